"""The hub and the renderer, in-process, with a scripted backend (our own Backend contract)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from exporter.backends.base import KERNEL, BackendFailed, BackendUnavailable, Cycle
from exporter.collector import Hub, cap_processes
from exporter.config import Config
from exporter.model import DeviceInfo, DeviceSample, ProcessSample
from exporter.render import Renderer


def info(bus: str, vendor: str = "amd") -> DeviceInfo:
    return DeviceInfo(vendor=vendor, pci_bus_id=bus, uuid=f"pci-{bus}")


class Scripted:
    """A backend whose behaviour each test writes down."""

    def __init__(self, name: str, buses: Sequence[str], interval: float | None = None) -> None:
        self.name, self.buses, self.interval = name, list(buses), interval
        self.opens = 0
        self.fail_next = False
        self.unavailable: str | None = None
        self.block = threading.Event()
        self.block.set()
        self.primary = True
        self.priority = KERNEL
        self.up = True
        self.engines: dict[str, float] = {}

    def open(self) -> Sequence[DeviceInfo]:
        self.opens += 1
        if self.unavailable:
            raise BackendUnavailable(self.unavailable)
        return [info(b) for b in self.buses]

    def sample(self, slow: bool) -> Cycle:
        self.block.wait()
        if self.fail_next:
            self.fail_next = False
            raise BackendFailed("driver reloaded")
        return Cycle([DeviceSample(info=info(b), source=self.name, primary=self.primary, up=self.up,
                                   power_watts=10.0, engine_utilization_ratio=self.engines)
                      for b in self.buses], {"parse": 1})

    def close(self) -> None:
        pass


def scrape(hub: Hub) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    renderer = Renderer()
    renderer.render_now(hub.snapshot)
    body, _ = renderer.body("text")
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples}


def test_gpus_are_numbered_by_pci_bus_id_across_backends() -> None:
    hub = Hub(Config(), [Scripted("b", ["0000:c1:00.0"]), Scripted("a", ["0000:03:00.0",
                                                                         "0000:41:00.0"])])
    snapshot = hub.collect_once()
    assert snapshot.gpu_index == {"0000:03:00.0": 0, "0000:41:00.0": 1, "0000:c1:00.0": 2}
    assert snapshot.ready


def test_process_cap_keeps_the_largest_and_counts_the_rest() -> None:
    procs = tuple(ProcessSample(pid=p, process="x", memory_used_bytes=m)
                  for p, m in [(1, 10), (2, None), (3, 30), (4, 20)])
    device = DeviceSample(info=info("0000:01:00.0"), source="s", processes=procs)
    kept, cut = cap_processes(device, 2)
    assert [p.pid for p in kept.processes] == [3, 4] and cut == 2
    assert cap_processes(device, 4) == (device, 0)


def test_failed_handle_is_reopened_and_errors_accumulate() -> None:
    backend = Scripted("amd", ["0000:03:00.0"])
    hub = Hub(Config(interval=0.05), [backend])
    hub.start()
    try:
        time.sleep(0.3)
        backend.fail_next = True
        deadline = time.monotonic() + 5
        while backend.opens < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert backend.opens == 2  # closed and reopened after REOPEN_BACKOFF[0]
        time.sleep(0.2)
        state = hub.snapshot.backends[0]
        assert state.up and state.errors_total["parse"] >= 2
    finally:
        hub.stop()


def test_stuck_backend_goes_stale_its_values_withdrawn_gpu_up_kept() -> None:
    stuck, fine = Scripted("nvidia", ["0000:18:00.0"]), Scripted("amd", ["0000:03:00.0"])
    hub = Hub(Config(interval=0.05, stale_after=0.3), [stuck, fine])
    hub.start()
    try:
        time.sleep(0.2)
        stuck.block.clear()  # the next sample() hangs, as a driver call can
        deadline = time.monotonic() + 5
        while not hub.snapshot.backends[0].stale and time.monotonic() < deadline:
            time.sleep(0.05)
        got = scrape(hub)
        nvidia = frozenset({("gpu", "1"), ("uuid", "pci-0000:18:00.0"), ("vendor", "amd"),
                            ("source", "nvidia")})
        assert got[("gpu_up", nvidia)] == 0
        assert ("gpu_power_watts", nvidia) not in got
        assert got[("gpu_exporter_backend_up", frozenset({("backend", "nvidia")}))] == 0
        assert got[("gpu_exporter_backend_up", frozenset({("backend", "amd")}))] == 1
        stuck.block.set()  # it answers again: values come back
        time.sleep(0.3)
        assert scrape(hub)[("gpu_power_watts", nvidia)] == 10.0
    finally:
        stuck.block.set()
        hub.stop()


def test_unavailable_backend_is_reported_down_with_its_reason() -> None:
    backend = Scripted("nvidia", [])
    backend.unavailable = "NVML not found"
    hub = Hub(Config(), [backend])
    snapshot = hub.collect_once()
    assert snapshot.ready and snapshot.backends[0].reason == "NVML not found"
    assert scrape(hub)[("gpu_exporter_backend_up", frozenset({("backend", "nvidia")}))] == 0


def test_fdinfo_engine_sums_yield_to_the_driver_s_own_engines() -> None:
    amd, fdinfo = Scripted("amd", ["0000:03:00.0"]), Scripted("processes", ["0000:03:00.0"])
    amd.engines = {"gfx": 0.5}
    fdinfo.primary, fdinfo.engines = False, {"gfx": 0.1, "compute": 0.2}
    hub = Hub(Config(), [amd, fdinfo])
    hub.collect_once()
    engines = {(dict(ls)["engine"], dict(ls)["source"]): v for (n, ls), v in scrape(hub).items()
               if n == "gpu_engine_utilization_ratio"}
    assert engines == {("gfx", "amd"): 0.5, ("compute", "processes"): 0.2}


def test_render_ahead_only_for_formats_asked_for_and_only_near_the_next_scrape() -> None:
    from exporter.render import _Demand

    d = _Demand()
    assert not d.due(0.0, lead=2.0)  # never asked for: rendered on the first request only
    d.asked(100.0)
    assert d.due(100.5, lead=2.0)  # one request, no cadence known yet: render ahead
    d.asked(115.0)  # a 15 s scrape interval
    assert not d.due(116.0, lead=2.0)  # the next scrape is ~14 s away: don't render
    assert d.due(128.5, lead=2.0)  # due within the lead: render ahead
    assert not d.due(115.0 + 301.0, lead=2.0)  # nobody asked for 5 minutes


def test_a_scrape_always_gets_the_newest_snapshot() -> None:
    hub = Hub(Config(), [Scripted("amd", ["0000:03:00.0"])])
    renderer = Renderer(lead=2.0)
    first = renderer.render_now(hub.collect_once())
    assert first._bodies == {}  # nobody asked for anything yet: nothing rendered ahead
    body, snap = renderer.body("text")
    assert snap.generation == first.snapshot.generation and b"gpu_power_watts" in body
    second = renderer.render_now(hub.collect_once())
    assert "text" in second._bodies  # asked for once, cadence unknown: rendered ahead
    assert renderer.body("text")[1].generation == second.snapshot.generation


def test_a_lost_gpu_is_logged_once_when_lost_and_once_when_back() -> None:
    from structlog.testing import capture_logs

    backend = Scripted("amd", ["0000:03:00.0"])
    hub = Hub(Config(), [backend])
    with capture_logs() as logs:
        hub.collect_once()
        backend.up = False
        for _ in range(3):
            hub._sample(backend, slow=False)
        backend.up = True
        for _ in range(3):
            hub._sample(backend, slow=False)
    events = [e["event"] for e in logs if e["event"].startswith("gpu ")]
    assert events == ["gpu lost", "gpu back"]
