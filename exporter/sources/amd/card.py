"""One amdgpu card's sample from its sysfs and hwmon files (no vendor library).

Owns: which files of ``class/drm/cardN/device`` feed which DeviceSample field, the
unit conversions, APU handling, the slow tier's limits and maxima, and how the binary
``gpu_metrics`` table fills what the text files do not say (by the merge's rule,
exporter.core.model.KEY_GROUPS).
The card's lifecycle (appearing, lost, gone) is exporter.sources.amd.backend's.

Every value here has ``source="sysfs"``, including those decoded from the binary
``gpu_metrics`` file (it is a sysfs file; docs/vendors-amd.md says which value
comes from where). Per-value problems are counted into ``Cycle.errors``:
``read`` (OS error on a file the card's layout lists), ``parse`` (not a number),
``gpu_metrics`` (undecodable table): exporter.core.fs.AttrReader's one rule.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.core import units
from exporter.core.fs import AttrReader, Planned, SysFS, planned
from exporter.core.labels import ErrorReason
from exporter.core.model import KEY_GROUPS, DeviceInfo, DeviceSample, copy_with, pci_uuid
from exporter.sources.amd import SYSFS_SOURCE as SOURCE
from exporter.sources.amd.ids import AmdgpuIds
from exporter.sources.amd.rates import AccumulatorRates, ResidencyFlags
from exporter.sources.discovery import DrmCard
from exporter.sources.kernel import hwmon
from exporter.sources.kernel.amdgpu import (
    DpmLevel,
    dpm_current_hz,
    dpm_max_hz,
    gfx_target,
    kfd_pci_bus_id,
    parse_kfd_properties,
    parse_pp_dpm,
    parse_ras_count,
)
from exporter.sources.kernel.amdgpu_gpu_metrics import (
    RESIDENCY_THROTTLERS,
    GpuMetrics,
    GpuMetricsError,
    parse_gpu_metrics,
)

_HWMON_SENSORS = {"edge": "edge", "junction": "junction", "mem": "memory"}


class _Files:
    """One card's device directory through its AttrReader, with the amdgpu text rules."""

    def __init__(self, reader: AttrReader, device_dir: str, errors: Counter[ErrorReason]) -> None:
        self.r = reader
        self.dir = device_dir
        self.errors = errors
        self._dpm: dict[str, list[DpmLevel]] = {}  # one read (and count) per cycle

    def text(self, name: str) -> str | None:
        return self.r.text(self.dir, name, self.errors)

    def number(self, name: str, unit: str) -> float | None:
        return self.r.number(self.dir, name, self.errors, 1.0, unit)

    def ratio(self, name: str) -> float | None:
        """A ``*_busy_percent`` file as 0..1 (a number that is no percentage: ``parse``)."""
        return _ratio(self.number(name, "count"), self.errors)  # not a number: counted there

    def dpm(self, name: str) -> list[DpmLevel]:
        if name not in self._dpm:
            levels, bad = parse_pp_dpm(self.text(name))
            self.errors[ErrorReason.PARSE] += bad
            self._dpm[name] = levels
        return self._dpm[name]

    def link_speed(self, name: str) -> int | None:
        return self.r.link_speed(self.dir, name, self.errors)

    def link_width(self, name: str) -> int | None:
        return self.r.link_width(self.dir, name, self.errors)


KFD_NODES = ("class", "kfd", "kfd", "topology", "nodes")


def kfd_architectures(sysfs: str) -> dict[str, str]:
    """PCI bus id -> gfx target (``gfx1103``) of every GPU node of the KFD topology
    (amdkfd, the compute side of amdgpu: ``class/kfd/kfd/topology/nodes/<N>/properties``,
    ``gfx_target_version`` and the node's PCI ``domain`` / ``location_id``). Empty where
    the kernel has no KFD (built without CONFIG_HSA_AMD) or it cannot be listed."""
    root = SysFS(sysfs)
    try:
        nodes = sorted(os.listdir(root.path(*KFD_NODES)))
    except OSError:
        return {}
    out: dict[str, str] = {}
    for node in nodes:
        props = parse_kfd_properties(root.read_text(*KFD_NODES, node, "properties"))
        target = gfx_target(props.get("gfx_target_version", 0))
        bus = kfd_pci_bus_id(props)
        if target and bus is not None:
            out.setdefault(bus, target)
    return out


