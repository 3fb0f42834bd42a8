"""gpu_metrics v1.4 - v1.8 (MI300 and later): layouts checked against C, blobs decoded.

Two independent checks of the layouts in ``amd_gpu_metrics_layouts``:

1. The C declarations below are transcribed by hand from the kernel header (the same
   sources the module cites). ``cc`` compiles them and prints ``offsetof`` of every
   field the Python layout names, and ``sizeof``; both must equal what
   ``layout_offsets`` computes, and the field order must match the C order.
2. A few offsets of v1.8 were computed by hand from the header (natural alignment).

Then blobs built from those offsets are decoded and the values checked.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from exporter.sources.kernel import amdgpu_gpu_metrics_layouts as layouts
from exporter.sources.kernel.amdgpu_gpu_metrics import layout_offsets, parse_gpu_metrics
from exporter.sources.kernel.amdgpu_gpu_metrics_layouts import Nested

C_DECLS = r"""
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
struct metrics_table_header { uint16_t structure_size; uint8_t format_revision;
  uint8_t content_revision; };
struct amdgpu_xcp_metrics { uint32_t gfx_busy_inst[8]; uint16_t jpeg_busy[32];
  uint16_t vcn_busy[4]; uint64_t gfx_busy_acc[8]; };
struct amdgpu_xcp_metrics_v1_1 { uint32_t gfx_busy_inst[8]; uint16_t jpeg_busy[32];
  uint16_t vcn_busy[4]; uint64_t gfx_busy_acc[8]; uint64_t gfx_below_host_limit_acc[8]; };
struct amdgpu_xcp_metrics_v1_2 { uint32_t gfx_busy_inst[8]; uint16_t jpeg_busy[40];
  uint16_t vcn_busy[4]; uint64_t gfx_busy_acc[8]; uint64_t gfx_below_host_limit_ppt_acc[8];
  uint64_t gfx_below_host_limit_thm_acc[8]; uint64_t gfx_low_utilization_acc[8];
  uint64_t gfx_below_host_limit_total_acc[8]; };
#define HEAD struct metrics_table_header common_header; uint16_t temperature_hotspot; \
  uint16_t temperature_mem; uint16_t temperature_vrsoc; uint16_t curr_socket_power; \
  uint16_t average_gfx_activity; uint16_t average_umc_activity;
#define LINKS uint16_t pcie_link_width; uint16_t pcie_link_speed; uint16_t xgmi_link_width; \
  uint16_t xgmi_link_speed; uint32_t gfx_activity_acc; uint32_t mem_activity_acc; \
  uint64_t pcie_bandwidth_acc; uint64_t pcie_bandwidth_inst; \
  uint64_t pcie_l0_to_recov_count_acc; uint64_t pcie_replay_count_acc; \
  uint64_t pcie_replay_rover_count_acc;
#define NAK uint32_t pcie_nak_sent_count_acc; uint32_t pcie_nak_rcvd_count_acc;
#define XGMI uint64_t xgmi_read_data_acc[8]; uint64_t xgmi_write_data_acc[8];
#define CLOCKS uint16_t current_gfxclk[8]; uint16_t current_socclk[4]; \
  uint16_t current_vclk0[4]; uint16_t current_dclk0[4]; uint16_t current_uclk;
#define RESID uint32_t accumulation_counter; uint32_t prochot_residency_acc; \
  uint32_t ppt_residency_acc; uint32_t socket_thm_residency_acc; \
  uint32_t vr_thm_residency_acc; uint32_t hbm_thm_residency_acc;
struct V1_4 { HEAD uint16_t vcn_activity[4]; uint64_t energy_accumulator;
  uint64_t system_clock_counter; uint32_t throttle_status; uint32_t gfxclk_lock_status;
  LINKS XGMI uint64_t firmware_timestamp; CLOCKS uint16_t padding; };
struct V1_5 { HEAD uint16_t vcn_activity[4]; uint16_t jpeg_activity[32];
  uint64_t energy_accumulator; uint64_t system_clock_counter; uint32_t throttle_status;
  uint32_t gfxclk_lock_status; LINKS NAK XGMI uint64_t firmware_timestamp; CLOCKS
  uint16_t padding; };
struct V1_6_FIRST { HEAD uint16_t vcn_activity[4]; uint16_t jpeg_activity[32];
  uint64_t energy_accumulator; uint64_t system_clock_counter; RESID
  uint32_t throttle_status; uint32_t gfxclk_lock_status; LINKS NAK XGMI
  uint64_t firmware_timestamp; CLOCKS uint16_t padding; };
