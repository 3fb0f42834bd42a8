"""Dynamic Resource Allocation: a claim's CDI devices -> the GPUs they put in a container.

The kubelet's pod-resources ``List`` names, per container, each ResourceClaim it uses
and per allocated device the DRA driver (``driver_name``) and the CDI device names the
driver prepared (``cdi_devices``). The CDI spec files (exporter.attribution.kubernetes.cdi) give
each name's device nodes, and a device node names one GPU:

- ``/dev/nvidia<minor>``: the NVIDIA GPU of that NVML minor number (our ``nvidia<minor>``
  device node). NVIDIA/k8s-dra-driver-gpu (driver ``gpu.nvidia.com``) writes kind
  ``k8s.gpu.nvidia.com/device`` with devices ``gpu-<n>`` and ``k8s.gpu.nvidia.com/claim``
  with ``<claim uid>-<device>`` whose edits carry no node (``cmd/gpu-kubelet-plugin/cdi.go``,
  commit 51370e3e6ea6); the device specs come from the container toolkit's nvcdi, whose
  GPU device lists ``/dev/nvidia<minor>``. A MIG device lists its parent's node plus
  ``/dev/nvidia-caps/nvidia-cap<n>`` for its GPU and compute instance; the driver's
  ``<procfs>/driver/nvidia-caps/mig-minors`` (lines ``gpu<g>/gi<i>/ci<c>/access <minor>``,
  as nvidia-container-toolkit ``internal/nvcaps`` and Slurm's ``gpu_nvml.c`` read it)
  names the instance: the MIG device with that parent, GPU instance and compute instance.
- ``/dev/dri/card<n>`` and ``/dev/dri/renderD<n>``: through ``<sysfs>/class/drm/<node>/
  device`` to a PCI bus id. ROCm/k8s-gpu-dra-driver (driver ``gpu.amd.com``) writes kind
  ``k8s.gpu.amd.com/gpu`` with a ``common`` device (environment only) and
  ``<claim uid>-<device>`` devices (``cmd/gpu-kubeletplugin/cdi.go``, commit fa9fe5afced0);
  intel/intel-resource-drivers-for-kubernetes (driver ``gpu.intel.com``) writes kind
  ``intel.com/gpu`` with one device per GPU listing ``/dev/dri/card<n>`` and
  ``/dev/dri/renderD<n>`` (``pkg/gpu/cdihelpers/cdihelpers.go``, commit 49484b7a57cc).
- An NVIDIA device's spec also lists the GPU's DRM nodes: its ``/dev/nvidia<minor>``
  decides. Nodes every GPU of a vendor shares (``/dev/nvidiactl``, ``/dev/nvidia-uvm*``,
  ``/dev/nvidia-modeset``, ``/dev/kfd``) name no GPU: skipped.

How the kubelet lists a claim's devices: in ``GetDynamicResources``
(kubernetes/kubernetes ``pkg/kubelet/cm/container_manager_linux.go``, commit
001332b04220), the CDI device list is declared once per driver of a claim, outside the
loop over that driver's devices, and each ``ClaimResource`` gets the list as it stands
after appending its own device's CDI ids: the n-th device of a driver carries the ids of
devices 1..n. ``own_cdi_ids`` takes back each device's own ids: what its entry adds to
the previous entry's of the same driver. A kubelet that lists only the device's own ids
(the list does not extend the previous one) is read as it is. ``pool_name`` and
``device_name`` identify the device.

Counted, never guessed (``gpu_exporter_collection_errors_total{backend="kubernetes"}``):
``cdi_device_unknown`` (a claim's CDI name in no spec: not written yet, or removed),
``dra_device_node_unknown`` (a GPU-looking node we cannot map: no such DRM node in sysfs,
a capability minor mig-minors does not list, a MIG device without its compute
instance's capability), ``dra_device_shared`` (one claimed device whose nodes name several
GPUs). A claimed device with no GPU node at all (a NIC's, an FPGA's) is skipped.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter.core.fs import ProcFS, SysFS, read_bytes
from exporter.core.labels import ErrorReason
from exporter.core.model import PodRef, normalize_pci_bus_id

# The attribution index names (exporter.attribution.kubernetes.attribution); a MIG key is
# "nvidia<parent minor>/gi<gpu instance>/ci<compute instance>".
NODE, PCI, MIG = "node", "pci", "mig"
MAX_MIG_MINORS_BYTES = 1 << 20

_NVIDIA = re.compile(r"/dev/(nvidia\d+)")
_DRM = re.compile(r"/dev/dri/((?:card|renderD)\d+)")
_MIG_MINOR = re.compile(r"gpu(\d+)/gi(\d+)(/ci\d+)?/access (\d+)")
_CAP_MINOR = re.compile(r"/dev/nvidia-caps/nvidia-cap(\d+)")
_PCI = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


@dataclass(frozen=True)
class Claim:
    """One device of a ResourceClaim, as the kubelet lists it for one container."""

    pod: PodRef
    claim: str  # "<namespace>/<name>"
    driver: str
    cdi_devices: tuple[str, ...]  # this device's own CDI names (own_cdi_ids)
    pool: str = ""
    device: str = ""


def own_cdi_ids(entries: Sequence[tuple[str, str, str, tuple[str, ...]]]
                ) -> list[tuple[str, ...]]:
    """Each (driver, pool, device, CDI names) entry of one claim -> the device's own names.

    The kubelet's list is cumulative per driver (the module's docstring): an entry whose
    list extends the previous entry's of the same driver owns the part it adds; one that
    does not (a kubelet listing each device's own names) owns its whole list. An entry
    that adds nothing (a device without CDI names) owns none.
    """
    previous: dict[str, tuple[str, ...]] = {}
    out = []
    for driver, _, _, names in entries:
        before = previous.get(driver, ())
        if before and len(names) >= len(before) and names[:len(before)] == before:
            out.append(names[len(before):])
        else:
            out.append(names)
        previous[driver] = names
    return out


class NodeResolver:
    """A ``/dev`` path -> (index, key) of our GPU; DRM nodes through sysfs, cached."""

    def __init__(self, sysfs: SysFS, procfs: ProcFS) -> None:
        self.sysfs = sysfs
        self.procfs = procfs
        self._drm: dict[str, str | None] = {}
        self._mig: dict[int, str] | None = None

    def forget(self) -> None:
        """DRM and MIG minors can move (driver reload, MIG reconfiguration): re-read them
        once per cycle, and only when a claim asks."""
        self._drm.clear()
        self._mig = None

    def key(self, path: str) -> tuple[str, str] | None:
        """Our GPU's key; None for a node no GPU owns alone; raises LookupError for a
        GPU node we cannot map."""
        path = os.path.normpath(path)
        if m := _NVIDIA.fullmatch(path):
            return NODE, m.group(1)
        if m := _DRM.fullmatch(path):
            pci = self._pci_of(m.group(1))
            if pci is None:
                raise LookupError(path)
            return PCI, pci
        if m := _CAP_MINOR.fullmatch(path):
            instance = self._mig_minors().get(int(m.group(1)))
            if instance is None:
                raise LookupError(path)
            return MIG, instance
        return None  # nodes shared by all GPUs (nvidiactl, kfd), other devices' nodes

    def _mig_minors(self) -> dict[int, str]:
        if self._mig is None:
            raw = read_bytes(self.procfs.path("driver", "nvidia-caps", "mig-minors"),
                             MAX_MIG_MINORS_BYTES)
            text = raw.decode("ascii", "replace") if raw else ""
            found = (_MIG_MINOR.fullmatch(line.strip()) for line in text.splitlines())
            self._mig = {int(m.group(4)): f"nvidia{m.group(1)}/gi{m.group(2)}{m.group(3) or ''}"
                         for m in found if m}
        return self._mig

    def _pci_of(self, node: str) -> str | None:
        if node not in self._drm:
            target = os.path.basename(os.path.realpath(self.sysfs.path("class", "drm", node,
                                                                          "device")))
            self._drm[node] = normalize_pci_bus_id(target) if _PCI.fullmatch(target) else None
        return self._drm[node]


def claim_keys(claim: Claim, devices: Mapping[str, tuple[str, ...]],
               key: Callable[[str], tuple[str, str] | None]) -> tuple[set[tuple[str, str]],
                                                                    Counter[ErrorReason]]:
    """The GPU keys one claimed device resolves to (at most one), and what was counted."""
    errors: Counter[ErrorReason] = Counter()
    keys: set[tuple[str, str]] = set()
    mig = False
    for name in claim.cdi_devices:
        nodes = devices.get(name)
        if nodes is None:
            errors[ErrorReason.CDI_DEVICE_UNKNOWN] += 1
            continue
        for path in nodes:
            if _CAP_MINOR.fullmatch(os.path.normpath(path)):
                mig = True
            try:
                k = key(path)
            except LookupError:
                errors[ErrorReason.DRA_DEVICE_NODE_UNKNOWN] += 1
                continue
            if k is not None:
                keys.add(k)
    if mig:
        # The parent's node is there too: the compute instance's capability decides,
        # and without it the device is never taken for the whole GPU.
        keys = {k for k in keys if k[0] == MIG and "/ci" in k[1]}
        if not keys:  # counted once per device at least
            unknown = ErrorReason.DRA_DEVICE_NODE_UNKNOWN
            errors[unknown] = max(errors[unknown], 1)
            return set(), errors
    elif any(k[0] == NODE for k in keys):
        # nvcdi lists an NVIDIA GPU's DRM nodes next to /dev/nvidia<minor>: one GPU.
        keys = {k for k in keys if k[0] == NODE}
    if len(keys) > 1:
        errors[ErrorReason.DRA_DEVICE_SHARED] += 1
        return set(), errors
    return keys, errors


def index_claims(claims: Iterable[Claim], devices: Mapping[str, tuple[str, ...]],
                 resolver: NodeResolver) -> tuple[list[tuple[tuple[str, str], Claim]],
                                                  Counter[ErrorReason]]:
    """(GPU key, claim) for every claimed device that names exactly one GPU."""
    out: list[tuple[tuple[str, str], Claim]] = []
    errors: Counter[ErrorReason] = Counter()
    resolver.forget()
    for claim in claims:
        keys, errs = claim_keys(claim, devices, resolver.key)
        errors.update(errs)
        out.extend((k, claim) for k in keys)
    return out, errors
