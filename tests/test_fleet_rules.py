"""The waste rules (deploy/prometheus/gpu-exporter.rules.yml: GpuAllocatedIdle,
GpuProcessMemoryIdle, GpuNamespaceIdleEnergy and their records) against the fixture, and
against the fleet view's PromQL.

deploy/prometheus/tests/gpu-waste*.test.yml feed promtool the series the exporter serves
for the k8s-node fixture (tests/golden/k8s-node.prom: labels and first values, checked
here) moving on as each test tells, plus a second node for the cases the fixture lacks.
Which alerts must fire is worked out here from those inputs, by the definitions in
docs/kubernetes.md, not from the rules; promtool itself runs in tests/test_deploy_rules.py.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_dashboards import load, targets
from test_kubernetes_rules import parse_series

from exporter.client.fleet.ql import FleetQL
from tests.daemon import REPO

TESTS = REPO / "deploy" / "prometheus" / "tests"
WASTE = TESTS / "gpu-waste.test.yml"
ENERGY = TESTS / "gpu-waste-energy.test.yml"
RULES = REPO / "deploy" / "prometheus" / "gpu-exporter.rules.yml"
GOLDEN = REPO / "tests" / "golden" / "k8s-node.prom"
NODE1 = {"job": "gpu-exporter", "instance": "node1:9445"}
DASHBOARD = 'instance=~"$instance", vendor=~"$vendor", gpu=~"$gpu"'  # its variables
Key = tuple[tuple[str, str], ...]


def expand(values: str) -> list[float | None]:
    """promtool's series notation (``a+bxn``, ``axn``, ``_xn``, ``stale``) -> one value per
    step, None where there is none."""
    out: list[float | None] = []
    for token in str(values).split():
        if token == "stale":
            out.append(None)
            continue
        m = re.fullmatch(r"(_|[-\d.e]+)(?:([+-][\d.e]+))?(?:x(\d+))?", token)
        assert m, token
        start, step, times = m.group(1), m.group(2), int(m.group(3) or 0)
        if start == "_":
            out += [None] * max(times, 1)
            continue
        delta = float(step or 0)
        out += [float(start) + i * delta for i in range(times + 1)]
    return out


def golden() -> dict[str, dict[Key, float]]:
    out: dict[str, dict[Key, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(GOLDEN.read_text()):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def inputs(case: dict[str, Any]) -> list[tuple[str, dict[str, str], list[float | None]]]:
    return [(*parse_series(s["series"]), expand(s["values"])) for s in case["input_series"]]


def cases(path: Any) -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(path.read_text())["tests"]
    return tests


def firing(case: dict[str, Any], alert: str) -> list[dict[str, str]]:
    """The labels of the alerts the case expects at its last evaluation of ``alert``."""
    checks = [c for c in case["alert_rule_test"] if c["alertname"] == alert]
    return [a["exp_labels"] for a in checks[-1]["exp_alerts"]]


def rule(name: str) -> str:
    doc = yaml.safe_load(RULES.read_text())
    (expr,) = [r["expr"] for g in doc["groups"] for r in g["rules"]
               if name in (r.get("alert"), r.get("record"))]
    return str(expr)


def words(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- one text for both


def test_the_alerts_are_the_fleet_views_expressions() -> None:
    """The fleet reader judges waste with the alerts' own text."""
    ql = FleetQL()
    assert words(rule("GpuAllocatedIdle")) == words(ql.idle_allocated())
    assert words(rule("GpuProcessMemoryIdle")) == words(ql.idle_processes())
    assert words(rule("namespace:gpu_idle_energy_joules:rate5m")) == \
        words(ql.idle_power_by_namespace())


def test_the_dashboards_waste_row_is_the_same_text() -> None:
    """The processes dashboard's waste row: the rules' expressions under the dashboard's
    variables; the day's energy is the increase1d record's sum at the same steps."""
    board = dict(targets(load("gpu-processes")))
    ql = FleetQL(matchers=DASHBOARD)
    assert words(board["Allocated GPUs left idle"]) == words(ql.idle_allocated())
    assert words(board["Processes holding memory with no engine time"]) == \
        words(ql.idle_processes())
    assert words(board["Idle power of allocated GPUs by namespace"]) == \
        words(ql.idle_power_by_namespace("$__rate_interval"))
    day = rule("namespace:gpu_idle_energy_joules:increase1d")
    assert words(day) == "sum_over_time(namespace:gpu_idle_energy_joules:rate5m[1d:5m]) * 300"
    assert words(board["Idle energy by namespace, last 24 hours"]) == words(
        f"sum_over_time(( {ql.idle_power_by_namespace()} )[1d:5m]) * 300 / 3600000")


def test_the_fleet_view_narrows_the_same_text_to_a_node() -> None:
    """With a node's matcher every selector is narrowed, and nothing else changes."""
    ql = FleetQL()
    m = ql.node_matcher('node"1')
    assert m == 'instance="node\\"1"'
    for plain, narrowed in ((ql.idle_allocated(), ql.idle_allocated(m)),
                            (ql.idle_processes(), ql.idle_processes(m))):
        # the series the exporter serves (the threshold record carries no node label)
        names = re.findall(r"(?<![\w:])(gpu_[a-z_]+)\b", plain)
        assert names and narrowed.count(m) == len(names)
        assert words(narrowed.replace(f"{{{m}}}", "")) == words(plain)


# ---------------------------------------------------------------- fed the fixture