def static_missing(info: DeviceInfo, reader: AttrReader, device_dir: str,
                   sysfs: str) -> list[str]:
    """What a card's static information still lacks that its driver writes: the name
    (from ``product_name`` or ``device`` / ``revision``), the memory size files, and the
    gfx target where the kernel has a KFD topology. A card found again before its driver
    finished creating its files (a rebind, a reset, a hot-plug) lacks them at first;
    the backend reads them again on the slow tier until none is missing."""
    missing = [] if info.name else ["name"]
    listed = reader.names(device_dir)
    missing += [f for f in ("mem_info_vram_total", "mem_info_gtt_total") if f not in listed]
    if not info.architecture and os.path.isdir(SysFS(sysfs).path(*KFD_NODES)):
        missing.append("architecture")
    return missing


def device_info(card: DrmCard, ids: AmdgpuIds | None = None,
                driver_version: str = "", architecture: str = "") -> DeviceInfo:
    """Static identity: product_name (else libdrm's name for device + revision),
    unique_id (the uuid), vbios_version; ``driver_version`` is the backend's,
    ``architecture`` the card's gfx target from the KFD topology (kfd_architectures)."""
    r = _Files(AttrReader(keep=False), os.fspath(card.device_dir), Counter())
    unique_id = r.text("unique_id")
    name = r.text("product_name") or ""
    if not name and ids is not None:
        name = ids.name(r.text("device"), r.text("revision"))
    return DeviceInfo(
        vendor="amd",
        pci_bus_id=card.pci_bus_id,
        uuid=unique_id or pci_uuid(card.pci_bus_id),
        name=name,
        driver=card.driver,
        driver_version=driver_version,
        architecture=architecture,
        vbios_version=r.text("vbios_version") or "",
        serial=r.text("serial_number") or "",
        device_node=card.card,
    )


def is_apu(metrics: GpuMetrics | None, voltage_labels: Collection[str]) -> bool:
    """APU: gpu_metrics v2.x/v3.x are the APU tables; ``vddnb`` exists on APUs only."""
    return (metrics is not None and metrics.format_revision >= 2) or "vddnb" in voltage_labels


def _first(values: dict[str, float], *preferred: str) -> float | None:
    for key in preferred:
        if key in values:
            return values[key]
    return next(iter(values.values()), None)


@dataclass(frozen=True)
class _Slow:
    """Values read on the slow tier: limits and maxima set by firmware or the operator."""

    # Every sensor's own thresholds, (sensor, threshold) -> °C.
    limits: dict[tuple[str, str], float] = field(default_factory=dict)
    power_limit: float | None = None
    max_clocks: dict[str, float] = field(default_factory=dict)
    max_generation: int | None = None
    max_width: int | None = None
    # Slow-tier readings of things that change rarely: the link the SMU runs now (it
    # follows the power state), memory sizes, and the error counters (a counter read
    # less often loses nothing).
    generation: int | None = None
    width: int | None = None
    vram_total: float | None = None
    gtt_total: float | None = None
    replays: int | None = None
    ecc: dict[str, int] = field(default_factory=dict)


