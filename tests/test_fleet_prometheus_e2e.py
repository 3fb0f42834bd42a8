"""The fleet reader (exporter.client.fleet.nodes) against a real Prometheus (Debian's) that
scrapes three daemons on three fixture machines: the k8s-node fixture with its fake
kubelet and container runtime (pods holding GPUs, some idle), the HGX H100 pair and the
RX 7800 XT desktop. The daemons serve both vocabularies (``--metric-names both``), so the
same Prometheus answers the reader in the exporter's names and in dcgm-exporter's.

What every node must show is read from each daemon's own /metrics (the goldens vouch for
those): its GPUs, its processes, its pod allocations; the waste from the fixtures' facts
(the GPUs the kubelet allocated whose utilisation is under 5 %; the notebook's process
that NVML samples at 0 %, the AMD detector whose engine counters never move).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_deploy_dashboards import load, targets, to_promql

from exporter.client.fleet.nodes import (
    Fleet,
    NodeSummary,
    Progress,
    load_fleet,
    load_history,
    load_node,
)
from exporter.client.fleet.promapi import PrometheusAPI
from exporter.core.config import MetricNames
from tests.daemon import FIXTURES, daemon_env, fixture_ids, machine_args, parse_samples
from tests.fakes.kubelet import FakeKubelet, FakeRuntime, Node
from tests.prometheus_harness import (
    PROMETHEUS,
    ROOT,
    VICTORIA_METRICS,
    Exporter,
    get,
    query,
    scraped,
    victoria_metrics,
)

K8S = FIXTURES / "k8s-node"
MACHINES = ("k8s-node", "nvidia-h100x2", "amd-rdna3-rx7800xt")
RULES = ROOT / "deploy" / "prometheus" / "gpu-exporter.rules.yml"
FAST = ["--collector.interval", "1s", "--collector.slow-interval", "1s",
        "--collector.processes.interval", "1s", "--metric-names", "both"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                       reason="no prometheus binary (Debian package prometheus)"),
]


def exporter(machine: str, tmp: Path, kubelet: FakeKubelet, runtime: FakeRuntime) -> Exporter:
    env = {"NODE_NAME": machine}  # the DCGM series' Hostname: which machine is which
    if machine == "k8s-node":
        sys_dir = FIXTURES / "mixed" / "sys"
        args = ["--path.sysfs", str(sys_dir), "--path.procfs", str(K8S / "proc"),
                *fixture_ids(sys_dir.parent),
                "--kubernetes.pod-resources-socket", str(kubelet.socket),
                "--kubernetes.cri-socket", str(runtime.socket), "--kubernetes.interval", "1s"]
        nvml = K8S / "nvml.json"
    else:
        args = [*machine_args(FIXTURES / machine), "--no-collector.kubernetes"]
        nvml = FIXTURES / machine / "nvml.json"
    return Exporter([*args, *FAST], daemon_env(nvml if nvml.exists() else None, env),
                    f"exporter-{machine}")


@pytest.fixture(scope="module")
def fleet_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """Prometheus' URL, and instance -> machine."""
    tmp = tmp_path_factory.mktemp("fleet")
    scenario = Node.load(K8S / "kubelet.json")
    with FakeKubelet(tmp / "kubelet.sock", scenario) as kubelet, \
            FakeRuntime(tmp / "containerd.sock", scenario) as runtime:
        exporters = [exporter(m, tmp, kubelet, runtime) for m in MACHINES]
        with scraped(tmp, exporters, [RULES]) as api:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # two samples of each counter for rate()
                if len(query(api, "count by (instance) (gpu_up offset 3s)")) == len(MACHINES) \
                        and query(api, "gpu_kubernetes_allocation_info offset 3s"):
                    break
                time.sleep(0.5)
            machines = {r["metric"]["instance"]: r["metric"]["Hostname"] for r in query(
                api, "group by (instance, Hostname) (DCGM_FI_DEV_GPU_TEMP)")}
            assert sorted(machines.values()) == sorted(MACHINES)
            yield api, machines


