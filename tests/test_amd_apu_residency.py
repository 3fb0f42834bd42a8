"""The APU's gpu_metrics v3.0 (Strix Point class): its throttler residencies become throttle
reasons and reach the verdict's thermal check.

No v3.0 capture is public (tests/fixtures/captures/SOURCES.md: the Phoenix APU's v2.1 is the
one APU table there), so the table is built from the captured Phoenix one: the v3.0 layout
of the kernel header (checked below against a C compiler, transcribed from
drivers/gpu/drm/amd/include/kgd_pp_interface.h ``struct gpu_metrics_v3_0``), every field
the two tables share by name carried over from the capture, the rest unfilled (all ones),
and the seven ``throttle_residency_*`` counters set and moved by the test. The machine
around it is the captured Phoenix tree (amd-apu-phoenix), copied.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.pipeline.health import DEGRADED, HEALTHY, evaluate
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.kernel import amdgpu_gpu_metrics_layouts as layouts
from exporter.sources.kernel.amdgpu_gpu_metrics import (
    APU_THROTTLERS,
    decode_raw,
    layout_for,
    layout_offsets,
    parse_gpu_metrics,
)

FIXTURES = Path(__file__).parent / "fixtures"
V3_0 = layouts.LAYOUTS[(3, 0)][0]
HEADER_FIELDS = ("structure_size", "format_revision", "content_revision")  # the C header struct
# struct gpu_metrics_v3_0 as the kernel header declares it (torvalds/linux, the revision
# amdgpu_gpu_metrics_layouts cites: kgd_pp_interface.h), field by field.
C_V3_0 = r"""
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
struct metrics_table_header { uint16_t structure_size; uint8_t format_revision;
  uint8_t content_revision; };
struct gpu_metrics_v3_0 { struct metrics_table_header common_header;
  uint16_t temperature_gfx; uint16_t temperature_soc; uint16_t temperature_core[16];
  uint16_t temperature_skin; uint16_t average_gfx_activity; uint16_t average_vcn_activity;
  uint16_t average_ipu_activity[8]; uint16_t average_core_c0_activity[16];
  uint16_t average_dram_reads; uint16_t average_dram_writes; uint16_t average_ipu_reads;
  uint16_t average_ipu_writes; uint64_t system_clock_counter; uint32_t average_socket_power;
  uint16_t average_ipu_power; uint32_t average_apu_power; uint32_t average_gfx_power;
  uint32_t average_dgpu_power; uint32_t average_all_core_power;
  uint16_t average_core_power[16]; uint16_t average_sys_power; uint16_t stapm_power_limit;
  uint16_t current_stapm_power_limit; uint16_t average_gfxclk_frequency;
  uint16_t average_socclk_frequency; uint16_t average_vpeclk_frequency;
  uint16_t average_ipuclk_frequency; uint16_t average_fclk_frequency;
  uint16_t average_vclk_frequency; uint16_t average_uclk_frequency;
  uint16_t average_mpipu_frequency; uint16_t current_coreclk[16];
  uint16_t current_core_maxfreq; uint16_t current_gfx_maxfreq;
  uint32_t throttle_residency_prochot; uint32_t throttle_residency_spl;
  uint32_t throttle_residency_fppt; uint32_t throttle_residency_sppt;
  uint32_t throttle_residency_thm_core; uint32_t throttle_residency_thm_gfx;
  uint32_t throttle_residency_thm_soc; uint32_t time_filter_alphavalue; };
