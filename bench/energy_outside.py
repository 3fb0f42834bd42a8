#!/usr/bin/env python3
"""Per-process GPU energy measured from outside, as a user sees it, at the defaults.

Starts the real daemon with no collector flags (``--collector.interval 1s``, slow tier
10 s: NVML's energy counter read every 30 s, its per-process samples every 10 s) and two
CUDA worker processes per GPU (bench/energy_split.py's matmul loop, torch), all alive
from the start to the end. Each worker is idle before its scenario opens and stays alive
after it. For each scenario it scrapes ``/metrics`` once before the first busy second
and once after the daemon read the GPU's counter again past the last busy second (the
scrape in which ``gpu_energy_joules_total`` first moved, at least a second after it), and
takes the increase of each worker's ``gpu_process_energy_joules_total`` in between:

  a. A and B busy at the same time for --busy s     -> A:B = 1:1 within 20 %
  b. A busy for --busy s, B alive and idle           -> A gets >= 90 % of the processes'
  c. A busy for 2T, then B for T (--t)               -> A:B = 2:1 within 15 %

on every GPU at once (``--gpus``: NVML indexes, PCI order; default all). Prints one row
per GPU and scenario with PASS or FAIL, the daemon's CPU over the run (utime + stime of
/proc/<pid>/stat), and what NVML's per-process samples showed at B's start in c (read
from this process on the first GPU: per second, and per 10 s with lastSeenTimeStamp 10 s
or 90 s back, to tell a diluted first reading from a late one). With $OUT set, writes
``$OUT/energy_outside.json`` and the rows as a Markdown table in
``$OUT/energy_outside.md``. Exits 1 on a FAIL.

Run from the repository root on a machine with NVIDIA GPUs, python3 with torch (CUDA),
nvidia-ml-py and the exporter's dependencies: ``python3 bench/energy_outside.py``
(about 5.5 minutes at the defaults: 200 s busy, up to 31 s after each scenario and before
the first for the counter's next read, ~20 s to start the workers).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from daemon_cost import TICK, cpu_ticks  # noqa: E402
from energy_split import CudaWorker, Row, ratio_row, share_row  # noqa: E402
from scrape_latency import start_daemon  # noqa: E402

COUNTERS = ("gpu_energy_joules_total", "gpu_estimated_energy_joules_total")
SETTLE_TIMEOUT = 75.0  # s: the counter is read every 30 s at the defaults
LATE = 2.0  # s after the last busy second before a counter read counts (samples come late)


# -- what a scrape shows ----------------------------------------------------------------

@dataclass
class Reading:
    """One GPU in one scrape."""

    counter: float | None = None  # gpu_energy_joules_total, or the estimate without one
    parts: dict[int, float] = field(default_factory=dict)  # pid -> process energy, J
    idle: float = 0.0


def parse(text: str) -> dict[str, Reading]:
    """uuid -> its Reading, from an exposition in the text format."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Reading] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            uuid = s.labels.get("uuid")
            if uuid is None:
                continue
            if s.name in COUNTERS:
                r = out.setdefault(uuid, Reading())
                if r.counter is None or s.name == COUNTERS[0]:
                    r.counter = s.value
            elif s.name == "gpu_process_energy_joules_total":
                out.setdefault(uuid, Reading()).parts[int(s.labels["pid"])] = s.value
            elif s.name == "gpu_idle_energy_joules_total":
                out.setdefault(uuid, Reading()).idle = s.value
    return out


class Clock(Protocol):
    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Worker(Protocol):
    pid: int

    def go(self, seconds: float) -> None: ...
    def wait_done(self) -> tuple[int, float]: ...


Scrape = Callable[[], dict[str, Reading]]


def settle(scrape: Scrape, clock: Clock, uuids: Sequence[str], since: float,
           timeout: float = SETTLE_TIMEOUT) -> dict[str, Reading]:
    """The first scrape, ``LATE`` seconds or more after ``since``, in which every GPU's
    counter has moved since a scrape taken then: the daemon read it (and closed a
    window) after the last busy second and the samples of it."""
    clock.sleep(max(0.0, since + LATE - clock.now()))
    base = scrape()
    deadline = clock.now() + timeout
    while True:
        clock.sleep(1.0)
        now = scrape()
        if all(now.get(u, Reading()).counter != base.get(u, Reading()).counter
               and now.get(u, Reading()).counter is not None for u in uuids):
            return now
        if clock.now() > deadline:
            raise SystemExit(f"no counter read within {timeout:.0f} s: {now}")


