"""deploy/kubernetes (kustomize), helm/gpu-exporter (static: no helm binary here) and the
Dockerfile, and that all three describe the same container."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
COMPONENT = KUSTOMIZE / "components" / "prometheus-operator"
CHART = ROOT / "helm" / "gpu-exporter"
KUBECTL = shutil.which("kubectl")
K8S_VERSIONS = ("1.28.0", "1.37.0")

needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl (with kustomize) is not installed"
)


def kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def with_component(tmp_path: Path) -> list[dict[str, Any]]:
    """Render an overlay the way the component's comment tells users to write one."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = Path("..", "..", *[".."] * (len(tmp_path.parts) - 1))  # from overlay/ up to /
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(rel / KUSTOMIZE.relative_to("/"))],
                "components": [str(rel / COMPONENT.relative_to("/"))],
            }
        )
    )
    return kustomize(overlay)


def container(daemonset: dict[str, Any]) -> dict[str, Any]:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


# ---------------------------------------------------------------- kustomize


@needs_kubectl
def test_manifests_validate_against_kubernetes_schemas() -> None:
    import kubernetes_validate

    docs = kustomize(KUSTOMIZE)
    assert sorted(d["kind"] for d in docs) == [
        "DaemonSet",
        "Namespace",
        "Service",
        "ServiceAccount",
    ]
    for version in K8S_VERSIONS:
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)


@needs_kubectl
def test_schema_validation_rejects_a_wrong_manifest() -> None:
    import kubernetes_validate

    daemonset = by_kind(kustomize(KUSTOMIZE), "DaemonSet")
    container(daemonset)["volumeMounts"][0]["readonly"] = True  # misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSIONS[-1], strict=True)


