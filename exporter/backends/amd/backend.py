"""AMD GPUs through the amdgpu kernel driver's sysfs and hwmon files (no vendor library).

Owns: which files of ``class/drm/cardN/device`` feed which DeviceSample field, the
unit conversions, APU handling, and the per-card lifecycle (a card that vanishes is
reported once with ``up=False``, then dropped). Cards come from the shared
DrmDiscovery (``cards(["amdgpu"])`` each cycle, cached, refreshed by udev events).

Every value here has ``source="sysfs"``, including those decoded from the binary
``gpu_metrics`` file (it is a sysfs file; docs/vendors-amd.md says which value
comes from where). Per-value problems are counted into ``Cycle.errors``:
``read`` (OS error on a file that exists), ``parse`` (not a number),
``gpu_metrics`` (undecodable table).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import structlog

from exporter import units
from exporter.backends.amd.ids import AmdgpuIds, default_path
from exporter.backends.amd.rates import AccumulatorRates, ResidencyFlags
from exporter.backends.base import KERNEL, BackendUnavailable, Cycle
from exporter.config import Config
from exporter.discovery import DrmCard, DrmDiscovery
from exporter.fs import clean_text, read_bytes
from exporter.kernel import hwmon
from exporter.kernel.amdgpu import (
    DpmLevel,
    dpm_current_hz,
    dpm_max_hz,
    parse_pp_dpm,
    parse_ras_count,
)
from exporter.kernel.amdgpu_gpu_metrics import (
    MI300_THROTTLERS,
    GpuMetrics,
    GpuMetricsError,
    parse_gpu_metrics,
)
from exporter.model import DeviceInfo, DeviceSample, pci_uuid

log = structlog.get_logger(__name__)

SOURCE = "sysfs"
_HWMON_SENSORS = {"edge": "edge", "junction": "junction", "mem": "memory"}


class _Reader:
    """Reads one card's attributes, telling "not exposed" from "failed" for the counters."""

    def __init__(self, device_dir: Path, errors: Counter[str]) -> None:
        self.dir = device_dir
        self.errors = errors

    def text(self, name: str) -> str | None:
        path = self.dir / name
        if not os.path.lexists(path):
            return None  # this ASIC/kernel does not have the file: not an error
        raw = read_bytes(path)
        if raw is None:
            self.errors["read"] += 1  # EAGAIN/ENODATA/EIO, a dangling link, a directory
            return None
        return clean_text(raw)

    def number(self, name: str, unit: str, scale: float = 1.0) -> float | None:
        """A number in base units, bounded for ``unit``; garbage is dropped and counted."""
        text = self.text(name)
        value = None if hwmon.is_u64_sentinel(text) else units.parse_scaled(text, scale, unit)
        if value is None and text is not None:
            self.errors["parse"] += 1
        return value

    def ratio(self, name: str) -> float | None:
        """A ``*_busy_percent`` file as 0..1."""
        text = self.text(name)
        value = units.ratio_from_percent(units.parse_number(text))
        if value is None and text is not None:
            self.errors["parse"] += 1
        return value

    def dpm(self, name: str) -> list[DpmLevel]:
        levels, bad = parse_pp_dpm(self.text(name))
        self.errors["parse"] += bad
        return levels

    def link_speed(self, name: str) -> int | None:
        text = self.text(name)
        gen = units.parse_link_speed(text)
        # "Unknown" (no link: an APU, a powered-down port) is not an error; a number is.
        if gen is None and text is not None and any(c.isdigit() for c in text):
            self.errors["parse"] += 1
        return gen

    def link_width(self, name: str) -> int | None:
        text = self.text(name)
        width = units.parse_link_width(text)
        if width is None and text is not None and text.strip() != "0":
            self.errors["parse"] += 1
        return width

    def raw(self, name: str) -> bytes | None:
        path = self.dir / name
        if not os.path.lexists(path):
            return None
        data = read_bytes(path)
        if data is None:
            self.errors["read"] += 1
        return data


