"""Pure parsers and tables for the Intel (i915 / xe) backend: no file access here.

Owns: what an i915/xe sysfs attribute means in docs/metrics.md terms: the throttle-reason
mapping, which GT is the render one and which the media one, which hwmon channel is
which sensor, PCI device id -> marketing name. Numbers themselves are parsed and
bounded by exporter.core.units, energy -> power by exporter.sources.energy.

Kernel references: drivers/gpu/drm/xe/xe_gt_freq.c and xe_gt_throttle.c
(``device/tile<T>/gt<G>/freq0/*``), drivers/gpu/drm/xe/xe_gt_idle.c (``gtidle/name``),
drivers/gpu/drm/i915/gt/intel_gt_sysfs_pm.c (``gt_*_freq_mhz``, ``gt/gt<N>/rps_*``,
``throttle_reason_*``), Documentation/ABI/testing/sysfs-driver-intel-xe-hwmon.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.core.labels import Clock, Sensor

# xe ``freq0/throttle/reason_<x>`` and i915 ``gt/gtN/throttle_reason_<x>`` both read
# the PCU's PERF_LIMIT_REASONS bits. Mapped onto docs/metrics.md's NVML-derived `reason`
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


# hwmon channel labels -> docs/metrics.md `sensor`. xe also labels mctrl, pcie and
# vram_ch_<N> sensors (Battlemage); METRICS has no sensor value for them, so they
# stay out rather than invent label values.
TEMP_SENSORS: Mapping[str, Sensor] = {"pkg": Sensor.PACKAGE, "vram": Sensor.VRAM}


def temperature_sensor(chip: str | None, label: str) -> Sensor | None:
    """The METRICS sensor of hwmon channel ``label`` on chip ``chip`` ("xe", "i915").

    i915 writes no label files: its ABI (Documentation/ABI/testing/
    sysfs-driver-intel-i915-hwmon, kernel 6.12) documents ``temp1_input`` as the
    "GPU package temperature", so discrete Arc on i915 reports its package sensor.
    """
    if label in TEMP_SENSORS:
        return TEMP_SENSORS[label]
    if chip == "i915" and label == "temp1":
        return Sensor.PACKAGE
    return None


def temperature_labels(chip: str | None) -> frozenset[str]:
    """Every hwmon label ``temperature_sensor`` maps to a sensor on chip ``chip``: the
    channels worth reading (xe lists 16 on a B580, every VRAM channel among them)."""
    return frozenset(TEMP_SENSORS) | (frozenset({"temp1"}) if chip == "i915" else frozenset())


# xe names each GT's idle (C-state) domain "gt<N>-rc" for a render/compute GT and
# "gt<N>-mc" for a media GT (xe_gt_idle.c). The media GT clocks the video engines
# (vcs/vecs), which is what METRICS's clock="video" means (NVML's video clock).
GT_CLOCKS: Mapping[str, Clock] = {"rc": Clock.GRAPHICS, "mc": Clock.VIDEO}


def gt_clock_label(idle_name: str | None, gt: str) -> Clock | None:
    """``("gt1-mc", "gt1")`` -> "video"; no gtidle name: gt0 is the render GT."""
    if idle_name:
        return GT_CLOCKS.get(idle_name.rpartition("-")[2])
    return Clock.GRAPHICS if gt == "gt0" else None


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
