#!/usr/bin/env python3
"""Peak memory of the fdinfo backend with 200,000 DRM clients, against the chart's limit.

Any local user can make DRM clients: every open of a render node is one, and each has
its own fdinfo. This generates a procfs-shaped tree of ``--processes`` pids (default
5,000) each holding ``--opens`` fds (default 40) on ``/dev/dri/renderD128`` with an
amdgpu fdinfo and a distinct client id: 200,000 clients, behind one amdgpu card in a
sysfs tree. Then, in a fresh interpreter (so the tree's generation costs nothing), the
real backend (``FdinfoBackend.sample()``: walk, parse, deduplicate, deltas, /proc reads,
DeviceSample building) scans it ``--scans`` times with a ``--budget`` that lets every
scan read every client (the worst case for memory: a whole pass in one scan), and the
interpreter's peak resident set (``ru_maxrss``) is printed next to its resident set
before the first scan and the chart's limit (helm's ``resources.limits.memory``,
256 MiB).

``--unbounded`` runs the same with the client table's bound lifted (what the backend
did before it had one), for the comparison.

Usage: ``python bench/fdinfo_memory.py [--processes 5000] [--opens 40] [--unbounded]``
(about 900 MB of small files in ``--dir``, a temp dir by default; a minute to write).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHART_LIMIT_MIB = 256  # helm/gpu-exporter/values.yaml: resources.limits.memory
FDINFO = ("drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t{cid}\n"
          "drm-engine-gfx:\t{gfx} ns\ndrm-engine-compute:\t0 ns\n"
          "drm-memory-vram:\t4096 KiB\ndrm-memory-gtt: \t65536 KiB\n")


def generate(root: Path, processes: int, opens: int) -> None:
    from bench.fdinfo_scan import add_card

    proc = root / "proc"
    for i in range(processes):
        pid = 1000 + i
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "fdinfo").mkdir()
        (d / "comm").write_text(f"opener{pid}\n")
        (d / "statm").write_text("25000 4000 1000 200 0 9000 0\n")
        for fd in range(3, 3 + opens):
            os.symlink("/dev/dri/renderD128", d / "fd" / str(fd))
            (d / "fdinfo" / str(fd)).write_text(FDINFO.format(cid=pid * 100 + fd, gfx=fd))
    add_card(root / "sys", "0000:03:00.0", "amdgpu", "1002:747E")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(root: Path, scans: int, budget: float, unbounded: bool) -> None:
    """In the child: the backend's scans, then the peak resident set."""
    from exporter.core.config import Config
    from exporter.sources.fdinfo import backend as fdinfo_backend
    from exporter.sources.fdinfo import scan as fdinfo_scan

    if unbounded:
        fdinfo_scan.MAX_CLIENTS = fdinfo_backend.MAX_CLIENTS = 1 << 62  # type: ignore[misc]
    config = Config(procfs=str(root / "proc"), sysfs=str(root / "sys"), processes_budget=budget)
    backend = fdinfo_backend.FdinfoBackend(config)
    backend.open()
    before = rss_mib()
    for n in range(scans):
        started = time.perf_counter()
        cycle = backend.sample(slow=False)
        took = time.perf_counter() - started
        rows = sum(len(d.processes) for d in cycle.devices)
        errors = {str(reason): n for reason, n in cycle.errors.items()}
        print(f"  scan {n + 1}: {took:6.1f} s, {len(backend._clients):7d} clients followed, "
              f"{rows:5d} process rows, errors {errors}, "
              f"RSS {rss_mib():6.1f} MiB", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"before the first scan: {before:.1f} MiB; peak: {peak:.1f} MiB "
          f"(chart limit {CHART_LIMIT_MIB} MiB: {peak / CHART_LIMIT_MIB:.0%} of it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=5000)
    parser.add_argument("--opens", type=int, default=40)
    parser.add_argument("--scans", type=int, default=3)
    parser.add_argument("--budget", type=float, default=600.0)
    parser.add_argument("--unbounded", action="store_true")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.measure is not None:
        measure(args.measure, args.scans, args.budget, args.unbounded)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        started = time.perf_counter()
        generate(Path(tmp), args.processes, args.opens)
        clients = args.processes * args.opens
        print(f"{clients:,} DRM clients ({args.processes:,} processes x {args.opens} opens) "
              f"written in {time.perf_counter() - started:.0f} s; "
              f"{'unbounded' if args.unbounded else 'bounded'} client table", flush=True)
        child = [sys.executable, __file__, "--measure", tmp, "--scans", str(args.scans),
                 "--budget", str(args.budget)] + (["--unbounded"] if args.unbounded else [])
        subprocess.run(child, check=True)


if __name__ == "__main__":
    main()
