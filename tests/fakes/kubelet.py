"""A fake kubelet and a fake container runtime: real gRPC servers on unix sockets.

``FakeKubelet`` serves ``/v1.PodResourcesLister/List`` (device-plugin devices and DRA
claims) and ``GetAllocatableResources``, ``FakeRuntime`` serves
``/runtime.v1.RuntimeService/ListContainers`` and ``ListPodSandbox``, both with grpcio
and from scenario data (``Node``, loadable from a fixture's ``kubelet.json``). Replies
are encoded with tests/fakes/protowire.py from the upstream field numbers, including
fields the exporter's trimmed protos leave out (CPU ids, memory, NUMA topology, DRA
claims, images, annotations), so the exporter's decoding is checked against the real
wire format, not against its own generated classes. A claim's CDI device lists are
cumulative per driver, as the real kubelet's ``GetDynamicResources`` sends them
(``encode_claim``).

Each server can ``stop()`` (removing its socket, as a kubelet restart does), start
again on the same path, answer slower than the client's timeout, or refuse a method
(``UNIMPLEMENTED``, an old kubelet without GetAllocatableResources).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.fakes import protowire as pw

RUNNING, EXITED = 1, 2  # runtime.v1.ContainerState
SANDBOX_READY = 0  # runtime.v1.PodSandboxState


@dataclass
class ClaimDevice:
    """One allocated device of a ResourceClaim (pod-resources ClaimResource)."""

    driver: str
    pool: str
    device: str
    cdi: list[str]  # fully qualified CDI device names


@dataclass
class DraClaim:
    name: str
    namespace: str
    devices: list[ClaimDevice]


@dataclass
class Container:
    name: str
    id: str  # 64 hex: what the cgroup path names
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> device ids
    claims: list[DraClaim] = field(default_factory=list)


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    containers: list[Container]
    labels: dict[str, str] = field(default_factory=dict)  # the pod's own labels (CRI sandbox)


@dataclass
class Node:
    pods: list[Pod]
    allocatable: dict[str, list[str]] = field(default_factory=dict)
    # Containers the runtime runs that the kubelet did not make (no pod labels).
    foreign: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)  # ids of exited kubelet containers
    # DRA claims' CDI lists as the kubelet writes them (encode_claim); False: each device's own.
    cumulative_cdi: bool = True

    @classmethod
    def load(cls, path: Path) -> Node:
        data = json.loads(path.read_text())
        pods = [Pod(p["namespace"], p["name"], p["uid"],
                    [Container(c["name"], c["id"], c.get("devices", {}),
                               [DraClaim(k["name"], k["namespace"], [
                                   ClaimDevice(d["driver"], d["pool"], d["device"], d["cdi"])
                                   for d in k["devices"]]) for k in c.get("claims", [])])
                     for c in p["containers"]], p.get("labels", {})) for p in data["pods"]]
        return cls(pods, data.get("allocatable", {}), data.get("foreign", []),
                   data.get("exited", []))


def _topology(numa: int) -> bytes:
    return pw.blob(1, pw.uint(1, numa))  # TopologyInfo.nodes[0].ID


def encode_list(node: Node) -> bytes:
    """ListPodResourcesResponse, with every upstream field a real kubelet fills."""
    out = b""
    for pod in node.pods:
        body = pw.string(1, pod.name) + pw.string(2, pod.namespace)
        for c in pod.containers:
            cbody = pw.string(1, c.name)
            for resource, ids in c.devices.items():
                cbody += pw.blob(2, pw.string(1, resource) + pw.strings(2, ids)
                                 + pw.blob(3, _topology(0)))
            cbody += pw.packed(3, [2, 3])  # cpu_ids
            cbody += pw.blob(4, pw.string(1, "memory") + pw.uint(2, 1 << 30)
                             + pw.blob(3, _topology(0)))
            for claim in c.claims:
                cbody += pw.blob(5, encode_claim(claim, node.cumulative_cdi))
            body += pw.blob(3, cbody)
        out += pw.blob(1, body)
    return out


def encode_claim(claim: DraClaim, cumulative: bool = True) -> bytes:
    """DynamicResource, with class_name (1), which kubelets before 1.31 still send.

    As the kubelet builds it (kubernetes/kubernetes ``pkg/kubelet/cm/
    container_manager_linux.go``, ``GetDynamicResources``, commit 001332b04220): the
    claim's devices grouped by driver (a Go map: any driver order), and per driver one
    CDI list declared outside the loop over its devices, so each ClaimResource carries
    the CDI names of that driver's devices up to and including its own. With
    ``cumulative=False``, each lists its own names only (a kubelet that fixes this).
    """
    out = pw.string(1, "gpu.example.com") + pw.string(2, claim.name) + pw.string(3, claim.namespace)
    by_driver: dict[str, list[ClaimDevice]] = {}
    for d in claim.devices:
        by_driver.setdefault(d.driver, []).append(d)
    for driver, devices in by_driver.items():
        cdi_devices: list[str] = []
        for d in devices:
            cdi_devices = [*cdi_devices, *d.cdi] if cumulative else list(d.cdi)
            cdi = b"".join(pw.blob(1, pw.string(1, name)) for name in cdi_devices)
            out += pw.blob(4, cdi + pw.string(2, driver) + pw.string(3, d.pool)
                           + pw.string(4, d.device))
    return out


def encode_allocatable(node: Node) -> bytes:
    out = b"".join(pw.blob(1, pw.string(1, r) + pw.strings(2, ids) + pw.blob(3, _topology(1)))
                   for r, ids in node.allocatable.items())
    return out + pw.packed(2, range(8)) + pw.blob(3, pw.string(1, "memory") + pw.uint(2, 1 << 34))


def _container(cid: str, labels: Mapping[str, str], name: str, state: int) -> bytes:
    return pw.blob(1, pw.string(1, cid) + pw.string(2, "sandbox-" + cid[:12])
                   + pw.blob(3, pw.string(1, name) + pw.uint(2, 1))
                   + pw.blob(4, pw.string(1, "registry.example/app:1"))  # image
                   + pw.string(5, "sha256:" + "ab" * 32) + pw.uint(6, state)
                   + pw.uint(7, 1_700_000_000_000_000_000) + pw.string_map(8, labels)
                   + pw.string_map(9, {"io.kubernetes.container.restartCount": "0"})
                   + pw.string(10, "sha256:" + "cd" * 32))


def encode_containers(node: Node, state_filter: int | None) -> bytes:
    out = b""
    for pod in node.pods:
        for c in pod.containers:
            state = EXITED if c.id in node.exited else RUNNING
            if state_filter is not None and state != state_filter:
                continue
            labels = {"io.kubernetes.pod.name": pod.name,
                      "io.kubernetes.pod.namespace": pod.namespace,
                      "io.kubernetes.pod.uid": pod.uid,
                      "io.kubernetes.container.name": c.name}
            out += _container(c.id, labels, c.name, state)
    for cid in node.foreign:
        out += _container(cid, {"nerdctl/name": "builder"}, "builder", RUNNING)
    return out


def encode_sandboxes(node: Node, state_filter: int | None) -> bytes:
    """ListPodSandboxResponse: every pod's sandbox READY (0), labels as the kubelet sets
    them (the pod's own plus io.kubernetes.pod.*), with annotations and runtime handler."""
    out = b""
    for n, pod in enumerate(node.pods):
        if state_filter not in (None, SANDBOX_READY):
            continue
        labels = {**pod.labels, "io.kubernetes.pod.name": pod.name,
                  "io.kubernetes.pod.namespace": pod.namespace, "io.kubernetes.pod.uid": pod.uid}
        meta = (pw.string(1, pod.name) + pw.string(2, pod.uid) + pw.string(3, pod.namespace)
                + pw.uint(4, 0))
        out += pw.blob(1, pw.string(1, f"sandbox-{n:04d}") + pw.blob(2, meta)
                       + pw.uint(3, SANDBOX_READY) + pw.uint(4, 1_700_000_000_000_000_000 + n)
                       + pw.string_map(5, labels)
                       + pw.string_map(6, {"kubernetes.io/config.source": "api"})
                       + pw.string(7, "runc"))
    return out


def state_filter_of(request: bytes) -> int | None:
    """ListContainersRequest.filter.state.state, None when the client sent no filter."""
    for flt in pw.fields(request).get(1, []):
        for value in pw.fields(flt).get(2, []):  # type: ignore[arg-type]
            return int(pw.fields(value).get(1, [0])[0])  # type: ignore[arg-type]
    return None


class _Server:
    """One grpcio server on a unix socket, serving raw bytes per method."""

    service = ""

    def __init__(self, socket: Path, node: Node) -> None:
        self.socket = socket
        self.node = node
        self.delay = 0.0  # seconds to sleep before answering (timeouts)
        self.unimplemented: set[str] = set()
        self.calls: Counter[str] = Counter()
        self.requests: list[bytes] = []
        self._server: Any = None
        self._lock = threading.Lock()

    def handlers(self) -> dict[str, Callable[[bytes], bytes]]:
        raise NotImplementedError

    def _wrap(self, name: str, fn: Callable[[bytes], bytes]) -> Callable[[bytes, Any], bytes]:
        def handle(request: bytes, context: Any) -> bytes:
            with self._lock:
                self.calls[name] += 1
                self.requests.append(request)
            if name in self.unimplemented:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} not enabled")
            if self.delay:
                time.sleep(self.delay)
            return fn(request)
        return handle

    def start(self) -> _Server:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        methods = {name: grpc.unary_unary_rpc_method_handler(self._wrap(name, fn))
                   for name, fn in self.handlers().items()}
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(self.service, methods),))
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def __enter__(self) -> _Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeKubelet(_Server):
    service = "v1.PodResourcesLister"

    def handlers(self) -> dict[str, Callable[[bytes], bytes]]:
        return {"List": lambda _: encode_list(self.node),
                "GetAllocatableResources": lambda _: encode_allocatable(self.node)}


class FakeRuntime(_Server):
    service = "runtime.v1.RuntimeService"

    def handlers(self) -> dict[str, Callable[[bytes], bytes]]:
        return {"ListContainers":
                lambda req: encode_containers(self.node, state_filter_of(req)),
                "ListPodSandbox":
                lambda req: encode_sandboxes(self.node, state_filter_of(req))}
