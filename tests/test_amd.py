"""The amdgpu sysfs backend against the five AMD fixture machines, broken inputs, hotplug.

Expected numbers are the raw file contents converted by hand (56000 m°C -> 56.0 °C,
32000000 µW -> 32.0 W, "2: 1750Mhz *" -> 1.75e9 Hz).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.base import BackendUnavailable
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.kernel.amdgpu import dpm_current_hz, dpm_max_hz, parse_pp_dpm, parse_ras_count

FIXTURES = Path(__file__).parent / "fixtures"


def backend(root: Path) -> AmdBackend:
    return AmdBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False))


def one(machine: str | Path) -> tuple[DeviceSample, dict[str, int]]:
    root = machine if isinstance(machine, Path) else FIXTURES / machine / "sys"
    b = backend(root)
    b.open()
    cycle = b.sample(slow=True)
    (dev,) = cycle.devices
    return dev, dict(cycle.errors)


@pytest.fixture
def rx7800xt(tmp_path: Path) -> tuple[Path, Path]:
    """A mutable copy of the RDNA3 machine: (sysfs root, PCI function dir)."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt/sys", root, symlinks=True)
    return root, (root / "class/drm/card1/device").resolve()


def test_polaris_rx580() -> None:
    d, errors = one("amd-polaris-rx580")
    assert errors == {}
    assert d.info.vendor == "amd" and d.info.pci_bus_id == "0000:09:00.0"
    assert d.info.uuid == "pci-0000:09:00.0"  # no unique_id on Polaris
    assert d.info.vbios_version == "113-1E3871U-O4C"
    assert d.info.device_node == "card0" and d.source == "sysfs" and d.up
    assert d.utilization_ratio == 0.11  # gpu_busy_percent 11
    assert d.memory_utilization_ratio == 0.02  # mem_busy_percent 2
    assert d.memory_total_bytes == 4294967296
    assert d.memory_used_bytes == 536870912
    assert d.memory_free_bytes == 4294967296 - 536870912
    assert d.shared_memory_total_bytes == 8342712320  # GTT
    assert d.temperatures_celsius == {"edge": 44.0}  # temp1_input 44000
    assert d.power_watts == 41.045  # power1_average 41045000 µW
    assert d.power_limit_watts == 155.0
    assert d.clocks_hertz["memory"] == 1750e6  # hwmon freq2 "mclk"
    assert d.clocks_max_hertz == {"graphics": 1366e6, "memory": 1750e6}
    assert d.fan_speed_ratio == {"0": pytest.approx(35 / 255)}  # pwm1 35
    assert (d.pcie_link_generation, d.pcie_link_width) == (3, 16)  # 8.0 GT/s x16
    assert d.pcie_replay_errors == 3
    assert d.throttle_reasons == {}  # no gpu_metrics before Vega20/Navi
    assert d.energy_joules is None


def test_rdna2_rx6900xt() -> None:
    d, errors = one("amd-rdna2-rx6900xt")
    assert errors == {}
    assert d.info.uuid == "946d7e1ef9b172dd"  # unique_id
    assert d.temperatures_celsius == {"edge": 56.0, "junction": 59.0, "memory": 54.0}
    assert d.temperature_thresholds_celsius == {"critical": 110.0, "shutdown": 115.0}
    assert d.power_watts == 36.0 and d.power_limit_watts == 289.0
    assert d.energy_joules == 17691682 / 65536  # gpu_metrics energy_accumulator
    assert d.clocks_hertz == {"graphics": 500e6, "memory": 1000e6}
    assert d.engine_utilization_ratio == {"gfx": 0.03, "video": 0.0}
    assert d.throttle_reasons["sw_thermal"] is False
    assert d.memory_total_bytes == 17163091968


