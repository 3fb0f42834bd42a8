"""The Apple backend with a real child process: tests/fakes/fake_macmon.py.

The fake replays recorded macmon lines (tests/fixtures/macmon, SOURCES.md there) at
the interval, and crashes, hangs, prints garbage or rejects ``--soc-info`` when
FAKE_MACMON_MODE says so. Every run appends its pid to FAKE_MACMON_LOG, which is how
these tests find the children and check that none is left running or unreaped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.sources.apple.backend import AppleBackend
from exporter.sources.base import BackendUnavailable, Cycle

pytestmark = pytest.mark.slow  # a real macmon child process per test

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fakes" / "fake_macmon.py"
LINES = REPO / "tests" / "fixtures" / "macmon"
INTERVAL = 0.2


class Fake:
    """Sets the fake's environment for the children this test starts; reads their log."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log = tmp_path / "macmon-runs.log"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("FAKE_MACMON_LOG", str(self.log))
        self.lines("v0.7-m1max-soc.jsonl")

    def lines(self, name: str) -> None:
        self.monkeypatch.setenv("FAKE_MACMON_LINES", str(LINES / name))

    def mode(self, modes: str, after: int = 1) -> None:
        self.monkeypatch.setenv("FAKE_MACMON_MODE", modes)
        self.monkeypatch.setenv("FAKE_MACMON_AFTER", str(after))

    def runs(self) -> list[tuple[int, str, str]]:
        """(pid, mode, argv) of every child started so far."""
        return [(pid, mode, argv) for pid, mode, _, argv in self.started()]

    def started(self) -> list[tuple[int, str, float, str]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            pid, mode, when, argv = line.split(" ", 3)
            out.append((int(pid), mode, float(when), argv))
        return out

    def backend(self, path: str | Path = FAKE) -> AppleBackend:
        return AppleBackend(Config(interval=INTERVAL, macmon_path=str(path)),
                            backoff=(0.3, 1.0))

    @contextmanager
    def opened(self) -> Iterator[Collector]:
        """An opened backend (closed after), sampled by a Collector."""
        b = self.backend()
        b.open()
        try:
            yield Collector(b)
        finally:
            b.close()


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    f = Fake(tmp_path, monkeypatch)
    yield f
    left = [pid for pid, _, _ in f.runs() if alive(pid)]
    for pid in left:  # a failed test must not leave children behind
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    assert not left, f"fake macmon {left} still running or unreaped"
    assert not zombie_children()


def alive(pid: int) -> bool:
    """Running or a zombie (an exited child nobody reaped): /proc/<pid> still exists."""
    return Path(f"/proc/{pid}").exists()


def zombie_children() -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(stat.parent.name))
    return found


class Collector:
    """Samples the backend as the collector does, keeping the errors' running totals."""

    def __init__(self, backend: AppleBackend) -> None:
        self.backend = backend
        self.errors: Counter[str] = Counter()
        self.restarts = 0

    def sample(self) -> Cycle:
        cycle = self.backend.sample(slow=False)
        self.errors.update(cycle.errors)
        self.restarts = cycle.child_restarts  # handed over in each cycle
        return cycle

    def until(self, done: Callable[[Cycle, Counter[str]], bool],
              timeout: float = 10.0) -> Cycle:
        deadline = time.monotonic() + timeout
        while True:
            cycle = self.sample()
            if done(cycle, self.errors):
                return cycle
            assert time.monotonic() < deadline, f"gave up; errors so far {dict(self.errors)}"
            time.sleep(INTERVAL / 2)


def only(cycle: Cycle) -> DeviceSample:
    (device,) = cycle.devices
    return device


def serving(cycle: Cycle, _: Counter[str]) -> bool:
    return bool(cycle.devices) and only(cycle).up


def recorded(name: str) -> dict[str, object]:
    return json.loads((LINES / name).read_text().splitlines()[0])  # type: ignore[no-any-return]


# -- reading ----------------------------------------------------------------------------

