"""Reading the hwmon directories that GPU drivers (amdgpu, i915, xe) hang under a PCI device.

Owns: finding ``<device>/hwmon/hwmonN`` and turning its channel files into base units,
keyed by channel label. Shared by the AMD and Intel backends. Kernel reference:
Documentation/hwmon/sysfs-interface.rst (and amdgpu.rst / i915 / xe ABI docs).

Public functions (each returns ``dict[label, float]``; a value that cannot be read
or parsed is left out, never reported as 0)::

    hwmon_dirs(device_dir)                    -> [Path]   hwmonN dirs, by number
    hwmon_name(hwmon_dir)                     -> str|None the chip name ("amdgpu", "xe", "i915")
    read_temperatures(d)                      tempN_input          m°C -> °C
    read_temperature_thresholds(d, kind)      tempN_<kind>         m°C -> °C  (kind: crit,
                                              emergency, max, crit_hyst, ...)
    read_power(d)                             powerN_average, else powerN_input   µW -> W
    read_power_caps(d, kind="cap")            powerN_<kind>        µW -> W  (cap, cap_max,
                                              cap_default, max, crit, ...)
    read_energy(d)                            energyN_input        µJ -> J
    read_fans_rpm(d)                          fanN_input           RPM
    read_fan_ratios(d)                        pwmN / pwmN_max (255 when absent), else
                                              fanN_input / fanN_max          0..1
    read_frequencies(d)                       freqN_input          Hz
    read_voltages(d)                          inN_input            mV -> V

The label is the content of ``<type>N_label`` when present ("edge", "junction",
"mem", "PPT", "sclk", "pkg", ...), else the channel name ("temp1", "fan1").

Every reader takes an optional ``errors`` Counter: a file that is listed but fails
with an OS error (EAGAIN, ENODATA, EIO, a directory where a file was expected) counts
under ``"read"``, text that is not a number under ``"parse"``. ``N/A``, empty files
and NUL padding mean "not exposed" and are skipped silently (see exporter.fs).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from exporter import units
from exporter.fs import clean_text, read_bytes, read_text

_HWMON_RE = re.compile(r"hwmon(\d+)")

ErrorCounter = Counter[str]


def hwmon_dirs(device_dir: Path) -> list[Path]:
    """``<device_dir>/hwmon/hwmonN`` directories, ordered by N (not lexically)."""
    base = device_dir / "hwmon"
    try:
        names = os.listdir(base)
    except OSError:
        return []
    found = [(int(m.group(1)), n) for n in names if (m := _HWMON_RE.fullmatch(n))]
    return [base / n for _, n in sorted(found)]


def hwmon_name(hwmon_dir: Path) -> str | None:
    return read_text(hwmon_dir / "name")


def is_u64_sentinel(text: str | None) -> bool:
    """2^64-1, the all-ones "no value" of a u64 sysfs attribute: never a reading."""
    return units.parse_int(text) == units.U64_MAX


def channels(names: Iterable[str], prefix: str, suffix: str) -> list[tuple[int, str]]:
    """``(N, filename)`` for every ``<prefix>N_<suffix>`` in ``names``, ordered by N (pure)."""
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)_{re.escape(suffix)}")
    found = [(int(m.group(1)), n) for n in names if (m := pattern.fullmatch(n))]
    return sorted(found)


def _listing(hwmon_dir: Path) -> list[str]:
    try:
        return os.listdir(hwmon_dir)
    except OSError:
        return []


def _read_value(path: Path, scale: float, unit: str, errors: ErrorCounter | None) -> float | None:
    """One channel file in base units; garbage (NaN, inf, 400 digits, the u64 all-ones
    sentinel, a value its unit cannot be) is dropped and counted as ``parse``."""
    raw = read_bytes(path)
    if raw is None:
        # Listed but unreadable: hwmon drivers return EAGAIN/ENODATA while the SMU is busy.
        if errors is not None:
            errors["read"] += 1
        return None
    text = clean_text(raw)
    if text is None:
        return None  # N/A or empty: not exposed, not an error
    value = None if is_u64_sentinel(text) else units.parse_scaled(text, scale, unit)
    if value is None and errors is not None:
        errors["parse"] += 1
    return value


def _label(hwmon_dir: Path, names: set[str], prefix: str, index: int) -> str:
    label_file = f"{prefix}{index}_label"
    label = read_text(hwmon_dir / label_file) if label_file in names else None
    return label or f"{prefix}{index}"


def _read_channels(
    hwmon_dir: Path,
    prefix: str,
    suffix: str,
    scale: float,
    unit: str,
    errors: ErrorCounter | None,
    names: list[str] | None = None,
) -> dict[str, float]:
    listed = names if names is not None else _listing(hwmon_dir)
    name_set = set(listed)
    out: dict[str, float] = {}
    for index, filename in channels(listed, prefix, suffix):
        value = _read_value(hwmon_dir / filename, scale, unit, errors)
        if value is not None:
            out.setdefault(_label(hwmon_dir, name_set, prefix, index), value)
    return out


def read_temperatures(hwmon_dir: Path, errors: ErrorCounter | None = None) -> dict[str, float]:
    """tempN_input, millidegrees Celsius -> °C."""
    return _read_channels(hwmon_dir, "temp", "input", 0.001, "celsius", errors)


def read_temperature_thresholds(
    hwmon_dir: Path, kind: str, errors: ErrorCounter | None = None
) -> dict[str, float]:
    """tempN_<kind> (crit, emergency, max, crit_hyst, ...), millidegrees -> °C."""
    return _read_channels(hwmon_dir, "temp", kind, 0.001, "celsius", errors)


def read_power(hwmon_dir: Path, errors: ErrorCounter | None = None) -> dict[str, float]:
    """powerN_average, or powerN_input where a channel has no average; µW -> W.

    amdgpu exposes one or the other (or both) depending on ASIC and kernel.
    """
    names = _listing(hwmon_dir)
    out = _read_channels(hwmon_dir, "power", "average", 1e-6, "watts", errors, names)
    inputs = _read_channels(hwmon_dir, "power", "input", 1e-6, "watts", errors, names)
    for label, value in inputs.items():
        out.setdefault(label, value)
    return out


def read_power_caps(
    hwmon_dir: Path, kind: str = "cap", errors: ErrorCounter | None = None
) -> dict[str, float]:
    """powerN_<kind> (cap, cap_max, cap_default, max, crit, ...), µW -> W."""
    return _read_channels(hwmon_dir, "power", kind, 1e-6, "watts", errors)


def read_energy(hwmon_dir: Path, errors: ErrorCounter | None = None) -> dict[str, float]:
    """energyN_input, µJ -> J (a counter since driver load)."""
    return _read_channels(hwmon_dir, "energy", "input", 1e-6, "joules", errors)


def read_fans_rpm(hwmon_dir: Path, errors: ErrorCounter | None = None) -> dict[str, float]:
    """fanN_input, RPM."""
    return _read_channels(hwmon_dir, "fan", "input", 1.0, "rpm", errors)


def read_fan_ratios(hwmon_dir: Path, errors: ErrorCounter | None = None) -> dict[str, float]:
    """Fan speed 0..1 keyed ``fanN`` (pwmN drives fanN).

    The PWM duty cycle (pwmN / pwmN_max, 255 by the hwmon ABI when pwmN_max is absent)
    is what the driver commands, like NVML's fan percentage; where a fan has no pwm
    channel, fall back to measured fanN_input / fanN_max.
    """
    names = _listing(hwmon_dir)
    name_set = set(names)
    out: dict[str, float] = {}
    pwm_re = re.compile(r"pwm(\d+)")
    for index in sorted(int(m.group(1)) for n in names if (m := pwm_re.fullmatch(n))):
        duty = _read_value(hwmon_dir / f"pwm{index}", 1.0, "count", errors)
        top: float | None = 255.0
        if f"pwm{index}_max" in name_set:
            top = _read_value(hwmon_dir / f"pwm{index}_max", 1.0, "count", errors)
        if duty is not None and top:
            if (ratio := units.clamp_ratio(duty / top)) is not None:
                out[f"fan{index}"] = ratio
    for index, filename in channels(names, "fan", "input"):
        key = f"fan{index}"
        if key in out or f"fan{index}_max" not in name_set:
            continue
        rpm = _read_value(hwmon_dir / filename, 1.0, "rpm", errors)
        top = _read_value(hwmon_dir / f"fan{index}_max", 1.0, "rpm", errors)
        if rpm is not None and top:
            if (ratio := units.clamp_ratio(rpm / top)) is not None:
                out[key] = ratio
    return out


def read_frequencies(hwmon_dir: Path, errors: ErrorCounter | None = None) -> dict[str, float]:
    """freqN_input, Hz (amdgpu labels them "sclk", "mclk", "fclk", ...)."""
    return _read_channels(hwmon_dir, "freq", "input", 1.0, "hertz", errors)


def read_voltages(hwmon_dir: Path, errors: ErrorCounter | None = None) -> dict[str, float]:
    """inN_input, millivolts -> volts (amdgpu labels "vddgfx", "vddnb")."""
    return _read_channels(hwmon_dir, "in", "input", 0.001, "volts", errors)
