"""The shipped Kubernetes rules on a fixture's series: per-pod and per-namespace roll-ups
(GPU memory, engine time) and processes used outside their allocation.

deploy/prometheus/tests/gpu-kubernetes.test.yml feeds promtool the series the exporter
serves for the k8s-node fixture (tests/golden/k8s-node.prom, byte-identical to the
daemon's output: tests/test_kubernetes_e2e.py). Here: those input series are the
golden's (labels and values), the sums the test expects are recomputed from the golden,
and promtool passes the file.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon import REPO

RULE_TEST = REPO / "deploy" / "prometheus" / "tests" / "gpu-kubernetes.test.yml"
GOLDEN = REPO / "tests" / "golden" / "k8s-node.prom"
TARGET = {"job": "gpu-exporter", "instance": "node1:9445"}
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    """A promtool series selector -> (name, labels), PromQL string escapes decoded."""
    name, _, rest = text.partition("{")
    return name, {k: json.loads(f'"{v}"') for k, v in _LABEL.findall(rest)}


def cases() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(RULE_TEST.read_text())["tests"]
    return tests


def golden(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(GOLDEN.read_text())
            for s in f.samples if s.name == name}


def fed(case: dict[str, Any], name: str) -> dict[tuple[tuple[str, str], ...], str]:
    out = {}
    for s in case["input_series"]:
        series, labels = parse_series(s["series"])
        if series == name:
            assert {k: labels.pop(k) for k in TARGET} == TARGET
            out[tuple(sorted(labels.items()))] = str(s["values"])
    return out


def expected_samples(case: dict[str, Any], expr: str) -> dict[tuple[tuple[str, str], ...],
                                                              float]:
    for check in case["promql_expr_test"]:
        if check["expr"] == expr:
            return {tuple(sorted(parse_series(e["labels"])[1].items())): float(e["value"])
                    for e in check["exp_samples"]}
    raise AssertionError(f"no test of {expr}")


def test_roll_ups_are_fed_the_golden_series_and_expect_its_sums() -> None:
    (case,) = [c for c in cases() if "roll-ups" in c["name"]]
    memory = golden("gpu_process_memory_used_bytes")
    given = fed(case, "gpu_process_memory_used_bytes")
    assert set(given) == set(memory)
    for labels, values in given.items():
        start = float(values.split("x")[0])
        assert start == memory[labels]
    per_pod: dict[tuple[str, str], float] = defaultdict(float)
    per_ns: dict[str, float] = defaultdict(float)
    for labels, value in memory.items():
        d = dict(labels)
        if d["pod"]:  # host processes (pod="") belong to no pod
            per_pod[(d["namespace"], d["pod"])] += value
            per_ns[d["namespace"]] += value
    assert expected_samples(case, "namespace_pod:gpu_process_memory_used_bytes:sum") == {
        (("namespace", ns), ("pod", pod)): v for (ns, pod), v in per_pod.items()}
    assert expected_samples(case, "namespace:gpu_process_memory_used_bytes:sum") == {
        (("namespace", ns),): v for ns, v in per_ns.items()}
    assert per_pod[("ml", "train-b-5c4e")] == sum(  # two processes, one pod
        v for k, v in memory.items() if dict(k)["pod"] == "train-b-5c4e")
    # Engine time: the pod's series start at the golden's counters and grow 30 s a minute.
    busy = golden("gpu_process_engine_busy_seconds_total")
    engine = fed(case, "gpu_process_engine_busy_seconds_total")
    for labels, values in engine.items():
        assert float(values.split("+")[0]) == busy[labels]
        assert values.endswith("+30x10")
    pods = {(dict(k)["namespace"], dict(k)["pod"]) for k in engine if dict(k)["pod"]}
    assert expected_samples(case, "namespace_pod:gpu_process_engine_busy_seconds:rate5m") == {
        (("namespace", ns), ("pod", pod)): 30 / 60 for ns, pod in pods}


@pytest.mark.slow
def test_promtool_passes_the_kubernetes_rule_tests() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian package prometheus)")
    out = subprocess.run([promtool, "test", "rules", str(RULE_TEST)], capture_output=True,
                         text=True, timeout=120, cwd=RULE_TEST.parent)
    assert out.returncode == 0, out.stdout + out.stderr
