"""What the Apple backend costs per line and per sample() (with the fake macmon).

    python bench/macmon_cost.py [--window 20] [--interval 0.1]

1. decode + convert of one recorded line of each macmon release (tests/fixtures/macmon),
   median over 2000 runs: the reader thread's and sample()'s work per line.
2. A live AppleBackend on tests/fakes/fake_macmon.py at ``--interval``: sample() wall
   time (median, p99) and the CPU of this process's threads over the window, the
   exporter side only (the child's own CPU is macmon's, not ours).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from exporter.core.config import Config  # noqa: E402
from exporter.sources.apple.backend import AppleBackend  # noqa: E402
from exporter.sources.apple.parse import decode_line, parse_macmon  # noqa: E402

LINES = ROOT / "tests" / "fixtures" / "macmon"
TICK = os.sysconf("SC_CLK_TCK")


def per_line() -> None:
    for path in sorted(LINES.glob("*.jsonl")):
        raw = path.read_bytes().splitlines()[0]
        times = []
        for _ in range(2000):
            t0 = time.perf_counter()
            parse_macmon(decode_line(raw) or {})
            times.append(time.perf_counter() - t0)
        print(f"{path.name:34} {len(raw):5} B  decode+convert "
              f"{statistics.median(times) * 1e6:6.1f} us")


def thread_cpu() -> float:
    ticks = 0
    for stat in Path("/proc/self/task").glob("*/stat"):
        fields = stat.read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / TICK


def live(window: float, interval: float) -> None:
    os.environ.setdefault("FAKE_MACMON_LINES", str(LINES / "v0.8dev-m1max.jsonl"))
    b = AppleBackend(Config(interval=interval, macmon_path=str(ROOT / "tests" / "fakes" /
                                                                "fake_macmon.py")))
    b.open()
    try:
        durations, cpu0, end = [], thread_cpu(), time.monotonic() + window
        while time.monotonic() < end:
            t0 = time.perf_counter()
            b.sample(slow=False)
            durations.append(time.perf_counter() - t0)
            time.sleep(interval)
        cpu = thread_cpu() - cpu0
    finally:
        b.close()
    durations.sort()
    print(f"sample(): {len(durations)} calls, median {statistics.median(durations) * 1e6:.0f} us,"
          f" p99 {durations[int(len(durations) * 0.99)] * 1e6:.0f} us; exporter CPU "
          f"{cpu:.2f} s in {window:.0f} s ({100 * cpu / window:.2f} % of a core) at "
          f"{interval * 1000:.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--interval", type=float, default=0.1)
    args = p.parse_args()
    per_line()
    live(args.window, args.interval)


if __name__ == "__main__":
    main()