struct V1_6 { HEAD uint64_t energy_accumulator; uint64_t system_clock_counter; RESID
  uint32_t gfxclk_lock_status; LINKS NAK XGMI uint64_t firmware_timestamp; CLOCKS
  uint16_t num_partition; struct amdgpu_xcp_metrics xcp_stats[8];
  uint32_t pcie_lc_perf_other_end_recovery; };
struct V1_7 { HEAD uint64_t mem_max_bandwidth; uint64_t energy_accumulator;
  uint64_t system_clock_counter; RESID uint32_t gfxclk_lock_status; LINKS NAK XGMI
  uint16_t xgmi_link_status[8]; uint16_t padding; uint64_t firmware_timestamp; CLOCKS
  uint16_t num_partition; struct amdgpu_xcp_metrics_v1_1 xcp_stats[8];
  uint32_t pcie_lc_perf_other_end_recovery; };
struct V1_8 { HEAD uint64_t mem_max_bandwidth; uint64_t energy_accumulator;
  uint64_t system_clock_counter; RESID uint32_t gfxclk_lock_status; LINKS NAK XGMI
  uint16_t xgmi_link_status[8]; uint16_t padding; uint64_t firmware_timestamp; CLOCKS
  uint16_t num_partition; struct amdgpu_xcp_metrics_v1_2 xcp_stats[8];
  uint32_t pcie_lc_perf_other_end_recovery; };
"""
MI300_LAYOUTS = ("V1_4", "V1_5", "V1_6_FIRST", "V1_6", "V1_7", "V1_8")


def flat_names(layout: layouts.Layout) -> list[str]:
    """The layout's field names with the header struct spelled as C spells it."""
    names = [n for n, _ in layout]
    assert names[:3] == ["structure_size", "format_revision", "content_revision"]
    return ["common_header", *names[3:]]


def c_field_order(struct_name: str) -> list[str]:
    """Field names of one C struct above, in declaration order (macros expanded by hand)."""
    macros = dict(re.findall(r"#define (\w+) (.*?)(?<!\\)\n", C_DECLS.replace("\\\n", " ")))
    body = re.search(rf"struct {struct_name} \{{(.*?)\}};", C_DECLS, re.S)
    assert body is not None
    text = body.group(1)
    for _ in range(2):
        for name, value in macros.items():
            text = re.sub(rf"\b{name}\b", value, text)
    return re.findall(r"(\w+)(?:\[\d+\])?;", text)


@pytest.mark.parametrize("name", MI300_LAYOUTS)
def test_field_order_matches_the_header(name: str) -> None:
    assert flat_names(getattr(layouts, name)) == c_field_order(name)


