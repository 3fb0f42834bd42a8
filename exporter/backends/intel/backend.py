"""Intel GPUs (i915 and xe kernel drivers) from sysfs and hwmon: no vendor library.

Owns: turning one i915/xe DRM card's sysfs files into a DeviceSample each cycle.

- Clocks: xe ``device/tile<T>/gt<G>/freq0/{act,rp0,max}_freq``; i915 per-GT
  ``card<N>/gt/gt<G>/rps_{act,RP0,max}_freq_mhz``, else the card-level
  ``gt_{act,RP0,max}_freq_mhz``. MHz -> Hz. The render GT is clock "graphics", the
  xe media GT (``gtidle/name`` "gt<N>-mc") is clock "video". The current clock is the
  *actual* one (``act``: 0 while the GT sleeps in RC6), not the requested ``cur``;
  the max is RP0 (the hardware maximum), else the user-set ``max``.
- Throttle reasons of the render GT (xe ``freq0/throttle/reason_*``, i915
  ``gt/gt0/throttle_reason_*``), mapped in intel_parse.THROTTLE_REASONS.
- hwmon (dGPUs only; iGPUs have none): energy counter (µJ -> J; the "card" channel,
  else i915's unlabelled energy1, else "pkg", chosen by exporter.backends.energy: a
  channel that reads 0 or stands still while another counts is not exported), power
  in W from the energy delta between two samples (``field_sources["power_watts"] =
  "sysfs_energy_delta"``, no power series on the first sample), power limit,
  "pkg"/"vram" temperatures (i915's unlabelled temp1 is the package) and the pkg
  crit/emergency thresholds, fans as fanN_input / fanN_max.

Every number goes through exporter.units: text that is not a number, NaN, infinities,
more than 20 digits or a value outside its unit's range is dropped and counted as
``parse``; it never reaches the output and never marks the card down.
- PCIe link, and xe ``tile<T>/physical_vram_size_bytes`` as memory total.

Engine utilisation is not read here (it comes from the fdinfo backend); GT idle
residency (``gtidle/idle_residency_ms``) has no docs/metrics.md family and is not read.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from exporter import units
from exporter.backends.base import KERNEL, BackendUnavailable, Cycle
from exporter.backends.energy import EnergyCounter
from exporter.config import Config
from exporter.discovery import DrmCard, DrmDiscovery
from exporter.fs import clean_text, read_bytes, read_text
from exporter.kernel import hwmon
from exporter.kernel.i915_xe import (
    device_name,
    first_present,
    gt_clock_label,
    map_throttle_reasons,
    temperature_sensor,
)
from exporter.model import DeviceInfo, DeviceSample, pci_uuid

log = structlog.get_logger(__name__).bind(backend="intel")

DRIVERS = ("i915", "xe")
SOURCE = "sysfs"
POWER_SOURCE = "sysfs_energy_delta"
HWMON_NAMES = ("xe", "i915")

# hwmon tempN_crit / tempN_emergency of the pkg sensor -> METRICS `threshold`.
# (xe's temp2_max reads 60 °C on a B580 at idle: not a max operating temperature.)
TEMP_THRESHOLDS = {"crit": "critical", "emergency": "shutdown"}
ENERGY_CHANNELS = ("card", "energy1", "pkg")
# Sustained limit (PL1: power1_max card, power2_max package), else the burst limit
# (PL2: powerN_cap), which is the only one a B580 exposes. powerN_crit (I1) is a
# protection threshold, not the limit the GPU runs at, and is not used.
LIMIT_CHANNELS = ("card", "power1", "pkg", "power2")

_NUMBERED = re.compile(r"(tile|gt)(\d+)")


def _numbered(parent: Path, prefix: str) -> list[Path]:
    """``tile0``, ``gt0``, ``gt1``, ... under ``parent``, ordered by number."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    found = [
        (int(m.group(2)), n)
        for n in names
        if (m := _NUMBERED.fullmatch(n)) and m.group(1) == prefix
    ]
    return [parent / n for _, n in sorted(found)]


MHZ = 1_000_000


