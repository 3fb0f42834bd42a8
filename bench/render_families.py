"""Cost of building the per-GPU and per-process families of one snapshot (no exposition).

    python bench/render_families.py [--gpus 8] [--processes 64] [--n 300] [--repo PATH]

Builds ``--gpus`` H100 samples (every field ``bench/dcgm_render.py`` fills) with
``--processes`` processes each, then times ``device_families`` in every
``--metric-names`` mode and prints medians. ``--repo`` imports ``exporter`` from another
checkout, so the same numbers can be printed for two versions on the same machine in the
same run; the ratio is new / other.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def medians(repo: Path, gpus: int, processes: int, n: int) -> dict[str, float]:
    sys.path.insert(0, str(repo))
    sys.path.insert(0, str(HERE))
    render: Any = importlib.import_module("exporter.output.render")
    model: Any = importlib.import_module("exporter.core.model")
    from dcgm_render import sample  # type: ignore[import-not-found]

    devices = []
    for i in range(gpus):
        d = sample(i, 0)
        procs = tuple(model.ProcessSample(pid=1000 * i + p, process=f"proc{p}",
                                          memory_used_bytes=float(p << 20),
                                          utilization_ratio={"sm": 0.5},
                                          host_memory_bytes=float(p << 22), source="nvml")
                      for p in range(processes))
        devices.append((str(i), d.with_processes(procs)))

    class Snap:
        pass

    snap = Snap()
    snap.devices = tuple(devices)  # type: ignore[attr-defined]
    health = importlib.import_module("exporter.pipeline.health")
    if hasattr(health, "verdicts"):  # per-GPU health families, where the checkout has them
        snap.health = health.verdicts(snap.devices, time.time())  # type: ignore[attr-defined]
    out = {}
    for mode in ("gpu", "dcgm", "both"):
        opts = render.RenderOptions(metric_names=mode, hostname="bench")
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            render.device_families(snap, opts)
            times.append((time.perf_counter() - t0) * 1e6)
        out[mode] = statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes", type=int, default=64)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--repo", type=Path, help="also time this checkout's exporter")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternate the two checkouts this many times; keep the lowest median")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(repr(medians(args.child, args.gpus, args.processes, args.n)))
        return
    runs: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):  # alternated: a busy neighbour slows both alike
        for name, repo in (("this", HERE.parent), ("other", args.repo)):
            if repo is None:
                continue
            out = subprocess.run([sys.executable, __file__, "--child", str(repo), "--gpus",
                                  str(args.gpus), "--processes", str(args.processes), "--n",
                                  str(args.n)], check=True, capture_output=True, text=True)
            got = eval(out.stdout)  # noqa: S307 - our own child's repr of a dict
            best = runs.setdefault(name, got)
            for mode, us in got.items():
                best[mode] = min(best[mode], us)
    print(f"{args.gpus} GPUs x {args.processes} processes, lowest median of {args.n} "
          f"over {args.rounds} rounds")
    for mode in ("gpu", "dcgm", "both"):
        line = f"--metric-names={mode:5s} this {runs['this'][mode]:8.0f} us"
        if "other" in runs:
            other = runs["other"][mode]
            line += f"   other {other:8.0f} us   ratio {runs['this'][mode] / other:5.2f}"
        print(line)


if __name__ == "__main__":
    main()
