"""The PMU's permission story as deployed: the systemd unit's opt-in lines, the chart's
pmu.perfmon and the kustomize perfmon component grant CAP_PERFMON and nothing else, and
docs/vendors-intel.md says what each grant buys."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_deploy_helm import container, pod_spec, render
from tests.test_deploy_kubernetes import KUSTOMIZE, by_kind, needs_kubectl, with_components
from tests.test_deploy_systemd import ANALYZE, UNIT, installable_copy, settings, verify

ROOT = Path(__file__).resolve().parent.parent
PERFMON_LINES = ("#CapabilityBoundingSet=CAP_PERFMON", "#AmbientCapabilities=CAP_PERFMON",
                 "#SystemCallFilter=perf_event_open")


@pytest.mark.slow
@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_opt_in_perfmon_is_valid_and_grants_only_perfmon(tmp_path: Path) -> None:
    text = UNIT.read_text()
    assert all(text.count(line) == 1 for line in PERFMON_LINES)
    assert "CAP_PERFMON" not in settings(text).get("AmbientCapabilities", [])
    opted = text
    for line in PERFMON_LINES:
        opted = opted.replace(line, line[1:])
    assert verify(installable_copy(tmp_path, opted)) == "rc=0"
    unit = settings(opted)
    assert unit["CapabilityBoundingSet"] == ["", "CAP_PERFMON"]
    assert unit["AmbientCapabilities"] == ["", "CAP_PERFMON"]
    # perf_event_open is in no group of @system-service: without this line seccomp says EPERM
    assert "perf_event_open" in unit["SystemCallFilter"]


@pytest.mark.slow  # Helm's engine
def test_chart_perfmon_runs_as_root_and_adds_perfmon_only() -> None:
    default = container(by_kind(render({}), "DaemonSet"))
    assert "PERFMON" not in default["securityContext"]["capabilities"].get("add", [])
    docs = render({"pmu": {"perfmon": True}, "kubernetes": {"enabled": False}})
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["PERFMON"]}
    assert pod["securityContext"]["runAsUser"] == 0  # added caps reach root's set only
    assert pod["hostPID"] is False
    both = container(by_kind(render({"pmu": {"perfmon": True}, "perProcess": {"enabled": True}}),
                             "DaemonSet"))
    assert both["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE", "PERFMON"]


@pytest.mark.slow
@needs_kubectl
def test_kustomize_perfmon_component_validates_and_grants_perfmon(tmp_path: Path) -> None:
    import kubernetes_validate

    from tests.test_deploy_kubernetes import K8S_VERSIONS

    ds = by_kind(with_components(tmp_path, [KUSTOMIZE / "components" / "perfmon"]), "DaemonSet")
    kubernetes_validate.validate(ds, K8S_VERSIONS[-1], strict=True)
    c = ds["spec"]["template"]["spec"]["containers"][0]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["PERFMON"]}
    assert ds["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 0


INTEL_MACHINES = ("intel-i915-cometlake", "intel-i915-arc-a380", "intel-xe-b580")
UTILISATION = ("gpu_utilization_ratio", "gpu_engine_utilization_ratio")


def test_dashboard_utilisation_panels_have_intel_rows() -> None:
    """Every panel that plots device or engine utilisation selects by vendor=~"$vendor"
    (whose values come from gpu_info): the Intel goldens now have those series."""
    import json
    import re

    from prometheus_client.parser import text_string_to_metric_families

    used = set()
    for board in (ROOT / "deploy" / "grafana").glob("*.json"):
        for expr in re.findall(r'"expr": "([^"\\]*(?:\\.[^"\\]*)*)"', board.read_text()):
            expr = json.loads(f'"{expr}"')
            for name in UTILISATION:
                if re.search(rf"\b{name}\{{", expr):
                    assert 'vendor=~"$vendor"' in expr, expr
                    used.add(name)
    assert used == set(UTILISATION)
    for machine in INTEL_MACHINES:
        text = (ROOT / "tests" / "golden" / f"{machine}.prom").read_text()
        found = {(s.name, s.labels["vendor"], s.labels["source"])
                 for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name in UTILISATION}
        assert {(n, "intel", "pmu") for n in UTILISATION} <= found, machine
