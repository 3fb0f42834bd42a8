"""Clients that hang up, and what one page view costs: /metrics during 600 hung-up ``GET /``.

    python bench/hung_up.py [--repo PATH] [--gpus 8] [--requests 600] [--skip-day]

(a) The daemon of ``--repo`` (default: this checkout) with the fake NVML generating
    ``--gpus`` GPUs (8 processes each) and its landing-page history already holding
    900 samples per GPU (``--web.history 15m`` at 1 s: the bench's runner fills the
    ring from the first snapshot, otherwise the daemon is run as ``python -m
    exporter.app.cli``). ``--requests`` connections each send ``GET /`` and reset after
    5 ms (8 at a time), while a scraper asks for ``/metrics`` every 0.25 s on a new
    connection for ``--watch`` seconds: its latency p50/p99/max and the age of the data
    it gets (now minus ``gpu_exporter_last_collection_timestamp_seconds``), median and
    highest; then how long one ``GET /`` takes.
(b) ``--web.history 24h`` (86,400 samples per GPU): the time, body size and the
    daemon's peak RSS growth of one ``/api/v1/history`` and of one ``/``.

``--repo`` runs another checkout (``git archive fae41ea | tar -x -C /tmp/old``) with
the same clients, so the figures compare. Loopback only; bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "bench"))
from flood import free_port  # noqa: E402
from scrape_latency import FAKE_ONLY, fake_env, percentile, stop  # noqa: E402

# The daemon, with the history's ring filled from its first complete snapshot.
RUNNER = """
import os, runpy, sys, time
from exporter.serve import history
_add = history.History.add
def add(self, snapshot, now=None):
    if not getattr(self, "_bench_filled", False) and snapshot.ready:
        self._bench_filled = True
        t = time.time()
        for i in range(self.capacity, 0, -1):
            _add(self, snapshot, now=t - i * self.interval)
        print("history filled", self.capacity, time.time() - t, flush=True)
    return _add(self, snapshot, now)
history.History.add = add
sys.argv = ["exporter.app.cli", *sys.argv[1:]]
runpy.run_module("exporter.app.cli", run_name="__main__", alter_sys=True)
"""
LAST = re.compile(rb"^gpu_exporter_last_collection_timestamp_seconds\{[^}]*\} (\S+)$", re.M)


@contextlib.contextmanager
def daemon(repo: Path, tmp: Path, gpus: int, history: str
           ) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    port = free_port()
    env = fake_env(repo, gpus, 8, tmp)
    log = tmp / f"daemon-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER, "--web.listen-address", f"127.0.0.1:{port}",
             "--log.format", "json", *FAKE_ONLY, "--web.history", history],
            cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "history filled" not in log.read_text(errors="replace") or \
                get(port, "/-/ready")[0] != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("daemon did not come up:\n" + log.read_text()[-2000:])
            time.sleep(0.2)
        yield proc, port, log
    finally:
        stop(proc)


def get(port: int, path: str, timeout: float = 30.0) -> tuple[int, bytes, float]:
    """(status, body, seconds) of one GET on a new connection; status 0 on failure."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, body, time.perf_counter() - t0
    except (OSError, http.client.HTTPException):
        return 0, b"", time.perf_counter() - t0
    finally:
        conn.close()


def hang_up(port: int, count: int, parallel: int = 8) -> threading.Thread:
    """``count`` connections that send ``GET /`` and reset 5 ms later."""
    left = [count]
    lock = threading.Lock()

    def one() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                time.sleep(0.005)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                s.close()  # RST

    def run() -> None:
        workers = [threading.Thread(target=one) for _ in range(parallel)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def vm(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) / 1024


def flood_figures(repo: Path, gpus: int, requests: int, watch: float) -> None:
    with tempfile.TemporaryDirectory(prefix="hung-up-") as tmpdir, \
            daemon(repo, Path(tmpdir), gpus, "15m") as (proc, port, log):
        time.sleep(2)
        latencies, ages, failed = [], [], 0
        flood = hang_up(port, requests)
        t0 = time.monotonic()
        while flood.is_alive() or time.monotonic() - t0 < watch:
            status, body, took = get(port, "/metrics")
            if status != 200:
                failed += 1
            else:
                latencies.append(took)
                stamps = [float(v) for v in LAST.findall(body)]
                if stamps:
                    ages.append(time.time() - max(stamps))
            time.sleep(0.25)
        flood.join(60)
        # the renders the pages' thread still has after the flood
        status, _, page_after = get(port, "/")
    latencies.sort()
    print(f"(a) {gpus} GPUs, 900 history samples each, {requests} GET / reset after 5 ms, "
          f"/metrics watched {watch:.0f} s: {len(latencies)} ok, {failed} failed; latency "
          f"p50 {percentile(latencies, 50) * 1e3:.0f} ms, p99 "
          f"{percentile(latencies, 99) * 1e3:.0f} ms, max {latencies[-1] * 1e3:.0f} ms; "
          f"data age median {statistics.median(ages):.1f} s, max {max(ages):.1f} s; "
          f"a page after it {page_after * 1e3:.0f} ms ({status})")


def day_figures(repo: Path, gpus: int) -> None:
    with tempfile.TemporaryDirectory(prefix="hung-up-") as tmpdir, \
            daemon(repo, Path(tmpdir), gpus, "24h") as (proc, port, log):
        time.sleep(2)
        for path in ("/api/v1/history", "/"):
            with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            before = vm(proc.pid, "VmRSS:")
            status, body, took = get(port, path, timeout=120)
            peak = vm(proc.pid, "VmHWM:")
            print(f"(b) --web.history 24h, {gpus} GPUs: GET {path} {status} in "
                  f"{took:.2f} s, body {len(body) / 2**20:.2f} MiB, daemon RSS {before:.0f} MB "
                  f"-> peak {peak:.0f} MB (+{peak - before:.0f} MB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=HERE, help="checkout whose daemon to run")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--watch", type=float, default=40.0,
                   help="seconds /metrics is watched from the flood's start (default 40)")
    p.add_argument("--skip-day", action="store_true", help="(a) only")
    args = p.parse_args()
    repo = args.repo.resolve()
    print(f"daemon of {repo}")
    flood_figures(repo, args.gpus, args.requests, args.watch)
    if not args.skip_day:
        day_figures(repo, args.gpus)


if __name__ == "__main__":
    main()
