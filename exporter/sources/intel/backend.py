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
  else i915's unlabelled energy1, else "pkg", chosen by exporter.sources.energy: a
  channel that reads 0 or stands still while another counts is not exported), power
  in W from the energy delta between two samples (``field_sources["power_watts"] =
  "sysfs_energy_delta"``, no power series on the first sample), power limit,
  "pkg"/"vram" temperatures (i915's unlabelled temp1 is the package) and the pkg
  crit/emergency thresholds, fans as fanN_input / fanN_max.

Every number goes through exporter.core.units: text that is not a number, NaN, infinities,
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

from exporter.core import units
from exporter.core.config import Config
from exporter.core.fs import AttrReader, driver_version, read_text
from exporter.core.labels import Clock, ErrorReason, Sensor, Threshold
from exporter.core.model import DeviceInfo, DeviceSample, pci_uuid
from exporter.sources.base import KERNEL, BackendUnavailable, Capabilities, Cycle
from exporter.sources.discovery import DrmCard, DrmDiscovery
from exporter.sources.energy import EnergyCounter
from exporter.sources.kernel import hwmon
from exporter.sources.kernel.i915_xe import (
    device_name,
    first_present,
    gt_clock_label,
    map_throttle_reasons,
    temperature_labels,
    temperature_sensor,
)

log = structlog.get_logger(__name__).bind(backend="intel")

DRIVERS = ("i915", "xe")
SOURCE = "sysfs"
POWER_SOURCE = "sysfs_energy_delta"
HWMON_NAMES = ("xe", "i915")

# hwmon tempN_crit / tempN_emergency of the pkg sensor -> METRICS `threshold`.
# (xe's temp2_max reads 60 °C on a B580 at idle: not a max operating temperature.)
TEMP_THRESHOLDS = {"crit": Threshold.CRITICAL, "emergency": Threshold.SHUTDOWN}
ENERGY_CHANNELS = ("card", "energy1", "pkg")
# Sustained limit (PL1: power1_max card, power2_max package), else the burst limit
# (PL2: powerN_cap), which is the only one a B580 exposes. powerN_crit (I1) is a
# protection threshold, not the limit the GPU runs at, and is not used.
LIMIT_CHANNELS = ("card", "power1", "pkg", "power2")

_NUMBERED = re.compile(r"(tile|gt)(\d+)")
MHZ = 1_000_000


def _numbered(r: AttrReader, parent: str, prefix: str) -> list[str]:
    """``tile0``, ``gt0``, ``gt1``, ... under ``parent``, ordered by number (once per layout)."""
    def build() -> list[str]:
        found = [(int(m.group(2)), n) for n in r.names(parent)
                 if (m := _NUMBERED.fullmatch(n)) and m.group(1) == prefix]
        return [f"{parent}/{n}" for _, n in sorted(found)]

    return r.memo(("numbered", parent, prefix), build)


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
    max_generation: int | None = None
    max_width: int | None = None
    # The host link now: it follows the power state, not worth a read every fast cycle.
    generation: int | None = None
    width: int | None = None


@dataclass
class _CardState:
    info: DeviceInfo
    link_dir: str
    energy: EnergyCounter
    reader: AttrReader = field(default_factory=AttrReader)
    energy_channels: list[str] | None = None  # hwmon energy labels present, preferred first
    slow: _Slow | None = None
    lost: bool = False
    # Static per GT, read on slow cycles: RP0 (else max) clock, VRAM size; fan maxima.
    max_clocks: dict[str, float] = field(default_factory=dict)
    vram: float | None = None
    fan_max: dict[str, float | None] = field(default_factory=dict)


class IntelBackend:
    """The i915/xe cards DrmDiscovery finds, read through its sysfs root."""

    name = "intel"
    source = SOURCE
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
        self._driver_versions: dict[str, str] = {}  # i915 / xe -> version, read once each
        self._generation = -1
        # open() only reads the cached card list: the collector may retry it every cycle.

    @property
    def capabilities(self) -> Capabilities:
        return self._discovery.capabilities(self._config.interval)  # open() reads its list

    def open(self) -> Sequence[DeviceInfo]:
        self._discovery.start()  # udev events on a real /sys (idempotent; shared with amd)
        cards = self._discovery.cards(DRIVERS)
        if not cards:
            raise BackendUnavailable(f"no i915/xe card under {self._config.sysfs}/class/drm")
        return [self._state(card).info for card in cards]

    def close(self) -> None:
        for state in self._states.values():
            state.reader.close()
        self._states.clear()

    def sample(self, slow: bool) -> Cycle:
        errors: Counter[ErrorReason] = Counter()
        devices: list[DeviceSample] = []
        cards, generation = self._discovery.listing(DRIVERS)
        if self._discovery.listing_error is not None:
            errors[ErrorReason.DRM_LISTING] += 1  # the last known cards are read meanwhile
        for gone in set(self._states) - set(cards):
            self._states.pop(gone).reader.close()
        if generation != self._generation:  # hotplug: re-list layouts
            for state in self._states.values():
                state.reader.reset()
            self._generation = generation
        for card in cards:
            state = self._state(card)
            try:
                sample = self._read_card(card, state, slow, errors)
            except Exception as exc:  # one card's surprise never ends the cycle
                errors[ErrorReason.INTERNAL] += 1
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
                driver_version=self._driver_version(card.driver),
                architecture=architecture,
                device_node=card.card,
            )
            state = self._states[card] = _CardState(
                info, os.fspath(_link_dir(card.device_dir)), EnergyCounter(card.pci_bus_id))
        return state

    def _driver_version(self, driver: str) -> str:
        """i915's or xe's version: the module's own where it has one, else the kernel
        release (core.fs.driver_version); read again while it reads empty."""
        if not self._driver_versions.get(driver):
            self._driver_versions[driver] = driver_version(
                self._config.sysfs, self._config.procfs, driver)
        return self._driver_versions[driver]

    def _read_card(
        self, card: DrmCard, state: _CardState, slow: bool, errors: Counter[ErrorReason]
    ) -> DeviceSample:
        r = state.reader
        dev = os.fspath(card.device_dir)
        if not os.path.isdir(dev):
            errors[ErrorReason.GPU_LOST] += 1
            r.reset()  # kept descriptors of removed files; re-listed when it is back
            return DeviceSample(info=state.info, source=SOURCE, up=False)

        slow = slow or state.slow is None
        if card.driver == "xe":
            clocks, max_clocks, throttle, vram = _read_xe_gts(r, dev, errors, slow)
        else:
            clocks, max_clocks, throttle = _read_i915_gt(r, os.path.dirname(dev), errors, slow)
            vram = None
        if slow:
            state.max_clocks, state.vram = max_clocks, vram

        temps: dict[str, float] = {}
        fans: dict[str, float] = {}
        readings: dict[str, float | None] = {}
        chips = [(d, hwmon.hwmon_name(d, r)) for d in hwmon.hwmon_dirs(dev, r)]
        chips = [(d, name) for d, name in chips if name in HWMON_NAMES]
        for chip, chip_name in chips:
            # Only the channels that are a METRICS sensor: xe lists 16 on a B580 (every
            # VRAM channel, the memory controller, PCIe), of which pkg and vram are used.
            wanted = temperature_labels(chip_name)
            for label, celsius in hwmon.read_temperatures(chip, errors, r, wanted).items():
                sensor = temperature_sensor(chip_name, label)
                if sensor is not None:
                    temps.setdefault(sensor, celsius)
            fans.update(hwmon.read_fan_ratios(chip, errors, r, pwm=False,
                                              maxima=state.fan_max, refresh=slow))
            if not readings:
                if not state.energy_channels:
                    labels = hwmon.energy_labels(chip, r)
                    state.energy_channels = [c for c in ENERGY_CHANNELS if c in labels]
                joules = hwmon.read_energy(chip, errors, r)
                readings = {c: joules.get(c) for c in state.energy_channels}
        if slow:
            state.slow = _read_slow(r, [c for c, _ in chips], state.link_dir, errors)
        assert state.slow is not None
        energy, power = state.energy.update(state.energy_channels or [], readings,
                                            self._clock())

        return DeviceSample(
            info=state.info,
            source=SOURCE,
            field_sources={"power_watts": POWER_SOURCE} if power is not None else {},
            memory_total_bytes=state.vram,
            temperatures_celsius=temps,
            temperature_limits_celsius={(Sensor.PACKAGE, t): v for t, v in
                                        state.slow.thresholds_celsius.items()},
            power_watts=power,
            power_limit_watts=state.slow.limit_watts,
            energy_joules=energy,
            fan_speed_ratio=fans,
            clocks_hertz=clocks,
            clocks_max_hertz=state.max_clocks,
            throttle_reasons=throttle,
            pcie_link_generation=state.slow.generation,
            pcie_link_width=state.slow.width,
            pcie_link_max_generation=state.slow.max_generation,
            pcie_link_max_width=state.slow.max_width,
        )


