"""The Intel backend against the i915/xe fixture machines (tests/fixtures/intel-*).

Expected values are worked out by hand from the fixture files (see build_intel.py):
56000 millidegrees -> 56.0 °C, 2850 MHz -> 2.85e9 Hz, 11031745544 µJ -> 11031.745544 J.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample
from exporter.sources.base import BackendUnavailable
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.energy import power_from_energy
from exporter.sources.intel.backend import IntelBackend
from exporter.sources.kernel.i915_xe import gt_clock_label, map_throttle_reasons

FIXTURES = Path(__file__).parent / "fixtures"
B580_DEV = "devices/pci0000:00/0000:00:01.1/0000:07:00.0/0000:08:01.0/0000:09:00.0"
B580_HWMON = f"{B580_DEV}/hwmon/hwmon2"
B580_GT0 = f"{B580_DEV}/tile0/gt0/freq0"
NO_THROTTLE = {
    "sw_power_cap": False,
    "hw_slowdown": False,
    "sw_thermal": False,
    "hw_thermal": False,
}


class Clock:
    """Monotonic time the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def backend(sys_root: Path, clock: Clock | None = None) -> IntelBackend:
    config = Config(sysfs=str(sys_root))
    discovery = DrmDiscovery(SysFS(sys_root), hotplug=False)
    return IntelBackend(config, discovery, clock=clock or Clock())


def sample_one(sys_root: Path, slow: bool = True) -> tuple[DeviceSample, dict[str, int]]:
    b = backend(sys_root)
    b.open()
    cycle = b.sample(slow=slow)
    assert len(cycle.devices) == 1
    return cycle.devices[0], dict(cycle.errors)


