"""Pure parsers for amdgpu's text sysfs attributes (text in, values out; no I/O).

Owns the formats of ``pp_dpm_sclk`` / ``pp_dpm_mclk`` (DPM level tables),
``pp_dpm_pcie``, ``pcie_bw`` and the RAS ``ras/<block>_err_count`` files. Numbers go through
exporter.core.units (link speeds too: ``units.parse_link_speed``); a level whose number
is garbage (400 digits, a negative clock) is dropped and counted, never raised.
Kernel reference: Documentation/gpu/amdgpu/thermal.rst ("pp_dpm_*"), driver-misc.rst
("pcie_bw") and amdgpu-ras ("ras/<block>_err_count").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.core import units

# "1: 456Mhz *", "S: 19Mhz *", "0: 2.5GT/s, x1 78Mhz " (pcie), tabs or spaces.
_DPM_RE = re.compile(r"^\s*(\w+):\s*(?:([\d.]+)GT/s,\s*x(\d+)\s+)?(\d+)\s*mhz\s*(\*)?", re.I)
_RAS_RE = re.compile(r"^\s*(ue|ce)\s*:\s*(\d+)\s*$", re.I | re.M)


@dataclass(frozen=True)
class DpmLevel:
    level: str  # "0", "1", ... or "S" (deep sleep)
    hz: float  # the level's clock, bounded by units ("hertz")
    current: bool
    pcie_gts: float | None = None  # pp_dpm_pcie only
    pcie_width: int | None = None


def parse_pp_dpm(text: str | None) -> tuple[list[DpmLevel], int]:
    """All levels of a ``pp_dpm_*`` table, and how many lines held a garbage number.

    A line that is not a level at all is skipped silently (the kernel prints headers on
    some ASICs); a level whose clock, rate or width is not plausible is dropped and counted.
    """
    levels: list[DpmLevel] = []
    bad = 0
    for line in (text or "").splitlines():
        m = _DPM_RE.match(line)
        if not m:
            continue
        hz = units.scaled(units.parse_int(m.group(4)), 1_000_000, "hertz")
        gts = units.parse_number(m.group(2)) if m.group(2) else None
        width = units.parse_link_width(m.group(3)) if m.group(3) else None
        if hz is None or (m.group(2) and gts is None) or (m.group(3) and width is None):
            bad += 1
            continue
        levels.append(DpmLevel(level=m.group(1), hz=hz, current=m.group(5) is not None,
                               pcie_gts=gts, pcie_width=width))
    return levels, bad


def dpm_current_hz(levels: list[DpmLevel]) -> float | None:
    """The ``*`` level's clock in Hz (the deep-sleep ``S:`` level counts: it is real)."""
    for lvl in levels:
        if lvl.current:
            return lvl.hz
    return None


def dpm_max_hz(levels: list[DpmLevel]) -> float | None:
    """Highest level in Hz. On RDNA the table can list the current clock between the
    min and max rows ("0: 500Mhz / 1: 77Mhz * / 2: 2254Mhz"), so take the max, not the last.
    """
    return max(lvl.hz for lvl in levels) if levels else None


def parse_ras_count(text: str | None) -> tuple[dict[str, int], int]:
    """``"ue: 0\\nce: 3"`` -> ({"uncorrected": 0, "corrected": 3}, 0); the second value
    counts counts that are not a u64 (dropped)."""
    out: dict[str, int] = {}
    bad = 0
    for kind, value in _RAS_RE.findall(text or ""):
        count = units.parse_int(value)
        if count is None or count < 0 or count == units.U64_MAX:
            bad += 1
            continue
        out["uncorrected" if kind.lower() == "ue" else "corrected"] = count
    return out, bad


# The maximum payload sizes PCIe allows (bytes): 128 << 0..5.
PCIE_MPS = frozenset(128 << i for i in range(6))


def parse_pcie_bw(text: str | None) -> tuple[float, float] | None:
    """``pcie_bw`` -> (received, sent) bytes per second, or None when it is not three
    numbers with a valid payload size (bad input: the caller counts it).

    The driver counts PCIe messages for one second inside the read and prints
    "<received> <sent> <mps>" (amdgpu_pm.c: count0 is event 40, messages received;
    count1 event 104, posted requests sent; mps the maximum payload size in bytes).
    A message carries at most mps bytes, so count x mps is an upper bound of the bytes,
    the estimate rocm-smi makes too (which reads the first number as "sent").
    """
    words = (text or "").split()
    if len(words) != 3:
        return None
    received, sent, mps = (units.parse_int(w) for w in words)
    if received is None or sent is None or mps not in PCIE_MPS or received < 0 or sent < 0:
        return None
    rx = units.bounded(received * mps, "bytes_per_second")
    tx = units.bounded(sent * mps, "bytes_per_second")
    return None if rx is None or tx is None else (rx, tx)
