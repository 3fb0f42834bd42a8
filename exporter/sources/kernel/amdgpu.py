"""Pure parsers for amdgpu's text sysfs attributes (text in, values out; no I/O).

Owns the formats of ``pp_dpm_sclk`` / ``pp_dpm_mclk`` (DPM level tables),
``pp_dpm_pcie``, ``pcie_bw`` and the RAS ``ras/<block>_err_count`` files. Numbers go through
exporter.core.units (link speeds too: ``units.parse_link_speed``); a level whose number
is garbage (400 digits, a negative clock) is dropped and counted, never raised.
Also the KFD topology's node ``properties`` (``/sys/class/kfd/kfd/topology/nodes/<N>/
properties``, drivers/gpu/drm/amd/amdkfd/kfd_topology.c): the GPU's gfx target and PCI
location.
Kernel reference: Documentation/gpu/amdgpu/thermal.rst ("pp_dpm_*"), driver-misc.rst
("pcie_bw") and amdgpu-ras ("ras/<block>_err_count").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from exporter.core import units
from exporter.core.labels import Severity

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
    A table reads the same until its ``*`` moves (a few texts per card), and the sclk or
    mclk table is read every fast cycle where hwmon has no such clock: the texts seen
    last are remembered (the levels are never changed by a caller).
    """
    return _parse_pp_dpm(text)


@lru_cache(maxsize=64)
def _parse_pp_dpm(text: str | None) -> tuple[list[DpmLevel], int]:
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
        out[Severity.UNCORRECTED if kind.lower() == "ue" else Severity.CORRECTED] = count
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


def parse_kfd_properties(text: str | None) -> dict[str, int]:
    """A KFD topology node's ``properties`` file ("name value" lines, decimal) -> name ->
    value; a line that is not a name and a non-negative integer is skipped."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            value = units.parse_int(parts[1])
            if value is not None and value >= 0:
                out[parts[0]] = value
    return out


def gfx_target(version: int) -> str:
    """KFD's ``gfx_target_version`` (major * 10000 + minor * 100 + stepping, as amdkfd's
    kgd2kfd_probe sets it: 110003, 90402, 90010) as the LLVM target the ROCm tools print
    (gfx1103, gfx942, gfx90a: minor and stepping one hex digit each); "" for 0 (a CPU
    node) or a version whose parts do not fit."""
    major, minor, stepping = version // 10000, version // 100 % 100, version % 100
    if not 0 < major < 100 or minor > 15 or stepping > 15:
        return ""
    return f"gfx{major}{minor:x}{stepping:x}"


def kfd_pci_bus_id(props: dict[str, int]) -> str | None:
    """The PCI address of a KFD GPU node: ``domain`` and ``location_id`` (pci_dev_id():
    bus << 8 | devfn, amdkfd's kfd_topology_add_device), as sysfs writes it."""
    location = props.get("location_id")
    if location is None or location > 0xFFFF:
        return None
    domain = props.get("domain", 0)
    bus, slot, function = location >> 8, (location >> 3) & 0x1F, location & 0x7
    return f"{domain:04x}:{bus:02x}:{slot:02x}.{function:x}"
