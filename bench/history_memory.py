"""Memory of the landing page's ring buffer (exporter.serve.history), full, per GPU and sample.

    python bench/history_memory.py [--gpus 8] [--processes 8] [--window 900] [--interval 1]
                                   [--n 5]

Fills a History of ``--window`` / ``--interval`` samples per GPU from a snapshot of
``--gpus`` H100 samples (bench/dcgm_render.py's) with ``--processes`` processes each, in
pods (the history keeps the top five per GPU), past its capacity, and measures what it
holds with tracemalloc (the allocations the buffer keeps, not the process's RSS); also
the median time of one ``add`` (on the collector's thread, per published snapshot) and of
one full ``/api/v1/history`` body. Prints medians of ``--n`` fills.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from exporter.core.model import ProcessSample  # noqa: E402
from exporter.serve.history import History  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--window", type=float, default=900.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--processes", type=int, default=8, help="per GPU")
    ap.add_argument("--n", type=int, default=5)
    args = ap.parse_args()
    from dcgm_render import sample  # type: ignore[import-not-found]

    processes = tuple(ProcessSample(pid=1000 + p, process=f"python3-{p}",
                                    memory_used_bytes=float((p + 1) << 30),
                                    namespace="ml", pod=f"trainer-{p}", container="main")
                      for p in range(args.processes))

    class Snap:
        ready = True
        backends = health = ()  # the page's tables (exporter.serve.tables.current): none here
        devices = tuple((str(i), dataclasses.replace(sample(i, 0), processes=processes))
                        for i in range(args.gpus))

    sizes, adds, bodies, body_bytes, capacity = [], [], [], 0, 0
    for _ in range(args.n):
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        history = History(args.window, args.interval)
        capacity = history.capacity
        t0 = time.perf_counter()
        for i in range(capacity + 10):  # full, and wrapped
            history.add(Snap(), now=1e9 + i * args.interval)  # type: ignore[arg-type]
        adds.append((time.perf_counter() - t0) / (capacity + 10) * 1e6)
        sizes.append(tracemalloc.get_traced_memory()[0] - before)
        tracemalloc.stop()
        t0 = time.perf_counter()
        body_bytes = len(json.dumps(history.as_json(), separators=(",", ":")))
        bodies.append((time.perf_counter() - t0) * 1e3)
    size = statistics.median(sizes)
    print(f"{args.gpus} GPUs, {args.window:g} s at {args.interval:g} s: {capacity} samples "
          f"per GPU, median of {args.n}")
    print(f"buffer        {size / 2**20:7.2f} MiB  ({size / 1024:.1f} KiB; "
          f"{size / args.gpus / 1024:.0f} KiB per GPU, "
          f"{size / args.gpus / capacity:.0f} bytes per sample)")
    print(f"add()         {statistics.median(adds):7.1f} us per snapshot")
    print(f"history JSON  {statistics.median(bodies):7.1f} ms, {body_bytes / 1024:.0f} KiB "
          "(full; the page then asks only for what is new)")


if __name__ == "__main__":
    main()
