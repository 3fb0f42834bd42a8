"""helm/gpu-exporter rendered by Helm's own engine (helm-python-sdk: Helm as a library, no
binary) for the default values and every toggle. Each rendered object validates against
the Kubernetes schemas (kubernetes-validate) or, for the Prometheus Operator's kinds,
against their CRDs' fields; the chart lints clean; values.schema.json rejects typos; and
the default render equals the kustomize manifests in deploy/kubernetes."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from helm_python.chart import Chart, lint
from helm_python.errors import HelmRenderError, HelmValuesError
from test_deploy_kubernetes import (
    COMPONENT,
    K8S_VERSIONS,
    KUSTOMIZE,
    by_kind,
    container,
    kustomize,
    needs_kubectl,
    with_components,
)
from test_deploy_rules import PROMTOOL, RULES
from test_deploy_systemd import cli_flags

from exporter.serve.webconfig import OPEN_PATHS

pytestmark = pytest.mark.slow  # Helm's engine renders the chart: seconds a test

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "gpu-exporter"
RELEASE = NAMESPACE = "gpu-exporter"
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

TLS = {"tls_server_config": {"cert_file": "/etc/gpu-exporter/tls/tls.crt",
                             "key_file": "/etc/gpu-exporter/tls/tls.key"}}
BASIC_AUTH = {"basic_auth_users": {"prometheus": "$2y$10$" + "x" * 53}}
MTLS = {"tls_server_config": {**TLS["tls_server_config"],
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": "/etc/gpu-exporter/tls/ca.crt"}}
KPS = {"release": "kube-prometheus-stack"}

TOGGLES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "serviceMonitor": {"serviceMonitor": {"enabled": True, "labels": KPS}},
    "podMonitor": {"podMonitor": {"enabled": True, "labels": KPS}},
    "prometheusRule": {"prometheusRule": {"enabled": True, "labels": KPS}},
    "prometheusRule-filtered": {"prometheusRule": {
        "enabled": True, "recordingRules": False,
        "alerts": {"GpuLost": False, "GpuXidErrors": False}}},
    "prometheusRule-waste": {"prometheusRule": {"enabled": True, "waste": {
        "idleUtilization": 0.1, "idleFor": "3h", "processIdleFor": "30m",
        "namespaceIdleEnergyKwh": 2.5}}},
    "webConfig-tls": {"webConfig": {"enabled": True, "config": TLS, "tlsSecretName": "gpu-tls"},
                      "serviceMonitor": {"enabled": True}},
    "webConfig-basicAuth": {"webConfig": {"enabled": True, "config": BASIC_AUTH}},
    "webConfig-mtls": {"webConfig": {"enabled": True, "config": MTLS, "tlsSecretName": "t"}},
    "perProcess": {"perProcess": {"enabled": True}},
    "pmu-perfmon": {"pmu": {"perfmon": True}},
    "kubernetes-off": {"kubernetes": {"enabled": False}},
    "criSocket": {"kubernetes": {"criSocket": {"enabled": True}, "deviceLabels": True,
                                 "podLabels": "team|app\\.kubernetes\\.io/name"}},
    "extraVolumes": {
        "extraVolumes": [{"name": "config", "configMap": {"name": "gpu-exporter-config"}}],
        "extraVolumeMounts": [{"name": "config", "mountPath": "/etc/gpu-exporter/config"}],
        "extraArgs": ["--config.file=/etc/gpu-exporter/config/config.yml"],
        "extraEnv": [{"name": "GPU_EXPORTER_COLLECTOR_INTERVAL", "value": "2s"}]},
    "nodeSelector": {"nodeSelector": {"nvidia.com/gpu.present": "true"}, "mallocArenaMax": 0,
                     "dashboards": {"enabled": False}, "serviceAccount": {"create": False}},
}


# ---------------------------------------------------------------- rendering


def render_text(values: dict[str, Any]) -> dict[str, str]:
    with Chart.load(CHART) as chart:
        out = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return {Path(path).name: text for path, text in out.items()}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs = []
    for name, text in render_text(values).items():
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def env_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each variable's value, or its valueFrom (the downward API)."""
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in container(by_kind(docs, "DaemonSet"))["env"]}