@pytest.fixture
def b580(tmp_path: Path) -> Iterator[Path]:
    """A mutable copy of the B580 machine, symlinks kept as symlinks."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "intel-xe-b580" / "sys", root, symlinks=True)
    yield root


# --- each fixture machine ----------------------------------------------------------


def test_i915_cometlake_igpu() -> None:
    dev, errors = sample_one(FIXTURES / "intel-i915-cometlake" / "sys")
    assert errors == {}
    assert dev.up and dev.source == "sysfs"
    info = dev.info
    assert (info.vendor, info.driver, info.pci_bus_id) == ("intel", "i915", "0000:00:02.0")
    assert info.uuid == "pci-0000:00:02.0"
    assert (info.name, info.architecture, info.device_node) == (
        "Intel UHD Graphics",
        "Gen9.5",
        "card0",
    )
    assert dev.clocks_hertz == {"graphics": 300e6}  # gt_act_freq_mhz 300
    assert dev.clocks_max_hertz == {"graphics": 1150e6}  # gt_RP0_freq_mhz 1150
    # An iGPU has no hwmon, no PCIe link ("Unknown", width 0), no device memory.
    assert dev.temperatures_celsius == {} and dev.fan_speed_ratio == {}
    assert dev.energy_joules is None and dev.power_watts is None
    assert dev.power_limit_watts is None and dev.memory_total_bytes is None
    assert dev.pcie_link_generation is None and dev.pcie_link_width is None
    assert dev.throttle_reasons == {}


def test_xe_tigerlake_igpu() -> None:
    dev, errors = sample_one(FIXTURES / "intel-xe-tigerlake" / "sys")
    assert errors == {}
    assert (dev.info.driver, dev.info.name) == ("xe", "Intel Iris Xe Graphics")
    assert dev.clocks_hertz == {"graphics": 0.0}  # act_freq 0: GT asleep in RC6
    assert dev.clocks_max_hertz == {"graphics": 1300e6}  # rp0_freq
    assert dev.throttle_reasons == NO_THROTTLE
    assert dev.energy_joules is None and dev.temperatures_celsius == {}


def test_xe_a380_dgpu() -> None:
    dev, errors = sample_one(FIXTURES / "intel-xe-a380" / "sys")
    assert errors == {}
    assert (dev.info.pci_bus_id, dev.info.name, dev.info.architecture) == (
        "0000:08:00.0",
        "Intel Arc A380",
        "Xe-HPG",
    )
    assert dev.clocks_hertz == {"graphics": 0.0}
    assert dev.clocks_max_hertz == {"graphics": 2450e6}
    assert dev.temperatures_celsius == {"package": 56.0, "vram": 54.0}
    assert dev.energy_joules == pytest.approx(59540.970520)  # only "pkg" energy here
    assert dev.power_watts is None  # first sample: no delta yet
    assert dev.power_limit_watts == pytest.approx(55.0)  # power2_max (pkg PL1)
    assert dev.fan_speed_ratio == {}  # fan1_input 945 RPM but no fan1_max
    assert dev.temperature_thresholds_celsius == {}
    assert (dev.pcie_link_generation, dev.pcie_link_width) == (1, 1)  # 2.5 GT/s x1
    assert dev.throttle_reasons == NO_THROTTLE


def test_xe_b580_dgpu() -> None:
    dev, errors = sample_one(FIXTURES / "intel-xe-b580" / "sys")
    assert errors == {}
    assert (dev.info.device_node, dev.info.name) == ("card1", "Intel Arc B580")
    # gt0 ("gt0-rc") is the render GT, gt1 ("gt1-mc") the media GT.
    assert dev.clocks_hertz == {"graphics": 0.0, "video": 0.0}
    assert dev.clocks_max_hertz == {"graphics": 2850e6, "video": 1500e6}
    assert dev.temperatures_celsius == {"package": 54.0, "vram": 56.0}
    assert dev.temperature_thresholds_celsius == {"critical": 100.0, "shutdown": 125.0}
    assert dev.energy_joules == pytest.approx(11031.745544)  # energy1 "card", not pkg
    assert dev.power_limit_watts == pytest.approx(190.0)  # power1_cap, no power1_max
    assert dev.fan_speed_ratio == pytest.approx(
        {"0": 1116 / 2160, "1": 1235 / 2160, "2": 0.0}
    )
    assert dev.memory_total_bytes is None


def test_mixed_machine_reads_only_the_intel_card() -> None:
    # AMD at 03:00.0 (amdgpu) and NVIDIA at 05:00.0 (nvidia-drm) are other backends'.
    b = backend(FIXTURES / "mixed" / "sys")
    assert [(i.pci_bus_id, i.driver, i.device_node) for i in b.open()] == [
        ("0000:09:00.0", "xe", "card2")
    ]
    cycle = b.sample(slow=True)
    assert dict(cycle.errors) == {}
    assert cycle.devices[0].energy_joules == pytest.approx(11031.745544)


def test_open_without_intel_cards(tmp_path: Path) -> None:
    (tmp_path / "class" / "drm").mkdir(parents=True)
    with pytest.raises(BackendUnavailable, match=f"no i915/xe card under {tmp_path}/class/drm"):
        backend(tmp_path).open()


# --- energy -> power ---------------------------------------------------------------


def test_power_from_energy_delta(b580: Path) -> None:
    clock = Clock()
    b = backend(b580, clock)
    b.open()
    first = b.sample(slow=True).devices[0]
    assert first.power_watts is None and first.field_sources == {}

    # 25 J more in 0.5 s -> 50 W.
    (b580 / B580_HWMON / "energy1_input").write_text(f"{11031745544 + 25_000_000}\n")
    clock.now += 0.5
    second = b.sample(slow=False).devices[0]
    assert second.energy_joules == pytest.approx(11031.745544 + 25.0)
    assert second.power_watts == pytest.approx(50.0)
    assert second.source_of("power_watts") == "sysfs_energy_delta"
    assert second.source_of("energy_joules") == "sysfs"

    # The counter going backwards (driver reload) gives no power, not a negative one.
    (b580 / B580_HWMON / "energy1_input").write_text("1000000\n")
    clock.now += 1.0
    third = b.sample(slow=False).devices[0]
    assert third.energy_joules == pytest.approx(1.0)
    assert third.power_watts is None


def test_energy_stays_on_its_channel(b580: Path) -> None:
    clock = Clock()
    b = backend(b580, clock)
    b.open()
    b.sample(slow=True)
    (b580 / B580_HWMON / "energy1_input").write_text("")  # card counter not readable
    clock.now += 1.0
    dev = b.sample(slow=False).devices[0]
    # No silent switch to the pkg counter (19014 J): that would fake a power spike.
    assert dev.energy_joules is None and dev.power_watts is None
    assert dev.temperatures_celsius == {"package": 54.0, "vram": 56.0}


# --- broken inputs: one value goes, everything else stays --------------------------


def test_nul_padded_and_trailing_spaces(b580: Path) -> None:
    (b580 / B580_HWMON / "temp2_input").write_bytes(b"61000\n" + b"\0" * 4090)
    (b580 / B580_GT0 / "rp0_freq").write_text("2800   \n")
    dev, errors = sample_one(b580)
    assert errors == {}
    assert dev.temperatures_celsius == {"package": 61.0, "vram": 56.0}
    assert dev.clocks_max_hertz == {"graphics": 2800e6, "video": 1500e6}


@pytest.mark.parametrize("content", ["N/A\n", "", "\0\0\0\0"])
def test_not_exposed_values_are_skipped_silently(b580: Path, content: str) -> None:
    (b580 / B580_GT0 / "act_freq").write_text(content)
    (b580 / B580_HWMON / "temp3_input").write_text(content)
    dev, errors = sample_one(b580)
    assert errors == {}
    assert dev.clocks_hertz == {"video": 0.0}
    assert dev.temperatures_celsius == {"package": 54.0}
    assert dev.energy_joules == pytest.approx(11031.745544)
    assert dev.clocks_max_hertz == {"graphics": 2850e6, "video": 1500e6}


def test_unreadable_files_are_counted(b580: Path) -> None:
    # A read that fails with an OS error (the kernel's EAGAIN/ENODATA, EACCES, ...):
    # a directory where the attribute should be fails the same way (EISDIR).
    for rel in (f"{B580_HWMON}/temp3_input", f"{B580_GT0}/act_freq", f"{B580_HWMON}/fan2_max"):
        (b580 / rel).unlink()
        (b580 / rel).mkdir()
    dev, errors = sample_one(b580)
    assert errors == {"read": 3}
    assert dev.temperatures_celsius == {"package": 54.0}
    assert dev.clocks_hertz == {"video": 0.0}
    assert dev.fan_speed_ratio == pytest.approx({"0": 1116 / 2160, "2": 0.0})
    assert dev.power_limit_watts == pytest.approx(190.0)


def test_garbage_is_counted_as_parse_error(b580: Path) -> None:
    (b580 / B580_GT0 / "throttle" / "reason_pl1").write_text("yes\n")
    (b580 / B580_HWMON / "energy1_input").write_text("lots\n")
    dev, errors = sample_one(b580)
    assert errors == {"parse": 2}
    assert dev.energy_joules is None
    # pl2 still feeds sw_power_cap; the others are untouched.
    assert dev.throttle_reasons == NO_THROTTLE
    assert dev.temperatures_celsius == {"package": 54.0, "vram": 56.0}


def test_throttle_reason_active(b580: Path) -> None:
    (b580 / B580_GT0 / "throttle" / "reason_prochot").write_text("1\n")
    (b580 / B580_GT0 / "throttle" / "status").write_text("1\n")
    dev, _ = sample_one(b580)
    assert dev.throttle_reasons == {**NO_THROTTLE, "hw_thermal": True}


def test_a_fast_cycle_reads_the_reason_bits_only_when_the_status_says_throttled(
        b580: Path) -> None:
    """``status`` is the OR of the reason bits: 0 on a fast cycle means each is 0 (one
    read, not nine); slow cycles read them all, so garbage in one is still counted."""
    throttle = b580 / B580_GT0 / "throttle"
    (throttle / "reason_pl1").write_text("yes\n")
    b = backend(b580)
    b.open()
    slow = b.sample(slow=True)
    assert slow.errors == {"parse": 1} and slow.devices[0].throttle_reasons == NO_THROTTLE
    fast = b.sample(slow=False)
    assert fast.errors == {} and fast.devices[0].throttle_reasons == NO_THROTTLE
    (throttle / "reason_pl1").write_text("0\n")
    (throttle / "reason_thermal").write_text("1\n")
    (throttle / "status").write_text("1\n")
    fast = b.sample(slow=False)
    assert fast.devices[0].throttle_reasons == {**NO_THROTTLE, "sw_thermal": True}


def test_lost_card_is_down_and_counted(b580: Path) -> None:
    b = backend(b580)
    b.open()
    assert b.sample(slow=True).devices[0].up
    shutil.rmtree(b580 / B580_DEV)  # GPU fell off the bus; discovery has not noticed yet
    cycle = b.sample(slow=False)
    assert [d.up for d in cycle.devices] == [False]
    assert cycle.devices[0].info.pci_bus_id == "0000:09:00.0"
    assert dict(cycle.errors) == {"gpu_lost": 1}


def test_one_broken_card_does_not_stop_the_other(tmp_path: Path) -> None:
    build_intel = _load_builder()
    root = tmp_path / "sys"
    build_intel.build_a380(root)  # card0 at 0000:08:00.0
    build_intel.build_b580(  # card1 at 0000:0b:00.0, behind its own switch
        root,
        pci_path=["pci0000:00", "0000:00:03.1", "0000:09:00.0", "0000:0a:01.0", "0000:0b:00.0"],
    )
    b = backend(root)
    assert [i.pci_bus_id for i in b.open()] == ["0000:08:00.0", "0000:0b:00.0"]
    shutil.rmtree(root / "devices" / "pci0000:00" / "0000:00:01.0")  # A380 gone
    cycle = b.sample(slow=True)
    a380, b580 = cycle.devices
    assert (a380.up, b580.up) == (False, True)
    assert b580.temperatures_celsius == {"package": 54.0, "vram": 56.0}
    assert dict(cycle.errors) == {"gpu_lost": 1}


def _load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_intel", FIXTURES / "build_intel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- layouts the captures do not show, from the kernel sources ----------------------


def test_i915_per_gt_rps_files(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "intel-i915-cometlake" / "sys", root, symlinks=True)
    gt0 = root / "class" / "drm" / "card0" / "gt" / "gt0"
    gt0.mkdir(parents=True)
    (gt0 / "rps_act_freq_mhz").write_text("350\n")
    (gt0 / "rps_RP0_freq_mhz").write_text("1200\n")
    (gt0 / "throttle_reason_status").write_text("1\n")
    (gt0 / "throttle_reason_pl1").write_text("1\n")
    (gt0 / "throttle_reason_thermal").write_text("0\n")
    dev, errors = sample_one(root)
    assert errors == {}
    assert dev.clocks_hertz == {"graphics": 350e6}  # per-GT file wins over gt_act_freq_mhz
    assert dev.clocks_max_hertz == {"graphics": 1200e6}
    assert dev.throttle_reasons == {"sw_power_cap": True, "sw_thermal": False}


def test_xe_vram_size_and_host_link_through_arc_switch(b580: Path) -> None:
    (b580 / B580_DEV / "tile0" / "physical_vram_size_bytes").write_text("12884901888\n")
    # The card's own switch: downstream port 08:01.0 and upstream port 07:00.0.
    for port in ("0000:07:00.0", "0000:08:01.0"):
        d = b580 / B580_DEV.split(port)[0] / port
        (d / "vendor").write_text("0x8086\n")
        (d / "class").write_text("0x060400\n")
    upstream = b580 / B580_DEV.split("0000:07:00.0")[0] / "0000:07:00.0"
    (upstream / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (upstream / "current_link_width").write_text("8\n")
    (upstream / "max_link_speed").write_text("16.0 GT/s PCIe\n")
    (upstream / "max_link_width").write_text("8\n")
    dev, _ = sample_one(b580)
    assert dev.memory_total_bytes == 12884901888
    assert (dev.pcie_link_generation, dev.pcie_link_width) == (4, 8)
    assert (dev.pcie_link_max_generation, dev.pcie_link_max_width) == (4, 8)


# --- pure parsers --------------------------------------------------------------------


def test_parsers() -> None:
    assert gt_clock_label("gt0-rc", "gt0") == "graphics"
    assert gt_clock_label("gt1-mc", "gt1") == "video"
    assert gt_clock_label(None, "gt0") == "graphics" and gt_clock_label(None, "gt1") is None
    assert map_throttle_reasons({"pl1": 0, "pl2": 1, "psys_pl1": 1}) == {"sw_power_cap": True}
    assert power_from_energy(None, (10.0, 1.0)) is None
    assert power_from_energy((10.0, 1.0), (40.0, 3.0)) == 15.0
    assert power_from_energy((10.0, 1.0), (20.0, 1.0)) is None
