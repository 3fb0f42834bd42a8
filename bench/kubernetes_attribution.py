"""What Kubernetes attribution costs: memory of grpcio, one refresh, one lookup.

    python bench/kubernetes_attribution.py [--pods 110] [--repeat 50]

Prints, each measured in a fresh subprocess or against the fake kubelet and runtime
of tests/fakes/kubelet.py (real gRPC over unix sockets) on a node of ``--pods`` pods
with one container each (110 is the kubelet's default pod limit):
- the resident memory importing grpcio + protobuf + the generated stubs adds (what a
  daemon with ``--no-collector.kubernetes``, or without the socket, does not pay);
- one backend cycle (List + ListContainers + building the Attribution), median, with
  device-plugin GPUs, then with every pod holding a DRA claim instead (CDI spec files
  in the NVIDIA driver's shape re-checked each cycle, device nodes mapped through
  the mixed machine's sysfs), and the ratio of the two;
- ``pod_of`` for a pid seen before (the collector's merge path) and for a new pid
  (reads ``stat`` and ``cgroup`` once), per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.attribution.kubernetes.backend import KubernetesBackend  # noqa: E402
from exporter.core.config import Config  # noqa: E402
from tests.fakes.kubelet import (  # noqa: E402
    ClaimDevice,
    Container,
    DraClaim,
    FakeKubelet,
    FakeRuntime,
    Node,
    Pod,
)

RSS_PROBE = """
import gc, sys
sys.path.insert(0, {repo!r})
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])
import exporter.app.cli, exporter.sources.nvidia.backend  # what the daemon imports anyway
before = rss()
if {load}:
    from exporter.attribution.kubernetes.podresources import PodResourcesClient
    from exporter.attribution.kubernetes.cri import CriClient
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


def dra_scenario(pods: int, cdi: Path) -> Node:
    """Every pod holds a claim of one of 8 GPUs; the specs as NVIDIA's DRA driver writes
    them (a device spec, one claim spec per claim)."""
    (cdi / "k8s.gpu.nvidia.com-device_base.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/device", "devices": [
            {"name": f"gpu-{g}", "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{g}"}]}}
            for g in range(8)],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]}}))
    out = []
    for i in range(pods):
        uid = f"00000000-0000-4000-8000-{i:012d}"
        (cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").write_text(json.dumps({
            "cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{"name": f"{uid}-gpu-{i % 8}", "containerEdits": {"env": ["A=1"]}}]}))
        claim = DraClaim(f"claim-{i}", "ns", [ClaimDevice(
            "gpu.nvidia.com", "node", f"gpu-{i % 8}",
            [f"k8s.gpu.nvidia.com/device=gpu-{i % 8}",
             f"k8s.gpu.nvidia.com/claim={uid}-gpu-{i % 8}"])])
        out.append(Pod("ns", f"pod-{i}", uid, [Container("main", f"{i:064x}", {}, [claim])]))
    return Node(out)


def started(node: Node, proc: Path, cdi: str) -> tuple[KubernetesBackend, FakeKubelet,
                                                      FakeRuntime]:
    tmp = tempfile.mkdtemp()
    kubelet = FakeKubelet(Path(tmp) / "kubelet.sock", node).start()
    runtime = FakeRuntime(Path(tmp) / "cri.sock", node).start()
    config = Config(procfs=str(proc), sysfs=str(REPO / "tests" / "fixtures" / "mixed" / "sys"),
                    kubernetes_pod_resources_socket=str(kubelet.socket),
                    kubernetes_cri_socket=str(runtime.socket), kubernetes_cdi_spec_dirs=(cdi,))
    backend = KubernetesBackend(config)
    backend.open()
    return backend, kubelet, runtime  # type: ignore[return-value]


def interleaved_ms(backends: list[KubernetesBackend], repeat: int) -> list[float]:
    """Median cycle time of each backend, sampled in turn (the same machine noise for all)."""
    times: list[list[float]] = [[] for _ in backends]
    for _ in range(repeat):
        for i, backend in enumerate(backends):
            t0 = time.perf_counter()
            backend.sample(slow=False)
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()

    deltas = [rss_delta_kib(True) - rss_delta_kib(False) for _ in range(3)]
    print(f"grpcio + protobuf + stubs: {statistics.median(deltas) / 1024:.1f} MiB resident")

    node = scenario(args.pods)
    proc = REPO / "tests" / "fixtures" / "k8s-node" / "proc"
    with tempfile.TemporaryDirectory() as cdi:
        runs = [started(node, proc, cdi), started(dra_scenario(args.pods, Path(cdi)), proc, cdi)]
        plain, dra = interleaved_ms([r[0] for r in runs], args.repeat)
        for backend, kubelet, runtime in runs:
            backend.close()
            kubelet.stop()
            runtime.stop()
        print(f"one refresh, {args.pods} pods: device plugins {plain:.2f} ms, DRA claims "
              f"{dra:.2f} ms median (x{dra / plain:.2f})")
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
                cycle = backend.sample(slow=False)
                times.append(time.perf_counter() - t0)
            print(f"one refresh, {args.pods} pods: {statistics.median(times) * 1e3:.2f} ms median")
            enricher = cycle.enricher
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