@pytest.fixture(scope="module")
def vm_api(fleet_api: tuple[str, dict[str, str]],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """VictoriaMetrics (Debian's single-node binary) scraping the same three daemons as
    the fleet's Prometheus, with no rules: its API URL once it holds what Prometheus
    holds (two samples of each counter for rate())."""
    if not Path(VICTORIA_METRICS).exists():
        pytest.skip("no victoria-metrics binary (Debian package victoria-metrics)")
    api, machines = fleet_api
    with victoria_metrics(tmp_path_factory.mktemp("vm"), sorted(machines)) as vm:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(query(vm, "count by (instance) (gpu_up offset 3s)")) == len(machines) \
                    and query(vm, "gpu_kubernetes_allocation_info offset 3s"):
                break
            time.sleep(0.5)
        yield vm


def scrape(instance: str) -> dict[str, list[dict[str, str]]]:
    """The daemon's own /metrics: sample name -> label sets (value under "__value__")."""
    status, body = get(f"http://{instance}/metrics")
    assert status == 200
    out: dict[str, list[dict[str, str]]] = {}
    for (name, labels), value in parse_samples(body.decode()).items():
        out.setdefault(name, []).append({**dict(labels), "__value__": repr(value)})
    return out


@pytest.fixture(scope="module")
def truth(fleet_api: tuple[str, dict[str, str]]) -> dict[str, dict[str, list[dict[str, str]]]]:
    _, machines = fleet_api
    return {machine: scrape(instance) for instance, machine in machines.items()}


def by_machine(fleet: Fleet, machines: dict[str, str]) -> dict[str, object]:
    return {machines[n.node]: n for n in fleet.nodes}


@pytest.mark.parametrize("names", [MetricNames.GPU, MetricNames.DCGM])
def test_every_node_and_its_gpus_are_listed_waste_first(
        fleet_api: tuple[str, dict[str, str]], truth: dict[str, dict[str, list[dict[str, str]]]],
        names: MetricNames) -> None:
    api, machines = fleet_api
    seen: list[Progress] = []
    fleet = load_fleet(PrometheusAPI(api), names=names, progress=seen.append)
    assert fleet.errors == () and not fleet.truncated
    assert {machines[n.node] for n in fleet.nodes} == set(MACHINES)
    assert seen and seen[-1].done == seen[-1].total == len({p.what for p in seen})
    for node in fleet.nodes:
        metrics = truth[machines[node.node]]
        gpus = {m["gpu"] for m in metrics["gpu_up"]}
        assert node.gpus == len(gpus), node
        assert node.up is True
        assert node.health == max(int(float(m["__value__"]))
                                  for m in metrics["gpu_health_status"])
        power = sum(float(m["__value__"]) for m in metrics.get("gpu_power_watts", []))
        assert node.power_watts == pytest.approx(power) if power else node.power_watts is None
    counts = {machines[n.node]: n.gpus for n in fleet.nodes}
    assert counts["k8s-node"] == 4 and counts["nvidia-h100x2"] == 2
    # The k8s node's pods hold idle GPUs: it comes first.
    assert machines[fleet.nodes[0].node] == "k8s-node"
    first = fleet.nodes[0].waste
    metrics = truth["k8s-node"]
    util = {m["gpu"]: float(m["__value__"]) for m in metrics["gpu_utilization_ratio"]}
    held = {m["gpu"] for m in metrics["gpu_kubernetes_allocation_info"]}
    idle = {g for g in held if util.get(g, 1.0) < 0.05}
    assert idle == {"0", "1", "3"}  # GPU 2 (Intel, 50 %) is busy
    assert first.idle_gpus == len(idle)
    assert first.idle_processes >= 2
    assert fleet.idle_threshold == 0.05  # the rules' threshold record, loaded here
    assert all(n.waste.idle_gpus == 0 for n in fleet.nodes[1:])  # no pods elsewhere


@pytest.mark.parametrize("names", [MetricNames.GPU, MetricNames.DCGM])
def test_drilling_into_each_node_shows_its_gpus_and_processes(
        fleet_api: tuple[str, dict[str, str]], truth: dict[str, dict[str, list[dict[str, str]]]],
        names: MetricNames) -> None:
    api, machines = fleet_api
    client = PrometheusAPI(api)
    for instance, machine in machines.items():
        node = load_node(client, instance, names=names)
        metrics = truth[machine]
        assert node.errors == ()
        assert {g.gpu for g in node.gpus} >= {m["gpu"] for m in metrics["gpu_up"]}
        if names is MetricNames.GPU:
            assert {(g.gpu, g.uuid) for g in node.gpus} == {
                (m["gpu"], m["uuid"]) for m in metrics["gpu_up"]}
            assert all(g.up for g in node.gpus)
        want = {(m["gpu"], m["pid"]) for m in metrics.get("gpu_process_memory_used_bytes", [])}
        assert {(p.gpu, p.pid) for p in node.processes} == want, machine
        memory = {(m["gpu"], m["pid"]): float(m["__value__"])
                  for m in metrics.get("gpu_process_memory_used_bytes", [])}
        for p in node.processes:
            assert p.memory_used_bytes == memory[(p.gpu, p.pid)]
        # idle first
        flags = [p.idle for p in node.processes]
        assert flags == sorted(flags, reverse=True)
        utils = {m["gpu"]: float(m["__value__"]) for m in metrics["gpu_utilization_ratio"]}
        for g in node.gpus:
            if g.gpu in utils and not g.uuid.startswith("MIG"):
                assert g.utilization == pytest.approx(utils[g.gpu]), (machine, g)


def test_the_k8s_node_names_the_pods_holding_idle_gpus_and_the_idle_processes(
        fleet_api: tuple[str, dict[str, str]], truth: dict[str, dict[str, list[dict[str, str]]]]
) -> None:
    api, machines = fleet_api
    (instance,) = [i for i, m in machines.items() if m == "k8s-node"]
    ours = load_node(PrometheusAPI(api), instance)
    dcgm = load_node(PrometheusAPI(api), instance, names=MetricNames.DCGM)
    pods = {(a["gpu"], a["namespace"], a["pod"])
            for a in truth["k8s-node"]["gpu_kubernetes_allocation_info"]}
    for node in (ours, dcgm):
        got = {(g.gpu, a.namespace, a.pod) for g in node.gpus for a in g.allocations}
        assert got == pods
        assert {g.gpu for g in node.gpus if g.idle} == {"0", "1", "3"}
    idle = {p.pid: p for p in ours.processes if p.idle}
    assert idle["7303"].pod == "notebook-c-0"  # NVML samples it at 0 %
    assert idle["7505"].pod == "detector-6b8d"  # its fdinfo engine counters stand still
    assert "7101" not in idle  # 35 % by NVML's samples
    assert {p.pid for p in dcgm.processes if p.idle} == set(idle)
    assert ours.waste.idle_gpus == 3


def test_history_gives_utilisation_over_time_per_node_and_per_gpu(
        fleet_api: tuple[str, dict[str, str]]) -> None:
    api, machines = fleet_api
    client = PrometheusAPI(api)
    fleet = load_history(client, window=20, points=11)
    assert fleet.error is None and set(fleet.series) == set(machines)
    (instance,) = [i for i, m in machines.items() if m == "nvidia-h100x2"]
    gpus = load_history(client, node=instance, window=20, points=11)
    assert set(gpus.series) == {"0", "1"}
    assert all(len(points) >= 2 for points in gpus.series.values())


def test_a_bounded_answer_says_it_was_cut(fleet_api: tuple[str, dict[str, str]]) -> None:
    api, machines = fleet_api
    fleet = load_fleet(PrometheusAPI(api, max_series=2))
    assert fleet.truncated and len(fleet.nodes) <= len(machines)


def test_the_dashboards_waste_row_shows_what_the_fleet_reader_finds(
        fleet_api: tuple[str, dict[str, str]]) -> None:
    api, machines = fleet_api
    board = dict(targets(load("gpu-processes")))
    client = PrometheusAPI(api)
    nodes = {i: load_node(client, i) for i in machines}
    gpus = {(r["metric"]["instance"], r["metric"]["gpu"], r["metric"]["pod"])
            for r in query(api, to_promql(board["Allocated GPUs left idle"]))}
    assert gpus == {(i, g.gpu, a.pod) for i, n in nodes.items() for g in n.gpus if g.idle
                    for a in g.allocations}
    assert {pod for _, _, pod in gpus} >= {"llm-server-0", "detector-6b8d"}
    procs = {(r["metric"]["instance"], r["metric"]["gpu"], r["metric"]["pid"])
             for r in query(api, to_promql(board["Processes holding memory with no engine time"]))}
    assert procs == {(i, p.gpu, p.pid) for i, n in nodes.items() for p in n.processes if p.idle}
    power = query(api, to_promql(board["Idle power of allocated GPUs by namespace"]))
    namespaces = {a.namespace for n in nodes.values() for g in n.gpus for a in g.allocations}
    assert {r["metric"]["namespace"] for r in power} <= namespaces and power
    # Its 5-minute steps have data once Prometheus has run past a multiple of 5 minutes;
    # the day's sum itself is checked by promtool (gpu-waste-energy.test.yml).
    day = query(api, to_promql(board["Idle energy by namespace, last 24 hours"]))
    assert {r["metric"]["namespace"] for r in day} <= namespaces


@pytest.mark.parametrize("names", [MetricNames.GPU, MetricNames.DCGM])
def test_victoria_metrics_answers_the_fleet_view_as_prometheus_does(
        fleet_api: tuple[str, dict[str, str]], vm_api: str, names: MetricNames) -> None:
    """Past one machine only Prometheus was tried. VictoriaMetrics (MetricsQL) scraping the
    same daemons gives the same node list, and each node the same GPUs, allocations and
    processes with the same idle verdicts; what it cannot give without rules (the rules'
    threshold record, the waste alerts) falls back as the view says (5 %, none)."""
    api, machines = fleet_api
    prom, vm = PrometheusAPI(api), PrometheusAPI(vm_api)
    ours, theirs = load_fleet(prom, names=names), load_fleet(vm, names=names)
    assert theirs.errors == () and not theirs.truncated
    assert theirs.idle_threshold == ours.idle_threshold == 0.05

    def row(n: NodeSummary) -> tuple[object, ...]:
        return (machines[n.node], n.gpus, n.lost_gpus, n.health, n.up, n.waste.idle_gpus,
                n.waste.idle_processes, n.memory_total_bytes)

    assert [row(n) for n in theirs.nodes] == [row(n) for n in ours.nodes]
    for a, b in zip(ours.nodes, theirs.nodes, strict=True):
        for value in ("utilization", "power_watts", "memory_used_bytes"):
            want, got = getattr(a, value), getattr(b, value)
            assert got == (None if want is None else pytest.approx(want, rel=0.05)), value
    for instance, machine in machines.items():
        mine, other = load_node(prom, instance, names=names), load_node(vm, instance,
                                                                         names=names)
        assert other.errors == (), machine
        assert [(g.gpu, g.uuid, g.up, g.idle, g.allocations) for g in other.gpus] == [
            (g.gpu, g.uuid, g.up, g.idle, g.allocations) for g in mine.gpus], machine
        assert [(p.gpu, p.pid, p.process, p.pod, p.idle, p.memory_used_bytes)
                for p in other.processes] == [
            (p.gpu, p.pid, p.process, p.pod, p.idle, p.memory_used_bytes)
            for p in mine.processes], machine
        # the drill-down's utilisation over time (a range query)
        history = load_history(vm, node=instance, names=names, window=20, points=11)
        assert history.error is None and set(history.series) == {g.gpu for g in mine.gpus
                                                                 if g.utilization is not None}
    nodes = load_history(vm, names=names, window=20, points=11)
    assert nodes.error is None and set(nodes.series) == set(machines)
