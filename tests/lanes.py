"""The test lanes (a pytest plugin that tests/conftest.py loads): ``slow`` marks,
explicitly (``@pytest.mark.slow``, or a module's ``pytestmark``), every test that starts
a process (the exporter, promtool, Prometheus, a browser, tmux, podman, ``helm``, pip)
or takes more than a second; ``pytest -m "not slow"`` is the fast lane, CI runs both.

The marks cannot drift: a test without the mark that starts a process (through the
harness, subprocess, asyncio, a fork, a library that runs ``ldconfig``) fails there and
then, in every run; and in the fast lane a test whose setup and call take longer than
``fast_lane_seconds`` (pyproject.toml: 1 s) fails. The time is the test's own: what the
test's thread spent waiting for a CPU that other processes held (a machine busy with other
work; Linux's schedstat) is not counted; ``-o fast_lane_seconds=3`` where even that is too
strict. tests/test_lanes.py runs both checks on tests of its own.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Generator
from typing import Any

import pytest

LIMIT = "fast_lane_seconds"
_fast_lane = pytest.StashKey[bool]()
_seconds = pytest.StashKey[float]()
_waiting = pytest.StashKey[float]()
_started: list[str] = []  # what a test without the slow mark tried to start
_unmarked: pytest.Item | None = None  # the running test, while it has no slow mark
_real: list[tuple[Any, str, Callable[..., Any]]] = []  # what pytest_configure replaced


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(LIMIT, "in the fast lane (-m 'not slow'), the most seconds a test may take "
                  "(setup and call)", default="1")


def runqueue_seconds() -> float:
    """How long this thread has waited, runnable, for a CPU (0 where the kernel does not
    say: then the whole time counts)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def fast_lane(markexpr: str) -> bool:
    """Whether ``-m markexpr`` leaves out every slow test: one marked slow only, and one
    with every other mark as well ("golden" keeps the slow goldens: not the fast lane)."""
    if not markexpr:
        return False
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)

        def only_slow(name: str, /, **kwargs: str | int | bool | None) -> bool:
            return name == "slow"

        def every_mark(name: str, /, **kwargs: str | int | bool | None) -> bool:
            return True

        return not expression.evaluate(only_slow) and not expression.evaluate(every_mark)
    except Exception:  # pytest's parser moved: the common spelling
        return "not slow" in markexpr


def _refuse(what: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _unmarked is not None:
            shown = args[1] if what == "subprocess" and len(args) > 1 else args[:1]
            _started.append(f"{what} {shown!r}")
            pytest.fail(f"{_unmarked.nodeid} starts a process ({what} {shown!r}) but is not "
                        "marked slow: add @pytest.mark.slow (tests/lanes.py)", pytrace=False)
        return real(*args, **kwargs)
    return guarded


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_fast_lane] = fast_lane(config.getoption("markexpr", "") or "")
    # Every way a test starts a process: subprocess (the harness's daemon, tools, asyncio's
    # subprocesses), a fork (multiprocessing, pty), os.system, posix_spawn.
    popen: Any = subprocess.Popen
    _real.append((popen, "_execute_child", popen._execute_child))
    _real.extend((os, name, getattr(os, name)) for name in (
        "fork", "forkpty", "system", "posix_spawn", "posix_spawnp") if hasattr(os, name))
    for owner, name, real in _real:
        setattr(owner, name, _refuse("subprocess" if owner is popen else f"os.{name}", real))


def pytest_unconfigure(config: pytest.Config) -> None:
    while _real:
        owner, name, real = _real.pop()
        setattr(owner, name, real)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    _started.clear()
    item.stash[_waiting] = runqueue_seconds()
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


def _guarded(item: pytest.Item) -> Generator[None, None, None]:
    """The phase, with process starts refused unless the test is marked slow (teardown is
    not guarded: a module's fixture that a slow test used may end its process there)."""
    global _unmarked
    _unmarked = None if item.get_closest_marker("slow") else item
    try:
        return (yield)
    finally:
        _unmarked = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    if call.when == "setup":
        item.stash[_seconds] = call.duration
    if call.when != "call" or not report.passed:
        return report
    if _started:  # refused, and the test swallowed the failure
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} starts a process ({_started[0]}) but is not "
                           "marked slow: add @pytest.mark.slow (tests/lanes.py)")
        return report
    waited = runqueue_seconds() - item.stash.get(_waiting, 0.0)
    seconds = item.stash.get(_seconds, 0.0) + call.duration - waited
    limit = float(item.config.getini(LIMIT))
    if item.config.stash[_fast_lane] and seconds > limit:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {seconds:.2f} s in the fast lane (at most "
                           f"{limit:g} s, fast_lane_seconds; not counted: {waited:.2f} s "
                           "waiting for a CPU): make it faster or mark it slow")
    return report
