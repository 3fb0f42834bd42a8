"""The one place where numbers from files, tools and libraries are parsed, bounded and converted.

Every value the exporter serves passes through here first, so a corrupted sysfs file,
a garbled fdinfo line or a library's sentinel can never reach the output as NaN, +Inf,
a negative counter or 1.8e16 °C. A parser never raises: text that is not a number, a
number that is not finite, or one outside what its unit can physically be returns
``None``, and the caller counts it (reason ``parse``) and drops that one value.

The plausible ranges are deliberately wide (a value outside them is garbage on every
GPU made, not an unusual card); they are not alarms.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from types import MappingProxyType

U64_MAX = (1 << 64) - 1
MAX_DIGITS = 20  # 2^64 has 20 decimal digits: anything longer is not a kernel counter

# unit -> (lowest, highest) a reading of it can be, in the base unit.
RANGES: Mapping[str, tuple[float, float]] = MappingProxyType({
    "celsius": (-60.0, 250.0),  # below any datacentre's floor, above any junction limit
    "hertz": (0.0, 1e11),  # 100 GHz
    "watts": (0.0, 1e5),  # 100 kW: a whole rack, far above any one device
    "joules": (0.0, 1.8e19),  # a u64 µJ counter in J is at most 1.8e13; mJ/J sources more
    "bytes": (0.0, float(U64_MAX)),
    "bytes_per_second": (0.0, 1e14),  # 100 TB/s
    "ratio": (0.0, 1.0),
    "seconds": (0.0, 1e12),  # busy-time counters: 30,000 years
    "volts": (0.0, 100.0),
    "rpm": (0.0, 1e6),
    "count": (0.0, float(U64_MAX)),
})

_RANGES = dict(RANGES)  # bounded()'s look-up: a plain dict, not through the proxy

_INT_RE = re.compile(rf"[+-]?[0-9]{{1,{MAX_DIGITS}}}\Z")
_HEX_RE = re.compile(r"0[xX][0-9a-fA-F]{1,16}\Z")


def parse_int(text: str | bytes | None) -> int | None:
    """A decimal (or ``0x`` hex) integer of at most 20 digits, else None. Never raises.

    ``int()`` alone accepts ``"1_000"``, Unicode digits, and 4,000-digit strings that
    overflow every later float conversion: none of those are kernel output.
    """
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    text = text.strip()
    if _INT_RE.match(text):
        value = int(text)
    elif _HEX_RE.match(text):
        value = int(text, 16)
    else:
        return None
    return value if -U64_MAX <= value <= U64_MAX else None


def parse_number(text: str | bytes | None) -> float | None:
    """An integer or a finite decimal number (``"56000"``, ``"1.5"``), else None."""
    if text is None:
        return None
    as_int = parse_int(text)
    if as_int is not None:
        return float(as_int)
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    text = text.strip()
    if not text or len(text) > 64 or not text.isascii():
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def bounded(value: float | int | None, unit: str) -> float | None:
    """``value`` as a float if finite and within ``RANGES[unit]``, else None."""
    kind = type(value)
    if kind is float:  # every sysfs reading passes here each cycle: the common case first
        v: float = value  # type: ignore[assignment]
    elif value is None or kind is bool:
        return None
    else:
        try:
            v = float(value)
        except (OverflowError, TypeError, ValueError):
            return None
    low, high = _RANGES[unit]
    # NaN fails both comparisons; +-inf is outside every range.
    return v if low <= v <= high and v - v == 0.0 else None


def scaled(value: float | int | None, scale: int | float, unit: str) -> float | None:
    """Convert to the base unit and bound it: ``scaled(56000, 1/1000, "celsius")`` -> 56.0.

    A scale below 1 divides by its exact integer inverse, so 3103000 µW is exactly
    3.103 W, not 3.1029999999999998.
    """
    if value is None:
        return None
    try:
        if 0 < scale < 1:
            inverse = _INVERSES.get(scale)
            if inverse is None:
                inverse = _INVERSES[scale] = round(1 / scale)
            v = value / inverse
        else:
            v = value * scale
    except (OverflowError, TypeError):
        return None
    if v.__class__ is float:  # what every reading scaled here is: bounded() inline
        low, high = _RANGES[unit]
        return v if low <= v <= high and v - v == 0.0 else None
    return bounded(v, unit)


_INVERSES: dict[float, int] = {}  # scale below 1 -> its integer inverse (a few constants)


def scaling(scale: int | float, unit: str) -> tuple[int, float, float, float]:
    """``scaled()``'s arithmetic for one scale and unit, worked out once for a reader
    that applies it to many values (exporter.core.fs.AttrReader.numbers): (integer
    divisor, else 0; multiplier; low; high). For a finite value ``v``,
    ``scaled(v, scale, unit)`` is ``v / divisor`` where there is a divisor, else
    ``v * multiplier``, kept where it lies within [low, high]."""
    low, high = _RANGES[unit]
    if 0 < scale < 1:
        inverse = _INVERSES.get(scale)
        if inverse is None:
            inverse = _INVERSES[scale] = round(1 / scale)
        return inverse, 1.0, low, high
    return 0, float(scale), low, high


def parse_scaled(text: str | bytes | None, scale: int | float, unit: str) -> float | None:
    """Text in a sub-unit (m°C, µW, MHz, ...) -> base unit, bounded. Never raises."""
    return scaled(parse_number(text), scale, unit)


def ratio_from_percent(percent: float | int | None) -> float | None:
    """0..100 % -> 0..1. Small overshoot (firmware reports up to a few % over) clamps to 1;
    negative, NaN, infinite or more than 110 % is garbage and gives None."""
    kind = type(percent)
    if kind is float:
        p: float = percent  # type: ignore[assignment]
    elif percent is None or kind is bool:
        return None
    else:
        try:
            p = float(percent)
        except (OverflowError, TypeError, ValueError):
            return None
    if not 0 <= p <= 110:  # NaN fails it too; +-inf is outside
        return None
    return min(p, 100.0) / 100.0


# Counter inputs: what a counter can gain in a given time (``plausible_increase``).
RATE_SLACK = 2.0  # readings are timed after the read, and drivers round their clocks
RATE_GRACE_SECONDS = 1.0  # and a reading may describe up to a second before the last one
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT on 64-bit: no pid is larger


def plausible_increase(increase: float, elapsed: float, rate: float,
                       grace: float = RATE_GRACE_SECONDS) -> bool:
    """Whether a counter that grows by at most ``rate`` per second can have grown by
    ``increase`` in ``elapsed`` seconds (with ``RATE_SLACK`` and ``grace`` seconds of
    tolerance): the one check every counter input passes before it moves a counter
    (engine busy time: ``rate`` is the engines behind the name; energy: the watts the
    GPU can draw). False for anything not finite or negative: the increase is dropped
    and counted (``ErrorReason.IMPLAUSIBLE``), never added."""
    try:
        ok = math.isfinite(increase) and math.isfinite(elapsed) and math.isfinite(rate)
        return ok and 0 <= increase <= rate * (max(0.0, elapsed) * RATE_SLACK + grace)
    except TypeError:
        return False


def valid_pid(pid: int | None) -> bool:
    """A process id the kernel can hand out: 1..PID_MAX (0 is the idle task, never a
    GPU process; anything larger or negative is a driver's or a library's garbage)."""
    return isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= PID_MAX


def clamp_ratio(value: float | None) -> float | None:
    """A computed ratio (busy time / elapsed) into 0..1; NaN/inf/negative -> None."""
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return min(value, 1.0)


# PCIe signalling rate per lane (GT/s) -> generation (PCI Express base specification).
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_GTS_RE = re.compile(r"([0-9]{1,3}(?:\.[0-9]{1,3})?)\s*GT/s", re.I)


def pcie_generation(gts: float | None) -> int | None:
    """8.0 -> 3; anything that is not a PCIe rate -> None."""
    if gts is None or not math.isfinite(gts):
        return None
    return _GEN_BY_GTS.get(round(gts, 1))


def parse_link_speed(text: str | None) -> int | None:
    """sysfs ``current_link_speed`` (``"16.0 GT/s PCIe"``) -> 4; ``"Unknown"`` -> None."""
    m = _GTS_RE.search(text or "")
    return pcie_generation(float(m.group(1))) if m else None


def parse_link_width(text: str | None) -> int | None:
    """``"16"`` -> 16; ``"0"`` (an iGPU: no link) and garbage -> None."""
    return link_width(parse_int(text))


def link_width(lanes: int | None) -> int | None:
    """A PCIe link's lanes, 1..64; 0 (an iGPU: no link) and more -> None."""
    return lanes if lanes is not None and 0 < lanes <= 64 else None


