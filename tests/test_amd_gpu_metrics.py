"""The gpu_metrics decoder, checked against real captures and hand-built tables.

Expected values for the captures come from outside the decoder: the rx6900xt table
was decoded independently of this decoder, with the kernel's gpu_metrics_v1_3 layout,
and agrees with that card's hwmon files; the rx7800xt and phoenix values are the hwmon
readings captured with them.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from exporter.sources.kernel.amdgpu_gpu_metrics import (
    GpuMetricsError,
    decode_raw,
    parse_gpu_metrics,
)

FIXTURES = Path(__file__).parent / "fixtures"


def blob(machine: str) -> bytes:
    (card,) = (FIXTURES / machine / "sys/class/drm").glob("card[0-9]")
    return (card / "device/gpu_metrics").read_bytes()


def test_v1_3_rx6900xt() -> None:
    m = parse_gpu_metrics(blob("amd-rdna2-rx6900xt"))
    assert (m.format_revision, m.content_revision, m.structure_size) == (1, 3, 120)
    assert m.temperatures_celsius["edge"] == 56.0
    assert m.temperatures_celsius["junction"] == 59.0
    assert m.temperatures_celsius["memory"] == 54.0
    assert m.gfx_activity_ratio == 0.03
    assert m.memory_activity_ratio == 0.0
    assert m.socket_power_watts == 36.0
    assert m.energy_joules == 17691682 / 65536
    assert m.clocks_hertz == {"graphics": 500e6, "memory": 1000e6, "soc": 800e6}
    assert m.pcie_link_width == 16 and m.pcie_link_speed_gts == 16.0
    assert m.indep_throttle_status == 0
    assert m.raw["voltage_gfx"] == 775
    # 0xFFFF / 0xFFFFFFFF fields are "not supported", not numbers
    assert m.raw["average_socclk_frequency"] is None
    assert m.raw["gfx_activity_acc"] is None
    assert m.raw["temperature_hbm"] == (None, None, None, None)
    assert m.raw["firmware_timestamp"] is None
    assert m.throttle_reasons == {
        "sw_power_cap": False,
        "hw_slowdown": False,
        "sw_thermal": False,
        "hw_thermal": False,
        "hw_power_brake": False,
    }


def test_v1_3_rx7800xt_matches_hwmon() -> None:
    m = parse_gpu_metrics(blob("amd-rdna3-rx7800xt"))
    # hwmon: temp1/2/3 24000/31000/48000, power1_average 32000000, freq1 2011 MHz, freq2 456
    assert m.temperatures_celsius["edge"] == 24.0
    assert m.temperatures_celsius["junction"] == 31.0
    assert m.temperatures_celsius["memory"] == 48.0
    assert m.socket_power_watts == 32.0
    assert m.clocks_hertz["graphics"] == 2011e6
    assert m.clocks_hertz["memory"] == 456e6
    assert m.fan_rpm == 868.0  # fan1_input
    assert m.energy_joules is None  # RDNA3 leaves the accumulator at 0


def test_v2_1_phoenix_apu_units() -> None:
    m = parse_gpu_metrics(blob("amd-apu-phoenix"))
    assert (m.format_revision, m.content_revision) == (2, 1)
    # centi-degrees: 2500 -> 25.0 (hwmon temp1_input 25000), 2737 -> 27.37
    assert m.temperatures_celsius == {"gfx": 25.0, "soc": 27.37}
    assert m.socket_power_watts == 3.401  # 3401 mW
    assert m.gfx_activity_ratio == 0.79
    assert m.memory_activity_ratio is None  # no UMC activity in APU tables
    assert m.clocks_hertz == {}  # current clocks are 0xFFFF on this APU
    assert m.raw["average_gfxclk_frequency"] == 800  # hwmon freq1_input 800 MHz
    assert m.indep_throttle_status is None  # v2.1 has none
    assert m.throttle_reasons == {}
    assert m.fan_rpm is None


def test_v3_0_hand_built() -> None:
    data = bytearray(b"\xff" * 264)
    struct.pack_into("<HBB", data, 0, 264, 3, 0)
    struct.pack_into("<H", data, 4, 4550)  # temperature_gfx, centi-°C
    struct.pack_into("<H", data, 42, 37)  # average_gfx_activity, %
    struct.pack_into("<H", data, 44, 5)  # average_vcn_activity, %
    struct.pack_into("<I", data, 112, 15000)  # average_socket_power (u32), mW
    m = parse_gpu_metrics(bytes(data))
    assert m.temperatures_celsius == {"gfx": 45.5}
    assert m.gfx_activity_ratio == 0.37
    assert m.video_activity_ratio == 0.05
    assert m.socket_power_watts == 15.0
    assert m.energy_joules is None
    assert m.raw["time_filter_alphavalue"] is None


def test_v1_0_unaligned_layout() -> None:
    data = bytearray(b"\xff" * 80)
    struct.pack_into("<HBB", data, 0, 80, 1, 0)
    struct.pack_into("<Q", data, 8, 123)  # system_clock_counter after 4 bytes of padding
    struct.pack_into("<H", data, 16, 61)  # temperature_edge
    struct.pack_into("<I", data, 36, 65536)  # energy_accumulator (u32 in v1.0)
    struct.pack_into("<BB", data, 74, 8, 80)  # pcie width x8, 8.0 GT/s
    m = parse_gpu_metrics(bytes(data))
    assert m.raw["system_clock_counter"] == 123
    assert m.temperatures_celsius == {"edge": 61.0}
    assert m.energy_joules == 1.0
    assert (m.pcie_link_width, m.pcie_link_speed_gts) == (8, 8.0)


def test_throttle_groups() -> None:
    data = bytearray(blob("amd-rdna3-rx7800xt"))
    struct.pack_into("<Q", data, 112, 1 << 0 | 1 << 36)  # PPT0 and TEMP_HOTSPOT
    reasons = parse_gpu_metrics(bytes(data)).throttle_reasons
    assert reasons["sw_power_cap"] and reasons["sw_thermal"]
    assert not reasons["hw_slowdown"] and not reasons["hw_thermal"]


def test_padded_and_truncated_reads() -> None:
    good = blob("amd-rdna3-rx7800xt")
    # a page-sized read (as the rx6900xt capture was): structure_size bounds it
    assert parse_gpu_metrics(good + b"\0" * 3976).socket_power_watts == 32.0
    # a short read: the fields that fit still decode
    part = decode_raw(good[:30])[3]
    assert part["temperature_edge"] == 24
    assert "energy_accumulator" not in part


@pytest.mark.parametrize("data", [b"", b"\x78\x00", b"\x78\x00\x09\x01" + b"\0" * 116])
def test_rejects_unknown(data: bytes) -> None:
    with pytest.raises(GpuMetricsError):
        parse_gpu_metrics(data)


@pytest.mark.parametrize("blob", sorted(FIXTURES.glob("*/sys/devices/**/gpu_metrics")),
                         ids=lambda p: p.parts[len(FIXTURES.parts)])
def test_one_unpack_of_the_whole_table_gives_each_field_at_its_offset(blob: Path) -> None:
    """decode_raw unpacks a whole table at once: each field equals an unpack of that
    field alone at its offset (all-ones -> None), for every fixture's table."""
    from exporter.sources.kernel.amdgpu_gpu_metrics import layout_for, layout_offsets

    data = blob.read_bytes()
    fmt_rev, content_rev, size, raw = decode_raw(data)
    layout = layout_for(fmt_rev, content_rev, size)
    assert layout is not None
    checked = 0
    for name, offset, code in layout_offsets(layout)[0]:
        if not isinstance(code, str):
            continue  # per-partition blocks are not decoded
        count = int(code[:-1] or 1)
        values = struct.unpack_from(f"<{count}{code[-1]}", data, offset)
        unset = (1 << (8 * struct.calcsize(code[-1]))) - 1
        cleaned = tuple(None if v == unset else v for v in values)
        assert raw[name] == (cleaned if count > 1 else cleaned[0]), name
        checked += 1
    assert checked == len(raw) > 10
