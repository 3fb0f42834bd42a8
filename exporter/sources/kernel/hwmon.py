"""Reading the hwmon directories that GPU drivers (amdgpu, i915, xe) hang under a PCI device.

Owns: finding ``<device>/hwmon/hwmonN``, which channels each chip has and their
labels, and turning channel files into base units keyed by channel label. Shared by
the AMD and Intel backends. Kernel reference: Documentation/hwmon/sysfs-interface.rst
(and amdgpu.rst / i915 / xe ABI docs).

Public functions (each value reader returns ``dict[label, float]``; a value that
cannot be read or parsed is left out, never reported as 0)::

    hwmon_dirs(device_dir)                    -> [Path]   hwmonN dirs, by number
    hwmon_name(hwmon_dir)                     -> str|None the chip name ("amdgpu", "xe", "i915")
    read_temperatures(d)                      tempN_input          m°C -> °C
    read_temperature_thresholds(d, kind)      tempN_<kind>         m°C -> °C  (kind: crit,
                                              emergency, max, crit_hyst, ...)
    read_power(d)                             powerN_average, else powerN_input   µW -> W
    read_power_caps(d, kind="cap")            powerN_<kind>        µW -> W  (cap, cap_max,
                                              cap_default, max, crit, ...)
    read_energy(d)                            energyN_input        µJ -> J
    read_fan_ratios(d, pwm=True)              pwmN / pwmN_max (255 when absent), else
                                              fanN_input / fanN_max   0..1, keyed "N-1"
    read_frequencies(d)                       freqN_input          Hz
    read_voltages(d)                          inN_input            mV -> V

For a card's plan of its hot reads (exporter.sources.amd.card), found once per layout and
read with ``AttrReader.numbers``: ``channel_files(d, reader)`` (the channels the five
readers above read), ``fan_plan(d, reader)`` and ``fan_ratios(plan, duties, ...)``
(read_fan_ratios' rule, given the duty cycles read).

The label is the content of ``<type>N_label`` when present ("edge", "junction",
"mem", "PPT", "sclk", "pkg", ...), else the channel name ("temp1", "fan1").

Every function takes an optional ``reader`` (exporter.core.fs.AttrReader): with the
card's reader, the chip's listing, its channels and their labels are found once per
layout and the values are re-read with pread on kept descriptors; without one, each
call lists and reads afresh. Errors follow AttrReader's one rule (``read`` for a
listed file that fails, ``parse`` for garbage) into the optional ``errors`` Counter.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from exporter.core import units
from exporter.core.fs import AttrReader, Planned, planned, read_text
from exporter.core.labels import ErrorReason

_HWMON_RE = re.compile(r"hwmon(\d+)")

ErrorCounter = Counter[ErrorReason]
HwmonDir = str | os.PathLike[str]


def hwmon_dirs(device_dir: HwmonDir, reader: AttrReader | None = None) -> list[Path]:
    """``<device_dir>/hwmon/hwmonN`` directories, ordered by N (not lexically)."""
    base = os.path.join(device_dir, "hwmon")

    def build() -> list[Path]:
        names = (reader or AttrReader(keep=False)).names(base)
        found = [(int(m.group(1)), n) for n in names if (m := _HWMON_RE.fullmatch(n))]
        return [Path(base, n) for _, n in sorted(found)]

    return reader.memo(("hwmon", base), build) if reader is not None else build()


def hwmon_name(hwmon_dir: HwmonDir, reader: AttrReader | None = None) -> str | None:
    if reader is None:
        return read_text(Path(hwmon_dir, "name"))
    d = os.fspath(hwmon_dir)
    return reader.memo(("name", d), lambda: reader.text(d, "name", None, keep=False))


def channels(names: Iterable[str], prefix: str, suffix: str) -> list[tuple[int, str]]:
    """``(N, filename)`` for every ``<prefix>N_<suffix>`` in ``names``, ordered by N (pure)."""
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)_{re.escape(suffix)}")
    found = [(int(m.group(1)), n) for n in names if (m := pattern.fullmatch(n))]
    return sorted(found)


def _labelled(reader: AttrReader, d: str, prefix: str, suffix: str) -> list[tuple[str, str]]:
    """``(label, filename)`` of each ``<prefix>N_<suffix>`` channel: found once per layout."""
    def build() -> list[tuple[str, str]]:
        out = []
        for index, filename in channels(reader.names(d), prefix, suffix):
            label = reader.text(d, f"{prefix}{index}_label", None, keep=False)
            out.append((label or f"{prefix}{index}", filename))
        return out

    return reader.memo(("channels", d, prefix, suffix), build)


def _read_channels(hwmon_dir: HwmonDir, prefix: str, suffix: str, scale: float, unit: str,
                   errors: ErrorCounter | None, reader: AttrReader | None,
                   only: frozenset[str] | None = None) -> dict[str, float]:
    """Every channel's value by label; with ``only``, just the channels so labelled (the
    others are not read at all)."""
    r = reader or AttrReader(keep=False)
    d = os.fspath(hwmon_dir)
    out: dict[str, float] = {}
    found = _labelled(r, d, prefix, suffix)
    if only is not None:
        found = r.memo(("only", d, prefix, suffix, only),
                       lambda: [c for c in found if c[0] in only])
    for label, filename in found:
        value = r.number(d, filename, errors, scale, unit)
        if value is not None and label not in out:
            out[label] = value
    return out


def read_temperatures(hwmon_dir: HwmonDir, errors: ErrorCounter | None = None,
                      reader: AttrReader | None = None,
                      only: frozenset[str] | None = None) -> dict[str, float]:
    """tempN_input, millidegrees Celsius -> °C; with ``only``, just those labels."""
    return _read_channels(hwmon_dir, "temp", "input", 0.001, "celsius", errors, reader, only)


def read_temperature_thresholds(hwmon_dir: HwmonDir, kind: str, errors: ErrorCounter | None = None,
                                reader: AttrReader | None = None) -> dict[str, float]:
    """tempN_<kind> (crit, emergency, max, crit_hyst, ...), millidegrees -> °C."""
    return _read_channels(hwmon_dir, "temp", kind, 0.001, "celsius", errors, reader)


def read_power(hwmon_dir: HwmonDir, errors: ErrorCounter | None = None,
               reader: AttrReader | None = None) -> dict[str, float]:
    """powerN_average, or powerN_input where a channel has no average; µW -> W.

    amdgpu exposes one or the other (or both) depending on ASIC and kernel.
    """
    reader = reader or AttrReader(keep=False)
    out = _read_channels(hwmon_dir, "power", "average", 1e-6, "watts", errors, reader)
    inputs = _read_channels(hwmon_dir, "power", "input", 1e-6, "watts", errors, reader)
    for label, value in inputs.items():
        out.setdefault(label, value)
    return out


def read_power_caps(hwmon_dir: HwmonDir, kind: str = "cap", errors: ErrorCounter | None = None,
                    reader: AttrReader | None = None) -> dict[str, float]:
    """powerN_<kind> (cap, cap_max, cap_default, max, crit, ...), µW -> W."""
    return _read_channels(hwmon_dir, "power", kind, 1e-6, "watts", errors, reader)


def read_energy(hwmon_dir: HwmonDir, errors: ErrorCounter | None = None,
                reader: AttrReader | None = None) -> dict[str, float]:
    """energyN_input, µJ -> J (a counter since driver load)."""
    return _read_channels(hwmon_dir, "energy", "input", 1e-6, "joules", errors, reader)


# What read_temperatures, read_power, read_energy, read_frequencies and read_voltages
# read: (kind, prefix, suffix, scale, unit), power's averages before its inputs.
FAST_CHANNELS = (("temps", "temp", "input", 0.001, "celsius"),
                 ("power", "power", "average", 1e-6, "watts"),
                 ("power", "power", "input", 1e-6, "watts"),
                 ("energy", "energy", "input", 1e-6, "joules"),
                 ("freqs", "freq", "input", 1.0, "hertz"),
                 ("volts", "in", "input", 0.001, "volts"))


def channel_files(hwmon_dir: HwmonDir, reader: AttrReader
                  ) -> list[tuple[str, str, str, float, str]]:
    """``(kind, label, path, scale, unit)`` of every channel of FAST_CHANNELS, in the
    order those readers read them (per kind: by channel number, so the first channel of a
    label wins, as there): a card's plan of its hot reads, built once per layout and
    read with ``AttrReader.numbers``."""
    d = os.fspath(hwmon_dir)
    return [(kind, label, f"{d}/{filename}", scale, unit)
            for kind, prefix, suffix, scale, unit in FAST_CHANNELS
            for label, filename in _labelled(reader, d, prefix, suffix)]


def energy_labels(hwmon_dir: HwmonDir, reader: AttrReader | None = None) -> list[str]:
    """The labels of the chip's energyN_input channels (which exist, not their values)."""
    r = reader or AttrReader(keep=False)
    return [label for label, _ in _labelled(r, os.fspath(hwmon_dir), "energy", "input")]