# The Prometheus Operator's CRDs, reduced to the fields this chart writes, from
# prometheus-operator/prometheus-operator example/prometheus-operator-crd/
# monitoring.coreos.com_{servicemonitors,podmonitors,prometheusrules}.yaml
# (operator 0.91.0, commit 00749296a6ed0225f09f8bd9849d764f1280d766). Unknown fields are
# errors here, as a misspelt field would be silently pruned by the API server.
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
             r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_SECRET_KEY = {"type": "object", "required": ["key"], "additionalProperties": False,
               "properties": {"key": {"type": "string"}, "name": {"type": "string"},
                              "optional": {"type": "boolean"}}}
_RELABEL = {"type": "array", "items": {"type": "object", "additionalProperties": False,
            "properties": {"sourceLabels": {"type": "array", "items": {"type": "string"}},
                           "separator": {"type": "string"}, "targetLabel": {"type": "string"},
                           "regex": {"type": "string"}, "modulus": {"type": "integer"},
                           "replacement": {"type": "string"},
                           "action": {"enum": ["replace", "keep", "drop", "hashmod", "labelmap",
                                               "labeldrop", "labelkeep", "lowercase",
                                               "uppercase", "keepequal", "dropequal"]}}}}
_ENDPOINT = {"type": "object", "additionalProperties": False, "properties": {
    "port": {"type": "string"}, "path": {"type": "string"}, "interval": _DURATION,
    "honorLabels": {"type": "boolean"},
    "scrapeTimeout": _DURATION, "scheme": {"enum": ["http", "https"]},
    "tlsConfig": {"type": "object"},
    "basicAuth": {"type": "object", "additionalProperties": False,
                  "properties": {"username": _SECRET_KEY, "password": _SECRET_KEY}},
    "relabelings": _RELABEL, "metricRelabelings": _RELABEL}}
_MONITOR_COMMON = {
    "jobLabel": {"type": "string"},
    "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
        "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
    "selector": {"type": "object", "additionalProperties": False, "properties": {
        "matchLabels": _STRINGS, "matchExpressions": {"type": "array"}}},
}
_RULE = {"type": "object", "additionalProperties": False, "required": ["expr"], "properties": {
    "record": {"type": "string"}, "alert": {"type": "string"}, "expr": {"type": "string"},
    "for": _DURATION, "keep_firing_for": _DURATION, "labels": _STRINGS, "annotations": _STRINGS}}


def _crd(spec: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"},
                           "metadata": {"type": "object", "required": ["name", "namespace"]},
                           "spec": {"type": "object", "additionalProperties": False,
                                    "required": required, "properties": spec}}}


CRD_SCHEMAS = {
    "ServiceMonitor": _crd({**_MONITOR_COMMON, "endpoints": {"type": "array", "items": _ENDPOINT}},
                           ["selector", "endpoints"]),
    "PodMonitor": _crd({**_MONITOR_COMMON,
                        "podMetricsEndpoints": {"type": "array", "items": _ENDPOINT}},
                       ["selector", "podMetricsEndpoints"]),
    "PrometheusRule": _crd({"groups": {"type": "array", "items": {
        "type": "object", "required": ["name", "rules"], "additionalProperties": False,
        "properties": {"name": {"type": "string"}, "interval": _DURATION,
                       "rules": {"type": "array", "items": _RULE}}}}}, ["groups"]),
}


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] in OPERATOR_KINDS:
        jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
        return
    import kubernetes_validate

    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0].removeprefix("--").removeprefix("no-")


# ---------------------------------------------------------------- every toggle


@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_every_toggle_renders_and_validates(toggle: str) -> None:
    docs = render(TOGGLES[toggle])
    assert {"DaemonSet", "Service"} <= {d["kind"] for d in docs}
    for doc in docs:
        assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
        validate(doc)
    flags = cli_flags()
    for arg in container(by_kind(docs, "DaemonSet"))["args"]:
        assert flag_name(arg) in flags, f"{arg}: not a flag of gpu-exporter --help"


@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_every_toggle_lints_clean(toggle: str) -> None:
    report = lint(CHART, TOGGLES[toggle], strict=True, namespace=NAMESPACE,
                  kube_version=f"v{K8S_VERSIONS[-1]}")
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); 2 warning, 3 error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_checks_above_can_fail(tmp_path: Path) -> None:
    """A wrong field fails validation; a broken template fails lint."""
    docs = render({})
    broken = copy.deepcopy(by_kind(docs, "DaemonSet"))
    container(broken)["volumeMounts"][0]["readonly"] = True  # misspelt
    with pytest.raises(Exception, match="readonly"):
        validate(broken)
    monitor = by_kind(render(TOGGLES["podMonitor"]), "PodMonitor")
    monitor["spec"]["podMetricsEndpoint"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)
    chart = tmp_path / "gpu-exporter"
    shutil.copytree(CHART, chart)
    service = chart / "templates" / "service.yaml"
    service.write_text(service.read_text().replace("{{ .Values.service.type }}",
                                                   "{{ .Values.service.type "))
    report = lint(chart, {}, strict=True)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"])