def test_rdna3_rx7800xt() -> None:
    d, errors = one("amd-rdna3-rx7800xt")
    assert errors == {}
    assert d.utilization_ratio == 0.02
    assert d.temperatures_celsius == {"edge": 24.0, "junction": 31.0, "memory": 48.0}
    assert d.power_watts == 32.0 and d.power_limit_watts == 236.0
    assert d.clocks_hertz == {"graphics": 2011e6, "memory": 456e6}
    # pp_dpm_sclk "0: 500Mhz / 1: 77Mhz * / 2: 2254Mhz": max is the largest row
    assert d.clocks_max_hertz == {"graphics": 2254e6, "memory": 1218e6}
    assert d.fan_speed_ratio == {"0": pytest.approx(89 / 255)}
    assert d.energy_joules is None  # accumulator never filled on RDNA3
    assert (d.pcie_link_generation, d.pcie_link_width) == (4, 16)
    assert d.memory_total_bytes is None  # the capture has no mem_info_*: no series


def test_rdna4_rx9070xt() -> None:
    d, errors = one("amd-rdna4-rx9070xt")
    assert errors == {}
    assert d.temperatures_celsius == {"edge": 42.0, "junction": 45.0, "memory": 68.0}
    assert d.power_watts == 55.0
    # the starred pp_dpm_pcie level (16.0GT/s x16), not the internal switch's 32 GT/s
    assert d.pcie_link_generation == 4
    assert d.throttle_reasons == {}  # no gpu_metrics in this capture


def test_apu_phoenix_memory_is_shared() -> None:
    d, errors = one("amd-apu-phoenix")
    assert errors == {}
    assert d.memory_total_bytes is None and d.memory_used_bytes is None
    assert d.memory_free_bytes is None
    # 4 GiB carve-out + 31433977856 GTT; used 1272893440 + 211398656
    assert d.shared_memory_total_bytes == 4294967296 + 31433977856
    assert d.shared_memory_used_bytes == 1272893440 + 211398656
    assert d.temperatures_celsius == {"edge": 25.0}
    assert d.power_watts == 3.103
    assert d.power_limit_watts is None  # no power1_cap on this APU
    assert d.clocks_hertz == {"graphics": 800e6, "memory": 400e6}
    assert d.engine_utilization_ratio["video"] == 0.0  # vcn_busy_percent
    assert d.fan_speed_ratio == {}


def test_open_without_a_card_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "class/drm").mkdir(parents=True)
    with pytest.raises(BackendUnavailable, match="no amdgpu card"):
        backend(tmp_path).open()


# -- broken inputs: each one drops one value; the rest of the card still comes out ----


def test_nul_padded_file(rx7800xt: tuple[Path, Path]) -> None:
    root, dev = rx7800xt
    (dev / "gpu_busy_percent").write_bytes(b"37\n" + b"\0" * 4093)
    d, errors = one(root)
    assert d.utilization_ratio == 0.37 and errors == {}
    assert d.power_watts == 32.0


def test_trailing_spaces(rx7800xt: tuple[Path, Path]) -> None:
    root, dev = rx7800xt
    (dev / "gpu_busy_percent").write_text("37   \n")
    (dev / "hwmon/hwmon4/temp1_input").write_text("25000   \n")
    d, errors = one(root)
    assert d.utilization_ratio == 0.37 and d.temperatures_celsius["edge"] == 25.0
    assert errors == {}


def test_na_and_empty_files(rx7800xt: tuple[Path, Path]) -> None:
    root, dev = rx7800xt
    (dev / "gpu_busy_percent").write_text("N/A\n")
    (dev / "hwmon/hwmon4/power1_average").write_text("")
    d, errors = one(root)
    # not exposed: no gpu_busy_percent, so the gpu_metrics activity (24 %) fills in,
    # and the power comes from gpu_metrics (32 W) - but nothing is counted as an error
    assert d.utilization_ratio == 0.24
    assert d.power_watts == 32.0
    assert errors == {}
    assert d.temperatures_celsius["junction"] == 31.0