def device_info(card: DrmCard, ids: AmdgpuIds | None = None) -> DeviceInfo:
    """Static identity: product_name (else libdrm's name for device + revision),
    unique_id (the uuid), vbios_version."""
    r = _Reader(card.device_dir, Counter())
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
        vbios_version=r.text("vbios_version") or "",
        serial=r.text("serial_number") or "",
        device_node=card.card,
    )


def is_apu(metrics: GpuMetrics | None, voltage_labels: Sequence[str]) -> bool:
    """APU: gpu_metrics v2.x/v3.x are the APU tables; ``vddnb`` exists on APUs only."""
    return (metrics is not None and metrics.format_revision >= 2) or "vddnb" in voltage_labels


def _first(values: dict[str, float], *preferred: str) -> float | None:
    for key in preferred:
        if key in values:
            return values[key]
    return next(iter(values.values()), None)


class CardCounters:
    """What one card's sample needs from the previous one: XGMI accumulators and MI300
    throttler residencies (gpu_metrics v1.4+) become rates and flags across cycles."""

    def __init__(self) -> None:
        self.xgmi: AccumulatorRates[tuple[str, str]] = AccumulatorRates()
        self.residency = ResidencyFlags()

    def xgmi_rates(self, metrics: GpuMetrics) -> dict[tuple[str, str], float]:
        # "read" data arrived over the link (rx), "write" data left through it (tx).
        counters = {**{(link, "rx"): v for link, v in metrics.xgmi_read_bytes.items()},
                    **{(link, "tx"): v for link, v in metrics.xgmi_write_bytes.items()}}
        # The driver's timestamp of the table, so a cached table is not a zero rate.
        now = metrics.system_clock_ns / 1e9 if metrics.system_clock_ns else time.monotonic()
        return self.xgmi.update(now, counters)


