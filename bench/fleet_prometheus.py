"""What the fleet reader (exporter.client.fleet.nodes) costs against a real Prometheus holding a
large fleet's series.

    python bench/fleet_prometheus.py [--nodes 250 1000] [--gpus 8] [--procs 2] [--loads 5]

For each fleet size: a synthetic target serves every node's series at once (each
sample carries its node's ``instance``; Prometheus scrapes it with ``honor_labels``, as
it would keep a federated or remote-written fleet's labels), built with
prometheus-client: per GPU ``gpu_up``, ``gpu_info``, utilisation, memory used and total,
power, two temperature sensors, the health verdict, the idle energy counter, a pod
allocation on half the GPUs (a quarter of those idle), and ``--procs`` processes each
with memory and a busy ratio (one in eight idle). Debian's ``prometheus`` scrapes it every
``--scrape`` seconds; after three scrapes the bench runs ``load_fleet`` ``--loads`` times and
``load_node`` on the most wasteful node, and prints the head series, the series the
reader received, and the median and slowest times.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
from exporter.client.fleet.nodes import load_fleet, load_node  # noqa: E402
from exporter.client.fleet.promapi import PrometheusAPI  # noqa: E402
from exporter.client.fleet.ql import FleetQL  # noqa: E402

GPU = ["instance", "job", "gpu", "uuid", "vendor", "source"]


class Fleet(Collector):
    """Every node's series; counters grow with wall time."""

    def __init__(self, nodes: int, gpus: int, procs: int) -> None:
        self.nodes, self.gpus, self.procs = nodes, gpus, procs
        self.started = time.time()
        rng = random.Random(7)
        self.util = [[rng.random() for _ in range(gpus)] for _ in range(nodes)]

    def collect(self) -> Iterator[Metric]:
        elapsed = time.time() - self.started
        fams = {name: GaugeMetricFamily(name, "bench", labels=GPU) for name in (
            "gpu_up", "gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
            "gpu_power_watts", "gpu_health_status")}
        info = GaugeMetricFamily("gpu_info", "bench", labels=[*GPU, "name"])
        temp = GaugeMetricFamily("gpu_temperature_celsius", "bench", labels=[*GPU, "sensor"])
        idle = CounterMetricFamily("gpu_idle_energy_joules", "bench", labels=GPU)
        alloc = GaugeMetricFamily("gpu_kubernetes_allocation_info", "bench",
                                  labels=[*GPU, "namespace", "pod", "container"])
        pl = [*GPU, "pid", "process", "namespace", "pod", "container"]
        pmem = GaugeMetricFamily("gpu_process_memory_used_bytes", "bench", labels=pl)
        putil = GaugeMetricFamily("gpu_process_utilization_ratio", "bench",
                                  labels=[*pl, "engine"])
        build = GaugeMetricFamily("gpu_exporter_build_info", "bench",
                                  labels=["instance", "job", "version"])
        for n in range(self.nodes):
            inst = f"node-{n:05d}:9445"
            build.add_metric([inst, "gpu-exporter", "bench"], 1)
            for g in range(self.gpus):
                base = [inst, "gpu-exporter", str(g), f"GPU-{n:05d}-{g:02d}", "nvidia", "nvml"]
                held = g % 2 == 0
                idle_gpu = held and (n + g) % 8 == 0
                u = 0.0 if idle_gpu else 0.2 + 0.8 * self.util[n][g]
                for name, value in (("gpu_up", 1), ("gpu_utilization_ratio", u),
                                    ("gpu_memory_used_bytes", 40e9 * u),
                                    ("gpu_memory_total_bytes", 80e9),
                                    ("gpu_power_watts", 70 + 600 * u), ("gpu_health_status", 0)):
                    fams[name].add_metric(base, value)
                info.add_metric([*base, "NVIDIA H100 80GB HBM3"], 1)
                temp.add_metric([*base, "gpu"], 40 + 30 * u)
                temp.add_metric([*base, "memory"], 45 + 30 * u)
                idle.add_metric(base, 70 * elapsed * (1 - u))
                pod = ["team", f"job-{n}-{g}", "main"]
                if held:
                    alloc.add_metric([*base, *pod], 1)
                for p in range(self.procs):
                    labels = [*base, str(1000 + 10 * g + p), "python3",
                              *(pod if held else ["", "", ""])]
                    pmem.add_metric(labels, 4e9)
                    putil.add_metric([*labels, "sm"], 0.0 if (g + p) % 8 == 1 else u)
        yield from (*fams.values(), info, temp, idle, alloc, pmem, putil, build)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(registry: CollectorRegistry) -> tuple[ThreadingHTTPServer, int]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except BrokenPipeError:  # a scrape that timed out: Prometheus counts it
                pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


def run(nodes: int, gpus: int, procs: int, loads: int, scrape: int, tmp: Path) -> None:
    registry = CollectorRegistry()
    registry.register(Fleet(nodes, gpus, procs))
    server, port = serve(registry)
    prom_port = free_port()
    config = {"global": {"scrape_interval": f"{scrape}s", "scrape_timeout": f"{scrape}s"},
              "scrape_configs": [{"job_name": "fleet", "honor_labels": True,
                                  "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp / "prometheus.log").open("wb")
    prom = subprocess.Popen([shutil.which("prometheus") or "/usr/bin/prometheus",
                             f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    api = PrometheusAPI(f"http://127.0.0.1:{prom_port}", timeout=120)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            scrapes = api.query("count_over_time(up[10m])")
            if scrapes.ok and scrapes.series and scrapes.series[0].value >= 3:
                break
            time.sleep(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/status/tsdb") as r:
            head = int(json.load(r)["data"]["headStats"]["numSeries"])
        took, slowest, got = [], [], 0
        fleet = None
        for _ in range(loads):
            fleet = load_fleet(api)
            took.append(fleet.seconds)
            slowest.append(fleet.slowest)
            got = fleet.series
        assert fleet is not None and not fleet.errors, fleet.errors if fleet else None
        per_query = {name: min(api.query(expr).seconds for _ in range(3))
                     for name, expr in FleetQL().node_queries().items()}
        top3 = sorted(per_query.items(), key=lambda kv: -kv[1])[:3]
        worst = fleet.nodes[0]
        node_times = []
        for _ in range(loads):
            detail = load_node(api, worst.node)
            node_times.append(detail.seconds)
        print(f"{nodes:6d} nodes {nodes * gpus:7d} GPUs  head series {head:8d}  "
              f"load_fleet: {len(fleet.nodes)} nodes, {got} series read, median "
              f"{statistics.median(took):.2f} s (slowest query {max(slowest):.2f} s)  "
              f"load_node: {len(detail.gpus)} GPUs {len(detail.processes)} processes, median "
              f"{statistics.median(node_times):.3f} s  most waste: {worst.node} "
              f"({worst.waste.idle_gpus} idle GPUs, {worst.waste.idle_processes} idle processes)"
              f"\n        slowest queries (best of 3): "
              + ", ".join(f"{name} {t:.2f} s" for name, t in top3), flush=True)
    finally:
        prom.terminate()
        prom.wait(30)
        log.close()
        server.shutdown()
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[250, 1000])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--scrape", type=int, default=15, help="scrape interval, seconds")
    args = parser.parse_args()
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory() as tmp:
            run(nodes, args.gpus, args.procs, args.loads, args.scrape, Path(tmp))


if __name__ == "__main__":
    main()