def read_fan_ratios(hwmon_dir: HwmonDir, errors: ErrorCounter | None = None,
                    reader: AttrReader | None = None, pwm: bool = True,
                    maxima: dict[str, float | None] | None = None,
                    refresh: bool = True) -> dict[str, float]:
    """Fan speed 0..1 keyed by fan index from 0 (hwmon fan1 is "0", as NVML counts).

    The PWM duty cycle (pwmN / pwmN_max, 255 by the hwmon ABI when pwmN_max is absent)
    is what the driver commands, like NVML's fan percentage; where a fan has no pwm
    channel (or ``pwm`` is False), measured fanN_input / fanN_max. A fan without
    fanN_max has no ratio rather than a guess. xe passes ``pwm=False``: it reads pwmN
    as 0 while the firmware fan curve (pwmN_enable 2) spins the fan (B580 capture).

    ``maxima``: the caller's cache of the ``*_max`` files (static limits), by path;
    they are read again only when ``refresh`` (the slow tier) or not cached yet.
    """
    r = reader or AttrReader(keep=False)
    plan = fan_plan(hwmon_dir, r, pwm)
    duties = r.numbers([duty for _, duty, _ in plan[0]], errors)
    return fan_ratios(plan, duties, errors, r, {} if maxima is None else maxima, refresh)