def read_attr(
    path: Path, errors: Counter[str], scale: float = 1, unit: str = "count"
) -> float | None:
    """One numeric attribute in ``unit`` (after ``scale``); a missing file is "not
    exposed", a failing read counts as ``read``, garbage or an impossible value as ``parse``."""
    raw = read_bytes(path)
    if raw is None:
        # EAGAIN/ENODATA/EACCES/EISDIR on a file that is there: count it, go on.
        if os.path.lexists(path):
            errors["read"] += 1
        return None
    text = clean_text(raw)  # NUL padding, trailing whitespace, "N/A", empty -> None
    if text is None:
        return None
    value = units.parse_scaled(text, scale, unit)
    if value is None:
        errors["parse"] += 1
    return value


def _hwmon(
    read: Callable[..., dict[str, float]], chip: Path, unit: str, errors: Counter[str],
    *args: str,
) -> dict[str, float]:
    """An exporter.kernel.hwmon reader's channels, each bounded for ``unit`` (garbage counted).

    hwmon's own parser lets NaN and infinities through and overflows on a 400-digit
    file; this keeps both out of the output and the card up, whatever hwmon does.
    """
    try:
        values = read(chip, *args, errors=errors)
    except (ArithmeticError, ValueError):
        errors["parse"] += 1
        return {}
    out: dict[str, float] = {}
    for label, value in values.items():
        bounded = units.bounded(value, unit)
        if bounded is None:
            errors["parse"] += 1
        else:
            out[label] = bounded
    return out


def _link_dir(device_dir: Path) -> Path:
    """Where the GPU's host PCIe link is described.

    Arc dGPUs sit behind their own PCIe switch (upstream + downstream port, both
    vendor 0x8086, class 0x0604xx): the GPU function reports that internal link
    (2.5 GT/s x1). The link to the host is the switch's upstream port's, so walk up
    through at most those two Intel bridges. iGPUs and cards straight on a root port
    stay as they are.
    """
    top = device_dir.resolve()
    for _ in range(2):
        if not _is_intel_bridge(top.parent):
            break
        top = top.parent
    return top


def _is_intel_bridge(directory: Path) -> bool:
    bridge = (units.parse_int(read_text(directory / "class")) or 0) >> 8 == 0x0604
    return bridge and units.parse_int(read_text(directory / "vendor")) == 0x8086


@dataclass(frozen=True)
class _Slow:
    """Values read on the slow tier: set by the operator or firmware, rarely changing."""

    limit_watts: float | None = None
    thresholds_celsius: dict[str, float] = field(default_factory=dict)


@dataclass
class _CardState:
    info: DeviceInfo
    link_dir: Path
    energy: EnergyCounter
    energy_channels: list[str] | None = None  # hwmon energy labels present, preferred first
    slow: _Slow | None = None
    lost: bool = False