@dataclass
class Result:
    gpu: str
    scenario: str
    expected: str
    measured: str
    ok: bool
    a_joules: float
    b_joules: float
    idle_joules: float
    seconds: float  # between the two scrapes


def increase(before: Reading, after: Reading, pid: int) -> float:
    return after.parts.get(pid, 0.0) - before.parts.get(pid, 0.0)


def run_scenarios(scrape: Scrape, clock: Clock, pairs: dict[str, tuple[Worker, Worker]],
                  busy: float, t: float, log: Callable[[str], None] = print,
                  on_second_start: Callable[[float], None] | None = None) -> list[Result]:
    """The three scenarios on every GPU of ``pairs`` (uuid -> its workers A and B) at
    once; one Result per GPU and scenario."""
    uuids = list(pairs)
    results: list[Result] = []
    current = settle(scrape, clock, uuids, clock.now())  # start just after a counter read
    started = clock.now()

    def together() -> None:
        for a, b in pairs.values():
            a.go(busy)
            b.go(busy)
        for a, b in pairs.values():
            a.wait_done()
            b.wait_done()

    def alone() -> None:
        for a, _ in pairs.values():
            a.go(busy)
        for a, _ in pairs.values():
            a.wait_done()

    def one_then_other() -> None:
        for a, _ in pairs.values():
            a.go(2 * t)
        for a, _ in pairs.values():
            a.wait_done()
        if on_second_start is not None:
            on_second_start(clock.now())
        for _, b in pairs.values():
            b.go(t)
        for _, b in pairs.values():
            b.wait_done()

    def verdict(name: str, a: float, b: float) -> Row:
        if name.startswith("a."):
            return ratio_row(name, a, b, 1.0, 0.20)
        if name.startswith("b."):
            return share_row(name, a, a + b, 0.90)
        return ratio_row(name, a, b, 2.0, 0.15)

    for name, run in (("a. two at once", together), ("b. one alone", alone),
                      ("c. 2T then T", one_then_other)):
        before, opened = current, clock.now()
        run()
        current = settle(scrape, clock, uuids, clock.now())
        seconds = clock.now() - opened
        for uuid, (a, b) in pairs.items():
            was, now = before.get(uuid, Reading()), current.get(uuid, Reading())
            ja, jb = increase(was, now, a.pid), increase(was, now, b.pid)
            row = verdict(name, ja, jb)
            results.append(Result(uuid, name, row.expected, row.measured, row.ok, ja, jb,
                                  now.idle - was.idle, seconds))
        log(f"  {name}: {seconds:.0f} s between the scrapes "
            f"({clock.now() - started:.0f} s since the first)")
    return results


def markdown(results: Sequence[Result], names: dict[str, str] | None = None) -> str:
    """The rows as a Markdown table (docs/energy.md's)."""
    names = names or {}
    lines = ["| GPU | scenario | expected | measured | idle J | |", "|---|---|---|---|---:|---|"]
    for r in results:
        lines.append(f"| {names.get(r.gpu, r.gpu)} | {r.scenario} | {r.expected} | {r.measured} "
                     f"| {r.idle_joules:.0f} | {'pass' if r.ok else 'FAIL'} |")
    return "\n".join(lines) + "\n"


def table(results: Sequence[Result], log: Callable[[str], None] = print,
          names: dict[str, str] | None = None) -> bool:
    """The rows, each GPU named by ``names`` (uuid -> name; else its uuid); True if all pass."""
    names = names or {}
    log(f"{'gpu':<14} {'scenario':<15} {'target':<24} {'measured':<40} {'idle J':>8}  result")
    for r in results:
        log(f"{names.get(r.gpu, r.gpu)[:14]:<14} {r.scenario:<15} {r.expected:<24} "
            f"{r.measured:<40} {r.idle_joules:>8.0f}  {'PASS' if r.ok else 'FAIL'}")
    return all(r.ok for r in results)


# -- the real machine -----------------------------------------------------------------------

def http_scrape(port: int) -> dict[str, Reading]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return parse(conn.getresponse().read().decode())
    finally:
        conn.close()


