"""Pure parsers for amdgpu's text sysfs attributes (text in, values out; no I/O).

Owns the formats of ``pp_dpm_sclk`` / ``pp_dpm_mclk`` (DPM level tables),
``pp_dpm_pcie``, ``current_link_speed`` / ``max_link_speed`` and the RAS
``ras/<block>_err_count`` files. Kernel reference: Documentation/gpu/amdgpu/thermal.rst
("pp_dpm_*") and amdgpu-ras ("ras/<block>_err_count").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "1: 456Mhz *", "S: 19Mhz *", "0: 2.5GT/s, x1 78Mhz " (pcie), tabs or spaces.
_DPM_RE = re.compile(r"^\s*(\w+):\s*(?:([\d.]+)GT/s,\s*x(\d+)\s+)?(\d+)\s*mhz\s*(\*)?", re.I)
_GTS_RE = re.compile(r"([\d.]+)\s*GT/s", re.I)
_RAS_RE = re.compile(r"^\s*(ue|ce)\s*:\s*(\d+)\s*$", re.I | re.M)

# PCIe generation by per-lane transfer rate (GT/s).
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


@dataclass(frozen=True)
class DpmLevel:
    level: str  # "0", "1", ... or "S" (deep sleep)
    mhz: int
    current: bool
    pcie_gts: float | None = None  # pp_dpm_pcie only
    pcie_width: int | None = None


def parse_pp_dpm(text: str | None) -> list[DpmLevel]:
    """All levels of a ``pp_dpm_*`` table; unparsable lines are skipped."""
    levels: list[DpmLevel] = []
    for line in (text or "").splitlines():
        m = _DPM_RE.match(line)
        if m:
            levels.append(
                DpmLevel(
                    level=m.group(1),
                    mhz=int(m.group(4)),
                    current=m.group(5) is not None,
                    pcie_gts=float(m.group(2)) if m.group(2) else None,
                    pcie_width=int(m.group(3)) if m.group(3) else None,
                )
            )
    return levels


def dpm_current_hz(levels: list[DpmLevel]) -> float | None:
    """The ``*`` level's clock in Hz (the deep-sleep ``S:`` level counts: it is real)."""
    for lvl in levels:
        if lvl.current:
            return lvl.mhz * 1e6
    return None


def dpm_max_hz(levels: list[DpmLevel]) -> float | None:
    """Highest level in Hz. On RDNA the table can list the current clock between the
    min and max rows ("0: 500Mhz / 1: 77Mhz * / 2: 2254Mhz"), so take the max, not the last.
    """
    return max(lvl.mhz for lvl in levels) * 1e6 if levels else None


def pcie_generation(gts: float | None) -> int | None:
    if gts is None:
        return None
    return _GEN_BY_GTS.get(round(gts, 1))


def parse_link_speed(text: str | None) -> int | None:
    """``"16.0 GT/s PCIe"`` -> 4. ``"Unknown"`` or garbage -> None."""
    m = _GTS_RE.search(text or "")
    return pcie_generation(float(m.group(1))) if m else None


def parse_ras_count(text: str | None) -> dict[str, int]:
    """``"ue: 0\\nce: 3"`` -> {"uncorrected": 0, "corrected": 3}."""
    out: dict[str, int] = {}
    for kind, value in _RAS_RE.findall(text or ""):
        out["uncorrected" if kind.lower() == "ue" else "corrected"] = int(value)
    return out
