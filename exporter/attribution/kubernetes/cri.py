"""The CRI runtime client: container id -> pod name, namespace and container name.

One ``runtime.v1.RuntimeService/ListContainers`` call (running containers only)
answers, for every container on the node, the labels the kubelet put on it at
creation: ``io.kubernetes.pod.name``, ``io.kubernetes.pod.namespace``,
``io.kubernetes.container.name`` and ``io.kubernetes.pod.uid`` (the pod UID on
``gpu_kubernetes_allocation_info``). ``ListPodSandbox`` (ready sandboxes) carries the
pod's own labels, read only for ``--kubernetes.pod-labels`` (kubernetes.podlabels).
The container id is the one the cgroup path names
(exporter.attribution.kubernetes.cgroup), so a process maps to its pod even when several pods
share one GPU. The messages come from ``proto/cri.proto``.

The socket is ``--kubernetes.cri-socket``, else the first of the runtimes' default
sockets that exists, each checked in the runtime's source:
- containerd: ``/run/containerd/containerd.sock`` (containerd/containerd
  ``defaults/defaults_unix.go``, ``DefaultAddress``, commit 0f7985d310a3);
- CRI-O: ``/var/run/crio/crio.sock`` (cri-o/cri-o ``pkg/config/config_unix.go``,
  ``CrioSocketPath``, commit 0ffabb00bc5e).
Other runtimes (cri-dockerd: ``/var/run/cri-dockerd.sock``) need the flag. The label
names are kubernetes/kubernetes ``pkg/kubelet/types/labels.go`` (commit 112d7df89667).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from exporter.attribution.kubernetes.rpc import UnixChannel, is_socket
from exporter.core.model import PodRef
from exporter.core.units import printable

DEFAULT_SOCKETS = (
    "/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
)
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
CONTAINER_NAME = "io.kubernetes.container.name"
POD_UID = "io.kubernetes.pod.uid"
MAX_NAME = 253  # a Kubernetes object name (a DNS subdomain) is at most 253 characters


def clean(name: str) -> str:
    """A pod, namespace or container name as it enters: without control or escape
    characters (units.printable, as process names), at most MAX_NAME characters. The
    runtime's labels are whatever the container's creator set, not only the kubelet's."""
    return printable(name, MAX_NAME)


def pod_ref(namespace: str, pod: str, container: str) -> PodRef:
    return PodRef(namespace=clean(namespace), pod=clean(pod), container=clean(container))


def find_socket(configured: str | None,
                exists: Callable[[str], bool] = is_socket) -> str | None:
    """The configured socket, else the first default one that exists, else None."""
    if configured:
        return configured
    return next((path for path in DEFAULT_SOCKETS if exists(path)), None)


def parse_containers(response: Any) -> Mapping[str, PodRef]:
    """A ListContainersResponse -> container id -> PodRef; containers not made by the
    kubelet (no pod labels: a runtime shared with plain docker or nerdctl) are left out."""
    out = {}
    for container in response.containers:
        labels = container.labels
        pod, namespace = labels.get(POD_NAME), labels.get(POD_NAMESPACE)
        if not container.id or not pod or not namespace:
            continue
        name = labels.get(CONTAINER_NAME) or container.metadata.name
        out[container.id] = pod_ref(namespace, pod, name)
    return MappingProxyType(out)


def parse_pod_uids(response: Any) -> Mapping[tuple[str, str], str]:
    """A ListContainersResponse -> (namespace, pod) -> pod UID (``io.kubernetes.pod.uid``)."""
    out = {}
    for container in response.containers:
        labels = container.labels
        pod, namespace, uid = labels.get(POD_NAME), labels.get(POD_NAMESPACE), labels.get(POD_UID)
        if pod and namespace and uid:
            out[(clean(namespace), clean(pod))] = clean(uid)
    return MappingProxyType(out)


class CriClient:
    """One channel to the container runtime's CRI socket. Calls raise RpcFailed."""

    def __init__(self, path: str) -> None:
        from exporter.attribution.kubernetes.proto import cri_pb2, cri_pb2_grpc

        self.path = path
        self._rpc = UnixChannel(path)
        self._stub = cri_pb2_grpc.RuntimeServiceStub(self._rpc.channel)  # type: ignore[no-untyped-call]
        self._request = cri_pb2.ListContainersRequest(filter=cri_pb2.ContainerFilter(
            state=cri_pb2.ContainerStateValue(state=cri_pb2.CONTAINER_RUNNING)))
        self._sandbox_request = cri_pb2.ListPodSandboxRequest(filter=cri_pb2.PodSandboxFilter(
            state=cri_pb2.PodSandboxStateValue(state=cri_pb2.SANDBOX_READY)))

    def containers(self) -> tuple[Mapping[str, PodRef], Mapping[tuple[str, str], str]]:
        """Container id -> its pod, and (namespace, pod) -> pod UID, from one call."""
        response = self._rpc.call(self._stub.ListContainers, self._request)
        return parse_containers(response), parse_pod_uids(response)

    def sandboxes(self) -> Any:
        """The ready pod sandboxes (``ListPodSandbox``): their metadata and pod labels."""
        return self._rpc.call(self._stub.ListPodSandbox, self._sandbox_request)

    def close(self) -> None:
        self._rpc.close()