@pytest.mark.slow
def test_node1_is_fed_the_k8s_node_fixtures_series() -> None:
    want = golden()
    checked = 0
    for case in cases(WASTE) + cases(ENERGY):
        for name, labels, values in inputs(case):
            if labels.get("instance") != NODE1["instance"]:
                continue
            assert {k: labels.pop(k) for k in NODE1} == NODE1
            key = tuple(sorted(labels.items()))
            assert key in want[name], (name, labels)
            assert values[0] == want[name][key], (name, labels)
            checked += 1
    fed = {n for c in cases(WASTE) for n, labels, _ in inputs(c)
           if labels.get("instance") == NODE1["instance"]}
    for name in ("gpu_kubernetes_allocation_info", "gpu_utilization_ratio",
                 "gpu_process_memory_used_bytes", "gpu_process_utilization_ratio",
                 "gpu_process_engine_busy_seconds_total"):
        assert name in fed
        # every series of the family the fixture serves is in the story, none left out
        given = {tuple(sorted((k, v) for k, v in labels.items() if k not in NODE1))
                 for c in cases(WASTE) for n, labels, _ in inputs(c)
                 if n == name and labels.get("instance") == NODE1["instance"]}
        assert given == set(want[name]), name
    assert checked > 40


def test_the_pod_holding_an_idle_gpu_is_the_one_that_alerts() -> None:
    """Every GPU allocated to a pod whose utilisation stays under 5 % alerts, once per
    container holding it; the others do not."""
    (case,) = [c for c in cases(WASTE) if "GpuAllocatedIdle" in c["name"]]
    util: dict[tuple[str, str], list[float | None]] = {}
    alloc: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for name, labels, values in inputs(case):
        key = (labels["instance"], labels["gpu"])
        if name == "gpu_utilization_ratio":
            util[key] = values
        elif name == "gpu_kubernetes_allocation_info":
            alloc[key].append(labels)
    want = set()
    for key, holders in alloc.items():
        recent = [v for v in util[key][2:62] if v is not None]  # the hour before 61m
        if recent and max(recent) < 0.05:
            want |= {(*key, h["namespace"], h["pod"]) for h in holders}
    assert want == {("node1:9445", "3", "llm", "llm-server-0"),
                    ("node2:9445", "0", "batch", "etl-0")}
    got = {(a["instance"], a["gpu"], a["namespace"], a["pod"])
           for a in firing(case, "GpuAllocatedIdle")}
    assert got == want


def test_processes_holding_memory_with_no_engine_time_are_the_ones_that_alert() -> None:
    (case,) = [c for c in cases(WASTE) if "GpuProcessMemoryIdle" in c["name"]]
    memory, busy, ratio, gpu_util = {}, defaultdict(list), defaultdict(list), {}
    for name, labels, values in inputs(case):
        pid = (labels.get("instance", ""), labels["gpu"], labels.get("pid", ""))
        if name == "gpu_process_memory_used_bytes":
            memory[pid] = values
        elif name == "gpu_process_engine_busy_seconds_total":
            busy[pid].append(values)
        elif name == "gpu_process_utilization_ratio":
            ratio[pid].append(values)
        elif name == "gpu_utilization_ratio":
            gpu_util[pid[:2]] = values
    reports = {pid[:2] for pid in ratio}  # GPUs whose processes have ratios
    want = set()
    for pid, held in memory.items():
        if not held[60]:
            continue
        if pid in busy:
            idle = all(len({v for v in series[55:62]}) == 1 for series in busy[pid])
        elif pid in ratio:
            idle = all(v == 0 for series in ratio[pid] for v in series[55:62])
        else:
            idle = max(v or 0 for v in gpu_util[pid[:2]][55:62]) == 0 or pid[:2] in reports
        if idle:
            want.add(pid)
    assert ("node1:9445", "0", "7505") in want  # the detector: its counter stood still
    assert ("node1:9445", "1", "7303") in want  # the notebook: NVML's ratio 0
    assert ("node2:9445", "1", "8300") not in want  # nothing to tell by: never called idle
    got = {(a["instance"], a["gpu"], a["pid"]) for a in firing(case, "GpuProcessMemoryIdle")}
    assert got == want


def test_idle_energy_per_namespace_follows_the_allocations() -> None:
    """Each GPU's idle joules split evenly between the containers holding it at each
    5-minute step, summed over the day's 288 steps, per namespace."""
    (case,) = cases(ENERGY)
    energy: dict[tuple[str, str], list[float | None]] = {}
    holders: dict[tuple[str, str], list[tuple[str, list[float | None]]]] = defaultdict(list)
    for name, labels, values in inputs(case):
        key = (labels["instance"], labels["gpu"])
        if name == "gpu_idle_energy_joules_total":
            energy[key] = values
        elif name == "gpu_kubernetes_allocation_info":
            holders[key].append((labels["namespace"], values))
    want: dict[str, float] = defaultdict(float)
    for key, counter in energy.items():  # a sample a minute
        for minute in range(5, 24 * 60 + 1, 5):
            now, before = counter[minute], counter[minute - 5]
            assert now is not None and before is not None
            held = [ns for ns, alloc in holders[key]
                    if minute < len(alloc) and alloc[minute] is not None]
            for ns in held:
                want[ns] += (now - before) / len(held)
    check = [t for t in case["promql_expr_test"]
             if t["expr"] == "namespace:gpu_idle_energy_joules:increase1d"][0]
    got = {parse_series(s["labels"])[1]["namespace"]: float(s["value"])
           for s in check["exp_samples"]}
    assert got == {ns: round(v, 3) for ns, v in want.items()}
    over = {ns for ns, v in want.items() if v > 10 * 3.6e6}
    assert over == {"batch"}
    assert {a["namespace"] for a in firing(case, "GpuNamespaceIdleEnergy")} == over
