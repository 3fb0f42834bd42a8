"""dcgm-exporter's names, units and labels (``--metric-names=dcgm|dcgm4.9|both|both-dcgm4.9``),
filled from our samples.

NVIDIA's dcgm-exporter writes one family per DCGM field, named after the field
(``DCGM_FI_DEV_GPU_UTIL``), in the field's own unit (MiB, MHz, %, mJ), labelled ``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, the driver version as
``DCGM_FI_DRIVER_VERSION``, ``GPU_I_PROFILE``/``GPU_I_ID`` on a MIG instance, and
``container``/``namespace``/``pod`` under Kubernetes. Facts from github.com/NVIDIA/dcgm-exporter
at commit 7ad58324b4447b64dc3dedf946b889b648b7f476: ``etc/default-counters.csv`` (fields,
types, units), ``internal/pkg/rendermetrics/render_metrics.go`` (labels),
``internal/pkg/hostname/hostname.go`` (``NODE_NAME`` before the host name).

Dashboards and alerts written for dcgm-exporter query those names, so this table fills them
from DeviceSample fields wherever the meaning is the same, for every vendor: one dashboard
covers a mixed fleet. Each family names the fields it reads (``Read``) and its own unit; the
conversion comes from the unit those fields declare in the field table (exporter.core.model), so
a field renamed or re-unitted there fails here at import. docs/dcgm-compat.md lists each
field, its source, and the fields we cannot fill. Per-process and gpu_exporter_* families
keep our names (exporter.output.render).

dcgm-exporter has two generations of names: the one above (up to 4.8.2, ``dcgm``) and the
one of 4.9 and later (``dcgm4.9``: DCGM 4.7's renamed fields, some in new units, and the
``hostname`` and ``DCGM_FI_SYSTEM_DRIVER_VERSION`` labels). The second is the first renamed
by the data in dcgm_generations.yml (with the sources of each name); ``generations()``
holds both, each with its field table and label names.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from prometheus_client.core import Metric

from exporter.core.fieldspec import value_specs
from exporter.core.labels import (
    Check,
    Clock,
    Direction,
    Engine,
    FindingCode,
    NvLinkError,
    Profiling,
    RetireCause,
    Sensor,
    Severity,
    ThrottleReason,
)
from exporter.core.model import DeviceInfo, DeviceSample, DeviceValues, PodRef
from exporter.pipeline.health import Verdict

MIB = float(1 << 20)
# (unit of the DeviceValues field, in exporter.core.model's table; dcgm-exporter's unit) -> factor
FACTORS: Mapping[tuple[str, str], float] = {
    ("hertz", "MHz"): 1e-6, ("celsius", "C"): 1, ("watts", "W"): 1, ("joules", "mJ"): 1000,
    ("count", "count"): 1, ("ratio", "%"): 100, ("ratio", "ratio"): 1, ("bytes", "MiB"): 1 / MIB,
    ("bytes_per_second", "B/s"): 1,
    # dcgm-exporter 4.9's base units (DCGM 4.7's *_HERTZ, *_JOULES_TOTAL, *_BYTES fields)
    ("hertz", "Hz"): 1, ("joules", "J"): 1, ("bytes", "B"): 1,
    # DCGM reports NVLink throughput in KiB/s / 1000.
    ("bytes_per_second", "~MB/s"): 1 / 1024 / 1000,
    ("seconds", "ns"): 1e9, ("", "code"): 1, ("", "0/1"): 1,
}
UNITS = {name: spec.unit for name, spec in value_specs(DeviceValues)}


@dataclass(frozen=True)
class Read:
    """Where a dcgm value comes from: one DeviceValues field (by its name in the field table).

    A scalar field is read as is; with ``minus``, less that other scalar field of the same
    unit (both must be there, and the result not negative: free memory derived from total
    and used). A mapping gives the value of the first of ``keys`` it has (with
    ``largest``, the largest of them), or with ``total`` the sum of its values (of ``keys``
    only, where given; of the tuple keys whose last element is ``last``, where given).
    ``unless``: a field whose presence rules this read out (a device that has device
    memory of its own never reads its shared pool as framebuffer). None where the device
    has none of it.
    """

    field: str
    keys: tuple[str, ...] = ()
    total: bool = False
    last: str = ""
    largest: bool = False
    minus: str = ""
    unless: str = ""

    def reading(self, d: DeviceValues) -> tuple[float, str | None] | None:
        """(value, the mapping key it came from: None for a scalar or a sum), or None."""
        if self.unless and getattr(d, self.unless) is not None:
            return None
        value = getattr(d, self.field)
        if not self.keys and not self.total:  # a scalar field
            if value is None:
                return None
            if self.minus:
                other = getattr(d, self.minus)
                if other is None or other > value:
                    return None
                return float(value - other), None
            return float(value), None
        if not self.total:
            present = [k for k in self.keys if k in value]
            if not present:
                return None
            key = max(present, key=lambda k: value[k]) if self.largest else present[0]
            return float(value[key]), key
        if self.last:
            last = self.last
            items = [v for k, v in value.items() if k[-1] == last]
        elif self.keys:
            items = [value[k] for k in self.keys if k in value]
        else:
            items = list(value.values())
        return (float(sum(items)), None) if items else None  # never a made-up 0

    def value(self, d: DeviceValues) -> float | None:
        found = self.reading(d)
        return None if found is None else found[0]


@dataclass(frozen=True)
class Field:
    """One dcgm-exporter family: its name, help, unit, and the fields it is filled from (the
    first that has a value wins), converted from the field table's unit into ``unit``."""

    name: str
    doc: str
    unit: str
    reads: tuple[Read, ...]
    # dcgm-exporter declares it a counter. Exposed untyped (``unknown`` in OpenMetrics): a
    # counter family of prometheus-client (and of OpenMetrics) must name its samples
    # ``<name>_total``, and dashboards query the bare DCGM name. rate() works on either.
    counter: bool = False
    # Series carry ``source``: the source of the value read (the reads are measures of
    # different definitions; docs/dcgm-compat.md). Off for fields that queries add up with
    # others (FB_USED + FB_FREE), where an extra label would break the match.
    sourced: bool = False
    # The field's name in the first generation (``dcgm``), whatever it is called in the one
    # served: what a counters CSV of either generation selects it by. "" for the first.
    key: str = ""

    # (read, factor from the table's unit into ``unit``), computed once
    plan: tuple[tuple[Read, float], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        plan = []
        for r in self.reads:  # a field renamed in the table, or a unit with no conversion
            factor = FACTORS.get((UNITS.get(r.field, "?"), self.unit))
            if factor is None:
                raise ValueError(f"{self.name}: no {r.field} in {UNITS.get(r.field)} -> "
                                 f"{self.unit}")
            for other in (r.minus, r.unless):
                if other and other not in UNITS:
                    raise ValueError(f"{self.name}: no field {other}")
            if r.minus and UNITS[r.minus] != UNITS[r.field]:
                raise ValueError(f"{self.name}: {r.field} - {r.minus} in two units")
            plan.append((r, factor))
        object.__setattr__(self, "plan", tuple(plan))
        object.__setattr__(self, "key", self.key or self.name)

    def value(self, d: DeviceValues) -> float | None:
        found = self.reading(d)
        return None if found is None else found[0]

    def reading(self, d: DeviceValues) -> tuple[float, Read, str | None] | None:
        """(value in ``unit``, the read that gave it, the mapping key it came from)."""
        for r, factor in self.plan:
            found = r.reading(d)
            if found is not None:
                return _tidy(found[0] * factor), r, found[1]
        return None


def _tidy(value: float) -> float:
    """12 significant digits: 22.000000000000004 % (0.22 * 100) is 22 %. Monotonic, so a
    counter stays a counter."""
    return float(f"{value:.12g}")


def _one(name: str, doc: str, unit: str, field: str, *keys: str, counter: bool = False
         ) -> Field:
    """A family filled from one field (from the first of ``keys`` a mapping has)."""
    return Field(name, doc, unit, (Read(field, keys),), counter)


def _nvlink_errors(name: str, doc: str, kind: str) -> Field:
    return Field(name, doc, "count", (Read("nvlink_errors", total=True, last=kind),), True)


def _profiling(name: str, doc: str, key: str) -> Field:
    return _one(name, doc, "ratio", "profiling_ratio", key)


# Every field of dcgm-exporter's default-counters.csv we can fill, then the fields that
# the cited dashboards and alerts use beyond it (docs/dcgm-compat.md says which is which).
FIELDS: tuple[Field, ...] = (
    _one("DCGM_FI_DEV_SM_CLOCK", "SM clock (MHz); the shader clock on AMD and Intel.", "MHz",
         "clocks_hertz", Clock.SM, Clock.GRAPHICS),
    _one("DCGM_FI_DEV_MEM_CLOCK", "Memory clock (MHz).", "MHz", "clocks_hertz", Clock.MEMORY),
    _one("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (C).", "C", "temperatures_celsius",
         Sensor.MEMORY, Sensor.VRAM),
    _one("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (C): die, AMD edge, Intel package.", "C",
         "temperatures_celsius", Sensor.GPU, Sensor.EDGE, Sensor.PACKAGE),
    _one("DCGM_FI_DEV_POWER_USAGE", "Power draw (W).", "W", "power_watts"),
    _one("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Energy since the driver loaded (mJ).", "mJ",
         "energy_joules", counter=True),
    _one("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replays.", "count", "pcie_replay_errors",
         counter=True),
    _one("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%).", "%", "utilization_ratio"),
    _one("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory controller utilization (%).", "%",
         "memory_utilization_ratio"),
    _one("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (%).", "%", "engine_utilization_ratio",
         Engine.ENCODER),
    _one("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (%).", "%", "engine_utilization_ratio",
         Engine.DECODER),
    _one("DCGM_FI_DEV_XID_ERRORS", "Code of the last XID error (0: none since start).", "code",
         "xid_last"),
    # Device memory as the source reports it (every backend that reads total and used
    # serves free); a GPU with no memory of its own (an APU, Apple) has the system memory
    # it maps as its framebuffer, free derived as total - used (docs/dcgm-compat.md).
    Field("DCGM_FI_DEV_FB_FREE", "Device memory free (MiB).", "MiB",
          (Read("memory_free_bytes"),
           Read("shared_memory_total_bytes", minus="shared_memory_used_bytes",
                unless="memory_total_bytes"))),
    Field("DCGM_FI_DEV_FB_USED", "Device memory used (MiB).", "MiB",
          (Read("memory_used_bytes"),
           Read("shared_memory_used_bytes", unless="memory_total_bytes"))),
    _one("DCGM_FI_DEV_FB_RESERVED", "Device memory reserved by the driver (MiB).", "MiB",
         "memory_reserved_bytes"),
    Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "NVLink throughput, all links, tx+rx (~MB/s).",
          "~MB/s", (Read("nvlink_throughput_bytes_per_second", total=True),)),
    _one("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Rows remapped for uncorrectable errors.",
         "count", "remapped_rows", Severity.UNCORRECTABLE, counter=True),
    _one("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Rows remapped for correctable errors.",
         "count", "remapped_rows", Severity.CORRECTABLE, counter=True),
    _one("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1 if a row remapping failed.", "0/1",
         "remap_failed"),
    # The closest measure each vendor has (docs/dcgm-compat.md compares them): NVIDIA's
    # GPM graphics activity (DCGM's own counter, Hopper+); AMD's GFX engine, which runs
    # both graphics and compute queues; Intel's busier of the render and compute engines;
    # else the device's busy fraction (NVML's utilisation before Hopper). ``source`` says
    # which: nvml_gpm, or the source of the fallback.
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics/compute engine is busy.",
          "ratio", (Read("profiling_ratio", (Profiling.GRAPHICS_ENGINE_ACTIVE,)),
                    Read("engine_utilization_ratio", (Engine.GFX,)),
                    Read("engine_utilization_ratio", (Engine.RENDER, Engine.COMPUTE),
                         largest=True),
                    Read("utilization_ratio")), sourced=True),
    _profiling("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipes are busy.",
               Profiling.TENSOR_ACTIVE),
    _profiling("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the memory interface is busy.",
               Profiling.DRAM_ACTIVE),
    _one("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe transmit rate (B/s).", "B/s",
         "pcie_throughput_bytes_per_second", Direction.TX),
    _one("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe receive rate (B/s).", "B/s",
         "pcie_throughput_bytes_per_second", Direction.RX),
    # -- beyond default-counters.csv ----------------------------------------------------
    _profiling("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has a warp assigned.",
               Profiling.SM_ACTIVE),
    _profiling("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of resident warps to the SMs' maximum.",
               Profiling.SM_OCCUPANCY),
    _profiling("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the FP64 pipes are busy.",
               Profiling.FP64_ACTIVE),
    _profiling("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the FP32 pipes are busy.",
               Profiling.FP32_ACTIVE),
    _profiling("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the FP16 pipes are busy.",
               Profiling.FP16_ACTIVE),
    _one("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Corrected ECC errors since the driver loaded.",
         "count", "ecc_errors", Severity.CORRECTED, counter=True),
    _one("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Uncorrected ECC errors since the driver loaded.",
         "count", "ecc_errors", Severity.UNCORRECTED, counter=True),
    _one("DCGM_FI_DEV_RETIRED_SBE", "Pages retired for single-bit errors.", "count",
         "retired_pages", RetireCause.SINGLE_BIT, counter=True),
    _one("DCGM_FI_DEV_RETIRED_DBE", "Pages retired for double-bit errors.", "count",
         "retired_pages", RetireCause.DOUBLE_BIT, counter=True),
    _one("DCGM_FI_DEV_POWER_VIOLATION", "Time clocks were held back by the power cap (ns).",
         "ns", "clock_event_seconds", ThrottleReason.SW_POWER_CAP, counter=True),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", "Time clocks were held back for heat (ns).", "ns",
          (Read("clock_event_seconds", (ThrottleReason.SW_THERMAL, ThrottleReason.HW_THERMAL),
                total=True),), counter=True),
    _nvlink_errors("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                   "NVLink flow-control CRC errors.", NvLinkError.CRC_FLIT),
    _nvlink_errors("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "NVLink data CRC errors.",
                   NvLinkError.CRC_DATA),
    _nvlink_errors("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLink replays.",
                   NvLinkError.REPLAY),
    _nvlink_errors("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVLink recoveries.",
                   NvLinkError.RECOVERY),
)


