"""Snapshot -> prometheus-client metric families -> cached exposition bytes.

The families are built fresh from an immutable Snapshot's merged devices on every
render (no stateful ``Gauge.labels().set()``, so a process or GPU that is gone is
simply not there). The exposition is rendered on the renderer's thread, for text
0.0.4 and OpenMetrics and their gzip forms, at most once per snapshot and format and
only for formats someone scrapes; ``/metrics`` returns bytes.
"""

from __future__ import annotations

import asyncio
import gzip
import platform
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, TypeVar

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
from prometheus_client.samples import Sample

from exporter import __version__, dcgm
from exporter.collector import DURATION_BUCKETS, Snapshot
from exporter.model import DeviceSample, PodRef, ProcessSample

TEXT_CONTENT_TYPE = getattr(text_format, "CONTENT_TYPE_PLAIN_0_0_4",
                            "text/plain; version=0.0.4; charset=utf-8")
OPENMETRICS_CONTENT_TYPE = om_format.CONTENT_TYPE_LATEST
T = TypeVar("T")
ESCAPING = "allow-utf-8"  # prometheus_client's ALLOWUTF8
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
    ("gpu_power_instant_watts", "power_instant_watts",
     "Instantaneous power draw, where the source splits it from the averaged one."),
    ("gpu_power_limit_watts", "power_limit_watts", "Enforced power limit."),
    ("gpu_energy_joules_total", "energy_joules", "Energy consumed since the driver loaded."),
    ("gpu_performance_state", "performance_state", "Performance state (P-state number)."),
    ("gpu_pcie_link_generation", "pcie_link_generation", "Current PCIe link generation."),
    ("gpu_pcie_link_width", "pcie_link_width", "Current PCIe link width (lanes)."),
    ("gpu_pcie_link_max_generation", "pcie_link_max_generation", "Maximum PCIe generation."),
    ("gpu_pcie_link_max_width", "pcie_link_max_width", "Maximum PCIe link width (lanes)."),
    ("gpu_pcie_replay_errors_total", "pcie_replay_errors", "PCIe replay errors."),
    ("gpu_memory_remap_failed", "remap_failed", "1 if a memory row remapping failed."),
    ("gpu_memory_remap_pending", "remap_pending",
     "1 while a memory row remap waits for the next GPU reset."),
    ("gpu_xid_last_timestamp_seconds", "xid_last_timestamp_seconds",
     "When the most recent XID event happened (seconds since the epoch)."),
)
# (family, DeviceSample field, label or labels of the mapping's key, help)
LABELLED: tuple[tuple[str, str, str | tuple[str, ...], str], ...] = (
    ("gpu_temperature_celsius", "temperatures_celsius", "sensor", "Temperature by sensor."),
    ("gpu_temperature_threshold_celsius", "temperature_thresholds_celsius", "threshold",
     "Temperature thresholds."),
    ("gpu_fan_speed_ratio", "fan_speed_ratio", "fan", "Fan speed as a fraction of its maximum."),
    ("gpu_clock_hertz", "clocks_hertz", "clock", "Current clock frequency."),
    ("gpu_clock_max_hertz", "clocks_max_hertz", "clock", "Maximum clock frequency."),
    ("gpu_clock_throttle_active", "throttle_reasons", "reason",
     "1 while this clock throttle reason is active."),
    ("gpu_clock_event_seconds_total", "clock_event_seconds", "reason",
     "Time the clocks were held back by this reason."),
    ("gpu_pcie_throughput_bytes_per_second", "pcie_throughput_bytes_per_second", "direction",
     "PCIe throughput."),
    ("gpu_engine_utilization_ratio", "engine_utilization_ratio", "engine",
     "Fraction of time an engine was busy."),
    ("gpu_engine_busy_seconds_total", "engine_busy_seconds", "engine",
     "Time an engine was busy."),
    ("gpu_ecc_errors_total", "ecc_errors", "severity", "ECC errors since the driver loaded."),
    ("gpu_memory_remapped_rows", "remapped_rows", "severity", "Memory rows remapped."),
    ("gpu_memory_retired_pages", "retired_pages", "cause",
     "Memory pages retired (pre-Ampere page retirement)."),
    ("gpu_xid_errors_total", "xid_errors", "xid", "NVIDIA XID error events by code."),
    ("gpu_memory_bandwidth_bytes_per_second", "memory_bandwidth_bytes_per_second",
     "direction", "Device memory bandwidth, where the source measures it."),
    ("gpu_nvlink_up", "nvlink_up", ("link", "remote"),
     "1 if this NVLink link is up; remote is what it connects to."),
    ("gpu_nvlink_throughput_bytes_per_second", "nvlink_throughput_bytes_per_second",
     ("link", "direction"), "NVLink throughput."),
    ("gpu_nvlink_errors_total", "nvlink_errors", ("link", "type"), "NVLink errors by type."),
    ("gpu_xgmi_throughput_bytes_per_second", "xgmi_throughput_bytes_per_second",
     ("link", "direction"), "AMD XGMI link throughput."),
    ("gpu_ras_errors_total", "ras_errors", ("block", "severity"),
     "RAS / ECC errors by hardware block."),
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
POD_LABELS = ("container", "pod", "namespace")
ALLOCATION_SOURCE = "kubelet"  # the kubelet's pod-resources API
INFO_DOC = "GPU identity; value 1."
UP_DOC = "1 if the GPU was readable at the last sample, 0 if lost or its backend stopped answering."
ALLOCATION_DOC = "Which container the kubelet allocated this GPU to; value 1."


@dataclass(frozen=True)
class RenderOptions:
    """What the operator chose about label shapes; fixed for the life of the process."""

    pod_labels: bool = False  # kubernetes attribution on: process series carry pod labels
    device_pod_labels: bool = False  # --kubernetes.device-labels
    metric_names: str = "gpu"  # gpu, dcgm or both
    hostname: str = dataclass_field(default_factory=dcgm.hostname)  # dcgm's Hostname label


class _Families:
    """Families by name, created on first use, so a family with no samples is not emitted.

    Samples are added with their own label dict: a MIG slice's series carry labels
    (gpu_instance_id, ...) that a whole GPU's series in the same family do not.
    """

    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}

    def add(self, name: str, doc: str, labels: dict[str, str], value: float) -> None:
        family = self.by_name.get(name)
        if family is None:
            if name.endswith("_total"):
                family = Metric(name[:-len("_total")], doc, "counter")
            else:
                family = Metric(name, doc, "gauge")
            self.by_name[name] = family
        family.samples.append(Sample(name, labels, float(value)))


