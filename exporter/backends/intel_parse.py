"""Pure parsers and tables for the Intel (i915 / xe) backend: no file access here.

Owns: what an i915/xe sysfs string means in METRICS.md terms. Frequencies (MHz),
PCIe link speed strings, the throttle-reason mapping, which GT is the render one
and which the media one, PCI device id -> marketing name, energy -> power.

Kernel references: drivers/gpu/drm/xe/xe_gt_freq.c and xe_gt_throttle.c
(``device/tile<T>/gt<G>/freq0/*``), drivers/gpu/drm/xe/xe_gt_idle.c (``gtidle/name``),
drivers/gpu/drm/i915/gt/intel_gt_sysfs_pm.c (``gt_*_freq_mhz``, ``gt/gt<N>/rps_*``,
``throttle_reason_*``), Documentation/ABI/testing/sysfs-driver-intel-xe-hwmon.
"""

from __future__ import annotations

from collections.abc import Mapping

MHZ = 1_000_000.0


def parse_int(text: str | None) -> int | None:
    """A decimal sysfs integer (already cleaned of NULs/whitespace), else None."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def mhz_to_hertz(value: int | None) -> float | None:
    """i915 ``gt_*_freq_mhz`` / xe ``*_freq`` are MHz; negative means garbage."""
    if value is None or value < 0:
        return None
    return value * MHZ


# PCIe signalling rate -> generation (PCI Express base spec; the kernel prints
# "<rate> GT/s PCIe" in current_link_speed / max_link_speed, "Unknown" for iGPUs).
_LINK_GENERATIONS = {
    "2.5": 1,
    "5.0": 2,
    "5": 2,
    "8.0": 3,
    "8": 3,
    "16.0": 4,
    "16": 4,
    "32.0": 5,
    "32": 5,
    "64.0": 6,
    "64": 6,
}


def parse_link_speed(text: str | None) -> int | None:
    """``"16.0 GT/s PCIe"`` -> 4; ``"Unknown"`` (integrated GPUs) -> None."""
    if not text:
        return None
    rate = text.split()[0]
    return _LINK_GENERATIONS.get(rate)


def parse_link_width(text: str | None) -> int | None:
    """``"8"`` -> 8; ``"0"`` (integrated GPUs: no link) -> None."""
    width = parse_int(text)
    return width if width else None


# xe ``freq0/throttle/reason_<x>`` and i915 ``gt/gtN/throttle_reason_<x>`` both read
# the PCU's PERF_LIMIT_REASONS bits. Mapped onto METRICS.md's NVML-derived `reason`
# values by what limits the clock; several Intel bits may fold into one reason (OR):
#  - pl1, pl2 (package power limits the firmware enforces over a window) are what
#    NVML calls a software power cap                              -> sw_power_cap
#  - pl4 ("PL4, Iccmax"), vr_tdc (VR current limit) are fast electrical limits the
#    hardware enforces, NVML's "HW slowdown ... power draw too high" -> hw_slowdown
#  - thermal (firmware thermal limit), ratl (running-average thermal limit) are
#    the firmware keeping temperature under its limit            -> sw_thermal
#  - prochot (the PROCHOT# signal), vr_thermalert (the VR's thermal alert line)
#    are hardware thermal signals                                -> hw_thermal
# ``status`` (any of the above) is not a reason and is left out; so is any bit this
# table does not know (Crescent Island's psys_*, soc_* ...): we never guess.
THROTTLE_REASONS: Mapping[str, str] = {
    "pl1": "sw_power_cap",
    "pl2": "sw_power_cap",
    "pl4": "hw_slowdown",
    "vr_tdc": "hw_slowdown",
    "thermal": "sw_thermal",
    "ratl": "sw_thermal",
    "prochot": "hw_thermal",
    "vr_thermalert": "hw_thermal",
}


def map_throttle_reasons(bits: Mapping[str, int]) -> dict[str, bool]:
    """``{"pl1": 0, "thermal": 1, ...}`` -> ``{"sw_power_cap": False, "sw_thermal": True}``.

    A METRICS reason appears only when at least one Intel bit that feeds it was read.
    """
    out: dict[str, bool] = {}
    for bit, value in bits.items():
        reason = THROTTLE_REASONS.get(bit)
        if reason is not None:
            out[reason] = out.get(reason, False) or value != 0
    return out


# xe names each GT's idle (C-state) domain "gt<N>-rc" for a render/compute GT and
# "gt<N>-mc" for a media GT (xe_gt_idle.c). The media GT clocks the video engines
# (vcs/vecs), which is what METRICS's clock="video" means (NVML's video clock).
GT_CLOCKS: Mapping[str, str] = {"rc": "graphics", "mc": "video"}


def gt_clock_label(idle_name: str | None, gt: str) -> str | None:
    """``("gt1-mc", "gt1")`` -> "video"; no gtidle name: gt0 is the render GT."""
    if idle_name:
        return GT_CLOCKS.get(idle_name.rpartition("-")[2])
    return "graphics" if gt == "gt0" else None


# PCI device id -> (name, architecture). Only ids whose name a public table states:
# pci.ids ("DG2 [Arc A380]", "TigerLake-LP GT2 [Iris Xe Graphics]", "CometLake-U GT2
# [UHD Graphics]") and Intel compute-runtime's device table ("Intel(R) Arc(TM) B580
# Graphics", "... B570 ..."). Anything else is "Intel GPU <id>".
DEVICE_NAMES: Mapping[int, tuple[str, str]] = {
    0x56A5: ("Intel Arc A380", "Xe-HPG"),
    0xE20B: ("Intel Arc B580", "Xe2-HPG"),
    0xE20C: ("Intel Arc B570", "Xe2-HPG"),
    0x9A49: ("Intel Iris Xe Graphics", "Xe-LP"),
    0x9B41: ("Intel UHD Graphics", "Gen9.5"),
}


def device_name(device_id: int) -> tuple[str, str]:
    return DEVICE_NAMES.get(device_id, (f"Intel GPU {device_id:04x}", ""))


def power_from_energy(
    previous: tuple[float, float] | None, current: tuple[float, float]
) -> float | None:
    """Average watts between two ``(joules, monotonic seconds)`` readings.

    None on the first reading, when no time passed, or when the counter went
    backwards (driver reload, wrap): a wrong spike is worse than one missing point.
    """
    if previous is None:
        return None
    d_joules = current[0] - previous[0]
    d_seconds = current[1] - previous[1]
    if d_seconds <= 0 or d_joules < 0:
        return None
    return d_joules / d_seconds


def first_present(values: Mapping[str, float], keys: tuple[str, ...]) -> float | None:
    """The first of ``keys`` that ``values`` holds with a positive value.

    Power limits read 0 when disabled (xe ABI: "A read value of 0 means that the PL1
    power limit is disabled"), so 0 falls through to the next candidate.
    """
    for key in keys:
        value = values.get(key)
        if value is not None and value > 0:
            return value
    return None
