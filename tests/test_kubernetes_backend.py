"""The kubernetes backend against a fake kubelet and runtime (real gRPC on unix sockets),
on the k8s-node fixture: devices and processes of the real NVIDIA (fake NVML), AMD,
Intel and fdinfo backends get the pods the scenario (k8s-node/kubelet.json) gives them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from exporter.attribution.kubernetes.attribution import Attribution
from exporter.attribution.kubernetes.backend import KubernetesBackend
from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample, PodRef
from exporter.pipeline.hub import Hub
from exporter.pipeline.registry import COLLECTORS, build_backends, forced_but_unavailable
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.base import BackendFailed, BackendUnavailable
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.fdinfo.backend import FdinfoBackend
from exporter.sources.intel.backend import IntelBackend
from exporter.sources.nvidia.backend import NvidiaBackend
from tests.fakes.fake_nvml import FakeGPU, FakeNVML, FakeProcess
from tests.fakes.kubelet import FakeKubelet, FakeRuntime, Node

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NODE_DIR = FIXTURES / "k8s-node"
MIXED_SYS = FIXTURES / "mixed" / "sys"

# The scenario's truth, as tests/fixtures/build_k8s.py lays it out.
GPU_A = "GPU-6a1f8f0e-2b4c-4d7e-9a3b-5c2d1e0f4a87"
GPU_B = "GPU-0f3c2b1a-9e8d-4c7b-a6f5-e4d3c2b1a098"
TRAIN_A = PodRef("ml", "train-a-7d9f", "trainer")
TRAIN_B = PodRef("ml", "train-b-5c4e", "trainer")
NOTEBOOK = PodRef("research", "notebook-c-0", "notebook")
LLM = PodRef("llm", "llm-server-0", "server")
DETECTOR = PodRef("vision", "detector-6b8d", "detector")
TRANSCODE = PodRef("media", "transcode-0", "ffmpeg")
PROCESS_PODS = {3310: None, 7101: TRAIN_A, 7202: TRAIN_B, 7203: TRAIN_B, 7303: NOTEBOOK,
                7404: LLM, 7707: None, 7808: None, 7505: DETECTOR, 7606: TRANSCODE,
                1874: None, 3342: None, 5120: None}


@dataclass
class FakeNode:
    kubelet: FakeKubelet
    runtime: FakeRuntime
    config: Config


@pytest.fixture
def node(tmp_path: Path) -> Iterator[FakeNode]:
    scenario = Node.load(NODE_DIR / "kubelet.json")
    kubelet = FakeKubelet(tmp_path / "kubelet.sock", scenario)
    runtime = FakeRuntime(tmp_path / "containerd.sock", scenario)
    config = Config(procfs=str(NODE_DIR / "proc"), sysfs=str(MIXED_SYS),
                    kubernetes_pod_resources_socket=str(kubelet.socket),
                    kubernetes_cri_socket=str(runtime.socket), kubernetes_interval=0.2)
    with kubelet, runtime:
        yield FakeNode(kubelet, runtime, config)


def gpu_devices(config: Config) -> list[DeviceSample]:
    """What the real backends report on the k8s-node: NVIDIA (fake NVML from nvml.json),
    AMD and Intel from sysfs, and the fdinfo processes of the AMD and Intel GPUs."""
    spec = json.loads((NODE_DIR / "nvml.json").read_text())
    gpus = []
    for i, g in enumerate(spec["gpus"]):
        g = dict(g, processes=[FakeProcess(**p) for p in g["processes"]])
        if "compute_capability" in g:
            g["compute_capability"] = tuple(g["compute_capability"])
        gpus.append(FakeGPU(index=i, **g))
    nvidia = NvidiaBackend(config, nvml=FakeNVML(gpus))
    discovery = DrmDiscovery(SysFS(MIXED_SYS), hotplug=False)
    out: list[DeviceSample] = []
    for backend in (nvidia, AmdBackend(config, discovery), IntelBackend(config, discovery)):
        backend.open()
        out.extend(backend.sample(slow=True).devices)
    fdinfo = FdinfoBackend(config)
    fdinfo.open()
    procs = {d.info.pci_bus_id: d.processes for d in fdinfo.sample(slow=True).devices}
    return [d.with_processes(d.processes + procs.get(d.info.pci_bus_id, ()))
            for d in out]


def open_sample(config: Config) -> tuple[KubernetesBackend, Attribution, dict[str, int]]:
    backend = KubernetesBackend(config)
    assert backend.open() == ()
    cycle = backend.sample(slow=True)
    attribution = cycle.enricher
    assert cycle.devices == () and isinstance(attribution, Attribution)
    return backend, attribution, dict(cycle.errors)


def test_every_gpu_and_process_gets_its_pod(node: FakeNode) -> None:
    backend, attribution, errors = open_sample(node.config)
    devices = {d.info.pci_bus_id: d for d in gpu_devices(node.config)}
    assert set(devices) == {"0000:03:00.0", "0000:05:00.0", "0000:09:00.0", "0000:0b:00.0"}

    def pods(bus: str) -> list[tuple[PodRef, str]]:
        return [(a.pod, a.resource) for a in attribution.allocations(devices[bus].info)]

    # Exclusive GPUs, one per vendor, each matched by its own kind of id.
    assert pods("0000:0b:00.0") == [(LLM, "nvidia.com/gpu")]
    assert pods("0000:03:00.0") == [(DETECTOR, "amd.com/gpu")]
    assert pods("0000:09:00.0") == [(TRANSCODE, "gpu.intel.com/xe")]
    # The time-sliced GPU: one allocation per container, ordered by namespace and pod.
    assert pods("0000:05:00.0") == [(TRAIN_A, "nvidia.com/gpu"), (TRAIN_B, "nvidia.com/gpu"),
                                    (NOTEBOOK, "nvidia.com/gpu")]
    # Every process on every GPU, by its own cgroup: right even on the shared GPU.
    seen = {}
    for device in devices.values():
        for p in device.processes:
            seen[p.pid] = attribution.pod_of(p.pid)
    assert seen == PROCESS_PODS
    # amdgpu_xcp_3 is offered (GetAllocatableResources) and granted (List): counted twice.
    assert errors == {"unknown_device_id": 2}
    # 7707's cgroup names a pod but no container: counted once, in the next cycle, and
    # not again while the process lives (its answer is cached).
    assert backend.sample(slow=False).errors == {"unknown_device_id": 1, "cgroup_format": 1}
    assert attribution.pod_of(7707) is None
    assert backend.sample(slow=False).errors == {"unknown_device_id": 1}


def test_attribution_answers_without_touching_the_sockets(node: FakeNode) -> None:
    _, attribution, _ = open_sample(node.config)
    calls = (dict(node.kubelet.calls), dict(node.runtime.calls))
    node.kubelet.stop()
    node.runtime.stop()
    info = gpu_devices(node.config)[0].info
    assert attribution.allocations(info) and attribution.pod_of(7101) == TRAIN_A
    assert (dict(node.kubelet.calls), dict(node.runtime.calls)) == calls


def test_pod_resources_socket_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config(kubernetes_pod_resources_socket=str(tmp_path / "kubelet.sock"))
    with pytest.raises(BackendUnavailable, match="kubelet.sock not found") as raised:
        KubernetesBackend(config).open()
    # What to set where the kubelet's root directory is not /var/lib/kubelet:
    assert "--kubernetes.pod-resources-socket" in str(raised.value)
    assert "kubernetes.kubeletRootDir" in str(raised.value)
    forced = [b.name for b in build_backends(replace(
        config, collectors={**COLLECTORS, "kubernetes": True}))]
    assert "kubernetes" in forced
    # Auto, no socket named: a workstation without a kubelet keeps its series shapes.
    monkeypatch.setattr("exporter.core.config.DEFAULT_POD_RESOURCES_SOCKET",
                        str(tmp_path / "default.sock"))
    assert "kubernetes" not in [b.name for b in build_backends(Config())]


def test_a_socket_named_but_absent_is_a_down_backend_not_an_exit(
        tmp_path: Path) -> None:
    """The chart forced --collector.kubernetes on: on a kubelet with another --root-dir
    (microk8s, k0s) the daemon exited 2 and the DaemonSet restarted it for ever. Auto with
    the socket named builds the backend: down with the reason, and retried, so a kubelet
    that comes up later is attributed without a restart."""
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    config = Config(kubernetes_pod_resources_socket=str(socket), kubernetes_interval=0.2)
    assert forced_but_unavailable(config, build_backends(config)) is None
    (backend,) = [b for b in build_backends(config) if b.name == "kubernetes"]
    hub = Hub(config, [backend])
    hub.start()
    try:
        assert wait_for(lambda: state(hub).attempted and not state(hub).up)
        assert "not found" in state(hub).reason and state(hub).code.value == "unreachable"
        socket.parent.mkdir()
        with FakeKubelet(socket, Node.load(NODE_DIR / "kubelet.json")):
            assert wait_for(lambda: state(hub).up and state(hub).last is not None)
    finally:
        hub.stop()


def test_build_backends_switch(node: FakeNode) -> None:
    assert "kubernetes" in [b.name for b in build_backends(node.config)]
    off = replace(node.config, collectors={**COLLECTORS, "kubernetes": False})
    assert "kubernetes" not in [b.name for b in build_backends(off)]


def test_cri_socket_missing_keeps_device_attribution(node: FakeNode, tmp_path: Path) -> None:
    config = replace(node.config, kubernetes_cri_socket=str(tmp_path / "nothing.sock"))
    _, attribution, errors = open_sample(config)
    devices = gpu_devices(config)
    by_bus = {d.info.pci_bus_id: d for d in devices}
    assert [a.pod for a in attribution.allocations(by_bus["0000:0b:00.0"].info)] == [LLM]
    assert all(attribution.pod_of(p.pid) is None for d in devices for p in d.processes)
    assert errors["cri_unavailable"] == 1


def test_runtime_failing_keeps_the_last_container_map(node: FakeNode) -> None:
    backend, _, _ = open_sample(node.config)
    node.runtime.stop()
    cycle = backend.sample(slow=False)
    assert cycle.errors.get("cri_unavailable") == 1
    attribution = cycle.enricher
    assert isinstance(attribution, Attribution)
    assert attribution.pod_of(7202) == TRAIN_B  # a container id names one container for ever


def test_kubelet_restart_recovers(node: FakeNode) -> None:
    backend, _, _ = open_sample(node.config)
    node.kubelet.stop()
    with pytest.raises(BackendFailed, match="kubelet.sock not found"):
        backend.sample(slow=False)
    backend.close()
    with pytest.raises(BackendUnavailable, match="not found"):
        backend.open()
    node.kubelet.start()
    backend.open()
    attribution = backend.sample(slow=False).enricher
    assert isinstance(attribution, Attribution) and attribution.pod_of(7404) == LLM


@pytest.mark.slow
def test_kubelet_restart_through_the_collector(node: FakeNode) -> None:
    """The collector reopens every --kubernetes.interval: no exporter restart needed."""
    hub = Hub(node.config, [KubernetesBackend(node.config)])
    hub.start()
    try:
        assert wait_for(lambda: state(hub).up and state(hub).last is not None)
        node.kubelet.stop()
        assert wait_for(lambda: not state(hub).up)
        assert "not found" in state(hub).reason
        node.kubelet.start()
        assert wait_for(lambda: state(hub).up and state(hub).reason == "")
    finally:
        hub.stop()


@pytest.mark.slow  # takes seconds
def test_kubelet_connection_and_its_loss_are_logged_once_each(node: FakeNode) -> None:
    """At start one "backend up" (not a second line of the backend's own), on the loss one
    "backend down" (the failed sample and the reopens that find the socket gone are one
    cause, unreachable), then one "backend recovered" after good cycles."""
    from structlog.testing import capture_logs

    hub = Hub(node.config, [KubernetesBackend(node.config)])
    with capture_logs() as logs:
        hub.start()
        try:
            assert wait_for(lambda: state(hub).up and state(hub).last is not None)
            node.kubelet.stop()
            assert wait_for(lambda: not state(hub).up)
            time.sleep(1.0)  # several reopens, every --kubernetes.interval (0.2 s)
            node.kubelet.start()
            assert wait_for(lambda: state(hub).up and not state(hub).failing)
        finally:
            hub.stop()
    lines = [(e["event"], e.get("code")) for e in logs
             if e["log_level"] != "debug" and e.get("backend", "kubernetes") == "kubernetes"
             and "CRI" not in e["event"]]
    assert lines == [("backend up", None), ("backend down", "unreachable"),
                     ("backend recovered", None)]


@pytest.mark.slow
def test_kubelet_too_slow_is_down_with_the_reason(node: FakeNode) -> None:
    backend, _, _ = open_sample(node.config)
    node.kubelet.delay = 1.5
    started = time.monotonic()
    with pytest.raises(BackendFailed, match="timed out after 1s"):
        backend.sample(slow=False)
    assert time.monotonic() - started < 1.4


def test_kubelet_without_get_allocatable(node: FakeNode) -> None:
    node.kubelet.unimplemented.add("GetAllocatableResources")
    _, attribution, errors = open_sample(node.config)
    assert errors["unknown_device_id"] == 1  # only the granted amdgpu_xcp_3
    assert attribution.pod_of(7101) == TRAIN_A


def state(hub: Hub):  # type: ignore[no-untyped-def]
    (s,) = hub.snapshot.backends
    return s


def wait_for(cond, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False
