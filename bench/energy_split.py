#!/usr/bin/env python3
"""Per-process GPU energy on a real NVIDIA GPU: does the split follow who used the GPU?

Runs the exporter's own path in this process (the NVIDIA backend in a Hub, whose energy
split is exporter.pipeline.energy_split) while worker processes run the same CUDA matmul loop
(torch), and checks three scenarios against what is known of them:

  a. two workers busy at the same time        -> their energy about 1:1 (within 20 %)
  b. one worker busy alone (the other idle)   -> it gets >= 90 % of the attributed energy
  c. worker A busy for 2T, then worker B for T -> A:B about 2:1 (within 15 %)

and, in every window the split closed, that the parts plus idle equal the increase of
the GPU's energy counter as NVML returned it to the backend (every reading is recorded
on its way). Prints one row per scenario with PASS or FAIL, and exits 1 on a FAIL.

Run from the repository root: ``python3 bench/energy_split.py`` (Python 3.12, torch with
CUDA, nvidia-ml-py; about 2.5 minutes). ``--gpu N`` picks the GPU (NVML index, PCI
order); ``--slow-interval`` the exporter's slow tier (default 1 s: NVML's per-process
samples are read each slow cycle, the energy counter every third one).
``--cost`` (no GPU): what the split adds to a snapshot, 8 GPUs x 4 and x 64 processes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.pipeline.energy_split import Window  # noqa: E402

MATMUL = 8192  # fp16 square matmul: ~1.5 ms on an H100, so each loop step is short


# -- the worker: one process, one CUDA context, the same loop in every copy ---------------

def worker_main() -> None:
    """``go <seconds>`` on stdin: run the loop that long, answer ``done <steps> <s>``."""
    import torch

    a = torch.randn(MATMUL, MATMUL, device="cuda", dtype=torch.float16)
    b = torch.randn(MATMUL, MATMUL, device="cuda", dtype=torch.float16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        seconds = float(words[1])
        steps, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            a @ b
            torch.cuda.synchronize()
            steps += 1
        print(f"done {steps} {time.monotonic() - start:.3f}", flush=True)


class Worker(Protocol):
    pid: int

    def go(self, seconds: float) -> None: ...
    def wait_done(self) -> tuple[int, float]: ...
    def stop(self) -> None: ...


class CudaWorker:
    """A worker process (this file with --worker) on one GPU."""

    def __init__(self, gpu: int) -> None:
        env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu)}
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid

    def ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"worker {self.pid} did not start: {line!r}")

    def go(self, seconds: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {seconds}\n")
        self.proc.stdin.flush()

    def wait_done(self) -> tuple[int, float]:
        assert self.proc.stdout is not None
        _, steps, seconds = self.proc.stdout.readline().split()
        return int(steps), float(seconds)

    def stop(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- the exporter side ----------------------------------------------------------------------

class Recording:
    """The NVML module, with every energy reading the backend gets recorded (J)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.readings: dict[str, list[float]] = {}  # PCI bus id (as NVML gives it) -> J
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> Any:  # noqa: N802 - NVML's
        value = self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        bus = self._nvml.nvmlDeviceGetPciInfo(handle).busId
        bus = bus.decode() if isinstance(bus, bytes) else str(bus)
        with self._lock:
            self.readings.setdefault(bus, []).append(value / 1000)
        return value


@dataclass
class Closed:
    at: float  # monotonic, when the window closed
    window: Window


