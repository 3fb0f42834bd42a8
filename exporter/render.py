"""Snapshot -> prometheus-client metric families -> cached exposition bytes.

The families are built fresh from an immutable Snapshot on every render (no
stateful ``Gauge.labels().set()``, so a process or GPU that is gone is simply not
there). The exposition is rendered once per new snapshot, off the request path,
for text 0.0.4 and OpenMetrics and their gzip forms; ``/metrics`` returns bytes.
"""

from __future__ import annotations

import gzip
import platform
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from prometheus_client import exposition as text_format
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.openmetrics import exposition as om_format
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from exporter import __version__
from exporter.collector import DURATION_BUCKETS, Snapshot
from exporter.dcgm import dcgm_families, hostname
from exporter.model import DeviceInfo, DeviceSample, ProcessSample

TEXT_CONTENT_TYPE = getattr(text_format, "CONTENT_TYPE_PLAIN_0_0_4",
                            "text/plain; version=0.0.4; charset=utf-8")
OPENMETRICS_CONTENT_TYPE = om_format.CONTENT_TYPE_LATEST
GPU_LABELS = ("gpu", "uuid", "vendor", "source")
PROCESS_LABELS = (*GPU_LABELS, "pid", "process")
INFO_LABELS = (*GPU_LABELS, "name", "pci_bus_id", "driver", "driver_version", "vbios_version",
               "compute_capability", "architecture", "serial")

# (family, DeviceSample field, help); gauges unless the name ends in _total.
SCALARS: tuple[tuple[str, str, str], ...] = (
    ("gpu_utilization_ratio", "utilization_ratio", "Fraction of time the GPU was busy."),
    ("gpu_memory_utilization_ratio", "memory_utilization_ratio",
     "Fraction of time the memory controller was busy."),
    ("gpu_memory_total_bytes", "memory_total_bytes", "Device-local memory in total."),
    ("gpu_memory_used_bytes", "memory_used_bytes", "Device-local memory in use."),
    ("gpu_memory_free_bytes", "memory_free_bytes", "Device-local memory free."),
    ("gpu_memory_reserved_bytes", "memory_reserved_bytes",
     "Device-local memory reserved by the driver."),
    ("gpu_shared_memory_total_bytes", "shared_memory_total_bytes",
     "System memory the GPU can map (GTT, unified memory)."),
    ("gpu_shared_memory_used_bytes", "shared_memory_used_bytes",
     "System memory mapped for the GPU in use."),
    ("gpu_power_watts", "power_watts", "Current power draw."),
    ("gpu_power_limit_watts", "power_limit_watts", "Enforced power limit."),
    ("gpu_energy_joules_total", "energy_joules", "Energy consumed since the driver loaded."),
    ("gpu_performance_state", "performance_state", "Performance state (P-state number)."),
    ("gpu_pcie_link_generation", "pcie_link_generation", "Current PCIe link generation."),
    ("gpu_pcie_link_width", "pcie_link_width", "Current PCIe link width (lanes)."),
    ("gpu_pcie_link_max_generation", "pcie_link_max_generation", "Maximum PCIe generation."),
    ("gpu_pcie_link_max_width", "pcie_link_max_width", "Maximum PCIe link width (lanes)."),
    ("gpu_pcie_replay_errors_total", "pcie_replay_errors", "PCIe replay errors."),
    ("gpu_memory_remap_failed", "remap_failed", "1 if a memory row remapping failed."),
)
# (family, DeviceSample field, label, help)
LABELLED: tuple[tuple[str, str, str, str], ...] = (
    ("gpu_temperature_celsius", "temperatures_celsius", "sensor", "Temperature by sensor."),
    ("gpu_temperature_threshold_celsius", "temperature_thresholds_celsius", "threshold",
     "Temperature thresholds."),
    ("gpu_fan_speed_ratio", "fan_speed_ratio", "fan", "Fan speed as a fraction of its maximum."),
    ("gpu_clock_hertz", "clocks_hertz", "clock", "Current clock frequency."),
    ("gpu_clock_max_hertz", "clocks_max_hertz", "clock", "Maximum clock frequency."),
    ("gpu_clock_throttle_active", "throttle_reasons", "reason",
     "1 while this clock throttle reason is active."),
    ("gpu_pcie_throughput_bytes_per_second", "pcie_throughput_bytes_per_second", "direction",
     "PCIe throughput."),
    ("gpu_engine_utilization_ratio", "engine_utilization_ratio", "engine",
     "Fraction of time an engine was busy."),
    ("gpu_engine_busy_seconds_total", "engine_busy_seconds", "engine",
     "Time an engine was busy."),
    ("gpu_ecc_errors_total", "ecc_errors", "severity", "ECC errors since the driver loaded."),
    ("gpu_memory_remapped_rows", "remapped_rows", "severity", "Memory rows remapped."),
    ("gpu_xid_errors_total", "xid_errors", "xid", "NVIDIA XID error events by code."),
)
PROFILING = {
    "sm_active": "Fraction of time at least one warp was active on an SM (GPM).",
    "sm_occupancy": "Fraction of the maximum warps resident on SMs (GPM).",
    "tensor_active": "Fraction of cycles the tensor pipes were active (GPM).",
    "dram_active": "Fraction of cycles the device memory interface was active (GPM).",
    "graphics_engine_active": "Fraction of time the graphics engine was active (GPM).",
    "fp16_active": "Fraction of cycles the FP16 pipes were active (GPM).",
    "fp32_active": "Fraction of cycles the FP32 pipes were active (GPM).",
    "fp64_active": "Fraction of cycles the FP64 pipes were active (GPM).",
}
# (family, ProcessSample field, label or "", help)
PROCESS_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("gpu_process_memory_used_bytes", "memory_used_bytes", "",
     "Device-local memory used by the process on this GPU."),
    ("gpu_process_shared_memory_used_bytes", "shared_memory_used_bytes", "",
     "System (GTT) memory charged to the process for this GPU."),
    ("gpu_process_utilization_ratio", "utilization_ratio", "engine",
     "Fraction of time the process kept an engine busy."),
    ("gpu_process_engine_busy_seconds_total", "engine_busy_seconds", "engine",
     "Engine time used by the process."),
    ("gpu_process_host_memory_bytes", "host_memory_bytes", "",
     "Resident host memory (RSS) of the GPU process."),
)


