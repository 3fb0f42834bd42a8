"""Processes on a GPU their pod was not given (exporter.attribution.kubernetes.unallocated).

On a running daemon: the k8s-node fixture with ``kubelet-unallocated.json``, where
llm/llm-server-0 keeps its process 7404 on GPU-0f3c... but holds no grant of it. What
must be served is derived here from the fixture files (kubelet.json's grants, the
processes' cgroup files and the fake NVML's process lists through the golden's process
series), and the promtool test of the shipped alert (deploy/prometheus/tests/
gpu-kubernetes.test.yml) must be fed exactly these series. Unit cases cover the
sidecar, MIG and runtime-down rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution.kubernetes.attribution import Attribution
from exporter.attribution.kubernetes.cgroup import ContainerCache
from exporter.attribution.kubernetes.unallocated import FAMILY, unallocated_rows
from exporter.core.fs import ProcFS
from exporter.core.model import Allocation, DeviceInfo, DeviceSample, PodRef, ProcessSample
from tests.daemon import FIXTURES, REPO, fixture_ids, promtool_check, running
from tests.fakes.kubelet import FakeKubelet, FakeRuntime, Node
from tests.test_kubernetes_rules import parse_series

NODE_DIR = FIXTURES / "k8s-node"
MIXED_SYS = FIXTURES / "mixed" / "sys"
RULE_TEST = REPO / "deploy" / "prometheus" / "tests" / "gpu-kubernetes.test.yml"
GOLDEN = REPO / "tests" / "golden" / "k8s-node.prom"
ONE_CYCLE = ["--collector.interval", "1h", "--collector.slow-interval", "1h",
             "--collector.processes.interval", "1h", "--kubernetes.interval", "1h"]
KEYS = ("gpu", "uuid", "namespace", "pod", "container", "pid", "scope")


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((NODE_DIR / name).read_text())
    return data


def test_the_fixture_differs_from_the_node_only_by_the_removed_grant() -> None:
    normal, variant = load("kubelet.json"), load("kubelet-unallocated.json")
    for pod in normal["pods"]:
        if pod["name"] == "llm-server-0":
            assert pod["containers"][0]["devices"]
            pod["containers"][0]["devices"] = {}
    assert normal == variant


def golden_processes() -> list[dict[str, str]]:
    """Every (GPU, process) of the k8s-node fixture with its pod, as the golden serves
    them (one cycle on the same files): gpu_process_memory_used_bytes' labels."""
    return [dict(s.labels) for f in text_string_to_metric_families(GOLDEN.read_text())
            for s in f.samples if s.name == "gpu_process_memory_used_bytes"]


def expected(scenario: dict[str, Any]) -> set[tuple[str, ...]]:
    """Processes whose pod holds no grant of their GPU (by uuid, or by PCI bus id for the
    AMD and Intel GPUs whose uuid is pci-<bus id>), or that run in no pod."""
    held: set[tuple[str, str, str]] = set()  # (namespace, pod, GPU id)
    for pod in scenario["pods"]:
        for c in pod["containers"]:
            for resource, ids in c.get("devices", {}).items():
                for device_id in ids:
                    gpu = device_id.split("::")[0]
                    if resource.startswith("gpu.intel.com/"):  # card2-0: the Intel card2
                        gpu = "pci-0000:09:00.0" if device_id.startswith("card2-") else gpu
                    elif resource.startswith("amd.com/"):
                        gpu = f"pci-{device_id}"
                    held.add((pod["namespace"], pod["name"], gpu))
    out = set()
    for p in golden_processes():
        if p["pod"] and (p["namespace"], p["pod"], p["uuid"]) in held:
            continue
        scope = "pod" if p["pod"] else "host"
        out.add((p["gpu"], p["uuid"], p["namespace"], p["pod"], p["container"], p["pid"],
                 scope))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("unallocated")
    scenario = Node.load(NODE_DIR / "kubelet-unallocated.json")
    with FakeKubelet(tmp / "kubelet.sock", scenario) as kubelet, \
            FakeRuntime(tmp / "containerd.sock", scenario) as runtime:
        args = ["--path.sysfs", str(MIXED_SYS), "--path.procfs", str(NODE_DIR / "proc"),
                *fixture_ids(MIXED_SYS.parent),
                "--kubernetes.pod-resources-socket", str(kubelet.socket),
                "--kubernetes.cri-socket", str(runtime.socket), *ONE_CYCLE]
        with running(args, tmp, nvml_json=NODE_DIR / "nvml.json") as daemon:
            text: str = daemon.get().text
            return text


def rows(text: str) -> list[dict[str, str]]:
    return [dict(s.labels) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == FAMILY]


@pytest.mark.slow
def test_a_pod_on_a_gpu_it_was_not_given_is_served(served: str) -> None:
    got = {tuple(r[k] for k in KEYS) for r in rows(served)}
    want = expected(load("kubelet-unallocated.json"))
    assert got == want
    pods = {(r[2], r[3], r[4]) for r in want if r[6] == "pod"}
    assert pods == {("llm", "llm-server-0", "server")}  # the fixture's one case
    # On the normal node the same pod is allocated that GPU: not flagged.
    assert not any(r[6] == "pod" for r in expected(load("kubelet.json")))
    assert all(r["process"] and r["source"] in ("nvml", "fdinfo") for r in rows(served))
    assert promtool_check(served).returncode == 0


