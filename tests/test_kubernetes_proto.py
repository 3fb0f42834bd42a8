"""The trimmed protos speak the upstream wire format.

Both directions go through tests/fakes/protowire.py, a hand encoder/decoder written
from the protobuf encoding spec and the upstream field numbers, not from our .proto:
- upstream-shaped bytes (with every field a real kubelet or runtime sends, the ones our
  protos leave out included) decode with our generated classes into the right values;
- what our classes encode decodes, field by field, to the upstream numbers and types;
- the service and method names (the gRPC paths) are the upstream ones.
"""

from __future__ import annotations

import re

from exporter.attribution.kubernetes.cri import parse_containers, parse_pod_uids
from exporter.attribution.kubernetes.dra import Claim
from exporter.attribution.kubernetes.podlabels import PodLabels, parse_sandboxes
from exporter.attribution.kubernetes.podresources import (
    Grant,
    parse_allocatable,
    parse_claims,
    parse_list,
)
from exporter.attribution.kubernetes.proto import cri_pb2, podresources_pb2
from exporter.core.model import PodRef
from tests.fakes import protowire as pw
from tests.fakes.kubelet import (
    RUNNING,
    SANDBOX_READY,
    ClaimDevice,
    Container,
    DraClaim,
    Node,
    Pod,
    encode_allocatable,
    encode_containers,
    encode_list,
    encode_sandboxes,
    state_filter_of,
)

GPU = "GPU-6a1f8f0e-2b4c-4d7e-9a3b-5c2d1e0f4a87"
CLAIM = DraClaim("shared-gpu", "ml", [
    ClaimDevice("gpu.nvidia.com", "node-1", "gpu-1",
                ["k8s.gpu.nvidia.com/device=gpu-1", "k8s.gpu.nvidia.com/claim=uid-1-gpu-1"]),
    ClaimDevice("example.com/no-cdi", "node-1", "nic-0", [])])
NODE = Node(
    pods=[Pod("ml", "train-a", "0b8e7d1c-0000-4000-8000-000000000001", [
        Container("trainer", "a" * 64, {"nvidia.com/gpu": [f"{GPU}::0", f"{GPU}::2"],
                                        "amd.com/gpu": ["0000:03:00.0"]}, [CLAIM]),
        Container("sidecar", "b" * 64)], {"team": "vision", "app.kubernetes.io/name": "t"})],
    allocatable={"nvidia.com/gpu": [f"{GPU}::{n}" for n in range(4)]},
    foreign=["c" * 64], exited=["b" * 64])


def test_pod_resources_list_from_upstream_bytes() -> None:
    response = podresources_pb2.ListPodResourcesResponse.FromString(encode_list(NODE))
    trainer = PodRef("ml", "train-a", "trainer")
    assert parse_list(response) == (
        Grant(trainer, "nvidia.com/gpu", (f"{GPU}::0", f"{GPU}::2")),
        Grant(trainer, "amd.com/gpu", ("0000:03:00.0",)),
    )  # the sidecar holds no device: no grant
    container = response.pod_resources[0].containers[0]
    assert [f.name for f, _ in container.ListFields()] == ["name", "devices",
                                                           "dynamic_resources"]


def test_dra_claims_from_upstream_bytes() -> None:
    # Upstream bytes carry class_name (1, dropped in 1.31): skipped, the rest decoded.
    response = podresources_pb2.ListPodResourcesResponse.FromString(encode_list(NODE))
    (dynamic,) = response.pod_resources[0].containers[0].dynamic_resources
    assert (dynamic.claim_name, dynamic.claim_namespace) == ("shared-gpu", "ml")
    gpu = dynamic.claim_resources[0]
    assert (gpu.driver_name, gpu.pool_name, gpu.device_name) == ("gpu.nvidia.com", "node-1",
                                                                 "gpu-1")
    # The device without CDI names (no device nodes to resolve) yields no Claim.
    assert parse_claims(response) == (Claim(
        PodRef("ml", "train-a", "trainer"), "ml/shared-gpu", "gpu.nvidia.com",
        ("k8s.gpu.nvidia.com/device=gpu-1", "k8s.gpu.nvidia.com/claim=uid-1-gpu-1"),
        "node-1", "gpu-1"),)