@dataclass
class Harness:
    """The NVIDIA backend in a running Hub; its split's windows of one GPU are kept."""

    nvml: Any
    gpu: int = 0
    interval: float = 1.0
    slow_interval: float = 1.0
    closed: list[Closed] = field(default_factory=list)
    key: str = ""

    def start(self) -> None:
        from exporter.core.config import Config
        from exporter.core.model import normalize_pci_bus_id
        from exporter.pipeline.hub import Hub
        from exporter.sources.nvidia.backend import NvidiaBackend

        self.recording = Recording(self.nvml)
        config = Config(interval=self.interval, slow_interval=self.slow_interval)
        self.backend = NvidiaBackend(config, self.recording)
        self.hub = Hub(config, [self.backend])
        self.hub.energy.on_window = self._window
        self.nvml.nvmlInit()  # our own reference (NVML counts them) to find the GPU's key
        handle = self.nvml.nvmlDeviceGetHandleByIndex(self.gpu)
        bus = self.nvml.nvmlDeviceGetPciInfo(handle).busId
        self.bus = bus.decode() if isinstance(bus, bytes) else str(bus)
        self.key = normalize_pci_bus_id(self.bus)
        self.cv = threading.Condition()
        self.hub.start()

    def _window(self, w: Window) -> None:
        if w.key == self.key:
            with self.cv:
                self.closed.append(Closed(time.monotonic(), w))
                self.cv.notify_all()

    def wait_windows(self, n: int, timeout: float = 30.0) -> int:
        """Wait until ``n`` more windows closed; returns the count so far."""
        with self.cv:
            target = len(self.closed) + n
            self.cv.wait_for(lambda: len(self.closed) >= target, timeout)
            return len(self.closed)

    def stop(self) -> None:
        self.hub.stop()
        self.nvml.nvmlShutdown()

    def readings(self) -> list[float]:
        return list(self.recording.readings.get(self.bus, []))


# -- the checks (pure: tested without a GPU in tests/test_energy_bench.py) ------------------

def counter_check(windows: Sequence[Window], readings: Sequence[float]) -> tuple[int, float]:
    """Every window's parts plus idle against its increase, and the increases against the
    counter as read: each running sum of window increases must be some reading minus the
    first one. Returns (windows checked, the largest difference in J)."""
    worst = 0.0
    total = 0.0
    deltas = [r - readings[0] for r in readings] if readings else []
    for w in windows:
        worst = max(worst, abs(sum(w.parts.values()) + w.idle - w.joules))
        total += w.joules
        worst = max(worst, min((abs(total - d) for d in deltas), default=float("inf")))
    return len(windows), worst


def parts_by_pid(closed: Sequence[Closed], first: int, last: int) -> tuple[dict[int, float],
                                                                              float]:
    """Joules by pid and idle over the windows ``first`` to ``last`` (indexes, inclusive)."""
    parts: dict[int, float] = {}
    idle = 0.0
    for c in closed[first:last + 1]:
        for pid, j in c.window.parts.items():
            parts[pid] = parts.get(pid, 0.0) + j
        idle += c.window.idle
    return parts, idle


@dataclass
class Row:
    scenario: str
    expected: str
    measured: str
    ok: bool


def ratio_row(name: str, a: float, b: float, want: float, tolerance: float) -> Row:
    ratio = a / b if b > 0 else float("inf")
    ok = abs(ratio / want - 1) <= tolerance
    return Row(name, f"A:B = {want:g}:1 +- {tolerance:.0%}", f"{ratio:.3f}:1 "
               f"(A {a:.1f} J, B {b:.1f} J)", ok)


def share_row(name: str, mine: float, total: float, floor: float) -> Row:
    share = mine / total if total > 0 else 0.0
    return Row(name, f"A >= {floor:.0%} of attributed", f"{share:.1%} "
               f"(A {mine:.1f} J of {total:.1f} J)", share >= floor)


# -- the scenarios --------------------------------------------------------------------------

def run_scenarios(h: Harness, a: Worker, b: Worker, seconds: float, t: float,
                  settle: int = 2, log: Callable[[str], None] = print) -> list[Row]:
    rows: list[Row] = []

    def scenario(run: Callable[[], None]) -> tuple[dict[int, float], float]:
        first = h.wait_windows(1)  # start right after a window closed
        run()
        last = h.wait_windows(settle) - 1  # the windows that hold the last busy samples
        parts, idle = parts_by_pid(h.closed, first, last)
        names = {a.pid: "A", b.pid: "B"}
        log(f"  {last - first + 1} windows: " + ", ".join(
            f"{names.get(pid, pid)} {j:.1f} J" for pid, j in sorted(parts.items()))
            + f", idle {idle:.1f} J")
        return parts, idle

    def together() -> None:
        a.go(seconds)
        b.go(seconds)
        log(f"  a: A {a.wait_done()}, B {b.wait_done()} (steps, s)")

    parts, _ = scenario(together)
    rows.append(ratio_row("a. two at once", parts.get(a.pid, 0.0), parts.get(b.pid, 0.0),
                          1.0, 0.20))

    def alone() -> None:
        a.go(seconds)
        log(f"  b: A {a.wait_done()} (steps, s)")

    parts, _ = scenario(alone)
    rows.append(share_row("b. one alone", parts.get(a.pid, 0.0), sum(parts.values()), 0.90))

    def one_then_other() -> None:
        a.go(2 * t)
        done_a = a.wait_done()
        b.go(t)
        log(f"  c: A {done_a}, then B {b.wait_done()} (steps, s)")

    parts, _ = scenario(one_then_other)
    rows.append(ratio_row("c. 2T then T", parts.get(a.pid, 0.0), parts.get(b.pid, 0.0),
                          2.0, 0.15))
    return rows


