"""Where the daemon's resident memory goes, item by item.

    python bench/memory.py [--real] [--gpus 1] [--processes 2]

1. Imports, stage by stage: a fresh interpreter per stage imports one more group of
   modules than the last and prints its RSS (VmRSS), so each group's delta is its cost
   (what lazy imports can save).
2. The running daemon (fake NVML, or ``--real``): after a warm-up and a few scrapes,
   /proc/<pid>/smaps grouped by mapping (the Python heap and anonymous memory, each
   shared library such as libnvidia-ml, thread stacks), its threads, and tracemalloc's
   largest Python allocation sites (the daemon started with PYTHONTRACEMALLOC=1 in a
   second run, since tracing costs memory itself).
3. The same daemon with MALLOC_ARENA_MAX=2 and without, RSS side by side.
4. What the daemon imports on an NVIDIA-only host, every collector at its default
   (bench/imports.py): its module count, top-level packages and own modules.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon_cost import rss_mib, scrape  # noqa: E402
from imports import describe, nvidia_only_args, nvidia_only_env, probe  # noqa: E402
from scrape_latency import start_daemon  # noqa: E402

STAGES = (
    ("python", ""),
    ("+ prometheus_client", "import prometheus_client, prometheus_client.openmetrics.exposition"),
    ("+ starlette, uvicorn", "import starlette.applications, uvicorn"),
    ("+ structlog", "import structlog"),
    ("+ pynvml", "import pynvml"),
    ("+ the exporter (cli, daemon, collector, render, server)",
     "import exporter.app.cli, exporter.app.daemon, exporter.pipeline.hub, "
     "exporter.output.render, exporter.serve.server"),
    ("+ backends (nvidia, amd, intel, fdinfo)",
     "import exporter.sources.nvidia.backend, exporter.sources.amd.backend, "
     "exporter.sources.intel.backend, exporter.sources.fdinfo.backend"),
    ("+ pyudev", "import pyudev; pyudev.Context()"),
    ("+ yaml, bcrypt (only with --config.file / basic auth)", "import yaml, bcrypt"),
    ("+ grpc and the kubernetes stubs (only in a cluster)",
     "import exporter.attribution.kubernetes.rpc"),
)


def import_stages() -> None:
    print("imports, each stage adds to the one before (fresh interpreter each):")
    code = ""
    before = None
    repo = str(Path(__file__).resolve().parent.parent)
    for label, stmt in STAGES:
        code = f"{code}; {stmt}" if stmt else code
        probe = f"{code.lstrip('; ')}\nprint(open('/proc/self/status').read())"
        try:
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                 text=True, timeout=60, cwd=repo).stdout
            rss = int(re.search(r"VmRSS:\s+(\d+)", out).group(1)) / 1024  # type: ignore[union-attr]
        except (AttributeError, subprocess.TimeoutExpired):
            print(f"  {label:<58} (failed to import)")
            code = code.rsplit(";", 1)[0]
            continue
        delta = "" if before is None else f"+{rss - before:5.1f}"
        print(f"  {label:<58} {rss:6.1f} MiB {delta}")
        before = rss


def smaps_groups(pid: int) -> dict[str, float]:
    """RSS (MiB) by mapping: a library's file name, [heap], [stack], anonymous, ..."""
    groups: dict[str, float] = {}
    name = "?"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                path = fields[5] if len(fields) > 5 else ""
                name = os.path.basename(path) if path.startswith("/") else (path or "anonymous")
                name = re.sub(r"\.so[.\d]*$", ".so", name)
                if name.endswith(".so") and "cpython" in name:
                    name = "python extension modules (*.cpython-*.so)"
            elif fields and fields[0] == "Rss:":
                groups[name] = groups.get(name, 0.0) + int(fields[1]) / 1024
    return groups


def running_breakdown(real: bool, gpus: int, processes: int, extra_env: dict[str, str],
                      label: str) -> float:
    env_before = dict(os.environ)
    os.environ.update(extra_env)
    try:
        with start_daemon(real, ["--collector.interval", "1s"], gpus, processes) as target:
            for _ in range(3):
                scrape(target.port)
                time.sleep(2)
            rss = [rss_mib(target.proc.pid) for _ in range(5) if not time.sleep(0.2)]
            pid = target.proc.pid
            groups = smaps_groups(pid)
            threads = sorted(open(f"/proc/{pid}/task/{t}/comm").read().strip()
                             for t in os.listdir(f"/proc/{pid}/task"))
            if label == "default":
                print(f"\nthe running daemon ({'real NVML' if real else 'fake NVML'}, "
                      f"{gpus} GPU(s) x {processes} processes): RSS by mapping")
                for name, mib in sorted(groups.items(), key=lambda kv: -kv[1])[:14]:
                    print(f"  {name:<58} {mib:6.1f} MiB")
                print(f"  threads ({len(threads)}): {', '.join(threads)}")
            return statistics.median(rss)
    finally:
        os.environ.clear()
        os.environ.update(env_before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="real NVML instead of the fake")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()
    import_stages()
    default = running_breakdown(args.real, args.gpus, args.processes, {}, "default")
    arenas = running_breakdown(args.real, args.gpus, args.processes,
                               {"MALLOC_ARENA_MAX": "2"}, "arenas")
    print(f"\nRSS median: {default:.1f} MiB as is, {arenas:.1f} MiB with MALLOC_ARENA_MAX=2")
    running_imports(args.real)


def running_imports(real: bool) -> None:
    got = probe(nvidia_only_args(real), nvidia_only_env(real))
    modules: list[str] = got["modules"]  # type: ignore[assignment]
    rss = int(got["rss_kib"]) / 1024  # type: ignore[call-overload]
    print(f"\nNVIDIA-only daemon, every collector at its default (bench/imports.py), "
          f"RSS {rss:.1f} MiB after the first scrape:\n{describe(modules)}")


if __name__ == "__main__":
    main()