@dataclass
class Probe:
    """NVML's per-process samples of one GPU, read from this process at B's start in c."""

    nvml: Any
    index: int
    pid: int = 0
    per_second: list[int] = field(default_factory=list)  # B's smUtil over the last 1 s
    reads: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self, at: float) -> None:
        self.thread = threading.Thread(target=self._run, args=(at,), daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(25.0)

    def _util(self, handle: Any, since_s: float) -> int | None:
        try:
            for s in self.nvml.nvmlDeviceGetProcessUtilization(handle, int(since_s * 1e6)):
                if s.pid == self.pid:
                    return int(s.smUtil)
        except self.nvml.NVMLError:
            return None
        return None

    def _run(self, at: float) -> None:
        handle = self.nvml.nvmlDeviceGetHandleByIndex(self.index)
        wall0 = time.time()
        for second in range(1, 21):
            time.sleep(max(0.0, at + second - time.monotonic()))
            now = time.time()
            self.per_second.append(self._util(handle, now - 1.0) or 0)
            if second in (10, 20):
                fresh, stale = self._util(handle, now - 10.0), self._util(handle, wall0 - 90.0)
                self.reads.append(f"+{second} s: since 10 s back {fresh} %, "
                                  f"since 90 s before B's start {stale} %")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default="all", help="NVML indexes (PCI order), or all")
    p.add_argument("--busy", type=float, default=40.0, help="scenarios a and b, seconds")
    p.add_argument("--t", type=float, default=40.0, help="T of scenario c, seconds")
    args = p.parse_args()
    import pynvml

    t0 = time.monotonic()
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    indexes = list(range(count)) if args.gpus == "all" else [int(i) for i in args.gpus.split(",")]
    uuids = {}
    for i in indexes:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
        uuids[i] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(indexes[0]))
    driver = pynvml.nvmlSystemGetDriverVersion()
    workers = {i: (CudaWorker(i), CudaWorker(i)) for i in indexes}
    out: dict[str, Any] = {"gpus": [uuids[i] for i in indexes], "name": str(name),
                           "driver": str(driver), "busy_s": args.busy, "t_s": args.t}
    ok = False
    try:
        with start_daemon(real=True) as daemon:
            for a, b in workers.values():
                a.ready()
                b.ready()
            pairs = {uuids[i]: w for i, w in workers.items()}
            print(f"{len(indexes)} x {name}, driver {driver}; workers "
                  + ", ".join(f"GPU {i}: A={a.pid} B={b.pid}" for i, (a, b) in workers.items())
                  + f"; daemon pid {daemon.proc.pid} at its defaults", flush=True)
            probe = Probe(pynvml, indexes[0], workers[indexes[0]][1].pid)
            ticks0, cpu_t0 = cpu_ticks(f"/proc/{daemon.proc.pid}/stat")[1], time.monotonic()
            results = run_scenarios(lambda: http_scrape(daemon.port), RealClock(), pairs,
                                    args.busy, args.t, on_second_start=probe.start)
            ticks = cpu_ticks(f"/proc/{daemon.proc.pid}/stat")[1] - ticks0
            cpu = ticks / TICK / (time.monotonic() - cpu_t0) * 100
            names = {u: f"{i}" for i, u in uuids.items()}
            ok = table(results, names=names)
            out["markdown"] = markdown(results, names)
            probe.join()
            print(f"daemon CPU over the scenarios: {cpu:.2f} % of one core "
                  f"({len(indexes)} GPU(s) under load, scrapes every second while settling)")
            print(f"NVML at B's start in c (GPU {indexes[0]}, smUtil over the last second): "
                  f"{probe.per_second}")
            for line in probe.reads:
                print(f"NVML {line}")
            out.update(results=[asdict(r) for r in results], daemon_cpu_percent=cpu,
                       probe_per_second=probe.per_second, probe_reads=probe.reads, ok=ok)
    finally:
        for a, b in workers.values():
            a.stop()
            b.stop()
        pynvml.nvmlShutdown()
    out["total_s"] = time.monotonic() - t0
    print(f"total {out['total_s']:.0f} s")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "energy_outside.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        path.with_suffix(".md").write_text(out.get("markdown", ""))
        print(f"wrote {path} and {path.with_suffix('.md').name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
