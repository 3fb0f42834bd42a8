"""The fdinfo backend against hostile or broken input: bounded state, implausible
counters, processes missing from one listing, names fixed at first sight."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.sources.fdinfo import backend as fdinfo_backend
from exporter.sources.fdinfo import scan as fdinfo_scan
from tests.test_fdinfo import Clock, amd, backend, drm_fd, gpu, only_device, proc, started

U64_MAX = 2**64 - 1


def test_clients_past_the_bound_are_counted_never_kept(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """160,000 clients (any local user can open a render node) grew the daemon past the
    chart's memory limit: the backend now follows MAX_CLIENTS at most, counts the rest
    at every scan, and keeps following the clients it had."""
    monkeypatch.setattr(fdinfo_scan, "MAX_CLIENTS", 4)
    monkeypatch.setattr(fdinfo_backend, "MAX_CLIENTS", 4)
    clock = Clock()
    gpu(tmp_path)
    first = proc(tmp_path, 10, b"first")
    for fd, cid in ((3, 1), (4, 2)):
        drm_fd(first, fd, amd(cid=cid, gfx_ns=1_000_000_000))
    b = backend(tmp_path, clock)
    assert b.sample(slow=False).errors == {}
    flood = proc(tmp_path, 20, b"flood")
    for fd in range(3, 13):  # ten more clients
        drm_fd(flood, fd, amd(cid=100 + fd, gfx_ns=0))
    for _ in range(3):
        clock.now += 1.0
        drm_fd(first, 3, amd(cid=1, gfx_ns=1_000_000_000 + int(clock.now - 1000) * 10**8))
        cycle = b.sample(slow=False)
        # The scan kept 4 (2 known + 2 new), the backend had room for 2 of them.
        assert cycle.errors == {"table_full": 8}
        assert len(b._clients) == 4
        d = only_device(cycle.devices)
        assert {p.pid for p in d.processes} == {10, 20}
    # One scan alone holds no more than the bound of clients nobody follows.
    cards = b._known_cards()
    assert cards is not None
    alone = b.scanner.scan(b.scanner.pids(), clock() + 10, cards)
    assert (len(alone.clients), alone.errors) == (4, {"table_full": 8})
    # The first process's client was never cut: its counter went on.
    p10 = {p.pid: p for p in only_device(b.sample(slow=False).devices).processes}[10]
    assert p10.engine_busy_seconds["gfx"] == pytest.approx(2.3)


def test_one_garbled_counter_neither_jumps_nor_stops_the_count(tmp_path: Path) -> None:
    """One read of 18446744073709551615 ns added 584 years to the process's counter,
    which then never counted again for that client's life (the larger value was held)."""
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10)
    b = backend(tmp_path, clock)
    seen = []
    for gfx in (10**9, 2 * 10**9, U64_MAX, 3 * 10**9, 4 * 10**9):
        drm_fd(d, 3, amd(cid=5, gfx_ns=gfx))
        cycle = b.sample(slow=False)
        (p,) = only_device(cycle.devices).processes
        seen.append((p.engine_busy_seconds["gfx"], cycle.errors.get("implausible", 0)))
        clock.now += 1.0
    assert seen == [(1.0, 0), (2.0, 0), (2.0, 1), (3.0, 0), (4.0, 0)]


def test_a_counter_that_really_jumped_is_followed_after_two_reads(tmp_path: Path) -> None:
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10)
    b = backend(tmp_path, clock)
    seen = []
    for gfx in (10**9, 10**18, 10**18 + 10**8, 10**18 + 5 * 10**8):
        drm_fd(d, 3, amd(cid=5, gfx_ns=gfx))
        cycle = b.sample(slow=False)
        (p,) = only_device(cycle.devices).processes
        seen.append((p.engine_busy_seconds["gfx"], dict(p.utilization_ratio),
                     cycle.errors.get("implausible", 0)))
        clock.now += 1.0
    assert seen == [(1.0, {}, 0), (1.0, {}, 1), (1.0, {}, 1),
                    (pytest.approx(1.4), {"gfx": pytest.approx(0.4)}, 0)]


def test_a_process_missing_from_one_listing_keeps_its_counter(tmp_path: Path) -> None:
    """A live process missing from one /proc listing came back with its busy counter at
    0 under the same labels: a counter that went back."""
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10, comm=b"worker")
    started(d, 1000)
    drm_fd(d, 3, amd(cid=1, gfx_ns=5 * 10**9))
    b = backend(tmp_path, clock)
    assert only_device(b.sample(slow=False).devices).processes[0].engine_busy_seconds == \
        {"gfx": 5.0}
    hidden = tmp_path / "proc" / ".10"
    os.rename(d, hidden)  # one listing without it
    clock.now += 1.0
    assert only_device(b.sample(slow=False).devices).processes == ()
    os.rename(hidden, d)
    drm_fd(d, 3, amd(cid=1, gfx_ns=6 * 10**9))
    clock.now += 1.0
    (p,) = only_device(b.sample(slow=False).devices).processes
    assert (p.pid, p.process, p.engine_busy_seconds) == (10, "worker", {"gfx": 6.0})


def test_the_process_name_is_fixed_at_first_sight(tmp_path: Path) -> None:
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10, comm=b"trainer")
    started(d, 1000)
    drm_fd(d, 3, amd(cid=1, gfx_ns=10**9))
    b = backend(tmp_path, clock)
    assert only_device(b.sample(slow=False).devices).processes[0].process == "trainer"
    (d / "comm").write_bytes(b"renamed\n")  # prctl(PR_SET_NAME) mid-run
    clock.now += 1.0
    assert only_device(b.sample(slow=False).devices).processes[0].process == "trainer"
    started(d, 2000, "renamed")  # another process under that pid: named anew
    clock.now += 1.0
    assert only_device(b.sample(slow=False).devices).processes[0].process == "renamed"


def test_the_pids_whose_failures_were_counted_are_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``vanished`` and ``permission`` count a process once while it lives, which needs a
    table of pids: past its bound a failure counts at every scan instead of growing it."""
    monkeypatch.setattr(fdinfo_scan, "MAX_COUNTED_PIDS", 2)
    gpu(tmp_path)
    for pid in range(20, 24):  # four processes whose fd directory cannot be read
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    b = backend(tmp_path)
    counts = [b.sample(slow=False).errors.get("vanished", 0) for _ in range(3)]
    assert counts == [4, 2, 2]
    assert len(b.scanner._counted) == 2