class _Families:
    """Families by name, created on first use, so a family with no samples is not emitted."""

    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}

    def add(self, name: str, doc: str, labels: tuple[str, ...], values: tuple[str, ...],
            value: float) -> None:
        family = self.by_name.get(name)
        if family is None:
            cls = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            family = cls(name, doc, labels=list(labels))
            self.by_name[name] = family
        family.add_metric(list(values), float(value))  # type: ignore[attr-defined]


def _device_families(f: _Families, gpu: str, identity: DeviceInfo, d: DeviceSample) -> None:
    def base(field: str) -> tuple[str, ...]:
        return (gpu, identity.uuid, identity.vendor, d.source_of(field))

    for name, field, doc in SCALARS:
        value = getattr(d, field)
        if value is not None:
            f.add(name, doc, GPU_LABELS, base(field), value)
    for name, field, label, doc in LABELLED:
        for key, value in getattr(d, field).items():
            f.add(name, doc, (*GPU_LABELS, label), (*base(field), str(key)), value)
    for key, value in d.profiling_ratio.items():
        if key in PROFILING:
            f.add(f"gpu_{key}_ratio", PROFILING[key], GPU_LABELS, base("profiling_ratio"), value)
    for (link, direction), value in d.nvlink_throughput_bytes_per_second.items():
        f.add("gpu_nvlink_throughput_bytes_per_second", "NVLink throughput.",
              (*GPU_LABELS, "link", "direction"),
              (*base("nvlink_throughput_bytes_per_second"), link, direction), value)
    for p in d.processes:
        _process_families(f, base("processes"), p)


def _process_families(f: _Families, base: tuple[str, ...], p: ProcessSample) -> None:
    labels = (*base, str(p.pid), p.process)
    for name, field, label, doc in PROCESS_FIELDS:
        value: Any = getattr(p, field)
        if label:
            for key, v in value.items():
                f.add(name, doc, (*PROCESS_LABELS, label), (*labels, key), v)
        elif value is not None:
            f.add(name, doc, PROCESS_LABELS, labels, value)


def _better_engines(s: Snapshot) -> dict[str, set[str]]:
    """Engines a primary backend reports per GPU: fdinfo sums do not repeat those."""
    engines: dict[str, set[str]] = {}
    for state in s.backends:
        if state.serving and state.last is not None:
            for d in state.last.devices:
                if d.primary:
                    engines.setdefault(d.info.pci_bus_id, set()).update(
                        d.engine_utilization_ratio, d.engine_busy_seconds)
    return engines


