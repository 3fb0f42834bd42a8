"""A real Prometheus scrapes the daemon in ``--metric-names dcgm`` on two fixture machines (an
HGX H100 pair and the NVIDIA+AMD+Intel desktop) and runs what dcgm-exporter users run: the
PromQL of NVIDIA's Grafana dashboard 12239 and published alert rules written for it
(tests/dcgm/references.yml says where each comes from).

Grafana's template variables are resolved as Grafana does: ``label_values(metric, label)``
through Prometheus's label-values API, and the dashboard's "All" selection as the regex
``(v1|v2|...)`` of every value, regex-escaped.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon import daemon_env, machine_args
from tests.fakes.fake_nvml import FakeGPU
from tests.prometheus_harness import PROMETHEUS, ROOT, Exporter, get, query, scraped

FIXTURES = ROOT / "tests" / "fixtures"
MACHINES = ("nvidia-h100x2", "mixed")
REFERENCES = yaml.safe_load((ROOT / "tests" / "dcgm" / "references.yml").read_text())

# Fields an alert queries that no fixture produces yet. Each must be empty today (so this
# list cannot go stale): when a backend starts filling one, move it out of here.
PENDING: dict[str, str] = {}
# Fields we do not provide at all (docs/dcgm-compat.md, "Not provided").
NOT_PROVIDED = {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "aggregate ECC counts are not read"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                       reason="no prometheus binary (Debian package prometheus)"),
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two exporters in dcgm mode, the cited alert rules, Prometheus scraping every second."""
    tmp = tmp_path_factory.mktemp("dcgm-prom")
    rules = {"groups": [{"name": "dcgm-exporter-alerts", "rules": REFERENCES["alerts"]}]}
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
    exporters = [Exporter([*machine_args(FIXTURES / machine), "--collector.interval", "1s",
                           "--metric-names", "dcgm"],
                          daemon_env(FIXTURES / machine / "nvml.json", {"NODE_NAME": machine}),
                          f"exporter-{machine}") for machine in MACHINES]
    with scraped(tmp, exporters, [tmp / "rules.yml"], job="dcgm") as api:
        time.sleep(3)  # a few scrapes and rule evaluations
        yield api


def label_values(api: str, metric: str, label: str) -> list[str]:
    """Grafana's ``label_values(metric, label)``."""
    status, body = get(f"{api}/api/v1/label/{label}/values?"
                       + urllib.parse.urlencode({"match[]": metric}))
    assert status == 200, body[:300]
    values: list[str] = json.loads(body)["data"]
    return values


def all_regex(values: list[str]) -> str:
    """Grafana's "All" of a multi-value variable: ``(a|b)``, escaped for a PromQL string."""
    return "(" + "|".join(re.sub(r"([\\.^$*+?(){}\[\]|])", r"\\\\\1", v) for v in values) + ")"


def dashboard_promql(api: str, expr: str) -> str:
    variables = REFERENCES["dashboard"]["variables"]
    for name, (metric, label) in variables.items():
        expr = expr.replace(f"${name}", all_regex(label_values(api, metric, label)))
    return expr


def test_dashboard_variables_list_every_machine_and_gpu(prometheus: str) -> None:
    assert len(label_values(prometheus, "DCGM_FI_DEV_GPU_TEMP", "instance")) == 2
    assert label_values(prometheus, "DCGM_FI_DEV_GPU_TEMP", "gpu") == ["0", "1", "2"]


def test_every_dashboard_panel_returns_data(prometheus: str) -> None:
    empty = [p["title"] for p in REFERENCES["dashboard"]["panels"]
             if not query(prometheus, dashboard_promql(prometheus, p["expr"]))]
    assert empty == []


def test_one_dashboard_shows_the_mixed_fleet(prometheus: str) -> None:
    panel = next(p for p in REFERENCES["dashboard"]["panels"] if p["title"] == "GPU Temperature")
    result = query(prometheus, dashboard_promql(prometheus, panel["expr"]))
    devices = sorted((r["metric"]["Hostname"], r["metric"]["device"]) for r in result)
    assert devices == [("mixed", "card1"), ("mixed", "card2"), ("mixed", "nvidia0"),
                       ("nvidia-h100x2", "nvidia0"), ("nvidia-h100x2", "nvidia1")]
    clocks = next(p for p in REFERENCES["dashboard"]["panels"] if p["title"] == "GPU SM Clocks")
    hz = {r["metric"]["device"] + "@" + r["metric"]["Hostname"]: float(r["value"][1])
          for r in query(prometheus, dashboard_promql(prometheus, clocks["expr"]))}
    assert hz["nvidia0@nvidia-h100x2"] == 1980e6  # nvml.json: clocks_mhz.sm, in Hz on the panel


def dcgm_names(expr: str) -> set[str]:
    return set(re.findall(r"\bDCGM_[A-Z0-9_]+\b", expr))


@pytest.mark.parametrize("alert", [a["alert"] for a in REFERENCES["alerts"]])
def test_every_field_an_alert_queries_returns_data(alert: str, prometheus: str) -> None:
    expr = next(a["expr"] for a in REFERENCES["alerts"] if a["alert"] == alert)
    query(prometheus, expr)  # accepted and evaluated
    for name in sorted(dcgm_names(expr)):
        result = query(prometheus, name)
        if name in PENDING or name in NOT_PROVIDED:
            assert result == [], f"{name} has data now: take it off the pending list"
        else:
            assert result, f"{alert}: {name} returns no data"


def test_alert_rules_load_and_evaluate(prometheus: str) -> None:
    deadline = time.monotonic() + 10
    rules: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        status, body = get(f"{prometheus}/api/v1/rules")
        assert status == 200
        rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
        if rules and all(not r["lastEvaluation"].startswith("0001") for r in rules):
            break
        time.sleep(0.5)
    assert {r["name"] for r in rules} == {a["alert"] for a in REFERENCES["alerts"]}
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []


def test_an_xid_fires_the_xid_alert_on_that_gpu_only(prometheus: str) -> None:
    config = json.loads((FIXTURES / "nvidia-h100x2" / "nvml.json").read_text())
    with_xids = [FakeGPU(index=i, **{k: v for k, v in g.items() if k == "xids"})
                 for i, g in enumerate(config["gpus"]) if g.get("xids")]
    deadline = time.monotonic() + 10
    firing: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not firing:
        firing = query(prometheus, 'ALERTS{alertname="GPUXidError",alertstate="firing"}')
        time.sleep(0.5)
    assert sorted(r["metric"]["UUID"] for r in firing) == sorted(g.uuid for g in with_xids)
    values = {r["metric"]["UUID"]: float(r["value"][1])
              for r in query(prometheus, "DCGM_FI_DEV_XID_ERRORS > 0")}
    assert values == {g.uuid: g.xids[-1] for g in with_xids}  # the last XID's code
