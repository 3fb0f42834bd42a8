"""A real Prometheus scrapes the real daemon on a fixture machine; the dashboards'
main queries must return data and the rules must load and evaluate."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_dashboards import load, targets, to_promql

from tests.daemon import daemon_env

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "mixed"  # AMD + NVIDIA (fake NVML) + Intel
RULES = ROOT / "deploy" / "prometheus" / "gpu-exporter.rules.yml"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


def wait_for(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if get(url)[0] == 200:
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:]
    pytest.fail(f"{log.stem} not ready at {url} (exit code {proc.poll()}):\n{tail}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Exporter on the fixture plus Prometheus scraping it every second; yields the API URL."""
    tmp = tmp_path_factory.mktemp("prom")
    exporter_port, prom_port = free_port(), free_port()
    exporter_log = (tmp / "exporter.log").open("wb")
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "--web.listen-address",
            f"127.0.0.1:{exporter_port}",
            "--path.sysfs",
            str(FIXTURE / "sys"),
            "--path.procfs",
            str(FIXTURE / "proc"),
            "--collector.interval",
            "1s",
        ],
        cwd=ROOT,
        env=daemon_env(FIXTURE / "nvml.json"),
        stdout=exporter_log,
        stderr=subprocess.STDOUT,
    )
    prom = None
    try:
        wait_for(f"http://127.0.0.1:{exporter_port}/-/ready", 30, exporter, tmp / "exporter.log")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "gpu-exporter",
                    "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        with (tmp / "prometheus.log").open("wb") as prom_log:
            prom = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=prom_log,
                stderr=subprocess.STDOUT,
            )
        api = f"http://127.0.0.1:{prom_port}"
        wait_for(f"{api}/-/ready", 30, prom, tmp / "prometheus.log")
        # A few scrape intervals, so that rate() over the data has two points or more.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(query(api, "gpu_up[1m]")) == 0:
            time.sleep(0.5)
        time.sleep(4)
        yield api
    finally:
        if prom is not None:
            stop(prom)
        stop(exporter)
        exporter_log.close()


def query(api: str, expr: str) -> list[dict[str, Any]]:
    status, body = get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert status == 200, (expr, body[:500])
    data = json.loads(body)
    assert data["status"] == "success", (expr, data)
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


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