class CardCounters:
    """What one card's sample needs from the previous one: XGMI accumulators and the
    throttler residencies (MI300's gpu_metrics v1.6+, the APU's v3.0) become rates and flags
    across cycles."""

    def __init__(self) -> None:
        self.xgmi: AccumulatorRates[tuple[str, str]] = AccumulatorRates()
        self.residency = ResidencyFlags()
        self.fan_max: dict[str, float | None] = {}  # hwmon pwmN_max / fanN_max, by path
        self.slow: _Slow | None = None  # the slow tier's values, kept between slow cycles

    def xgmi_rates(self, metrics: GpuMetrics) -> dict[tuple[str, str], float]:
        if not (metrics.xgmi_read_bytes or metrics.xgmi_write_bytes or self.xgmi.known):
            return {}  # a table without XGMI (all but MI300's), nothing to forget
        # "read" data arrived over the link (rx), "write" data left through it (tx).
        counters = {**{(link, "rx"): v for link, v in metrics.xgmi_read_bytes.items()},
                    **{(link, "tx"): v for link, v in metrics.xgmi_write_bytes.items()}}
        # The driver's timestamp of the table, so a cached table is not a zero rate.
        now = metrics.system_clock_ns / 1e9 if metrics.system_clock_ns else time.monotonic()
        return self.xgmi.update(now, counters)


GPU_METRICS_BYTES = 16384  # a binary attribute: the largest table (MI300, v1.5) is ~1.4 KB
# What the gpu_metrics table stands in for where the files do not say it.
_TABLE_TEMPS = ("edge", "junction", "memory")
_TABLE_CLOCKS = ("graphics", "memory")


def read_card(card: DrmCard, info: DeviceInfo, errors: Counter[ErrorReason],
              counters: CardCounters | None = None,
              reader: AttrReader | None = None, slow: bool = True) -> DeviceSample:
    """One sample of one card; never raises for a bad value (it is skipped and counted).

    Limits and maxima (temperature thresholds, power cap, DPM maxima, max PCIe link,
    fan maxima, memory sizes) and the slowly changing readings (the PCIe link now, the
    PCIe replay and RAS error counters) are read on slow cycles (and the first one) and
    kept in ``counters`` meanwhile.

    The card's files (text attributes, hwmon) come first; the binary ``gpu_metrics``
    table fills what they do not say, through the same field-by-field merge that
    joins backends (exporter.pipeline.merge), so "first value wins" lives in one place.
    """
    reader = reader or AttrReader(keep=False)
    device_dir = os.fspath(card.device_dir)
    metrics: GpuMetrics | None = None
    blob = reader.raw(device_dir, "gpu_metrics", errors, GPU_METRICS_BYTES)
    if blob:
        try:
            metrics = parse_gpu_metrics(blob)
            if metrics.dropped:
                errors[ErrorReason.PARSE] += metrics.dropped
        except GpuMetricsError:
            errors[ErrorReason.GPU_METRICS] += 1
    counters = counters or CardCounters()
    files = _from_files(_Files(reader, device_dir, errors), info, metrics, counters, slow)
    if metrics is None:
        return files
    return fill(files, _from_gpu_metrics(metrics, counters))


# field -> the other DeviceSample fields of its key group (KEY_GROUPS)
_GROUPED = {name: tuple(other for other, g in KEY_GROUPS.items() if g == group
                        and other != name and other in DeviceSample.__dataclass_fields__)
            for name, group in KEY_GROUPS.items()}


def fill(files: DeviceSample, table: Mapping[str, Any]) -> DeviceSample:
    """``files`` with what only ``table`` (field -> value, as a DeviceSample of the same
    source and card would hold it) says, by exporter.pipeline.merge's rule: the first
    value wins, field by field and key by key; a key of a key group belongs to the sample
    that has it first in any field of the group. It looks only at the fields the table
    has, not at every field of two samples as ``merge_device`` does (a third of an
    amdgpu fast cycle); tests/test_amd.py checks it gives what ``merge_device`` gives.
    Clocks and engines keep their name order whichever side gave which key (_from_files
    writes its own in name order)."""
    changes: dict[str, Any] = {}
    ours = files.__dict__  # the fields, by name (copy_with's rule)
    for name, value in table.items():
        if value is None:
            continue
        mine = ours[name]
        if value.__class__ is dict:
            if not value or value.keys() <= mine.keys():
                continue  # nothing the files do not say (the temperatures, the clocks)
            # the files' keys in the other fields of its key group: theirs too
            owned = [keys for other in _GROUPED.get(name, ()) if (keys := ours[other])]
            if not mine and not owned:
                changes[name] = value
                continue
            extra = {k: v for k, v in value.items()
                     if k not in mine and not any(k in keys for keys in owned)}
            if extra:
                changes[name] = {**mine, **extra}
        elif mine is None:
            changes[name] = value
    for name in ("clocks_hertz", "engine_utilization_ratio"):
        if name in changes and len(changes[name]) > 1:
            changes[name] = dict(sorted(changes[name].items()))
    return copy_with(files, **changes) if changes else files


