"""Where the NVIDIA backend's CPU goes, cycle by cycle, on a real GPU: the daemon's
cadence at its defaults (a fast cycle every interval, a slow one every tenth), with
nobody reading the metrics (the daemon alone, as bench/cost_table.py measures it) or
with a reader before every cycle (``--read``).

    python bench/nvml_profile.py [--seconds 120] [--read] [--top 30]

Prints the thread CPU per simulated second (the share of one core the NVIDIA thread
would use at 1 s), the CPU of each kind of cycle (fast, slow, the slow cycles that also
read the rare tier), and cProfile's functions by their own time and by the time under
them, so that NVML's calls (``nvmlDevice*``: the driver's time) and our Python can be
told apart.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SLOW_EVERY = 10  # --collector.slow-interval 10s over --collector.interval 1s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=120, help="simulated seconds (cycles)")
    ap.add_argument("--read", action="store_true", help="a reader before every cycle")
    ap.add_argument("--top", type=int, default=30, help="functions listed (0: no profiler)")
    args = ap.parse_args()

    from exporter.core.config import Config
    from exporter.sources.nvidia.backend import NvidiaBackend
    from exporter.sources.nvidia.device import RARE_EVERY
    from exporter.sources.readers import Readers

    readers = Readers()
    backend = NvidiaBackend(Config(), readers=readers)
    gpus = len(backend.open())
    backend.sample(slow=True)  # the first readings, taken whatever the readers
    backend.sample(slow=False)
    kinds: dict[str, list[float]] = {"fast": [], "slow": [], "slow+rare": []}
    profile = cProfile.Profile()
    total = 0.0
    slow_cycles = 1
    for i in range(1, args.seconds + 1):
        slow = i % SLOW_EVERY == 0
        kind = "fast"
        if slow:
            kind = "slow+rare" if slow_cycles % RARE_EVERY == 0 else "slow"
            slow_cycles += 1
        if args.read:
            readers.read()
        t0 = time.thread_time()
        if args.top:
            profile.enable()
        backend.sample(slow=slow)
        if args.top:
            profile.disable()
        spent = time.thread_time() - t0
        total += spent
        kinds[kind].append(spent)
        time.sleep(0.01)
    backend.close()
    print(f"{gpus} GPU(s), {args.seconds} cycles, reader before each: {args.read}")
    print(f"NVIDIA thread at 1 s: {total / args.seconds * 1e6:.0f} us of CPU a second "
          f"= {total / args.seconds * 100:.3f} % of one core"
          f"{' (profiler on)' if args.top else ''}")
    for kind, cycles in kinds.items():
        if cycles:
            print(f"  {kind:10s} x{len(cycles):3d}: median "
                  f"{statistics.median(cycles) * 1e6:8.0f} us")
    for order in ("tottime", "cumulative") if args.top else ():
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(args.top)
        print(f"\n--- by {order}")
        print("\n".join(line for line in out.getvalue().splitlines()
                        if line.strip() and not line.startswith(("   Ordered", "         "))))


if __name__ == "__main__":
    main()