@pytest.mark.slow
def test_the_alerts_promtool_test_is_fed_the_fixtures_series(served: str) -> None:
    """The rule test's input series for the family are what the daemon serves on the
    fixture (plus Prometheus' job and instance), so the alert firing there is the alert
    firing on this fixture."""
    doc = yaml.safe_load(RULE_TEST.read_text())
    fed = set()
    for case in doc["tests"]:
        for s in case.get("input_series", []):
            name, labels = parse_series(s["series"])
            if name == FAMILY:
                assert (labels.pop("job"), labels.pop("instance")) == ("gpu-exporter",
                                                                      "node1:9445")
                fed.add(tuple(sorted(labels.items())))
    assert fed == {tuple(sorted(r.items())) for r in rows(served)}
    firing = [a["exp_labels"] for case in doc["tests"] for check in
              case.get("alert_rule_test", []) for a in check.get("exp_alerts") or []]
    assert {"namespace": "llm", "pod": "llm-server-0", "container": "server",
            "scope": "pod"}.items() <= next(a for a in firing if a["scope"] == "pod").items()


# -- the rules, without a daemon ---------------------------------------------------------

def gpu(uuid: str, procs: tuple[ProcessSample, ...], allocs: tuple[Allocation, ...] = (),
        parent: str = "", up: bool = True) -> DeviceSample:
    info = DeviceInfo(vendor="nvidia", pci_bus_id="", uuid=uuid, device_key=uuid,
                      parent_key=parent)
    return DeviceSample(info=info, source="nvml", up=up, processes=procs, allocations=allocs)


def proc(pid: int, ns: str | None = None, pod: str | None = None,
         container: str | None = None) -> ProcessSample:
    return ProcessSample(pid=pid, process="p", namespace=ns, pod=pod, container=container,
                         source="nvml")


def test_sidecars_mig_slices_and_lost_gpus() -> None:
    holder = Allocation(PodRef("ml", "a", "main"), "nvidia.com/gpu")
    devices = [
        # A sidecar of the pod that holds the GPU: not flagged; another pod is.
        ("0", gpu("GPU-0", (proc(1, "ml", "a", "sidecar"), proc(2, "ml", "b", "x")),
                  (holder,))),
        # A MIG slice's allocation counts for its whole GPU (same gpu label).
        ("1", gpu("GPU-1", (proc(3, "ml", "a", "main"),))),
        ("1", gpu("MIG-1", (), (holder,), parent="GPU-1")),
        ("2", gpu("GPU-2", (proc(4),), up=False)),  # lost: no processes to judge
        ("3", gpu("GPU-3", (proc(5),))),  # a host process on a GPU nobody holds
    ]
    got = [(r[2]["gpu"], r[2]["pid"], r[2]["scope"]) for r in unallocated_rows(devices)]
    assert got == [("0", "2", "pod"), ("3", "5", "host")]


def test_nothing_while_the_runtime_does_not_answer(tmp_path: Path) -> None:
    devices = [("0", gpu("GPU-0", (proc(5),)))]
    cache = ContainerCache(ProcFS(tmp_path))
    assert [r[0] for r in Attribution({}, {}, cache).join_rows(devices)] == [FAMILY]
    assert list(Attribution({}, {}, cache, containers_known=False).join_rows(devices)) == []


def test_the_backend_serves_none_while_the_runtime_is_away(tmp_path: Path) -> None:
    """The kubernetes backend with the kubelet answering and no CRI socket: every process
    would look like a host process, so none is listed; once the runtime answers, the
    fixture's pod on a GPU it was not given is."""
    from exporter.attribution.kubernetes.backend import KubernetesBackend
    from exporter.core.config import Config

    scenario = Node.load(NODE_DIR / "kubelet-unallocated.json")
    devices = [("3", gpu("GPU-0f3c2b1a-9e8d-4c7b-a6f5-e4d3c2b1a098",
                         (proc(7404, "llm", "llm-server-0", "server"), proc(7808))))]
    with FakeKubelet(tmp_path / "kubelet.sock", scenario) as kubelet:
        config = Config(procfs=str(NODE_DIR / "proc"), sysfs=str(MIXED_SYS),
                        kubernetes_pod_resources_socket=str(kubelet.socket),
                        kubernetes_cri_socket=str(tmp_path / "containerd.sock"))
        backend = KubernetesBackend(config)
        backend.open()
        try:
            joins = backend.sample(slow=True).joins
            assert joins is not None and list(joins.join_rows(devices)) == []
            with FakeRuntime(tmp_path / "containerd.sock", scenario):
                joins = backend.sample(slow=True).joins
                assert joins is not None
                got = [(r[2]["pid"], r[2]["scope"]) for r in joins.join_rows(devices)]
                assert got == [("7404", "pod"), ("7808", "host")]
        finally:
            backend.close()
