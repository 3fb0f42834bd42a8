"""The NVIDIA backend against what a driver or a host can hand it: a wall clock stepped
back or forward, a sample stamped in the future, pid 0, memory past the GPU's total, a
pid whose /proc entry went, thousands of MPS clients."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.core.config import Config
from exporter.core.model import ProcessSample
from exporter.sources.nvidia import processes as nvml_processes
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.processes import ProcessReader
from tests.fakes.fake_nvml import FakeGPU, FakeNVML, FakeProcess
from tests.test_energy_defaults import SLOW, A, B, Daemon

DAY = 86_400.0
GIB = 1 << 30


def backend(fake: FakeNVML, procfs: Path | str = "/nonexistent") -> NvidiaBackend:
    b = NvidiaBackend(Config(procfs=str(procfs)), fake)
    b.open()
    return b


def sm(d: Daemon, pid: int) -> float | None:
    p = {p.pid: p for p in d.devices[0].processes}[pid]
    return p.utilization_ratio.get("sm")


@pytest.mark.parametrize("step", [-DAY, DAY])
def test_a_clock_step_leaves_utilisation_and_energy_right_after_one_cycle(
        monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    """The reader kept the largest timestamp NVML ever gave: after the wall clock went
    back, every sample was older than that and per-process utilisation vanished for as
    long as the step; the busy process's energy went to idle meanwhile."""
    d = Daemon(1, monkeypatch)
    monkeypatch.setattr(ProcessReader, "wall", staticmethod(d.nvml.wall))
    d.nvml.busy(0, A, 2, 400)  # B stays idle throughout
    d.run_until(95)
    assert sm(d, A) == pytest.approx(0.87, abs=0.02)
    d.nvml.wall_step = step  # NTP steps the host's clock between two cycles
    errors_before = dict(d.backend.sample(False).errors)
    assert errors_before == {}
    d.run_until(110)  # the next slow cycle (100 s) reads across the step, the one after is clean
    assert sm(d, A) == pytest.approx(0.87, abs=0.02)
    before = {p.pid: p.energy_joules or 0.0 for p in d.devices[0].processes}
    d.run_until(110 + 3 * 30 + 1)  # three energy windows (the counter is read every 30 s)
    after = {p.pid: p.energy_joules or 0.0 for p in d.devices[0].processes}
    gained = after[A] - before[A]
    assert gained == pytest.approx(90 * d.nvml.busy_watts, rel=0.15)
    assert after[B] == before[B] == 0.0
    assert sm(d, A) == pytest.approx(0.87, abs=0.02)


def test_a_sample_stamped_in_the_future_is_dropped_and_does_not_silence_the_reader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_760_000_000.0]
    monkeypatch.setattr(ProcessReader, "wall", staticmethod(lambda: now[0]))
    monkeypatch.setattr(ProcessReader, "mono", staticmethod(lambda: now[0] - 1_760_000_000.0))
    worker = FakeProcess(pid=77, used_memory_bytes=GIB, sm_util=60)
    b = backend(FakeNVML([FakeGPU(processes=[worker])]))
    seen = []
    for ahead in (0, 10**12, 0, 0):  # one sample stamped 11.6 days ahead
        worker.stamp_ahead_us = ahead
        now[0] += SLOW
        cycle = b.sample(slow=True)
        (p,) = cycle.devices[0].processes
        seen.append((p.utilization_ratio.get("sm"), cycle.errors.get("clock", 0)))
    assert seen == [(0.6, 0), (None, 1), (0.6, 0), (0.6, 0)]


def test_pid_zero_and_pids_out_of_range_are_dropped_and_counted() -> None:
    fake = FakeNVML([FakeGPU(processes=[
        FakeProcess(pid=0, used_memory_bytes=GIB), FakeProcess(pid=1 << 23, used_memory_bytes=GIB),
        FakeProcess(pid=4242, used_memory_bytes=GIB)])])
    cycle = backend(fake).sample(slow=True)
    assert [p.pid for p in cycle.devices[0].processes] == [4242]
    assert cycle.errors == {"implausible": 2}


def test_process_memory_past_the_gpus_total_is_dropped_and_counted() -> None:
    gpu = FakeGPU(processes=[FakeProcess(pid=10, used_memory_bytes=2**62),
                             FakeProcess(pid=11, used_memory_bytes=2**63 - 1),
                             FakeProcess(pid=12, used_memory_bytes=4 * GIB)])
    cycle = backend(FakeNVML([gpu])).sample(slow=True)
    memory = {p.pid: p.memory_used_bytes for p in cycle.devices[0].processes}
    assert memory == {10: None, 11: None, 12: 4.0 * GIB}
    assert cycle.errors == {"implausible": 2}


