"""A real Prometheus scrapes the real daemon on a fixture machine; the dashboards'
main queries must return data and the rules must load and evaluate."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_deploy_dashboards import load, targets, to_promql

from tests.daemon import daemon_env
from tests.prometheus_harness import PROMETHEUS, ROOT, Exporter, get, query, scraped

FIXTURE = ROOT / "tests" / "fixtures" / "mixed"  # AMD + NVIDIA (fake NVML) + Intel
RULES = ROOT / "deploy" / "prometheus" / "gpu-exporter.rules.yml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(PROMETHEUS).exists(), reason="no prometheus binary (Debian package prometheus)"
    ),
    pytest.mark.skipif(
        not (FIXTURE / "sys").is_dir(), reason=f"fixture {FIXTURE.name} not built yet"
    ),
]

# Panels whose queries an AMD RX 7800 XT with a few GPU processes must fill.
MAIN_PANELS = {
    "gpu-overview": [
        "GPUs",
        "Fleet utilisation",
        "Device memory in use",
        "Power draw",
        "Exporters ready",
        "GPU utilisation",
        "Device memory used",
        "Temperature (hottest sensor)",
        "Power",
        "Inventory",
        "Backends up",
    ],
    "gpu-detail": ["GPU", "Utilisation", "Temperatures", "Clocks"],
    "gpu-processes": ["GPU processes", "Device memory by process (top 10)"],
}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Exporter on the fixture plus Prometheus scraping it every second; yields the API URL."""
    exporter = Exporter(["--path.sysfs", str(FIXTURE / "sys"), "--path.procfs",
                         str(FIXTURE / "proc"), "--collector.interval", "1s"],
                        daemon_env(FIXTURE / "nvml.json"))
    with scraped(tmp_path_factory.mktemp("prom"), [exporter], [RULES]) as api:
        # A few scrape intervals, so that rate() over the data has two points or more.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(query(api, "gpu_up[1m]")) == 0:
            time.sleep(0.5)
        time.sleep(4)
        yield api


def test_target_is_up(prometheus: str) -> None:
    result = query(prometheus, 'up{job="gpu-exporter"}')
    assert [r["value"][1] for r in result] == ["1"]


def test_dashboards_main_queries_return_data(prometheus: str) -> None:
    empty = []
    for name, titles in MAIN_PANELS.items():
        board = load(name)
        found = {title for title, _ in targets(board)}
        assert set(titles) <= found, (name, set(titles) - found)
        for title, expr in targets(board):
            if title in titles and not query(prometheus, to_promql(expr)):
                empty.append(f"{name}: {title}: {expr}")
    assert empty == []


def test_every_dashboard_query_is_accepted(prometheus: str) -> None:
    """Prometheus accepts every query (empty results are fine: not every GPU has every value)."""
    for name in MAIN_PANELS:
        for _, expr in targets(load(name)):
            query(prometheus, to_promql(expr))


def test_rules_load_and_evaluate(prometheus: str) -> None:
    status, body = get(f"{prometheus}/api/v1/rules")
    assert status == 200
    groups = json.loads(body)["data"]["groups"]
    assert {g["name"] for g in groups} == {"gpu-exporter.rules", "gpu-exporter.alerts",
                                           "gpu-exporter.energy.rules"}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not query(prometheus, "vendor:gpu_utilization_ratio:avg"):
        time.sleep(0.5)
    unhealthy = [r["name"] for g in groups for r in g["rules"] if r.get("health") == "err"]
    assert unhealthy == []
    result = query(prometheus, "vendor:gpu_utilization_ratio:avg")
    assert sorted(r["metric"]["vendor"] for r in result) == ["amd", "intel", "nvidia"]
    # A healthy fixture machine: the exporter, its target and its GPU alerts are quiet.
    firing = query(prometheus, 'ALERTS{alertstate="firing"}')
    assert [r["metric"]["alertname"] for r in firing] == []