def test_our_dra_messages_use_upstream_numbers() -> None:
    msg = podresources_pb2.ContainerResources(name="c", dynamic_resources=[
        podresources_pb2.DynamicResource(claim_name="n", claim_namespace="ns", claim_resources=[
            podresources_pb2.ClaimResource(cdi_devices=[podresources_pb2.CDIDevice(name="v/c=d")],
                                           driver_name="drv", pool_name="p", device_name="d")])])
    (dynamic,) = pw.fields(msg.SerializeToString())[5]
    f = pw.fields(dynamic)  # type: ignore[arg-type]
    assert (f[2], f[3]) == ([b"n"], [b"ns"])
    resource = pw.fields(f[4][0])  # type: ignore[arg-type]
    assert (resource[2], resource[3], resource[4]) == ([b"drv"], [b"p"], [b"d"])
    assert pw.fields(resource[1][0]) == {1: [b"v/c=d"]}  # type: ignore[arg-type]


def test_cri_sandboxes_from_upstream_bytes() -> None:
    response = cri_pb2.ListPodSandboxResponse.FromString(encode_sandboxes(NODE, None))
    (sandbox,) = response.items
    meta = sandbox.metadata
    assert (meta.name, meta.namespace, meta.uid) == ("train-a", "ml",
                                                    "0b8e7d1c-0000-4000-8000-000000000001")
    assert sandbox.state == cri_pb2.SANDBOX_READY
    pods, errors = parse_sandboxes(response, re.compile(r"team|app\.kubernetes\.io/.*|io\..*"))
    # The kubelet's io.kubernetes.pod.* labels are never exported, whatever the regex.
    assert pods == (PodLabels("ml", "train-a", (("label_app_kubernetes_io_name", "t"),
                                                ("label_team", "vision"))),)
    assert not errors


def test_our_sandbox_request_asks_for_ready_sandboxes() -> None:
    request = cri_pb2.ListPodSandboxRequest(filter=cri_pb2.PodSandboxFilter(
        state=cri_pb2.PodSandboxStateValue(state=cri_pb2.SANDBOX_READY)))
    assert state_filter_of(request.SerializeToString()) == SANDBOX_READY
    msg = cri_pb2.PodSandbox(id="i", metadata=cri_pb2.PodSandboxMetadata(
        name="n", uid="u", namespace="ns", attempt=2), state=cri_pb2.SANDBOX_NOTREADY,
        created_at=9, labels={"k": "v"})
    f = pw.fields(msg.SerializeToString())
    assert (f[1], f[3], f[4]) == ([b"i"], [1], [9])
    assert pw.fields(f[2][0]) == {1: [b"n"], 2: [b"u"], 3: [b"ns"], 4: [2]}  # type: ignore[arg-type]
    assert pw.fields(f[5][0]) == {1: [b"k"], 2: [b"v"]}  # type: ignore[arg-type]


def test_allocatable_from_upstream_bytes() -> None:
    response = podresources_pb2.AllocatableResourcesResponse.FromString(encode_allocatable(NODE))
    assert parse_allocatable(response) == {"nvidia.com/gpu": tuple(f"{GPU}::{n}" for n in range(4))}


def test_our_pod_resources_messages_use_upstream_numbers() -> None:
    msg = podresources_pb2.ListPodResourcesResponse(pod_resources=[podresources_pb2.PodResources(
        name="p", namespace="ns", containers=[podresources_pb2.ContainerResources(
            name="c", devices=[podresources_pb2.ContainerDevices(
                resource_name="nvidia.com/gpu", device_ids=["x", "y"])])])])
    (pod,) = pw.fields(msg.SerializeToString())[1]
    pod_fields = pw.fields(pod)  # type: ignore[arg-type]
    assert pod_fields[1] == [b"p"] and pod_fields[2] == [b"ns"]
    container = pw.fields(pod_fields[3][0])  # type: ignore[arg-type]
    assert container[1] == [b"c"]
    devices = pw.fields(container[2][0])  # type: ignore[arg-type]
    assert devices == {1: [b"nvidia.com/gpu"], 2: [b"x", b"y"]}


def test_cri_list_containers_from_upstream_bytes() -> None:
    response = cri_pb2.ListContainersResponse.FromString(encode_containers(NODE, None))
    containers = parse_containers(response)
    assert dict(containers) == {"a" * 64: PodRef("ml", "train-a", "trainer"),
                                "b" * 64: PodRef("ml", "train-a", "sidecar")}
    first = response.containers[0]
    assert (first.id, first.metadata.name, first.metadata.attempt, first.state) == (
        "a" * 64, "trainer", 1, RUNNING)
    assert first.labels["io.kubernetes.pod.uid"] == "0b8e7d1c-0000-4000-8000-000000000001"
    assert first.created_at == 1_700_000_000_000_000_000
    assert response.containers[2].labels == {"nerdctl/name": "builder"}  # foreign: left out
    assert dict(parse_pod_uids(response)) == {
        ("ml", "train-a"): "0b8e7d1c-0000-4000-8000-000000000001"}


