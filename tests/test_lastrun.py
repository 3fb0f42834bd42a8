"""A crash is in the log of the next start: the real daemon killed by SIGSEGV and restarted.
The state directory is untrusted input: FIFOs, symlinks and odd records in it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from structlog.testing import capture_logs

from exporter.app.lastrun import (
    CRASH_FILE,
    RUN_FILE,
    Previous,
    RunRecord,
    crash_summary,
    state_dir,
)
from tests.daemon import FIXTURES, machine_args, running

MACHINE = FIXTURES / "amd-rdna3-rx7800xt"
T = TypeVar("T")


@pytest.mark.slow
def test_a_segfault_is_logged_by_the_next_start_and_a_clean_stop_is_not(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = [*machine_args(MACHINE), "--path.state", str(state)]
    with running(args, tmp_path) as first:
        first.proc.send_signal(signal.SIGSEGV)  # what a vendor library's crash does
        assert first.proc.wait(10) == -signal.SIGSEGV
    assert "Segmentation fault" in (state / CRASH_FILE).read_text()
    with running(args, tmp_path) as second:
        (warning,) = second.records("previous run ended without a clean stop")
    assert warning["level"] == "warning" and warning["pid"] == first.proc.pid
    assert str(warning["crash"]).startswith("Fatal Python error: Segmentation fault")
    assert warning["starts_last_hour"] == 2
    assert isinstance(warning["ran_seconds"], float) and warning["ran_seconds"] >= 0
    # The second run stopped on SIGTERM: the third start has nothing to say.
    assert json.loads((state / RUN_FILE).read_text())["clean"] is True
    with running(args, tmp_path) as third:
        assert third.records("previous run ended without a clean stop") == []
    assert len(json.loads((state / RUN_FILE).read_text())["starts"]) == 3


@pytest.mark.slow
def test_an_unusable_state_directory_is_one_warning_and_the_daemon_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = [*machine_args(MACHINE), "--path.state", str(blocker / "state")]
    with running(args, tmp_path) as daemon:
        assert daemon.get().status_code == 200
        assert len(daemon.records("state directory unusable: the next start cannot say how "
                                  "this run ended")) == 1


@pytest.mark.slow
def test_the_summary_of_a_real_crash_inside_a_c_call(tmp_path: Path) -> None:
    """faulthandler's own output for a SIGSEGV in a ctypes call (as in a driver library)."""
    crash = tmp_path / "crash.txt"
    code = (f"import ctypes, faulthandler; f = open({str(crash)!r}, 'wb'); "
            "faulthandler.enable(file=f, all_threads=True)\n"
            "def read():\n    ctypes.string_at(0)\nread()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert done.returncode == -signal.SIGSEGV
    summary = crash_summary(crash.read_text())
    assert summary.startswith("Fatal Python error: Segmentation fault; File ")
    assert summary.endswith("in string_at")  # the innermost frame: the C call


def test_systemds_state_directory_is_the_default() -> None:
    assert state_dir(None, {"STATE_DIRECTORY": "/var/lib/gpu-exporter:/var/lib/other"}) == \
        "/var/lib/gpu-exporter"
    assert state_dir("/srv/x", {"STATE_DIRECTORY": "/var/lib/gpu-exporter"}) == "/srv/x"
    assert state_dir(None, {}) is None


def test_a_corrupt_record_reads_as_no_record(tmp_path: Path) -> None:
    (tmp_path / RUN_FILE).write_text("{not json")
    record = RunRecord(str(tmp_path))
    previous = record.start(now=1000.0)
    record.stop()
    assert previous is not None and previous.clean and previous.starts_last_hour == 1
    assert json.loads((tmp_path / RUN_FILE).read_text())["clean"] is True


def _ignored(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if e["event"] == "state file ignored"]


def _unblocked(call: Callable[[], T], fifo: Path) -> tuple[T | None, bool]:
    """call() on its own thread: (what it returned, whether it ever blocked). A call
    blocked in open() on ``fifo`` is freed by opening the FIFO's other end, so that the
    test ends either way."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(5)
    blocked = thread.is_alive()
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline:
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            try:
                os.close(os.open(fifo, flags))
            except OSError:
                pass
        thread.join(0.05)
    return (out[0] if out else None), blocked


@pytest.mark.parametrize("name", [CRASH_FILE, RUN_FILE, RUN_FILE + ".tmp"])
def test_a_fifo_in_the_state_directory_blocks_nothing(tmp_path: Path, name: str) -> None:
    os.mkfifo(tmp_path / name)
    record = RunRecord(str(tmp_path))
    with capture_logs() as logs:
        previous, blocked = _unblocked(lambda: record.start(now=1000.0), tmp_path / name)
    assert not blocked, f"start() blocked in open() on the FIFO {name}"
    assert _unblocked(record.stop, tmp_path / name)[1] is False
    assert previous is not None and previous.clean and previous.starts_last_hour == 1
    assert len(_ignored(logs)) == (0 if name.endswith(".tmp") else 1)
    for state in (RUN_FILE, CRASH_FILE):  # both are this run's regular files now
        assert stat.S_ISREG((tmp_path / state).lstat().st_mode)
    assert json.loads((tmp_path / RUN_FILE).read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("content", [
    '{"starts": 5}', '{"starts": null}', '{"starts": "abc"}', '{"starts": [1, "x"]}',
    '{"started": "yesterday"}', '{"pid": true}', '{"clean": "no"}', '{"started": NaN}',
    "[" * 1001 + "]" * 1001,  # deeper than the interpreter's stack
    '"run"', "x" * (64 * 1024 + 1),
], ids=lambda c: c[:20])
def test_an_oddly_shaped_record_is_discarded_with_one_warning(tmp_path: Path,
                                                             content: str) -> None:
    (tmp_path / RUN_FILE).write_text(content)
    record = RunRecord(str(tmp_path))
    with capture_logs() as logs:
        previous = record.start(now=1000.0)
    record.stop()
    assert previous == Previous(clean=True, pid=None, ran_seconds=None, crash="",
                                starts_last_hour=1)
    (warning,) = _ignored(logs)
    assert warning["path"] == str(tmp_path / RUN_FILE) and warning["log_level"] == "warning"
    assert [e["event"] for e in logs] == ["state file ignored"]  # nothing else said
    written = json.loads((tmp_path / RUN_FILE).read_text())  # rewritten: no crash loop
    assert written == {"pid": os.getpid(), "started": 1000.0, "clean": True,
                       "starts": [1000.0]}


def test_a_well_formed_record_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / RUN_FILE).write_text(json.dumps(
        {"pid": 4242, "started": 900.0, "clean": False, "starts": [-3000.0, 800, 900.0],
         "later": "a field a newer version may add"}))
    record = RunRecord(str(tmp_path))
    with capture_logs() as logs:
        previous = record.start(now=1000.0)
    record.stop()
    assert previous == Previous(clean=False, pid=4242, ran_seconds=100.0, crash="",
                                starts_last_hour=3)  # -3000.0 is older than the hour
    assert [e["event"] for e in logs] == ["previous run ended without a clean stop"]


def test_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    victims = {name: tmp_path / f"victim-{name}" for name in
               (CRASH_FILE, RUN_FILE, RUN_FILE + ".tmp")}
    for name, victim in victims.items():
        victim.write_text('{"pid": 7, "started": 1.0, "clean": false}')
        (state / name).symlink_to(victim)
    record = RunRecord(str(state))
    with capture_logs() as logs:
        previous = record.start(now=1000.0)
    record.stop()
    for victim in victims.values():  # neither truncated nor overwritten
        assert victim.read_text() == '{"pid": 7, "started": 1.0, "clean": false}'
    assert previous is not None and previous.pid is None  # run.json's link not read
    assert sorted(str(e["path"]) for e in _ignored(logs)) == \
        [str(state / CRASH_FILE), str(state / RUN_FILE)]
    for name in (CRASH_FILE, RUN_FILE):  # the links replaced by this run's own files
        assert stat.S_ISREG((state / name).lstat().st_mode)
    assert json.loads((state / RUN_FILE).read_text())["pid"] == os.getpid()
    assert (state / (RUN_FILE + ".tmp")).is_symlink()  # a name never written to


@pytest.mark.slow
def test_the_daemon_serves_with_a_fifo_in_its_state_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / CRASH_FILE)
    os.mkfifo(state / RUN_FILE)
    with running([*machine_args(MACHINE), "--path.state", str(state)], tmp_path) as daemon:
        assert daemon.get().status_code == 200
        assert len(daemon.records("state file ignored")) == 2
