"""bench/energy_split.py without a GPU: its harness and checks against the fake NVML.

The bench's own scenario runner drives fake workers that switch their process's NVML
per-process SM sample on for the time they are told to be busy, with the exporter's
Hub (and its energy split) running on short intervals; the checks must pass on what
such workers do and fail on a split that is wrong.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.pipeline.energy_split import Window
from tests.fakes.fake_nvml import FakeGPU, FakeNVML, FakeProcess

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("energy_bench", REPO / "bench" / "energy_split.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
sys.modules["energy_bench"] = bench
spec.loader.exec_module(bench)


class TimedNVML(FakeNVML):
    """The fake NVML with an energy counter that grows with time (constant power), as a
    real one does, rather than by a step per read."""

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        super().nvmlDeviceGetTotalEnergyConsumption(h)  # its checks and call count
        return int(h.gpu.power_mw * time.monotonic())


class FakeWorker:
    """A worker whose NVML process has an SM sample only while it is busy."""

    def __init__(self, process: FakeProcess, sm: int = 90) -> None:
        self.process, self.sm, self.pid = process, sm, process.pid
        self._thread: threading.Thread | None = None

    def go(self, seconds: float) -> None:
        done = threading.Event()

        def run() -> None:
            self.process.sm_util = self.sm
            done.wait(seconds)
            self.process.sm_util = None

        self._thread = threading.Thread(target=run)
        self._thread.start()

    def wait_done(self) -> tuple[int, float]:
        assert self._thread is not None
        self._thread.join()
        return 0, 0.0

    def stop(self) -> None:
        pass


@pytest.mark.slow  # seconds of simulated scenarios
def test_the_scenarios_pass_on_a_split_that_follows_the_samples() -> None:
    a, b = FakeProcess(4100, 1 << 30), FakeProcess(4200, 1 << 30)
    fake = TimedNVML([FakeGPU(processes=[a, b])])
    h = bench.Harness(fake, 0, interval=0.1, slow_interval=0.1)
    h.start()
    lines: list[str] = []
    try:
        rows = bench.run_scenarios(h, FakeWorker(a), FakeWorker(b), seconds=1.5, t=2.0,
                                   log=lines.append)
    finally:
        h.stop()
    checked, worst = bench.counter_check([c.window for c in h.closed], h.readings())
    assert bench.report(rows, checked, worst, 1e-6, log=lines.append), "\n".join(lines)
    assert [r.scenario for r in rows] == ["a. two at once", "b. one alone", "c. 2T then T"]
    assert checked > 10 and len(h.readings()) > checked
    assert any("PASS" in line for line in lines) and not any("FAIL" in line for line in lines)


def test_counter_check_finds_a_window_that_does_not_add_up() -> None:
    readings = [100.0, 110.0, 125.0]
    good = [Window("k", 1.0, 10.0, {1: 6.0}, 4.0), Window("k", 1.0, 15.0, {1: 5.0}, 10.0)]
    assert bench.counter_check(good, readings) == (2, 0.0)
    lost = [good[0], Window("k", 1.0, 15.0, {1: 5.0}, 9.0)]  # 1 J went nowhere
    assert bench.counter_check(lost, readings)[1] == pytest.approx(1.0)
    skewed = [good[0], Window("k", 1.0, 14.0, {1: 5.0}, 9.0)]  # not the counter's delta
    assert bench.counter_check(skewed, readings)[1] == pytest.approx(1.0)


def test_verdicts_apply_the_issue_bounds() -> None:
    assert bench.ratio_row("a", 110.0, 100.0, 1.0, 0.20).ok
    assert not bench.ratio_row("a", 130.0, 100.0, 1.0, 0.20).ok
    assert bench.ratio_row("c", 180.0, 100.0, 2.0, 0.15).ok
    assert not bench.ratio_row("c", 160.0, 100.0, 2.0, 0.15).ok
    assert not bench.ratio_row("c", 1.0, 0.0, 2.0, 0.15).ok
    assert bench.share_row("b", 91.0, 100.0, 0.90).ok
    assert not bench.share_row("b", 89.0, 100.0, 0.90).ok
    assert not bench.share_row("b", 0.0, 0.0, 0.90).ok
