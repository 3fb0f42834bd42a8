"""Hotplug through the whole collection path: DRM discovery, the AMD backend, the hub.

The udev monitor only runs on a real /sys; the first test hands the discovery the
event by hand on a copy of a fixture tree, as the monitor thread would, and the
discovery wakes the Hub's down backends as the Daemon wires it. The container test
has no event at all: the backend finds the card at its next retry.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.pipeline.hub import Hub
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.fdinfo.backend import FdinfoBackend
from tests.daemon import FIXTURES
from tests.drm_tree import add_pci_card

BUS = "0000:03:00.0"


def wait_for(predicate, timeout: float = 3.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.02)
    return time.monotonic() - t0


def devices(hub: Hub) -> dict[str, bool]:
    (state,) = hub.snapshot.backends
    return {d.info.pci_bus_id: d.up for d in state.last.devices} if state.last else {}


@pytest.mark.slow  # waits for the discovery's refresh
def test_card_added_then_removed(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt" / "sys", sys_root, symlinks=True)
    drm = sys_root / "class" / "drm"
    parked = tmp_path / "parked"
    parked.mkdir()
    for link in drm.iterdir():  # start with no card at all
        link.rename(parked / link.name)

    config = Config(sysfs=str(sys_root), interval=0.1)
    discovery = DrmDiscovery(SysFS(sys_root), hotplug=False)
    hub = Hub(config, [AmdBackend(config, discovery)])
    discovery.on_card_added(hub.reprobe)  # as the Daemon wires them
    hub.start()
    try:
        assert hub.snapshot.backends[0].up is False
        assert "no amdgpu card" in hub.snapshot.backends[0].reason
        time.sleep(3.5)  # long enough that the back-off now waits 5 s or more

        for link in parked.iterdir():  # the card appears; udev says "add"
            link.rename(drm / link.name)
        discovery._on_event(SimpleNamespace(action="add"))
        took = wait_for(lambda: devices(hub).get(BUS) is True)
        assert took < 2.0  # about one interval (0.1 s), not the 5 s+ back-off step
        assert hub.snapshot.gpu_index[BUS] == 0

        for link in drm.iterdir():  # the card goes away; udev says "remove"
            link.unlink()
        discovery._on_event(SimpleNamespace(action="remove"))
        wait_for(lambda: devices(hub).get(BUS) is False)  # reported down first...
        wait_for(lambda: BUS not in devices(hub))  # ...then withdrawn
    finally:
        hub.stop()


@pytest.mark.slow  # waits for the back-off's first step (1 s)
def test_container_sysfs_without_udev_events(tmp_path: Path) -> None:
    # As a container runs: --path.sysfs=/host/sys, no uevent ever arrives and nobody
    # calls rescan(). The card must still be found when it appears (at the backend's
    # next retry: 1 s after its first, here), and reported down (then withdrawn) within
    # about one interval when it goes.
    sys_root = tmp_path / "host" / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt" / "sys", sys_root, symlinks=True)
    drm = sys_root / "class" / "drm"
    parked = tmp_path / "parked"
    parked.mkdir()
    for link in drm.iterdir():
        link.rename(parked / link.name)

    config = Config(sysfs=str(sys_root), interval=0.1)
    discovery = DrmDiscovery(SysFS(sys_root), hotplug=config.sysfs == "/sys")
    hub = Hub(config, [AmdBackend(config, discovery)])
    hub.start()
    try:
        assert hub.snapshot.backends[0].up is False
        for link in parked.iterdir():
            link.rename(drm / link.name)
        took = wait_for(lambda: devices(hub).get(BUS) is True, timeout=5.0)
        assert took < 3.0  # the back-off's first step, 1 s after the first open

        for link in drm.iterdir():
            link.unlink()
        took = wait_for(lambda: devices(hub).get(BUS) is False)
        assert took < 2.0
        wait_for(lambda: BUS not in devices(hub))
    finally:
        hub.stop()


@pytest.mark.slow  # waits for the discovery's refresh
def test_processes_backend_waits_for_a_usage_stats_card(tmp_path: Path) -> None:
    # On an NVIDIA-only host the /proc walk is skipped (backend_up 0 with the reason);
    # an amdgpu card bound later (udev says "add") turns it on within about one interval.
    sys_root = tmp_path / "sys"
    add_pci_card(sys_root, "0000:18:00.0", "card0", driver="nvidia", render="renderD128")
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt" / "proc", tmp_path / "proc", symlinks=True)
    config = Config(sysfs=str(sys_root), procfs=str(tmp_path / "proc"), interval=0.1,
                    processes_interval=0.1)
    discovery = DrmDiscovery(SysFS(sys_root), hotplug=False)
    hub = Hub(config, [FdinfoBackend(config, discovery)])
    discovery.on_card_added(hub.reprobe)  # as the Daemon wires them
    hub.start()
    try:
        time.sleep(3.5)  # long enough that the back-off now waits 5 s or more
        (state,) = hub.snapshot.backends
        assert (state.up, state.last) == (False, None)
        assert "no amdgpu, i915 or xe card" in state.reason

        add_pci_card(sys_root, BUS, "card1", render="renderD129")  # the fdinfo's drm-pdev
        discovery._on_event(SimpleNamespace(action="add"))
        took = wait_for(lambda: BUS in devices(hub))
        assert took < 2.0
        assert hub.snapshot.backends[0].up
    finally:
        hub.stop()