def report(rows: Sequence[Row], checked: int, worst: float, tolerance: float,
           log: Callable[[str], None] = print) -> bool:
    rows = [*rows, Row("every window", "parts + idle = counter delta",
                       f"{checked} windows, max |diff| {worst:.2e} J",
                       checked > 0 and worst <= tolerance)]
    log(f"{'scenario':<16} {'expected':<30} {'measured':<44} result")
    for r in rows:
        log(f"{r.scenario:<16} {r.expected:<30} {r.measured:<44} {'PASS' if r.ok else 'FAIL'}")
    return all(r.ok for r in rows)


def cost(gpus: int = 8, processes: int = 64, rounds: int = 200) -> tuple[float, float]:
    """Milliseconds the split adds to one snapshot's merge (median of ``rounds``): feeding
    a new snapshot (every sample a new reading, a window closing on every GPU) and serving
    one already fed. No GPU needed: ``--cost``."""
    import statistics

    from exporter.core.model import DeviceInfo, DeviceSample, ProcessSample
    from exporter.pipeline.energy_split import EnergySplit

    def snapshot(step: int) -> list[DeviceSample]:
        return [DeviceSample(
            info=DeviceInfo(vendor="nvidia", pci_bus_id=f"0000:{i + 1:02x}:00.0", uuid=f"g{i}"),
            source="nvml", energy_joules=1000.0 + step,
            processes=tuple(ProcessSample(pid=1000 + j, process="python3", utilization_ratio={
                "sm": (j % 50 + step % 7) / 100}) for j in range(processes)))
            for i in range(gpus)]

    now = [0.0]
    split = EnergySplit(21.0, 1.0, clock=lambda: now[0])
    fed, served = [], []
    for step in range(rounds):
        devices = snapshot(step)
        now[0] += 1.0
        t0 = time.perf_counter()
        split.attribute(step, devices)
        t1 = time.perf_counter()
        split.attribute(step, devices)
        fed.append(t1 - t0)
        served.append(time.perf_counter() - t1)
    return statistics.median(fed) * 1e3, statistics.median(served) * 1e3


def main() -> int:
    if "--worker" in sys.argv:
        worker_main()
        return 0
    if "--cost" in sys.argv:
        for n in (4, 64):
            fed, served = cost(processes=n)
            print(f"8 GPUs x {n} processes: feed {fed:.2f} ms, serve again {served:.2f} ms "
                  "per snapshot (median)")
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU (PCI order)")
    p.add_argument("--seconds", type=float, default=20.0, help="scenarios a and b, seconds")
    p.add_argument("--t", type=float, default=15.0, help="T of scenario c, seconds")
    p.add_argument("--slow-interval", type=float, default=1.0)
    args = p.parse_args()
    import pynvml

    started = time.monotonic()
    h = Harness(pynvml, args.gpu, slow_interval=args.slow_interval)
    h.start()
    workers = [CudaWorker(args.gpu), CudaWorker(args.gpu)]
    try:
        for w in workers:
            w.ready()
        print(f"GPU {args.gpu} ({h.bus}), workers A={workers[0].pid} B={workers[1].pid}, "
              f"slow interval {args.slow_interval:g} s", flush=True)
        if h.wait_windows(1, timeout=20 * args.slow_interval) == 0:
            print("no window closed: no energy readings from NVML on this GPU "
                  f"({len(h.readings())} read)")
            return 2
        rows = run_scenarios(h, workers[0], workers[1], args.seconds, args.t)
    finally:
        for w in workers:
            w.stop()
        h.stop()
    checked, worst = counter_check([c.window for c in h.closed], h.readings())
    ok = report(rows, checked, worst, tolerance=1e-3)  # 1 mJ: the counter's unit
    print(f"total {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
