"""``--metric-names dcgm4.9`` in a real Prometheus: dcgm-exporter 4.9's names on the same
fixture machines as tests/test_dcgm_prometheus_e2e.py (an HGX H100 pair, the
NVIDIA+AMD+Intel desktop fully equipped, an AMD APU laptop), with dashboard 12239's
current revision and the published alert rules as a 4.9 user has them
(tests/dcgm/references.yml, ``dashboard_current_4_9`` and ``alerts_4_9``, says how they
were written).

A fourth exporter serves the desktop as it is bare, with neither amd-smi nor the Level
Zero loader, in ``--metric-names both-dcgm4.9``: docs/dcgm-compat.md says which GPUs the
dashboard's picker can list and why the Intel card without Level Zero cannot be; the
``gpu_*`` names beside the DCGM ones show that nothing was left out that a figure existed
for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from exporter.client.fleet.nodes import load_fleet, load_node
from exporter.client.fleet.promapi import PrometheusAPI
from exporter.core.config import MetricNames
from tests.daemon import daemon_env, machine_args
from tests.prometheus_harness import PROMETHEUS, Exporter, get, query, scraped
from tests.test_dcgm_prometheus_e2e import (
    FIXTURES,
    L0_DATA,
    MACHINES,
    MIB,
    NOT_PROVIDED,
    REFERENCES,
    RX7800XT_VRAM_MIB,
    dashboard_promql,
    dcgm_names,
    evaluated_rules,
    extra_args,
    extra_env,
    label_values,
    xid_alert_fires_on_the_gpus_with_xids,
)

DASHBOARD = "dashboard_current_4_9"
ALERTS = REFERENCES["alerts_4_9"]
BARE = "mixed-bare"  # the desktop without amd-smi and Level Zero

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                       reason="no prometheus binary (Debian package prometheus)"),
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Three exporters in dcgm4.9 mode, the bare desktop in both-dcgm4.9, the 4.9 alerts."""
    tmp = tmp_path_factory.mktemp("dcgm49-prom")
    rules = {"groups": [{"name": "dcgm-exporter-alerts", "rules": ALERTS}]}
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
    exporters = [Exporter([*machine_args(FIXTURES / machine), "--collector.interval", "1s",
                           "--metric-names", "dcgm4.9", *extra_args(machine)],
                          extra_env(machine, tmp), f"exporter-{machine}")
                 for machine in MACHINES]
    mixed = FIXTURES / "mixed"
    exporters.append(Exporter(
        [*machine_args(mixed), "--collector.interval", "1s", "--metric-names", "both-dcgm4.9"],
        daemon_env(mixed / "nvml.json", {"NODE_NAME": BARE}), f"exporter-{BARE}"))
    with scraped(tmp, exporters, [tmp / "rules.yml"], job="dcgm") as api:
        time.sleep(3)  # a few scrapes and rule evaluations
        yield api


def every_gpu(api: str) -> set[tuple[str, str]]:
    """(hostname, gpu) of every GPU the dcgm4.9 exporters serve (each has a temperature)."""
    return {(r["metric"]["hostname"], r["metric"]["gpu"])
            for r in query(api, f'DCGM_FI_DEV_GPU_TEMP_CELSIUS{{hostname!="{BARE}"}}')}


