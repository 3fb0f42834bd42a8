"""The hub and the renderer, in-process, with a scripted backend (our own Backend contract)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.config import Config
from exporter.core.model import DeviceInfo, DeviceSample, ProcessSample
from exporter.output.render import Renderer
from exporter.pipeline.hub import Hub, cap_processes
from exporter.sources.base import KERNEL, PLAIN, BackendFailed, BackendUnavailable, Cycle
from tests.clock import SteppedClock


def info(bus: str, vendor: str = "amd") -> DeviceInfo:
    return DeviceInfo(vendor=vendor, pci_bus_id=bus, uuid=f"pci-{bus}")


class Scripted:
    """A backend whose behaviour each test writes down."""

    def __init__(self, name: str, buses: Sequence[str], interval: float | None = None) -> None:
        self.name, self.buses, self.interval = name, list(buses), interval
        self.source = name
        self.opens = 0
        self.fail_next = False
        self.unavailable: str | None = None
        self.block = threading.Event()
        self.block.set()
        self.primary = True
        self.priority = KERNEL
        self.capabilities = PLAIN
        self.up = True
        self.engines: dict[str, float] = {}
        self.processes: tuple[ProcessSample, ...] = ()

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
                                   power_watts=10.0, engine_utilization_ratio=self.engines,
                                   processes=self.processes)
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
    assert [p.pid for p in kept.processes] == [3, 4] and cut == (1, 2)
    assert cap_processes(device, 4) == (device, ())


def test_one_process_cap_per_gpu_after_the_merge_and_one_count_per_cut_process() -> None:
    """A library backend and fdinfo see disjoint pids of one GPU: with a cap of 3, the GPU
    serves 3 processes (not 3 per source), the largest of both, and each of the 3 cut
    processes counts once (not once per source, not once per cycle)."""
    def procs(pids: range) -> tuple[ProcessSample, ...]:
        return tuple(ProcessSample(pid=p, process="x", memory_used_bytes=float(p))
                     for p in pids)

    library = Scripted("amdsmi", ["0000:03:00.0"])
    library.priority, library.processes = 0, procs(range(1, 4))  # pids 1-3
    fdinfo = Scripted("fdinfo", ["0000:03:00.0"])
    fdinfo.primary, fdinfo.processes = False, procs(range(11, 14))  # pids 11-13
    hub = Hub(Config(max_processes_per_gpu=3), [library, fdinfo])
    snapshot = hub.collect_once()
    [(_, device)] = snapshot.devices
    assert [p.pid for p in device.processes] == [13, 12, 11]
    assert snapshot.processes_truncated_total == 3
    values = scrape(hub)
    assert values[("gpu_exporter_processes_truncated_total", frozenset())] == 3
    assert len([k for k in values if k[0] == "gpu_process_memory_used_bytes"]) == 3
    # The same processes cut again in the next cycles are not counted again...
    for _ in range(2):
        hub.collect_once()
    assert hub.publish().processes_truncated_total == 3
    # ...a new one is.
    library.processes = procs(range(1, 5))
    assert hub.collect_once().processes_truncated_total == 4


@pytest.mark.slow  # takes seconds
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
    from exporter.output.render.exposition import _Demand

    d = _Demand()
    assert not d.due(0.0, lead=2.0)  # never asked for: rendered on the first request only
    d.asked(100.0)
    assert not d.due(100.5, lead=2.0)  # one request, no cadence known yet: on demand
    d.asked(115.0)  # a 15 s scrape interval
    assert not d.due(116.0, lead=2.0)  # the next scrape is ~14 s away: don't render
    assert d.due(128.5, lead=2.0)  # due within the lead: render ahead
    d.ahead = True  # what Renderer.render_now records when it renders ahead
    assert not d.due(129.5, lead=2.0)  # once per expected scrape, not every snapshot
    d.asked(130.0)
    assert d.due(143.5, lead=2.0)
    assert not d.due(130.0 + 301.0, lead=2.0)  # nobody asked for 5 minutes


def test_a_scrape_always_gets_the_newest_snapshot() -> None:
    hub = Hub(Config(), [Scripted("amd", ["0000:03:00.0"])])
    renderer = Renderer(lead=2.0)
    first = renderer.render_now(hub.collect_once())
    assert first._bodies == {}  # nobody asked for anything yet: nothing rendered ahead
    body, snap = renderer.body("text")
    assert snap.generation == first.snapshot.generation and b"gpu_power_watts" in body
    second = renderer.render_now(hub.collect_once())
    assert second._bodies == {}  # asked for once, cadence unknown: not rendered ahead
    assert renderer.body("text")[1].generation == second.snapshot.generation
    renderer.body("text")  # a second request: the cadence is known (about 0 s here)
    third = renderer.render_now(hub.collect_once())
    assert "text" in third._bodies  # due now: rendered ahead


def test_a_snapshot_not_due_for_a_scrape_is_made_current_without_waking_the_renderer(
        ) -> None:
    hub = Hub(Config(), [Scripted("amd", ["0000:03:00.0"])])
    renderer = Renderer(lead=2.0)
    woken: list[Callable[[], object]] = []
    renderer.worker.call = woken.append  # type: ignore[method-assign, assignment]
    try:
        first = hub.collect_once()
        renderer.submit(first)
        assert not woken  # no scrape expected soon: nothing to render, no thread woken
        assert renderer.current is not None and renderer.current.snapshot is first
        assert renderer.current._bodies == {}
        renderer.body("text")
        renderer.body("text")  # the cadence is known (about 0 s): a render is due now
        second = hub.collect_once()
        renderer.submit(second)
        renderer.submit(third := hub.collect_once())  # comes while that render waits
        assert len(woken) == 1  # one render ahead on the renderer's thread, for both
        woken[0]()
        assert renderer.current.snapshot is third and "text" in renderer.current._bodies
    finally:
        renderer.stop()


def test_backends_sampling_together_publish_once_and_a_hung_one_is_not_waited_for() -> None:
    """The publishing thread merges once per tick: a backend that finishes while another
    of the same tick is still sampling does not publish alone; one that hangs past an
    interval is not waited for."""
    clock = SteppedClock()
    amd, slow = Scripted("amd", ["0000:03:00.0"]), Scripted("intel", ["0000:09:00.0"])
    hub = Hub(Config(interval=1.0), [amd, slow], clock=clock)
    first = hub.collect_once().generation  # no publishing thread yet: published here
    with hub._life:
        hub._start_publisher()
    try:
        slow.block.clear()  # intel's sample is in the driver
        behind = threading.Thread(target=hub._sample, args=(slow, False))
        behind.start()
        wait_for(lambda: "intel" in hub._sampling)
        hub._sample(amd, slow=False)
        time.sleep(0.3)  # the publisher is awake and waits for intel, of the same tick
        assert hub.snapshot.generation == first
        slow.block.set()
        behind.join(5)
        wait_for(lambda: hub.snapshot.generation == first + 1)
        time.sleep(0.1)
        assert hub.snapshot.generation == first + 1  # one publish for both
        assert {s.name: s.last.timestamp for s in hub.snapshot.backends if s.last} == \
            {s.name: s.last.timestamp for s in hub._states.values() if s.last}  # both in it
        slow.block.clear()  # intel hangs in the driver, past an interval
        behind = threading.Thread(target=hub._sample, args=(slow, False))
        behind.start()
        wait_for(lambda: "intel" in hub._sampling)
        clock.t += 1.5
        hub._sample(amd, slow=False)
        wait_for(lambda: hub.snapshot.generation == first + 2)
        assert hub.snapshot.generation == first + 2  # not waited for
        slow.block.set()
        behind.join(5)
    finally:
        hub.stop()


def test_a_backend_whose_tick_came_before_its_thread_ran_is_waited_for_a_moment() -> None:
    """Backends of one tick wake together, but one thread may start its cycle a little
    after another has finished (the interpreter was busy): the publisher waits for it
    (TICK_GRACE), and merges once for both, not once for each; one whose tick is past
    that moment is not waited for."""
    from exporter.pipeline.hub import TICK_GRACE

    clock = SteppedClock()
    amd, late = Scripted("amd", ["0000:03:00.0"]), Scripted("intel", ["0000:09:00.0"])
    hub = Hub(Config(interval=1.0), [amd, late], clock=clock)
    first = hub.collect_once().generation
    with hub._life:
        hub._start_publisher()
    try:
        with hub._lock:  # both wait for the tick at t; intel's thread is not scheduled yet
            hub._next_tick.update(amd=clock.t, intel=clock.t)
        hub._sample(amd, slow=False)
        time.sleep(0.3)  # the publisher is awake and waits for intel's cycle to start
        assert hub.snapshot.generation == first
        assert "amd" not in hub._next_tick  # its cycle is over: nothing to wait for
        with hub._lock:
            assert hub._due(clock.t) == pytest.approx(TICK_GRACE)
        hub._sample(late, slow=False)
        wait_for(lambda: hub.snapshot.generation == first + 1)
        time.sleep(0.1)
        assert hub.snapshot.generation == first + 1  # one publish for both

        with hub._lock:  # intel's tick is long past and its thread never came
            hub._next_tick["intel"] = clock.t - 2 * TICK_GRACE
        hub._sample(amd, slow=False)
        wait_for(lambda: hub.snapshot.generation == first + 2)  # not waited for
    finally:
        hub.stop()


def test_subscribers_run_on_the_publishing_thread_in_generation_order() -> None:
    """No subscriber runs on a backend's thread: the renderer and the history get each
    snapshot from the one publishing thread, in order."""
    seen: list[tuple[str, int]] = []
    amd = Scripted("amd", ["0000:03:00.0"])
    hub = Hub(Config(interval=0.05), [amd])
    hub.subscribe(lambda s: seen.append((threading.current_thread().name, s.generation)))
    hub.start()
    try:
        wait_for(lambda: len(seen) >= 5)
        assert len(seen) >= 5
    finally:
        hub.stop()
    assert {name for name, _ in seen} == {"collector-publish"}
    generations = [g for _, g in seen]
    assert generations == sorted(generations) and len(set(generations)) == len(generations)


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


def test_device_log_lines_carry_the_gpu_index_of_the_series() -> None:
    """A log said gpu: 0 (the library's index) for the GPU whose series say gpu="1"."""
    from structlog.testing import capture_logs

    amd, nvidia = Scripted("amd", ["0000:03:00.0"]), Scripted("nvidia", ["0000:05:00.0"])
    hub = Hub(Config(), [amd, nvidia])
    snapshot = hub.collect_once()
    index = {d.info.key: gpu for gpu, d in snapshot.devices}
    with capture_logs() as logs:
        nvidia.up = False
        hub._sample(nvidia, slow=False)
    (lost,) = [e for e in logs if e["event"] == "gpu lost"]
    assert lost["gpu"] == index[lost["device"]] == "1"


def test_debug_logs_each_backends_cycle_time_at_most_once_a_minute() -> None:
    from structlog.testing import capture_logs

    from exporter.core import logs as exporter_logs

    backend = Scripted("amd", ["0000:03:00.0", "0000:04:00.0"])
    hub = Hub(Config(), [backend])
    hub.collect_once()
    try:
        with capture_logs() as quiet:
            hub._sample(backend, slow=False)  # info: nothing
        exporter_logs.set_level("debug")
        with capture_logs() as logs:
            for _ in range(5):
                hub._sample(backend, slow=False)
    finally:
        exporter_logs.set_level("info")
    assert not [e for e in quiet if e["event"] == "backend cycle"]
    (line,) = [e for e in logs if e["event"] == "backend cycle"]
    assert line["backend"] == "amd" and line["gpus"] == ["0", "1"] and line["devices"] == 2
    assert 0 <= line["seconds_per_device"] <= line["seconds"]


class Raising(Scripted):
    """A backend with a bug (or a handle that goes bad): sample() raises after ``good``
    cycles."""

    def __init__(self, name: str, buses: Sequence[str], good: int = 0,
                 error: Exception | None = None) -> None:
        super().__init__(name, buses)
        self.good = good
        self.error = error or KeyError("boom")

    def sample(self, slow: bool) -> Cycle:
        if self.good <= 0:
            raise self.error
        self.good -= 1
        return super().sample(slow)


def wait_for(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


@pytest.mark.slow
def test_an_exception_in_a_backend_keeps_its_gpus_down_logged_once_and_counted() -> None:
    """Issue 8.5: the GPUs used to vanish while backend_up stayed 1."""
    from structlog.testing import capture_logs

    backend = Raising("amd", ["0000:03:00.0"], good=1)
    hub = Hub(Config(interval=0.05), [backend])
    with capture_logs() as logs:
        hub.start()
        try:
            wait_for(lambda: hub.snapshot.backends[0].errors_total.get("exception", 0) >= 2)
            got = scrape(hub)
        finally:
            hub.stop()
    gpu = frozenset({("gpu", "0"), ("uuid", "pci-0000:03:00.0"), ("vendor", "amd"),
                     ("source", "amd")})
    assert got[("gpu_up", gpu)] == 0
    assert ("gpu_power_watts", gpu) not in got
    assert got[("gpu_exporter_backend_up", frozenset({("backend", "amd")}))] == 0
    errors = frozenset({("backend", "amd"), ("reason", "exception")})
    assert got[("gpu_exporter_collection_errors_total", errors)] >= 2
    raised = [e for e in logs if e["event"] == "backend down"]
    assert len(raised) == 1 and "KeyError" in raised[0]["reason"] and raised[0]["exc_info"]


@pytest.mark.parametrize("error", [BackendFailed("handle went bad"), KeyError("bug")])
def test_a_backend_that_fails_after_every_open_backs_off(error: Exception) -> None:
    """Issue 8.6: 49,589 opens in one second with a sample that always failed."""
    backend = Raising("amd", ["0000:03:00.0"], error=error)
    clock = SteppedClock()
    hub = Hub(Config(interval=0.05), [backend], clock=clock)
    hub.start()
    opens = []
    try:
        for seconds in (0.5, 1.5, 2.9, 3.5, 7.9, 8.5):  # of virtual time since the start
            clock.run_until(1000.0 + seconds, threads=2)  # the backend's and the watchdog
            opens.append(backend.opens)
    finally:
        hub.stop()
    # opens at 0, then after REOPEN_BACKOFF's 1 s, 2 s, 5 s: at 1, 3 and 8 s
    assert opens == [1, 2, 2, 3, 3, 4]


class AllLost(Scripted):
    """NVML with its only GPU lost for good: every cycle down, BackendFailed every 2nd."""

    def sample(self, slow: bool) -> Cycle:
        self.cycles = getattr(self, "cycles", 0) + 1
        if self.cycles % 2 == 0:
            raise BackendFailed("every GPU lost: re-initialising")
        return Cycle([DeviceSample(info=info(b), source=self.name, up=False)
                      for b in self.buses])


def test_back_off_is_not_reset_by_cycles_in_which_every_gpu_is_down() -> None:
    backend = AllLost("nvidia", ["0000:18:00.0"])
    clock = SteppedClock()
    hub = Hub(Config(interval=0.05), [backend], clock=clock)
    hub.start()
    try:
        clock.run_until(1000.0 + 3.6, threads=2)
    finally:
        hub.stop()
    # opens at 0, ~1.05, ~3.1 (1 s then 2 s of back-off); without the carried back-off
    # it reopened after 1 s every time (4 opens in 3.6 s).
    assert backend.opens == 3


def test_a_backend_that_hangs_in_its_first_sample_goes_stale_and_ready_is_reached() -> None:
    """Issue 8.7: staleness counted from the last success, which never came."""
    stuck, fine = Scripted("nvidia", ["0000:18:00.0"]), Scripted("amd", ["0000:03:00.0"])
    stuck.block.clear()  # its very first sample() hangs
    hub = Hub(Config(interval=0.05, stale_after=0.3), [stuck, fine])
    hub.start()
    try:
        wait_for(lambda: hub.snapshot.backends[0].stale)
        snapshot = hub.snapshot
        assert snapshot.backends[0].stale and snapshot.ready
        got = scrape(hub)
        assert got[("gpu_exporter_backend_up", frozenset({("backend", "nvidia")}))] == 0
        assert got[("gpu_exporter_up", frozenset())] == 1
    finally:
        stuck.block.set()
        hub.stop()


@pytest.mark.slow
def test_a_wall_clock_step_does_not_withdraw_anything() -> None:
    """Issue 8.7: an NTP step of 3 s made every backend stale."""
    offset = [0.0]
    backend = Scripted("amd", ["0000:03:00.0"])
    hub = Hub(Config(interval=0.05, stale_after=0.3), [backend],
              wall_clock=lambda: time.time() + offset[0])
    hub.start()
    try:
        time.sleep(0.2)
        offset[0] = 3.0  # the wall clock jumps forward
        time.sleep(0.5)
        assert not hub.snapshot.backends[0].stale
        offset[0] = -3.0  # and back
        time.sleep(0.5)
        assert not hub.snapshot.backends[0].stale
    finally:
        hub.stop()


def test_a_gpu_its_backend_stops_reporting_stays_with_gpu_up_0() -> None:
    """Issue 8.8: a removed card stayed gpu_up 1 (or vanished) with its series gone."""
    backend = Scripted("amd", ["0000:03:00.0", "0000:41:00.0"])
    hub = Hub(Config(), [backend])
    hub.collect_once()
    backend.buses = ["0000:03:00.0"]  # the second card was pulled
    hub._sample(backend, slow=False)
    got = scrape(hub)
    gone = frozenset({("gpu", "1"), ("uuid", "pci-0000:41:00.0"), ("vendor", "amd"),
                      ("source", "amd")})
    assert got[("gpu_up", gone)] == 0 and ("gpu_power_watts", gone) not in got
    here = gone - {("gpu", "1"), ("uuid", "pci-0000:41:00.0")} | {
        ("gpu", "0"), ("uuid", "pci-0000:03:00.0")}
    assert got[("gpu_up", here)] == 1


def test_a_gpu_of_a_backend_stale_before_its_first_sample_carries_the_declared_source() -> None:
    """The contract's ``source`` (not the backend's name, nor a module-level constant)
    labels the gpu_up 0 series of the GPUs open() returned."""
    stuck = Scripted("nvidia", ["0000:18:00.0"])
    stuck.source = "nvml"  # what its samples would carry; this module has no SOURCE
    stuck.block.clear()
    hub = Hub(Config(interval=0.05, stale_after=0.3), [stuck])
    hub.start()
    try:
        wait_for(lambda: hub.snapshot.backends[0].stale)
        got = scrape(hub)
    finally:
        stuck.block.set()
        hub.stop()
    up = {dict(labels)["source"]: v for (name, labels), v in got.items() if name == "gpu_up"}
    assert up == {"nvml": 0.0}
