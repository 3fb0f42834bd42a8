"""A backend that cannot open costs nothing between its retries.

The real Hub on a stepped clock runs a backend whose open() asks the real DRM
discovery for its cards, as the AMD, Intel, PMU and fdinfo backends do, on a tree with
no card, and counts the opens: they follow the back-off (1, 2, 5, 10 s, then every
HOTPLUG_POLL without udev), not the collection interval; a card added (the udev event
the discovery hears, or a backend that is up finding it on its cycle) re-probes at once
and starts the back-off over, as the Daemon wires the discovery to the Hub.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceInfo, DeviceSample
from exporter.pipeline.hub import Hub
from exporter.sources.base import KERNEL, BackendUnavailable, Capabilities, Cycle
from exporter.sources.discovery import HOTPLUG_POLL, DrmDiscovery
from tests.clock import SteppedClock
from tests.drm_tree import add_pci_card

START = 1000.0  # SteppedClock's start
BUS = "0000:03:00.0"


class CardLess:
    """A DRM backend's open(): the discovery's cached card list (amdgpu, or ``drivers``),
    BackendUnavailable without a card; every call counted with the Hub's virtual time."""

    source = "sysfs"
    priority = KERNEL
    interval: float | None = None

    def __init__(self, config: Config, discovery: DrmDiscovery, now: Callable[[], float],
                 name: str = "amd", drivers: tuple[str, ...] = ("amdgpu",)) -> None:
        self.name = name
        self.drivers = drivers
        self.config = config
        self.discovery = discovery
        self.now = now
        self.opens: list[float] = []

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(retry_interval=self.discovery.retry_interval(self.config.interval))

    def open(self) -> Sequence[DeviceInfo]:
        self.opens.append(round(self.now() - START, 6))
        cards = self.discovery.cards(self.drivers)
        if not cards:
            raise BackendUnavailable(f"no {'/'.join(self.drivers)} card")
        return [_info(c.pci_bus_id) for c in cards]

    def sample(self, slow: bool) -> Cycle:
        return Cycle([DeviceSample(info=_info(c.pci_bus_id), source=self.source)
                      for c in self.discovery.cards(self.drivers)])

    def close(self) -> None:
        pass


def _info(bus: str) -> DeviceInfo:
    return DeviceInfo(vendor="amd", pci_bus_id=bus, uuid=f"pci-{bus}")


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


def card_less(tmp_path: Path) -> tuple[Hub, CardLess, DrmDiscovery, SteppedClock]:
    (tmp_path / "class" / "drm").mkdir(parents=True)
    clock = SteppedClock(START)
    config = Config(sysfs=str(tmp_path), interval=0.1)
    discovery = DrmDiscovery(SysFS(tmp_path), hotplug=False)  # a container: no udev
    backend = CardLess(config, discovery, clock.now)
    hub = Hub(config, [backend], clock=clock)
    discovery.on_card_added(hub.reprobe)  # as the Daemon wires them
    return hub, backend, discovery, clock


def test_a_down_backend_is_opened_on_its_back_off_not_every_cycle(tmp_path: Path) -> None:
    hub, backend, _, clock = card_less(tmp_path)
    hub.start()
    try:
        clock.run_until(START + 60.0, threads=2)  # the backend's thread and the watchdog
    finally:
        hub.stop()
    # 600 cycles of 0.1 s; the opens: the first, then 1, 2, 5 s of back-off, then every
    # HOTPLUG_POLL (10 s), the cap without udev.
    assert HOTPLUG_POLL == 10.0
    assert backend.opens == [0.0, 1.0, 3.0, 8.0, 18.0, 28.0, 38.0, 48.0, 58.0]
    (state,) = hub.snapshot.backends
    assert not state.up and "no amdgpu card" in state.reason


def test_a_card_added_reprobes_a_down_backend_at_once(tmp_path: Path) -> None:
    hub, backend, discovery, clock = card_less(tmp_path)
    hub.start()
    try:
        clock.run_until(START + 40.0, threads=2)  # its next retry is at 48 s
        assert backend.opens[-1] == 38.0
        add_pci_card(tmp_path, BUS, "card1")
        discovery._on_event(SimpleNamespace(action="add"))  # what the udev thread calls
        wait_for(lambda: hub._states["amd"].up)
        assert backend.opens[-1] == 40.0  # now, not at 48 s
        wait_for(lambda: hub._states["amd"].last is not None)
        assert [d.info.pci_bus_id for d in hub._states["amd"].last.devices] == [BUS]
    finally:
        hub.stop()


def test_a_reprobe_that_still_fails_starts_the_back_off_over(tmp_path: Path) -> None:
    # udev's "add" for a card comes before its driver has finished (a PMU registered
    # later, a file written later): the next retries come 1 and 2 s after, not 10 s.
    hub, backend, _, clock = card_less(tmp_path)
    hub.start()
    try:
        clock.run_until(START + 40.0, threads=2)
        hub.reprobe()
        wait_for(lambda: backend.opens[-1] == 40.0)
        clock.run_until(START + 45.0, threads=2)
    finally:
        hub.stop()
    assert backend.opens[-4:] == [38.0, 40.0, 41.0, 43.0]


@pytest.mark.slow  # real time: waits until the back-off has grown
def test_a_card_an_up_backend_finds_on_its_cycle_wakes_the_down_ones(tmp_path: Path) -> None:
    """Without udev: the AMD backend, up, lists the cards every cycle; the card-less
    Intel one is woken by the xe card that listing finds."""
    add_pci_card(tmp_path, "0000:09:00.0", "card0")
    config = Config(sysfs=str(tmp_path), interval=0.05)
    discovery = DrmDiscovery(SysFS(tmp_path), hotplug=False)
    amd = CardLess(config, discovery, time.monotonic)
    intel = CardLess(config, discovery, time.monotonic, name="intel", drivers=("i915", "xe"))
    hub = Hub(config, [amd, intel])
    discovery.on_card_added(hub.reprobe)
    hub.start()
    try:
        time.sleep(3.5)  # intel's retries: at 0, 1 and 3 s; the next at 8 s
        assert len(intel.opens) == 3 and hub._states["amd"].up
        add_pci_card(tmp_path, "0000:0a:00.0", "card2", driver="xe", render="renderD130")
        t0 = time.monotonic()
        wait_for(lambda: hub._states["intel"].up)
        assert time.monotonic() - t0 < 2.0  # about one interval, not the 4.5 s left
        assert len(intel.opens) == 4
    finally:
        hub.stop()


def test_the_daemon_wakes_its_hub_when_the_discovery_finds_a_card(tmp_path: Path) -> None:
    from exporter.app.daemon import Daemon
    from exporter.app.flags import load_config

    (tmp_path / "class" / "drm").mkdir(parents=True)
    config = load_config(["--path.sysfs", str(tmp_path), "--no-collector.nvidia"], {})
    daemon = Daemon(config)
    try:
        discovery = daemon.shared.discovery
        discovery.cards()  # the first enumeration: no card
        assert not any(p.is_set() for p in daemon.hub._probes.values())
        add_pci_card(tmp_path, BUS, "card1")
        discovery._on_event(SimpleNamespace(action="add"))
        assert all(p.is_set() for p in daemon.hub._probes.values())
    finally:
        daemon.stop()
