"""What the otlp extra costs: resident memory with the SDK imported and without, and CPU
per push next to one /metrics render of the same snapshot.

    python bench/otlp_cost.py [--machine nvidia-h100x2] [--n 200] [--rounds 3]

RSS: fresh interpreters import what the daemon imports (exporter.app.cli, .collector,
.render, .server), without and then with exporter.output.otlp (the OpenTelemetry SDK and the
OTLP/HTTP exporter); VmRSS is read from /proc/self/status, median of ``--rounds``.
CPU: one fixture machine (the fake NVML of tests/fakes reads its nvml.json) is collected
once; then, ``--n`` times, the push thread's work on that snapshot is timed with
time.thread_time(): the snapshot -> OTLP projection, and the export (protobuf encoding
and the POST to a receiver on 127.0.0.1 that answers 200, whose own CPU is on another
thread and not counted), next to the text exposition of the same snapshot (a scrape).
Medians and ratios are printed. Needs the otlp extra.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SHIM = REPO / "tests" / "fakes" / "pynvml_shim"
DAEMON_IMPORTS = ("import exporter.app.cli, exporter.app.daemon, exporter.pipeline.hub, "
                  "exporter.output.render, "
                  "exporter.serve.server")
READ_RSS = ("print(next(int(l.split()[1]) for l in open('/proc/self/status') "
            "if l.startswith('VmRSS')) / 1024)")


def rss_mib(extra: str, rounds: int) -> float:
    code = f"{DAEMON_IMPORTS}{extra}\n{READ_RSS}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return statistics.median(
        float(subprocess.run([sys.executable, "-c", code], env=env, check=True, text=True,
                             capture_output=True, cwd=REPO).stdout)
        for _ in range(rounds))


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def snapshot_of(machine: str) -> Any:
    sys.path[:0] = [str(SHIM), str(REPO)]
    os.environ["FAKE_NVML_JSON"] = str(FIXTURES / machine / "nvml.json")
    from exporter.core.config import Config
    from exporter.pipeline.hub import Hub
    from exporter.pipeline.registry import build_backends

    proc = FIXTURES / machine / "proc"
    config = Config(sysfs=str(FIXTURES / machine / "sys"),
                    procfs=str(proc if proc.is_dir() else FIXTURES / "empty-proc"))
    hub = Hub(config, build_backends(config))
    snapshot = hub.collect_once()
    hub.stop(timeout=0)
    return config, hub, snapshot


def cpu_ms(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.thread_time()
        fn()
        times.append((time.thread_time() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", default="nvidia-h100x2")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    without = rss_mib("", args.rounds)
    with_sdk = rss_mib("\nimport exporter.output.otlp", args.rounds)
    print(f"RSS after the daemon's imports: {without:.1f} MiB without the SDK, "
          f"{with_sdk:.1f} MiB with exporter.output.otlp: +{with_sdk - without:.1f} MiB "
          f"(x{with_sdk / without:.2f})")

    config, hub, snapshot = snapshot_of(args.machine)
    from dataclasses import replace

    from exporter.output.otlp import Pusher
    from exporter.output.render import Renderer, RenderOptions

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    pusher = Pusher(replace(config, otlp_endpoint=endpoint), hub, RenderOptions())
    renderer = Renderer()
    points = sum(len(m.data.data_points) for rm in pusher.build(snapshot).resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics)

    render = cpu_ms(lambda: renderer._render_bytes(snapshot, renderer.options, False), args.n)
    build = cpu_ms(lambda: pusher.build(snapshot), args.n)
    data = pusher.build(snapshot)
    export = cpu_ms(lambda: pusher.exporter.export(data), args.n)
    server.shutdown()
    print(f"{args.machine}: {points} data points per push, median of {args.n}")
    print(f"  /metrics text render      {render:7.2f} ms CPU")
    print(f"  push: snapshot -> OTLP    {build:7.2f} ms CPU")
    print(f"  push: encode + POST       {export:7.2f} ms CPU")
    print(f"  push in all               {build + export:7.2f} ms CPU "
          f"(x{(build + export) / render:.2f} a render)")


if __name__ == "__main__":
    main()