@needs_kubectl
def test_daemonset_reads_the_host_read_only_and_unprivileged() -> None:
    docs = kustomize(KUSTOMIZE)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {
        "gpu-exporter"
    }
    ds = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = container(ds)
    assert "--path.sysfs=/host/sys" in c["args"] and "--path.procfs=/host/proc" in c["args"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert volumes == {
        "sys": "/sys",
        "proc": "/proc",
        "pod-resources": "/var/lib/kubelet/pod-resources",
    }
    assert mounts["sys"]["mountPath"] == "/host/sys" and mounts["proc"]["mountPath"] == "/host/proc"
    assert all(m["readOnly"] for m in mounts.values())
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in c["securityContext"]
    # Monitoring must never take a GPU away from a workload.
    assert not any("gpu" in k for k in c["resources"].get("limits", {}))
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert c["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert pod["priorityClassName"] and pod["tolerations"]
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"


@needs_kubectl
def test_service_selects_the_pods_and_their_port() -> None:
    docs = kustomize(KUSTOMIZE)
    ds, svc = by_kind(docs, "DaemonSet"), by_kind(docs, "Service")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    port_names = {p["name"] for p in container(ds)["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names


@needs_kubectl
def test_servicemonitor_component_scrapes_the_service_as_job_gpu_exporter(tmp_path: Path) -> None:
    docs = with_component(tmp_path)
    svc, sm = by_kind(docs, "Service"), by_kind(docs, "ServiceMonitor")
    assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    # The alerting rules select job="gpu-exporter".
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "gpu-exporter"


# ---------------------------------------------------------------- helm chart (static)


def values() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return data


def templates() -> Iterator[tuple[str, str]]:
    for path in sorted((CHART / "templates").iterdir()):
        yield path.name, path.read_text()


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "gpu-exporter"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version, "chart appVersion must be the exporter's version"


def test_every_values_path_used_in_templates_exists() -> None:
    vals = values()
    used = set()
    for name, text in templates():
        for path in re.findall(r"\.Values\.([A-Za-z_][\w.]*)", text):
            used.add(path.split(".")[0])
            node: Any = vals
            for key in path.split("."):
                assert isinstance(node, dict) and key in node, f"{name}: .Values.{path}"
                node = node[key]
    assert set(vals) - used == set(), "values.yaml keys no template uses"


# Keys whose children are a Kubernetes object passed through as is (toYaml).
PASSTHROUGH = {
    "updateStrategy",
    "resources",
    "podSecurityContext",
    "securityContext",
    "livenessProbe",
    "readinessProbe",
    "tolerations",
    "affinity",
    "nodeSelector",
}


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
        if set(inside) & PASSTHROUGH or (indent and inside and inside[-1] in ("matchLabels",)):
            continue
        above = lines[i - 1].strip() if i else ""
        # A comment right above, or a sibling documented with it (interval/scrapeTimeout).
        sibling = re.match(rf" {{{indent}}}[A-Za-z_]\w*:", lines[i - 1]) and lines[
            i - 2
        ].strip().startswith("#")
        assert above.startswith("#") or sibling, f"values.yaml:{i + 1}: {key} has no comment"


def test_templates_reference_existing_helpers_and_files() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    defined = set(re.findall(r'define "([^"]+)"', helpers))
    for name, text in templates():
        assert text.count("{{") == text.count("}}"), name
        for used in re.findall(r'include "([^"]+)"', text):
            assert used in defined, f"{name}: include {used}"
        for path in re.findall(r'\.Files\.Get "([^"]+)"', text):
            assert (CHART / path).is_file(), f"{name}: {path}"
        for pattern in re.findall(r'\.Files\.Glob "([^"]+)"', text):
            assert list(CHART.glob(pattern)), f"{name}: {pattern}"
    names = {n for n, _ in templates()}
    assert names >= {
        "daemonset.yaml",
        "service.yaml",
        "servicemonitor.yaml",
        "prometheusrule.yaml",
        "dashboards-configmap.yaml",
        "web-config-secret.yaml",
        "NOTES.txt",
    }


def test_operator_resources_are_behind_flags() -> None:
    vals = values()
    assert vals["serviceMonitor"]["enabled"] is False
    assert vals["prometheusRule"]["enabled"] is False
    for name in ("servicemonitor.yaml", "prometheusrule.yaml", "web-config-secret.yaml"):
        text = (CHART / "templates" / name).read_text()
        first = next(line for line in text.splitlines() if line.strip())
        assert re.fullmatch(r"\{\{- if \.Values\.\w+\.enabled \}\}", first), name
    configmap = (CHART / "templates" / "dashboards-configmap.yaml").read_text()
    assert "{{ .Values.dashboards.label }}:" in configmap
    assert vals["dashboards"]["label"] == "grafana_dashboard"


def render_simple(text: str, vals: dict[str, Any], app_version: str) -> str:
    """Substitute the plain {{ .Values.a.b }} and image expressions; enough for comparing."""

    def value(path: str) -> str:
        node: Any = vals
        for key in path.split("."):
            node = node[key]
        return str(node)

    text = text.replace(
        '{{ include "gpu-exporter.image" . }}',
        f"{vals['image']['repository']}:{vals['image']['tag'] or app_version}",
    )
    text = re.sub(
        r"\{\{ \.Values\.([\w.]+) \| quote \}\}", lambda m: json.dumps(value(m.group(1))), text
    )
    return re.sub(r"\{\{ \.Values\.([\w.]+) \}\}", lambda m: value(m.group(1)), text)


@needs_kubectl
def test_chart_and_kustomize_agree_on_the_container() -> None:
    vals = values()
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    chart = render_simple((CHART / "templates" / "daemonset.yaml").read_text(), vals, app_version)
    ds = by_kind(kustomize(KUSTOMIZE), "DaemonSet")
    c, pod = container(ds), ds["spec"]["template"]["spec"]

    assert f"image: {c['image']}\n" in chart
    for arg in c["args"]:
        assert f"- {arg}\n" in chart, arg
    for port in c["ports"]:
        assert (
            f"- name: {port['name']}\n              containerPort: {port['containerPort']}\n"
            in chart
        )
    for mount in c["volumeMounts"]:
        assert (
            f"- name: {mount['name']}\n"
            f"              mountPath: {mount['mountPath']}\n"
            "              readOnly: true\n" in chart
        )
    for volume in pod["volumes"]:
        assert (
            f"- name: {volume['name']}\n"
            "          hostPath:\n"
            f"            path: {volume['hostPath']['path']}\n"
            f"            type: {volume['hostPath']['type']}\n" in chart
        )
    for env in c["env"]:
        assert f'- name: {env["name"]}\n              value: "{env["value"]}"\n' in chart
    assert f"path: {c['livenessProbe']['httpGet']['path']}" in chart
    assert f"path: {c['readinessProbe']['httpGet']['path']}" in chart
    # The pass-through blocks come from values.yaml: compare them as data.
    assert vals["podSecurityContext"] == pod["securityContext"]
    assert (
        vals["securityContext"]["capabilities"]["drop"]
        == c["securityContext"]["capabilities"]["drop"]
    )
    assert {k: v for k, v in vals["securityContext"].items() if k != "capabilities"} == {
        k: v for k, v in c["securityContext"].items() if k != "capabilities"
    }
    assert vals["resources"] == c["resources"]
    assert vals["tolerations"] == pod["tolerations"]
    assert vals["updateStrategy"] == ds["spec"]["updateStrategy"]
    assert vals["priorityClassName"] == pod["priorityClassName"]
    assert vals["hostPID"] == pod["hostPID"]
    assert vals["service"]["port"] == vals["containerPort"]


# ---------------------------------------------------------------- Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n\s*", " ", text)  # join continuation lines
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def test_dockerfile_is_multistage_non_root_with_entrypoint_and_healthcheck() -> None:
    steps = dockerfile()
    froms = [rest for ins, rest in steps if ins == "FROM"]
    assert len(froms) >= 2 and all("slim" in f for f in froms)
    final = steps[max(i for i, (ins, _) in enumerate(steps) if ins == "FROM") :]
    users = [rest for ins, rest in final if ins == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    uid = int(users[-1].split(":")[0])
    assert uid == values()["podSecurityContext"]["runAsUser"]
    entry = json.loads(next(rest for ins, rest in final if ins == "ENTRYPOINT"))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry == ["gpu-exporter"] and "gpu-exporter" in scripts
    assert [rest for ins, rest in final if ins == "EXPOSE"] == [str(values()["containerPort"])]
    health = next(rest for ins, rest in final if ins == "HEALTHCHECK")
    cmd = json.loads(health.split(" CMD ", 1)[1])
    assert cmd[:2] == ["python", "-c"] and "/-/healthy" in cmd[2]
    compile(cmd[2], "HEALTHCHECK", "exec")
    env = " ".join(rest for ins, rest in final if ins == "ENV")
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env and "NVIDIA_VISIBLE_DEVICES=all" in env
    labels = " ".join(rest for ins, rest in final if ins == "LABEL")
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    # Runtime dependencies only: the build installs the project without extras.
    installs = " ".join(rest for ins, rest in steps if ins == "RUN" and "pip install" in rest)
    assert "pip install ." in installs and "[" not in installs


def test_dockerignore_lets_in_what_the_build_copies() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for ins, rest in dockerfile():
        if ins == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                assert src.rstrip("/") in allowed, src
