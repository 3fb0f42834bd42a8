"""Multi-GPU ResourceClaims as the kubelet really lists them (tests/fixtures/k8s-dra-multi).

The kubelet's ``GetDynamicResources`` (kubernetes/kubernetes ``pkg/kubelet/cm/
container_manager_linux.go``) gives the n-th device of a driver in a claim the CDI ids of
devices 1..n; the fake kubelet sends that shape by default and, with
``cumulative_cdi=False``, the corrected one (each device its own ids). Claims of 2, 4 and
8 GPUs of each driver (NVIDIA, AMD with its ``common`` device first, Intel with one spec
per node) go through real gRPC, the exporter's decoder, the CDI spec files and the sysfs
tree; every GPU of every claim must come out. What each claim should resolve to is read
here from the fixture files (kubelet.json, specs, sysfs links), not from the exporter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.attribution.kubernetes.attribution import index_grants
from exporter.attribution.kubernetes.cdi import CdiRegistry
from exporter.attribution.kubernetes.dra import NodeResolver, index_claims, own_cdi_ids
from exporter.attribution.kubernetes.podresources import PodResourcesClient
from exporter.attribution.kubernetes.proto import podresources_pb2
from exporter.core.fs import ProcFS, SysFS
from tests.daemon import FIXTURES
from tests.fakes.kubelet import FakeKubelet, Node, encode_list

MULTI = FIXTURES / "k8s-dra-multi"
SYS = MULTI / "sys"
CDI_DIRS = [str(MULTI / "cdi" / "etc"), str(MULTI / "cdi" / "run")]
SCENARIO: dict[str, Any] = json.loads((MULTI / "kubelet.json").read_text())
PODS = {p["name"]: p for p in SCENARIO["pods"]}


def spec_nodes() -> dict[str, list[str]]:
    out = {}
    for path in sorted((MULTI / "cdi").rglob("*.*")):
        doc = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(
            path.read_text())
        for device in doc["devices"]:
            nodes = (device.get("containerEdits") or {}).get("deviceNodes") or []
            out[f"{doc['kind']}={device['name']}"] = [n["path"] for n in nodes]
    return out


def truth(pod: dict[str, Any]) -> set[tuple[str, str]]:
    """The GPU keys a pod's claim holds, from its devices' own CDI names: /dev/nvidia<n>
    names NVML minor n, a DRM node the PCI device its sysfs link points at."""
    nodes = spec_nodes()
    out = set()
    for device in pod["containers"][0]["claims"][0]["devices"]:
        paths = [p for name in device["cdi"] for p in nodes[name]]
        nvidia = [os.path.basename(p) for p in paths if p.startswith("/dev/nvidia")
                  and os.path.basename(p)[len("nvidia"):].isdigit()]
        if nvidia:
            out.add(("node", nvidia[0]))
            continue
        (card,) = [os.path.basename(p) for p in paths if "/dev/dri/card" in p]
        out.add(("pci", os.path.basename(os.path.realpath(SYS / "class" / "drm" / card
                                                          / "device"))))
    return out


def served_keys(tmp_path: Path, pod: dict[str, Any], cumulative: bool
                ) -> tuple[set[tuple[str, str]], dict[str, int], int]:
    node = Node.load(MULTI / "kubelet.json")
    node.pods = [p for p in node.pods if p.name == pod["name"]]
    node.cumulative_cdi = cumulative
    with FakeKubelet(tmp_path / "kubelet.sock", node) as kubelet:
        client = PodResourcesClient(str(kubelet.socket))
        try:
            _, claims = client.list()
        finally:
            client.close()
    registry = CdiRegistry(CDI_DIRS)
    errors = dict(registry.refresh())
    claimed, dra_errors = index_claims(claims, registry.devices,
                                       NodeResolver(SysFS(SYS), ProcFS(MULTI / "proc")))
    errors.update(dra_errors)
    allocations, _ = index_grants((), claimed)
    assert all(a.claim == f"train/{pod['containers'][0]['claims'][0]['name']}"
               for found in allocations.values() for a in found)
    return {k for k, _ in claimed}, errors, len(allocations)


@pytest.mark.parametrize("cumulative", [True, False], ids=["kubelet", "own-ids"])
@pytest.mark.parametrize("name", sorted(PODS))
def test_every_gpu_of_a_claim_is_attributed(tmp_path: Path, name: str, cumulative: bool) -> None:
    pod = PODS[name]
    want = truth(pod)
    size = len(pod["containers"][0]["claims"][0]["devices"])
    assert len(want) == size  # the fixture: one GPU per device
    got, errors, allocated = served_keys(tmp_path, pod, cumulative)
    assert got == want
    assert allocated == size
    assert errors == {}  # nothing shared, nothing unknown


def test_the_three_drivers_and_sizes_are_all_there() -> None:
    drivers = {(p["containers"][0]["claims"][0]["devices"][0]["driver"],
                len(p["containers"][0]["claims"][0]["devices"])) for p in PODS.values()}
    assert drivers == {(d, n) for d in ("gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com")
                       for n in (2, 4, 8)}
    amd = PODS["amd-x8-0"]["containers"][0]["claims"][0]["devices"]
    assert all(d["cdi"][0] == "k8s.gpu.amd.com/gpu=common" for d in amd)


def test_the_fake_kubelet_lists_cdi_ids_cumulatively() -> None:
    """The wire bytes, decoded with the upstream field numbers: the n-th ClaimResource of
    a driver carries the CDI ids of devices 1..n (GetDynamicResources), and only its own
    with the corrected shape."""
    node = Node.load(MULTI / "kubelet.json")
    node.pods = [p for p in node.pods if p.name == "amd-x4-0"]
    own = [d.cdi for d in node.pods[0].containers[0].claims[0].devices]
    for cumulative in (True, False):
        node.cumulative_cdi = cumulative
        response = podresources_pb2.ListPodResourcesResponse.FromString(encode_list(node))
        (dynamic,) = response.pod_resources[0].containers[0].dynamic_resources
        lists = [[c.name for c in r.cdi_devices] for r in dynamic.claim_resources]
        want = ([sum(own[:n + 1], []) for n in range(len(own))] if cumulative else own)
        assert lists == want
        assert [r.device_name for r in dynamic.claim_resources] == [
            f"gpu-{n}" for n in range(4)]


def test_old_reading_of_the_kubelet_shape_finds_shared_devices(tmp_path: Path) -> None:
    """Taking each ClaimResource's whole list as one device (the old reading) sees
    several GPUs behind every device after the first: what the issue saw on real nodes."""
    node = Node.load(MULTI / "kubelet.json")
    node.pods = [p for p in node.pods if p.name == "amd-x2-0"]
    response = podresources_pb2.ListPodResourcesResponse.FromString(encode_list(node))
    (dynamic,) = response.pod_resources[0].containers[0].dynamic_resources
    second = [c.name for c in dynamic.claim_resources[1].cdi_devices]
    nodes = spec_nodes()
    cards = {p for name in second for p in nodes[name] if "/dev/dri/card" in p}
    assert len(cards) == 2


def test_own_cdi_ids_of_both_shapes() -> None:
    a, b, c = ("v/k=common", "v/k=a"), ("v/k=common", "v/k=b"), ("w/k=c",)
    # The kubelet's shape: per driver cumulative; another driver starts over.
    kubelet = [("amd", "p", "a", a), ("amd", "p", "b", a + b), ("w", "p", "c", c),
               ("amd", "p", "x", a + b)]  # a device without CDI ids adds nothing
    assert own_cdi_ids(kubelet) == [a, b, c, ()]
    # The corrected shape: each device its own ids.
    assert own_cdi_ids([("amd", "p", "a", a), ("amd", "p", "b", b), ("w", "p", "c", c)]) == [
        a, b, c]
    # A device without CDI ids first: the next one owns its whole list.
    assert own_cdi_ids([("amd", "p", "x", ()), ("amd", "p", "a", a)]) == [(), a]


def test_the_backend_attributes_every_gpu_of_the_real_backends(tmp_path: Path) -> None:
    """The kubernetes backend (kubelet and runtime fakes, every pod of the fixture at
    once) against the GPUs the real NVIDIA (fake NVML, minors 0-7), AMD and Intel
    backends report on the fixture's sysfs: each GPU carries exactly the claims whose
    devices name it."""
    from exporter.attribution.kubernetes.backend import KubernetesBackend
    from exporter.core.config import Config
    from exporter.sources.amd.backend import AmdBackend
    from exporter.sources.discovery import DrmDiscovery
    from exporter.sources.intel.backend import IntelBackend
    from exporter.sources.nvidia.backend import NvidiaBackend
    from tests.fakes.fake_nvml import FakeGPU, FakeNVML
    from tests.fakes.kubelet import FakeRuntime

    node = Node.load(MULTI / "kubelet.json")
    with FakeKubelet(tmp_path / "kubelet.sock", node) as kubelet, \
            FakeRuntime(tmp_path / "containerd.sock", node) as runtime:
        config = Config(procfs=str(MULTI / "proc"), sysfs=str(SYS),
                        kubernetes_pod_resources_socket=str(kubelet.socket),
                        kubernetes_cri_socket=str(runtime.socket),
                        kubernetes_cdi_spec_dirs=tuple(CDI_DIRS))
        backend = KubernetesBackend(config)
        backend.open()
        cycle = backend.sample(slow=True)
        attribution = cycle.enricher
        backend.close()
    assert attribution is not None and dict(cycle.errors) == {}
    nvml = FakeNVML([FakeGPU(index=n, minor=n, uuid=f"GPU-{n:08x}-0000-4000-8000-000000000000",
                             pci_bus_id=f"0000:3{n}:00.0") for n in range(8)])
    discovery = DrmDiscovery(SysFS(SYS), hotplug=False)
    devices = []
    for vendor in (NvidiaBackend(config, nvml=nvml), AmdBackend(config, discovery),
                   IntelBackend(config, discovery)):
        vendor.open()
        devices.extend(vendor.sample(slow=True).devices)
    assert len(devices) == 24
    got = {}
    for d in devices:
        key = (("node", d.info.device_node) if d.info.vendor == "nvidia"
               else ("pci", d.info.pci_bus_id))
        got[key] = {a.claim for a in attribution.allocations(d.info)}
    want: dict[tuple[str, str], set[str]] = {k: set() for k in got}
    for pod in PODS.values():
        claim = pod["containers"][0]["claims"][0]
        for key in truth(pod):
            want[key].add(f"train/{claim['name']}")
    assert got == want
    assert all(len(claims) >= 1 for claims in got.values())  # x8 claims cover every GPU
