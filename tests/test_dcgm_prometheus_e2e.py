"""A real Prometheus scrapes the daemon in ``--metric-names dcgm`` on three fixture machines
(an HGX H100 pair, the NVIDIA+AMD+Intel desktop and an AMD APU laptop) and runs what
dcgm-exporter users run: the PromQL of NVIDIA's Grafana dashboard 12239, its 2020 revision
and its current one, and published alert rules written for it (tests/dcgm/references.yml
says where each comes from).

The desktop runs as a fully equipped one: with amd-smi for its AMD card (the fake amdsmi,
answering the memory figures of a real RX 7800 XT, below) and the Level Zero loader for its
Intel card (the stub loader with the B580's recorded answers), so every GPU reports memory
and so appears in the current revision's pickers, which list ``DCGM_FI_DEV_FB_FREE``.

Grafana's template variables are resolved as Grafana does: ``label_values(metric, label)``
through Prometheus's label-values API, in the dashboard's order (a picker's query may use
an earlier one's value), and the "All" selection as the regex ``(v1|v2|...)`` of every
value, regex-escaped.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon import PERF_SHIM, SHIM, daemon_env, machine_args
from tests.fakes.fake_nvml import FakeGPU
from tests.fakes.ze_build import build_stub
from tests.prometheus_harness import PROMETHEUS, ROOT, Exporter, get, query, scraped

FIXTURES = ROOT / "tests" / "fixtures"
MACHINES = ("nvidia-h100x2", "mixed", "amd-apu-phoenix")
MIB = 1 << 20
# amd-smi on a real RX 7800 XT (the mixed machine's AMD card), "mem_usage" total_vram and
# used_vram in MiB: github.com/nathaninline/ajean/issues/39 (amd-smi static and metric).
RX7800XT_VRAM_MIB = {"vram_total": 16368, "vram_used": 14569}
L0_DATA = FIXTURES / "intel-xe-b580" / "level_zero.tsv"  # the B580's recorded answers
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
                           "--metric-names", "dcgm", *extra_args(machine)],
                          extra_env(machine, tmp), f"exporter-{machine}")
                 for machine in MACHINES]
    with scraped(tmp, exporters, [tmp / "rules.yml"], job="dcgm") as api:
        time.sleep(3)  # a few scrapes and rule evaluations
        yield api


def extra_args(machine: str) -> list[str]:
    return ["--collector.level-zero"] if machine == "mixed" else []


def extra_env(machine: str, tmp: Path) -> dict[str, str]:
    nvml = FIXTURES / machine / "nvml.json"
    env = daemon_env(nvml if nvml.exists() else None, {"NODE_NAME": machine})
    if machine == "mixed":
        amdsmi = tmp / "amdsmi.json"
        amdsmi.write_text(json.dumps({"gpus": [{"bdf": "0000:03:00.0",
                                                "vram": RX7800XT_VRAM_MIB}]}))
        env.update(LD_LIBRARY_PATH=str(build_stub(tmp / "ze").parent), ZE_STUB_DATA=str(L0_DATA),
                   FAKE_AMDSMI_JSON=str(amdsmi),
                   PYTHONPATH=os.pathsep.join(map(str, (SHIM, PERF_SHIM, ROOT / "tests" / "fakes",
                                                        ROOT))))
    return env


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


def resolved(api: str, dashboard: str = "dashboard") -> dict[str, str]:
    """Each variable's "All" regex, in the dashboard's order."""
    out: dict[str, str] = {}
    for name, (metric, label) in REFERENCES[dashboard]["variables"].items():
        for earlier, regex in out.items():
            metric = metric.replace(f"${earlier}", regex)
        out[name] = all_regex(label_values(api, metric, label))
    return out


def dashboard_promql(api: str, expr: str, dashboard: str = "dashboard") -> str:
    for name, regex in resolved(api, dashboard).items():
        expr = expr.replace(f"${name}", regex)
    return expr


def test_dashboard_variables_list_every_machine_and_gpu(prometheus: str) -> None:
    assert len(label_values(prometheus, "DCGM_FI_DEV_GPU_TEMP", "instance")) == len(MACHINES)
    assert label_values(prometheus, "DCGM_FI_DEV_GPU_TEMP", "gpu") == ["0", "1", "2"]


def test_every_dashboard_panel_returns_data(prometheus: str) -> None:
    empty = [p["title"] for p in REFERENCES["dashboard"]["panels"]
             if not query(prometheus, dashboard_promql(prometheus, p["expr"]))]
    assert empty == []


# -- the current revision of 12239 ----------------------------------------------------------

def every_gpu(api: str) -> set[tuple[str, str]]:
    """(Hostname, gpu) of every GPU the exporters serve (each has a temperature)."""
    return {(r["metric"]["Hostname"], r["metric"]["gpu"])
            for r in query(api, "DCGM_FI_DEV_GPU_TEMP")}


def test_current_pickers_list_every_host_and_every_gpu(prometheus: str) -> None:
    gpus = every_gpu(prometheus)
    assert {h for h, _ in gpus} == set(MACHINES) and len(gpus) == 6
    (host_metric, host_label), (gpu_metric, gpu_label) = \
        REFERENCES["dashboard_current"]["variables"].values()
    assert sorted(label_values(prometheus, host_metric, host_label)) == sorted(MACHINES)
    for host in MACHINES:  # the GPU picker with one host chosen
        listed = label_values(prometheus, gpu_metric.replace("$instance", host), gpu_label)
        assert sorted(listed) == sorted(g for h, g in gpus if h == host), host
    assert sorted(label_values(prometheus, gpu_metric.replace("$instance", "mixed"),
                               gpu_label)) == ["0", "1", "2"]  # NVIDIA, AMD and Intel


def test_every_current_panel_but_tensor_core_shows_every_gpu(prometheus: str) -> None:
    gpus = every_gpu(prometheus)
    for panel in REFERENCES["dashboard_current"]["panels"]:
        result = query(prometheus, dashboard_promql(prometheus, panel["expr"],
                                                    "dashboard_current"))
        shown = {(r["metric"].get("Hostname"), r["metric"].get("gpu")) for r in result}
        if panel["expr"].startswith(("avg(", "sum(")):
            assert len(result) == 1, panel["title"]  # one number over every GPU
        elif panel["title"] == "Tensor Core Utilization":  # GPM: the H100s only
            assert shown == {g for g in gpus if g[0] == "nvidia-h100x2"}
        else:
            assert shown == gpus, (panel["title"], gpus - shown)


def test_gpu_utilization_panel_says_where_each_value_came_from(prometheus: str) -> None:
    source = {(r["metric"]["Hostname"], r["metric"]["device"]): r["metric"]["source"]
              for r in query(prometheus, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")}
    # Intel's busier of render and compute: Level Zero's once it has two readings (a
    # library goes before kernel files), the i915/xe PMU's on the first cycle.
    assert source.pop(("mixed", "card2")) in ("level_zero", "pmu")
    assert source == {
        ("nvidia-h100x2", "nvidia0"): "nvml_gpm", ("nvidia-h100x2", "nvidia1"): "nvml_gpm",
        ("mixed", "nvidia0"): "nvml",  # an Ada card: NVML's utilisation, no GPM
        ("mixed", "card1"): "sysfs",  # AMD's GFX engine
        ("amd-apu-phoenix", "card1"): "sysfs"}


def test_framebuffer_of_every_vendor(prometheus: str) -> None:
    def fb(name: str, host: str, device: str) -> float:
        (r,) = query(prometheus, f'{name}{{Hostname="{host}",device="{device}"}}')
        return float(r["value"][1])

    vram = RX7800XT_VRAM_MIB
    assert fb("DCGM_FI_DEV_FB_USED", "mixed", "card1") == vram["vram_used"]
    assert fb("DCGM_FI_DEV_FB_FREE", "mixed", "card1") == vram["vram_total"] - vram["vram_used"]
    (memory,) = [line.split("\t") for line in L0_DATA.read_text().splitlines()
                 if line.startswith("memory\t")]
    size, free = int(memory[3]), int(memory[4])  # memory location physicalSize size free ...
    assert fb("DCGM_FI_DEV_FB_FREE", "mixed", "card2") == free / MIB
    assert fb("DCGM_FI_DEV_FB_USED", "mixed", "card2") == (size - free) / MIB
    # The APU's framebuffer is the system memory it maps: its carve-out and GTT.
    (dev,) = (FIXTURES / "amd-apu-phoenix" / "sys" / "devices").rglob("mem_info_gtt_total")
    read = {n: int((dev.parent / n).read_text()) for n in (
        "mem_info_vram_total", "mem_info_vram_used", "mem_info_gtt_total", "mem_info_gtt_used")}
    used = read["mem_info_vram_used"] + read["mem_info_gtt_used"]
    total = read["mem_info_vram_total"] + read["mem_info_gtt_total"]
    # (dcgm values keep 12 significant digits)
    assert fb("DCGM_FI_DEV_FB_USED", "amd-apu-phoenix", "card1") == pytest.approx(
        used / MIB, rel=1e-11)
    assert fb("DCGM_FI_DEV_FB_FREE", "amd-apu-phoenix", "card1") == pytest.approx(
        (total - used) / MIB, rel=1e-11)


def test_one_dashboard_shows_the_mixed_fleet(prometheus: str) -> None:
    panel = next(p for p in REFERENCES["dashboard"]["panels"] if p["title"] == "GPU Temperature")
    result = query(prometheus, dashboard_promql(prometheus, panel["expr"]))
    devices = sorted((r["metric"]["Hostname"], r["metric"]["device"]) for r in result)
    assert devices == [("amd-apu-phoenix", "card1"), ("mixed", "card1"), ("mixed", "card2"),
                       ("mixed", "nvidia0"),
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


def evaluated_rules(prometheus: str) -> list[dict[str, Any]]:
    """The rules Prometheus loaded, once each has been evaluated (10 s at most)."""
    deadline = time.monotonic() + 10
    rules: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        status, body = get(f"{prometheus}/api/v1/rules")
        assert status == 200
        rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
        if rules and all(not r["lastEvaluation"].startswith("0001") for r in rules):
            break
        time.sleep(0.5)
    return rules


def test_alert_rules_load_and_evaluate(prometheus: str) -> None:
    rules = evaluated_rules(prometheus)
    assert {r["name"] for r in rules} == {a["alert"] for a in REFERENCES["alerts"]}
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []


def xid_alert_fires_on_the_gpus_with_xids(prometheus: str) -> list[FakeGPU]:
    """Waits (10 s at most) for GPUXidError to fire; it fires on exactly the fixture's GPUs
    with XIDs, which are returned."""
    config = json.loads((FIXTURES / "nvidia-h100x2" / "nvml.json").read_text())
    with_xids = [FakeGPU(index=i, **{k: v for k, v in g.items() if k == "xids"})
                 for i, g in enumerate(config["gpus"]) if g.get("xids")]
    deadline = time.monotonic() + 10
    firing: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not firing:
        firing = query(prometheus, 'ALERTS{alertname="GPUXidError",alertstate="firing"}')
        time.sleep(0.5)
    assert sorted(r["metric"]["UUID"] for r in firing) == sorted(g.uuid for g in with_xids)
    return with_xids


def test_an_xid_fires_the_xid_alert_on_that_gpu_only(prometheus: str) -> None:
    with_xids = xid_alert_fires_on_the_gpus_with_xids(prometheus)
    values = {r["metric"]["UUID"]: float(r["value"][1])
              for r in query(prometheus, "DCGM_FI_DEV_XID_ERRORS > 0")}
    assert values == {g.uuid: g.xids[-1] for g in with_xids}  # the last XID's code
