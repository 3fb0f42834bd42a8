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
  else i915's unlabelled energy1, else "pkg"), power in W from the energy delta
  between two samples (``field_sources["power_watts"] = "sysfs_energy_delta"``, no
  power series on the first sample), power limit, "pkg"/"vram" temperatures and the
  pkg crit/emergency thresholds, fans as fanN_input / fanN_max.
- PCIe link, and xe ``tile<T>/physical_vram_size_bytes`` as memory total.

Engine utilisation is not read here (it comes from the fdinfo backend); GT idle
residency (``gtidle/idle_residency_ms``) has no METRICS.md family and is not read.
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

from exporter import hwmon
from exporter.backends.base import KERNEL, BackendUnavailable, Cycle
from exporter.backends.intel_parse import (
    device_name,
    first_present,
    gt_clock_label,
    map_throttle_reasons,
    mhz_to_hertz,
    parse_int,
    parse_link_speed,
    parse_link_width,
    power_from_energy,
)
from exporter.config import Config
from exporter.discovery import DrmCard, DrmDiscovery
from exporter.fs import clean_text, read_bytes, read_int, read_text
from exporter.model import DeviceInfo, DeviceSample, pci_uuid

log = structlog.get_logger(__name__).bind(backend="intel")

DRIVERS = ("i915", "xe")
SOURCE = "sysfs"
POWER_SOURCE = "sysfs_energy_delta"
HWMON_NAMES = ("xe", "i915")

# hwmon channel labels -> METRICS.md `sensor`. xe also labels mctrl, pcie and
# vram_ch_<N> sensors (Battlemage); METRICS has no sensor value for them, so they
# stay out rather than invent label values.
TEMP_SENSORS = {"pkg": "package", "vram": "vram"}
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


def read_attr_int(path: Path, errors: Counter[str]) -> int | None:
    """One integer attribute; a missing file is "not exposed", a failing one is counted."""
    raw = read_bytes(path)
    if raw is None:
        # EAGAIN/ENODATA/EACCES/EISDIR on a file that is there: count it, go on.
        if os.path.lexists(path):
            errors["read"] += 1
        return None
    text = clean_text(raw)  # NUL padding, trailing whitespace, "N/A", empty -> None
    value = parse_int(text)
    if text is not None and value is None:
        errors["parse"] += 1
    return value


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
    bridge = (read_int(directory / "class") or 0) >> 8 == 0x0604
    return bridge and read_int(directory / "vendor") == 0x8086


@dataclass(frozen=True)
class _Slow:
    """Values read on the slow tier: set by the operator or firmware, rarely changing."""

    limit_watts: float | None = None
    thresholds_celsius: dict[str, float] = field(default_factory=dict)


@dataclass
class _CardState:
    info: DeviceInfo
    link_dir: Path
    energy: tuple[float, float] | None = None  # last (joules, monotonic seconds)
    energy_channel: str | None = None  # hwmon label the counter is read from
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
        self.retry_interval = config.interval

    def open(self) -> Sequence[DeviceInfo]:
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
            state = self._states[card] = _CardState(info, _link_dir(card.device_dir))
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
        energy: float | None = None
        chips = [d for d in hwmon.hwmon_dirs(dev) if hwmon.hwmon_name(d) in HWMON_NAMES]
        for chip in chips:
            for label, celsius in hwmon.read_temperatures(chip, errors).items():
                if label in TEMP_SENSORS:
                    temps.setdefault(TEMP_SENSORS[label], celsius)
            fans.update(_read_fan_ratios(chip, errors))
            if energy is None:
                if state.energy_channel is None:
                    state.energy_channel = _energy_channel(chip)
                if state.energy_channel is not None:
                    energy = hwmon.read_energy(chip, errors).get(state.energy_channel)
        if slow or state.slow is None:
            state.slow = _read_slow(chips, errors)

        power: float | None = None
        if energy is not None:
            now = (energy, self._clock())
            power = power_from_energy(state.energy, now)
            state.energy = now

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
            pcie_link_generation=parse_link_speed(read_text(link / "current_link_speed")),
            pcie_link_width=parse_link_width(read_text(link / "current_link_width")),
            pcie_link_max_generation=parse_link_speed(read_text(link / "max_link_speed")),
            pcie_link_max_width=parse_link_width(read_text(link / "max_link_width")),
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
        size = read_attr_int(tile / "physical_vram_size_bytes", errors)
        if size is not None:
            vram = (vram or 0.0) + size
        for gt in _numbered(tile, "gt"):
            label = gt_clock_label(read_text(gt / "gtidle" / "name"), gt.name)
            if label is None or label in clocks or label in max_clocks:
                continue
            freq = gt / "freq0"
            act = mhz_to_hertz(read_attr_int(freq / "act_freq", errors))
            top = mhz_to_hertz(read_attr_int(freq / "rp0_freq", errors))
            if top is None:
                top = mhz_to_hertz(read_attr_int(freq / "max_freq", errors))
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
    act = mhz_to_hertz(read_attr_int(base / f"{prefix}act_freq_mhz", errors))
    top = mhz_to_hertz(read_attr_int(base / f"{prefix}RP0_freq_mhz", errors))
    if top is None:
        top = mhz_to_hertz(read_attr_int(base / f"{prefix}max_freq_mhz", errors))
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
        value = read_attr_int(directory / name, errors)
        if value is not None:
            bits[name.removeprefix(prefix)] = value
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
        rpm = read_attr_int(chip / filename, errors)
        top = read_attr_int(chip / f"fan{index}_max", errors)
        if rpm is not None and top:
            out[str(index - 1)] = min(max(rpm / top, 0.0), 1.0)
    return out


def _energy_channel(chip: Path) -> str | None:
    """The hwmon label to take the energy counter from, chosen once per card.

    Chosen by which channels exist, not by which read well this cycle: falling back
    to "pkg" when "card" fails once would splice two counters and fake a power spike.
    """
    try:
        names = os.listdir(chip)
    except OSError:
        return None
    labels = [
        read_text(chip / f"energy{index}_label") or f"energy{index}"
        for index, _ in hwmon.channels(names, "energy", "input")
    ]
    return next((c for c in ENERGY_CHANNELS if c in labels), None)


def _read_slow(chips: list[Path], errors: Counter[str]) -> _Slow:
    """Power limit and pkg temperature thresholds."""
    limit: float | None = None
    thresholds: dict[str, float] = {}
    for chip in chips:
        if limit is None:
            limit = first_present(hwmon.read_power_caps(chip, "max", errors), LIMIT_CHANNELS)
        if limit is None:
            limit = first_present(hwmon.read_power_caps(chip, "cap", errors), LIMIT_CHANNELS)
        for kind, threshold in TEMP_THRESHOLDS.items():
            value = hwmon.read_temperature_thresholds(chip, kind, errors).get("pkg")
            if value is not None:
                thresholds.setdefault(threshold, value)
    return _Slow(limit, thresholds)