def test_no_series_has_a_first_generation_name_or_label(prometheus: str) -> None:
    names = set(json.loads(get(f"{prometheus}/api/v1/label/__name__/values")[1])["data"])
    first = {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_SM_CLOCK",
             "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    assert names & first == set()
    assert not query(prometheus, '{__name__=~"DCGM_.+", Hostname!=""}')
    assert not query(prometheus, '{__name__=~"DCGM_.+", DCGM_FI_DRIVER_VERSION!=""}')
    assert query(prometheus, '{__name__=~"DCGM_.+", DCGM_FI_SYSTEM_DRIVER_VERSION!=""}')


def test_pickers_list_every_host_and_every_gpu(prometheus: str) -> None:
    gpus = every_gpu(prometheus)
    assert {h for h, _ in gpus} == set(MACHINES) and len(gpus) == 6
    (host_metric, host_label), (gpu_metric, gpu_label) = \
        REFERENCES[DASHBOARD]["variables"].values()
    assert set(MACHINES) <= set(label_values(prometheus, host_metric, host_label))
    for host in MACHINES:  # the GPU picker with one host chosen
        listed = label_values(prometheus, gpu_metric.replace("$instance", host), gpu_label)
        assert sorted(listed) == sorted(g for h, g in gpus if h == host), host
    assert sorted(label_values(prometheus, gpu_metric.replace("$instance", "mixed"),
                               gpu_label)) == ["0", "1", "2"]  # NVIDIA, AMD and Intel


def test_every_panel_but_tensor_core_shows_every_gpu(prometheus: str) -> None:
    gpus = every_gpu(prometheus)
    for panel in REFERENCES[DASHBOARD]["panels"]:
        expr = dashboard_promql(prometheus, panel["expr"], DASHBOARD)
        result = [r for r in query(prometheus, expr)
                  if r["metric"].get("hostname") != BARE]
        shown = {(r["metric"].get("hostname"), r["metric"].get("gpu")) for r in result}
        if panel["expr"].startswith(("avg(", "sum(")):
            assert len(query(prometheus, expr)) == 1, panel["title"]
        elif panel["title"] == "Tensor Core Utilization":  # GPM: the H100s only
            assert shown == {g for g in gpus if g[0] == "nvidia-h100x2"}
        else:
            assert shown == gpus, (panel["title"], gpus - shown)


def test_panels_show_the_new_units(prometheus: str) -> None:
    def one(name: str, host: str, device: str) -> float:
        (r,) = query(prometheus, f'{name}{{hostname="{host}",device="{device}"}}')
        return float(r["value"][1])

    assert one("DCGM_FI_DEV_SM_CLOCK_HERTZ", "nvidia-h100x2", "nvidia0") == 1980e6  # nvml.json
    vram = RX7800XT_VRAM_MIB
    assert one("DCGM_FI_DEV_FB_USED_BYTES", "mixed", "card1") == vram["vram_used"] * MIB
    assert one("DCGM_FI_DEV_FB_FREE_BYTES", "mixed", "card1") == (
        vram["vram_total"] - vram["vram_used"]) * MIB
    (memory,) = [line.split("\t") for line in L0_DATA.read_text().splitlines()
                 if line.startswith("memory\t")]
    assert one("DCGM_FI_DEV_FB_FREE_BYTES", "mixed", "card2") == int(memory[4])
    ratios = [float(r["value"][1]) for r in query(prometheus, "DCGM_FI_DEV_GPU_UTIL_RATIO")]
    assert ratios and all(0 <= v <= 1 for v in ratios)


@pytest.mark.parametrize("alert", [a["alert"] for a in ALERTS])
def test_every_field_an_alert_queries_returns_data(alert: str, prometheus: str) -> None:
    expr = next(a["expr"] for a in ALERTS if a["alert"] == alert)
    query(prometheus, expr)  # accepted and evaluated
    for name in sorted(dcgm_names(expr)):
        result = query(prometheus, name)
        if name in NOT_PROVIDED:
            assert result == [], f"{name} has data now: take it off the list"
        else:
            assert result, f"{alert}: {name} returns no data"


def test_alert_rules_load_and_evaluate(prometheus: str) -> None:
    rules = evaluated_rules(prometheus)
    assert {r["name"] for r in rules} == {a["alert"] for a in ALERTS}
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []


def test_an_xid_fires_the_xid_alert_on_that_gpu_only(prometheus: str) -> None:
    xid_alert_fires_on_the_gpus_with_xids(prometheus)


# -- the picker on the bare desktop (docs/dcgm-compat.md, "The GPU picker") --------------

def test_the_picker_lists_each_gpu_with_a_memory_figure_and_no_other(prometheus: str) -> None:
    """Listed: every GPU with a figure FB_FREE can honestly be (the gpu_* names beside it
    say which do). Not listed: the Intel card, for which Level Zero is off and sysfs gives
    no memory use (the docs' reason), and no made-up value in its place."""
    def gpus(expr: str) -> set[str]:
        return {r["metric"]["gpu"] for r in query(prometheus, expr)}

    listed = set(label_values(prometheus, f'DCGM_FI_DEV_FB_FREE_BYTES{{hostname="{BARE}"}}',
                              "gpu"))
    with_memory = gpus(f'gpu_memory_free_bytes{{instance=~".+", job="dcgm"}} '
                       f'and on (instance) DCGM_FI_DEV_GPU_TEMP_CELSIUS{{hostname="{BARE}"}}')
    assert listed == with_memory
    intel = {r["metric"]["gpu"] for r in query(
        prometheus, f'gpu_info{{vendor="intel"}} and on (instance) '
                    f'DCGM_FI_DEV_GPU_TEMP_CELSIUS{{hostname="{BARE}"}}')}
    assert intel and not intel & listed
    (card,) = intel
    memory = query(prometheus, f'{{__name__=~"gpu_(shared_)?memory_.*bytes", gpu="{card}"}} '
                               f'and on (instance) gpu_info{{vendor="intel"}}')
    assert memory == []  # nothing to derive a free figure from
    # what the docs offer instead: a picker on DCGM_FI_DEV_SM_CLOCK lists every GPU
    everyone = gpus(f'DCGM_FI_DEV_GPU_TEMP_CELSIUS{{hostname="{BARE}"}}')
    assert set(label_values(prometheus, f'DCGM_FI_DEV_SM_CLOCK_HERTZ{{hostname="{BARE}"}}',
                            "gpu")) == everyone == {"0", "1", "2"}
    for host in MACHINES:
        assert set(label_values(prometheus, f'DCGM_FI_DEV_SM_CLOCK_HERTZ{{hostname="{host}"}}',
                                "gpu")) == {g for h, g in every_gpu(prometheus) if h == host}


# -- the fleet view (top --prometheus) reads the 4.9 names ---------------------------------

def test_the_fleet_view_reads_the_4_9_names_in_base_units(prometheus: str) -> None:
    """The node list and one node's GPUs in ``--metric-names dcgm4.9``: the same numbers as
    the DCGM series say, with no /100 or MiB scaling left over from the first generation."""
    api = PrometheusAPI(prometheus)
    machines = {r["metric"]["instance"]: r["metric"]["hostname"] for r in query(
        prometheus, "group by (instance, hostname) (DCGM_FI_DEV_GPU_TEMP_CELSIUS)")}
    fleet = load_fleet(api, names=MetricNames.DCGM_4_9)
    assert fleet.errors == ()
    nodes = {machines[n.node]: n for n in fleet.nodes if n.node in machines}
    assert set(MACHINES) <= set(nodes)

    def total(name: str, host: str) -> float:
        return sum(float(r["value"][1])
                   for r in query(prometheus, f'{name}{{hostname="{host}"}}'))

    for host in MACHINES:
        node = nodes[host]
        assert node.gpus == len({g for h, g in every_gpu(prometheus) if h == host})
        assert node.power_watts == pytest.approx(total("DCGM_FI_DEV_BOARD_POWER_WATTS", host))
        assert node.memory_used_bytes == pytest.approx(total("DCGM_FI_DEV_FB_USED_BYTES", host))
    (instance,) = [i for i, h in machines.items() if h == "nvidia-h100x2"]
    detail = load_node(api, instance, names=MetricNames.DCGM_4_9)
    assert detail.errors == ()
    util = {r["metric"]["gpu"]: float(r["value"][1]) for r in query(
        prometheus, 'DCGM_FI_DEV_GPU_UTIL_RATIO{hostname="nvidia-h100x2"}')}
    assert {g.gpu: g.utilization for g in detail.gpus} == pytest.approx(util)
    assert all(g.name.startswith("NVIDIA H100") for g in detail.gpus)
    assert all(0 <= (g.utilization or 0) <= 1 for g in detail.gpus)
