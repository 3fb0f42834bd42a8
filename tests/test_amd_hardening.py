"""The amdgpu sysfs backend under file-system faults: a blocking attribute, a failing
``class/drm`` listing, a device directory that goes while its link stays.

Each test runs the real backend over a mutable copy of the RX 7800 XT fixture tree;
values are the fixture's file contents converted by hand (32000000 µW -> 32.0 W).
"""

from __future__ import annotations

import os
import resource
import shutil
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.base import Cycle
from exporter.sources.discovery import DrmDiscovery

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def rx7800xt(tmp_path: Path) -> tuple[Path, Path]:
    """A mutable copy of the RDNA3 machine: (sysfs root, PCI function dir)."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt/sys", root, symlinks=True)
    return root, (root / "class/drm/card1/device").resolve()


def opened(root: Path) -> tuple[AmdBackend, DrmDiscovery]:
    disc = DrmDiscovery(SysFS(root), hotplug=False)
    b = AmdBackend(Config(sysfs=str(root)), disc)
    b.open()
    return b, disc


def sample_within(b: AmdBackend, fifo: Path, seconds: float = 5.0) -> Cycle:
    """``b.sample()`` in a thread; fails the test if it blocks (then unblocks it)."""
    out: list[Cycle] = []
    t = threading.Thread(target=lambda: out.append(b.sample(False)), daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        # A blocking open() of a FIFO returns once a writer appears: be that writer.
        os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
        t.join(seconds)
        pytest.fail("sample() blocked on a FIFO attribute")
    return out[0]


def test_a_fifo_attribute_does_not_wedge_the_backend_and_it_recovers(
    rx7800xt: tuple[Path, Path],
) -> None:
    root, dev = rx7800xt
    (dev / "gpu_busy_percent").unlink()
    os.mkfifo(dev / "gpu_busy_percent")
    b, _ = opened(root)

    cycle = sample_within(b, dev / "gpu_busy_percent")
    (d,) = cycle.devices
    assert d.up and d.power_watts == 32.0  # the other attributes still read
    assert cycle.errors == {"read": 1}
    assert sample_within(b, dev / "gpu_busy_percent").errors == {"read": 1}  # still a FIFO

    # The normal file is back: the same backend reads it, no restart.
    (dev / "gpu_busy_percent").unlink()
    (dev / "gpu_busy_percent").write_text("37\n")
    cycle = b.sample(False)
    assert cycle.devices[0].utilization_ratio == 0.37
    assert cycle.errors == {}


def test_a_device_directory_gone_under_its_link_is_lost_until_it_is_back(
    rx7800xt: tuple[Path, Path],
) -> None:
    root, dev = rx7800xt
    b, _ = opened(root)
    assert b.sample(False).devices[0].power_watts == 32.0
    parked = root / "parked"
    dev.rename(parked)  # unbound: class/drm/card1 still links to where it was
    assert os.path.lexists(root / "class/drm/card1")

    cycle = b.sample(False)
    (d,) = cycle.devices
    assert (d.info.pci_bus_id, d.up, d.power_watts) == ("0000:03:00.0", False, None)
    assert cycle.errors == {"gpu_lost": 1}
    assert b.sample(False).devices[0].up is False  # stays lost, not dropped

    parked.rename(dev)  # bound again
    cycle = b.sample(False)
    (d,) = cycle.devices
    assert d.up and d.power_watts == 32.0 and d.utilization_ratio == 0.02
    assert cycle.errors == {}


def fill_descriptors() -> list[int]:
    """Every descriptor the (lowered) soft limit allows: the next open gets EMFILE."""
    fds: list[int] = []
    try:
        while True:
            fds.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        return fds


def test_a_failing_drm_listing_keeps_the_cards_and_is_counted(
    rx7800xt: tuple[Path, Path],
) -> None:
    root, _ = rx7800xt
    b, disc = opened(root)
    b.sample(False)  # the attributes' descriptors are open from here on
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    fds = fill_descriptors()
    try:
        with capture_logs() as logs:
            cycle = b.sample(False)  # listing class/drm fails with EMFILE
            again = b.sample(False)
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    (d,) = cycle.devices
    assert (d.info.pci_bus_id, d.up, d.power_watts) == ("0000:03:00.0", True, 32.0)
    assert cycle.errors == again.errors == {"drm_listing": 1}
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "drm card listing failed; keeping the last known cards"]  # once, not per cycle
    assert "Too many open files" in (disc.listing_error or "")  # until the next listing

    cycle = b.sample(False)  # listing works again
    assert cycle.errors == {} and disc.listing_error is None
    assert [x.up for x in cycle.devices] == [True]


def test_limits_are_read_on_the_slow_tier_and_kept_between(rx7800xt: tuple[Path, Path]) -> None:
    root, dev = rx7800xt
    b, _ = opened(root)
    first = b.sample(False).devices[0]  # the first cycle reads the slow tier too
    assert (first.power_limit_watts, first.temperature_thresholds_celsius["critical"]) == (
        236.0, 110.0)  # power1_cap 236000000 µW; temp2_crit (junction) 110000 m°C
    (dev / "hwmon/hwmon4/power1_cap").write_text("200000000\n")  # the operator lowers it
    (dev / "hwmon/hwmon4/power1_average").write_text("40000000\n")
    fast = b.sample(False).devices[0]
    assert (fast.power_watts, fast.power_limit_watts) == (40.0, 236.0)
    assert b.sample(True).devices[0].power_limit_watts == 200.0


def test_a_card_found_before_its_files_are_complete_gets_them_on_the_slow_tier(
    rx7800xt: tuple[Path, Path],
) -> None:
    """A card seen while its driver is still creating its files (a rebind, a reset, a
    hot-plug) has no name and no memory size at first; the slow tier reads them again
    until they are there, instead of keeping an empty name for good."""
    root, dev = rx7800xt
    device = (dev / "device").read_text()
    (dev / "device").unlink()
    b, _ = opened(root)
    (d,) = b.sample(True).devices
    assert (d.info.name, d.memory_total_bytes) == ("", None)

    (dev / "device").write_text(device)  # the driver finishes
    (dev / "mem_info_vram_total").write_text("17163091968\n")
    (d,) = b.sample(False).devices
    assert d.info.name == ""  # static information waits for the slow tier
    with capture_logs() as logs:
        (d,) = b.sample(True).devices
    # The capture has no revision (no amdgpu.ids match) and no pci.ids: the synthetic name.
    assert d.info.name == f"AMD {device.strip()}" == "AMD 0x747e"
    assert d.memory_total_bytes == 17163091968
    (line,) = [e for e in logs if e["event"] == "amdgpu card static information read again"]
    assert line["found"] == ["mem_info_vram_total", "name"]


def test_a_card_back_after_it_was_lost_is_read_afresh_at_once(
    rx7800xt: tuple[Path, Path],
) -> None:
    root, dev = rx7800xt
    b, _ = opened(root)
    (d,) = b.sample(True).devices
    assert d.memory_total_bytes is None  # this capture has no mem_info_vram_total
    parked = root / "parked"
    dev.rename(parked)  # a reset: gone, then back with its files
    assert b.sample(False).devices[0].up is False
    (parked / "mem_info_vram_total").write_text("17163091968\n")
    parked.rename(dev)
    (d,) = b.sample(False).devices  # a fast cycle: the first one back reads everything
    assert d.up and d.memory_total_bytes == 17163091968


def test_static_information_its_driver_never_writes_is_looked_for_a_bounded_time(
    rx7800xt: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The capture has no mem_info_vram_total: the slow tier looks for it STATIC_RETRIES
    times (the card's layout listed afresh each time), says once that it stops, and looks
    again when the card is found again after it was lost."""
    from exporter.sources.amd import backend as amd_backend

    root, dev = rx7800xt
    b, _ = opened(root)
    (st,) = b._cards.values()
    assert "mem_info_vram_total" in st.missing
    relists = []
    monkeypatch.setattr(st.reader, "relist", lambda: relists.append(1))
    with capture_logs() as logs:
        for _ in range(amd_backend.STATIC_RETRIES + 4):
            b.sample(True)
            b.sample(False)
    assert len(relists) == amd_backend.STATIC_RETRIES
    (line,) = [e for e in logs if e["event"].startswith("amdgpu card static information still")]
    assert "mem_info_vram_total" in line["missing"]

    parked = root / "parked"
    dev.rename(parked)
    b.sample(False)
    parked.rename(dev)
    b.sample(False)  # back: read afresh at once
    assert len(relists) == amd_backend.STATIC_RETRIES + 1
    b.sample(True)
    assert len(relists) == amd_backend.STATIC_RETRIES + 2  # and looked for again