def _hwmon_values(r: _Files, slow: bool, fan_max: dict[str, float | None]
                  ) -> dict[str, dict[Any, float]]:
    """Every hwmon chip of the card, by kind; thresholds and caps only when ``slow``."""
    out: dict[str, dict[Any, float]] = {k: {} for k in (
        "temps", "limits", "power", "caps", "energy", "fans", "freqs", "volts")}
    reader, errors = r.r, r.errors
    for chip in hwmon.hwmon_dirs(r.dir, reader):
        d = os.fspath(chip)  # once, not in each reader below
        raw_temps = hwmon.read_temperatures(d, errors, reader)
        out["temps"].update({_HWMON_SENSORS.get(k, k): v for k, v in raw_temps.items()})
        if slow:
            for kind, name in (("crit", "critical"), ("emergency", "shutdown")):
                by_label = hwmon.read_temperature_thresholds(d, kind, errors, reader)
                out["limits"].update({(_HWMON_SENSORS.get(k, k), name): v
                                      for k, v in by_label.items()})
            out["caps"].update(hwmon.read_power_caps(d, "cap", errors, reader))
        out["power"].update(hwmon.read_power(d, errors, reader))
        out["energy"].update(hwmon.read_energy(d, errors, reader))
        out["fans"].update(hwmon.read_fan_ratios(d, errors, reader, maxima=fan_max,
                                                 refresh=slow))
        out["freqs"].update(hwmon.read_frequencies(d, errors, reader))
        out["volts"].update(hwmon.read_voltages(d, errors, reader))
    return out


# The text attributes a fast cycle reads: (name, unit); "ratio" is a *_busy_percent.
_FAST_FILES = (("gpu_busy_percent", "ratio"), ("mem_busy_percent", "ratio"),
               ("vcn_busy_percent", "ratio"), ("mem_info_vram_used", "bytes"),
               ("mem_info_gtt_used", "bytes"))
_FAST_KINDS = ("temps", "power", "energy", "freqs", "volts")


@dataclass(frozen=True)
class _FastPlan:
    """What a fast cycle reads, found once per layout (``AttrReader.memo``: until the
    card's layout is listed again): every file as a ``planned`` entry for
    ``AttrReader.numbers`` and where each value goes, so a cycle is one loop."""

    reads: list[Planned]
    # reads[i] for i < len(channels): (index of its kind in _FAST_KINDS, label); the first
    # channel of a label wins, as in the hwmon readers.
    channels: list[tuple[int, str]]
    files: tuple[int | None, ...]  # each of _FAST_FILES' index in reads, None: not listed
    fans: hwmon.FanPlan | None  # the one hwmon chip's fans; None where there is no chip
    duties: slice  # their pwm duty cycles in reads


def _fast_plan(r: _Files) -> _FastPlan | None:
    """The card's plan; None where its hwmon layout is not one chip whose temperature
    labels stay distinct once renamed (_HWMON_SENSORS): those keep _hwmon_values' way
    of joining chips (the last chip's value wins a label, the first channel within one)."""
    chips = hwmon.hwmon_dirs(r.dir, r.r)
    if len(chips) > 1:
        return None
    channels = hwmon.channel_files(chips[0], r.r) if chips else []
    temps = {label for kind, label, *_ in channels if kind == "temps"}
    if len({_HWMON_SENSORS.get(k, k) for k in temps}) != len(temps):
        return None
    reads = [planned(path, scale, unit) for _, _, path, scale, unit in channels]
    plan = [(_FAST_KINDS.index(kind), _HWMON_SENSORS.get(label, label) if kind == "temps"
             else label) for kind, label, *_ in channels]
    fans = hwmon.fan_plan(chips[0], r.r) if chips else None
    start = len(reads)
    reads += [duty for _, duty, _ in fans[0]] if fans else []
    duties = slice(start, len(reads))
    files: list[int | None] = []
    listed = r.r.names(r.dir)
    for name, unit in _FAST_FILES:
        files.append(len(reads) if name in listed else None)
        if name in listed:
            reads.append(planned(f"{r.dir}/{name}", 1.0, "count" if unit == "ratio" else unit))
    return _FastPlan(reads, plan, tuple(files), fans, duties)


