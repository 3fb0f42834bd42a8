"""Device -> pods and process -> pod: the immutable Enricher one kubernetes cycle yields.

A device plugin names each device it offers with an id of its own format; the
kubelet hands those ids back unchanged in pod-resources ``List``. ``device_key``
turns one id into the key of our DeviceInfo it names. Each format below was read
in the plugin's source (repository, file, commit):

- NVIDIA, NVIDIA/k8s-device-plugin: a GPU's id is its NVML UUID (``GPU-<uuid>``), a MIG
  device's its MIG UUID (``MIG-<uuid>``; ``internal/rm/devices.go`` BuildDevice,
  ``dev.ID = uuid``, commit 03973a973563); a time-sliced or MPS replica is
  ``<uuid>::<n>`` (``NewAnnotatedID``, same file), possibly under a renamed resource
  such as ``nvidia.com/gpu.shared`` (``internal/rm/device_map.go``
  updateDeviceMapWithReplicas, commit 0deecb2d5858). ``--device-id-strategy=index``
  changes only what the container sees, not these ids (``internal/plugin/server.go``
  deviceIDsFromAnnotatedDeviceIDs, commit 01421a201edd). MIG resources are
  ``nvidia.com/mig-<profile>`` (strategy mixed) or ``nvidia.com/gpu`` (single).
- NVIDIA, GoogleCloudPlatform/container-engine-accelerators (GKE): the device node name
  ``nvidia<minor>`` (``pkg/gpu/nvidia/manager.go``, regex ``^nvidia[0-9]*$``, commit
  56913a57fb5a), ``nvidia<minor>/vgpu<n>`` when time-shared (ListDevices in later
  versions of that file). GKE's MIG ids (``nvidia0/gi<n>``) are not mapped: counted.
- AMD, ROCm/k8s-device-plugin: the PCI address from
  ``/sys/module/amdgpu/drivers/pci:amdgpu/<domain:bus:dev.fn>`` under ``amd.com/gpu``, or
  ``amd.com/<compute>_<memory>`` partition resources (``internal/pkg/amdgpu/amdgpu.go``
  GetAMDGPUs and ``internal/pkg/plugin/plugin.go`` ListAndWatch, commit 0821507dbd4c).
  Partition ids ``amdgpu_xcp_<n>`` are not mapped: counted.
- Intel, intel/intel-device-plugins-for-kubernetes: ``<card>-<n>``, the host's DRM card
  name and a share index below ``--shared-dev-num``, under ``gpu.intel.com/i915`` or
  ``gpu.intel.com/xe`` (``cmd/gpu_plugin/gpu_plugin.go`` scan, commit 01b5fb2b93bb). The
  ``*_monitoring`` resources (id ``all``) grant read access to every GPU, not a GPU.

An id of a GPU resource in none of these formats is counted (``unknown_device_id``),
never guessed. Other resources (CPUs, NICs, other vendors' devices) are skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from exporter.attribution.kubernetes.cgroup import ContainerCache
from exporter.attribution.kubernetes.dra import MIG, NODE, PCI, Claim
from exporter.attribution.kubernetes.podlabels import DOC as POD_LABELS_DOC
from exporter.attribution.kubernetes.podlabels import FAMILY as POD_LABELS_FAMILY
from exporter.attribution.kubernetes.podlabels import PodLabels
from exporter.attribution.kubernetes.podresources import Grant
from exporter.attribution.kubernetes.unallocated import unallocated_rows
from exporter.core.labels import ErrorReason
from exporter.core.model import Allocation, DeviceInfo, DeviceSample, PodRef, normalize_pci_bus_id

if TYPE_CHECKING:
    from exporter.core.joins import Row

# Index names: which DeviceInfo field a key is matched against (dra.py uses NODE and PCI).
UUID, NODE, PCI, CARD = "uuid", NODE, PCI, "card"

_NVIDIA_UUID = re.compile(r"((?:GPU|MIG)-[0-9A-Za-z/-]+)(?:::\d+)?")
_NVIDIA_NODE = re.compile(r"(nvidia\d+)(?:/vgpu\d+)?")
_PCI = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_INTEL_CARD = re.compile(r"(card\d+)-\d+")
_NVIDIA_GPU_RESOURCE = re.compile(r"nvidia\.com/(?:gpu(?:\..+)?|mig-.+)")
_AMD_GPU_RESOURCE = re.compile(r"amd\.com/(?:gpu|[a-z]px_nps\d+)")
_INTEL_GPU_RESOURCE = re.compile(r"gpu\.intel\.com/(?:i915|xe)")


def device_key(resource: str, device_id: str) -> tuple[str, str] | None:
    """(index, key) of the device ``device_id`` names; None when it names no GPU of ours.

    Raises ValueError for an id of a GPU resource whose format we do not know.
    """
    if resource.startswith("nvidia.com/"):
        if m := _NVIDIA_UUID.fullmatch(device_id):
            return UUID, m.group(1).lower()
        if m := _NVIDIA_NODE.fullmatch(device_id):
            return NODE, m.group(1)
        if _NVIDIA_GPU_RESOURCE.fullmatch(resource):
            raise ValueError(device_id)
        return None  # the NVIDIA network operator's NICs and the like
    if resource.startswith("amd.com/"):
        if _PCI.fullmatch(device_id):
            return PCI, normalize_pci_bus_id(device_id)
        if _AMD_GPU_RESOURCE.fullmatch(resource):
            raise ValueError(device_id)
        return None
    if _INTEL_GPU_RESOURCE.fullmatch(resource):
        if m := _INTEL_CARD.fullmatch(device_id):
            return CARD, m.group(1)
        raise ValueError(device_id)
    return None


def keys_of(info: DeviceInfo) -> list[tuple[str, str]]:
    """The (index, key) pairs under which a device plugin or a DRA claim
    (exporter.attribution.kubernetes.dra: ``/dev/nvidia<minor>``, a DRM node's PCI bus id, a MIG
    capability) may name ``info``. A slice (MIG, AMD partition) is named by its own
    ids only."""
    keys = []
    if info.vendor == "nvidia":
        keys = [(UUID, k.lower()) for k in (info.uuid, info.device_key) if k]
        if info.device_node and not info.parent_key:
            keys.append((NODE, info.device_node))
        gi, ci = (info.slice_labels.get(k) for k in ("gpu_instance_id", "compute_instance_id"))
        if info.device_node and info.parent_key and gi and ci:  # a MIG device: its parent's node
            keys.append((MIG, f"{info.device_node}/gi{gi}/ci{ci}"))
    elif info.vendor == "intel" and info.device_node:
        keys = [(CARD, info.device_node)]
    if info.pci_bus_id and not info.parent_key and info.vendor in ("amd", "intel", "nvidia"):
        keys.append((PCI, normalize_pci_bus_id(info.pci_bus_id)))
    return keys


PodUids = Mapping[tuple[str, str], str]  # (namespace, pod) -> pod UID


def index_grants(grants: Iterable[Grant], claimed: Iterable[tuple[tuple[str, str], Claim]] = (),
                 pod_uids: PodUids | None = None
                 ) -> tuple[dict[tuple[str, str], tuple[Allocation, ...]], Counter[ErrorReason]]:
    """Every GPU grant and DRA-claimed GPU indexed by device key; one Allocation per
    (container, resource, claim). ``claimed`` comes from exporter.attribution.kubernetes.dra."""
    uids = pod_uids or {}
    index: dict[tuple[str, str], set[Allocation]] = {}
    errors: Counter[ErrorReason] = Counter()

    def add(key: tuple[str, str], pod: PodRef, resource: str, claim: str = "") -> None:
        uid = uids.get((pod.namespace, pod.pod), "")
        index.setdefault(key, set()).add(Allocation(pod, resource, uid, claim))

    for grant in grants:
        for device_id in grant.device_ids:
            try:
                key = device_key(grant.resource, device_id)
            except ValueError:
                errors[ErrorReason.UNKNOWN_DEVICE_ID] += 1
                continue
            if key is not None:
                add(key, grant.pod, grant.resource)
    for key, c in claimed:
        add(key, c.pod, c.driver, c.claim)
    return {k: tuple(sorted(v, key=_order)) for k, v in index.items()}, errors


def _order(a: Allocation) -> tuple[str, ...]:
    return a.pod.namespace, a.pod.pod, a.pod.container, a.resource, a.claim


def check_offered(offered: Mapping[str, Sequence[str]]) -> Counter[ErrorReason]:
    """Unknown id formats among what the node offers (GetAllocatableResources)."""
    errors: Counter[ErrorReason] = Counter()
    for resource, ids in offered.items():
        for device_id in ids:
            try:
                device_key(resource, device_id)
            except ValueError:
                errors[ErrorReason.UNKNOWN_DEVICE_ID] += 1
    return errors


class Attribution:
    """The Enricher of one kubernetes cycle: immutable maps plus the shared pid cache.

    ``allocations`` and ``pod_of`` answer from memory (no socket); ``pod_of`` reads a
    process's cgroup file once, the first time it is asked about that process.
    """

    def __init__(self, allocations: Mapping[tuple[str, str], tuple[Allocation, ...]],
                 containers: Mapping[str, PodRef], cache: ContainerCache,
                 pod_labels: Sequence[PodLabels] = (), containers_known: bool = True) -> None:
        self._allocations = MappingProxyType(dict(allocations))
        self._containers = containers
        self._cache = cache
        self._pod_labels = tuple(pod_labels)
        # The runtime answered this cycle: a process in no known container is outside
        # every pod (exporter.attribution.kubernetes.unallocated), not merely unknown.
        self._containers_known = containers_known

    def join_rows(self, devices: Sequence[tuple[str, DeviceSample]]) -> Iterable[Row]:
        """``gpu_kubernetes_pod_labels_info`` (exporter.attribution.kubernetes.podlabels) and
        ``gpu_kubernetes_unallocated_process_info``
        (exporter.attribution.kubernetes.unallocated)."""
        rows: list[Row] = [(POD_LABELS_FAMILY, POD_LABELS_DOC, {
            "namespace": p.namespace, "pod": p.pod, "source": "cri", **dict(p.labels)})
            for p in self._pod_labels]
        if self._containers_known:
            rows.extend(unallocated_rows(devices))
        return rows

    def allocations(self, info: DeviceInfo) -> Sequence[Allocation]:
        found: list[Allocation] = []
        for key in keys_of(info):
            found.extend(a for a in self._allocations.get(key, ()) if a not in found)
        return tuple(found)

    def pod_of(self, pid: int) -> PodRef | None:
        ref = self._cache.lookup(pid)
        if ref is None or ref.container_id is None:
            return None
        return self._containers.get(ref.container_id)
