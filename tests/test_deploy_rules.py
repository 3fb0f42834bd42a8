"""deploy/prometheus: the alerting and recording rules and their promtool unit tests.

Also home of the PromQL helpers the dashboard and end-to-end tests share: which
metric names an expression uses, which names the exporter emits (the goldens),
and which names docs/metrics.md promises.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "gpu-exporter.rules.yml"
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))
CHART_RULES = ROOT / "helm" / "gpu-exporter" / "files" / "gpu-exporter.rules.yml"
GOLDEN_DIR = ROOT / "tests" / "golden"
METRICS_MD = ROOT / "docs" / "metrics.md"  # generated from the field table
PROMTOOL = shutil.which("promtool")

# Alerts about a namespace across the fleet, not about one machine.
NAMESPACE_ALERTS = {"GpuNamespaceIdleEnergy"}

# Series Prometheus makes itself for every target, not the exporter's.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}

_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    "atan2",
    "start",
    "end",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (function names, keywords and labels left out)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    text = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", "", text)
    names = set()
    for m in _IDENT.finditer(text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def promql_check(exprs: list[str], tmp_path: Path) -> None:
    """Every expression parses: promtool checks them as recording rules."""
    assert PROMTOOL, "promtool is not installed (Debian package prometheus)"
    rules = [{"record": f"check:expr_{i}:value", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "exprs.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
    out = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def golden_sample_names() -> set[str]:
    """Every sample name (counters with _total, histograms with _bucket...) in the goldens."""
    goldens = sorted(GOLDEN_DIR.glob("*.prom"))
    if not goldens:
        pytest.skip(
            "no tests/golden/*.prom yet: the lead's golden harness creates them; this check "
            "needs them to know which names the exporter emits"
        )
    names: set[str] = set()
    for path in goldens:
        for family in text_string_to_metric_families(path.read_text()):
            names.update(sample.name for sample in family.samples)
    return names


def documented_names() -> set[str]:
    """Family names that docs/metrics.md lists, with derived sample names."""
    names = set(re.findall(r"`(gpu_[a-z0-9_]+)`", METRICS_MD.read_text()))
    derived = {n + s for n in names for s in ("_bucket", "_count", "_sum")}
    return names | derived


def load_rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, object]]:
    return {str(r["alert"]): r for r in load_rules() if "alert" in r}


def recorded_names() -> set[str]:
    return {str(r["record"]) for r in load_rules() if "record" in r}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool is not installed (Debian package prometheus)"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.slow
def test_promtool_check_rules() -> None:
    out = _promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(load_rules())} rules found" in out.stdout


@pytest.mark.slow
def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool test files in deploy/prometheus/tests/"
    out = _promtool("test", "rules", *map(str, RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests are not vacuous: an alert that fires later than the rule says fails them."""
    doc = yaml.safe_load(RULES.read_text())
    (lost,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "GpuLost"]
    assert lost["for"] == "1m"
    lost["for"] = "30m"
    (tmp_path / "gpu-exporter.rules.yml").write_text(yaml.safe_dump(doc))
    (tmp_path / "tests").mkdir()
    for test_file in RULE_TESTS:
        shutil.copy(test_file, tmp_path / "tests" / test_file.name)
    out = subprocess.run(
        [str(PROMTOOL), "test", "rules", *(str(tmp_path / "tests" / t.name) for t in RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "GpuLost" in out.stdout + out.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alerts())
    assert names - firing == set(), "alerts with no firing test"
    assert names - silent == set(), "alerts with no not-firing test"


def test_every_recording_rule_is_tested() -> None:
    tested = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("promql_expr_test", []):
                tested |= metric_names(check["expr"])
    assert recorded_names() - tested == set()


def test_alerts_carry_severity_and_a_runbook() -> None:
    for name, rule in alerts().items():
        labels = rule["labels"]
        assert isinstance(labels, dict)
        assert labels.get("severity") in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert set(annotations) >= {"summary", "description"}, name
        # Runbook style: what happened, on which GPU, and what to do about it.
        assert len(str(annotations["description"])) >= 200, name
        # Where it happened: the machine, or for a per-namespace alert the namespace.
        where = "$labels.namespace" if name in NAMESPACE_ALERTS else "$labels.instance"
        assert where in str(annotations["summary"]), name


def test_recording_rule_names_follow_level_metric_operation() -> None:
    for name in recorded_names():
        assert re.fullmatch(r"[a-z_]*:[a-z_]+:[a-z0-9_]+", name), name


def test_issue_alert_list_is_covered() -> None:
    """The alerts the deployment issue asks for exist (names are part of the contract)."""
    assert set(alerts()) >= {
        "GpuExporterDown",
        "GpuExporterNotReady",
        "GpuExporterBackendDown",
        "GpuExporterCollectionStale",
        "GpuLost",
        "GpuXidErrors",
        "GpuUncorrectedEccErrors",
        "GpuRowRemapFailure",
        "GpuThermalThrottling",
        "GpuTemperatureNearSlowdown",
        "GpuMemoryNearlyFull",
        "GpuPowerBrake",
    }


def test_metric_name_extraction() -> None:
    expr = (
        'max without (sensor, source) (gpu_temperature_celsius{sensor=~"gpu|edge"}) '
        "> on (instance, job, gpu) group_left () (min by (instance) "
        '(gpu_temperature_threshold_celsius{threshold="slowdown"}) - 5) '
        "or increase(gpu_xid_errors_total[10m] offset 1h) > 0 "
        "or histogram_quantile(0.99, rate(x_bucket[$__rate_interval])) "
        'or sum by (namespace) (:gpu_utilization_ratio:avg{a="b(c)"}) or vector(0)'
    )
    assert metric_names(expr) == {
        "gpu_temperature_celsius",
        "gpu_temperature_threshold_celsius",
        "gpu_xid_errors_total",
        "x_bucket",
        ":gpu_utilization_ratio:avg",
    }


def test_rules_use_only_documented_metrics() -> None:
    known = documented_names() | recorded_names() | PROMETHEUS_SYNTHETIC
    for rule in load_rules():
        unknown = metric_names(str(rule["expr"])) - known
        assert unknown == set(), (rule.get("alert") or rule.get("record"), unknown)


def test_rules_use_only_metrics_the_exporter_emits() -> None:
    known = golden_sample_names() | recorded_names() | PROMETHEUS_SYNTHETIC
    unknown = {
        (str(rule.get("alert") or rule.get("record")), name)
        for rule in load_rules()
        for name in metric_names(str(rule["expr"])) - known
    }
    assert unknown == set(), "rules use names no golden output contains"


def test_chart_carries_the_same_rules() -> None:
    assert CHART_RULES.read_bytes() == RULES.read_bytes(), (
        "helm/gpu-exporter/files/gpu-exporter.rules.yml must be a copy of "
        "deploy/prometheus/gpu-exporter.rules.yml"
    )