# -- generations ----------------------------------------------------------------------


@dataclass(frozen=True)
class Generation:
    """One generation of dcgm-exporter's names: its field table and label names."""

    name: str  # the --metric-names word: dcgm, dcgm4.9
    fields: tuple[Field, ...]
    host_label: str
    driver_label: str

    def field_named(self, name: str) -> Field | None:
        """The field called ``name`` here or in the first generation (a counters CSV of
        either generation names it so), else None."""
        return next((f for f in self.fields if name in (f.name, f.key)), None)


def _generation(word: str, table: Mapping[str, Any]) -> Generation:
    """The first generation's FIELDS renamed by one generation's rows of
    dcgm_generations.yml. A row for a field we do not serve, or a unit with no conversion
    from its fields' unit, fails at import (Field checks the unit)."""
    rows: Mapping[str, Mapping[str, str]] = table.get("fields") or {}
    unknown = set(rows) - {f.name for f in FIELDS}
    if unknown:
        raise ValueError(f"dcgm_generations.yml {word}: no such field {sorted(unknown)}")
    fields = tuple(
        replace(f, name=row["name"], unit=row.get("unit", f.unit), doc=row.get("help", f.doc),
                key=f.name) if (row := rows.get(f.name)) else f
        for f in FIELDS)
    labels = table["labels"]
    return Generation(word, fields, labels["hostname"]["name"], labels["driver_version"]["name"])


