"""docs/deploy.md and the deployment files say only what exists: every exporter flag they
pass is one `gpu-exporter --help` lists, every chart value they set is accepted by the
chart's schema and does what the text says, and the overlay example renders."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_helm import CHART, by_kind, container, pod_spec, render
from test_deploy_kubernetes import KUSTOMIZE, kustomize, needs_kubectl
from test_deploy_rules import RULES
from test_deploy_systemd import cli_flags

from tests.daemon import EMPTY_PROC, daemon_env, running

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "deploy.md"
DEPLOY_FILES = [DOC, ROOT / "Dockerfile", *sorted((ROOT / "systemd").iterdir()),
                *sorted((CHART / "templates").iterdir()), CHART / "values.yaml",
                *sorted(KUSTOMIZE.rglob("*.yaml"))]
# Flags of the other programs the docs run (docker, podman, helm, kubectl, systemctl) or
# name (the kubelet's --root-dir).
TOOL_FLAGS = {"name", "restart", "gpus", "pid", "cap-add", "user", "build-arg", "format",
              "set", "set-string", "create-namespace", "field-selector", "isolation", "now",
              "destination", "app-version", "outdir",  # helm package, python -m build
              "root-dir"}


def flags_in(text: str) -> set[str]:
    """--flags of a text; a pattern such as --collector.<name> is not a flag."""
    return set(re.findall(r"(?<![\w-])--([a-z][a-z0-9.-]*[a-z0-9])(?![a-z0-9<-]|\.[\w<])", text))


def exporter_text(path: Path) -> str:
    """The part of a file that speaks about the exporter's flags: in the Dockerfile its
    comments (the docker run examples), not the useradd and HEALTHCHECK options."""
    text = path.read_text()
    if path.name == "Dockerfile":
        return "\n".join(line for line in text.splitlines() if line.startswith("#"))
    return text


@pytest.mark.slow
def test_deployment_files_pass_only_flags_the_exporter_has() -> None:
    known = cli_flags() | cli_flags("top") | TOOL_FLAGS
    for path in DEPLOY_FILES:
        for flag in flags_in(exporter_text(path)):
            assert flag in known or flag.removeprefix("no-") in known, (
                f"{path.relative_to(ROOT)}: --{flag} is not a gpu-exporter flag")


@pytest.mark.slow
def test_the_snapshot_command_the_docs_give_asks_the_running_daemon(tmp_path: Path) -> None:
    """`gpu-exporter snapshot --from http://127.0.0.1:9445`, as NOTES.txt, the alert texts
    and this doc write it, against a real daemon (on another port here)."""
    commands = set(re.findall(r"gpu-exporter\s+snapshot\s+--from\s+(https?://[\w.:]+)",
                              DOC.read_text() + RULES.read_text(), re.M))
    assert commands == {"http://127.0.0.1:9445"}
    empty = tmp_path / "sys"
    empty.mkdir()
    with running(["--path.sysfs", str(empty), "--path.procfs", str(EMPTY_PROC)], tmp_path) as d:
        out = subprocess.run([sys.executable, "-m", "exporter.app.cli", "snapshot", "--from",
                              d.base_url], cwd=ROOT, env=daemon_env(None),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        served = d.get("/snapshot").json()
    backends = {b["backend"]: b["up"] for b in json.loads(out.stdout)["backends"]}
    assert backends == {b["backend"]: b["up"] for b in served["backends"]}
    assert backends["nvidia"] is False


def helm_commands(text: str) -> list[list[str]]:
    commands = []
    for m in re.finditer(r"^\s*(helm install .*?)(?<!\\)$", text, re.M | re.S):
        commands.append(shlex.split(m.group(1).replace("\\\n", " ")))
    return commands


def set_values(argv: list[str]) -> dict[str, Any]:
    """Helm's --set / --set-string for the plain forms the docs use (a.b=v, escaped dots)."""
    values: dict[str, Any] = {}
    for flag, arg in zip(argv, argv[1:], strict=False):
        if flag not in ("--set", "--set-string"):
            continue
        key, _, raw = arg.partition("=")
        path = [p.replace("\\.", ".") for p in re.split(r"(?<!\\)\.", key)]
        value: Any = raw
        if flag == "--set" and raw in ("true", "false"):
            value = raw == "true"
        node = values
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return values


def test_quickstart_helm_install_renders_what_the_doc_says() -> None:
    (argv,) = [c for c in helm_commands(DOC.read_text()) if not c[3].startswith("oci://")]
    assert argv[:4] == ["helm", "install", "gpu-exporter", "./helm/gpu-exporter"]
    assert "--create-namespace" not in argv  # it would make an unlabelled namespace
    values = set_values(argv)
    docs = render(values)  # the chart's schema accepts every --set
    c = container(by_kind(docs, "DaemonSet"))
    assert c["image"] == "registry.example.com/gpu-exporter:0.1.0"
    assert pod_spec(docs)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert by_kind(docs, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_values_table_names_real_values() -> None:
    with (CHART / "values.yaml").open() as f:
        values = yaml.safe_load(f)
    table = DOC.read_text().split("### What the chart deploys", 1)[1].split("###", 1)[0]
    for cell in re.findall(r"^\| (.+?) \|", table, re.M)[2:]:
        for name in re.findall(r"`([a-zA-Z][\w.]*)`", cell):
            node: Any = values
            for part in name.split("."):
                if part == "<AlertName>":
                    break
                assert isinstance(node, dict) and part in node, f"docs names {name}"
                node = node[part]


@pytest.mark.slow
@needs_kubectl
def test_the_overlay_example_renders(tmp_path: Path) -> None:
    text = DOC.read_text()
    example = re.search(r"```yaml\n(# my-overlay/kustomization.yaml.*?)```", text, re.S)
    assert example
    overlay = tmp_path / "my-overlay"
    overlay.mkdir()
    up = Path(*[".."] * len(overlay.parts[1:]))
    body = example.group(1).replace("<path>/deploy", str(up / ROOT.relative_to("/") / "deploy"))
    (overlay / "kustomization.yaml").write_text(body)
    docs = kustomize(overlay)
    c = container(by_kind(docs, "DaemonSet"))
    assert c["image"] == "registry.example.com/gpu-exporter:0.1.0"
    assert by_kind(docs, "ServiceMonitor")["metadata"]["labels"]["release"] == (
        "kube-prometheus-stack")
    assert by_kind(docs, "Namespace")["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_license_file_is_the_license_the_metadata_declares() -> None:
    import tomllib

    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()
