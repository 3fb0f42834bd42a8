"""deploy/kubernetes: the kustomize base and its components, rendered by kubectl's kustomize
and validated against the Kubernetes schemas. tests/test_deploy_helm.py holds them equal to
the rendered Helm chart."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
COMPONENT = KUSTOMIZE / "components" / "prometheus-operator"
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


def with_components(tmp_path: Path, components: list[Path]) -> list[dict[str, Any]]:
    """Render an overlay the way the components' comments tell users to write one."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    up = Path(*[".."] * len(overlay.parts[1:]))  # kustomize takes relative paths only
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(up / KUSTOMIZE.relative_to("/"))],
                "components": [str(up / c.relative_to("/")) for c in components],
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


@pytest.mark.slow
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


@pytest.mark.slow
@needs_kubectl
def test_schema_validation_rejects_a_wrong_manifest() -> None:
    import kubernetes_validate

    daemonset = by_kind(kustomize(KUSTOMIZE), "DaemonSet")
    container(daemonset)["volumeMounts"][0]["readonly"] = True  # misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSIONS[-1], strict=True)


@pytest.mark.slow
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
    assert "--kubernetes.pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in (
        c["args"])
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    # The one writable mount: a small emptyDir where a run records how it ended.
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    assert state == {"name": "state", "emptyDir": {"sizeLimit": "1Mi"}}
    assert "--path.state=/var/lib/gpu-exporter" in c["args"]
    assert mounts.pop("state") == {"name": "state", "mountPath": "/var/lib/gpu-exporter"}
    assert volumes == {
        "sys": "/sys",
        "proc": "/proc",
        "pod-resources": "/var/lib/kubelet/pod-resources",
        # DRA: the CDI spec directories, passed as --kubernetes.cdi-spec-dirs.
        "cdi-specs-0": "/etc/cdi",
        "cdi-specs-1": "/var/run/cdi",
    }
    assert "--kubernetes.cdi-spec-dirs=/etc/cdi,/var/run/cdi" in c["args"]
    assert mounts["sys"]["mountPath"] == "/host/sys" and mounts["proc"]["mountPath"] == "/host/proc"
    assert all(m["readOnly"] for m in mounts.values())
    # uid 0 for the kubelet socket, but no capability and no privilege escalation.
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["hostPID"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in c["securityContext"]
    # Monitoring must never take a GPU away from a workload.
    assert not any("gpu" in k for k in c["resources"].get("limits", {}))
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
        "MALLOC_ARENA_MAX": "2",
        # dcgm mode's Hostname: the node's name, not the pod's.
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert c["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert c["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert pod["priorityClassName"] and pod["tolerations"]
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"


@pytest.mark.slow
@needs_kubectl
def test_service_selects_the_pods_and_their_port() -> None:
    docs = kustomize(KUSTOMIZE)
    ds, svc = by_kind(docs, "DaemonSet"), by_kind(docs, "Service")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    port_names = {p["name"] for p in container(ds)["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names


@pytest.mark.slow
@needs_kubectl
def test_servicemonitor_component_scrapes_the_service_as_job_gpu_exporter(tmp_path: Path) -> None:
    docs = with_components(tmp_path, [COMPONENT])
    svc, sm = by_kind(docs, "Service"), by_kind(docs, "ServiceMonitor")
    assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    # The alerting rules select job="gpu-exporter".
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "gpu-exporter"
    # The workload's pod/namespace/container win over the operator's target labels.
    assert all(e["honorLabels"] is True for e in sm["spec"]["endpoints"])


@pytest.mark.slow
@needs_kubectl
def test_per_process_and_cri_components_validate_and_grant_what_they_say(tmp_path: Path) -> None:
    import kubernetes_validate

    components = KUSTOMIZE / "components"
    docs = with_components(tmp_path, [components / "per-process", components / "cri-socket"])
    ds = by_kind(docs, "DaemonSet")
    kubernetes_validate.validate(ds, K8S_VERSIONS[-1], strict=True)
    pod, c = ds["spec"]["template"]["spec"], container(ds)
    assert pod["hostPID"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    cri = next(m for m in c["volumeMounts"] if m["name"] == "cri-socket")
    assert cri["readOnly"] is True
    assert f"--kubernetes.cri-socket={cri['mountPath']}" in c["args"]


def test_namespace_is_labelled_for_pod_security() -> None:
    namespace = yaml.safe_load((KUSTOMIZE / "namespace.yaml").read_text())
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    base = yaml.safe_load((KUSTOMIZE / "kustomization.yaml").read_text())
    assert "namespace.yaml" in base["resources"]
    assert base["namespace"] == namespace["metadata"]["name"]


@pytest.mark.slow
def test_host_libdrm_component_mounts_the_table_beside_the_host_sysfs(tmp_path: Path) -> None:
    import kubernetes_validate

    from exporter.sources.amd.ids import lookup_paths

    docs = with_components(tmp_path, [KUSTOMIZE / "components" / "host-libdrm"])
    ds = by_kind(docs, "DaemonSet")
    kubernetes_validate.validate(ds, K8S_VERSIONS[-1], strict=True)
    c = container(ds)
    mount = next(m for m in c["volumeMounts"] if m["name"] == "host-libdrm")
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "host-libdrm")
    assert mount["readOnly"] is True and volume["hostPath"]["path"] == "/usr/share/libdrm"
    sysfs = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--path.sysfs="))
    # The exporter's first table is the mounted host's, its second the image's own.
    tables, _ = lookup_paths(sysfs, None)
    assert [str(t) for t in tables] == [mount["mountPath"] + "/amdgpu.ids",
                                        "/usr/share/libdrm/amdgpu.ids"]