def test_a_pid_gone_from_proc_keeps_its_name(tmp_path: Path) -> None:
    """NVML still lists a pid whose /proc entry went: its ``process`` label changed from
    its comm to NVML's name, ending its series (and its energy) for another."""
    d = tmp_path / "proc" / "4321"
    d.mkdir(parents=True)
    (d / "comm").write_bytes(b"vanisher\n")
    (d / "stat").write_text("4321 (vanisher) S " + " ".join(["0"] * 18) + " 777 0 0\n")
    fake = FakeNVML([FakeGPU(processes=[FakeProcess(pid=4321, used_memory_bytes=GIB,
                                                    name="/usr/bin/python3")])])
    b = backend(fake, tmp_path / "proc")
    names = [b.sample(slow=True).devices[0].processes[0].process]
    for child in d.iterdir():
        child.unlink()
    d.rmdir()
    names += [b.sample(slow=slow).devices[0].processes[0].process for slow in (True, False)]
    assert names == ["vanisher"] * 3


def test_thousands_of_mps_clients_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_processes, "MAX_PROCESSES", 8)
    clients = [FakeProcess(pid=1000 + i, used_memory_bytes=(i + 1) * (1 << 20), mps=True)
               for i in range(20)]
    b = backend(FakeNVML([FakeGPU(processes=clients)]))
    for _ in range(2):
        cycle = b.sample(slow=True)
        rows: tuple[ProcessSample, ...] = cycle.devices[0].processes
        assert [p.pid for p in rows] == list(range(1019, 1011, -1))  # the most memory first
        assert cycle.errors == {"table_full": 12}
    reader = b._gpus[0].procs
    assert max(len(reader._names), len(reader._rss), len(reader._owners)) == 8


def test_xid_codes_are_bounded_per_gpu_past_which_they_count_as_other() -> None:
    """Every code up to 0xFFFF was kept per GPU: 3,000 odd codes from the driver made
    6,001 gpu_xid_* series on one GPU (787 KB of /metrics)."""
    from exporter.core.xid import MAX_CODES, OTHER
    from exporter.output.render.families import RenderOptions, device_families
    from exporter.pipeline.health import evaluate
    from exporter.pipeline.state import Snapshot

    codes = [1001 + 2 * i for i in range(3000)]
    b = backend(FakeNVML([FakeGPU(xids=[*codes, 79, codes[0]])]))
    for _ in range(4):  # 1,024 events a cycle at most
        d = b.sample(slow=True).devices[0]
    assert len(d.xid_errors) == MAX_CODES + 2  # the marker 0, the first codes, other
    assert d.xid_errors[OTHER] == 3000 - MAX_CODES + 1  # 79 came after the bound too
    assert d.xid_errors[codes[0]] == 2  # a code counted before goes on under its own
    assert d.xid_last == codes[0]
    assert ((OTHER, f"codes past the first {MAX_CODES} of this GPU")) in d.xid_info
    s = Snapshot(generation=1, created=0.0, ready=True, backends=(), gpu_index={},
                 devices=(("0", d),))
    series = {f.name: [smp.labels for smp in f.samples]
              for f in device_families(s, RenderOptions())}
    errors = series["gpu_xid_errors"]
    assert len(errors) == MAX_CODES + 2 and len(series["gpu_xid_info"]) == MAX_CODES + 1
    assert sum(labels["xid"] == "other" for labels in errors) == 1
    reasons = [f.reason for f in evaluate(d, max(d.xid_seen_seconds.values())).findings]
    assert f"XID other: codes past the first {MAX_CODES} of this GPU" in reasons


_steps = st.lists(st.tuples(st.floats(0.5, 30.0), st.sampled_from([0.0, 0.0, -DAY, DAY, -3.0]),
                            st.sampled_from([0, 0, 10**12, -5 * 10**6])), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_steps)
def test_no_clock_step_or_stamp_silences_the_reader_past_one_cycle(
        steps: list[tuple[float, float, int]]) -> None:
    """Whatever the wall clock does (steps of a day either way, a few seconds back) and
    whatever the driver stamps (in the future, in the past), a read whose stamps are
    sane after a read that was gives the process's utilisation, and nothing is ever
    out of range."""
    clock = {"wall": 1_760_000_000.0, "mono": 5_000.0}
    worker = FakeProcess(pid=77, used_memory_bytes=GIB, sm_util=50)
    with patch.object(ProcessReader, "wall", staticmethod(lambda: clock["wall"])), \
            patch.object(ProcessReader, "mono", staticmethod(lambda: clock["mono"])):
        b = backend(FakeNVML([FakeGPU(processes=[worker])]))
        sane_before = True
        for dt, jump, ahead in steps:
            clock["mono"] += dt
            clock["wall"] += dt + jump
            worker.stamp_ahead_us = ahead
            (p,) = b.sample(slow=True).devices[0].processes
            ratio = p.utilization_ratio.get("sm")
            assert ratio is None or 0.0 <= ratio <= 1.0
            sane = jump == 0.0 and ahead == 0
            if sane and sane_before:
                assert ratio == 0.5
            sane_before = ahead == 0  # a step between two reads is the next read's