class IntelBackend:
    """The i915/xe cards DrmDiscovery finds, read through its sysfs root."""

    name = "intel"
    priority = KERNEL
    interval: float | None = None

    def __init__(
        self,
        config: Config,
        discovery: DrmDiscovery,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._discovery = discovery
        self._clock = clock  # injected so tests control the energy -> power interval
        self._states: dict[DrmCard, _CardState] = {}
        # open() only reads the cached card list: the collector may retry it every cycle.

    @property
    def retry_interval(self) -> float:
        """open() only reads the cached card list: retried every cycle, or less often
        where udev announces new cards (DrmDiscovery.retry_interval)."""
        return self._discovery.retry_interval(self._config.interval)

    def open(self) -> Sequence[DeviceInfo]:
        self._discovery.start()  # udev events on a real /sys (idempotent; shared with amd)
        cards = self._discovery.cards(DRIVERS)
        if not cards:
            raise BackendUnavailable(f"no i915/xe card under {self._config.sysfs}/class/drm")
        return [self._state(card).info for card in cards]

    def close(self) -> None:
        self._states.clear()

    def sample(self, slow: bool) -> Cycle:
        errors: Counter[str] = Counter()
        devices: list[DeviceSample] = []
        cards = self._discovery.cards(DRIVERS)
        for gone in set(self._states) - set(cards):
            del self._states[gone]
        for card in cards:
            state = self._state(card)
            try:
                sample = self._read_card(card, state, slow, errors)
            except Exception as exc:  # one card's surprise never ends the cycle
                errors["internal"] += 1
                if not state.lost:  # log the change, not every cycle
                    log.warning("intel card read failed", card=card.card, error=repr(exc))
                sample = DeviceSample(info=state.info, source=SOURCE, up=False)
            # Cleared only by a cycle that read the card: a card that raises every cycle
            # logs once. GPU lost/back itself is logged by the collector for every backend.
            state.lost = not sample.up
            devices.append(sample)
        return Cycle(devices=devices, errors=dict(errors))

    def _state(self, card: DrmCard) -> _CardState:
        state = self._states.get(card)
        if state is None:
            name, architecture = device_name(card.device_id)
            info = DeviceInfo(
                vendor="intel",
                pci_bus_id=card.pci_bus_id,
                uuid=pci_uuid(card.pci_bus_id),
                name=name,
                driver=card.driver,
                architecture=architecture,
                device_node=card.card,
            )
            state = self._states[card] = _CardState(
                info, _link_dir(card.device_dir), EnergyCounter(card.pci_bus_id))
        return state

    def _read_card(
        self, card: DrmCard, state: _CardState, slow: bool, errors: Counter[str]
    ) -> DeviceSample:
        dev = card.device_dir
        if not dev.is_dir():
            errors["gpu_lost"] += 1
            return DeviceSample(info=state.info, source=SOURCE, up=False)

        if card.driver == "xe":
            clocks, max_clocks, throttle, vram = _read_xe_gts(dev, errors)
        else:
            clocks, max_clocks, throttle = _read_i915_gt(dev.parent, errors)
            vram = None

        temps: dict[str, float] = {}
        fans: dict[str, float] = {}
        readings: dict[str, float | None] = {}
        chips = [(d, hwmon.hwmon_name(d)) for d in hwmon.hwmon_dirs(dev)]
        chips = [(d, name) for d, name in chips if name in HWMON_NAMES]
        for chip, chip_name in chips:
            for label, celsius in _hwmon(hwmon.read_temperatures, chip, "celsius",
                                         errors).items():
                sensor = temperature_sensor(chip_name, label)
                if sensor is not None:
                    temps.setdefault(sensor, celsius)
            fans.update(_read_fan_ratios(chip, errors))
            if not readings:
                if not state.energy_channels:
                    state.energy_channels = _energy_channels(chip)
                joules = _hwmon(hwmon.read_energy, chip, "joules", errors)
                readings = {c: joules.get(c) for c in state.energy_channels}
        if slow or state.slow is None:
            state.slow = _read_slow([c for c, _ in chips], errors)
        energy, power = state.energy.update(state.energy_channels or [], readings,
                                            self._clock())

        link = state.link_dir
        return DeviceSample(
            info=state.info,
            source=SOURCE,
            field_sources={"power_watts": POWER_SOURCE} if power is not None else {},
            memory_total_bytes=vram,
            temperatures_celsius=temps,
            temperature_thresholds_celsius=state.slow.thresholds_celsius,
            power_watts=power,
            power_limit_watts=state.slow.limit_watts,
            energy_joules=energy,
            fan_speed_ratio=fans,
            clocks_hertz=clocks,
            clocks_max_hertz=max_clocks,
            throttle_reasons=throttle,
            pcie_link_generation=units.parse_link_speed(read_text(link / "current_link_speed")),
            pcie_link_width=units.parse_link_width(read_text(link / "current_link_width")),
            pcie_link_max_generation=units.parse_link_speed(read_text(link / "max_link_speed")),
            pcie_link_max_width=units.parse_link_width(read_text(link / "max_link_width")),
        )


Clocks = dict[str, float]


def _read_xe_gts(
    dev: Path, errors: Counter[str]
) -> tuple[Clocks, Clocks, dict[str, bool], float | None]:
    """xe: every ``tile<T>/gt<G>``; the first render GT and first media GT win."""
    clocks: Clocks = {}
    max_clocks: Clocks = {}
    throttle: dict[str, bool] = {}
    vram: float | None = None
    for tile in _numbered(dev, "tile"):
        size = read_attr(tile / "physical_vram_size_bytes", errors, unit="bytes")
        if size is not None:
            vram = (vram or 0.0) + size
        for gt in _numbered(tile, "gt"):
            label = gt_clock_label(read_text(gt / "gtidle" / "name"), gt.name)
            if label is None or label in clocks or label in max_clocks:
                continue
            freq = gt / "freq0"
            act = read_attr(freq / "act_freq", errors, MHZ, "hertz")
            top = read_attr(freq / "rp0_freq", errors, MHZ, "hertz")
            if top is None:
                top = read_attr(freq / "max_freq", errors, MHZ, "hertz")
            if act is not None:
                clocks[label] = act
            if top is not None:
                max_clocks[label] = top
            if label == "graphics":
                throttle = _read_reasons(freq / "throttle", "reason_", errors)
    return clocks, max_clocks, throttle, vram


def _read_i915_gt(card_dir: Path, errors: Counter[str]) -> tuple[Clocks, Clocks, dict[str, bool]]:
    """i915: ``gt/gt0/rps_*_freq_mhz`` (kernels with per-GT sysfs), else ``gt_*_freq_mhz``."""
    gt0 = card_dir / "gt" / "gt0"
    if gt0.is_dir():
        base, prefix = gt0, "rps_"
        throttle = _read_reasons(gt0, "throttle_reason_", errors)
    else:
        base, prefix, throttle = card_dir, "gt_", {}
    clocks: Clocks = {}
    max_clocks: Clocks = {}
    act = read_attr(base / f"{prefix}act_freq_mhz", errors, MHZ, "hertz")
    top = read_attr(base / f"{prefix}RP0_freq_mhz", errors, MHZ, "hertz")
    if top is None:
        top = read_attr(base / f"{prefix}max_freq_mhz", errors, MHZ, "hertz")
    if act is not None:
        clocks["graphics"] = act
    if top is not None:
        max_clocks["graphics"] = top
    return clocks, max_clocks, throttle


def _read_reasons(directory: Path, prefix: str, errors: Counter[str]) -> dict[str, bool]:
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith(prefix))
    except OSError:
        return {}
    bits: dict[str, int] = {}
    for name in names:
        value = read_attr(directory / name, errors)
        if value is None:
            continue
        if value not in (0, 1):  # a reason bit is 0 or 1; anything else is garbage
            errors["parse"] += 1
            continue
        bits[name.removeprefix(prefix)] = int(value)
    return map_throttle_reasons(bits)