@cache
def generations() -> Mapping[str, Generation]:
    """--metric-names word -> its generation: "dcgm" (FIELDS as they are), "dcgm4.9". Read
    from dcgm_generations.yml on first use: a daemon that serves no DCGM names never
    imports yaml."""
    import yaml

    text = resources.files(__package__).joinpath("dcgm_generations.yml").read_text("utf-8")
    tables: Mapping[str, Mapping[str, Any]] = yaml.safe_load(text)["generations"]
    return MappingProxyType({word: _generation(word, t) for word, t in tables.items()})


def generation(word: str) -> Generation:
    return generations()[word]


def hostname() -> str:
    """The ``Hostname`` label, as dcgm-exporter picks it: ``NODE_NAME`` (set from the
    downward API in Kubernetes; tests set it for stable output), else the host's name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def dcgm_bus_id(pci_bus_id: str) -> str:
    """``0000:3b:00.0`` -> ``00000000:3B:00.0``, the form DCGM (and NVML) print."""
    domain, sep, rest = pci_bus_id.partition(":")
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}" if sep else pci_bus_id
    except ValueError:
        return pci_bus_id


def _labels(gpu: str, info: DeviceInfo, parent: DeviceInfo, host: str, gen: Generation
            ) -> dict[str, str]:
    """A slice (MIG instance, AMD partition) is shown as dcgm-exporter shows a GPU instance:
    the parent GPU's identity plus GPU_I_PROFILE and GPU_I_ID. The host and driver labels
    are named as the generation names them."""
    labels = {"gpu": gpu, "UUID": parent.uuid, "pci_bus_id": dcgm_bus_id(parent.pci_bus_id),
              "device": parent.device_node, "modelName": parent.name}
    if info.parent_key:
        s = info.slice_labels
        labels["GPU_I_PROFILE"] = s.get("mig_profile") or info.info_labels.get("partition", "")
        labels["GPU_I_ID"] = s.get("gpu_instance_id") or s.get("partition_id", "")
    labels[gen.host_label] = host
    labels[gen.driver_label] = parent.driver_version
    # An empty label is the same as no label to Prometheus: leave it out.
    return {k: v for k, v in labels.items() if v or k in ("gpu", "UUID")}


# DCGM_EXP_GPU_HEALTH_STATUS: dcgm-exporter's health watch per GPU and DCGM health system
# (internal/pkg/collector/gpu_health_collector.go at commit
# 07a14b87917292035ab97d403a42c149b9e263e2: labels health_watch, health_error_code; value
# dcgm_structs.h dcgmHealthWatchResult_t PASS 0, WARN 10, FAIL 20). Our checks that are one
# of its systems, and our finding codes that are one of its DCGM_FR_* codes; the `xid`
# check has no system of its own there (docs/dcgm-compat.md).
HEALTH_FAMILY = "DCGM_EXP_GPU_HEALTH_STATUS"
HEALTH_WATCHES: Mapping[Check, str] = {
    Check.PCIE: "PCIE", Check.INTERCONNECT: "NVLINK", Check.MEMORY: "MEM",
    Check.THERMAL: "THERMAL", Check.POWER: "POWER", Check.DRIVER: "DRIVER"}
HEALTH_RESULTS = (0, 10, 20)
# A finding code not here (ras_uncorrected, recovery_action, gpu_unreadable) has no
# DCGM_FR_* twin: DCGM_FR_UNKNOWN.
HEALTH_CODES: Mapping[FindingCode, str] = {
    FindingCode.XID: "DCGM_FR_XID_ERROR",
    FindingCode.ROW_REMAP_FAILURE: "DCGM_FR_ROW_REMAP_FAILURE",
    FindingCode.ROW_REMAP_PENDING: "DCGM_FR_PENDING_ROW_REMAP",
    FindingCode.PAGE_RETIREMENT_PENDING: "DCGM_FR_PENDING_PAGE_RETIREMENTS",
    FindingCode.ECC_UNCORRECTED: "DCGM_FR_VOLATILE_DBE_DETECTED",
    FindingCode.TEMPERATURE: "DCGM_FR_TEMP_VIOLATION",
    FindingCode.THROTTLE_THERMAL: "DCGM_FR_CLOCK_THROTTLE_THERMAL",
    FindingCode.THROTTLE_POWER: "DCGM_FR_CLOCK_THROTTLE_POWER",
    FindingCode.NVLINK_DOWN: "DCGM_FR_NVLINK_DOWN"}


def health_family(entries: Iterable[tuple[str, DeviceSample, Verdict]], host: str,
                  gen: Generation | None = None) -> list[Metric]:
    """DCGM_EXP_GPU_HEALTH_STATUS from the health verdicts: one series per GPU and check
    that has a DCGM health system; the code of the check's worst finding, else DCGM_FR_OK."""
    family = Metric(HEALTH_FAMILY, "GPU health status per DCGM health watch "
                    "(0 pass, 10 warn, 20 fail).", "gauge")
    for gpu, d, verdict in entries:
        base = _labels(gpu, d.info, d.info, host, gen or generation("dcgm"))
        for check, status in verdict.checks.items():
            watch = HEALTH_WATCHES.get(check)
            if watch is None:
                continue
            worst = max((f for f in verdict.findings if f.check == check),
                        key=lambda f: f.status, default=None)
            code = "DCGM_FR_OK" if worst is None else HEALTH_CODES.get(worst.code,
                                                                       "DCGM_FR_UNKNOWN")
            for pod in _pods(d):
                labels = {**base, "health_watch": watch, "health_error_code": code}
                if pod is not None:
                    labels.update(container=pod.container, namespace=pod.namespace,
                                  pod=pod.pod)
                family.add_sample(HEALTH_FAMILY, labels, HEALTH_RESULTS[status])
    return [family] if family.samples else []


