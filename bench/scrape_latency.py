"""Scrape latency of the real daemon: p50/p90/p99/max over N sequential scrapes.

    python bench/scrape_latency.py [--n 1000] [--real] [--interval 1s]

Starts ``python -m exporter.app.cli`` on a free 127.0.0.1 port, with the fake NVML
generating 8 GPUs x 64 processes (``--real``: the machine's NVML), waits for
``/-/ready``, then scrapes ``/metrics`` N times per format over ONE keep-alive
connection (http.client) and times each request from send to the last body byte.
Formats: text 0.0.4, text + gzip, OpenMetrics. The collector keeps its default 1 s
interval, so renders happen during the run: the honest condition.
``daemon_cost.py`` imports ``start_daemon`` from here.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "tests" / "fakes" / "pynvml_shim"
FAKE_ONLY = ["--no-collector.amd", "--no-collector.intel", "--no-collector.processes"]
# Prometheus' own Accept header (2.x/3.x, scrape_protocols default) and gzip.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,"
                     "application/openmetrics-text;version=0.0.1;q=0.4,"
                     "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
FORMATS: dict[str, dict[str, str]] = {
    "text": {},
    "text+gzip": {"Accept-Encoding": "gzip"},
    "openmetrics": {"Accept": "application/openmetrics-text;version=1.0.0"},
}
# Python < 3.14 does not give threads an OS name; name them (prctl PR_SET_NAME) so
# /proc/<pid>/task/<tid>/comm says collector-nvidi, renderer, ... The daemon is
# otherwise run exactly as ``python -m exporter.app.cli``.
NAMED_THREADS_MAIN = """
import ctypes, runpy, sys, threading
_libc = ctypes.CDLL(None, use_errno=True)
_inner = threading.Thread._bootstrap_inner
def _named(self):
    _libc.prctl(15, self.name.encode()[:15], 0, 0, 0)
    _inner(self)
threading.Thread._bootstrap_inner = _named
sys.argv = ["exporter.app.cli", *sys.argv[1:]]
runpy.run_module("exporter.app.cli", run_name="__main__", alter_sys=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Target:
    """A running exporter process and where to scrape it."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, path: str, log: Path) -> None:
        self.proc, self.port, self.path, self.log = proc, port, path, log

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def wait_ready(self, path: str, timeout: float = 60.0) -> float:
        """Poll ``path`` until it answers 200; return the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise SystemExit(f"exporter exited {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", path)
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return time.monotonic() - t0
            time.sleep(0.05)
        raise SystemExit(f"exporter not ready after {timeout:.0f}s:\n{self.log_tail()}")


def fake_nvml_file(gpus: int, processes: int, tmp: Path) -> Path:
    path = tmp / "fake-nvml.json"
    path.write_text(json.dumps({"generate": {"gpus": gpus, "processes_per_gpu": processes}}))
    return path


def fake_env(repo: Path, gpus: int, processes: int, tmp: Path) -> dict[str, str]:
    """The environment of a daemon of ``repo`` on ``gpus`` fake GPUs (the pynvml shim),
    without the caller's GPU_EXPORTER_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "tests" / "fakes" / "pynvml_shim"),
                                         str(repo)])
    env["FAKE_NVML_JSON"] = str(fake_nvml_file(gpus, processes, tmp))
    return env


@contextlib.contextmanager
def start_daemon(real: bool, extra: Sequence[str] = (), gpus: int = 8, processes: int = 64,
                 cmd: str | None = None, port: int | None = None) -> Iterator[Target]:
    """Start our daemon (fake NVML unless ``real``) or ``cmd`` ({port} is substituted)."""
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmpdir:
        tmp = Path(tmpdir)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
        env["PYTHONUNBUFFERED"] = "1"
        if cmd is not None:
            argv, path = shlex.split(cmd.format(port=port)), "/metrics"
        else:
            paths = [*([] if real else [str(SHIM)]), str(REPO), env.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
            if not real:
                env["FAKE_NVML_JSON"] = str(fake_nvml_file(gpus, processes, tmp))
            argv = [sys.executable, "-c", NAMED_THREADS_MAIN,
                    "--web.listen-address", f"127.0.0.1:{port}", "--log.format", "json",
                    *([] if real else FAKE_ONLY), *extra]
            path = "/-/ready"
        log = tmp / "exporter.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        target = Target(proc, port, path, log)
        try:
            took = target.wait_ready(path)
            what = cmd.format(port=port) if cmd else " ".join(argv[3:])
            kind = "cmd" if cmd else ("real NVML" if real else "fake NVML")
            print(f"started pid {proc.pid} ({kind}), ready in {took:.2f}s: {what}", flush=True)
            yield target
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s: a daemon a bench started never outlives it."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def measure(port: int, path: str, headers: dict[str, str], n: int,
            warmup: int = 20) -> tuple[list[float], int, int]:
    """(sorted latencies ms, last body bytes, distinct bodies seen) over one connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times: list[float] = []
    size, bodies = 0, set()
    try:
        for i in range(warmup + n):
            t0 = time.perf_counter()
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            dt = time.perf_counter() - t0
            if resp.status != 200:
                raise SystemExit(f"GET {path} -> {resp.status}")
            if i >= warmup:
                times.append(dt * 1e3)
                size = len(body)
                bodies.add(zlib.crc32(body))
    finally:
        conn.close()
    return sorted(times), size, len(bodies)


def report(target: Target, n: int, label: str) -> None:
    print(f"\n{label}: {n} sequential scrapes per format, one keep-alive connection")
    print(f"{'format':<12} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'body bytes':>11} {'renders seen':>13} {'wall s':>7}")
    for name, headers in FORMATS.items():
        t0 = time.monotonic()
        times, size, bodies = measure(target.port, "/metrics", headers, n)
        wall = time.monotonic() - t0
        p50, p90, p99 = (percentile(times, q) for q in (50, 90, 99))
        print(f"{name:<12} {p50:8.3f} {p90:8.3f} {p99:8.3f} {times[-1]:8.3f} {size:11d} "
              f"{bodies:13d} {wall:7.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="scrapes per format (default 1000)")
    ap.add_argument("--real", action="store_true", help="real NVML instead of the fake")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes", type=int, default=64, help="fake processes per GPU")
    ap.add_argument("--interval", default="1s", help="--collector.interval (default 1s)")
    args = ap.parse_args()
    extra = ["--collector.interval", args.interval]
    with start_daemon(args.real, extra, args.gpus, args.processes) as target:
        label = "real NVML" if args.real else f"fake NVML {args.gpus} GPUs x {args.processes} procs"
        report(target, args.n, label)


if __name__ == "__main__":
    main()