def read_card(card: DrmCard, info: DeviceInfo, errors: Counter[str],
              counters: CardCounters | None = None) -> DeviceSample:
    """One sample of one card; never raises for a bad value (it is skipped and counted)."""
    r = _Reader(card.device_dir, errors)
    counters = counters or CardCounters()
    metrics: GpuMetrics | None = None
    blob = r.raw("gpu_metrics")
    if blob:
        try:
            metrics = parse_gpu_metrics(blob)
            errors["parse"] += metrics.dropped
        except GpuMetricsError:
            errors["gpu_metrics"] += 1

    temps: dict[str, float] = {}
    thresholds: dict[str, float] = {}
    limits: dict[tuple[str, str], float] = {}  # every sensor's own thresholds (health)
    power: dict[str, float] = {}
    caps: dict[str, float] = {}
    energy: dict[str, float] = {}
    fans: dict[str, float] = {}
    freqs: dict[str, float] = {}
    volts: dict[str, float] = {}
    for d in hwmon.hwmon_dirs(card.device_dir):
        raw_temps = hwmon.read_temperatures(d, errors)
        temps.update({_HWMON_SENSORS.get(k, k): v for k, v in raw_temps.items()})
        # Thresholds of the sensor that throttles: junction (hotspot) where it exists.
        hot = next((s for s in ("junction", "edge") if s in raw_temps), None)
        for kind, name in (("crit", "critical"), ("emergency", "shutdown")):
            by_label = hwmon.read_temperature_thresholds(d, kind, errors)
            limits.update({(_HWMON_SENSORS.get(k, k), name): v for k, v in by_label.items()})
            value = by_label.get(hot) if hot else _first(by_label)
            if value is not None:
                thresholds[name] = value
        power.update(hwmon.read_power(d, errors))
        caps.update(hwmon.read_power_caps(d, "cap", errors))
        energy.update(hwmon.read_energy(d, errors))
        for key, ratio in hwmon.read_fan_ratios(d, errors).items():
            fans[str(int(key.removeprefix("fan")) - 1)] = ratio  # fan1 -> "0", as NVML counts
        freqs.update(hwmon.read_frequencies(d, errors))
        volts.update(hwmon.read_voltages(d, errors))

    if metrics is not None:  # fill only what hwmon did not give
        for sensor in ("edge", "junction", "memory"):
            if sensor not in temps and sensor in metrics.temperatures_celsius:
                temps[sensor] = metrics.temperatures_celsius[sensor]

    sclk = r.dpm("pp_dpm_sclk")
    mclk = r.dpm("pp_dpm_mclk")
    clocks: dict[str, float] = {}
    for clock, label, levels in (("graphics", "sclk", sclk), ("memory", "mclk", mclk)):
        value = freqs.get(label) or dpm_current_hz(levels)
        if value is None and metrics is not None:
            value = metrics.clocks_hertz.get(clock)
        if value is not None:
            clocks[clock] = value
    max_clocks = {
        clock: hz
        for clock, levels in (("graphics", sclk), ("memory", mclk))
        if (hz := dpm_max_hz(levels)) is not None
    }

    # PCIe: the starred pp_dpm_pcie level is the link the SMU runs; Navi dGPUs sit
    # behind an internal switch whose current_link_* shows the switch's link instead.
    pcie = [lvl for lvl in r.dpm("pp_dpm_pcie") if lvl.current]
    gen = units.pcie_generation(pcie[0].pcie_gts) if pcie else None
    width = pcie[0].pcie_width if pcie else None
    if gen is None:
        gen = r.link_speed("current_link_speed")
    if width is None:
        width = r.link_width("current_link_width")

    util = r.ratio("gpu_busy_percent")
    mem_util = r.ratio("mem_busy_percent")
    engines: dict[str, float] = {}
    video = r.ratio("vcn_busy_percent")
    if metrics is not None:
        util = util if util is not None else metrics.gfx_activity_ratio
        mem_util = mem_util if mem_util is not None else metrics.memory_activity_ratio
        if metrics.gfx_activity_ratio is not None:
            engines["gfx"] = metrics.gfx_activity_ratio
        video = video if video is not None else metrics.video_activity_ratio
    if video is not None:
        engines["video"] = video

    vram_total = r.number("mem_info_vram_total", "bytes")
    vram_used = r.number("mem_info_vram_used", "bytes")
    gtt_total = r.number("mem_info_gtt_total", "bytes")
    gtt_used = r.number("mem_info_gtt_used", "bytes")
    apu = is_apu(metrics, list(volts))
    if apu:
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

    ecc: dict[str, int] = {}
    ras_dir = card.device_dir / "ras"
    if ras_dir.is_dir():
        for name in sorted(os.listdir(ras_dir)):
            if name.endswith("_err_count"):
                counts, bad = parse_ras_count(r.text(f"ras/{name}"))
                errors["parse"] += bad
                for kind, count in counts.items():
                    ecc[kind] = ecc.get(kind, 0) + count

    power_w = _first(power, "PPT")
    if power_w is None and metrics is not None:
        power_w = metrics.socket_power_watts
    energy_j = _first(energy)
    if energy_j is None and metrics is not None:
        energy_j = metrics.energy_joules

    throttle: dict[str, bool] = {}
    xgmi: dict[tuple[str, str], float] = {}
    links: dict[tuple[str, str], bool] = {}
    if metrics is not None:
        throttle = metrics.throttle_reasons or counters.residency.update(
            metrics.throttle_residency, MI300_THROTTLERS)
        xgmi = counters.xgmi_rates(metrics)
        links = {(link, "gpu"): up for link, up in metrics.xgmi_link_up.items()}

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
        temperatures_celsius=temps,
        temperature_thresholds_celsius=thresholds,
        temperature_limits_celsius=limits,
        power_watts=power_w,
        power_limit_watts=_first(caps, "PPT"),
        energy_joules=energy_j,
        fan_speed_ratio=fans,
        clocks_hertz=clocks,
        clocks_max_hertz=max_clocks,
        throttle_reasons=throttle,
        pcie_link_generation=gen,
        pcie_link_width=width,
        pcie_link_max_generation=r.link_speed("max_link_speed"),
        pcie_link_max_width=r.link_width("max_link_width"),
        pcie_replay_errors=_int(r.number("pcie_replay_count", "count")),
        engine_utilization_ratio=engines,
        ecc_errors=ecc,
        xgmi_throughput_bytes_per_second=xgmi,
        nvlink_up=links,
    )


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