def test_unreadable_files(rx7800xt: tuple[Path, Path]) -> None:
    root, dev = rx7800xt
    (dev / "mem_busy_percent").mkdir()  # EISDIR on read, as an OSError stands in for EIO
    (dev / "hwmon/hwmon4/temp1_input").unlink()
    (dev / "hwmon/hwmon4/temp1_input").symlink_to("missing")  # dangling: ENOENT on open
    (dev / "pp_dpm_mclk").write_text("")
    (dev / "gpu_metrics").unlink()  # else it would fill the edge temperature back in
    d, errors = one(root)
    assert errors == {"read": 2}
    assert "edge" not in d.temperatures_celsius
    assert d.temperatures_celsius["junction"] == 31.0
    assert d.utilization_ratio == 0.02
    assert d.memory_utilization_ratio is None
    assert "memory" not in d.clocks_max_hertz and d.clocks_max_hertz["graphics"] == 2254e6


def test_garbage_values_are_counted(rx7800xt: tuple[Path, Path]) -> None:
    root, dev = rx7800xt
    (dev / "gpu_busy_percent").write_text("sixteen\n")
    (dev / "gpu_metrics").write_bytes(b"\x78\x00\x09\x09" + b"\0" * 116)  # unknown v9.9
    d, errors = one(root)
    assert errors == {"parse": 1, "gpu_metrics": 1}
    assert d.utilization_ratio is None
    assert d.pcie_link_width == 16
    assert d.throttle_reasons == {}
    assert d.power_watts == 32.0


def test_ras_error_counts(rx7800xt: tuple[Path, Path]) -> None:
    root, dev = rx7800xt
    (dev / "ras").mkdir()
    (dev / "ras/umc_err_count").write_text("ue: 1\nce: 4\n")
    (dev / "ras/gfx_err_count").write_text("ue: 0\nce: 2\n")
    (dev / "ras/features").write_text("feature mask: 0x0\n")
    d, _ = one(root)
    assert d.ecc_errors == {"uncorrected": 1, "corrected": 6}


# -- hotplug ------------------------------------------------------------------------


def test_card_added_then_removed(rx7800xt: tuple[Path, Path]) -> None:
    root, _ = rx7800xt
    disc = DrmDiscovery(SysFS(root), hotplug=False)
    b = AmdBackend(Config(sysfs=str(root)), disc)
    assert [i.pci_bus_id for i in b.open()] == ["0000:03:00.0"]

    # A second card appears: copy the rx6900xt PCI function in with its links.
    other = FIXTURES / "amd-rdna2-rx6900xt/sys"
    src = (other / "class/drm/card0/device").resolve()
    dst = root / "devices/pci0000:00/0000:00:03.1/0000:0c:00.0"
    shutil.copytree(src, dst, symlinks=True)
    os.symlink(os.path.relpath(dst / "drm/card0", root / "class/drm"), root / "class/drm/card0")
    assert len(b.sample(False).devices) == 2  # found without an event: cards() polls
    disc.rescan()  # the udev "add" event
    devices = b.sample(False).devices
    assert [(x.info.pci_bus_id, x.up) for x in devices] == [
        ("0000:03:00.0", True),
        ("0000:0c:00.0", True),
    ]
    assert devices[1].info.uuid == "946d7e1ef9b172dd"

    # card1 goes away: reported once as down, then withdrawn.
    (root / "class/drm/card1").unlink()
    shutil.rmtree(root / "devices/pci0000:00/0000:00:01.1/0000:03:00.0")
    disc.rescan()  # the udev "remove" event
    devices = b.sample(False).devices
    assert [(x.info.pci_bus_id, x.up) for x in devices] == [
        ("0000:03:00.0", False),
        ("0000:0c:00.0", True),
    ]
    assert devices[0].utilization_ratio is None
    assert [x.info.pci_bus_id for x in b.sample(False).devices] == ["0000:0c:00.0"]


def test_card_vanishing_before_rescan_does_not_crash(rx7800xt: tuple[Path, Path]) -> None:
    root, dev = rx7800xt
    b = backend(root)
    b.open()
    shutil.rmtree(dev)  # gone from sysfs, no event processed yet
    cycle = b.sample(False)
    (d,) = cycle.devices
    assert d.utilization_ratio is None and d.power_watts is None


# -- pure parsers -------------------------------------------------------------------