def test_one_child_streams_values_converted_exactly(fake: Fake) -> None:
    doc = recorded("v0.7-m1max-soc.jsonl")
    b = fake.backend()
    (info,) = b.open()
    try:
        assert (info.key, info.pci_bus_id, info.uuid, info.vendor) == ("soc0", "", "soc0", "apple")
        assert info.name == doc["soc"]["chip_name"] == "Apple M1 Max"  # type: ignore[index]
        assert info.architecture == "M1"  # the generation of soc.chip_name
        c = Collector(b)
        d = only(c.until(serving))
        assert d.source == "macmon" and c.errors == {}
        freq_mhz, ratio = doc["gpu_usage"]  # type: ignore[misc]
        assert d.clocks_hertz == {"graphics": freq_mhz * 1e6}
        assert d.clocks_max_hertz == {"graphics": max(doc["soc"]["gpu_freqs"]) * 1e6}  # type: ignore[index]
        assert d.utilization_ratio == ratio
        assert d.power_watts == doc["gpu_power"]
        assert d.temperatures_celsius == {"gpu": doc["temp"]["gpu_temp_avg"]}  # type: ignore[index]
        assert d.shared_memory_total_bytes == doc["memory"]["ram_total"]  # type: ignore[index]
        assert d.shared_memory_used_bytes == doc["memory"]["ram_usage"]  # type: ignore[index]
        assert d.memory_total_bytes is None  # no device-local memory on a unified SoC
        time.sleep(3 * INTERVAL)
        c.until(serving)
        assert c.restarts == 0
        ((_, _, argv),) = fake.runs()  # ONE child for the whole time
        assert argv == "pipe -i 200 --soc-info"
    finally:
        b.close()


@pytest.mark.parametrize(("chip", "generation"), [
    ("Apple M1 Max", "M1"), ("Apple M4 Pro", "M4"), ("Apple M2", "M2"), ("Apple M10", "M10"),
    ("", ""), ("Apple silicon", ""), ("MacBookPro18,2", "")])
def test_the_architecture_is_the_chip_generation(chip: str, generation: str) -> None:
    from exporter.sources.apple.parse import chip_generation

    assert chip_generation(chip) == generation