def test_our_cri_request_asks_for_running_containers() -> None:
    request = cri_pb2.ListContainersRequest(filter=cri_pb2.ContainerFilter(
        state=cri_pb2.ContainerStateValue(state=cri_pb2.CONTAINER_RUNNING)))
    assert state_filter_of(request.SerializeToString()) == RUNNING
    assert state_filter_of(b"") is None
    only_running = cri_pb2.ListContainersResponse.FromString(
        encode_containers(NODE, state_filter_of(request.SerializeToString())))
    assert [c.id for c in only_running.containers] == ["a" * 64, "c" * 64]


def test_our_cri_container_uses_upstream_numbers() -> None:
    msg = cri_pb2.Container(id="i", pod_sandbox_id="s", metadata=cri_pb2.ContainerMetadata(
        name="n", attempt=3), state=cri_pb2.CONTAINER_EXITED, created_at=7,
        labels={"k": "v"}, annotations={"a": "b"})
    f = pw.fields(msg.SerializeToString())
    assert (f[1], f[2], f[6], f[7]) == ([b"i"], [b"s"], [2], [7])
    assert pw.fields(f[3][0]) == {1: [b"n"], 2: [3]}  # type: ignore[arg-type]
    assert pw.fields(f[8][0]) == {1: [b"k"], 2: [b"v"]}  # type: ignore[arg-type]
    assert pw.fields(f[9][0]) == {1: [b"a"], 2: [b"b"]}  # type: ignore[arg-type]


def test_service_paths_are_upstream() -> None:
    lister = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert lister.full_name == "v1.PodResourcesLister"
    assert {m.name for m in lister.methods} == {"List", "GetAllocatableResources"}
    runtime = cri_pb2.DESCRIPTOR.services_by_name["RuntimeService"]
    assert runtime.full_name == "runtime.v1.RuntimeService"
    assert {m.name for m in runtime.methods} == {"ListContainers", "ListPodSandbox"}
    assert cri_pb2.ContainerState.Name(cri_pb2.CONTAINER_RUNNING) == "CONTAINER_RUNNING"


def test_names_lose_their_control_characters_where_they_enter() -> None:
    """Whoever creates a container sets its runtime labels (the kubelet's names among
    them): pod, namespace and container names, pod UIDs, claim names and pod label
    values lose their control and escape characters as they are read, as process names
    do (units.printable), before any label, page or terminal sees them."""
    evil = "\x1b]0;pwned\x07\x1b[2J\u202e"
    response = cri_pb2.ListContainersResponse(containers=[cri_pb2.Container(
        id="d" * 64, metadata=cri_pb2.ContainerMetadata(name="x"), labels={
            "io.kubernetes.pod.name": "train" + evil, "io.kubernetes.pod.namespace": "ml" + evil,
            "io.kubernetes.container.name": "main" + evil,
            "io.kubernetes.pod.uid": "uid" + evil})])
    assert dict(parse_containers(response)) == {
        "d" * 64: PodRef("ml]0;pwned[2J", "train]0;pwned[2J", "main]0;pwned[2J")}
    assert dict(parse_pod_uids(response)) == {
        ("ml]0;pwned[2J", "train]0;pwned[2J"): "uid]0;pwned[2J"}
    listed = podresources_pb2.ListPodResourcesResponse(pod_resources=[
        podresources_pb2.PodResources(name="p" + evil, namespace="ns", containers=[
            podresources_pb2.ContainerResources(name="c" + evil, devices=[
                podresources_pb2.ContainerDevices(resource_name="nvidia.com/gpu",
                                                  device_ids=["GPU-1"])])])])
    (grant,) = parse_list(listed)
    assert grant.pod == PodRef("ns", "p]0;pwned[2J", "c]0;pwned[2J")
    sandboxes = cri_pb2.ListPodSandboxResponse(items=[cri_pb2.PodSandbox(
        id="s", metadata=cri_pb2.PodSandboxMetadata(name="p" + evil, namespace="ns"),
        labels={"team": "ml" + evil})])
    (labels,), _ = parse_sandboxes(sandboxes, re.compile("team"))
    assert (labels.pod, labels.labels) == ("p]0;pwned[2J", (("label_team", "ml]0;pwned[2J"),))