def _without_engines(d: DeviceSample, engines: set[str]) -> DeviceSample:
    if not engines:
        return d
    return replace(
        d,
        engine_utilization_ratio={k: v for k, v in d.engine_utilization_ratio.items()
                                  if k not in engines},
        engine_busy_seconds={k: v for k, v in d.engine_busy_seconds.items()
                             if k not in engines})


def snapshot_families(s: Snapshot, metric_names: str = "gpu", host: str = "") -> Iterator[Metric]:
    f = _Families()
    better = _better_engines(s)
    for state in s.backends:
        if state.last is None:
            continue
        for d in state.last.devices:
            bus = d.info.pci_bus_id
            gpu = str(s.gpu_index.get(bus, ""))
            identity = s.identities.get(bus, d.info)
            if d.primary:
                f.add("gpu_info", "GPU identity; value 1.", INFO_LABELS, (
                    gpu, identity.uuid, identity.vendor, d.source, identity.name, bus,
                    identity.driver, identity.driver_version, identity.vbios_version,
                    identity.compute_capability, identity.architecture, identity.serial), 1)
                f.add("gpu_up", "1 if the GPU was readable at the last sample, 0 if lost or "
                      "its backend stopped answering.", GPU_LABELS,
                      (gpu, identity.uuid, identity.vendor, d.source),
                      1 if d.up and state.serving else 0)
            if state.serving and d.up:
                if not d.primary:
                    d = _without_engines(d, better.get(bus, set()))
                _device_families(f, gpu, identity, d)
    # --metric-names: dcgm replaces the per-GPU gpu_* families; processes keep our names.
    yield from (m for n, m in f.by_name.items()
                if metric_names != "dcgm" or n.startswith("gpu_process_"))
    if metric_names != "gpu":  # until the collector merges devices: the primary backends'
        yield from dcgm_families(((str(s.gpu_index.get(d.info.pci_bus_id, "")), d)
                                  for st in s.backends if st.serving and st.last
                                  for d in st.last.devices if d.primary and d.up), host)
    yield from _exporter_families(s)


def _exporter_families(s: Snapshot) -> Iterator[Metric]:
    build = GaugeMetricFamily("gpu_exporter_build_info", "Build information; value 1.",
                              labels=["version", "python_version"])
    build.add_metric([__version__, platform.python_version()], 1)
    yield build
    yield GaugeMetricFamily("gpu_exporter_up", "1 once the first collection has completed.",
                            value=1 if s.ready else 0)
    up = GaugeMetricFamily("gpu_exporter_backend_up",
                           "1 if the backend is open and answering.", labels=["backend"])
    hist = HistogramMetricFamily("gpu_exporter_collection_duration_seconds",
                                 "Time one collection cycle took.", labels=["backend"])
    errors = CounterMetricFamily("gpu_exporter_collection_errors_total",
                                 "Values, devices or processes a collection had to drop.",
                                 labels=["backend", "reason"])
    last = GaugeMetricFamily("gpu_exporter_last_collection_timestamp_seconds",
                             "When the backend last completed a collection.", labels=["backend"])
    for state in s.backends:
        up.add_metric([state.name], 1 if state.up and not state.stale else 0)
        if state.duration_count:
            buckets = [(str(b), c) for b, c in
                       zip(DURATION_BUCKETS, state.duration_buckets, strict=True)]
            buckets.append(("+Inf", state.duration_count))
            hist.add_metric([state.name], buckets, state.duration_sum)
        for reason, n in sorted(state.errors_total.items()):
            errors.add_metric([state.name, reason], n)
        if state.last_success is not None:
            last.add_metric([state.name], state.last_success)
    yield from (up, hist, errors, last)
    yield CounterMetricFamily("gpu_exporter_processes_truncated_total",
                              "Per-process series cut by --max-processes-per-gpu.",
                              value=s.processes_truncated_total)


class _SnapshotCollector:
    def __init__(self, metric_names: str, host: str) -> None:
        self.snapshot: Snapshot | None = None
        self.metric_names, self.host = metric_names, host

    def describe(self) -> list[Metric]:
        return []  # so registering never calls collect()

    def collect(self) -> Iterator[Metric]:
        if self.snapshot is not None:
            yield from snapshot_families(self.snapshot, self.metric_names, self.host)


