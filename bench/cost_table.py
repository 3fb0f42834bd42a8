"""The device cost table: our exporter against nvitop-exporter, and ours alone, idle.

    python bench/cost_table.py compare [--window 60] [--repeats 3] [--load]
    python bench/cost_table.py idle [--window 60] [--intervals 100ms,1s,10s]
    python bench/cost_table.py model [--window 40] [--rss-window 30] [--repeats 2] [--json F]

On a machine with a real NVIDIA GPU (Python 3.12, nvidia-ml-py; ``compare`` also
needs nvitop-exporter 1.7.2, ``--load`` torch):

- ``compare``: ``--repeats`` rounds, each running our daemon (``--collector.interval
  1s``) and then nvitop-exporter (``--interval 1.0``) for a ``--window`` after a
  ``--warmup``, scraped like Prometheus every ``--scrape-every`` seconds, with a CUDA
  matmul loop running (``--load``: started here; else bring your own). Prints both
  exporters' CPU and RSS per round, the medians, and the ratios against the targets
  (CPU at most 0.25x nvitop-exporter's, RSS at most 0.9x).
- ``idle``: our daemon alone, no load, no scrapes, at each interval; prints % of one
  core against the targets (0.6 % at 100 ms, 0.15 % at 1 s, 0.05 % at 10 s).
- ``model``: the device rows of bench/cost_model.py's table. Our daemon alone, idle, no
  scrapes, at each interval, each thread's CPU (schedstat) and wake-ups; then RSS side by
  side with nvitop-exporter (both at 1 s, scraped every ``--scrape-every`` seconds,
  ``--repeats`` alternating rounds of ``--rss-window`` seconds), each process's RSS by
  mapping (/proc/<pid>/smaps: anonymous, heap, libcuda, libnvidia-ml, ...) and threads;
  ``--json`` writes everything. The targets: 1 s on one GPU at most 0.2 % of a core, RSS
  at most 0.9x nvitop-exporter's.

CPU is the sum over the process's threads of /proc/<pid>/task/*/schedstat's time on
CPU (nanoseconds: a 10 s interval spends a few clock ticks a minute, below what
utime+stime's 10 ms ticks resolve); utime+stime of /proc/<pid>/stat (every thread,
dead ones included) is printed beside it as a check. RSS is the median VmRSS over the
window, read once a second. Both processes start from the same Python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from daemon_cost import TICK, cpu_ticks, rss_mib, schedstat, scrape  # noqa: E402
from scrape_latency import start_daemon  # noqa: E402

NVITOP = "{py} -m nvitop_exporter --bind-address 127.0.0.1 --port {{port}} --interval 1.0"
TARGET_CPU_RATIO = 0.25
TARGET_RSS_RATIO = 0.9
TARGET_IDLE = {"100ms": 0.6, "1s": 0.15, "10s": 0.05}  # % of one core
LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
while True:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    time.sleep(0.05)
"""


@dataclass
class Window:
    seconds: float
    cpu_ns: int  # schedstat, live threads
    ticks: int  # utime + stime, every thread
    rss_mib: float

    @property
    def percent(self) -> float:
        return self.cpu_ns / 1e9 / self.seconds * 100

    @property
    def tick_percent(self) -> float:
        return self.ticks / TICK / self.seconds * 100


def schedstat_ns(pid: int) -> int:
    return sum(ns for _, ns, _ in schedstat(pid).values())


def window(pid: int, port: int, seconds: float, scrape_every: float) -> Window:
    ns0, (_, t0) = schedstat_ns(pid), cpu_ticks(f"/proc/{pid}/stat")
    start = time.monotonic()
    rss: list[float] = []
    next_scrape = start
    while (now := time.monotonic()) < start + seconds:
        if scrape_every > 0 and now >= next_scrape:
            scrape(port)
            next_scrape += scrape_every
        rss.append(rss_mib(pid))
        time.sleep(max(0.0, min(1.0, start + seconds - time.monotonic())))
    ns1, (_, t1) = schedstat_ns(pid), cpu_ticks(f"/proc/{pid}/stat")
    return Window(time.monotonic() - start, ns1 - ns0, t1 - t0, statistics.median(rss))