Clocks = dict[str, float]


def _read_xe_gts(
    r: AttrReader, dev: str, errors: Counter[ErrorReason], slow: bool = True
) -> tuple[Clocks, Clocks, dict[str, bool], float | None]:
    """xe: every ``tile<T>/gt<G>``; the first render GT and first media GT win. The
    static maxima and VRAM size only when ``slow`` (else empty and None)."""
    clocks: Clocks = {}
    max_clocks: Clocks = {}
    throttle: dict[str, bool] = {}
    vram: float | None = None
    for tile in _numbered(r, dev, "tile"):
        size = r.number(tile, "physical_vram_size_bytes", errors, 1, "bytes") if slow else None
        if size is not None:
            vram = (vram or 0.0) + size
        for gt in _numbered(r, tile, "gt"):
            idle = f"{gt}/gtidle"
            label = r.memo(("gt", gt), lambda: gt_clock_label(
                r.text(idle, "name", errors, keep=False), os.path.basename(gt)))  # noqa: B023
            if label is None or label in clocks or label in max_clocks:
                continue
            act, top = _freqs(r, f"{gt}/freq0", "", "_freq", errors, "rp0", slow)
            if act is not None:
                clocks[label] = act
            if top is not None:
                max_clocks[label] = top
            if label == Clock.GRAPHICS:
                throttle = _read_reasons(r, f"{gt}/freq0/throttle", "reason_", errors, slow)
    return clocks, max_clocks, throttle, vram


