"""DRM card enumeration and rediscovery against real-layout sysfs trees."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from exporter.core.fs import SysFS
from exporter.sources.discovery import DrmDiscovery, enumerate_cards, parse_uevent
from tests.drm_tree import add_pci_card, remove_card

FIXTURES = Path(__file__).parent / "fixtures"


def test_fixture_card_identity() -> None:
    sysfs = SysFS(FIXTURES / "amd-rdna3-rx7800xt/sys")
    (card,) = enumerate_cards(sysfs)  # card1-DP-1 and renderD128 are not cards
    assert card.card == "card1"
    assert card.pci_bus_id == "0000:03:00.0"
    assert card.vendor_id == 0x1002
    assert card.device_id == 0x747E  # PCI_ID=1002:747E in the capture
    assert card.driver == "amdgpu"
    assert card.render_node == "renderD128"
    assert card.device_dir == sysfs.path("class/drm/card1/device")
    assert (card.device_dir / "gpu_busy_percent").is_file()


def test_every_amd_fixture_is_found() -> None:
    machines = sorted(p.parent.name for p in FIXTURES.glob("amd-*/sys"))
    assert len(machines) >= 5
    for machine in machines:
        cards = enumerate_cards(SysFS(FIXTURES / machine / "sys"))
        assert [c.driver for c in cards] == ["amdgpu"], machine


def test_card10_and_sorting_by_bus_id(tmp_path: Path) -> None:
    add_pci_card(tmp_path, "0000:0a:00.0", "card10", render="renderD130")
    add_pci_card(tmp_path, "0000:03:00.0", "card2", driver="i915", vendor="0x8086")
    add_pci_card(tmp_path, "0000:05:00.0", "card9", render=None)
    cards = enumerate_cards(SysFS(tmp_path))
    assert [c.card for c in cards] == ["card2", "card9", "card10"]
    assert cards[1].render_node is None
    assert cards[2].render_node == "renderD130"
    disc = DrmDiscovery(SysFS(tmp_path), hotplug=False)
    assert [c.card for c in disc.cards(["amdgpu"])] == ["card9", "card10"]
    assert [c.vendor_id for c in disc.cards(["i915", "xe"])] == [0x8086]


def test_device_id_from_uevent_when_attribute_missing(tmp_path: Path) -> None:
    add_pci_card(tmp_path, "0000:03:00.0", "card0", device=None)
    (card,) = enumerate_cards(SysFS(tmp_path))
    assert card.device_id == 0x73BF


def test_non_pci_and_deviceless_entries_are_skipped(tmp_path: Path) -> None:
    platform = tmp_path / "devices/platform/simple-framebuffer.0/drm/card0"
    platform.mkdir(parents=True)
    (platform / "device").symlink_to("../..")
    (tmp_path / "class/drm").mkdir(parents=True)
    (tmp_path / "class/drm/card0").symlink_to(os.path.relpath(platform, tmp_path / "class/drm"))
    (tmp_path / "class/drm/card3").mkdir()  # no device link at all
    (tmp_path / "class/drm/version").write_text("drm 1.1.0 20060810\n")
    assert enumerate_cards(SysFS(tmp_path)) == []
    assert enumerate_cards(SysFS(tmp_path / "nothing")) == []


def test_cards_are_current_without_udev(tmp_path: Path) -> None:
    # Item 8 of issue 8: under a --path.sysfs other than /sys no uevent ever arrives.
    # Before this, cards() kept its first list until rescan() (udev) and a removed
    # card stayed "up"; now every call notices a card that came or went.
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt/sys", root, symlinks=True)
    disc = DrmDiscovery(SysFS(root), hotplug=False)
    assert [c.card for c in disc.cards()] == ["card1"]
    gen = disc.generation

    add_pci_card(root, "0000:0c:00.0", "card0")  # hotplugged: no event, no rescan()
    assert [c.pci_bus_id for c in disc.cards()] == ["0000:03:00.0", "0000:0c:00.0"]
    assert disc.generation == gen + 1
    assert [c.card for c in disc.cards(["amdgpu"])] == ["card1", "card0"]
    assert disc.generation == gen + 1  # nothing changed since: same generation

    remove_card(root, "card1")  # PCI remove / unbind: its class/drm links go
    assert [c.card for c in disc.cards()] == ["card0"]
    assert disc.generation == gen + 2


def test_unchanged_cards_are_not_read_again(tmp_path: Path) -> None:
    # The per-call check only looks at class/drm's names and links: a card's attribute
    # files are read at enumeration, not on every call (that is what keeps it cheap).
    dev = add_pci_card(tmp_path, "0000:0c:00.0", "card0")
    disc = DrmDiscovery(SysFS(tmp_path), hotplug=False)
    assert [c.device_id for c in disc.cards()] == [0x73BF]
    (dev / "device").write_text("0x7480\n")
    assert [c.device_id for c in disc.cards()] == [0x73BF]
    disc.rescan()  # a udev "change" event still re-reads everything
    assert [c.device_id for c in disc.cards()] == [0x7480]


def test_rescan_bumps_generation_only_on_change(tmp_path: Path) -> None:
    disc = DrmDiscovery(SysFS(tmp_path), hotplug=False)
    assert disc.cards() == []
    gen = disc.generation
    disc.rescan()
    assert disc.generation == gen
    add_pci_card(tmp_path, "0000:0c:00.0", "card0")
    disc.rescan()  # what the udev "add" event triggers
    assert disc.generation == gen + 1
    assert [c.card for c in disc.cards()] == ["card0"]
    assert disc.generation == gen + 1


def test_start_stop_are_noops_without_hotplug() -> None:
    disc = DrmDiscovery(SysFS(FIXTURES / "amd-apu-phoenix/sys"), hotplug=False)
    disc.start()
    disc.start()
    disc.stop()
    disc.stop()
    assert [c.card for c in disc.cards()] == ["card1"]


def test_parse_uevent() -> None:
    text = "DRIVER=amdgpu\nPCI_ID=1002:747E\nPCI_SLOT_NAME=0000:03:00.0\nbad line\n"
    assert parse_uevent(text) == {
        "DRIVER": "amdgpu",
        "PCI_ID": "1002:747E",
        "PCI_SLOT_NAME": "0000:03:00.0",
    }
    assert parse_uevent(None) == {}


def test_card_less_backends_look_again_on_a_back_off_capped_shorter_without_udev(
        tmp_path: Path) -> None:
    """In a container nothing announces a new card: the back-off stops growing at
    HOTPLUG_POLL. Where a udev monitor runs, an added card wakes the backends, so the
    back-off can grow to UDEV_POLL; never more often than the collection interval."""
    from exporter.sources.discovery import HOTPLUG_POLL, UDEV_POLL

    discovery = DrmDiscovery(SysFS(tmp_path), hotplug=False)
    discovery.start()  # no udev for a fixture root
    assert not discovery.watching and discovery.retry_interval(1.0) == HOTPLUG_POLL
    discovery._observer = object()  # what start() keeps while pyudev's observer runs
    assert discovery.watching and discovery.retry_interval(1.0) == UDEV_POLL
    assert discovery.retry_interval(300.0) == 300.0
    assert HOTPLUG_POLL < UDEV_POLL


def test_a_card_that_appears_calls_back_but_not_the_first_enumeration(tmp_path: Path) -> None:
    """on_card_added (the Hub's reprobe) runs when a listing finds a new card, however
    it was noticed (a backend's cycle, a rescan), and on a udev add or bind event."""
    from types import SimpleNamespace

    add_pci_card(tmp_path, "0000:03:00.0", "card0")
    disc = DrmDiscovery(SysFS(tmp_path), hotplug=False)
    calls: list[int] = []
    disc.on_card_added(lambda: calls.append(1))
    assert [c.card for c in disc.cards()] == ["card0"]
    assert calls == []  # the first enumeration: every backend is opening anyway
    disc.cards()
    assert calls == []  # nothing changed
    add_pci_card(tmp_path, "0000:0c:00.0", "card1", render="renderD130")
    assert [c.card for c in disc.cards()] == ["card0", "card1"]  # seen on a cycle
    assert calls == [1]
    os.unlink(tmp_path / "class" / "drm" / "card1")
    disc.cards()
    assert calls == [1]  # a card that goes wakes nobody
    disc._on_event(SimpleNamespace(action="change"))
    assert calls == [1]
    disc._on_event(SimpleNamespace(action="add"))  # what the udev monitor thread calls
    assert calls == [1, 1]


def test_a_fifo_in_place_of_an_identity_file_does_not_block_enumeration(tmp_path: Path) -> None:
    dev = add_pci_card(tmp_path, "0000:03:00.0", "card1")
    (dev / "device").unlink()
    os.mkfifo(dev / "device")  # nothing ever writes: a blocking open() would never return
    found: list[list[str]] = []
    t = threading.Thread(
        target=lambda: found.append([c.pci_bus_id for c in enumerate_cards(SysFS(tmp_path))]),
        daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():
        os.close(os.open(dev / "device", os.O_RDWR | os.O_NONBLOCK))  # let it finish
        t.join(5)
        raise AssertionError("enumerating cards blocked on a FIFO")
    assert found == [["0000:03:00.0"]]  # the device id comes from PCI_ID in uevent instead


def test_a_card_first_seen_half_written_is_picked_up_once_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Discovery re-read a card only when a link's name or target changed: a card whose
    class/drm link was there before its device link and driver was never picked up."""
    from exporter.sources import discovery

    dev = add_pci_card(tmp_path, "0000:0c:00.0", "card0", render=None)
    node = dev / "drm" / "card0"
    (node / "device").unlink()  # the kernel has not written the rest yet
    (dev / "driver").unlink()
    (dev / "uevent").write_text("PCI_ID=1002:73BF\nPCI_SLOT_NAME=0000:0c:00.0\n")
    disc = DrmDiscovery(SysFS(tmp_path), hotplug=False)
    assert disc.cards() == []
    (node / "device").symlink_to(os.path.relpath(dev, node))  # the device link: no driver
    assert [c.driver for c in disc.cards()] == [""]
    assert disc.cards(["amdgpu"]) == []
    (dev / "driver").symlink_to(os.path.relpath(tmp_path / "bus/pci/drivers/amdgpu", dev))
    assert [c.card for c in disc.cards(["amdgpu"])] == ["card0"]
    assert not any(disc._incomplete.values())  # complete: no more re-reads

    # One that never completes (a virtual card without a device) is re-read a bounded
    # number of times, then only when its link changes.
    (tmp_path / "class/drm/card7").mkdir()
    reads = []
    real = discovery.enumerate_cards
    monkeypatch.setattr(discovery, "enumerate_cards", lambda *a: reads.append(1) or real(*a))
    for _ in range(discovery.INCOMPLETE_RETRIES + 10):
        disc.cards()
    assert len(reads) == discovery.INCOMPLETE_RETRIES + 1


def test_a_card_entry_is_card_and_a_number_never_a_connector() -> None:
    from exporter.sources.discovery import is_card_entry

    assert [n for n in ("card0", "card12", "card1-DP-1", "card1-HDMI-A-1", "renderD128",
                        "card", "cards", "card 1", "version", "xcard1")
            if is_card_entry(n)] == ["card0", "card12"]


def test_a_connector_or_render_node_that_comes_is_no_card(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt/sys", root, symlinks=True)
    disc = DrmDiscovery(SysFS(root), hotplug=False)
    assert [c.card for c in disc.cards()] == ["card1"]
    gen = disc.generation
    target = os.readlink(root / "class/drm/card1")
    os.symlink(target + "-DP-9", root / "class/drm/card1-DP-9")  # a connector's link
    assert [c.card for c in disc.cards()] == ["card1"] and disc.generation == gen