"""


@pytest.mark.slow
def test_the_v3_0_layout_matches_a_c_compiler(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    fields, size, _ = layout_offsets(V3_0)
    prints = "".join(f'printf("{name} %zu\\n", offsetof(struct gpu_metrics_v3_0, {name}));'
                     for name, _, _ in fields if name not in HEADER_FIELDS)
    src = tmp_path / "v3.c"
    src.write_text(C_V3_0 + "int main(void) {" + prints
                   + 'printf("sizeof %zu\\n", sizeof(struct gpu_metrics_v3_0)); return 0; }')
    subprocess.run([cc, "-o", str(tmp_path / "v3"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "v3")], check=True, capture_output=True, text=True)
    got = dict(line.split() for line in out.stdout.splitlines())
    assert {k: int(v) for k, v in got.items()} == {
        **{name: offset for name, offset, _ in fields if name not in HEADER_FIELDS},
        "sizeof": size}


def phoenix_capture() -> bytes:
    (card,) = (FIXTURES / "amd-apu-phoenix" / "sys/class/drm").glob("card[0-9]")
    return (card / "device/gpu_metrics").read_bytes()


def v3_table(residency: dict[str, int]) -> bytes:
    """A v3.0 table: the Phoenix capture's values under the names both tables have, and
    ``residency`` (throttler -> counter) in ``throttle_residency_<throttler>``."""
    _, _, _, captured = decode_raw(phoenix_capture())
    fields, size, _ = layout_offsets(V3_0)
    data = bytearray(b"\xff" * size)
    struct.pack_into("<HBB", data, 0, size, 3, 0)
    for name, offset, code in fields:
        assert isinstance(code, str)
        value = residency.get(name.removeprefix("throttle_residency_"))
        if value is None and name not in HEADER_FIELDS:
            value = captured.get(name)  # type: ignore[assignment]
        if isinstance(value, int) and value < 1 << 8 * struct.calcsize(code[-1]):
            struct.pack_into("<" + code[-1], data, offset, value)
    return bytes(data)


def test_the_built_table_carries_the_capture_and_the_residencies() -> None:
    m = parse_gpu_metrics(v3_table({"thm_gfx": 7, "spl": 3}))
    assert (m.format_revision, m.content_revision) == (3, 0)
    assert layout_for(3, 0, m.structure_size) is V3_0
    captured = parse_gpu_metrics(phoenix_capture())
    assert m.temperatures_celsius == captured.temperatures_celsius == {"gfx": 25.0,
                                                                      "soc": 27.37}
    assert m.socket_power_watts == captured.socket_power_watts == 3.401
    assert m.throttle_residency == {"thm_gfx": 7, "spl": 3}  # the unfilled ones: none
    assert m.throttle_reasons == {}  # a counter says nothing until it is read twice


@pytest.fixture
def apu(tmp_path: Path) -> tuple[AmdBackend, Path]:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-apu-phoenix" / "sys", root, symlinks=True)
    (card,) = (root / "class/drm").glob("card[0-9]")
    dev = (card / "device").resolve()
    backend = AmdBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False))
    backend.open()
    return backend, dev / "gpu_metrics"


def cycle(backend: AmdBackend, table: Path, residency: dict[str, int]) -> tuple[
        dict[str, bool], dict[str, int]]:
    table.write_bytes(v3_table(residency))
    (d,) = backend.sample(slow=True).devices
    verdict = evaluate(d, now=0.0)
    return dict(d.throttle_reasons), dict(verdict.checks)


ALL_ZERO = dict.fromkeys(APU_THROTTLERS, 0)


def test_a_thermal_residency_that_moves_degrades_the_thermal_check(
        apu: tuple[AmdBackend, Path]) -> None:
    backend, table = apu
    reasons, checks = cycle(backend, table, ALL_ZERO)
    assert reasons == {} and "thermal" not in checks  # one reading: nothing to compare
    # Nothing engaged since: every reason the table counts reads 0, and the thermal check
    # is served (healthy) on that evidence.
    reasons, checks = cycle(backend, table, ALL_ZERO)
    assert reasons == {"hw_power_brake": False, "sw_power_cap": False, "sw_thermal": False}
    assert checks["thermal"] == HEALTHY and checks["power"] == HEALTHY
    # The firmware's GFX thermal limit engaged for 40 table updates.
    reasons, checks = cycle(backend, table, {**ALL_ZERO, "thm_gfx": 40})
    assert reasons == {"hw_power_brake": False, "sw_power_cap": False, "sw_thermal": True}
    assert checks["thermal"] == DEGRADED
    # The counter stands still again: the reason clears, so does the check.
    reasons, checks = cycle(backend, table, {**ALL_ZERO, "thm_gfx": 40})
    assert reasons["sw_thermal"] is False and checks["thermal"] == HEALTHY
    # The package power limits are sw_power_cap (the limit doing its job: no finding).
    reasons, checks = cycle(backend, table, {**ALL_ZERO, "thm_gfx": 40, "sppt": 5})
    assert reasons == {"hw_power_brake": False, "sw_power_cap": True, "sw_thermal": False}
    assert checks["thermal"] == HEALTHY and checks["power"] == HEALTHY
    # PROCHOT, the signal from outside the GPU, degrades the power check.
    reasons, checks = cycle(backend, table, {**ALL_ZERO, "thm_gfx": 40, "sppt": 5,
                                             "prochot": 1})
    assert reasons["hw_power_brake"] is True and checks["power"] == DEGRADED
    backend.close()


def test_a_counter_that_goes_back_is_no_reading(apu: tuple[AmdBackend, Path]) -> None:
    backend, table = apu
    cycle(backend, table, {**ALL_ZERO, "thm_soc": 900})
    reasons, _ = cycle(backend, table, {**ALL_ZERO, "thm_soc": 3})  # firmware reset
    assert "sw_thermal" not in reasons or reasons["sw_thermal"] is False
    reasons, _ = cycle(backend, table, {**ALL_ZERO, "thm_soc": 4})
    assert reasons["sw_thermal"] is True
    backend.close()


def test_the_captured_v2_1_table_has_no_throttle_reason(apu: tuple[AmdBackend, Path]) -> None:
    """The Phoenix table itself (v2.1) reports no throttler in any form the driver defines
    independently of the ASIC: no reason, no thermal check from it (docs/vendors-amd.md)."""
    backend, table = apu
    for _ in range(2):
        (d,) = backend.sample(slow=True).devices
    assert dict(d.throttle_reasons) == {}
    backend.close()


def test_the_page_and_top_say_why(tmp_path: Path) -> None:
    from exporter.client.top.panels import panel
    from exporter.pipeline.hub import Hub
    from exporter.serve import landing
    from exporter.serve.history import History
    from exporter.serve.tables import current

    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-apu-phoenix" / "sys", root, symlinks=True)
    (card,) = (root / "class/drm").glob("card[0-9]")
    table = (card / "device").resolve() / "gpu_metrics"
    config = Config(sysfs=str(root))
    backend = AmdBackend(config, DrmDiscovery(SysFS(root), hotplug=False))
    hub = Hub(config, [backend])
    for residency in (ALL_ZERO, {**ALL_ZERO, "thm_soc": 12}):
        table.write_bytes(v3_table(residency))
        snapshot = hub.collect_once()
    page = landing.page(snapshot, History(900.0, 1.0), "/metrics")
    assert "thermal: clocks held back: sw_thermal" in page
    (dev,), _ = current(snapshot)
    shown = "\n".join(line.plain for line in panel(dev, [], False, 120))
    assert "thermal: clocks held back: sw_thermal" in shown
    backend.close()