# ---------------------------------------------------------------- values.schema.json


@pytest.mark.parametrize("values, where", [
    ({"serviceMonitr": {"enabled": True}}, "serviceMonitr"),  # --set serviceMonitr.enabled=true
    ({"serviceMonitor": {"enabeld": True}}, "enabeld"),
    ({"kubernetes": {"criSocket": {"enabled": "yes"}}}, "/kubernetes/criSocket/enabled"),
    ({"extraArgs": ["collector.interval=2s"]}, "/extraArgs/0"),
    ({"livenessProbe": {"httpGet": {"path": "/metrics"}}}, "httpGet"),
    ({"logLevel": "verbose"}, "/logLevel"),
])
def test_schema_rejects_a_typo(values: dict[str, Any], where: str) -> None:
    """The SDK applies values.schema.json on render, as helm install does."""
    with pytest.raises(HelmValuesError, match=re.escape(where)):
        render_text(values)


def test_schema_accepts_every_default_and_covers_every_key() -> None:
    with Chart.load(CHART) as chart:
        schema, defaults = chart.schema, chart.values
    assert schema is not None
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(defaults, schema)

    def walk(node: dict[str, Any], sub: dict[str, Any], path: str) -> None:
        props = sub.get("properties")
        if props is None:  # a Kubernetes object passed through, or a free map
            return
        for key, value in node.items():
            assert key in props, f"values.schema.json has no {path}{key}"
            if isinstance(value, dict):
                walk(value, props[key], f"{path}{key}.")

    walk(defaults, schema, "")


# ---------------------------------------------------------------- PrometheusRule


def rules_file() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return data


def alert_names() -> set[str]:
    return {r["alert"] for g in rules_file()["groups"] for r in g["rules"] if "alert" in r}


def test_prometheus_rule_carries_the_rules_file_unchanged() -> None:
    rule = by_kind(render(TOGGLES["prometheusRule"]), "PrometheusRule")
    assert rule["spec"] == rules_file()
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_alert_switches_filter_the_rules_file() -> None:
    rule = by_kind(render(TOGGLES["prometheusRule-filtered"]), "PrometheusRule")
    # recordingRules=false keeps only the recording rules the kept alerts read, directly
    # or through another record (tests/test_deploy_helm_switches.py checks each alert).
    rules = [r for g in rules_file()["groups"] for r in g["rules"]]
    records = {r["record"]: r["expr"] for r in rules if "record" in r}
    todo = [r["expr"] for r in rules if r.get("alert") not in (None, "GpuLost", "GpuXidErrors")]
    read: set[str] = set()
    while todo:
        expr = todo.pop()
        for name in records:
            if name not in read and re.search(rf"(^|[^\w:]){re.escape(name)}($|[^\w:])", expr):
                read.add(name)
                todo.append(records[name])
    expected = []
    for group in rules_file()["groups"]:
        kept = [r for r in group["rules"]
                if r.get("alert", "GpuLost") not in ("GpuLost", "GpuXidErrors")
                or r.get("record") in read]
        if kept:
            expected.append({**group, "rules": kept})
    assert rule["spec"]["groups"] == expected
    assert {"instance_gpu:gpu_kubernetes_allocation_info:exclusive",
            ":gpu_waste_idle_utilization_ratio:threshold"} <= read  # GpuUnhealthy, waste
    assert "vendor:gpu_utilization_ratio:avg" not in read  # dashboards' records are gone


