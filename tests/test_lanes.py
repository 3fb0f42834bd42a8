"""The lanes' checks (tests/lanes.py), run on tests of their own in a pytest of their own:
a test without the slow mark that starts a process fails in any run, and one that takes
over ``fast_lane_seconds`` fails the fast lane only."""

from __future__ import annotations

import pytest

from tests.daemon import REPO
from tests.lanes import fast_lane, runqueue_seconds

TESTS = '''
import subprocess
import time

import pytest


def test_unmarked_starts_a_process():
    subprocess.run(["true"], check=True)


def test_unmarked_swallows_the_refusal():
    try:
        subprocess.run(["true"])
    except BaseException:
        pass


@pytest.mark.slow
def test_marked_starts_a_process():
    subprocess.run(["true"], check=True)


def test_unmarked_takes_over_a_second():
    time.sleep(1.2)


def test_unmarked_is_quick():
    pass
'''


@pytest.fixture()
def lanes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow lane\n")
    pytester.makepyfile(test_x=TESTS)
    return pytester


@pytest.mark.slow  # a pytest process
def test_a_process_started_without_the_mark_fails_in_every_run(
        lanes: pytest.Pytester) -> None:
    result = lanes.runpytest_subprocess("-p", "tests.lanes", "-p", "no:cacheprovider", "-ra")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines_random([
        "FAILED test_x.py::test_unmarked_starts_a_process*",
        "FAILED test_x.py::test_unmarked_swallows_the_refusal*",
        "*test_unmarked_starts_a_process starts a process (subprocess ?'true'?) but is not "
        "marked slow: add @pytest.mark.slow*"])


@pytest.mark.slow  # pytest processes
def test_over_a_second_fails_the_fast_lane_only(lanes: pytest.Pytester) -> None:
    fast = lanes.runpytest_subprocess("-p", "tests.lanes", "-p", "no:cacheprovider",
                                      "-m", "not slow", "-k", "second or quick")
    fast.assert_outcomes(passed=1, failed=1)
    fast.stdout.fnmatch_lines(["*test_unmarked_takes_over_a_second took 1.* s in the fast "
                               "lane (at most 1 s, fast_lane_seconds; not counted: *"])
    slow_allowed = lanes.runpytest_subprocess("-p", "tests.lanes", "-p", "no:cacheprovider",
                                              "-m", "not slow", "-k", "second or quick",
                                              "-o", "fast_lane_seconds=3")
    slow_allowed.assert_outcomes(passed=2)
    everything = lanes.runpytest_subprocess("-p", "tests.lanes", "-p", "no:cacheprovider",
                                            "-k", "second or quick")
    everything.assert_outcomes(passed=2)


def test_time_waiting_for_a_cpu_is_read_and_grows_only() -> None:
    first = runqueue_seconds()
    assert first >= 0 and runqueue_seconds() >= first


@pytest.mark.parametrize("markexpr, fast", [
    ("not slow", True), ("not slow and not golden", True), ("golden and not slow", True),
    ("", False), ("golden", False), ("slow", False), ("not golden", False),
    ("hardware", False),
])
def test_the_fast_lane_is_any_selection_without_slow_tests(markexpr: str, fast: bool) -> None:
    assert fast_lane(markexpr) is fast