@pytest.mark.slow
def test_offsets_and_sizes_match_a_c_compiler(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    prints = []
    for name in MI300_LAYOUTS:
        prints.append(f'printf("{name} sizeof %zu\\n", sizeof(struct {name}));')
        for field, _ in getattr(layouts, name)[3:]:
            prints.append(f'printf("{name} {field} %zu\\n", offsetof(struct {name}, {field}));')
    src = tmp_path / "layouts.c"
    src.write_text(C_DECLS + "int main(void) {\n" + "\n".join(prints) + "\nreturn 0; }\n")
    subprocess.run([cc, "-o", str(tmp_path / "layouts"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "layouts")], check=True, capture_output=True, text=True)
    from_c = {tuple(line.split()[:2]): int(line.split()[2]) for line in out.stdout.splitlines()}
    for name in MI300_LAYOUTS:
        fields, size, _ = layout_offsets(getattr(layouts, name))
        assert size == from_c[(name, "sizeof")], name
        for field, offset, _ in fields[3:]:
            assert offset == from_c[(name, field)], (name, field)


def test_v1_8_offsets_computed_by_hand() -> None:
    offsets = {f: o for f, o, _ in layout_offsets(layouts.V1_8)[0]}
    # header 4 + six u16 -> 16; mem_max_bandwidth u64 at 16, energy 24, clock counter 32,
    # six u32 (accumulation + 5 residencies) 40..64, gfxclk_lock 64, four u16 68..76,
    # two u32 76..84, pad to 88 for five u64 88..128, two u32 128..136, XGMI 2 x 8 x u64
    # 136..264, link status 8 x u16 264..280, padding 280, pad to 288 for the timestamp.
    assert offsets["mem_max_bandwidth"] == 16
    assert offsets["energy_accumulator"] == 24
    assert offsets["hbm_thm_residency_acc"] == 60
    assert offsets["pcie_bandwidth_acc"] == 88
    assert offsets["xgmi_read_data_acc"] == 136
    assert offsets["xgmi_write_data_acc"] == 200
    assert offsets["xgmi_link_status"] == 264
    assert offsets["firmware_timestamp"] == 288
    assert offsets["current_uclk"] == 336
    assert offsets["xcp_stats"] == 344  # 340 rounded up to the u64 alignment of the block


def build(layout: layouts.Layout, fmt: int, content: int, values: dict[str, object]) -> bytes:
    """A table as the kernel writes it: all ones (not filled) except ``values``."""
    fields, size, _ = layout_offsets(layout)
    data = bytearray(b"\xff" * size)
    struct.pack_into("<HBB", data, 0, size, fmt, content)
    for name, offset, code in fields:
        if name in values and not isinstance(code, Nested):
            v = values[name]
            count = int(code[:-1] or 1)
            items = list(v) if isinstance(v, (list, tuple)) else [v]
            items += [(1 << 8 * struct.calcsize(code[-1])) - 1] * (count - len(items))
            struct.pack_into(f"<{count}{code[-1]}", data, offset, *items)
    return bytes(data)


# Values from real MI300X readings: 40 °C / 142 W (amd-smi, ROCm/amdsmi issue 132), the
# rest plausible for that card (HBM 42 °C, 2100 MHz max gfx clock, uclk 1300 MHz).
MI300X = {
    "temperature_hotspot": 40, "temperature_mem": 42, "temperature_vrsoc": 35,
    "curr_socket_power": 142, "average_gfx_activity": 3, "average_umc_activity": 1,
    "energy_accumulator": 65536 * 1000, "system_clock_counter": 5_000_000_000,
    "pcie_link_width": 16, "pcie_link_speed": 320, "xgmi_link_width": 16,
    "xgmi_link_speed": 32, "xgmi_read_data_acc": [1000, 2000], "xgmi_write_data_acc": [3000],
    "current_gfxclk": [132, 133], "current_uclk": 1300, "ppt_residency_acc": 7,
    "xgmi_link_status": [1, 0], "vcn_activity": [10, 30],
}  # fmt: skip


@pytest.mark.parametrize(("name", "content"), [("V1_4", 4), ("V1_5", 5), ("V1_6_FIRST", 6),
                                                ("V1_6", 6), ("V1_7", 7), ("V1_8", 8)])
def test_decode_mi300_tables(name: str, content: int) -> None:
    m = parse_gpu_metrics(build(getattr(layouts, name), 1, content, MI300X))
    assert (m.format_revision, m.content_revision) == (1, content)
    assert m.temperatures_celsius == {"junction": 40.0, "memory": 42.0, "vrsoc": 35.0}
    assert m.socket_power_watts == 142.0
    assert m.gfx_activity_ratio == 0.03 and m.memory_activity_ratio == 0.01
    assert m.energy_joules == 1000.0
    assert m.clocks_hertz == {"graphics": 132e6, "memory": 1300e6}
    assert (m.pcie_link_width, m.pcie_link_speed_gts) == (16, 32.0)
    assert m.xgmi_read_bytes == {"0": 1_000_000.0, "1": 2_000_000.0}
    assert m.xgmi_write_bytes == {"0": 3_000_000.0}
    assert m.system_clock_ns == 5_000_000_000
    assert m.dropped == 0
    has_vcn = name in ("V1_4", "V1_5", "V1_6_FIRST")
    assert m.video_activity_ratio == (0.2 if has_vcn else None)
    assert m.xgmi_link_up == ({"0": True, "1": False} if content >= 7 else {})
    assert m.throttle_residency == ({"ppt": 7} if name not in ("V1_4", "V1_5") else {})


def test_v1_4_throttle_bits_are_mi300s() -> None:
    # THROTTLER_PPT_BIT (1) and THROTTLER_THERMAL_HBM_BIT (4) of smu13_driver_if_v13_0_6.h
    m = parse_gpu_metrics(build(layouts.V1_4, 1, 4, {"throttle_status": 1 << 1 | 1 << 4}))
    assert m.throttle_reasons == {"hw_power_brake": False, "sw_power_cap": True,
                                  "sw_thermal": True, "hw_thermal": False}


def test_impossible_values_are_dropped_and_counted() -> None:
    m = parse_gpu_metrics(build(layouts.V1_8, 1, 8, {**MI300X, "temperature_hotspot": 60000,
                                                     "average_gfx_activity": 5000}))
    assert "junction" not in m.temperatures_celsius and m.gfx_activity_ratio is None
    assert m.dropped == 2


def test_size_picks_the_v1_6_form() -> None:
    first = build(layouts.V1_6_FIRST, 1, 6, {"vcn_activity": [50]})
    assert parse_gpu_metrics(first).video_activity_ratio == 0.5
    final = build(layouts.V1_6, 1, 6, {"energy_accumulator": 65536})
    assert parse_gpu_metrics(final).energy_joules == 1.0