def _exclusive_pod(d: DeviceSample) -> PodRef | None:
    pods = {a.pod for a in d.allocations}
    return next(iter(pods)) if len(pods) == 1 else None


def _device_families(f: _Families, gpu: str, d: DeviceSample, opts: RenderOptions) -> None:
    info = d.info
    extra: dict[str, str] = dict(info.slice_labels)
    if opts.device_pod_labels and (pod := _exclusive_pod(d)) is not None:
        extra.update(container=pod.container, pod=pod.pod, namespace=pod.namespace)

    def labels(source: str, **more: str) -> dict[str, str]:
        return {"gpu": gpu, "uuid": info.uuid, "vendor": info.vendor, "source": source,
                **extra, **more}

    f.add("gpu_info", INFO_DOC, {
        **labels(d.source), "name": info.name, "pci_bus_id": info.pci_bus_id,
        "driver": info.driver, "driver_version": info.driver_version,
        "vbios_version": info.vbios_version, "compute_capability": info.compute_capability,
        "architecture": info.architecture, "serial": info.serial, **info.info_labels}, 1)
    f.add("gpu_up", UP_DOC, labels(d.source), 1 if d.up else 0)
    seen_pods = set()
    for a in d.allocations:
        if (a.pod, a.resource) not in seen_pods:
            seen_pods.add((a.pod, a.resource))
            f.add("gpu_kubernetes_allocation_info", ALLOCATION_DOC, labels(
                ALLOCATION_SOURCE, container=a.pod.container, pod=a.pod.pod,
                namespace=a.pod.namespace, resource=a.resource), 1)
    if not d.up:
        return
    for name, field, doc in SCALARS:
        value = getattr(d, field)
        if value is not None:
            f.add(name, doc, labels(d.source_of(field)), value)
    for name, field, label, doc in LABELLED:
        names = (label,) if isinstance(label, str) else label
        for key, value in getattr(d, field).items():
            keys = key if isinstance(key, tuple) else (key,)
            f.add(name, doc, labels(d.source_of(field, key),
                                    **{n: str(k) for n, k in zip(names, keys, strict=True)}),
                  value)
    for key, value in d.profiling_ratio.items():
        if key in PROFILING:
            f.add(f"gpu_{key}_ratio", PROFILING[key], labels(d.source_of("profiling_ratio", key)),
                  value)
    for p in d.processes:
        _process_families(f, labels, d, p, opts)


