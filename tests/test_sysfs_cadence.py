"""Cadence of the amdgpu and i915/xe sysfs backends: a fast cycle reads only the files
whose values a user wants at every interval; limits, maxima, memory sizes, the PCIe
link now and the error counters are read on the slow tier (and the first cycle) and
served from the last slow read in between. Real backends over mutable copies of the
fixture trees; the expected values are the fixture files' contents converted by hand."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.intel.backend import IntelBackend

FIXTURES = Path(__file__).parent / "fixtures"


def machine(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """(sysfs root, the card's PCI function dir) of a mutable copy of a fixture machine."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / name / "sys", root, symlinks=True)
    card = next(n for n in sorted(os.listdir(root / "class/drm")) if n[4:].isdigit())
    return root, (root / "class/drm" / card / "device").resolve()


def files_read(monkeypatch: pytest.MonkeyPatch, cycle: Callable[[], Any]) -> set[str]:
    """Base names of the files ``cycle()`` opens or preads."""
    seen: set[str] = set()
    real_open, real_pread = os.open, os.pread

    def opened(path: Any, *args: Any, **kw: Any) -> int:
        seen.add(os.path.basename(os.fsdecode(path)))
        return real_open(path, *args, **kw)

    def pread(fd: int, size: int, offset: int) -> bytes:
        seen.add(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real_pread(fd, size, offset)

    with monkeypatch.context() as m:
        m.setattr(os, "open", opened)
        m.setattr(os, "pread", pread)
        cycle()
    return seen


def amd(root: Path) -> AmdBackend:
    b = AmdBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False))
    b.open()
    return b


def intel(root: Path) -> IntelBackend:
    b = IntelBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False))
    b.open()
    return b


AMD_SLOW = {"pcie_replay_count", "mem_info_vram_total", "mem_info_gtt_total", "pwm1_max",
            "pp_dpm_pcie", "power1_cap", "temp2_crit"}


def test_amd_fast_cycle_reads_no_slow_file(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = machine(tmp_path, "amd-rdna2-rx6900xt")
    b = amd(root)
    assert AMD_SLOW & files_read(monkeypatch, lambda: b.sample(False))  # the first reads all
    fast = files_read(monkeypatch, lambda: b.sample(False))
    assert {"gpu_busy_percent", "mem_info_vram_used", "power1_average", "pwm1"} <= fast
    assert fast.isdisjoint(AMD_SLOW)
    assert AMD_SLOW & files_read(monkeypatch, lambda: b.sample(True)) >= {
        "pcie_replay_count", "mem_info_vram_total", "pwm1_max", "pp_dpm_pcie"}


def test_amd_slow_values_are_served_between_slow_cycles(tmp_path: Path) -> None:
    root, dev = machine(tmp_path, "amd-rdna2-rx6900xt")
    b = amd(root)
    first = b.sample(False).devices[0]
    assert (first.memory_total_bytes, first.pcie_replay_errors) == (17163091968, 0)
    assert (first.pcie_link_generation, first.pcie_link_width) == (4, 16)  # 16.0GT/s x16 *
    (dev / "pcie_replay_count").write_text("7\n")
    (dev / "pp_dpm_pcie").write_text("0: 2.5GT/s, x1 310Mhz *\n1: 16.0GT/s, x16 619Mhz \n")
    (dev / "mem_info_vram_used").write_text("1000000000\n")
    fast = b.sample(False).devices[0]
    assert fast.memory_used_bytes == 1000000000  # the fast tier moved on
    assert (fast.pcie_replay_errors, fast.pcie_link_generation) == (0, 4)  # the last slow read
    slow = b.sample(True).devices[0]
    assert (slow.pcie_replay_errors, slow.pcie_link_generation, slow.pcie_link_width) == (
        7, 1, 1)
    assert b.sample(False).devices[0].pcie_replay_errors == 7


INTEL_SLOW = {"rp0_freq", "fan1_max", "fan2_max", "fan3_max", "current_link_speed",
              "current_link_width", "max_link_speed", "max_link_width"}


def test_intel_fast_cycle_reads_no_slow_file(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = machine(tmp_path, "intel-xe-b580")
    b = intel(root)
    assert INTEL_SLOW & files_read(monkeypatch, lambda: b.sample(False))
    fast = files_read(monkeypatch, lambda: b.sample(False))
    assert {"act_freq", "fan1_input", "energy1_input"} <= fast
    assert fast.isdisjoint(INTEL_SLOW)
    assert {"rp0_freq", "fan1_max", "current_link_width"} <= files_read(
        monkeypatch, lambda: b.sample(True))


def test_intel_slow_values_are_served_between_slow_cycles(tmp_path: Path) -> None:
    root, dev = machine(tmp_path, "intel-xe-b580")
    b = intel(root)
    hwmon = next((dev / "hwmon").iterdir())
    first = b.sample(False).devices[0]
    assert first.clocks_max_hertz["graphics"] == 2850e6  # rp0_freq 2850 MHz
    assert first.fan_speed_ratio["0"] == pytest.approx(1116 / 2160)  # fan1_input / fan1_max
    assert first.pcie_link_width == 1
    (dev / "tile0/gt0/freq0/rp0_freq").write_text("2000\n")
    (hwmon / "fan1_max").write_text("4320\n")
    (hwmon / "fan1_input").write_text("2160\n")
    fast = b.sample(False).devices[0]
    assert fast.fan_speed_ratio["0"] == pytest.approx(1.0)  # 2160 / the last fan1_max read
    assert fast.clocks_max_hertz["graphics"] == 2850e6
    slow = b.sample(True).devices[0]
    assert slow.fan_speed_ratio["0"] == pytest.approx(0.5)
    assert slow.clocks_max_hertz["graphics"] == 2000e6


def test_intel_reads_only_the_temperature_channels_it_reports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The B580's xe hwmon lists 16 temperature channels; pkg and vram are the sensors.
    root, dev = machine(tmp_path, "intel-xe-b580")
    hwmon = next((dev / "hwmon").iterdir())
    labels = {f.name.removesuffix("_label"): f.read_text().strip()
              for f in hwmon.glob("temp*_label")}
    assert len(labels) == 16
    wanted = {f"{ch}_input": label for ch, label in labels.items() if label in ("pkg", "vram")}
    b = intel(root)
    b.sample(False)
    for name, data in (("pkg", "61000\n"), ("vram", "58000\n")):  # fresh readings
        ch = next(c for c, label in wanted.items() if label == name)
        (hwmon / ch).write_text(data)
    dev_sample: list[Any] = []
    read = files_read(monkeypatch, lambda: dev_sample.append(b.sample(False).devices[0]))
    assert {f for f in read if f.startswith("temp") and f.endswith("_input")} == set(wanted)
    assert dev_sample[0].temperatures_celsius == {"package": 61.0, "vram": 58.0}
