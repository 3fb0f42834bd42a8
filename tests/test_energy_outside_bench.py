"""bench/energy_outside.py without a GPU: its scenarios, settling and verdicts.

The bench's scenario runner drives fake workers on the timeline fake of NVML
(tests/fakes/fake_nvml_timeline.py) read by the real NVIDIA backend at the defaults
(tests/test_energy_defaults.py's Daemon, on a virtual clock), scraping what the split
serves; its /metrics parser reads a golden exposition, checked against the file's lines.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.test_energy_defaults import A, B, Daemon

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
spec = importlib.util.spec_from_file_location("energy_outside",
                                              REPO / "bench" / "energy_outside.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
sys.modules["energy_outside"] = bench
spec.loader.exec_module(bench)


class VirtualClock:
    def __init__(self, d: Daemon) -> None:
        self.d = d

    def now(self) -> float:
        return self.d.clock.t

    def sleep(self, seconds: float) -> None:
        self.d.run_until(self.d.clock.t + seconds)


class FakeWorker:
    """A worker whose process keeps its GPU busy for the time it is told, on the timeline."""

    def __init__(self, d: Daemon, gpu: int, pid: int) -> None:
        self.d, self.gpu, self.pid = d, gpu, pid
        self.end = 0.0

    def go(self, seconds: float) -> None:
        now = self.d.clock.t
        self.d.nvml.busy(self.gpu, self.pid, now, now + seconds)
        self.end = now + seconds

    def wait_done(self) -> tuple[int, float]:
        if self.end > self.d.clock.t:
            self.d.run_until(self.end)
        return 0, 0.0


def scrape(d: Daemon) -> dict[str, object]:
    return {dev.info.uuid: bench.Reading(
        dev.energy_joules if dev.energy_joules is not None else dev.estimated_energy_joules,
        {p.pid: p.energy_joules or 0.0 for p in dev.processes}, dev.idle_energy_joules or 0.0)
        for dev in d.devices}


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_scenarios_pass_at_the_defaults_on_every_gpu(monkeypatch: pytest.MonkeyPatch,
                                                        gpus: int) -> None:
    d = Daemon(gpus, monkeypatch)
    d.run_until(45.0)  # the daemon has run a while; the workers idle
    pairs = {dev.info.uuid: (FakeWorker(d, i, A + 1000 * i), FakeWorker(d, i, B + 1000 * i))
             for i, dev in enumerate(d.devices)}
    lines: list[str] = []
    results = bench.run_scenarios(lambda: scrape(d), VirtualClock(d), pairs, busy=40.0,
                                  t=40.0, log=lines.append)
    assert bench.table(results, log=lines.append), "\n".join(lines)
    assert bench.markdown(results).count("| pass |") == len(results) == 3 * gpus
    assert [r.scenario for r in results] == [s for s in ("a. two at once", "b. one alone",
                                                          "c. 2T then T") for _ in range(gpus)]
    for r in results:  # each measurement closed after its last busy second, not long after
        busy = {"a": 40, "b": 40, "c": 120}[r.scenario[0]]
        assert busy + bench.LATE <= r.seconds <= busy + bench.LATE + 32
    assert d.clock.t < 45 + 200 + 4 * 33  # the whole run: busy time and four settlings


def test_settling_waits_for_a_counter_read_after_the_last_busy_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    d = Daemon(1, monkeypatch)
    d.run_until(31.0)  # the counter was read at 0 and 30; the next read is at 60
    clock = VirtualClock(d)
    got = bench.settle(lambda: scrape(d), clock, [d.devices[0].info.uuid], since=40.0)
    assert d.clock.t == pytest.approx(61.0)  # the scrape after the read at 60
    assert got[d.devices[0].info.uuid].counter == pytest.approx(d.nvml.energy(0, 60.0))


def test_parse_reads_counters_process_energy_and_idle_of_each_gpu() -> None:
    text = (REPO / "tests" / "golden" / "nvidia-h100x2.prom").read_text()
    got = bench.parse(text)

    def lines(name: str) -> list[tuple[dict[str, str], float]]:
        out = []
        for m in re.finditer(rf"^{name}{{(.*)}} (\S+)$", text, re.M):
            out.append((dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))), float(m.group(2))))
        return out

    counters = lines("gpu_energy_joules_total")
    assert counters and {u: r.counter for u, r in got.items()} == \
        {labels["uuid"]: v for labels, v in counters}
    parts = lines("gpu_process_energy_joules_total")
    assert parts and all(got[lb["uuid"]].parts[int(lb["pid"])] == v for lb, v in parts)
    assert all(got[lb["uuid"]].idle == v for lb, v in lines("gpu_idle_energy_joules_total"))
