"""The chart's switches cannot silently break the shipped alerts.

Every combination of the switches values.yaml documents that changes what Prometheus
stores or evaluates (``prometheusRule.recordingRules``, ``prometheusRule.alerts.<name>``,
a ServiceMonitor or a PodMonitor, ``nameOverride``, ``fullnameOverride``, the release
name, ``kubernetes.deviceLabels``) is rendered by Helm's engine; the job label the
Prometheus Operator gives the exporter's targets is worked out from the rendered monitor
(``job_of``, a model of the operator's relabelling); and the promtool unit tests of
deploy/prometheus/tests are run on the rendered PrometheusRule, fed series under that job
(and, where the DaemonSet passes ``--kubernetes.device-labels``, with the pod labels the
exporter then puts on an exclusively held GPU's series: ``device_labelled``, learnt from
the real daemon). The expected alerts, and their labels, are the tests' own and stay as
they are: an alert of the combination that lost its namespace/pod/container, its job or
its firing fails them.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_rules import PROMTOOL, RULE_TESTS, RULES, metric_names
from test_kubernetes_rules import parse_series

from tests.daemon import FIXTURES, fixture_ids, running
from tests.fakes.kubelet import FakeKubelet, Node

pytestmark = pytest.mark.slow  # Helm's engine and promtool

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "gpu-exporter"
NAMESPACE = "monitoring"
JOB = "gpu-exporter"  # the job the shipped rules select (GpuExporterDown)

MONITORS = {"serviceMonitor": {"serviceMonitor": {"enabled": True}},
            "podMonitor": {"podMonitor": {"enabled": True}}}
# (release name, values): each way values.yaml documents to rename what the chart makes
NAMES = {"plain": ("gpu-exporter", {}),
         "release": ("gpus", {}),
         "nameOverride": ("gpu-exporter", {"nameOverride": "gpu"}),
         "fullnameOverride": ("gpu-exporter", {"fullnameOverride": "node-gpus"})}


def shipped_rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def alert_names() -> list[str]:
    return [r["alert"] for r in shipped_rules() if "alert" in r]


RULE_SWITCHES = {
    "all": {},
    "no-recording-rules": {"recordingRules": False},
    # every other alert off, recording rules off: what each alert needs must still come
    "half-the-alerts": {"recordingRules": False,
                        "alerts": {a: False for a in alert_names()[::2]}},
}


def render(chart: Chart, release: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    out = chart.render(values=values, name=release, namespace=NAMESPACE, is_install=True)
    return [d for path, text in out.items() if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def job_of(docs: list[dict[str, Any]]) -> str:
    """The job label of the exporter's targets, as the Prometheus Operator relabels them
    (prometheus-operator pkg/prometheus/promcfg.go, generateServiceMonitorConfig and
    generatePodMonitorConfig): first the Service's name (ServiceMonitor) or
    "<namespace>/<PodMonitor name>" (PodMonitor), then, where ``jobLabel`` is set and
    the Service (or pod) has that label with a non-empty value, that value; the
    monitor's own relabelings come after, and none of the chart's targets job."""
    monitors = [d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")]
    (monitor,) = monitors
    if monitor["kind"] == "ServiceMonitor":
        service = one(docs, "Service")
        job, labels = service["metadata"]["name"], service["metadata"]["labels"]
        endpoints = monitor["spec"]["endpoints"]
    else:
        job = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
        labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
        endpoints = monitor["spec"]["podMetricsEndpoints"]
    if monitor["spec"].get("jobLabel") and labels.get(monitor["spec"]["jobLabel"]):
        job = labels[monitor["spec"]["jobLabel"]]
    for endpoint in endpoints:
        assert all(r.get("targetLabel") != "job" for r in endpoint.get("relabelings", []))
    return str(job)


def rule_file(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"groups": one(docs, "PrometheusRule")["spec"]["groups"]}


Labelled = tuple[str, str, str]  # (namespace, pod, container)
POD_LABELS = ("namespace", "pod", "container")


def device_labelled(tmp: Path) -> set[str]:
    """The sample names that do NOT get the pod labels of an exclusively held GPU under
    --kubernetes.device-labels, as the real daemon serves the k8s-node fixture (a fake
    kubelet allots GPUs to pods): every other per-GPU series does."""
    node = FIXTURES / "k8s-node"
    with FakeKubelet(tmp / "kubelet.sock", Node.load(node / "kubelet.json")) as kubelet:
        args = ["--path.sysfs", str(FIXTURES / "mixed" / "sys"),
                "--path.procfs", str(node / "proc"), *fixture_ids(FIXTURES / "mixed"),
                "--kubernetes.pod-resources-socket", str(kubelet.socket),
                "--kubernetes.device-labels", "--collector.interval", "1h",
                "--collector.slow-interval", "1h", "--collector.processes.interval", "1h",
                "--kubernetes.interval", "1h"]
        with running(args, tmp, nvml_json=node / "nvml.json") as daemon:
            text = daemon.get().text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    held: dict[str, set[Labelled]] = defaultdict(set)
    for s in samples:
        if s.name == "gpu_kubernetes_allocation_info":
            held[s.labels["uuid"]].add(tuple(s.labels[k] for k in POD_LABELS))  # type: ignore[arg-type]
    exclusive = {uuid for uuid, pods in held.items() if len(pods) == 1}
    mine = [s for s in samples if s.labels.get("uuid") in exclusive]
    assert exclusive and {s.name for s in mine if "pod" in s.labels} >= {"gpu_up", "gpu_info"}
    return {s.name for s in mine if "pod" not in s.labels}


def with_device_labels(series: list[dict[str, Any]], unlabelled: set[str]) -> None:
    """The input series of one test case as the exporter serves them with
    --kubernetes.device-labels: a GPU that one container holds (its allocation series
    name one namespace/pod/container) has them on its per-GPU series too."""
    held: dict[tuple[str, ...], set[Labelled]] = defaultdict(set)
    parsed = [parse_series(s["series"]) for s in series]
    for name, labels in parsed:
        if name == "gpu_kubernetes_allocation_info":
            key = tuple(labels.get(k, "") for k in ("instance", "job", "gpu", "uuid"))
            held[key].add(tuple(labels[k] for k in POD_LABELS))  # type: ignore[arg-type]
    for s, (name, labels) in zip(series, parsed, strict=True):
        key = tuple(labels.get(k, "") for k in ("instance", "job", "gpu", "uuid"))
        if (name.startswith("gpu_") and not name.startswith(("gpu_process_", "gpu_exporter_"))
                and name not in unlabelled and "pod" not in labels
                and len(held.get(key, ())) == 1):
            labels.update(zip(POD_LABELS, next(iter(held[key])), strict=True))
            s["series"] = name + "{" + ", ".join(
                f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"


def adapted_tests(rules: dict[str, Any], job: str, where: Path,
                  unlabelled: set[str] | None = None) -> tuple[list[Path], set[str]]:
    """deploy/prometheus/tests rewritten for one rendered rule file: the input series
    under ``job`` (what Prometheus stores from the operator's targets; with
    ``unlabelled``, as --kubernetes.device-labels serves them), and only the checks whose
    alert or recording rule the file has. What is expected stays as is. Returns the test
    files and the alerts they still check."""
    present = {r.get("alert") or r.get("record") for g in rules["groups"] for r in g["rules"]}
    recorded = {r["record"] for r in shipped_rules() if "record" in r}
    where.mkdir()
    (where / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (where / "tests").mkdir()
    files, checked = [], set()
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        doc["rule_files"] = ["../rules.yml"]
        cases = []
        for case in doc["tests"]:
            for s in case.get("input_series", []):
                s["series"] = s["series"].replace(f'job="{JOB}"', f'job="{job}"')
            if unlabelled is not None:
                with_device_labels(case.get("input_series", []), unlabelled)
            alerts = [c for c in case.get("alert_rule_test", []) if c["alertname"] in present]
            exprs = [c for c in case.get("promql_expr_test", [])
                     if metric_names(c["expr"]) & recorded <= present]
            checked |= {c["alertname"] for c in alerts}
            case = {**case, "alert_rule_test": alerts, "promql_expr_test": exprs}
            if alerts or exprs:
                cases.append({k: v for k, v in case.items() if v != []})
        doc["tests"] = cases
        files.append(where / "tests" / path.name)
        files[-1].write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return files, checked


def promtool_test(files: list[Path]) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool is not installed (Debian package prometheus)"
    return subprocess.run([PROMTOOL, "test", "rules", *map(str, files)], capture_output=True,
                          text=True, timeout=300, cwd=files[0].parent)


def combinations() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for (m, monitor), (n, (release, names)), (r, rules) in itertools.product(
            MONITORS.items(), NAMES.items(), RULE_SWITCHES.items()):
        values = {**monitor, **names, "prometheusRule": {"enabled": True, **rules}}
        out.append((f"{m}-{n}-{r}", release, values))
    for r, rules in RULE_SWITCHES.items():  # the exporter's own switch that adds labels
        out.append((f"deviceLabels-{r}", "gpu-exporter", {
            **MONITORS["serviceMonitor"], "kubernetes": {"deviceLabels": True},
            "prometheusRule": {"enabled": True, **rules}}))
    return out


def device_labels_on(docs: list[dict[str, Any]]) -> bool:
    (container,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return "--kubernetes.device-labels" in container["args"]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_every_documented_combination_keeps_the_alerts_and_their_labels(
        tmp_path: Path) -> None:
    runs: dict[tuple[str, str, bool], list[str]] = {}  # (rules, job, device labels) -> names
    files: dict[tuple[str, str, bool], dict[str, Any]] = {}
    with Chart.load(CHART) as chart:
        for name, release, values in combinations():
            docs = render(chart, release, values)
            rules, job = rule_file(docs), job_of(docs)
            assert job == JOB, name
            key = (yaml.safe_dump(rules), job, device_labels_on(docs))
            runs.setdefault(key, []).append(name)
            files[key] = rules
    # the names and monitors change no rule and no job
    assert len(runs) == 2 * len(RULE_SWITCHES)
    (tmp_path / "daemon").mkdir()
    unlabelled = device_labelled(tmp_path / "daemon")
    suites = []
    for i, (key, names) in enumerate(runs.items()):
        tests, checked = adapted_tests(files[key], key[1], tmp_path / str(i),
                                       unlabelled if key[2] else None)
        kept = {r["alert"] for g in files[key]["groups"] for r in g["rules"] if "alert" in r}
        assert checked == kept, names  # every alert the file keeps is still tested
        suites.append((names, tests))
    # One promtool per rule file, as many at once as there are cores (each is seconds).
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        outs = list(pool.map(promtool_test, [tests for _, tests in suites]))
    for (names, _), out in zip(suites, outs, strict=True):
        assert out.returncode == 0, f"{names}:\n{out.stdout[-3000:]}{out.stderr[-2000:]}"


def test_recording_rules_off_keeps_what_each_alert_reads() -> None:
    """Each alert alone, with recordingRules=false: the rendered file holds exactly the
    recording rules that alert reads, directly or through another one (worked out here
    from the rules file's expressions), and nothing else."""
    records = {r["record"]: r["expr"] for r in shipped_rules() if "record" in r}
    alerts = {r["alert"]: r["expr"] for r in shipped_rules() if "alert" in r}

    def reads(expr: str) -> set[str]:
        found, todo = set(), [expr]
        while todo:
            for name in metric_names(todo.pop()) & set(records) - found:
                found.add(name)
                todo.append(records[name])
        return found

    assert "instance_gpu:gpu_kubernetes_allocation_info:exclusive" in reads(alerts["GpuLost"])
    with Chart.load(CHART) as chart:
        for alert, expr in alerts.items():
            values = {"prometheusRule": {"enabled": True, "recordingRules": False,
                                         "alerts": {a: a == alert for a in alerts}}}
            rules = rule_file(render(chart, "gpu-exporter", values))["groups"]
            kept = [r.get("alert") or r.get("record") for g in rules for r in g["rules"]]
            assert set(kept) == {alert} | reads(expr), alert


def test_the_checks_above_can_fail(tmp_path: Path) -> None:
    """Without the recording rule it joins, GpuLost fires without namespace/pod/container
    and the unit tests say so; a job taken from app.kubernetes.io/name follows
    nameOverride, and GpuExporterDown's test fails under it."""
    with Chart.load(CHART) as chart:
        docs = render(chart, "gpu-exporter", {**MONITORS["serviceMonitor"], "nameOverride": "gpu",
                                              "prometheusRule": {"enabled": True}})
    rules = rule_file(docs)
    for group in rules["groups"]:
        group["rules"] = [r for r in group["rules"]
                          if r.get("record") != "instance_gpu:gpu_kubernetes_allocation_info:"
                                                "exclusive"]
    tests, _ = adapted_tests(rules, JOB, tmp_path / "no-join")
    if PROMTOOL is not None:
        out = promtool_test(tests)
        assert out.returncode != 0 and "GpuLost" in out.stdout + out.stderr
    one(docs, "ServiceMonitor")["spec"]["jobLabel"] = "app.kubernetes.io/name"
    assert job_of(docs) == "gpu"
    tests, _ = adapted_tests(rule_file(docs), "gpu", tmp_path / "renamed")
    if PROMTOOL is not None:
        out = promtool_test(tests)
        assert out.returncode != 0 and "GpuExporterDown" in out.stdout + out.stderr