def test_parse_pp_dpm_with_deep_sleep_level() -> None:
    levels, bad = parse_pp_dpm("S: 19Mhz *\n0: 615Mhz\n1: 800Mhz\n3: 1000Mhz\n")
    assert [(lvl.level, lvl.hz, lvl.current) for lvl in levels][0] == ("S", 19e6, True)
    assert bad == 0
    assert dpm_current_hz(levels) == 19e6
    assert dpm_max_hz(levels) == 1000e6


def test_parse_pp_dpm_pcie_and_garbage() -> None:
    levels, bad = parse_pp_dpm("0: 2.5GT/s, x1 78Mhz \n1: 16.0GT/s, x16 623Mhz *\nbogus\n")
    assert bad == 0  # "bogus" is not a level line at all
    assert [(lvl.pcie_gts, lvl.pcie_width, lvl.current) for lvl in levels] == [
        (2.5, 1, False),
        (16.0, 16, True),
    ]
    assert parse_pp_dpm(None) == ([], 0) and dpm_max_hz([]) is None and dpm_current_hz([]) is None


def test_parse_pp_dpm_drops_impossible_levels() -> None:
    huge = "9" * 400
    levels, bad = parse_pp_dpm(f"0: 500Mhz\n1: {huge}Mhz *\n2: 2254Mhz\n3: 16.0GT/s, x99 1Mhz\n")
    assert [lvl.hz for lvl in levels] == [500e6, 2254e6]
    assert bad == 2
    assert dpm_current_hz(levels) is None


def test_parse_ras_count() -> None:
    assert parse_ras_count("ue: 0\nce: 3\n") == ({"uncorrected": 0, "corrected": 3}, 0)
    assert parse_ras_count("") == ({}, 0)
    assert parse_ras_count(f"ue: {'9' * 400}\nce: 18446744073709551615\n") == ({}, 2)


@pytest.mark.parametrize("machine", ["amd-rdna3-rx7800xt", "amd-rdna2-rx6900xt",
                                     "amd-apu-phoenix", "amd-mi300x", "amd-mi300x-faulty"])