VARIANTS = ("text", "text+gzip", "openmetrics", "openmetrics+gzip")
WANT_TTL = 300.0  # a format nobody asked for in 5 minutes is no longer rendered ahead


class _Demand:
    """When one format was last asked for, and how often (a moving average of the gaps).

    Prometheus scrapes on a fixed cadence, usually much slower than the collection
    interval; rendering every snapshot ahead of time would render fifteen to serve one.
    So a snapshot is rendered ahead only when a scrape is due within ``lead`` seconds.
    A scrape that comes early still gets the newest snapshot, rendered on the spot.
    """

    def __init__(self) -> None:
        self.last: float | None = None
        self.period: float | None = None

    def asked(self, now: float) -> None:
        if self.last is not None:
            gap = now - self.last
            self.period = gap if self.period is None else 0.7 * self.period + 0.3 * gap
        self.last = now

    def due(self, now: float, lead: float) -> bool:
        if self.last is None or now - self.last > WANT_TTL:
            return False
        return self.period is None or now - self.last >= self.period - lead


class Exposition:
    """The bytes of one snapshot in every format, rendered on demand and kept."""

    def __init__(self, snapshot: Snapshot, render: Callable[[bool], bytes]) -> None:
        self.snapshot = snapshot
        self._render = render
        self._bodies: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def body(self, variant: str) -> bytes:
        cached = self._bodies.get(variant)
        if cached is not None:
            return cached
        with self._lock:
            if variant not in self._bodies:
                fmt, _, zipped = variant.partition("+")
                raw = self._bodies.get(fmt)
                if raw is None:
                    raw = self._bodies[fmt] = self._render(fmt == "openmetrics")
                if zipped:
                    self._bodies[variant] = gzip.compress(raw, compresslevel=6)
            return self._bodies[variant]


class Renderer:
    """Receives snapshots (from the Hub), renders them off the request path, serves bytes.

    Rendering runs on a thread of its own, so snapshots published in quick succession by
    several backends coalesce into one render, and only formats that scrapers ask for
    are rendered, shortly before they are expected to ask (see _Demand).
    """

    def __init__(self, lead: float = 2.0, metric_names: str = "gpu") -> None:
        self.lead = lead  # render ahead when a scrape is due within this many seconds
        self.registry = CollectorRegistry(auto_describe=False)
        self._collector = _SnapshotCollector(
            metric_names, hostname() if metric_names != "gpu" else "")
        self.registry.register(self._collector)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._demand = {variant: _Demand() for variant in VARIANTS}
        self._pending: Snapshot | None = None
        self._wake = threading.Event()
        self._render_lock = threading.Lock()
        self.current: Exposition | None = None
        self._stopped = False

    def _render_bytes(self, snapshot: Snapshot, openmetrics: bool) -> bytes:
        with self._render_lock:  # the registry's collector holds one snapshot at a time
            self._collector.snapshot = snapshot
            if openmetrics:
                body: bytes = om_format.generate_latest(self.registry)  # type: ignore[no-untyped-call]
                return body
            return text_format.generate_latest(self.registry)

    def render_now(self, snapshot: Snapshot) -> Exposition:
        """Render ``snapshot`` in the formats wanted lately and make it current."""
        exposition = Exposition(snapshot, lambda om: self._render_bytes(snapshot, om))
        now = time.monotonic()
        for variant, demand in self._demand.items():
            if demand.due(now, self.lead):
                exposition.body(variant)
        current = self.current
        if current is None or snapshot.generation >= current.snapshot.generation:
            self.current = exposition
        return exposition

    def body(self, variant: str) -> tuple[bytes, Snapshot]:
        self._demand[variant].asked(time.monotonic())
        exposition = self.current
        assert exposition is not None, "Renderer.body() before the first snapshot"
        return exposition.body(variant), exposition.snapshot

    # -- the render thread ----------------------------------------------------------------
    def submit(self, snapshot: Snapshot) -> None:
        """Hub listener: remember the newest snapshot and wake the render thread."""
        pending = self._pending
        if pending is None or snapshot.generation > pending.generation:
            self._pending = snapshot
        self._wake.set()

    def run(self, coalesce: float = 0.02) -> None:
        while not self._stopped:
            self._wake.wait()
            if self._stopped:
                return
            time.sleep(coalesce)  # let backends that tick together land in one render
            self._wake.clear()
            snapshot = self._pending
            if snapshot is not None:
                self.render_now(snapshot)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="renderer", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
