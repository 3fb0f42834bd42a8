"""What the running daemon costs: CPU seconds per minute, % of one core, RSS.

    python bench/daemon_cost.py [--real] [--window 60] [--warmup 10] [--scrape-every 15]
    python bench/daemon_cost.py --cmd 'nvitop-exporter --bind-address 127.0.0.1 --port {port}'
    python bench/daemon_cost.py --warmup 900 --latency 1000   # 8 x 64, the history full

Starts our daemon (fake NVML 8 GPUs x 64 processes, or ``--real``) or ``--cmd`` (any
exporter; ``{port}`` is replaced by a free port, ``/metrics`` is scraped), waits for it
to answer, lets it warm up, then over the window reads the process's CPU time
(utime + stime of /proc/<pid>/stat: every thread, dead ones included) and VmRSS
(/proc/<pid>/status) once a second, while scraping ``/metrics`` like Prometheus does
(its Accept header, gzip, a new connection every ``--scrape-every`` seconds).
Per-thread CPU over the window comes from /proc/<pid>/task/*/stat; our daemon's
threads are named (collector-nvidi[a], renderer, ...; see scrape_latency.py).
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scrape_latency import PROMETHEUS_ACCEPT, start_daemon  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(stat_path: str) -> tuple[str, int]:
    """(comm, utime + stime) from a /proc/.../stat file."""
    with open(stat_path) as f:
        data = f.read()
    comm = data[data.index("(") + 1:data.rindex(")")]
    fields = data[data.rindex(")") + 2:].split()
    return comm, int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)


def status_mib(pid: int, keys: tuple[str, ...] = ("VmRSS",)) -> dict[str, float]:
    """Lines of /proc/<pid>/status in MiB (the kernel gives kB)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in keys:
                out[key] = int(rest.split()[0]) / 1024
    return out


def schedstat(pid: int) -> dict[str, tuple[str, int, int]]:
    """Per live thread (tid): its name, its time on CPU in nanoseconds and how many times
    it was switched in (/proc/<pid>/task/*/schedstat: finer than utime+stime's ticks)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            out[tid] = (name, int(fields[0]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            pass  # the thread exited between listdir and open
    return out


def rss_mib(pid: int) -> float:
    return status_mib(pid).get("VmRSS", 0.0)


def threads(pid: int) -> dict[int, tuple[str, int]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = cpu_ticks(f"/proc/{pid}/task/{tid}/stat")
        except (OSError, ValueError):
            pass  # the thread exited between listdir and open
    return out


def scrape(port: int) -> tuple[float, int]:
    """One Prometheus-like scrape on a new connection: (ms, body bytes)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT,
                                                  "Accept-Encoding": "gzip"})
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    return (time.perf_counter() - t0) * 1e3, len(body)


def measure(pid: int, port: int, window: float, scrape_every: float) -> None:
    _, cpu0 = cpu_ticks(f"/proc/{pid}/stat")
    th0 = threads(pid)
    t0 = time.monotonic()
    rss: list[float] = []
    scrapes: list[tuple[float, int]] = []
    next_scrape = t0
    while (now := time.monotonic()) < t0 + window:
        if scrape_every > 0 and now >= next_scrape:
            scrapes.append(scrape(port))
            next_scrape += scrape_every
        rss.append(rss_mib(pid))
        time.sleep(max(0.0, min(1.0, t0 + window - time.monotonic())))
    _, cpu1 = cpu_ticks(f"/proc/{pid}/stat")
    th1 = threads(pid)
    elapsed = time.monotonic() - t0
    rss.append(rss_mib(pid))

    cpu_s = (cpu1 - cpu0) / TICK
    if scrapes:
        print(f"\nwindow {elapsed:.1f} s, {len(scrapes)} scrapes (gzip, Prometheus Accept; "
              f"median {statistics.median(s for s, _ in scrapes):.2f} ms, "
              f"{scrapes[-1][1]} bytes), {len(rss)} RSS samples, clock tick {1000 / TICK:.0f} ms")
    else:
        print(f"\nwindow {elapsed:.1f} s, no scrapes, {len(rss)} RSS samples, "
              f"clock tick {1000 / TICK:.0f} ms")
    print(f"CPU: {cpu_s:.2f} s in window = {cpu_s / elapsed * 60:.3f} CPU s/min = "
          f"{cpu_s / elapsed * 100:.3f} % of one core")
    print(f"RSS: median {statistics.median(rss):.1f} MiB, max {max(rss):.1f} MiB, "
          f"min {min(rss):.1f} MiB")
    parts = status_mib(pid, ("RssAnon", "RssFile", "RssShmem", "VmHWM"))
    print("     " + ", ".join(f"{k} {v:.1f} MiB" for k, v in parts.items()))
    print(f"\n{'tid':>8} {'thread':<16} {'CPU s':>7} {'CPU s/min':>10} {'% core':>8}")
    for tid in sorted(th1, key=lambda t: -(th1[t][1] - th0.get(t, ("", 0))[1])):
        comm, ticks = th1[tid]
        d = (ticks - th0.get(tid, ("", 0))[1]) / TICK
        name = f"{comm}{' (main)' if tid == pid else ''}"
        print(f"{tid:>8} {name:<16} {d:7.2f} {d / elapsed * 60:10.3f} {d / elapsed * 100:8.3f}")
    gone = sum(t for tid, (_, t) in th0.items() if tid not in th1)
    if gone:
        print(f"(threads that exited during the window had {gone / TICK:.2f} s before it)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="real NVML instead of the fake")
    ap.add_argument("--cmd", help="measure this exporter command instead ({port} substituted)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds measured (default 60)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before (default 10)")
    ap.add_argument("--scrape-every", type=float, default=15.0,
                    help="seconds (default 15); 0: no scrapes in the window")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes", type=int, default=64, help="fake processes per GPU")
    ap.add_argument("--interval", default="1s", help="our --collector.interval (default 1s)")
    ap.add_argument("--latency", type=int, default=0,
                    help="then this many sequential scrapes per format (scrape_latency.py)")
    args = ap.parse_args()
    extra = [] if args.cmd else ["--collector.interval", args.interval]
    with start_daemon(args.real, extra, args.gpus, args.processes, cmd=args.cmd) as target:
        if args.scrape_every > 0:
            scrape(target.port)  # a first scrape, as Prometheus would have done by now
        time.sleep(args.warmup)
        measure(target.proc.pid, target.port, args.window, args.scrape_every)
        if args.latency:
            from scrape_latency import report

            report(target, args.latency, "the same daemon")
            print(f"RSS after: {rss_mib(target.proc.pid):.1f} MiB")
        if target.proc.poll() is not None:
            raise SystemExit(f"exporter exited during the window:\n{target.log_tail()}")


if __name__ == "__main__":
    main()
