"""Metric selection: --collector.metrics.include/exclude and --dcgm.counters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.config import Config, MetricNames
from exporter.output.dcgm import FIELDS, HEALTH_FAMILY, parse_counters
from exporter.output.render import Renderer, RenderOptions
from exporter.output.render.selection import Selection, load_selection
from exporter.pipeline.hub import Hub
from tests.daemon import FIXTURES, REPO, machine_args, running
from tests.test_collector import Scripted
from tests.test_server import run_cli

MIXED = FIXTURES / "mixed"
COUNTERS = FIXTURES / "dcgm" / "counters.csv"


def served(selection: Selection) -> tuple[set[str], int]:
    """(family names as served, body size) of one render of a scripted two-GPU snapshot."""
    snapshot = Hub(Config(), [Scripted("amd", ["0000:03:00.0", "0000:04:00.0"])]).collect_once()
    renderer = Renderer(options=RenderOptions(selection=selection))
    renderer.render_now(snapshot)
    body, _ = renderer.body("text")
    names = {s.name for f in text_string_to_metric_families(body.decode()) for s in f.samples
             if not s.name.endswith(("_bucket", "_count", "_sum", "_created"))}
    return names, len(body)


def test_exclude_drops_whole_families_and_their_bytes() -> None:
    everything, size = served(Selection())
    assert {"gpu_power_watts", "gpu_up", "process_cpu_seconds_total", "python_info",
            "gpu_exporter_up"} <= everything
    names, smaller = served(Selection(exclude="python_.*|process_.*|gpu_exporter_.*"))
    assert names == {n for n in everything
                     if not n.startswith(("python_", "process_", "gpu_exporter_"))}
    assert "gpu_power_watts" in names and smaller < size


def test_include_is_fully_anchored_and_counters_match_with_total() -> None:
    names, _ = served(Selection(include="gpu_power"))  # a prefix is not a match
    assert names == set()
    names, _ = served(Selection(include="gpu_(power_watts|up)|process_cpu_seconds_total"))
    assert names == {"gpu_power_watts", "gpu_up", "process_cpu_seconds_total"}
    names, _ = served(Selection(include="gpu_.*", exclude="gpu_exporter_.*|gpu_info"))
    assert "gpu_power_watts" in names and "gpu_info" not in names
    assert not any(n.startswith("gpu_exporter_") for n in names)


def test_counters_csv_parse() -> None:
    counters = parse_counters(COUNTERS.read_text())
    assert counters.fields == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                               "DCGM_FI_DEV_DEC_UTIL"}
    assert counters.unknown == ("DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                                "DCGM_FI_DEV_PCIE_TX_THROUGHPUT")
    assert counters.malformed == 1
    everything = parse_counters("\n".join(f"{f.name}, gauge, x" for f in FIELDS))
    assert everything.fields == {f.name for f in FIELDS} and not everything.unknown
    assert parse_counters("\x00\xff,,\n#\n,gauge\n") == parse_counters("").__class__(
        frozenset(), (), 2)


@pytest.mark.slow
def test_dcgm_counters_serve_only_the_fields_named(tmp_path: Path) -> None:
    args = [*machine_args(MIXED), "--metric-names", "dcgm"]
    env = {"NODE_NAME": "node-a"}
    with running(args, tmp_path, nvml_json=MIXED / "nvml.json", env=env) as d:
        full = {f.name for f in text_string_to_metric_families(d.get().text)}
    with running([*args, "--dcgm.counters", str(COUNTERS), "--collector.metrics.exclude",
                  "gpu_process_memory_used_bytes"], tmp_path,
                 nvml_json=MIXED / "nvml.json", env=env) as d:
        body = d.get().text
        reports = d.records("dcgm counters: fields not served")
    names = {f.name for f in text_string_to_metric_families(body)}
    assert {"DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP"} <= full
    dcgm = {n for n in names if n.startswith("DCGM_")}
    assert dcgm == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_DEC_UTIL"}
    # our own per-process families stay, less the one excluded by name
    assert "gpu_process_memory_used_bytes" in full and \
        "gpu_process_memory_used_bytes" not in names
    assert any(n.startswith("gpu_process_") for n in names)
    assert len(reports) == 1
    assert reports[0]["unknown"] == ["DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                                     "DCGM_FI_DEV_PCIE_TX_THROUGHPUT"]
    assert reports[0]["malformed_lines"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(("args", "needle"), [
    (["--dcgm.counters", str(COUNTERS)], "--dcgm.counters needs --metric-names dcgm, dcgm4.9"),
    (["--metric-names", "dcgm", "--dcgm.counters", "/nonexistent/counters.csv"],
     "--dcgm.counters: /nonexistent/counters.csv: No such file or directory"),
    (["--collector.metrics.include", "gpu_("], "--collector.metrics.include: not a regular"),
])
def test_a_bad_selection_exits_2_in_one_line(tmp_path: Path, args: list[str],
                                             needle: str) -> None:
    result = run_cli(*machine_args(MIXED), *args)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -- which DCGM fields each vendor fills (docs/dcgm-compat.md "Fields per vendor") --------
VENDORS = ("nvidia", "amd", "intel")  # the Apple machine runs as on a Mac: not here
VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}
DOC = REPO / "docs" / "dcgm-compat.md"


def dcgm_coverage(tmp: Path) -> dict[str, set[str]]:
    """DCGM family -> vendors whose fixture machines fill it, with every machine's daemon
    run in ``--metric-names both`` (the vendor from ``gpu_info`` of the same ``gpu``)."""
    from tests.test_golden import MACHINES, ONE_CYCLE, _all_running

    coverage: dict[str, set[str]] = {}
    with _all_running(tmp, MACHINES, [*ONE_CYCLE, "--metric-names", "both"]) as daemons:
        for daemon in daemons.values():
            families = list(text_string_to_metric_families(daemon.get().text))
            vendor = {s.labels["gpu"]: s.labels["vendor"] for f in families
                      if f.name == "gpu_info" for s in f.samples}
            for f in families:
                if f.name.startswith("DCGM_"):
                    for s in f.samples:
                        coverage.setdefault(f.name, set()).add(vendor[s.labels["gpu"]])
    return coverage


def coverage_table(coverage: dict[str, set[str]]) -> str:
    rows = ["| field | " + " | ".join(VENDOR_NAMES[v] for v in VENDORS) + " |",
            "|---|" + "---|" * len(VENDORS)]
    for name in (*(f.name for f in FIELDS), HEALTH_FAMILY):
        have = coverage.get(name, set())
        rows.append(f"| {name} | " + " | ".join("yes" if v in have else "–"
                                                  for v in VENDORS) + " |")
    return "\n".join(rows) + "\n"


@pytest.mark.slow  # every fixture machine collected
def test_the_per_vendor_field_table_matches_the_fixtures(tmp_path: Path) -> None:
    table = coverage_table(dcgm_coverage(tmp_path))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        print(table)
    assert table in DOC.read_text(), f"docs/dcgm-compat.md: the per-vendor table is now\n{table}"


@pytest.mark.parametrize(("include", "exclude", "hidden"), [
    (None, None, []),
    ("gpu_.*", None, []),  # gpu_exporter_* is gpu_.* too
    ("gpu_utilization_ratio|gpu_memory_.*", None,
     ["gpu_exporter_up", "gpu_exporter_backend_up", "gpu_exporter_backend_down_reason",
      "gpu_exporter_collection_errors_total",
      "gpu_exporter_last_collection_timestamp_seconds",
      "gpu_exporter_config_last_reload_successful"]),
    (None, "gpu_exporter_.*_total", ["gpu_exporter_collection_errors_total"]),
])
def test_a_selection_that_hides_the_exporters_own_series_is_warned_about(
        include: str | None, exclude: str | None, hidden: list[str]) -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        load_selection(include, exclude, MetricNames.GPU, None)
    warned = [e for e in logs if e["event"] == "metric selection hides the exporter's own series"]
    assert [e["hidden"] for e in warned] == ([hidden] if hidden else [])


def test_the_watched_families_are_those_the_shipped_rules_use() -> None:
    """Every gpu_exporter_* family an expression of deploy/prometheus uses is watched."""
    import re

    from exporter.output.render.selfmetrics import WATCHED

    rules = (Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
             / "gpu-exporter.rules.yml").read_text()
    used = set(re.findall(r"\b(gpu_exporter_[a-z_]+)", rules))
    assert used and used <= {spec.name for spec in WATCHED}
