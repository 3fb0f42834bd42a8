"""A crash is in the log of the next start: the real daemon killed by SIGSEGV and restarted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.app.lastrun import CRASH_FILE, RUN_FILE, RunRecord, crash_summary, state_dir
from tests.daemon import FIXTURES, machine_args, running

pytestmark = pytest.mark.slow
MACHINE = FIXTURES / "amd-rdna3-rx7800xt"


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


def test_an_unusable_state_directory_is_one_warning_and_the_daemon_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = [*machine_args(MACHINE), "--path.state", str(blocker / "state")]
    with running(args, tmp_path) as daemon:
        assert daemon.get().status_code == 200
        assert len(daemon.records("state directory unusable: the next start cannot say how "
                                  "this run ended")) == 1


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
