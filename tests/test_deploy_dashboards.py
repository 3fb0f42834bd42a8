"""deploy/grafana: the dashboards' structure, variables and PromQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_deploy_rules import (
    PROMETHEUS_SYNTHETIC,
    documented_names,
    golden_sample_names,
    metric_names,
    promql_check,
    recorded_names,
)

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "deploy" / "grafana"
CHART_DASHBOARDS = ROOT / "helm" / "gpu-exporter" / "files" / "dashboards"
NAMES = ("gpu-overview", "gpu-detail", "gpu-processes")

# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_MACROS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "${datasource}": "",
}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GRAFANA / f"{name}.json").read_text())
    return data


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def targets(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expression) for every query of every panel."""
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def to_promql(expr: str, variables: dict[str, str] | None = None) -> str:
    """What Prometheus receives: macros replaced, template variables set (default: All)."""
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    values = variables or {}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), ".*"), expr)


def variable_queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """label_values(<selector>, label) of the query variables -> (selector, label)."""
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"] if isinstance(var["query"], str) else var["query"]["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
            assert m, (var["name"], query)
            yield m.group(1), m.group(2)


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_model(name: str) -> None:
    board = load(name)
    assert board["uid"] == f"gpu-exporter-{name.removeprefix('gpu-')}"
    assert board["title"] and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for var in ("instance", "gpu", "vendor"):
        assert variables[var]["type"] == "query", var
        assert variables[var]["datasource"]["uid"] == "${datasource}", var
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.mark.parametrize("name", NAMES)
def test_panels_do_not_overlap(name: str) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in panels(load(name)):
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


@pytest.mark.parametrize("name", NAMES)
def test_per_gpu_queries_follow_the_variables(name: str) -> None:
    """Every query honours $instance; every per-GPU query also $gpu and $vendor."""
    for title, expr in targets(load(name)):
        assert '"$instance"' in expr, title
        if re.search(r"\bgpu_(?!exporter_)", expr):
            assert '"$gpu"' in expr and '"$vendor"' in expr, title


@pytest.mark.slow
def test_every_query_parses(tmp_path: Path) -> None:
    exprs = [to_promql(e) for n in NAMES for _, e in targets(load(n))]
    exprs += [to_promql(sel) for n in NAMES for sel, _ in variable_queries(load(n))]
    promql_check(exprs, tmp_path)


@pytest.mark.slow
def test_query_check_catches_bad_promql(tmp_path: Path) -> None:
    with pytest.raises(AssertionError):
        promql_check(["sum by (gpu (gpu_up)"], tmp_path)


def all_names() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for name in NAMES:
        board = load(name)
        for title, expr in targets(board):
            for metric in metric_names(to_promql(expr)):
                used.setdefault(metric, set()).add(f"{name}: {title}")
        for selector, _ in variable_queries(board):
            for metric in metric_names(to_promql(selector)):
                used.setdefault(metric, set()).add(f"{name}: variables")
    return used


def thresholds() -> set[str]:
    """The shipped rules' threshold records: a panel may read one, with its default where
    the rules are not loaded (``x or vector(default)``); nothing else recorded."""
    return {n for n in recorded_names() if n.endswith(":threshold")}


def test_dashboards_use_only_documented_metrics() -> None:
    unknown = set(all_names()) - documented_names() - PROMETHEUS_SYNTHETIC - thresholds()
    assert unknown == set()


def test_dashboards_use_only_metrics_the_exporter_emits() -> None:
    known = golden_sample_names() | PROMETHEUS_SYNTHETIC | thresholds()
    unknown = {m: sorted(where) for m, where in all_names().items() if m not in known}
    assert unknown == {}, "dashboards use names no golden output contains"


@pytest.mark.parametrize("name", NAMES)
def test_chart_carries_the_same_dashboard(name: str) -> None:
    copy = CHART_DASHBOARDS / f"{name}.json"
    assert copy.read_bytes() == (GRAFANA / f"{name}.json").read_bytes(), (
        f"helm/gpu-exporter/files/dashboards/{name}.json must be a copy of deploy/grafana/"
    )


def test_chart_carries_no_other_dashboard() -> None:
    assert sorted(p.stem for p in CHART_DASHBOARDS.glob("*.json")) == sorted(NAMES)