def _process_families(f: _Families, labels: Callable[..., dict[str, str]], d: DeviceSample,
                      p: ProcessSample, opts: RenderOptions) -> None:
    base_source = p.source or d.source_of("processes")
    pod = {}
    if opts.pod_labels:
        pod = {"container": p.container or "", "pod": p.pod or "",
               "namespace": p.namespace or ""}

    def source(field: str, key: Any = None) -> str:
        if not p.field_sources:
            return base_source
        return p.field_sources.get((field, key)) or p.field_sources.get(field) or base_source

    for name, field, label, doc in PROCESS_FIELDS:
        value: Any = getattr(p, field)
        if label:
            for key, v in value.items():
                f.add(name, doc, labels(source(field, key), pid=str(p.pid), process=p.process,
                                        **pod, **{label: key}), v)
        elif value is not None:
            f.add(name, doc, labels(source(field), pid=str(p.pid), process=p.process, **pod),
                  value)


# Families in this order in every output, whichever device happens to come first.
FAMILY_ORDER = ("gpu_info", "gpu_up", "gpu_kubernetes_allocation_info",
                *(n for n, _, _ in SCALARS), *(n for n, _, _, _ in LABELLED),
                *(f"gpu_{k}_ratio" for k in PROFILING), *(n for n, _, _, _ in PROCESS_FIELDS))
_RANK = {name: i for i, name in enumerate(FAMILY_ORDER)}


def device_families(s: Snapshot, opts: RenderOptions) -> list[Metric]:
    """The per-GPU and per-process families of a snapshot's merged devices."""
    f = _Families()
    for gpu, d in s.devices:
        _device_families(f, gpu, d, opts)
    ours = [f.by_name[n] for n in sorted(f.by_name, key=lambda n: _RANK.get(n, len(_RANK)))]
    if opts.metric_names == "gpu":
        return ours
    # dcgm replaces the per-GPU families; per-process ones keep our names in every mode.
    kept = ours if opts.metric_names == "both" else [
        m for m in ours if m.name.startswith("gpu_process_")]
    return kept + list(dcgm.dcgm_families(((g, d) for g, d in s.devices if d.up), opts.hostname))


def snapshot_families(s: Snapshot, opts: RenderOptions | None = None,
                      threads: Mapping[str, Sequence[threading.Thread]] | None = None,
                      otlp: Mapping[str, int] | None = None) -> Iterator[Metric]:
    """``otlp``: the OTLP pusher's export counts by result, with --otlp.endpoint only."""
    yield from device_families(s, opts or RenderOptions())
    yield from _exporter_families(s, threads or {})
    if otlp is not None:
        exports = CounterMetricFamily("gpu_exporter_otlp_exports_total",
                                      "OTLP pushes by result: sent, failed (after the "
                                      "exporter's retries), dropped (a push still in flight "
                                      "when the next was due).", labels=["result"])
        for result, n in otlp.items():
            exports.add_metric([result], n)
        yield exports


def thread_cpu_seconds(thread: threading.Thread) -> float | None:
    """CPU time one thread has used (Linux and other systems with per-thread clocks)."""
    ident = thread.ident
    getclock = getattr(time, "pthread_getcpuclockid", None)
    if ident is None or getclock is None or not thread.is_alive():
        return None
    try:
        return float(time.clock_gettime(getclock(ident)))
    except OSError:
        return None