def run(cmd: str | None, extra: list[str], args: argparse.Namespace, scrape_every: float
        ) -> Window:
    with start_daemon(True, extra, cmd=cmd) as target:
        if scrape_every > 0:
            scrape(target.port)
        time.sleep(args.warmup)
        got = window(target.proc.pid, target.port, args.window, scrape_every)
        if target.proc.poll() is not None:
            raise SystemExit(f"exporter exited during the window:\n{target.log_tail()}")
    return got


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def compare(args: argparse.Namespace) -> None:
    load = subprocess.Popen([sys.executable, "-c", LOAD]) if args.load else None
    try:
        if load is not None:
            time.sleep(8)  # CUDA context up, the matmuls running
        ours: list[Window] = []
        theirs: list[Window] = []
        nvitop = args.nvitop or NVITOP.format(py=sys.executable)
        for r in range(1, args.repeats + 1):
            ours.append(run(None, ["--collector.interval", "1s"], args, args.scrape_every))
            theirs.append(run(nvitop, [], args, args.scrape_every))
            print(f"round {r}: gpu-exporter {ours[-1].percent:.3f} % "
                  f"(ticks {ours[-1].tick_percent:.3f} %), {ours[-1].rss_mib:.1f} MiB; "
                  f"nvitop-exporter {theirs[-1].percent:.3f} % "
                  f"(ticks {theirs[-1].tick_percent:.3f} %), {theirs[-1].rss_mib:.1f} MiB",
                  flush=True)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    cpu = (statistics.median(w.percent for w in ours),
           statistics.median(w.percent for w in theirs))
    rss = (statistics.median(w.rss_mib for w in ours),
           statistics.median(w.rss_mib for w in theirs))
    print(f"\n1 s interval, {'CUDA load, ' if args.load else ''}{args.window:.0f} s windows, "
          f"scrape every {args.scrape_every:g} s, medians of {args.repeats} rounds\n")
    print("| | gpu-exporter | nvitop-exporter 1.7.2 | ratio | target | |")
    print("|---|---:|---:|---:|---:|---|")
    print(f"| CPU, % of one core | {cpu[0]:.3f} | {cpu[1]:.3f} | {cpu[0] / cpu[1]:.2f}x | "
          f"<= {TARGET_CPU_RATIO}x | {verdict(cpu[0] <= TARGET_CPU_RATIO * cpu[1])} |")
    print(f"| RSS, MiB | {rss[0]:.1f} | {rss[1]:.1f} | {rss[0] / rss[1]:.2f}x | "
          f"<= {TARGET_RSS_RATIO}x | {verdict(rss[0] <= TARGET_RSS_RATIO * rss[1])} |")


def idle(args: argparse.Namespace) -> None:
    rows = []
    for interval in args.intervals.split(","):
        got = run(None, ["--collector.interval", interval], args, 0)
        rows.append((interval, got))
        print(f"{interval}: {got.percent:.3f} % (ticks {got.tick_percent:.3f} %), "
              f"{got.rss_mib:.1f} MiB", flush=True)
    print(f"\ngpu-exporter alone, idle, no scrapes, {args.window:.0f} s windows\n")
    print("| --collector.interval | % of one core | (utime+stime) | RSS MiB | target | |")
    print("|---|---:|---:|---:|---:|---|")
    for interval, got in rows:
        target = TARGET_IDLE.get(interval)
        print(f"| {interval} | {got.percent:.3f} | {got.tick_percent:.3f} | {got.rss_mib:.1f} | "
              + (f"<= {target} | {verdict(got.percent <= target)} |" if target else "| |"))


def threads_window(pid: int, seconds: float) -> dict[str, tuple[float, float]]:
    """Per thread name: (% of one core, wake-ups per second) over ``seconds``."""
    before, t0 = schedstat(pid), time.monotonic()
    time.sleep(seconds)
    after, elapsed = schedstat(pid), time.monotonic() - t0
    out: dict[str, tuple[float, float]] = {}
    for tid, (name, ns, switches) in after.items():
        _, ns0, switches0 = before.get(tid, (name, 0, 0))
        cpu, wake = out.get(name, (0.0, 0.0))
        out[name] = (cpu + (ns - ns0) / 1e9 / elapsed * 100,
                     wake + (switches - switches0) / elapsed)
    return out


def rss_window(pid: int, port: int, seconds: float, scrape_every: float) -> dict[str, object]:
    got = window(pid, port, seconds, scrape_every)
    from memory import smaps_groups

    groups = smaps_groups(pid)
    names = sorted(open(f"/proc/{pid}/task/{t}/comm").read().strip()
                   for t in os.listdir(f"/proc/{pid}/task"))
    return {"rss_mib": got.rss_mib, "cpu_percent": got.percent,
            "smaps_mib": {k: round(v, 2) for k, v in sorted(groups.items(),
                                                            key=lambda kv: -kv[1])[:12]},
            "threads": names}


