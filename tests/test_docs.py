"""Nothing is advertised that is not produced (issue 14): every flag the README, the docs
and the deployment files name is one the CLI accepts, and every metric family
docs/metrics.md documents is produced by some backend on some fixture machine (a golden
output holds it), as every family a golden holds is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_docs import TOOL_FLAGS, exporter_text, flags_in
from test_deploy_systemd import cli_flags

from tools.metricsdoc import generate

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "deploy").rglob("*.plist")),
        *sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))]
# Flags of other programs the docs show (pip, pytest, nvidia-smi, apt, kubectl, helm, ...).
OTHER_TOOLS = TOOL_FLAGS | {"no-deps", "only-binary", "platform", "dry-run", "target",
                            "soc-info", "samples", "interval", "no-install-recommends",
                            "without-pip", "system-site-packages", "python-version",
                            "namespace", "values", "version", "help", "window", "warmup",
                            "scrape-every", "real", "gpus", "processes", "cmd", "rounds",
                            "batch", "cycle", "stub", "nvlinks", "procs", "probe",
                            "nvidia-only", "one-process", "grpc_python_out", "python_out",
                            "pyi_out", "proto_path", "kubernetes-virtual-gpus", "init",
                            "privileged", "device", "group-add", "all", "from-file",
                            "query-gpu", "format", "report", "quiet", "kubelet-arg",
                            # device plugins (docs/kubernetes.md), nvitop-exporter
                            "device-id-strategy", "shared-dev-num", "bind-address", "port",
                            # bench scripts (docs/performance.md)
                            "costs", "machines", "duration", "nvml", "repeat", "links",
                            "calls-json", "daemon", "json", "latency", "repo", "unread",
                            "ab", "skip-before", "seconds", "top"}


def golden_families() -> set[str]:
    out = set()
    for golden in (ROOT / "tests" / "golden").rglob("*.prom"):
        for family in text_string_to_metric_families(golden.read_text()):
            for sample in family.samples:
                out.add(re.sub(r"_(bucket|count|sum)$", "", sample.name))
    return out


def bench_flags() -> set[str]:
    """The flags of the bench scripts (docs/performance.md quotes their commands)."""
    return {flag for path in sorted((ROOT / "bench").glob("*.py"))
            for flag in re.findall(r'add_argument\(\s*"--([a-z0-9-]+)"', path.read_text())}


@pytest.mark.slow
def test_every_flag_the_docs_name_is_a_flag_the_cli_accepts() -> None:
    known = cli_flags() | cli_flags("top") | OTHER_TOOLS | bench_flags()
    unknown = []
    for path in DOCS:
        for flag in flags_in(exporter_text(path)):
            if flag not in known and flag.removeprefix("no-") not in known:
                unknown.append(f"{path.relative_to(ROOT)}: --{flag}")
    assert unknown == []


@pytest.mark.slow
def test_the_checks_can_fail() -> None:
    assert "collector.nvidai" not in cli_flags() | OTHER_TOOLS
    assert flags_in("run gpu-exporter --collector.nvidai now") == {"collector.nvidai"}


def test_every_documented_family_is_produced_on_some_fixture() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9_]+)`", generate(), re.M))
    produced = golden_families()  # families only flags bring: tests/golden/flags.prom
    assert documented - produced == set(), "documented, but no golden output produces it"


def test_every_produced_family_is_documented() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9_]+)`", generate(), re.M))
    ours = {f for f in golden_families() if f.startswith("gpu_")}
    assert ours - documented == set()
