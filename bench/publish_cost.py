"""What one collection cycle costs with its publish, and the running daemon per thread.

    python bench/publish_cost.py [--gpus 1] [--cycles 3000] [--window 20] [--interval 100ms]
    python bench/publish_cost.py --real ...   # on a machine with an NVIDIA GPU

1. In process, the daemon's own objects (``Daemon`` built from the same flags, its Hub,
   renderer and history wired as ``Daemon.start`` wires them), fake NVML with
   ``--gpus`` GPUs of two processes each (or ``--real``): thread CPU time of the NVIDIA
   backend's ``sample(slow=False)`` alone, of the Hub's whole cycle (sample, accept,
   publish: the merge, cap, attribution, energy split, health, history, renderer), and
   of a publish alone; medians over ``--cycles`` back-to-back cycles, then over 100
   cycles 100 ms apart (a 10 Hz daemon runs cold: caches and clocks).
2. The daemon itself at ``--interval`` (no scrapes): each thread's CPU from
   /proc/<pid>/task/*/schedstat (nanoseconds) over ``--window`` seconds, its wake-ups
   per second, and the whole process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import scrape_latency  # noqa: E402
from daemon_cost import schedstat  # noqa: E402
from scrape_latency import SHIM, fake_nvml_file, start_daemon  # noqa: E402


def median_us(fn: Callable[[], object], n: int, gap: float = 0.0) -> float:
    times = []
    for _ in range(n):
        t = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - t)
        if gap:
            time.sleep(gap)
    return statistics.median(times) / 1e3


def in_process(args: argparse.Namespace) -> None:
    if not args.real:
        sys.path.insert(0, str(SHIM))
        os.environ["FAKE_NVML_JSON"] = str(fake_nvml_file(args.gpus, 2, Path(tempfile.mkdtemp())))
    from exporter.app.daemon import Daemon
    from exporter.app.flags import load_config
    from exporter.output.render import Renderer

    config = load_config(["--no-collector.amd", "--no-collector.intel",
                          "--collector.interval", args.interval], {})
    daemon = Daemon(config)
    hub = daemon.hub
    daemon.renderer = Renderer(lead=config.interval, options=daemon.render_options())
    hub.subscribe(daemon.renderer.submit)
    hub.subscribe(daemon.history.add)
    nvidia = next(b for b in daemon.backends if b.name == "nvidia")
    hub.collect_once()  # every backend opened and sampled, the GPUs numbered
    try:
        for label, gap, n in (("back to back", 0.0, args.cycles), ("100 ms apart", 0.1, 100)):
            sample = median_us(lambda: nvidia.sample(False), n, gap)
            cycle = median_us(lambda: hub._sample(nvidia, False), n, gap)
            publish = median_us(hub.publish, n, gap)
            print(f"{args.gpus if not args.real else 'real'} GPU(s), {label}: sample "
                  f"{sample:.0f} us; sample + accept + publish {cycle:.0f} us; publish "
                  f"alone {publish:.0f} us", flush=True)
    finally:
        daemon.stop(timeout=0)


def per_thread(args: argparse.Namespace) -> None:
    scrape_latency.FAKE_ONLY = ["--no-collector.processes"]  # every other collector on
    with start_daemon(args.real, ["--collector.interval", args.interval], gpus=args.gpus,
                      processes=2) as target:
        time.sleep(4)
        before = schedstat(target.proc.pid)
        time.sleep(args.window)
        after = schedstat(target.proc.pid)
    rows = []
    for tid, (name, ns, wakeups) in after.items():
        _, ns0, wakeups0 = before.get(tid, (name, 0, 0))
        rows.append((name, (ns - ns0) / 1e9 / args.window * 100,
                     (wakeups - wakeups0) / args.window))
    rows.sort(key=lambda r: -r[1])
    print(f"\nthe daemon at {args.interval}, no scrapes, {args.window:.0f} s:")
    for name, percent, wakeups in rows:
        if percent > 0:
            print(f"  {name:<18} {percent:7.3f} % of one core  {wakeups:6.1f} wake-ups/s")
    print(f"  {'whole process':<18} {sum(r[1] for r in rows):7.3f} %")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--interval", default="100ms")
    ap.add_argument("--real", action="store_true", help="real NVML instead of the fake")
    args = ap.parse_args()
    in_process(args)
    per_thread(args)


if __name__ == "__main__":
    main()