def _exporter_families(s: Snapshot, threads: Mapping[str, Sequence[threading.Thread]]
                       ) -> Iterator[Metric]:
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
    restarts = CounterMetricFamily("gpu_exporter_child_restarts_total",
                                   "Child processes (macmon) a backend restarted.",
                                   labels=["backend"])
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
        if state.child_restarts is not None:
            restarts.add_metric([state.name], state.child_restarts)
    yield from (up, hist, errors, last)
    if restarts.samples:
        yield restarts
    yield CounterMetricFamily("gpu_exporter_processes_truncated_total",
                              "Per-process series cut by --max-processes-per-gpu.",
                              value=s.processes_truncated_total)
    cpu = CounterMetricFamily(
        "gpu_exporter_backend_cpu_seconds_total",
        "CPU time of each backend's collector thread, and of the renderer and the HTTP server.",
        labels=["backend"])
    for name, group in threads.items():
        used = [t for t in (thread_cpu_seconds(th) for th in group) if t is not None]
        if used:
            cpu.add_metric([name], sum(used))
    if cpu.samples:
        yield cpu


class _SnapshotCollector:
    def __init__(self, options: RenderOptions,
                 threads: Mapping[str, Sequence[threading.Thread]]) -> None:
        self.snapshot: Snapshot | None = None
        self.otlp: Callable[[], Mapping[str, Any]] | None = None  # the OTLP pusher's status
        self.options = options
        self.threads = threads

    def describe(self) -> list[Metric]:
        return []  # so registering never calls collect()

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        if s is not None:
            threads = {**{name: (t,) for name, t in s.threads.items()}, **self.threads}
            status = self.otlp() if self.otlp is not None else None
            yield from snapshot_families(s, self.options, threads,
                                         None if status is None else status["exports"])


VARIANTS = ("text", "text+gzip", "openmetrics", "openmetrics+gzip")
WANT_TTL = 300.0  # a format nobody asked for in 5 minutes is no longer rendered ahead


class _Demand:
    """When one format was last asked for, and the gap before that: the scrape cadence.

    Prometheus scrapes on a fixed cadence, usually much slower than the collection
    interval; rendering every snapshot ahead of time would render fifteen to serve one.
    So at most one snapshot is rendered ahead per expected scrape, the first one that
    comes within ``lead`` seconds of it. A scrape that comes early, or after a newer
    snapshot, still gets the newest snapshot, rendered on the spot.
    """

    def __init__(self) -> None:
        self.last: float | None = None
        self.period: float | None = None
        self.ahead = False  # a snapshot was rendered ahead since the last request

    def asked(self, now: float) -> None:
        if self.last is not None:
            self.period = now - self.last
        self.last = now
        self.ahead = False

    def due(self, now: float, lead: float) -> bool:
        """Render ahead only once the scrape cadence is known (two requests), once per
        expected scrape: before that a snapshot rendered ahead is almost always replaced
        before anyone asks."""
        if self.last is None or self.period is None or self.ahead or \
                now - self.last > WANT_TTL:
            return False
        return now - self.last >= self.period - lead


class Exposition:
    """The bytes of one snapshot in every format, rendered on demand and kept."""

    def __init__(self, snapshot: Snapshot, render: Callable[[bool], bytes]) -> None:
        self.snapshot = snapshot
        self._render = render
        self._bodies: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def cached(self, variant: str) -> bytes | None:
        return self._bodies.get(variant)

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


