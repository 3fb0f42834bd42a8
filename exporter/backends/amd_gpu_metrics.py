"""Decoder for amdgpu's binary ``gpu_metrics`` sysfs file (pure: bytes in, dataclass out).

Owns the layouts of ``struct gpu_metrics_v1_0`` .. ``v1_3`` (dGPUs), ``v2_0`` .. ``v2_4``
(APUs) and ``v3_0`` (Strix-class APUs) from the kernel's
``drivers/gpu/drm/amd/include/kgd_pp_interface.h``. Every version starts with the
same header: ``structure_size`` u16, ``format_revision`` u8, ``content_revision`` u8.
Fields are little-endian with C natural alignment; layouts are written below as
(name, type) lists and their offsets computed the way the compiler does.

A field of all ones (0xFFFF, 0xFFFFFFFF, ...) means "this ASIC does not fill it" and
decodes to None. A file shorter than its layout (a truncated read) decodes the
fields that fit. Units differ by generation, and are normalised here:

- v1.x (dGPU): temperatures in °C, socket power in W.
- v2.x, v3.0 (APU): temperatures in centi-°C, power in mW.
- energy_accumulator: 15.259 µJ (2^-16 J) units (the resolution amdsmi reports);
  a value of 0 is taken as "not filled" (RDNA3 firmware never updates it).
- activities in percent (v2.4: hundredths of a percent), clocks in MHz, PCIe speed in 0.1 GT/s.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_F = list[tuple[str, str]]  # (field name, struct code with optional count: "H", "8H")

_HEADER: _F = [("structure_size", "H"), ("format_revision", "B"), ("content_revision", "B")]
_V1_TEMPS: _F = [
    ("temperature_edge", "H"), ("temperature_hotspot", "H"), ("temperature_mem", "H"),
    ("temperature_vrgfx", "H"), ("temperature_vrsoc", "H"), ("temperature_vrmem", "H"),
    ("average_gfx_activity", "H"), ("average_umc_activity", "H"), ("average_mm_activity", "H"),
    ("average_socket_power", "H"),
]  # fmt: skip
_V1_CLOCKS: _F = [
    ("average_gfxclk_frequency", "H"), ("average_socclk_frequency", "H"),
    ("average_uclk_frequency", "H"), ("average_vclk0_frequency", "H"),
    ("average_dclk0_frequency", "H"), ("average_vclk1_frequency", "H"),
    ("average_dclk1_frequency", "H"), ("current_gfxclk", "H"), ("current_socclk", "H"),
    ("current_uclk", "H"), ("current_vclk0", "H"), ("current_dclk0", "H"),
    ("current_vclk1", "H"), ("current_dclk1", "H"), ("throttle_status", "I"),
    ("current_fan_speed", "H"),
]  # fmt: skip
_V1_1: _F = [
    *_HEADER, *_V1_TEMPS, ("energy_accumulator", "Q"), ("system_clock_counter", "Q"),
    *_V1_CLOCKS, ("pcie_link_width", "H"), ("pcie_link_speed", "H"), ("padding", "H"),
    ("gfx_activity_acc", "I"), ("mem_activity_acc", "I"), ("temperature_hbm", "4H"),
]  # fmt: skip
_V1_2: _F = [*_V1_1, ("firmware_timestamp", "Q")]
_V1_3: _F = [
    *_V1_2, ("voltage_soc", "H"), ("voltage_gfx", "H"), ("voltage_mem", "H"),
    ("padding1", "H"), ("indep_throttle_status", "Q"),
]  # fmt: skip
_V1_0: _F = [
    *_HEADER, ("system_clock_counter", "Q"), *_V1_TEMPS, ("energy_accumulator", "I"),
    *_V1_CLOCKS, ("pcie_link_width", "B"), ("pcie_link_speed", "B"),
]  # fmt: skip

_V2_TEMPS: _F = [
    ("temperature_gfx", "H"), ("temperature_soc", "H"), ("temperature_core", "8H"),
    ("temperature_l3", "2H"),
]  # fmt: skip
_V2_POWER_CLOCKS: _F = [
    ("average_socket_power", "H"), ("average_cpu_power", "H"), ("average_soc_power", "H"),
    ("average_gfx_power", "H"), ("average_core_power", "8H"),
    ("average_gfxclk_frequency", "H"), ("average_socclk_frequency", "H"),
    ("average_uclk_frequency", "H"), ("average_fclk_frequency", "H"),
    ("average_vclk_frequency", "H"), ("average_dclk_frequency", "H"),
    ("current_gfxclk", "H"), ("current_socclk", "H"), ("current_uclk", "H"),
    ("current_fclk", "H"), ("current_vclk", "H"), ("current_dclk", "H"),
    ("current_coreclk", "8H"), ("current_l3clk", "2H"), ("throttle_status", "I"),
    ("fan_pwm", "H"),
]  # fmt: skip
_V2_0: _F = [
    *_HEADER, ("system_clock_counter", "Q"), *_V2_TEMPS, ("average_gfx_activity", "H"),
    ("average_mm_activity", "H"), *_V2_POWER_CLOCKS, ("padding", "H"),
]  # fmt: skip
_V2_1: _F = [
    *_HEADER, *_V2_TEMPS, ("average_gfx_activity", "H"), ("average_mm_activity", "H"),
    ("system_clock_counter", "Q"), *_V2_POWER_CLOCKS, ("padding", "3H"),
]  # fmt: skip
_V2_2: _F = [*_V2_1, ("indep_throttle_status", "Q")]
_V2_3: _F = [
    *_V2_2, ("average_temperature_gfx", "H"), ("average_temperature_soc", "H"),
    ("average_temperature_core", "8H"), ("average_temperature_l3", "2H"),
]  # fmt: skip
_V2_4: _F = [
    *_V2_3, ("average_cpu_voltage", "H"), ("average_soc_voltage", "H"),
    ("average_gfx_voltage", "H"), ("average_cpu_current", "H"),
    ("average_soc_current", "H"), ("average_gfx_current", "H"),
]  # fmt: skip
_V3_0: _F = [
    *_HEADER, ("temperature_gfx", "H"), ("temperature_soc", "H"), ("temperature_core", "16H"),
    ("temperature_skin", "H"), ("average_gfx_activity", "H"), ("average_vcn_activity", "H"),
    ("average_ipu_activity", "8H"), ("average_core_c0_activity", "16H"),
    ("average_dram_reads", "H"), ("average_dram_writes", "H"), ("average_ipu_reads", "H"),
    ("average_ipu_writes", "H"), ("system_clock_counter", "Q"),
    ("average_socket_power", "I"), ("average_ipu_power", "H"), ("average_apu_power", "I"),
    ("average_gfx_power", "I"), ("average_dgpu_power", "I"), ("average_all_core_power", "I"),
    ("average_core_power", "16H"), ("average_sys_power", "H"), ("stapm_power_limit", "H"),
    ("current_stapm_power_limit", "H"), ("average_gfxclk_frequency", "H"),
    ("average_socclk_frequency", "H"), ("average_vpeclk_frequency", "H"),
    ("average_ipuclk_frequency", "H"), ("average_fclk_frequency", "H"),
    ("average_vclk_frequency", "H"), ("average_uclk_frequency", "H"),
    ("average_mpipu_frequency", "H"), ("current_coreclk", "16H"),
    ("current_core_maxfreq", "H"), ("current_gfx_maxfreq", "H"),
    ("throttle_residency_prochot", "I"), ("throttle_residency_spl", "I"),
    ("throttle_residency_fppt", "I"), ("throttle_residency_sppt", "I"),
    ("throttle_residency_thm_core", "I"), ("throttle_residency_thm_gfx", "I"),
    ("throttle_residency_thm_soc", "I"), ("time_filter_alphavalue", "I"),
]  # fmt: skip

LAYOUTS: Mapping[tuple[int, int], _F] = MappingProxyType(
    {
        (1, 0): _V1_0, (1, 1): _V1_1, (1, 2): _V1_2, (1, 3): _V1_3,
        (2, 0): _V2_0, (2, 1): _V2_1, (2, 2): _V2_2, (2, 3): _V2_3, (2, 4): _V2_4,
        (3, 0): _V3_0,
    }
)  # fmt: skip

# Independent throttle bits (SMU_THROTTLER_*_BIT in amdgpu_smu.h), grouped into the
# `reason` values METRICS.md defines: PPT/SPL limits are firmware power capping,
# TDC/EDC are electrical (current) limits, temperature limits are enforced by the
# firmware, VRHOT/PROCHOT are hardware signals from outside the GPU.
THROTTLE_GROUPS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        "sw_power_cap": tuple(range(0, 8)),
        "hw_slowdown": tuple(range(16, 24)),
        "sw_thermal": tuple(range(32, 44)),
        "hw_thermal": (44, 45),
        "hw_power_brake": (46, 47),
    }
)


class GpuMetricsError(ValueError):
    """Too short for even the header, or a revision this decoder does not know."""


@dataclass(frozen=True)
class GpuMetrics:
    """The fields the exporter uses, in base units; None = not filled by this ASIC."""

    format_revision: int
    content_revision: int
    structure_size: int
    temperatures_celsius: Mapping[str, float] = field(default_factory=dict)
    gfx_activity_ratio: float | None = None
    memory_activity_ratio: float | None = None  # UMC (memory controller), v1.x only
    video_activity_ratio: float | None = None  # UVD/VCN
    socket_power_watts: float | None = None
    energy_joules: float | None = None
    clocks_hertz: Mapping[str, float] = field(default_factory=dict)  # current, by clock
    throttle_status: int | None = None  # ASIC-dependent bits, kept for debugging
    indep_throttle_status: int | None = None  # ASIC-independent SMU_THROTTLER_* bits
    fan_rpm: float | None = None
    pcie_link_width: int | None = None
    pcie_link_speed_gts: float | None = None
    raw: Mapping[str, int | tuple[int | None, ...] | None] = field(default_factory=dict)

    @property
    def throttle_reasons(self) -> dict[str, bool]:
        """reason -> active, from the independent status; {} when not reported."""
        status = self.indep_throttle_status
        if status is None:
            return {}
        return {
            reason: any(status >> bit & 1 for bit in bits)
            for reason, bits in THROTTLE_GROUPS.items()
        }


def _offsets(layout: _F) -> tuple[str, list[tuple[str, int, str, int]]]:
    """Little-endian struct format with explicit padding, and (name, offset, code, count)."""
    fmt, offset, fields = "<", 0, []
    for name, code in layout:
        count = int(code[:-1] or 1)
        kind = code[-1]
        size = struct.calcsize(kind)
        pad = -offset % size  # natural alignment, as the kernel's compiler lays it out
        fmt += "x" * pad + code
        offset += pad
        fields.append((name, offset, kind, count))
        offset += size * count
    return fmt, fields


def _unset(value: int, kind: str) -> bool:
    return value == (1 << (8 * struct.calcsize(kind))) - 1


def decode_raw(data: bytes) -> tuple[int, int, int, dict[str, int | tuple[int | None, ...] | None]]:
    """(format, content, size, {field: value}) with all-ones fields as None."""
    if len(data) < 4:
        raise GpuMetricsError(f"gpu_metrics is {len(data)} bytes: no header")
    size, fmt_rev, content_rev = struct.unpack_from("<HBB", data)
    layout = LAYOUTS.get((fmt_rev, content_rev))
    if layout is None:
        raise GpuMetricsError(f"unknown gpu_metrics revision v{fmt_rev}.{content_rev}")
    # The kernel may pad the file (sysfs reads of a page); trust structure_size, but
    # never read past what we have.
    _, fields = _offsets(layout)
    out: dict[str, int | tuple[int | None, ...] | None] = {}
    for name, offset, kind, count in fields:
        end = offset + struct.calcsize(kind) * count
        if end > min(len(data), size or len(data)):
            break
        values = struct.unpack_from(f"<{count}{kind}", data, offset)
        cleaned = tuple(None if _unset(v, kind) else v for v in values)
        out[name] = cleaned if count > 1 else cleaned[0]
    return fmt_rev, content_rev, size, out


def _num(raw: Mapping[str, object], name: str) -> int | None:
    value = raw.get(name)
    return value if isinstance(value, int) else None


def _scaled(raw: Mapping[str, object], name: str, scale: float) -> float | None:
    value = _num(raw, name)
    if value is None:
        return None
    # Divide by an exact integer (100, 1000, 65536) so 2737 centi-°C is 27.37, not 27.369999.
    return value / round(1 / scale) if 0 < scale < 1 else value * scale


def parse_gpu_metrics(data: bytes) -> GpuMetrics:
    """Decode a whole ``gpu_metrics`` read. Raises GpuMetricsError on an unknown layout."""
    fmt_rev, content_rev, size, raw = decode_raw(data)
    apu = fmt_rev >= 2
    temp_scale = 0.01 if apu else 1.0  # APU tables report centi-degrees
    power_scale = 0.001 if apu else 1.0  # APU tables report mW
    temps: dict[str, float] = {}
    names = (
        {"gfx": "temperature_gfx", "soc": "temperature_soc"}
        if apu
        else {"edge": "temperature_edge", "junction": "temperature_hotspot",
              "memory": "temperature_mem", "vrgfx": "temperature_vrgfx",
              "vrsoc": "temperature_vrsoc", "vrmem": "temperature_vrmem"}
    )  # fmt: skip
    for sensor, name in names.items():
        value = _scaled(raw, name, temp_scale)
        if value is not None:
            temps[sensor] = value
    clocks: dict[str, float] = {}
    for clock, name in (("graphics", "current_gfxclk"), ("memory", "current_uclk"),
                        ("soc", "current_socclk"), ("fabric", "current_fclk")):  # fmt: skip
        value = _scaled(raw, name, 1e6)
        if value is not None:
            clocks[clock] = value
    speed = _num(raw, "pcie_link_speed")
    # SMU13 dGPUs (RDNA3) leave the accumulator at 0 for the life of the driver: a
    # counter that never moves is "not filled", not a card that used no energy.
    energy = _scaled(raw, "energy_accumulator", 2.0**-16) or None
    # v2.4 reports activity in hundredths of a percent.
    activity_scale = 0.01 if (fmt_rev, content_rev) == (2, 4) else 1.0
    video = "average_vcn_activity" if fmt_rev == 3 else "average_mm_activity"
    return GpuMetrics(
        format_revision=fmt_rev,
        content_revision=content_rev,
        structure_size=size,
        temperatures_celsius=temps,
        gfx_activity_ratio=_ratio(_scaled(raw, "average_gfx_activity", activity_scale)),
        memory_activity_ratio=_ratio(_scaled(raw, "average_umc_activity", activity_scale)),
        video_activity_ratio=_ratio(_scaled(raw, video, activity_scale)),
        socket_power_watts=_scaled(raw, "average_socket_power", power_scale),
        energy_joules=energy,
        clocks_hertz=clocks,
        throttle_status=_num(raw, "throttle_status"),
        indep_throttle_status=_num(raw, "indep_throttle_status"),
        fan_rpm=None if apu else _scaled(raw, "current_fan_speed", 1.0),
        pcie_link_width=_num(raw, "pcie_link_width"),
        pcie_link_speed_gts=None if speed is None else speed / 10,
        raw=raw,
    )


def _ratio(percent: float | None) -> float | None:
    # Firmware occasionally reports >100 % transiently; a ratio stays within 0..1.
    return None if percent is None else min(percent, 100) / 100
