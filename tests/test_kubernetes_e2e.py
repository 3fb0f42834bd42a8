"""The daemon on a Kubernetes node: fake kubelet and runtime (real gRPC), the k8s-node
fixture (mixed machine's GPUs, pods' processes), scraped over HTTP and by a real
Prometheus. Expected pods are derived here from the fixture files (kubelet.json, the
cgroup files, sysfs links), not from the exporter's code.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_dashboards import load, targets, to_promql
from test_deploy_prometheus_e2e import RULES
from test_golden import normalize

from tests.daemon import FIXTURES, REPO, fixture_ids, promtool_check, running
from tests.fakes.kubelet import FakeKubelet, FakeRuntime, Node
from tests.prometheus_harness import PROMETHEUS, free_port, get, query, stop, wait_for

NODE_DIR = FIXTURES / "k8s-node"
MIXED_SYS = FIXTURES / "mixed" / "sys"
GOLDEN = REPO / "tests" / "golden" / "k8s-node.prom"
ONE_CYCLE = ["--collector.interval", "1h", "--collector.slow-interval", "1h",
             "--collector.processes.interval", "1h", "--kubernetes.interval", "1h"]
POD_PANELS = ["Device memory by namespace", "Device memory by pod", "Utilisation by pod"]
Labels = dict[str, str]

pytestmark = pytest.mark.slow


def node_args(kubelet: FakeKubelet, runtime: FakeRuntime) -> list[str]:
    return ["--path.sysfs", str(MIXED_SYS), "--path.procfs", str(NODE_DIR / "proc"),
            *fixture_ids(MIXED_SYS.parent),
            "--kubernetes.pod-resources-socket", str(kubelet.socket),
            "--kubernetes.cri-socket", str(runtime.socket)]


@pytest.fixture(scope="module")
def fake_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKubelet,
                                                                         FakeRuntime, Path]]:
    tmp = tmp_path_factory.mktemp("k8s")
    scenario = Node.load(NODE_DIR / "kubelet.json")
    with FakeKubelet(tmp / "kubelet.sock", scenario) as kubelet, \
            FakeRuntime(tmp / "containerd.sock", scenario) as runtime:
        yield kubelet, runtime, tmp  # type: ignore[misc]


@pytest.fixture(scope="module")
def scrape(fake_node: tuple[FakeKubelet, FakeRuntime, Path]) -> str:
    kubelet, runtime, tmp = fake_node
    with running([*node_args(kubelet, runtime), *ONE_CYCLE], tmp,
                 nvml_json=NODE_DIR / "nvml.json") as daemon:
        return daemon.get().text


def series(text: str, prefix: str) -> list[tuple[str, Labels]]:
    return [(s.name, dict(s.labels)) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith(prefix)]


# -- the truth, from the fixture files ---------------------------------------------------

def scenario() -> dict[str, object]:
    data: dict[str, object] = json.loads((NODE_DIR / "kubelet.json").read_text())
    return data


def containers() -> dict[str, tuple[str, str, str]]:
    """container id -> (namespace, pod, container), as the fake runtime reports them."""
    return {c["id"]: (p["namespace"], p["name"], c["name"])
            for p in scenario()["pods"] for c in p["containers"]}  # type: ignore[attr-defined]


def pod_of_pid(pid: str) -> tuple[str, str, str]:
    """From the cgroup file: the 64-hex id in the last path that has one; else a host process."""
    text = (NODE_DIR / "proc" / pid / "cgroup").read_text()
    for part in reversed(text.replace(":", "/").split("/")):
        leaf = part.strip().removesuffix(".scope").rsplit("-", 1)[-1]
        if len(leaf) == 64 and leaf in containers():
            return containers()[leaf]
    return ("", "", "")


def card_pci(card: str) -> str:
    return os.readlink(MIXED_SYS / "class" / "drm" / card).split("/")[-3]


def expected_allocations(scrape: str) -> set[tuple[str, str, str, str, str]]:
    """(uuid, namespace, pod, container, resource) for every GPU device the pods hold."""
    uuid_of_pci = {labels["pci_bus_id"]: labels["uuid"] for _, labels in series(scrape, "gpu_info")}
    out = set()
    for pod in scenario()["pods"]:  # type: ignore[attr-defined]
        for c in pod["containers"]:
            for resource, ids in c["devices"].items():
                for device in ids:
                    if device.startswith("GPU-"):
                        uuid = device.split("::")[0]
                    elif device.startswith("0000:"):
                        uuid = uuid_of_pci[device]
                    elif device.startswith("card"):
                        uuid = uuid_of_pci[card_pci(device.split("-")[0])]
                    else:
                        continue  # amdgpu_xcp_3 (not mapped), fpga0, rdma0 (not GPUs)
                    out.add((uuid, pod["namespace"], pod["name"], c["name"], resource))
    return out


# -- over HTTP ----------------------------------------------------------------------------

def test_allocation_info_matches_the_kubelet(scrape: str) -> None:
    got = {(labels["uuid"], labels["namespace"], labels["pod"], labels["container"],
            labels["resource"]) for _, labels in series(scrape, "gpu_kubernetes_allocation_info")}
    want = expected_allocations(scrape)
    assert got == want
    assert len(want) == 6  # 3 pods on the time-sliced GPU, 1 on each exclusive GPU
    # Pod UIDs (the runtime's io.kubernetes.pod.uid) from kubelet.json; no DRA claim here.
    uids = {(p["namespace"], p["name"]): p["uid"] for p in scenario()["pods"]}  # type: ignore[attr-defined]
    for _, labels in series(scrape, "gpu_kubernetes_allocation_info"):
        assert labels["pod_uid"] == uids[(labels["namespace"], labels["pod"])]
        assert labels["claim"] == ""


def test_every_gpu_process_carries_its_pod(scrape: str) -> None:
    checked = set()
    for name, labels in series(scrape, "gpu_process_"):
        want = pod_of_pid(labels["pid"])
        assert (labels["namespace"], labels["pod"], labels["container"]) == want, (name, labels)
        checked.add((labels["pid"], want))
    shared = {pid for name, labels in series(scrape, "gpu_process_memory_used_bytes")
              if labels["gpu"] == "1" for pid in [labels["pid"]]}
    assert shared == {"3310", "7101", "7202", "7203", "7303"}  # the time-sliced GPU
    pods = {want[1] for _, want in checked}
    assert pods == {"", "train-a-7d9f", "train-b-5c4e", "notebook-c-0", "llm-server-0",
                    "detector-6b8d", "transcode-0"}


@pytest.mark.golden
def test_golden_and_promtool(scrape: str) -> None:
    got = normalize(scrape)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), f"/metrics differs from {GOLDEN}"
    result = promtool_check(scrape)
    assert result.returncode == 0, result.stdout + result.stderr


# -- a real Prometheus --------------------------------------------------------------------

@pytest.fixture(scope="module")
def prometheus(fake_node: tuple[FakeKubelet, FakeRuntime, Path]) -> Iterator[str]:
    if not Path(PROMETHEUS).exists():
        pytest.skip("no prometheus binary (Debian package prometheus)")
    kubelet, runtime, tmp = fake_node
    # A 1 s slow tier: NVML's energy counter (every third slow cycle) and per-process
    # samples move within the test's wait, for the energy rules.
    args = [*node_args(kubelet, runtime), "--collector.interval", "1s",
            "--collector.slow-interval", "1s",
            "--collector.processes.interval", "1s", "--kubernetes.interval", "1s"]
    with running(args, tmp, nvml_json=NODE_DIR / "nvml.json") as daemon:
        port = free_port()
        # The target carries the exporter pod's own labels, as the Prometheus Operator's
        # ServiceMonitor/PodMonitor relabelling adds them; honor_labels as shipped.
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(RULES)],
                  "scrape_configs": [{"job_name": "gpu-exporter",
                                      "honor_labels": shipped_honor_labels(),
                                      "static_configs": [{
                                          "targets": [daemon.base_url.removeprefix("http://")],
                                          "labels": OPERATOR_TARGET_LABELS}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        with (tmp / "prometheus.log").open("wb") as log:
            prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={tmp / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}"],
                                    stdout=log, stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{port}"
        try:
            wait_for(f"{api}/-/ready", 30, prom, tmp / "prometheus.log")
            deadline = time.monotonic() + 30  # rate() over 5m wants two points or more
            while time.monotonic() < deadline and not query(
                    api, "namespace:gpu_process_engine_busy_seconds:rate5m"):
                time.sleep(0.5)
            yield api
        finally:
            stop(prom)


OPERATOR_TARGET_LABELS = {"namespace": "gpu-exporter", "pod": "gpu-exporter-x7k2p",
                          "container": "gpu-exporter"}


def shipped_honor_labels() -> bool:
    """What the shipped kustomize ServiceMonitor sets (the chart's monitors: test_deploy_helm)."""
    monitor = yaml.safe_load((REPO / "deploy" / "kubernetes" / "components"
                              / "prometheus-operator" / "servicemonitor.yaml").read_text())
    (endpoint,) = monitor["spec"]["endpoints"]
    return bool(endpoint.get("honorLabels", False))


def test_workload_labels_win_over_the_targets(prometheus: str) -> None:
    result = query(prometheus, 'gpu_process_memory_used_bytes{job="gpu-exporter"}')
    assert result
    for r in result:
        labels = r["metric"]  # type: ignore[index]
        assert not any(k.startswith("exported_") for k in labels), labels
        # A workload process keeps its pod; a host process (pod="" on /metrics) stays
        # without one: it never takes the exporter's own pod or namespace.
        want = pod_of_pid(labels["pid"])
        assert (labels.get("namespace", ""), labels.get("pod", "")) == want[:2], labels
    pods = {r["metric"]["pod"] for r in query(  # type: ignore[index]
        prometheus, "gpu_kubernetes_allocation_info")}
    assert pods == {pod for _, pod, _ in containers().values() if pod != "partition-job"}


def by(result: list[dict[str, object]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"][k] for k in labels): float(r["value"][1])  # type: ignore[index]
            for r in result}


def nvml_memory(namespace: str) -> float:
    """Device memory of the namespace's NVIDIA processes, from nvml.json and the cgroups."""
    gpus = json.loads((NODE_DIR / "nvml.json").read_text())["gpus"]
    return float(sum(p["used_memory_bytes"] for g in gpus for p in g["processes"]
                     if pod_of_pid(str(p["pid"]))[0] == namespace))


def test_namespace_recording_rules(prometheus: str) -> None:
    memory = by(query(prometheus, "namespace:gpu_process_memory_used_bytes:sum"), "namespace")
    assert set(memory) == {("ml",), ("research",), ("llm",), ("vision",), ("media",)}
    for ns in ("ml", "research", "llm"):  # NVIDIA only: NVML's numbers, summed by namespace
        assert memory[(ns,)] == nvml_memory(ns)
    util = by(query(prometheus, "namespace:gpu_process_utilization_ratio:sum"), "namespace")
    assert util[("ml",)] == pytest.approx((35 + 10 + 5) / 100)  # sm_util of 7101, 7202, 7203
    busy = by(query(prometheus, "namespace:gpu_process_engine_busy_seconds:rate5m"), "namespace")
    # Busy-time counters come from amdgpu's fdinfo (ns); xe reports cycles, ratios only.
    assert set(busy) == {("vision",)}


def test_pod_energy_recording_rules(prometheus: str) -> None:
    """Each process's share of its GPU's energy is its SM sample (their sum is below 1 on
    each GPU: the rest is idle), so per pod the energy rates are in the ratio of the pods'
    sm_util sums from nvml.json; host processes are in no pod. The AMD card's pod has a
    series too, from the card's power estimate."""
    gpus = json.loads((NODE_DIR / "nvml.json").read_text())["gpus"]
    share: dict[tuple[str, str], float] = {}
    for g in gpus:
        for p in g["processes"]:
            ns, pod, _ = pod_of_pid(str(p["pid"]))
            if pod and p.get("sm_util") is not None:
                share[(ns, pod)] = share.get((ns, pod), 0.0) + p["sm_util"] / 100
    # The AMD card has no energy counter: its power estimate is split the same way
    # (docs/energy.md); its pod's engine time does not move in a fixture (a rate of 0).
    amd = {("vision", "detector-6b8d")}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        energy = by(query(prometheus, "namespace_pod:gpu_process_energy_joules:rate5m"),
                    "namespace", "pod")
        if set(energy) == set(share) | amd and all(energy[k] for k, v in share.items() if v) \
                or set(energy) > set(share) | amd:
            break
        time.sleep(0.5)
    # Both rules as one evaluation of their group wrote them: at a moment already past,
    # after the one the loop saw.
    at = time.time() + 1
    time.sleep(2)

    def rule(name: str, *labels: str) -> dict[tuple[str, ...], float]:
        body = _get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode(
            {"query": name, "time": f"{at:.3f}"}))
        return by(json.loads(body)["data"]["result"], *labels)

    energy = rule("namespace_pod:gpu_process_energy_joules:rate5m", "namespace", "pod")
    assert set(energy) == set(share) | amd
    assert all(energy[k] == 0.0 for k in amd)
    # Pods on one GPU: their counters grow in the same windows, so the ratio is exact.
    (gpu0,) = [g for g in gpus if any(p["pid"] == 7101 for p in g["processes"])]
    pods0 = {pod_of_pid(str(p["pid"]))[:2] for p in gpu0["processes"]} & set(share)
    first = min(pods0)
    for pod in pods0:
        assert energy[pod] / energy[first] == pytest.approx(share[pod] / share[first], rel=1e-3)
    by_ns = rule("namespace:gpu_process_energy_joules:rate5m", "namespace")
    assert {ns for (ns,) in by_ns} == {ns for ns, _ in share} | {ns for ns, _ in amd}
    for (ns,) in by_ns:
        assert by_ns[(ns,)] == pytest.approx(sum(v for k, v in energy.items() if k[0] == ns))
    idle = rule("instance_gpu:gpu_idle_energy_joules:rate5m", "uuid")
    assert set(idle) >= {(g["uuid"],) for g in gpus}  # and the Intel card's


def test_pod_panels_return_the_pods(prometheus: str) -> None:
    board = dict(targets(load("gpu-processes")))
    namespaces = by(query(prometheus, to_promql(board["Device memory by namespace"])),
                    "namespace")
    assert set(namespaces) == {("ml",), ("research",), ("llm",), ("vision",), ("media",)}
    pods = set(by(query(prometheus, to_promql(board["Device memory by pod"])),
                  "namespace", "pod"))
    assert pods == {(ns, pod) for ns, pod, _ in containers().values()
                    if pod != "partition-job"}  # holds only an unmapped AMD partition
    util = by(query(prometheus, to_promql(board["Utilisation by pod"])), "namespace", "pod")
    assert util[("ml", "train-b-5c4e")] == pytest.approx(0.15)  # 7202 and its worker 7203
    assert util[("llm", "llm-server-0")] == pytest.approx(0.90)


def test_exclusive_allocation_rule_names_one_pod_per_gpu(prometheus: str) -> None:
    result = query(prometheus, "instance_gpu:gpu_kubernetes_allocation_info:exclusive")
    got = by(result, "gpu", "pod")
    # gpu 1 is time-sliced across three pods: no single pod, no series.
    assert got == {("0", "detector-6b8d"): 1.0, ("2", "transcode-0"): 1.0,
                   ("3", "llm-server-0"): 1.0}
    unhealthy = [r["name"] for g in json.loads(_get(f"{prometheus}/api/v1/rules"))["data"][
        "groups"] for r in g["rules"] if r.get("health") == "err"]
    assert unhealthy == []


def _get(url: str) -> bytes:

    status, body = get(url)
    assert status == 200
    return body


def nvml_pod_memory() -> dict[tuple[str, str], float]:
    """Device memory of each pod's NVIDIA processes, from nvml.json and the cgroups."""
    out: dict[tuple[str, str], float] = {}
    for g in json.loads((NODE_DIR / "nvml.json").read_text())["gpus"]:
        for p in g["processes"]:
            ns, pod, _ = pod_of_pid(str(p["pid"]))
            if pod:
                out[(ns, pod)] = out.get((ns, pod), 0.0) + p["used_memory_bytes"]
    return out


def test_pod_recording_rules(prometheus: str) -> None:
    memory = by(query(prometheus, "namespace_pod:gpu_process_memory_used_bytes:sum"),
                "namespace", "pod")
    assert set(memory) == {(ns, pod) for ns, pod, _ in containers().values()
                           if pod != "partition-job"}
    for key, value in nvml_pod_memory().items():  # NVIDIA-only pods: NVML's numbers
        assert memory[key] == value, key
    assert memory[("ml", "train-b-5c4e")] == nvml_pod_memory()[("ml", "train-b-5c4e")]
    busy = by(query(prometheus, "namespace_pod:gpu_process_engine_busy_seconds:rate5m"),
              "namespace", "pod")
    assert set(busy) == {("vision", "detector-6b8d")}  # amdgpu fdinfo's busy counters


def test_unallocated_panel_lists_the_processes_in_no_pod(prometheus: str) -> None:
    """Every pod here holds the GPU it uses: the panel lists the host processes only, and
    they keep empty pod labels (never the exporter's own pod)."""
    board = dict(targets(load("gpu-processes")))
    result = query(prometheus, to_promql(board["Processes outside their allocation"]))
    got = {(r["metric"]["gpu"], r["metric"]["pid"]): r["metric"]  # type: ignore[index]
           for r in result}
    gpus = json.loads((NODE_DIR / "nvml.json").read_text())["gpus"]
    nvidia_host = {str(p["pid"]) for g in gpus for p in g["processes"]
                   if pod_of_pid(str(p["pid"])) == ("", "", "")}
    assert nvidia_host <= {pid for _, pid in got}
    assert {"7808", "7707", "3310"} <= nvidia_host  # docker, unknown cgroup, the host
    for labels in got.values():
        assert labels["scope"] == "host"
        assert pod_of_pid(labels["pid"]) == ("", "", "")
        assert labels.get("pod", "") == "" and labels.get("namespace", "") == ""
    assert len(query(prometheus, "instance_gpu:gpu_kubernetes_unallocated_process_info:count")
               ) >= 3