def _read_fan_ratios(chip: Path, errors: Counter[str]) -> dict[str, float]:
    """fanN_input / fanN_max, keyed "N-1" (hwmon fan1 is fan "0", as AMD and NVML number them).

    Not hwmon.read_fan_ratios: that prefers pwmN, and xe reads pwmN as 0 while the
    firmware fan curve (pwmN_enable 2) spins the fan at 1116 RPM (B580 capture).
    A fan without fanN_max (A380) has no ratio.
    """
    try:
        names = os.listdir(chip)
    except OSError:
        return {}
    out: dict[str, float] = {}
    for index, filename in hwmon.channels(names, "fan", "input"):
        if f"fan{index}_max" not in names:
            continue
        rpm = read_attr(chip / filename, errors, unit="rpm")
        top = read_attr(chip / f"fan{index}_max", errors, unit="rpm")
        if rpm is not None and top and (ratio := units.clamp_ratio(rpm / top)) is not None:
            out[str(index - 1)] = ratio
    return out


def _energy_channels(chip: Path) -> list[str]:
    """The hwmon energy labels this chip has, in ENERGY_CHANNELS' order of preference.

    Read once per card: which one is exported is EnergyCounter's choice among these.
    """
    try:
        names = os.listdir(chip)
    except OSError:
        return []
    labels = [
        read_text(chip / f"energy{index}_label") or f"energy{index}"
        for index, _ in hwmon.channels(names, "energy", "input")
    ]
    return [c for c in ENERGY_CHANNELS if c in labels]


def _read_slow(chips: list[Path], errors: Counter[str]) -> _Slow:
    """Power limit and pkg temperature thresholds."""
    limit: float | None = None
    thresholds: dict[str, float] = {}
    for chip in chips:
        for kind in ("max", "cap"):
            if limit is None:
                caps = _hwmon(hwmon.read_power_caps, chip, "watts", errors, kind)
                limit = first_present(caps, LIMIT_CHANNELS)
        for kind, threshold in TEMP_THRESHOLDS.items():
            value = _hwmon(hwmon.read_temperature_thresholds, chip, "celsius", errors,
                           kind).get("pkg")
            if value is not None:
                thresholds.setdefault(threshold, value)
    return _Slow(limit, thresholds)
