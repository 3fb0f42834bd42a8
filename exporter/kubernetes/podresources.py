"""The kubelet pod-resources API v1 client: which container holds which device.

``PodResourcesLister.List`` answers, for every pod on the node, each container's
devices as (resource name, device ids) exactly as the device plugins advertised
them; ``GetAllocatableResources`` answers what the node offers. Both over the
kubelet's unix socket (``--kubernetes.pod-resources-socket``, by default
``/var/lib/kubelet/pod-resources/kubelet.sock``), read-only, no credentials: access
is whoever can open the socket. The messages come from ``proto/podresources.proto``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.kubernetes.rpc import UnixChannel
from exporter.model import PodRef


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
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for devices in container.devices:
                if devices.device_ids:
                    grants.append(Grant(ref, devices.resource_name, tuple(devices.device_ids)))
    return tuple(grants)


def parse_allocatable(response: Any) -> dict[str, tuple[str, ...]]:
    """An AllocatableResourcesResponse -> resource name -> device ids the node offers."""
    offered: dict[str, list[str]] = {}
    for devices in response.devices:
        offered.setdefault(devices.resource_name, []).extend(devices.device_ids)
    return {name: tuple(ids) for name, ids in offered.items()}


class PodResourcesClient:
    """One channel to the kubelet's pod-resources socket. Calls raise RpcFailed."""

    def __init__(self, path: str) -> None:
        from exporter.kubernetes.proto import podresources_pb2, podresources_pb2_grpc

        self._pb = podresources_pb2
        self._rpc = UnixChannel(path)
        self._stub = podresources_pb2_grpc.PodResourcesListerStub(self._rpc.channel)  # type: ignore[no-untyped-call]

    def list(self) -> tuple[Grant, ...]:
        return parse_list(self._rpc.call(self._stub.List, self._pb.ListPodResourcesRequest()))

    def allocatable(self) -> dict[str, tuple[str, ...]]:
        request = self._pb.AllocatableResourcesRequest()
        return parse_allocatable(self._rpc.call(self._stub.GetAllocatableResources, request))

    def close(self) -> None:
        self._rpc.close()