class AmdBackend:
    """amdgpu sysfs backend. One "handle": the shared DrmDiscovery (and its udev monitor)."""

    name = "amd"
    priority = KERNEL
    interval: float | None = None

    def __init__(self, config: Config, discovery: DrmDiscovery) -> None:
        self.config = config
        self.discovery = discovery
        self._infos: dict[str, DeviceInfo] = {}  # card name -> identity
        self._cards: dict[str, DrmCard] = {}
        self._generation = -1
        self._counters: dict[str, CardCounters] = {}
        self._ids = AmdgpuIds(Path(config.amdgpu_ids) if config.amdgpu_ids
                              else default_path(config.sysfs))
        # open() only reads the cached card list: the collector may retry it every cycle.

    @property
    def retry_interval(self) -> float:
        """open() only reads the cached card list: retried every cycle, or less often
        where udev announces new cards (DrmDiscovery.retry_interval)."""
        return self.discovery.retry_interval(self.config.interval)

    def open(self) -> Sequence[DeviceInfo]:
        # With no card, stay down; the collector's reopen back-off calls us again and
        # discovery (kept current by udev events) then sees a card that arrived.
        self.discovery.start()
        cards = self.discovery.cards(["amdgpu"])
        if not cards:
            root = self.discovery.sysfs.path("class", "drm")
            raise BackendUnavailable(f"no amdgpu card under {root}")
        self._refresh(cards)
        return [self._infos[c.card] for c in cards]

    def _refresh(self, cards: list[DrmCard]) -> list[DrmCard]:
        """New cards get their static info read once; returns the cards that went away."""
        current = {c.card: c for c in cards}
        gone = [c for name, c in self._cards.items() if current.get(name) != c]
        for c in gone:
            self._infos.pop(c.card, None)
            self._counters.pop(c.card, None)
        for name, c in current.items():
            if name not in self._infos:
                self._infos[name] = device_info(c, self._ids)
        self._cards = current
        self._generation = self.discovery.generation
        return gone

    def sample(self, slow: bool) -> Cycle:
        errors: Counter[str] = Counter()
        gone_infos = {c.card: self._infos.get(c.card) for c in self._cards.values()}
        gone = self._refresh(self.discovery.cards(["amdgpu"]))
        devices: list[DeviceSample] = []
        for c in self._cards.values():
            try:
                counters = self._counters.setdefault(c.card, CardCounters())
                devices.append(read_card(c, self._infos[c.card], errors, counters))
            except Exception as exc:  # a card torn down mid-read: keep the others going
                errors["card"] += 1
                log.debug("amdgpu card read failed", card=c.card, reason=str(exc))
                devices.append(DeviceSample(info=self._infos[c.card], source=SOURCE, up=False))
        # A card that vanished is reported once as down, then its series go away.
        for c in gone:
            info = gone_infos.get(c.card)
            if info is not None and info.pci_bus_id not in {d.info.pci_bus_id for d in devices}:
                devices.append(DeviceSample(info=info, source=SOURCE, up=False))
        devices.sort(key=lambda d: d.info.pci_bus_id)
        return Cycle(devices=devices, errors={k: n for k, n in errors.items() if n})

    def close(self) -> None:
        # The discovery (and its udev observer) is shared with the Intel backend:
        # it is not ours to stop here.
        self._cards.clear()
        self._infos.clear()
        self._counters.clear()