# (pwm fans: (fan key, pwmN, pwmN_max or None: 255), measured fans: (fan key, fanN_input,
# fanN_max)), each file a planned AttrReader.numbers entry
FanPlan = tuple[list[tuple[str, Planned, Planned | None]], list[tuple[str, Planned, Planned]]]


def fan_plan(hwmon_dir: HwmonDir, reader: AttrReader, pwm: bool = True) -> FanPlan:
    """What read_fan_ratios reads of a chip, found once per layout: a card's plan reads
    the duty cycles with its other hot files and hands them to fan_ratios."""
    d = os.fspath(hwmon_dir)

    def build() -> FanPlan:
        names = reader.names(d)
        pwms = [(str(index - 1), planned(f"{d}/{filename}", 1.0, "count"),
                 planned(f"{d}/{filename}_max", 1.0, "count")
                 if f"{filename}_max" in names else None)
                for index, filename in _pwm_channels(reader, d, pwm)]
        fans = [(str(index - 1), planned(f"{d}/{filename}", 1.0, "rpm"),
                 planned(f"{d}/fan{index}_max", 1.0, "rpm"))
                for index, filename in _fan_channels(reader, d)]
        return pwms, fans

    return reader.memo(("fan-plan", d, pwm), build)


def fan_ratios(plan: FanPlan, duties: Sequence[float | None], errors: ErrorCounter | None,
               reader: AttrReader, maxima: dict[str, float | None],
               refresh: bool) -> dict[str, float]:
    """read_fan_ratios' rule, given the pwm channels' ``duties`` (in ``plan``'s order)."""
    def top_of(entry: Planned) -> float | None:
        key = entry[0]
        if refresh or key not in maxima:
            maxima[key] = reader.numbers((entry,), errors)[0]
        return maxima[key]

    out: dict[str, float] = {}
    pwms, fans = plan
    for (key, _, top), duty in zip(pwms, duties, strict=True):
        _put_ratio(out, key, duty, 255.0 if top is None else top_of(top))
    for key, rpm, top in fans:
        if key not in out:
            _put_ratio(out, key, reader.numbers((rpm,), errors)[0], top_of(top))
    return out


def _put_ratio(out: dict[str, float], key: str, value: float | None, top: float | None) -> None:
    if value is not None and top and (ratio := units.clamp_ratio(value / top)) is not None:
        out[key] = ratio


def _pwm_channels(reader: AttrReader, d: str, pwm: bool) -> list[tuple[int, str]]:
    if not pwm:
        return []

    def build() -> list[tuple[int, str]]:
        found = (re.fullmatch(r"pwm(\d+)", n) for n in reader.names(d))
        return sorted((int(m.group(1)), m.group(0)) for m in found if m)

    return reader.memo(("pwm", d), build)


def _fan_channels(reader: AttrReader, d: str) -> list[tuple[int, str]]:
    """fanN_input channels that have a fanN_max to divide by."""
    def build() -> list[tuple[int, str]]:
        names = reader.names(d)
        return [(i, f) for i, f in channels(names, "fan", "input") if f"fan{i}_max" in names]

    return reader.memo(("fan", d), build)


def read_frequencies(hwmon_dir: HwmonDir, errors: ErrorCounter | None = None,
                     reader: AttrReader | None = None) -> dict[str, float]:
    """freqN_input, Hz (amdgpu labels them "sclk", "mclk", "fclk", ...)."""
    return _read_channels(hwmon_dir, "freq", "input", 1.0, "hertz", errors, reader)


def read_voltages(hwmon_dir: HwmonDir, errors: ErrorCounter | None = None,
                  reader: AttrReader | None = None) -> dict[str, float]:
    """inN_input, millivolts -> volts (amdgpu labels "vddgfx", "vddnb")."""
    return _read_channels(hwmon_dir, "in", "input", 0.001, "volts", errors, reader)