def test_waste_values_set_the_thresholds_and_durations() -> None:
    """prometheusRule.waste rewrites the threshold records and the waste alerts' `for`,
    and nothing else: the rest equals the rules file."""
    rule = by_kind(render(TOGGLES["prometheusRule-waste"]), "PrometheusRule")
    got = {r.get("record") or r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert got[":gpu_waste_idle_utilization_ratio:threshold"]["expr"] == "vector(0.1)"
    assert got[":gpu_waste_namespace_idle_energy_joules:threshold"]["expr"] == \
        "vector(2.5 * 3600000)"
    assert got["GpuAllocatedIdle"]["for"] == "3h"
    assert got["GpuProcessMemoryIdle"]["for"] == "30m"
    file = {r.get("record") or r["alert"]: r for g in rules_file()["groups"] for r in g["rules"]}
    changed = {name for name in file if got[name] != file[name]}
    assert changed == {":gpu_waste_idle_utilization_ratio:threshold",
                       ":gpu_waste_namespace_idle_energy_joules:threshold",
                       "GpuAllocatedIdle", "GpuProcessMemoryIdle"}


@pytest.mark.parametrize("values, where", [
    ({"idleUtilization": 5}, "idleUtilization"),  # a percentage where a ratio goes
    ({"idleFor": "1 hour"}, "idleFor"),
    ({"namespaceIdleEnergyKwh": "10kWh"}, "namespaceIdleEnergyKwh"),
])
def test_schema_rejects_bad_waste_values(values: dict[str, Any], where: str) -> None:
    with pytest.raises(HelmValuesError, match=where):
        render_text({"prometheusRule": {"enabled": True, "waste": values}})


def test_an_unknown_alert_switch_fails_the_render() -> None:
    with pytest.raises(HelmRenderError, match="prometheusRule.alerts.GpuLots: no such alert"):
        render_text({"prometheusRule": {"enabled": True, "alerts": {"GpuLots": False}}})


def test_values_have_a_switch_for_every_alert() -> None:
    with Chart.load(CHART) as chart:
        switches = chart.values["prometheusRule"]["alerts"]
    assert set(switches) == alert_names(), (
        "add each new alert of deploy/prometheus/gpu-exporter.rules.yml to "
        "prometheusRule.alerts in helm/gpu-exporter/values.yaml (AlertName: true)")
    assert all(v is True for v in switches.values())


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_rendered_rules_pass_promtool(tmp_path: Path) -> None:
    for toggle in ("prometheusRule", "prometheusRule-filtered", "prometheusRule-waste"):
        path = tmp_path / f"{toggle}.yml"
        path.write_text(yaml.safe_dump(by_kind(render(TOGGLES[toggle]), "PrometheusRule")["spec"]))
        out = subprocess.run([str(PROMTOOL), "check", "rules", str(path)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr


# ---------------------------------------------------------------- scraping


@pytest.mark.parametrize("kind, toggle", [("ServiceMonitor", "serviceMonitor"),
                                          ("PodMonitor", "podMonitor")])
def test_monitor_selects_the_pods_as_job_gpu_exporter(kind: str, toggle: str) -> None:
    docs = render(TOGGLES[toggle])
    monitor, ds = by_kind(docs, kind), by_kind(docs, "DaemonSet")
    other = ({"ServiceMonitor", "PodMonitor"} - {kind}).pop()
    assert other not in {d["kind"] for d in docs}
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    target = pod_labels if kind == "PodMonitor" else by_kind(docs, "Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= target.items()
    assert target[monitor["spec"]["jobLabel"]] == "gpu-exporter"  # the job the alerts select
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    endpoints = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    (endpoint,) = monitor["spec"][endpoints]
    assert endpoint["port"] in {p["name"] for p in container(ds)["ports"]}
    assert endpoint["scheme"] == "http"
    assert endpoint["relabelings"][0]["targetLabel"] == "node"


def test_every_monitor_honors_the_workload_labels() -> None:
    # The operator adds pod/namespace/container of the exporter's own pod; honorLabels keeps
    # ours (the workload's), which the recording rules and dashboards group by.
    seen = set()
    for toggle, values in TOGGLES.items():
        for doc in render(values):
            if doc["kind"] in {"ServiceMonitor", "PodMonitor"}:
                seen.add(doc["kind"])
                for endpoint in doc["spec"].get("endpoints", doc["spec"].get(
                        "podMetricsEndpoints")):
                    assert endpoint["honorLabels"] is True, (toggle, doc["kind"])
    assert seen == {"ServiceMonitor", "PodMonitor"}


@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_node_name_comes_from_the_downward_api(toggle: str) -> None:
    # dcgm mode's Hostname label is NODE_NAME, else the host name (the pod's name here).
    assert env_of(render(TOGGLES[toggle]))["NODE_NAME"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_service_links_are_off(toggle: str) -> None:
    """The kubelet would put *_SERVICE_HOST/*_PORT variables of every Service of the
    namespace into the pod (tests/test_service_links.py); the exporter needs none."""
    pods = [doc["spec"]["template"]["spec"] for doc in render(TOGGLES[toggle])
            if doc["kind"] == "DaemonSet"]
    assert pods and all(pod["enableServiceLinks"] is False for pod in pods)


def test_image_is_one_the_user_builds() -> None:
    # No public registry: a local tag loaded into the nodes, or the user's registry.
    with Chart.load(CHART) as chart:
        version = chart.metadata["appVersion"]
    assert container(by_kind(render({}), "DaemonSet"))["image"] == f"gpu-exporter:{version}"
    pushed = render({"image": {"repository": "registry.example.com/gpu-exporter"}})
    assert container(by_kind(pushed, "DaemonSet"))["image"] == (
        f"registry.example.com/gpu-exporter:{version}")
    shipped = [CHART / "values.yaml", *KUSTOMIZE.rglob("*.yaml"), ROOT / "docs" / "deploy.md"]
    assert [p for p in shipped if "ghcr.io" in p.read_text()] == []


def test_service_and_pod_monitor_are_alternatives() -> None:
    with pytest.raises(HelmRenderError, match="enable one"):
        render_text({"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})


# ---------------------------------------------------------------- probes and web config


def probes(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    c = container(by_kind(docs, "DaemonSet"))
    return c["livenessProbe"], c["readinessProbe"]


def test_probes_are_http_on_the_paths_the_daemon_exempts_from_auth() -> None:
    for toggle, scheme in (("defaults", "HTTP"), ("webConfig-basicAuth", "HTTP"),
                           ("webConfig-tls", "HTTPS")):
        live, ready = probes(render(TOGGLES[toggle]))
        assert live["httpGet"] == {"path": "/-/healthy", "port": "metrics", "scheme": scheme}
        assert ready["httpGet"] == {"path": "/-/ready", "port": "metrics", "scheme": scheme}
        assert {live["httpGet"]["path"], ready["httpGet"]["path"]} == OPEN_PATHS
        assert live["periodSeconds"] == 30 and ready["periodSeconds"] == 10


def test_probes_fall_back_to_tcp_only_where_client_certificates_are_required() -> None:
    live, ready = probes(render(TOGGLES["webConfig-mtls"]))
    assert live["tcpSocket"] == ready["tcpSocket"] == {"port": "metrics"}
    assert "httpGet" not in live


def test_web_config_is_a_mounted_secret_and_tls_scrapes_https() -> None:
    docs = render(TOGGLES["webConfig-tls"])
    secret = by_kind(docs, "Secret")
    assert yaml.safe_load(secret["stringData"]["web-config.yml"]) == TLS
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    assert "--web.config.file=/etc/gpu-exporter/web/web-config.yml" in c["args"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["web-config"] == "/etc/gpu-exporter/web"
    assert mounts["tls"] == "/etc/gpu-exporter/tls"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["web-config"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert volumes["tls"]["secret"]["secretName"] == "gpu-tls"
    assert by_kind(docs, "ServiceMonitor")["spec"]["endpoints"][0]["scheme"] == "https"


# ---------------------------------------------------------------- sockets and privileges


def test_default_mounts_the_kubelet_socket_read_only_as_root_without_capabilities() -> None:
    docs = render({})
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    # auto: no switch, so an absent socket is a down backend and not an exit (below)
    assert not [a for a in c["args"] if "collector.kubernetes" in a]
    (socket_arg,) = [a for a in c["args"] if a.startswith("--kubernetes.pod-resources-socket=")]
    socket = socket_arg.split("=", 1)[1]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")
    volume = next(v for v in pod["volumes"] if v["name"] == "pod-resources")
    assert mount["readOnly"] is True
    assert str(Path(socket).parent) == mount["mountPath"] == volume["hostPath"]["path"]
    assert Path(socket).name == "kubelet.sock"
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["runAsNonRoot"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["hostPID"] is False
    assert not any(a.startswith("--kubernetes.cri-socket") for a in c["args"])
    assert env_of(docs)["MALLOC_ARENA_MAX"] == "2"


# The kubelet root directories docs/deploy.md names, and the socket each kubelet serves.
KUBELET_ROOTS = {
    "default, k3s, RKE2": "/var/lib/kubelet",
    "microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
    "k0s": "/var/lib/k0s/kubelet",
}


def pod_resources_of(docs: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(the socket passed, the directory mounted, the host directory) of a render."""
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    (socket_arg,) = [a for a in c["args"] if a.startswith("--kubernetes.pod-resources-socket=")]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")
    volume = next(v for v in pod["volumes"] if v["name"] == "pod-resources")
    return socket_arg.split("=", 1)[1], mount["mountPath"], volume["hostPath"]["path"]


@pytest.mark.parametrize("root", list(KUBELET_ROOTS.values()), ids=list(KUBELET_ROOTS))
def test_the_kubelet_root_directory_places_the_socket_and_its_mount(root: str) -> None:
    """The chart knew /var/lib/kubelet only: on microk8s or k0s the socket is elsewhere."""
    for given in (root, root + "/"):
        docs = render({"kubernetes": {"kubeletRootDir": given}})
        assert pod_resources_of(docs) == (f"{root}/pod-resources/kubelet.sock",
                                          f"{root}/pod-resources", f"{root}/pod-resources")
    # podResourcesPath, where set, wins over the root directory (a kubelet's own layout).
    docs = render({"kubernetes": {"kubeletRootDir": root, "podResourcesPath": "/srv/pr/"}})
    assert pod_resources_of(docs) == ("/srv/pr/kubelet.sock", "/srv/pr", "/srv/pr")


def test_kubernetes_enabled_is_auto_true_or_false() -> None:
    """auto names the socket with no switch (the daemon's auto: down where it is absent);
    true adds --collector.kubernetes (an exit where it is absent); false turns it off."""
    def switches(values: dict[str, Any]) -> list[str]:
        args = container(by_kind(render(values), "DaemonSet"))["args"]
        return [a for a in args if "collector.kubernetes" in a]

    assert switches({}) == switches({"kubernetes": {"enabled": "auto"}}) == []
    assert switches({"kubernetes": {"enabled": True}}) == ["--collector.kubernetes"]
    assert switches({"kubernetes": {"enabled": False}}) == ["--no-collector.kubernetes"]
    forced = render({"kubernetes": {"enabled": True}})
    assert pod_resources_of(forced) == pod_resources_of(render({}))
    assert pod_spec(forced)["securityContext"]["runAsUser"] == 0
    with pytest.raises(HelmValuesError, match="/kubernetes/enabled"):
        render_text({"kubernetes": {"enabled": "on"}})


def test_cdi_spec_dirs_are_mounted_read_only_and_passed() -> None:
    # DRA claims resolve through the CDI specs: the same paths inside, read-only.
    docs = render({})
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    (arg,) = [a for a in c["args"] if a.startswith("--kubernetes.cdi-spec-dirs=")]
    dirs = arg.split("=", 1)[1].split(",")
    assert dirs == ["/etc/cdi", "/var/run/cdi"]  # the runtimes' default cdi_spec_dirs
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in dirs:
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    none = render({"kubernetes": {"cdiSpecDirs": []}})
    assert not any("cdi" in a for a in container(by_kind(none, "DaemonSet"))["args"])
    assert not any("cdi" in v["name"] for v in pod_spec(none)["volumes"])


def test_pod_labels_need_the_cri_socket_and_reach_the_flag() -> None:
    regex = r"team|app\.kubernetes\.io/name"
    with pytest.raises(HelmRenderError, match="needs kubernetes.criSocket.enabled"):
        render_text({"kubernetes": {"podLabels": regex}})
    docs = render({"kubernetes": {"podLabels": regex, "criSocket": {"enabled": True}}})
    assert f"--kubernetes.pod-labels={regex}" in container(by_kind(docs, "DaemonSet"))["args"]
    assert not any("pod-labels" in a for a in container(by_kind(render({}), "DaemonSet"))["args"])


def test_without_pod_attribution_the_pod_is_non_root_and_mounts_no_socket() -> None:
    docs = render(TOGGLES["kubernetes-off"])
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    assert "--no-collector.kubernetes" in c["args"]
    assert not any("kubernetes." in a for a in c["args"])
    # The host's sys and proc, and the emptyDir where a run records how it ended (an
    # emptyDir is writable by any user: the non-root exporter can keep it).
    assert {v["name"] for v in pod["volumes"]} == {"sys", "proc", "state"}
    assert next(v for v in pod["volumes"] if v["name"] == "state")["emptyDir"] == {
        "sizeLimit": "1Mi"}
    assert "--path.state=/var/lib/gpu-exporter" in c["args"]
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_cri_socket_is_opt_in_read_only_and_passed() -> None:
    docs = render(TOGGLES["criSocket"])
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    mount = next(m for m in c["volumeMounts"] if m["name"] == "cri-socket")
    volume = next(v for v in pod["volumes"] if v["name"] == "cri-socket")
    assert mount["readOnly"] is True
    assert volume["hostPath"] == {"path": "/run/containerd/containerd.sock", "type": "Socket"}
    assert f"--kubernetes.cri-socket={mount['mountPath']}" in c["args"]
    assert "--kubernetes.device-labels" in c["args"]
    with pytest.raises(HelmRenderError, match="criSocket.enabled needs kubernetes.enabled"):
        render_text({"kubernetes": {"enabled": False, "criSocket": {"enabled": True}}})


def test_per_process_preset_adds_host_pid_and_ptrace_only() -> None:
    docs = render(TOGGLES["perProcess"])
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    assert pod["hostPID"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert pod["securityContext"]["runAsUser"] == 0
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in c["securityContext"]
    # Without pod attribution the preset still needs root: a non-root container gets
    # added capabilities in its bounding set only.
    alone = pod_spec(render({"perProcess": {"enabled": True}, "kubernetes": {"enabled": False}}))
    assert alone["securityContext"]["runAsUser"] == 0
    # A user set in values wins over the chart's choice.
    mine = render({"podSecurityContext": {"runAsUser": 4242, "runAsNonRoot": True}})
    assert pod_spec(mine)["securityContext"]["runAsUser"] == 4242


def test_extra_volumes_and_mounts_are_added() -> None:
    docs = render(TOGGLES["extraVolumes"])
    c, pod = container(by_kind(docs, "DaemonSet")), pod_spec(docs)
    assert TOGGLES["extraVolumes"]["extraVolumes"][0] in pod["volumes"]
    assert TOGGLES["extraVolumes"]["extraVolumeMounts"][0] in c["volumeMounts"]
    assert c["args"][-1] == "--config.file=/etc/gpu-exporter/config/config.yml"
    assert env_of(docs)["GPU_EXPORTER_COLLECTOR_INTERVAL"] == "2s"


def test_node_selector_and_switches_reach_the_pod() -> None:
    docs = render(TOGGLES["nodeSelector"])
    assert pod_spec(docs)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "MALLOC_ARENA_MAX" not in env_of(docs)
    assert {"ConfigMap", "ServiceAccount"}.isdisjoint(d["kind"] for d in docs)
    assert pod_spec(docs)["serviceAccountName"] == "default"


def test_host_paths_need_the_privileged_pod_security_level() -> None:
    """Baseline forbids hostPath volumes; the kustomize namespace says privileged."""
    for toggle in TOGGLES:
        assert any("hostPath" in v for v in pod_spec(render(TOGGLES[toggle]))["volumes"])
    namespace = yaml.safe_load((KUSTOMIZE / "namespace.yaml").read_text())
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


# ---------------------------------------------------------------- NOTES.txt


def test_notes_tell_how_to_ask_the_running_daemon() -> None:
    notes = render_text({})["NOTES.txt"]
    assert (f"kubectl exec -n {NAMESPACE} <pod> -- gpu-exporter snapshot "
            "--from http://127.0.0.1:9445\n") in notes
    m = re.search(r"get pods -l (\S+) --field-selector spec.nodeName=<node>", notes)
    assert m, notes
    selector = dict(pair.split("=") for pair in m.group(1).split(","))
    pod_labels = by_kind(render({}), "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert "pod-security.kubernetes.io/enforce=privileged" in notes
    tls_notes = render_text(TOGGLES["webConfig-tls"])["NOTES.txt"]
    assert "snapshot --from https://127.0.0.1:9445" in tls_notes
    assert "<user>:<password>@" not in notes
    auth_notes = render_text(TOGGLES["webConfig-basicAuth"])["NOTES.txt"]
    assert "--from http://<user>:<password>@127.0.0.1:9445" in auth_notes
    assert "{{" not in notes and "<no value>" not in notes


# ---------------------------------------------------------------- values.yaml


def test_chart_metadata() -> None:
    import tomllib

    with Chart.load(CHART) as chart:
        meta = chart.metadata
    assert meta["apiVersion"] == "v2" and meta["name"] == "gpu-exporter"
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert meta["appVersion"] == version, "chart appVersion must be the exporter's version"


def test_every_values_key_is_used_by_a_template() -> None:
    text = "\n".join(p.read_text() for p in (CHART / "templates").iterdir())
    used = {p.split(".")[0] for p in re.findall(r"\.Values\.([A-Za-z_][\w.]*)", text)}
    with Chart.load(CHART) as chart:
        assert set(chart.values) - used == set()


# Keys whose children are a Kubernetes object passed through as is (toYaml).
PASSTHROUGH = {"updateStrategy", "resources", "podSecurityContext", "securityContext",
               "livenessProbe", "readinessProbe", "tolerations", "affinity", "nodeSelector",
               "alerts"}


def test_values_are_documented_value_by_value() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    parents: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = re.match(r"( *)([A-Za-z_]\w*):", line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2)
        parents = [(d, k) for d, k in parents if d < indent]
        inside = [k for _, k in parents]
        parents.append((indent, key))
        if set(inside) & PASSTHROUGH:
            continue
        above = lines[i - 1].strip() if i else ""
        # A comment right above, or a sibling documented with it (interval/scrapeTimeout).
        sibling = re.match(rf" {{{indent}}}[A-Za-z_]\w*:", lines[i - 1]) and lines[
            i - 2
        ].strip().startswith("#")
        assert above.startswith("#") or sibling, f"values.yaml:{i + 1}: {key} has no comment"


# ---------------------------------------------------------------- kustomize parity


def kustomize_pod(components: list[Path], tmp_path: Path) -> dict[str, Any]:
    docs = with_components(tmp_path, components) if components else kustomize(KUSTOMIZE)
    spec: dict[str, Any] = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


@needs_kubectl
@pytest.mark.parametrize("components, values", [
    ([], {}),
    (["per-process"], {"perProcess": {"enabled": True}}),
    (["cri-socket"], {"kubernetes": {"criSocket": {"enabled": True}}}),
    (["per-process", "cri-socket"],
     {"perProcess": {"enabled": True}, "kubernetes": {"criSocket": {"enabled": True}}}),
    (["kubelet-root-microk8s"], {"kubernetes": {"kubeletRootDir": KUBELET_ROOTS["microk8s"]}}),
    (["kubelet-root-k0s"], {"kubernetes": {"kubeletRootDir": KUBELET_ROOTS["k0s"]}}),
])
def test_kustomize_pod_equals_the_rendered_chart(
        components: list[str], values: dict[str, Any], tmp_path: Path) -> None:
    paths = [COMPONENT.parent / name for name in components]
    assert kustomize_pod(paths, tmp_path) == pod_spec(render(values))


@needs_kubectl
def test_kustomize_objects_equal_the_rendered_chart(tmp_path: Path) -> None:
    chart = render(TOGGLES["serviceMonitor"])
    plain = with_components(tmp_path, [COMPONENT])
    for kind in ("DaemonSet", "Service", "ServiceMonitor"):
        ours, theirs = by_kind(plain, kind)["spec"], by_kind(chart, kind)["spec"]
        if kind == "DaemonSet":
            ours, theirs = ours["updateStrategy"], theirs["updateStrategy"]
        elif kind == "ServiceMonitor":
            assert ours["selector"]["matchLabels"].items() <= (
                theirs["selector"]["matchLabels"].items())
            ours, theirs = ours["endpoints"], theirs["endpoints"]
        else:
            ours, theirs = ours["ports"], theirs["ports"]
        assert ours == theirs, kind
    assert by_kind(plain, "Namespace")["metadata"]["name"] == NAMESPACE


def test_host_libdrm_is_mounted_beside_the_host_sysfs_only_when_set() -> None:
    from exporter.sources.amd.ids import lookup_paths

    assert not [m for m in pod_spec(render({}))["containers"][0]["volumeMounts"]
                if m["name"] == "libdrm"]
    pod = pod_spec(render({"hostPaths": {"libdrm": "/usr/share/libdrm"}}))
    c = pod["containers"][0]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "libdrm")
    volume = next(v for v in pod["volumes"] if v["name"] == "libdrm")
    assert mount["readOnly"] is True and volume["hostPath"]["path"] == "/usr/share/libdrm"
    sysfs = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--path.sysfs="))
    assert str(lookup_paths(sysfs, None)[0][0]) == mount["mountPath"] + "/amdgpu.ids"