class Worker:
    """One named thread that runs what it is given, in order: the renderer's.

    Renders (ahead of a scrape, or cold for a scrape that came early) and the
    ``/snapshot`` JSON run here, never on the HTTP server's event loop, and their CPU
    time is this thread's (``gpu_exporter_backend_cpu_seconds_total{backend="renderer"}``).
    Started on first use.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        with self._lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self.thread.start()
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits for it
                future.set_exception(e)

    def stop(self) -> None:
        self._queue.put(None)


class Renderer:
    """Receives snapshots (from the Hub), renders them off the request path, serves bytes.

    Rendering runs on the renderer's own thread (``Worker``), so snapshots published in
    quick succession by several backends coalesce into one render, and only formats that
    scrapers ask for are rendered, shortly before they are expected to ask (see _Demand).
    A snapshot nobody scrapes is never rendered.
    """

    def __init__(self, lead: float = 2.0, options: RenderOptions | None = None) -> None:
        self.lead = lead  # render ahead when a scrape is due within this many seconds
        self.options = options or RenderOptions()
        self.worker = Worker("renderer")
        # label -> threads whose CPU time is reported under it (the server adds its own)
        self.cpu_threads: dict[str, list[threading.Thread]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self._collector = _SnapshotCollector(self.options, self.cpu_threads)
        self.registry.register(self._collector)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._demand = {variant: _Demand() for variant in VARIANTS}
        self._pending: Snapshot | None = None
        self._scheduled = False
        self._lock = threading.Lock()
        self._render_lock = threading.Lock()
        self.current: Exposition | None = None
        self.coalesce = 0.02  # let backends that tick together land in one render

    @property
    def otlp(self) -> Callable[[], Mapping[str, Any]] | None:
        """The OTLP pusher's status (exporter/otlp.py), with --otlp.endpoint only."""
        return self._collector.otlp

    @otlp.setter
    def otlp(self, status: Callable[[], Mapping[str, Any]] | None) -> None:
        self._collector.otlp = status

    def _render_bytes(self, snapshot: Snapshot, openmetrics: bool) -> bytes:
        with self._render_lock:  # the registry's collector holds one snapshot at a time
            if self.worker.thread is not None:
                self.cpu_threads["renderer"] = [self.worker.thread]
            self._collector.snapshot = snapshot
            # Every name here is a legacy Prometheus name, so "allow-utf-8" writes the
            # same bytes as the default "underscores", which checks each label name
            # character by character: 40 % of an OpenMetrics render (bench on H100).
            if openmetrics:
                body: bytes = om_format.generate_latest(  # type: ignore[no-untyped-call]
                    self.registry, escaping=ESCAPING)
                return body
            return text_format.generate_latest(self.registry, escaping=ESCAPING)

    def render_now(self, snapshot: Snapshot) -> Exposition:
        """Make ``snapshot`` current, rendering it in the formats due to be asked for soon."""
        exposition = Exposition(snapshot, lambda om: self._render_bytes(snapshot, om))
        now = time.monotonic()
        for variant, demand in self._demand.items():
            if demand.due(now, self.lead):
                demand.ahead = True
                exposition.body(variant)
        current = self.current
        if current is None or snapshot.generation >= current.snapshot.generation:
            self.current = exposition
        return exposition

    def body(self, variant: str) -> tuple[bytes, Snapshot]:
        """The current snapshot's bytes, rendered on the calling thread if not cached."""
        self._demand[variant].asked(time.monotonic())
        exposition = self.current
        assert exposition is not None, "Renderer.body() before the first snapshot"
        return exposition.body(variant), exposition.snapshot

    async def body_async(self, variant: str) -> tuple[bytes, Snapshot]:
        """As body(), for the event loop: a cold render runs on the renderer's thread."""
        self._demand[variant].asked(time.monotonic())
        exposition = self.current
        assert exposition is not None, "Renderer.body() before the first snapshot"
        body = exposition.cached(variant)
        if body is None:
            body = await asyncio.wrap_future(self.worker.call(lambda: exposition.body(variant)))
        return body, exposition.snapshot

    # -- rendering ahead ------------------------------------------------------------------
    def submit(self, snapshot: Snapshot) -> None:
        """Hub listener: remember the newest snapshot; the worker picks it up once."""
        with self._lock:
            pending = self._pending
            if pending is None or snapshot.generation > pending.generation:
                self._pending = snapshot
            if self._scheduled:
                return
            self._scheduled = True
        self.worker.call(self._render_pending)

    def _render_pending(self) -> None:
        time.sleep(self.coalesce)
        with self._lock:
            snapshot, self._scheduled = self._pending, False
        if snapshot is not None:
            self.render_now(snapshot)

    def stop(self) -> None:
        self.worker.stop()
