"""The binary layouts of amdgpu's ``gpu_metrics`` sysfs file, as data (no decoding here).

Source: the kernel's ``drivers/gpu/drm/amd/include/kgd_pp_interface.h``:

- v1.0 .. v1.6 (first form), v2.x, v3.0: torvalds/linux @ 00dedab07b52ca16107e82ce5ca7caaaedf6a417.
- v1.6 (final form, with ``xcp_stats``): amd-gfx patch "drm/amd/pm: Add gpu_metrics_v1_6"
  (Asad Kamal, 2024, ``struct amdgpu_xcp_metrics``); its first form (``vcn_activity`` /
  ``jpeg_activity``, ending in ``padding``) was reverted upstream but shipped in some
  kernels, so both are here and ``structure_size`` tells them apart.
- v1.7: "drm/amd/pm: Add gpu_metrics_v1_7" (kernel commit e2259b5a8c2754d9134fa5a92f69a9de75d7536c,
  ``struct amdgpu_xcp_metrics_v1_1``).
- v1.8: "drm/amd/pm: Add gpu_metrics_v1_8" (amd-gfx, 2025-03-26, ``struct
  amdgpu_xcp_metrics_v1_2``, ``NUM_JPEG_ENG_V1`` = 40).

Each layout is a list of (field, code): a ``struct`` code with an optional count
("H", "8Q"), or a ``Nested`` struct array (``xcp_stats``). Fields are little-endian with
C natural alignment; ``amd_gpu_metrics.offsets`` lays them out as the compiler does
(tests compile the same declarations with ``cc`` and compare every offset).

Which fields each dGPU layout has (the ones the exporter reads; v1.4+ is MI300
``smu_v13_0_6`` and later, where the table changed shape):

| field                          | 1.0-1.3 | 1.4 | 1.5 | 1.6 | 1.7 | 1.8 |
|--------------------------------|---------|-----|-----|-----|-----|-----|
| temperature_edge               | yes     |     |     |     |     |     |
| temperature_hotspot / _mem     | yes     | yes | yes | yes | yes | yes |
| temperature_vrsoc              | yes     | yes | yes | yes | yes | yes |
| average_socket_power (W)       | yes     |     |     |     |     |     |
| curr_socket_power (W)          |         | yes | yes | yes | yes | yes |
| average_gfx/umc_activity (%)   | yes     | yes | yes | yes | yes | yes |
| average_mm_activity (%)        | yes     |     |     |     |     |     |
| vcn_activity[4] (%)            |         | yes | yes | 1st |     |     |
| energy_accumulator (2^-16 J)   | 1.0: u32| yes | yes | yes | yes | yes |
| throttle_status (ASIC bits)    | yes     | yes | yes | 1st |     |     |
| indep_throttle_status          | 1.3     |     |     |     |     |     |
| *_residency_acc (5 throttlers) |         |     |     | yes | yes | yes |
| pcie_link_width / _speed       | 1.1+    | yes | yes | yes | yes | yes |
| xgmi_link_width / _speed (Gbps)|         | yes | yes | yes | yes | yes |
| xgmi_read/write_data_acc[8] KB |         | yes | yes | yes | yes | yes |
| xgmi_link_status[8]            |         |     |     |     | yes | yes |
| current_gfxclk (MHz)           | u16     | [8] | [8] | [8] | [8] | [8] |
| current_uclk (MHz)             | yes     | yes | yes | yes | yes | yes |

("1st": only the first, reverted form of v1.6.) APU layouts (v2.x, v3.0) are unchanged
by this table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

NUM_XGMI_LINKS = 8
MAX_GFX_CLKS = 8
MAX_CLKS = 4
NUM_VCN = 4
NUM_JPEG_ENG = 32
NUM_JPEG_ENG_V1 = 40
MAX_XCC = 8
NUM_XCP = 8


@dataclass(frozen=True)
class Nested:
    """An array of a struct inside a layout (``struct amdgpu_xcp_metrics xcp_stats[8]``)."""

    layout: list[tuple[str, str | Nested]]
    count: int


Layout = list[tuple[str, "str | Nested"]]


_HEADER: Layout = [("structure_size", "H"), ("format_revision", "B"), ("content_revision", "B")]
_V1_TEMPS: Layout = [
    ("temperature_edge", "H"), ("temperature_hotspot", "H"), ("temperature_mem", "H"),
    ("temperature_vrgfx", "H"), ("temperature_vrsoc", "H"), ("temperature_vrmem", "H"),
    ("average_gfx_activity", "H"), ("average_umc_activity", "H"), ("average_mm_activity", "H"),
    ("average_socket_power", "H"),
]  # fmt: skip
_V1_CLOCKS: Layout = [
    ("average_gfxclk_frequency", "H"), ("average_socclk_frequency", "H"),
    ("average_uclk_frequency", "H"), ("average_vclk0_frequency", "H"),
    ("average_dclk0_frequency", "H"), ("average_vclk1_frequency", "H"),
    ("average_dclk1_frequency", "H"), ("current_gfxclk", "H"), ("current_socclk", "H"),
    ("current_uclk", "H"), ("current_vclk0", "H"), ("current_dclk0", "H"),
    ("current_vclk1", "H"), ("current_dclk1", "H"), ("throttle_status", "I"),
    ("current_fan_speed", "H"),
]  # fmt: skip
_V1_1: Layout = [
    *_HEADER, *_V1_TEMPS, ("energy_accumulator", "Q"), ("system_clock_counter", "Q"),
    *_V1_CLOCKS, ("pcie_link_width", "H"), ("pcie_link_speed", "H"), ("padding", "H"),
    ("gfx_activity_acc", "I"), ("mem_activity_acc", "I"), ("temperature_hbm", "4H"),
]  # fmt: skip
_V1_2: Layout = [*_V1_1, ("firmware_timestamp", "Q")]
_V1_3: Layout = [
    *_V1_2, ("voltage_soc", "H"), ("voltage_gfx", "H"), ("voltage_mem", "H"),
    ("padding1", "H"), ("indep_throttle_status", "Q"),
]  # fmt: skip
_V1_0: Layout = [
    *_HEADER, ("system_clock_counter", "Q"), *_V1_TEMPS, ("energy_accumulator", "I"),
    *_V1_CLOCKS, ("pcie_link_width", "B"), ("pcie_link_speed", "B"),
]  # fmt: skip

_V2_TEMPS: Layout = [
    ("temperature_gfx", "H"), ("temperature_soc", "H"), ("temperature_core", "8H"),
    ("temperature_l3", "2H"),
]  # fmt: skip
_V2_POWER_CLOCKS: Layout = [
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
_V2_0: Layout = [
    *_HEADER, ("system_clock_counter", "Q"), *_V2_TEMPS, ("average_gfx_activity", "H"),
    ("average_mm_activity", "H"), *_V2_POWER_CLOCKS, ("padding", "H"),
]  # fmt: skip
_V2_1: Layout = [
    *_HEADER, *_V2_TEMPS, ("average_gfx_activity", "H"), ("average_mm_activity", "H"),
    ("system_clock_counter", "Q"), *_V2_POWER_CLOCKS, ("padding", "3H"),
]  # fmt: skip
_V2_2: Layout = [*_V2_1, ("indep_throttle_status", "Q")]
_V2_3: Layout = [
    *_V2_2, ("average_temperature_gfx", "H"), ("average_temperature_soc", "H"),
    ("average_temperature_core", "8H"), ("average_temperature_l3", "2H"),
]  # fmt: skip
_V2_4: Layout = [
    *_V2_3, ("average_cpu_voltage", "H"), ("average_soc_voltage", "H"),
    ("average_gfx_voltage", "H"), ("average_cpu_current", "H"),
    ("average_soc_current", "H"), ("average_gfx_current", "H"),
]  # fmt: skip
_V3_0: Layout = [
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


# MI300 (smu_v13_0_6) and later. The first fields are common to v1.4 .. v1.8.
_V1_4_HEAD: Layout = [
    *_HEADER, ("temperature_hotspot", "H"), ("temperature_mem", "H"),
    ("temperature_vrsoc", "H"), ("curr_socket_power", "H"),
    ("average_gfx_activity", "H"), ("average_umc_activity", "H"),
]  # fmt: skip
_PCIE_XGMI: Layout = [
    ("pcie_link_width", "H"), ("pcie_link_speed", "H"),
    ("xgmi_link_width", "H"), ("xgmi_link_speed", "H"),
    ("gfx_activity_acc", "I"), ("mem_activity_acc", "I"),
    ("pcie_bandwidth_acc", "Q"), ("pcie_bandwidth_inst", "Q"),
    ("pcie_l0_to_recov_count_acc", "Q"), ("pcie_replay_count_acc", "Q"),
    ("pcie_replay_rover_count_acc", "Q"),
]  # fmt: skip
_PCIE_NAK: Layout = [("pcie_nak_sent_count_acc", "I"), ("pcie_nak_rcvd_count_acc", "I")]
_XGMI_ACC: Layout = [
    ("xgmi_read_data_acc", f"{NUM_XGMI_LINKS}Q"), ("xgmi_write_data_acc", f"{NUM_XGMI_LINKS}Q"),
]  # fmt: skip
_CURRENT_CLOCKS: Layout = [
    ("current_gfxclk", f"{MAX_GFX_CLKS}H"), ("current_socclk", f"{MAX_CLKS}H"),
    ("current_vclk0", f"{MAX_CLKS}H"), ("current_dclk0", f"{MAX_CLKS}H"), ("current_uclk", "H"),
]  # fmt: skip
_RESIDENCIES: Layout = [
    ("accumulation_counter", "I"), ("prochot_residency_acc", "I"), ("ppt_residency_acc", "I"),
    ("socket_thm_residency_acc", "I"), ("vr_thm_residency_acc", "I"),
    ("hbm_thm_residency_acc", "I"),
]  # fmt: skip
_XCP_V1_0: Layout = [
    ("gfx_busy_inst", f"{MAX_XCC}I"), ("jpeg_busy", f"{NUM_JPEG_ENG}H"),
    ("vcn_busy", f"{NUM_VCN}H"), ("gfx_busy_acc", f"{MAX_XCC}Q"),
]  # fmt: skip
_XCP_V1_1: Layout = [*_XCP_V1_0, ("gfx_below_host_limit_acc", f"{MAX_XCC}Q")]
_XCP_V1_2: Layout = [
    ("gfx_busy_inst", f"{MAX_XCC}I"), ("jpeg_busy", f"{NUM_JPEG_ENG_V1}H"),
    ("vcn_busy", f"{NUM_VCN}H"), ("gfx_busy_acc", f"{MAX_XCC}Q"),
    ("gfx_below_host_limit_ppt_acc", f"{MAX_XCC}Q"),
    ("gfx_below_host_limit_thm_acc", f"{MAX_XCC}Q"),
    ("gfx_low_utilization_acc", f"{MAX_XCC}Q"),
    ("gfx_below_host_limit_total_acc", f"{MAX_XCC}Q"),
]  # fmt: skip

V1_4: Layout = [
    *_V1_4_HEAD, ("vcn_activity", f"{NUM_VCN}H"), ("energy_accumulator", "Q"),
    ("system_clock_counter", "Q"), ("throttle_status", "I"), ("gfxclk_lock_status", "I"),
    *_PCIE_XGMI, *_XGMI_ACC, ("firmware_timestamp", "Q"), *_CURRENT_CLOCKS, ("padding", "H"),
]  # fmt: skip
V1_5: Layout = [
    *_V1_4_HEAD, ("vcn_activity", f"{NUM_VCN}H"), ("jpeg_activity", f"{NUM_JPEG_ENG}H"),
    ("energy_accumulator", "Q"), ("system_clock_counter", "Q"), ("throttle_status", "I"),
    ("gfxclk_lock_status", "I"), *_PCIE_XGMI, *_PCIE_NAK, *_XGMI_ACC,
    ("firmware_timestamp", "Q"), *_CURRENT_CLOCKS, ("padding", "H"),
]  # fmt: skip
V1_6_FIRST: Layout = [
    *_V1_4_HEAD, ("vcn_activity", f"{NUM_VCN}H"), ("jpeg_activity", f"{NUM_JPEG_ENG}H"),
    ("energy_accumulator", "Q"), ("system_clock_counter", "Q"), *_RESIDENCIES,
    ("throttle_status", "I"), ("gfxclk_lock_status", "I"), *_PCIE_XGMI, *_PCIE_NAK,
    *_XGMI_ACC, ("firmware_timestamp", "Q"), *_CURRENT_CLOCKS, ("padding", "H"),
]  # fmt: skip
V1_6: Layout = [
    *_V1_4_HEAD, ("energy_accumulator", "Q"), ("system_clock_counter", "Q"), *_RESIDENCIES,
    ("gfxclk_lock_status", "I"), *_PCIE_XGMI, *_PCIE_NAK, *_XGMI_ACC,
    ("firmware_timestamp", "Q"), *_CURRENT_CLOCKS, ("num_partition", "H"),
    ("xcp_stats", Nested(_XCP_V1_0, NUM_XCP)), ("pcie_lc_perf_other_end_recovery", "I"),
]  # fmt: skip


def _v1_7(xcp: Layout) -> Layout:
    return [
        *_V1_4_HEAD, ("mem_max_bandwidth", "Q"), ("energy_accumulator", "Q"),
        ("system_clock_counter", "Q"), *_RESIDENCIES, ("gfxclk_lock_status", "I"),
        *_PCIE_XGMI, *_PCIE_NAK, *_XGMI_ACC, ("xgmi_link_status", f"{NUM_XGMI_LINKS}H"),
        ("padding", "H"), ("firmware_timestamp", "Q"), *_CURRENT_CLOCKS,
        ("num_partition", "H"), ("xcp_stats", Nested(xcp, NUM_XCP)),
        ("pcie_lc_perf_other_end_recovery", "I"),
    ]  # fmt: skip


V1_7: Layout = _v1_7(_XCP_V1_1)
V1_8: Layout = _v1_7(_XCP_V1_2)  # the same table with the wider per-partition block

# (format, content) -> the layouts that revision has had; the first whose size matches
# structure_size is used (v1.6 changed shape once), else the first.
LAYOUTS: Mapping[tuple[int, int], tuple[Layout, ...]] = MappingProxyType(
    {
        (1, 0): (_V1_0,), (1, 1): (_V1_1,), (1, 2): (_V1_2,), (1, 3): (_V1_3,),
        (1, 4): (V1_4,), (1, 5): (V1_5,), (1, 6): (V1_6, V1_6_FIRST), (1, 7): (V1_7,),
        (1, 8): (V1_8,),
        (2, 0): (_V2_0,), (2, 1): (_V2_1,), (2, 2): (_V2_2,), (2, 3): (_V2_3,),
        (2, 4): (_V2_4,), (3, 0): (_V3_0,),
    }
)  # fmt: skip