def _freqs(r: AttrReader, base: str, prefix: str, suffix: str, errors: Counter[ErrorReason],
           rp0: str, slow: bool = True) -> tuple[float | None, float | None]:
    """(actual, hardware max: RP0, else the user-set max) of one GT, MHz -> Hz; the
    maximum only when ``slow``."""
    act = r.number(base, f"{prefix}act{suffix}", errors, MHZ, "hertz")
    if not slow:
        return act, None
    top = r.number(base, f"{prefix}{rp0}{suffix}", errors, MHZ, "hertz")
    if top is None:
        top = r.number(base, f"{prefix}max{suffix}", errors, MHZ, "hertz")
    return act, top


def _read_i915_gt(r: AttrReader, card_dir: str, errors: Counter[ErrorReason],
                  slow: bool = True) -> tuple[Clocks, Clocks, dict[str, bool]]:
    """i915: ``gt/gt0/rps_*_freq_mhz`` (kernels with per-GT sysfs), else ``gt_*_freq_mhz``."""
    gt0 = f"{card_dir}/gt/gt0"
    if "gt0" in r.names(f"{card_dir}/gt"):
        base, prefix = gt0, "rps_"
        throttle = _read_reasons(r, gt0, "throttle_reason_", errors, slow)
    else:
        base, prefix, throttle = card_dir, "gt_", {}
    clocks: Clocks = {}
    max_clocks: Clocks = {}
    act, top = _freqs(r, base, prefix, "_freq_mhz", errors, "RP0", slow)
    if act is not None:
        clocks[Clock.GRAPHICS] = act
    if top is not None:
        max_clocks[Clock.GRAPHICS] = top
    return clocks, max_clocks, throttle


# The file beside the reason bits that is their OR (the same PERF_LIMIT_REASONS register
# under the same mask: xe_gt_throttle.c, i915's intel_gt_sysfs_pm.c), by reason prefix.
_STATUS = {"reason_": "status", "throttle_reason_": "throttle_reason_status"}


def _read_reasons(r: AttrReader, directory: str, prefix: str,
                  errors: Counter[ErrorReason], slow: bool = True) -> dict[str, bool]:
    """Every reason bit, mapped. On a fast cycle a ``status`` of 0 says each bit is 0
    (what an unthrottled GPU reads nearly always): one read instead of eight or nine.
    Slow cycles read every bit, so a garbage one is still counted (``parse``)."""
    names = r.memo(("reasons", directory, prefix), lambda: sorted(
        n for n in r.names(directory) if n.startswith(prefix)))
    if not slow and r.number(directory, _STATUS[prefix], None) == 0:
        return map_throttle_reasons({name.removeprefix(prefix): 0 for name in names})
    bits: dict[str, int] = {}
    for name in names:
        value = r.number(directory, name, errors)
        if value is None:
            continue
        if value not in (0, 1):  # a reason bit is 0 or 1; anything else is garbage
            errors[ErrorReason.PARSE] += 1
            continue
        bits[name.removeprefix(prefix)] = int(value)
    return map_throttle_reasons(bits)


def _read_slow(r: AttrReader, chips: list[Path], link: str, errors: Counter[ErrorReason]) -> _Slow:
    """Power limit, pkg temperature thresholds, the host link now and its maximum."""
    limit: float | None = None
    thresholds: dict[str, float] = {}
    for chip in chips:
        for kind in ("max", "cap"):
            if limit is None:
                caps = hwmon.read_power_caps(chip, kind, errors, r)
                limit = first_present(caps, LIMIT_CHANNELS)
        for kind, threshold in TEMP_THRESHOLDS.items():
            value = hwmon.read_temperature_thresholds(chip, kind, errors, r).get("pkg")
            if value is not None:
                thresholds.setdefault(threshold, value)
    return _Slow(limit, thresholds, r.link_speed(link, "max_link_speed", errors),
                 r.link_width(link, "max_link_width", errors),
                 r.link_speed(link, "current_link_speed", errors),
                 r.link_width(link, "current_link_width", errors))