def printable(text: str, limit: int) -> str:
    """``text`` without control, format or escape characters (C0, C1, ESC, DEL, bidi
    overrides, line separators: everything ``str.isprintable`` refuses), at most
    ``limit`` characters: the one filter for names that come from outside (process
    names, command lines, Kubernetes names, everything ``gpu-exporter top`` draws)."""
    if text.isprintable():  # the usual case, in C
        return text[:limit]
    return "".join(ch for ch in text if ch.isprintable())[:limit]


def process_name(raw: bytes | str | None) -> str:
    """A process's ``comm`` as a label value: any bytes decode, control characters dropped.

    The one reader for every backend (NVML's and fdinfo's processes are named alike).
    """
    if raw is None:
        return ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return printable(text.rstrip("\n"), 64)


MAX_COMMAND = 256  # characters of a command line kept (procps top cuts it to the screen)


def command_line(raw: bytes | None) -> str | None:
    """``/proc/<pid>/cmdline`` (arguments separated by NUL) as one line: arguments joined
    by a space, control characters dropped, at most MAX_COMMAND characters; None where
    it is empty (a kernel thread, a zombie) or unreadable."""
    if not raw:
        return None
    text = raw[:4 * MAX_COMMAND].rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return printable(text, MAX_COMMAND).strip() or None


def parse_uid(status: bytes | None) -> int | None:
    """The real uid of ``/proc/<pid>/status`` (its ``Uid:`` line: real, effective, saved,
    filesystem), or None."""
    if not status:
        return None
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            fields = line[4:].split()
            if fields and fields[0].isdigit():
                return int(fields[0])
            return None
    return None


def parse_start_time(stat: bytes) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks after boot); comm may hold spaces.

    With the pid, the identity of a process: a reused pid has another start time.
    """
    _, sep, rest = stat.rpartition(b")")
    fields = rest.split()
    if not sep or len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19])


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def parse_rss(statm: bytes | None, status: bytes | None) -> float | None:
    """Resident set size in bytes from ``/proc/<pid>/statm`` (pages), else ``status``
    (``VmRSS: N kB``): the one reader for every backend that reports host memory."""
    fields = (statm or b"").split()
    pages = parse_int(fields[1]) if len(fields) >= 2 else None
    if pages is not None:
        return bounded(pages * _PAGE_SIZE, "bytes")
    for line in (status or b"").splitlines():
        if line.startswith(b"VmRSS:"):
            parts = line.split()
            kib = parse_int(parts[1]) if len(parts) == 3 and parts[2] == b"kB" else None
            return None if kib is None else bounded(kib * 1024, "bytes")
    return None