def _pods(d: DeviceSample) -> list[PodRef | None]:
    """One series per container the kubelet gave this device to, as dcgm-exporter does with
    --kubernetes-virtual-gpus (shared GPUs); one unlabelled series for a device nobody has."""
    pods: list[PodRef | None] = list(dict.fromkeys(a.pod for a in d.allocations))
    return pods or [None]


def dcgm_families(devices: Iterable[tuple[str, DeviceSample]], host: str,
                  fields: tuple[Field, ...] = FIELDS, gen: Generation | None = None
                  ) -> Iterator[Metric]:
    """The dcgm-exporter families of ``devices``: (``gpu`` label value, merged sample) pairs
    of readable devices; ``fields``: those selected (--dcgm.counters), of generation ``gen``
    (its label names; the first generation's by default). A family without a value on any
    device is not emitted."""
    gen = gen or generation("dcgm")
    devices = list(devices)
    infos = {d.info.key: d.info for _, d in devices}
    families: dict[str, Metric] = {}
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for gpu, d in devices:
        base = _labels(gpu, d.info, infos.get(d.info.parent_key, d.info), host, gen)
        values = [(f, f.reading(d)) for f in fields]
        for pod in _pods(d):
            labels = base if pod is None else {
                **base, "container": pod.container, "namespace": pod.namespace, "pod": pod.pod}
            for f, found in values:
                key = (f.name, frozenset(labels.items()))
                # A GPU instance split in compute instances is one dcgm entity: its first.
                if found is None or key in seen:
                    continue
                seen.add(key)
                family = families.get(f.name)
                if family is None:
                    family = families[f.name] = Metric(
                        f.name, f.doc, "unknown" if f.counter else "gauge")
                value, read, mapping_key = found
                series = {**labels, "source": d.source_of(read.field, mapping_key)} \
                    if f.sourced else labels
                family.add_sample(f.name, series, value)
    yield from (families[f.name] for f in fields if f.name in families)