def _ratio(percent: float | None, errors: Counter[ErrorReason]) -> float | None:
    """A ``*_busy_percent`` value as 0..1 (a number that is no percentage: ``parse``)."""
    value = units.ratio_from_percent(percent)
    if value is None and percent is not None:
        errors[ErrorReason.PARSE] += 1
    return value


def _from_files(r: _Files, info: DeviceInfo, metrics: GpuMetrics | None,
                counters: CardCounters, slow: bool) -> DeviceSample:
    """What the card's text attributes and hwmon chips say: a fast cycle by the card's
    _FastPlan where it has one, else (and on slow cycles) file by file."""
    slow = slow or counters.slow is None
    plan = None if slow else r.r.memo(("amd-fast", r.dir), lambda: _fast_plan(r))
    if plan is None:
        hw = _hwmon_values(r, slow, counters.fan_max)
        util = r.ratio("gpu_busy_percent")
        mem_util = r.ratio("mem_busy_percent")
        video = r.ratio("vcn_busy_percent")
        vram_used = r.number("mem_info_vram_used", "bytes")
        gtt_used = r.number("mem_info_gtt_used", "bytes")
    else:
        values = r.r.numbers(plan.reads, r.errors)
        kinds: list[dict[Any, float]] = [{}, {}, {}, {}, {}]
        for (kind, label), value in zip(plan.channels, values, strict=False):  # the files follow
            if value is not None:
                into = kinds[kind]
                if label not in into:
                    into[label] = value
        temps, power, energy, freqs, volts = kinds
        fans = {} if plan.fans is None else hwmon.fan_ratios(
            plan.fans, values[plan.duties], r.errors, r.r, counters.fan_max, refresh=False)
        hw = {"temps": temps, "power": power, "energy": energy, "fans": fans,
              "freqs": freqs, "volts": volts}
        util, mem_util, video, vram_used, gtt_used = (
            None if i is None else values[i] for i in plan.files)
        util, mem_util, video = (_ratio(util, r.errors), _ratio(mem_util, r.errors),
                                 _ratio(video, r.errors))
    clocks: dict[str, float] = {}
    for clock, label, table in (("graphics", "sclk", "pp_dpm_sclk"),
                                ("memory", "mclk", "pp_dpm_mclk")):
        value = hw["freqs"].get(label) or dpm_current_hz(r.dpm(table))
        if value is not None:
            clocks[clock] = value
    if slow:
        # PCIe: the starred pp_dpm_pcie level is the link the SMU runs; Navi dGPUs sit
        # behind an internal switch whose current_link_* shows the switch's link instead.
        pcie = [lvl for lvl in r.dpm("pp_dpm_pcie") if lvl.current]
        gen = units.pcie_generation(pcie[0].pcie_gts) if pcie else None
        width = pcie[0].pcie_width if pcie else None
        if gen is None:
            gen = r.link_speed("current_link_speed")
        if width is None:
            width = r.link_width("current_link_width")
        counters.slow = _Slow(
            limits=hw["limits"],
            power_limit=_first(hw["caps"], "PPT"),
            max_clocks={clock: hz for clock, table in (("graphics", "pp_dpm_sclk"),
                                                       ("memory", "pp_dpm_mclk"))
                        if (hz := dpm_max_hz(r.dpm(table))) is not None},
            max_generation=r.link_speed("max_link_speed"),
            max_width=r.link_width("max_link_width"),
            generation=gen,
            width=width,
            vram_total=r.number("mem_info_vram_total", "bytes"),
            gtt_total=r.number("mem_info_gtt_total", "bytes"),
            replays=_int(r.number("pcie_replay_count", "count")),
            ecc=_ras_counts(r),
        )
    limits = counters.slow
    assert limits is not None

    vram_total = limits.vram_total
    gtt_total = limits.gtt_total
    if is_apu(metrics, hw["volts"]):
        # The "VRAM" of an APU is a carve-out of system RAM: report it with GTT as
        # shared memory, and no device-local memory, rather than pretend it is VRAM.
        shared_total = _sum(vram_total, gtt_total)
        shared_used = _sum(vram_used, gtt_used)
        vram_total = vram_used = None
    else:
        shared_total, shared_used = gtt_total, gtt_used
    vram_free = None
    if vram_total is not None and vram_used is not None and vram_used <= vram_total:
        vram_free = vram_total - vram_used

    return DeviceSample(
        info=info,
        source=SOURCE,
        utilization_ratio=util,
        memory_utilization_ratio=mem_util,
        memory_total_bytes=vram_total,
        memory_used_bytes=vram_used,
        memory_free_bytes=vram_free,
        shared_memory_total_bytes=shared_total,
        shared_memory_used_bytes=shared_used,
        temperatures_celsius=hw["temps"],
        temperature_limits_celsius=limits.limits,
        power_watts=_first(hw["power"], "PPT"),
        power_limit_watts=limits.power_limit,
        energy_joules=_first(hw["energy"]),
        fan_speed_ratio=hw["fans"],
        voltages_volts=hw["volts"],
        clocks_hertz=clocks,
        clocks_max_hertz=limits.max_clocks,
        pcie_link_generation=limits.generation,
        pcie_link_width=limits.width,
        pcie_link_max_generation=limits.max_generation,
        pcie_link_max_width=limits.max_width,
        pcie_replay_errors=limits.replays,
        engine_utilization_ratio={"video": video} if video is not None else {},
        ecc_errors=limits.ecc,
    )