def model(args: argparse.Namespace) -> None:
    summary: dict[str, object] = {"intervals": {}, "rss": []}
    print(f"gpu-exporter alone, idle, no scrapes, {args.window:.0f} s windows, per thread "
          "(% of one core, wake-ups/s)", flush=True)
    for interval in args.intervals.split(","):
        with start_daemon(True, ["--collector.interval", interval]) as target:
            time.sleep(args.warmup)
            per = threads_window(target.proc.pid, args.window)
            rss = rss_mib(target.proc.pid)
        total = sum(cpu for cpu, _ in per.values())
        summary["intervals"][interval] = {  # type: ignore[index]
            "percent": total, "rss_mib": rss, "threads": per}
        target_pct = TARGET_IDLE.get(interval)
        print(f"\n{interval}: {total:.3f} % of one core, RSS {rss:.1f} MiB"
              + (f" (1 s target 0.2 %: {verdict(total <= 0.2)})" if interval == "1s" else "")
              + (f" (earlier target {target_pct} %)" if target_pct and interval != "1s" else ""))
        for name, (cpu, wake) in sorted(per.items(), key=lambda kv: -kv[1][0]):
            print(f"  {name:<18} {cpu:7.3f} %  {wake:6.1f} wake-ups/s")
    nvitop = args.nvitop or NVITOP.format(py=sys.executable)
    print(f"\nRSS side by side, both at 1 s, scraped every {args.scrape_every:g} s, "
          f"{args.rss_window:.0f} s windows, {args.repeats} rounds", flush=True)
    for r in range(1, args.repeats + 1):
        row = {}
        for who, cmd, extra in (("gpu-exporter", None, ["--collector.interval", "1s"]),
                                ("nvitop-exporter", nvitop, [])):
            try:
                with start_daemon(True, extra, cmd=cmd) as target:
                    scrape(target.port)
                    time.sleep(args.warmup)
                    row[who] = rss_window(target.proc.pid, target.port, args.rss_window,
                                          args.scrape_every)
            except (SystemExit, OSError) as e:  # nvitop-exporter missing: say so, go on
                row[who] = {"error": str(e)[-500:]}
        summary["rss"].append(row)  # type: ignore[attr-defined]
        ours, theirs = row["gpu-exporter"], row["nvitop-exporter"]
        if "rss_mib" in ours and "rss_mib" in theirs:
            ratio = float(ours["rss_mib"]) / float(theirs["rss_mib"])  # type: ignore[arg-type]
            print(f"round {r}: gpu-exporter {ours['rss_mib']:.1f} MiB "
                  f"({ours['cpu_percent']:.3f} %), nvitop-exporter {theirs['rss_mib']:.1f} MiB "
                  f"({theirs['cpu_percent']:.3f} %): {ratio:.2f}x (target <= "
                  f"{TARGET_RSS_RATIO}x: {verdict(ratio <= TARGET_RSS_RATIO)})", flush=True)
        for who, got in row.items():
            print(f"  {who}: " + json.dumps(got.get("smaps_mib", got)))
            if "threads" in got:
                print(f"  {who} threads: {' '.join(got['threads'])}")  # type: ignore[arg-type]
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, default=str))


VERSIONS = ("pynvml", "prometheus_client", "starlette", "uvicorn", "structlog", "nvitop",
            "nvitop_exporter", "psutil")
SUMMARY = ("nvml_calls", "nvml_memory", "cost_model_real", "cost_model_device")


def versions(args: argparse.Namespace) -> None:
    """What this Python imports: each package's version and file, or that it is missing."""
    import importlib

    print(sys.version)
    for name in VERSIONS:
        try:
            mod = importlib.import_module(name)
            print(name, getattr(mod, "__version__", ""), mod.__file__)
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            print(name, "MISSING", e)


def summary(args: argparse.Namespace) -> None:
    """The JSON files of bench/h100.sh costmodel under ``args.out``, in one object."""
    out = {name: json.loads(f.read_text()) if (f := args.out / f"{name}.json").exists()
           else None for name in SUMMARY}
    print(json.dumps(out, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("compare", "idle", "model", "versions", "summary"))
    ap.add_argument("out", nargs="?", type=Path, default=Path("out"), help="summary: the folder")
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scrape-every", type=float, default=15.0)
    ap.add_argument("--load", action="store_true", help="compare: run a CUDA matmul loop")
    ap.add_argument("--intervals", default="100ms,1s,10s")
    ap.add_argument("--nvitop", help="compare: another command ({port} substituted)")
    ap.add_argument("--rss-window", type=float, default=30.0, help="model: RSS window, s")
    ap.add_argument("--json", type=Path, help="model: write the summary here")
    args = ap.parse_args()
    {"compare": compare, "idle": idle, "model": model, "versions": versions,
     "summary": summary}[args.mode](args)


if __name__ == "__main__":
    main()
