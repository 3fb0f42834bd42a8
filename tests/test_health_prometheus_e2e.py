"""A real Prometheus evaluates the health and thermal alerts against the real daemon on a
hot, faulty fixture machine (tests/fixtures/build_health.py: mixed-faulty).

The alerts wait (``for:``) minutes before they fire; here they must be active (pending or
firing) on exactly the GPUs and checks the fixture's faults call for, for every vendor.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_deploy_dashboards import load, to_promql

from tests.daemon import daemon_env
from tests.prometheus_harness import PROMETHEUS, ROOT, Exporter, query, scraped

FIXTURE = ROOT / "tests" / "fixtures" / "mixed-faulty"
RULES = ROOT / "deploy" / "prometheus" / "gpu-exporter.rules.yml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                       reason="no prometheus binary (Debian package prometheus)"),
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exporter = Exporter(["--path.sysfs", str(FIXTURE / "sys"), "--path.procfs",
                         str(FIXTURE / "proc"), "--collector.interval", "1s"],
                        daemon_env(FIXTURE / "nvml.json"))
    with scraped(tmp_path_factory.mktemp("prom-health"), [exporter], [RULES]) as api:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(
                query(api, 'ALERTS{alertname="GpuTemperatureNearSlowdown"}')) < 4:
            time.sleep(0.5)
        yield api


def active(api: str, alert: str) -> set[tuple[str, ...]]:
    result = query(api, f'ALERTS{{alertname="{alert}", alertstate=~"pending|firing"}}')
    keys = ("vendor", "gpu", "check", "sensor")
    return {tuple(r["metric"][k] for k in keys if k in r["metric"]) for r in result}


def test_the_verdicts_are_scraped(prometheus: str) -> None:
    result = query(prometheus, "gpu_health_status")
    assert {r["metric"]["vendor"]: r["value"][1] for r in result} == {
        "nvidia": "2", "amd": "1", "intel": "1"}


def test_unhealthy_fires_for_the_failed_check_only(prometheus: str) -> None:
    # NVIDIA: recovery action GPU_RESET; its application XIDs (13, 31) fail nothing.
    assert active(prometheus, "GpuUnhealthy") == {("nvidia", "1", "driver")}


def test_degraded_fires_for_the_hot_amd_and_the_throttled_intel(prometheus: str) -> None:
    assert active(prometheus, "GpuDegraded") == {("amd", "0", "thermal"),
                                                 ("intel", "2", "thermal")}


def test_near_slowdown_fires_for_every_vendor_on_the_sensor_its_threshold_is_for(
        prometheus: str) -> None:
    # AMD: the junction against its own critical, and the memory (109 °C) against its own
    # (108 °C, temp3_crit), not the junction's: the threshold series carry their sensor.
    assert active(prometheus, "GpuTemperatureNearSlowdown") == {
        ("nvidia", "1", "gpu"), ("amd", "0", "junction"), ("amd", "0", "memory"),
        ("intel", "2", "package")}


def test_the_overview_inventory_shows_each_gpus_health(prometheus: str) -> None:
    (inventory,) = [p for p in load("gpu-overview")["panels"] if p["title"] == "Inventory"]
    (expr,) = [t["expr"] for t in inventory["targets"] if "gpu_health_status" in t["expr"]]
    result = query(prometheus, to_promql(expr))
    assert {r["metric"]["gpu"]: r["value"][1] for r in result} == {"0": "1", "1": "2", "2": "1"}
