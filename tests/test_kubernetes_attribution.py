"""Device-plugin id formats -> our devices (exporter.attribution.kubernetes.attribution)."""

from __future__ import annotations

import pytest

from exporter.attribution.kubernetes.attribution import (
    CARD,
    NODE,
    PCI,
    UUID,
    Attribution,
    check_offered,
    device_key,
    index_grants,
)
from exporter.attribution.kubernetes.cgroup import ContainerCache
from exporter.attribution.kubernetes.podresources import Grant
from exporter.core.fs import ProcFS
from exporter.core.model import Allocation, DeviceInfo, PodRef

GPU = "GPU-6a1f8f0e-2b4c-4d7e-9a3b-5c2d1e0f4a87"
MIG = "MIG-1c9ae8f2-6a4b-5e0d-9f3a-7b2c4d6e8f01"


@pytest.mark.parametrize(("resource", "device_id", "key"), [
    # NVIDIA/k8s-device-plugin: UUID, time-slicing replica, renamed shared resource, MIG
    ("nvidia.com/gpu", GPU, (UUID, GPU.lower())),
    ("nvidia.com/gpu", f"{GPU}::3", (UUID, GPU.lower())),
    ("nvidia.com/gpu.shared", f"{GPU}::12", (UUID, GPU.lower())),
    ("nvidia.com/mig-1g.10gb", MIG, (UUID, MIG.lower())),
    ("nvidia.com/gpu", MIG, (UUID, MIG.lower())),  # MIG strategy "single"
    # GKE's plugin: device node names
    ("nvidia.com/gpu", "nvidia1", (NODE, "nvidia1")),
    ("nvidia.com/gpu", "nvidia1/vgpu4", (NODE, "nvidia1")),
    # ROCm/k8s-device-plugin: PCI addresses, also under partition resources
    ("amd.com/gpu", "0000:C3:00.0", (PCI, "0000:c3:00.0")),
    ("amd.com/cpx_nps4", "0000:0c:00.0", (PCI, "0000:0c:00.0")),
    # intel-device-plugins-for-kubernetes: <card>-<share index>
    ("gpu.intel.com/i915", "card0-0", (CARD, "card0")),
    ("gpu.intel.com/xe", "card12-7", (CARD, "card12")),
    # not GPUs of ours: skipped, not counted
    ("nvidia.com/rdma_shared_device_a", "rdma0", None),
    ("amd.com/xilinx_u250", "0000:af:00.1", (PCI, "0000:af:00.1")),  # matches no GPU of ours
    ("amd.com/fpga", "fpga0", None),
    ("gpu.intel.com/i915_monitoring", "all", None),
    ("cpu", "3", None),
    ("example.com/gpu", GPU, None),
])
def test_known_formats(resource: str, device_id: str, key: tuple[str, str] | None) -> None:
    assert device_key(resource, device_id) == key


@pytest.mark.parametrize(("resource", "device_id"), [
    ("nvidia.com/gpu", "0"),  # an index: no plugin we know advertises these
    ("nvidia.com/mig-3g.40gb", "nvidia0/gi1"),  # GKE MIG partitions: not mapped
    ("amd.com/gpu", "amdgpu_xcp_30"),  # MI300 partitions: not mapped
    ("amd.com/spx_nps1", "card1"),
    ("gpu.intel.com/xe", "0000:03:00.0"),
    ("gpu.intel.com/i915", "card0"),
])
def test_unknown_formats_raise(resource: str, device_id: str) -> None:
    with pytest.raises(ValueError):
        device_key(resource, device_id)


def pod(name: str, container: str = "main", ns: str = "default") -> PodRef:
    return PodRef(ns, name, container)


def attribution(*grants: Grant) -> tuple[Attribution, dict[str, int]]:
    allocations, errors = index_grants(grants)
    return Attribution(allocations, {}, ContainerCache(ProcFS("/nonexistent"))), dict(errors)


def test_time_sliced_gpu_has_one_allocation_per_container() -> None:
    a, errors = attribution(
        Grant(pod("a"), "nvidia.com/gpu", (f"{GPU}::0",)),
        Grant(pod("b"), "nvidia.com/gpu", (f"{GPU}::1", f"{GPU}::2")),  # two replicas, once
        Grant(pod("c"), "nvidia.com/gpu", ("0",)),
    )
    info = DeviceInfo(vendor="nvidia", pci_bus_id="0000:05:00.0", uuid=GPU, device_node="nvidia0")
    assert a.allocations(info) == (Allocation(pod("a"), "nvidia.com/gpu"),
                                   Allocation(pod("b"), "nvidia.com/gpu"))
    assert errors == {"unknown_device_id": 1}


def test_matching_by_vendor_identity() -> None:
    a, _ = attribution(
        Grant(pod("mig"), "nvidia.com/mig-1g.10gb", (MIG,)),
        Grant(pod("gke"), "nvidia.com/gpu", ("nvidia3",)),
        Grant(pod("amd"), "amd.com/gpu", ("0000:03:00.0",)),
        Grant(pod("intel"), "gpu.intel.com/xe", ("card2-0", "card2-1")),
    )
    mig = DeviceInfo(vendor="nvidia", pci_bus_id="0000:18:00.0", uuid=MIG, device_key=MIG,
                     parent_key="0000:18:00.0")
    parent = DeviceInfo(vendor="nvidia", pci_bus_id="0000:18:00.0", uuid=GPU, device_node="nvidia0")
    gke = DeviceInfo(vendor="nvidia", pci_bus_id="0000:3b:00.0", uuid="GPU-x",
                     device_node="nvidia3")
    amd = DeviceInfo(vendor="amd", pci_bus_id="0000:03:00.0", uuid="0x1", device_node="card1")
    intel = DeviceInfo(vendor="intel", pci_bus_id="0000:09:00.0", uuid="pci-0000:09:00.0",
                       device_node="card2")
    other_intel = DeviceInfo(vendor="intel", pci_bus_id="0000:00:02.0", uuid="u",
                             device_node="card1")
    assert [x.pod.pod for x in a.allocations(mig)] == ["mig"]
    assert a.allocations(parent) == ()  # its MIG slices hold the pods
    assert [x.pod.pod for x in a.allocations(gke)] == ["gke"]
    assert a.allocations(amd) == (Allocation(pod("amd"), "amd.com/gpu"),)
    assert a.allocations(intel) == (Allocation(pod("intel"), "gpu.intel.com/xe"),)
    assert a.allocations(other_intel) == ()
    apple = DeviceInfo(vendor="apple", pci_bus_id="", uuid="soc", device_key="soc0")
    assert a.allocations(apple) == ()


def test_offered_ids_are_checked() -> None:
    assert check_offered({"nvidia.com/gpu": [GPU, "garbage"], "amd.com/gpu": ["amdgpu_xcp_1"],
                          "cpu": ["1"]}) == {"unknown_device_id": 2}