# -- dcgm-exporter's counters CSV (--dcgm.counters) -------------------------------------
# Its format (etc/default-counters.csv at the commit above): one field a line,
# "DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).", "#" starts a comment.
# Only the name matters here: our type, unit and help are the table's. dcgm-exporter's own
# DCGM_EXP_* families other than the health one have no counterpart here. A field is
# selected by its name in any generation (DCGM keeps the old names as deprecated aliases of
# the new: go-dcgm's const_fields.go), and known by its first generation's name.


@cache
def _keys() -> Mapping[str, str]:
    """Every generation's name of a field -> its first generation's name."""
    return MappingProxyType({f.name: f.key for g in generations().values() for f in g.fields}
                            | {HEALTH_FAMILY: HEALTH_FAMILY})


@dataclass(frozen=True)
class Counters:
    """The names a counters CSV lists: those we serve (by their first generation's name,
    ``Field.key``), those we cannot, lines dropped."""

    fields: frozenset[str]
    unknown: tuple[str, ...]
    malformed: int


def parse_counters(text: str) -> Counters:
    """Never raises: a line that does not start with a field name is dropped and counted."""
    names: list[str] = []
    malformed = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split(",", 1)[0].strip()
        if name.startswith(("DCGM_FI_", "DCGM_EXP_")) and name.replace("_", "").isalnum():
            names.append(name)
        else:
            malformed += 1
    keys = _keys()
    return Counters(frozenset(keys[n] for n in names if n in keys),
                    tuple(dict.fromkeys(n for n in names if n not in keys)), malformed)