def _ras_counts(r: _Files) -> dict[str, int]:
    """RAS ``ras/<block>_err_count`` files, summed over blocks by kind."""
    ras = f"{r.dir}/ras"
    blocks = r.r.memo(("ras", ras), lambda: sorted(
        n for n in r.r.names(ras) if n.endswith("_err_count")))
    ecc: dict[str, int] = {}
    for name in blocks:
        counts, bad = parse_ras_count(r.r.text(ras, name, r.errors))
        r.errors[ErrorReason.PARSE] += bad
        for kind, count in counts.items():
            ecc[kind] = ecc.get(kind, 0) + count
    return ecc


def _from_gpu_metrics(metrics: GpuMetrics, counters: CardCounters) -> dict[str, Any]:
    """What the gpu_metrics table says, by DeviceSample field (None or empty: it does not
    say): some values only it has (throttling, XGMI), the rest fills in where the files
    are silent (fill)."""
    engines = {"gfx": metrics.gfx_activity_ratio, "video": metrics.video_activity_ratio}
    return {
        "utilization_ratio": metrics.gfx_activity_ratio,
        "memory_utilization_ratio": metrics.memory_activity_ratio,
        "temperatures_celsius": {s: v for s, v in metrics.temperatures_celsius.items()
                                 if s in _TABLE_TEMPS},
        "power_watts": metrics.socket_power_watts,
        "energy_joules": metrics.energy_joules,
        "clocks_hertz": {c: v for c, v in metrics.clocks_hertz.items() if c in _TABLE_CLOCKS},
        "throttle_reasons": metrics.throttle_reasons or counters.residency.update(
            metrics.throttle_residency, RESIDENCY_THROTTLERS),
        "engine_utilization_ratio": {k: v for k, v in engines.items() if v is not None},
        "xgmi_throughput_bytes_per_second": counters.xgmi_rates(metrics),
        "nvlink_up": {(link, "gpu"): up for link, up in metrics.xgmi_link_up.items()},
    }


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)
