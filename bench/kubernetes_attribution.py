"""What Kubernetes attribution costs: memory of grpcio, one refresh, one lookup.

    python bench/kubernetes_attribution.py [--pods 110] [--repeat 50]

Prints, each measured in a fresh subprocess or against the fake kubelet and runtime
of tests/fakes/kubelet.py (real gRPC over unix sockets) on a node of ``--pods`` pods
with one container each (110 is the kubelet's default pod limit):
- the resident memory importing grpcio + protobuf + the generated stubs adds (what a
  daemon with ``--no-collector.kubernetes``, or without the socket, does not pay);
- one backend cycle (List + ListContainers + building the Attribution), median;
- ``pod_of`` for a pid seen before (the collector's merge path) and for a new pid
  (reads ``stat`` and ``cgroup`` once), per call.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.config import Config  # noqa: E402
from exporter.kubernetes.backend import KubernetesBackend  # noqa: E402
from tests.fakes.kubelet import Container, FakeKubelet, FakeRuntime, Node, Pod  # noqa: E402

RSS_PROBE = """
import gc, sys
sys.path.insert(0, {repo!r})
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])
import exporter.cli, exporter.backends.nvidia.backend  # what the daemon imports anyway
before = rss()
if {load}:
    from exporter.kubernetes.podresources import PodResourcesClient
    from exporter.kubernetes.cri import CriClient
    PodResourcesClient('/nonexistent.sock').close(); CriClient('/nonexistent.sock').close()
gc.collect()
print(rss() - before)
"""


def rss_delta_kib(load: bool) -> int:
    out = subprocess.run([sys.executable, "-c", RSS_PROBE.format(repo=str(REPO), load=load)],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def scenario(pods: int) -> Node:
    gpu = "GPU-6a1f8f0e-2b4c-4d7e-9a3b-5c2d1e0f4a87"
    return Node([Pod("ns", f"pod-{i}", f"00000000-0000-4000-8000-{i:012d}", [
        Container("main", f"{i:064x}", {"nvidia.com/gpu": [f"{gpu}::{i}"]} if i < 8 else {})])
        for i in range(pods)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()

    deltas = [rss_delta_kib(True) - rss_delta_kib(False) for _ in range(3)]
    print(f"grpcio + protobuf + stubs: {statistics.median(deltas) / 1024:.1f} MiB resident")

    node = scenario(args.pods)
    proc = REPO / "tests" / "fixtures" / "k8s-node" / "proc"
    with tempfile.TemporaryDirectory() as tmp:
        kubelet = FakeKubelet(Path(tmp) / "kubelet.sock", node).start()
        runtime = FakeRuntime(Path(tmp) / "cri.sock", node).start()
        try:
            config = Config(procfs=str(proc), kubernetes_pod_resources_socket=str(kubelet.socket),
                            kubernetes_cri_socket=str(runtime.socket))
            backend = KubernetesBackend(config)
            backend.open()
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                backend.sample(slow=False)
                times.append(time.perf_counter() - t0)
            print(f"one refresh, {args.pods} pods: {statistics.median(times) * 1e3:.2f} ms median")
            enricher = backend.attribution()
            assert enricher is not None
            pids = [int(p.name) for p in proc.iterdir()]
            t0 = time.perf_counter()
            for pid in pids:  # first time: reads stat + cgroup
                enricher.pod_of(pid)
            new = (time.perf_counter() - t0) / len(pids)
            t0 = time.perf_counter()
            n = 0
            for _ in range(200):
                for pid in pids:
                    enricher.pod_of(pid)
                    n += 1
            seen = (time.perf_counter() - t0) / n
            print(f"pod_of: {new * 1e6:.1f} us for a new pid, {seen * 1e6:.2f} us for a seen one")
            backend.close()
        finally:
            kubelet.stop()
            runtime.stop()


if __name__ == "__main__":
    main()