def test_the_driver_version_is_the_macos_release(fake: Fake,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """platform.mac_ver() reads SystemVersion.plist: the release the GPU driver came with
    (on Linux, where the tests run, it is "": the label stays empty, never guessed)."""
    import platform

    from exporter.sources.apple.backend import macos_version

    assert macos_version() == platform.mac_ver()[0]
    monkeypatch.setattr(platform, "mac_ver", lambda: ("14.5", ("", "", ""), "arm64"))
    b = fake.backend()
    (info,) = b.open()
    b.close()
    assert info.driver_version == "14.5"


def test_the_newest_line_is_the_sample(fake: Fake) -> None:
    fake.lines("early-v0.5.jsonl")  # two consecutive real lines: 169 MHz, then 338 MHz
    clocks: set[float] = set()
    with fake.opened() as c:
        c.until(lambda cycle, _: serving(cycle, _) and bool(
            clocks.add(only(cycle).clocks_hertz["graphics"])) or clocks == {169e6, 338e6})


def test_older_macmon_without_soc_info_is_asked_again_without_it(fake: Fake) -> None:
    fake.lines("early-v0.5.jsonl")
    fake.mode("old")
    b = fake.backend()
    (info,) = b.open()
    try:
        assert info.name == ""  # macmon before 0.6.1 does not know the SoC's name
        assert [argv for _, _, argv in fake.runs()] == ["pipe -i 200 --soc-info", "pipe -i 200"]
        c = Collector(b)
        cycle = c.until(serving)
        assert only(cycle).clocks_hertz["graphics"] in (169e6, 338e6)
        assert c.errors == {} and c.restarts == 0
    finally:
        b.close()


# -- failures ---------------------------------------------------------------------------

def test_a_crashed_child_is_counted_reaped_and_replaced(fake: Fake) -> None:
    fake.mode("crash,replay", after=2)
    with fake.opened() as c:
        (first, _, _), = fake.runs()
        cycle = c.until(lambda _, e: e["child_exited"] > 0)
        assert not alive(first)  # reaped at once, not left a zombie
        assert not only(cycle).up and only(cycle).power_watts is None  # nothing stale served
        cycle = c.until(serving)
        assert c.restarts == 1 and c.errors == {"child_exited": 1}
        assert [mode for _, mode, _ in fake.runs()] == ["crash", "replay"]
        assert only(cycle).power_watts == recorded("v0.7-m1max-soc.jsonl")["gpu_power"]


def test_a_silent_child_is_killed_after_three_intervals(fake: Fake) -> None:
    fake.mode("hang,replay")
    with fake.opened() as c:
        (hung, _, _), = fake.runs()
        c.until(serving)
        t0 = time.monotonic()
        cycle = c.until(lambda _, e: e["child_hung"] > 0)
        assert time.monotonic() - t0 <= 4 * INTERVAL + 0.5
        assert not alive(hung)
        assert not only(cycle).up
        cycle = c.until(serving)
        assert c.restarts == 1 and c.errors == {"child_hung": 1}


def test_garbage_lines_are_counted_and_a_child_printing_only_garbage_is_replaced(
        fake: Fake) -> None:
    fake.mode("garbage,replay")
    with fake.opened() as c:
        (garbled, _, _), = fake.runs()
        c.until(lambda _, e: e["child_hung"] > 0)
        assert c.errors["child_garbage"] >= 2  # one per line, while it kept printing them
        assert not alive(garbled)
        c.until(serving)
        assert c.restarts == 1


def test_restarts_back_off_while_the_child_keeps_failing(fake: Fake) -> None:
    fake.mode("crash")  # every run: one line, then exit 1
    with fake.opened() as c, capture_logs() as logs:  # back-off 0.3 s, then 1 s
        c.until(lambda _, e: e["child_exited"] >= 3, timeout=15)
    failed = [e for e in logs if e["event"] == "macmon child failed"]
    (logged,) = failed  # once, not 3x
    assert logged["reason"] == "child_exited: status 1: fake macmon: crashing as " \
        "FAKE_MACMON_MODE asked"
    starts = [when for _, _, when, _ in fake.started()]
    assert len(starts) == 3 and c.restarts == 2
    # each run lives ~2 intervals; the wait before the next grows 0.3 s -> 1 s
    first_gap, second_gap = starts[1] - starts[0], starts[2] - starts[1]
    assert second_gap > first_gap + 0.35, starts


def test_a_child_that_dies_before_its_first_line_makes_the_backend_unavailable(
        fake: Fake) -> None:
    fake.mode("crash", after=0)
    b = fake.backend()
    with pytest.raises(BackendUnavailable, match="status 1: fake macmon: crashing"):
        b.open()


@pytest.mark.parametrize("path", ["/nonexistent/macmon", "no-such-macmon-on-path",
                                  str(LINES / "SOURCES.md")])  # a file, not executable
def test_no_macmon_executable_makes_the_backend_unavailable(fake: Fake, path: str) -> None:
    with pytest.raises(BackendUnavailable, match="macmon not found"):
        fake.backend(path).open()


def test_close_kills_and_reaps_the_child(fake: Fake) -> None:
    b = fake.backend()
    b.open()
    (pid, _, _), = fake.runs()
    assert alive(pid)
    b.close()
    assert not alive(pid) and not zombie_children()
    b.close()  # twice is harmless


def gone(pid: int) -> bool:
    """Exited and reaped. A killed grandchild is reaped by whoever adopted it: init, or
    this process where it is pid 1 (a container without an init)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return not alive(pid)


def all_gone(pids: list[int], timeout: float = 5.0) -> bool:
    """Every pid gone within ``timeout``: SIGKILL is sent, the adoptive reaping follows."""
    deadline = time.monotonic() + timeout
    while not all(gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wrapper(tmp_path: Path) -> Path:
    """A ``--macmon.path`` script that runs macmon as its child (no ``exec``)."""
    script = tmp_path / "macmon-wrapper"
    script.write_text(f'#!/bin/sh\n"{FAKE}" "$@"\nstatus=$?\necho "macmon exited" >&2\n'
                      'exit $status\n')
    script.chmod(0o755)
    return script


def test_a_wrapper_that_does_not_exec_leaves_no_macmon_behind(
        fake: Fake, tmp_path: Path) -> None:
    """Killing only the wrapper left macmon running with the pipe, its two reader
    threads and their fds: threads 10 -> 18, fds 15 -> 23 over 90 s, 7 macmon left
    after exit. The child's whole process group goes on every restart and on close."""
    threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
    fake.mode("hang,hang,replay")
    b = AppleBackend(Config(interval=INTERVAL, macmon_path=str(wrapper(tmp_path))),
                     backoff=(0.3, 1.0))
    b.open()
    try:
        c = Collector(b)
        c.until(lambda _, e: e["child_hung"] >= 2, timeout=15)
        hung = [pid for pid, mode, _ in fake.runs() if mode == "hang"]
        assert len(hung) == 2 and all_gone(hung)
        c.until(serving)
    finally:
        b.close()
    assert all_gone([pid for pid, _, _ in fake.runs()])
    assert threading.active_count() == threads
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_child_silent_from_the_start_reports_no_gpu_then_is_replaced(fake: Fake) -> None:
    fake.mode("hang,replay", after=0)
    with fake.opened() as c:  # open() returns once the first-line wait is over
        assert c.sample().devices == ()  # nothing is known yet: no series, not a lost GPU
        c.until(serving)
        assert c.errors == {"child_hung": 1} and c.restarts == 1