def test_table_fill_gives_what_the_backend_merge_gives(machine: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """card.fill joins the files' sample with the gpu_metrics table's by exporter.pipeline.merge's
    rule without walking every field: the same sample as merge_device on every fixture."""
    from exporter.pipeline.merge import View, merge_device
    from exporter.sources.amd import card
    from exporter.sources.base import KERNEL

    pairs: list[tuple[DeviceSample, dict[str, Any]]] = []
    real = card.fill

    def spy(files: DeviceSample, table: dict[str, Any]) -> DeviceSample:
        pairs.append((files, table))
        return real(files, table)

    monkeypatch.setattr(card, "fill", spy)
    b = backend(FIXTURES / machine / "sys")
    b.sample(True)
    b.sample(False)
    assert pairs  # every one of these cards has a gpu_metrics table
    view = View(priority=KERNEL, serving=True, devices=())
    for files, table in pairs:
        said = {name: v for name, v in table.items() if v is not None and v != {}}
        assert said  # every one of these tables says something
        as_sample = DeviceSample(info=files.info, source=files.source, **said)
        merged = merge_device([(view, files), (view, as_sample)])
        assert merged is not None
        want = replace(merged, clocks_hertz=dict(sorted(merged.clocks_hertz.items())),
                       engine_utilization_ratio=dict(
                           sorted(merged.engine_utilization_ratio.items())))
        got = real(files, table)
        assert got == want
        assert list(got.clocks_hertz) == list(want.clocks_hertz)
        assert list(got.temperatures_celsius) == list(want.temperatures_celsius)


def test_kfd_properties_give_the_gfx_target_and_pci_address() -> None:
    """The KFD node properties of the Phoenix APU capture (LACT snapshot, node 1) and the
    targets ROCm prints for the versions amdkfd sets (kgd2kfd_probe)."""
    from exporter.sources.kernel.amdgpu import gfx_target, kfd_pci_bus_id, parse_kfd_properties

    text = (FIXTURES / "captures/lact_snapshots/amd/phoenix/kfd/topology/nodes/1/"
            "properties").read_text()
    props = parse_kfd_properties(text)
    assert (props["gfx_target_version"], props["location_id"]) == (110003, 25600)
    assert (gfx_target(110003), kfd_pci_bus_id(props)) == ("gfx1103", "0000:64:00.0")
    assert [gfx_target(v) for v in (90402, 90010, 80003, 100300, 120001, 0, 91600)] == [
        "gfx942", "gfx90a", "gfx803", "gfx1030", "gfx1201", "", ""]
    cpu = parse_kfd_properties((FIXTURES / "captures/lact_snapshots/amd/phoenix/kfd/"
                                "topology/nodes/0/properties").read_text())
    assert gfx_target(cpu["gfx_target_version"]) == ""  # the CPU node
    assert parse_kfd_properties("garbage\nsimd_count -1\nx y z\n") == {}


def _corrupt(root: Path) -> Path:
    """The RX 7800 XT with garbage in files a fast cycle reads: a busy percentage that is
    no number, one over 110 %, a temperature out of range, the u64 "no value"."""
    tree = root / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt" / "sys", tree, symlinks=True)
    dev = tree / "class" / "drm" / "card1" / "device"
    (dev / "gpu_busy_percent").write_text("abc\n")
    (dev / "mem_busy_percent").write_text("250\n")
    (dev / "mem_info_vram_used").write_text("18446744073709551615\n")
    (next((dev / "hwmon").iterdir()) / "temp1_input").write_text("9" * 12 + "\n")
    return tree


@pytest.mark.parametrize("machine", ["amd-rdna3-rx7800xt", "amd-rdna2-rx6900xt",
                                     "amd-apu-phoenix", "amd-mi300x", "amd-mi300x-faulty",
                                     "corrupt"])
def test_fast_plan_gives_what_file_by_file_gives(machine: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast cycle read by the card's plan (every hot file in one loop) gives the same
    samples and counts the same errors as the same cycle read file by file."""
    from exporter.sources.amd import card

    root = _corrupt(tmp_path) if machine == "corrupt" else FIXTURES / machine / "sys"

    def cycles() -> list[tuple[list[DeviceSample], dict[str, int]]]:
        b = backend(root)
        b.open()
        out = []
        for slow in (True, False, False, True, False):
            c = b.sample(slow)
            out.append((c.devices, dict(c.errors)))
        b.close()
        return out

    planned = cycles()
    monkeypatch.setattr(card, "_fast_plan", lambda r: None)
    assert planned == cycles()
    if machine == "corrupt":
        assert planned[1][1] == {"parse": 4}  # each garbage value counted once a cycle


def test_a_card_that_comes_or_goes_is_seen_on_the_next_cycle(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """A cycle with the discovery's generation unchanged does not match its cards again;
    a card that comes or goes is still seen on the next cycle, including one that came
    on another thread just after this cycle took the card list."""
    from tests.drm_tree import add_pci_card, remove_card

    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt/sys", root, symlinks=True)
    b = backend(root)
    b.open()
    b.sample(True)

    def buses(slow: bool = False) -> dict[str, bool]:
        return {d.info.pci_bus_id: d.up for d in b.sample(slow).devices}

    add_pci_card(root, "0000:0c:00.0", "card0")
    assert buses() == {"0000:03:00.0": True, "0000:0c:00.0": True}
    remove_card(root, "card0")
    assert buses() == {"0000:03:00.0": True, "0000:0c:00.0": False}  # down once
    assert buses() == {"0000:03:00.0": True}

    real = b.discovery.listing

    def then_a_card_comes(drivers: list[str] | None = None) -> tuple[list[Any], int]:
        taken = real(drivers)
        add_pci_card(root, "0000:0d:00.0", "card2", render="renderD130")
        b.discovery.rescan()  # the udev thread, between this list and the next cycle
        return taken

    monkeypatch.setattr(b.discovery, "listing", then_a_card_comes)
    assert buses() == {"0000:03:00.0": True}
    monkeypatch.setattr(b.discovery, "listing", real)
    assert buses() == {"0000:03:00.0": True, "0000:0d:00.0": True}
