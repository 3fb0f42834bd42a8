"""The kubelet pod-resources API v1 client: which container holds which device.

``PodResourcesLister.List`` answers, for every pod on the node, each container's
devices as (resource name, device ids) exactly as the device plugins advertised
them, and its DRA ResourceClaims' devices as CDI device names (``parse_claims``);
``GetAllocatableResources`` answers what the node offers. Both over the
kubelet's unix socket (``--kubernetes.pod-resources-socket``, by default
``/var/lib/kubelet/pod-resources/kubelet.sock``), read-only, no credentials: access
is whoever can open the socket. The messages come from ``proto/podresources.proto``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.attribution.kubernetes.cri import clean, pod_ref
from exporter.attribution.kubernetes.dra import Claim, own_cdi_ids
from exporter.attribution.kubernetes.rpc import UnixChannel
from exporter.core.model import PodRef


@dataclass(frozen=True)
class Grant:
    """The kubelet gave ``device_ids`` of ``resource`` to this container."""

    pod: PodRef
    resource: str
    device_ids: tuple[str, ...]


def parse_list(response: Any) -> tuple[Grant, ...]:
    """A ListPodResourcesResponse -> one Grant per (container, resource) with devices."""
    grants = []
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = pod_ref(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if devices.device_ids:
                    grants.append(Grant(ref, devices.resource_name, tuple(devices.device_ids)))
    return tuple(grants)


def parse_claims(response: Any) -> tuple[Claim, ...]:
    """A ListPodResourcesResponse -> one Claim per (container, claim, allocated device).

    ``dynamic_resources`` (kubelet 1.27+, on by default since 1.34) lists the container's
    ResourceClaims; each ``claim_resources`` entry is one allocated device of one driver,
    named by ``pool_name``/``device_name``. Its ``cdi_devices`` are cumulative per
    (claim, driver) on the kubelets that exist (exporter.attribution.kubernetes.dra.own_cdi_ids):
    the device's own names are what it adds to the previous entry's.
    """
    claims = []
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = pod_ref(pod.namespace, pod.name, container.name)
            for dynamic in container.dynamic_resources:
                name = clean(f"{dynamic.claim_namespace or pod.namespace}/{dynamic.claim_name}")
                listed = [(r.driver_name, r.pool_name, r.device_name,
                           tuple(d.name for d in r.cdi_devices if d.name))
                          for r in dynamic.claim_resources]
                for (driver, pool, device, _), cdi in zip(listed, own_cdi_ids(listed),
                                                          strict=True):
                    if driver and cdi:
                        claims.append(Claim(ref, name, driver, cdi, pool, device))
    return tuple(claims)


def parse_allocatable(response: Any) -> dict[str, tuple[str, ...]]:
    """An AllocatableResourcesResponse -> resource name -> device ids the node offers."""
    offered: dict[str, list[str]] = {}
    for devices in response.devices:
        offered.setdefault(devices.resource_name, []).extend(devices.device_ids)
    return {name: tuple(ids) for name, ids in offered.items()}


class PodResourcesClient:
    """One channel to the kubelet's pod-resources socket. Calls raise RpcFailed."""

    def __init__(self, path: str) -> None:
        from exporter.attribution.kubernetes.proto import podresources_pb2, podresources_pb2_grpc

        self._pb = podresources_pb2
        self._rpc = UnixChannel(path)
        self._stub = podresources_pb2_grpc.PodResourcesListerStub(self._rpc.channel)  # type: ignore[no-untyped-call]

    def list(self) -> tuple[tuple[Grant, ...], tuple[Claim, ...]]:
        """Device-plugin grants and DRA claims, from one ``List`` call."""
        response = self._rpc.call(self._stub.List, self._pb.ListPodResourcesRequest())
        return parse_list(response), parse_claims(response)

    def allocatable(self) -> dict[str, tuple[str, ...]]:
        request = self._pb.AllocatableResourcesRequest()
        return parse_allocatable(self._rpc.call(self._stub.GetAllocatableResources, request))

    def close(self) -> None:
        self._rpc.close()

