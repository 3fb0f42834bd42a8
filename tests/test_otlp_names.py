"""The catalogue's Prometheus -> OTLP mapping: complete, documented, applied as documented."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import socket
import subprocess
import sys
from typing import Any

import pytest
from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from exporter.core.fieldspec import GAUGE, SUM, UPDOWN
from exporter.output.catalogue import FAMILIES, LABELS, attribute_name
from tests.daemon import REPO
from tools.metricsdoc import generate as metrics_doc


def need(module: str) -> Any:
    """Skip without the otlp extra and opentelemetry-proto, except under CI, whose .ci/run
    installs both: there a missing one is a failure, not a silent skip."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def test_every_family_in_docs_metrics_md_has_an_otlp_name_and_no_other() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9_]+)`", metrics_doc(), re.M))
    assert documented, "docs/metrics.md lists no family"
    assert documented - set(FAMILIES) == set(), "give their MetricSpec an Otlp"
    assert set(FAMILIES) - documented == set(), "mapped, but no longer a family"


def test_names_are_unique_and_units_are_ucum() -> None:
    names = [t.name for t in FAMILIES.values()]
    assert len(names) == len(set(names))
    # UCUM units, or an annotation in braces as the conventions write counts ({error})
    assert all(re.fullmatch(r"By|By/s|W|J|V|Cel|1|Hz|s|\{[a-z]+\}", t.unit)
               for t in FAMILIES.values()), {t.unit for t in FAMILIES.values()}


def test_labels_map_to_the_semantic_conventions_attributes() -> None:
    assert attribute_name("gpu_utilization_ratio", "uuid") == "hw.id"
    assert attribute_name("gpu_temperature_celsius", "sensor") == "hw.sensor_location"
    assert attribute_name("gpu_clock_hertz", "clock") == "gpu.clock"
    assert attribute_name("gpu_exporter_backend_up", "backend") == "gpu_exporter.backend"
    assert LABELS["pod"] == "k8s.pod.name" and LABELS["namespace"] == "k8s.namespace.name"


def test_process_series_with_pod_labels_carry_the_k8s_attributes() -> None:
    need("opentelemetry.sdk")
    from exporter.output.otlp import to_otlp

    family = Metric("gpu_process_engine_busy_seconds", "Engine time.", "counter")
    labels = {"gpu": "0", "uuid": "GPU-1", "vendor": "nvidia", "source": "nvml",
              "pid": "42", "process": "python", "engine": "compute", "pod": "train-0",
              "namespace": "ml", "container": "trainer"}
    family.samples.append(Sample("gpu_process_engine_busy_seconds_total", labels, 12.5))
    host = dict(labels, pid="43", pod="", namespace="", container="")
    family.samples.append(Sample("gpu_process_engine_busy_seconds_total", host, 1.0))
    (metric,) = to_otlp([family], start=1, now=2)
    assert metric.name == "gpu.process.engine.busy_time" and metric.unit == "s"
    assert metric.data.is_monotonic
    pod, host_point = metric.data.data_points
    assert pod.attributes == {
        "gpu.index": "0", "hw.id": "GPU-1", "hw.vendor": "nvidia", "gpu.source": "nvml",
        "process.pid": 42, "process.executable.name": "python", "gpu.engine": "compute",
        "k8s.pod.name": "train-0", "k8s.namespace.name": "ml",
        "k8s.container.name": "trainer", "hw.type": "gpu"}
    assert pod.value == 12.5 and pod.start_time_unix_nano == 1 and pod.time_unix_nano == 2
    # A host process: empty pod labels are absent attributes, as in Prometheus.
    assert not any(k.startswith("k8s.") for k in host_point.attributes)


def test_histogram_buckets_become_per_bucket_counts() -> None:
    need("opentelemetry.sdk")
    from prometheus_client.core import HistogramMetricFamily

    from exporter.output.otlp import to_otlp

    family = HistogramMetricFamily("gpu_exporter_collection_duration_seconds", "Time.",
                                   labels=["backend"])
    family.add_metric(["nvml"], [("0.01", 2), ("0.1", 5), ("+Inf", 6)], 0.4)
    (metric,) = to_otlp([family], start=1, now=2)
    (point,) = metric.data.data_points
    assert metric.name == "gpu_exporter.collection.duration" and metric.unit == "s"
    assert list(point.explicit_bounds) == [0.01, 0.1]
    assert list(point.bucket_counts) == [2, 3, 1]
    assert point.count == 6 and point.sum == 0.4
    assert point.attributes == {"gpu_exporter.backend": "nvml"}


def test_resource_attributes_and_the_standard_variables_over_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    need("opentelemetry.sdk")
    from exporter.output.otlp import metrics_endpoint, resource

    plain = resource({"NODE_NAME": "node-3"}).attributes
    assert plain["service.name"] == "gpu-exporter" and plain["k8s.node.name"] == "node-3"
    assert "k8s.node.name" not in resource({}).attributes
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gpu-telemetry")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=edge-1")
    overridden = resource({}).attributes
    assert overridden["service.name"] == "gpu-telemetry"
    assert overridden["host.name"] == "edge-1"
    assert metrics_endpoint("http://c:4318") == "http://c:4318/v1/metrics"
    assert metrics_endpoint("http://c:4318/") == "http://c:4318/v1/metrics"
    assert metrics_endpoint("https://c/otlp/v1/metrics") == "https://c/otlp/v1/metrics"


# Prometheus's OTLP translation with suffixes (UnderscoreEscapingWithSuffixes, the OTLP
# receiver's default): prometheus/otlptranslator metric_namer.go, normalizeName and
# buildUnitSuffixes. Modelled for what a name ends with: tokens of [a-zA-Z0-9:], the
# unit's suffix unless the unit holds braces (an annotation) or is "1", _total for a
# monotonic sum, _ratio for a gauge of unit "1".
PROM_UNITS = {"s": "seconds", "By": "bytes", "V": "volts", "J": "joules", "W": "watts",
              "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent"}
PROM_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}


def prometheus_name(name: str, unit: str, kind: str) -> str:
    tokens = [t for t in re.split(r"[^a-zA-Z0-9:]", name) if t]
    main, _, per = (u.strip() for u in unit.partition("/"))
    main = "" if not main or set(main) & {"{", "}"} else PROM_UNITS.get(main, main)
    per = "" if not per or set(per) & {"{", "}"} else PROM_PER_UNITS.get(per, per)
    if main and main not in tokens:
        tokens.append(main)
    if per and per not in tokens:
        tokens += ["per", per]
    if kind == SUM:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)


def test_prometheus_otlp_translation_adds_ratio_to_ratios_only() -> None:
    """Gauges of unit "1" that are no ratio (gpu_info, gpu_performance_state,
    gpu_pcie_link_generation, gpu_exporter_up, ...) became gpu_info_ratio and the like in
    Prometheus: a state, flag, info series or number has an annotation unit."""
    assert prometheus_name("hw.gpu.utilization", "1", GAUGE) == "hw_gpu_utilization_ratio"
    assert prometheus_name("gpu.fan.speed_ratio", "1", GAUGE) == "gpu_fan_speed_ratio"
    assert prometheus_name("gpu.energy", "J", SUM) == "gpu_energy_joules_total"
    assert prometheus_name("gpu.info", "{info}", GAUGE) == "gpu_info"
    translated = {family: prometheus_name(t.name, t.unit, t.kind)
                  for family, t in FAMILIES.items()}
    wrong = {family: name for family, name in translated.items()
             if name.endswith("_ratio") != family.endswith("_ratio")}
    assert wrong == {}
    assert translated["gpu_performance_state"] == "gpu_performance_state"
    assert translated["gpu_exporter_up"] == "gpu_exporter_up"


def _instance_id(env: dict[str, str]) -> str:
    """service.instance.id as a fresh process (a restart) computes it."""
    code = ("from exporter.output.otlp import resource; import os; "
            "print(resource(os.environ).attributes['service.instance.id'])")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    done = subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.slow
def test_the_service_instance_id_survives_a_restart() -> None:
    """The SDK's service.instance.id was a random UUID per process; Prometheus's OTLP
    receiver makes it the instance label, so every restart began new series."""
    need("opentelemetry.sdk")
    assert _instance_id({}) == _instance_id({}) == socket.gethostname()
    assert _instance_id({"NODE_NAME": "gpu-node-7"}) == "gpu-node-7"
    assert _instance_id({"NODE_NAME": "gpu-node-7",
                         "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=rack3-gpu7"}) == \
        "rack3-gpu7"


# -- docs/otlp.md's comparison with the conventions ---------------------------------------

def conventions() -> dict[str, tuple[str, str]]:
    """The hardware metrics of the installed opentelemetry-semantic-conventions package:
    name -> (kind, unit), read from each one's create_* function."""
    hw = pytest.importorskip("opentelemetry.semconv._incubating.metrics.hw_metrics")
    kinds = {"counter": SUM, "up_down_counter": UPDOWN, "gauge": GAUGE,
             "observable_gauge": GAUGE, "observable_counter": SUM,
             "observable_up_down_counter": UPDOWN}
    out = {}
    for attr in dir(hw):
        if attr.startswith("create_hw_"):
            source = inspect.getsource(getattr(hw, attr))
            name = getattr(hw, attr.removeprefix("create_").upper())
            kind = re.search(r"meter\.create_([a-z_]+)\(", source).group(1)  # type: ignore[union-attr]
            unit = re.search(r'unit="([^"]*)"', source).group(1)  # type: ignore[union-attr]
            out[name] = (kinds[kind], unit)
    return out


def comparison_rows() -> dict[str, list[str]]:
    doc = (REPO / "docs" / "otlp.md").read_text()
    section = doc.split("### Compared with the semantic conventions", 1)[1].split("\n### ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `hw."):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[re.match(r"`([a-z._]+)`", cells[0]).group(1)] = cells  # type: ignore[union-attr]
    return rows


def test_the_comparison_lists_each_gpu_convention_and_every_hw_name_we_send() -> None:
    known = conventions()
    rows = comparison_rows()
    assert set(rows) <= set(known), set(rows) - set(known)  # names as the conventions spell them
    gpu = {n for n in known if n.startswith("hw.gpu.")} | {
        "hw.errors", "hw.power", "hw.energy", "hw.status"}  # docs/hardware/gpu.md, common.md
    assert gpu <= set(rows), gpu - set(rows)
    sent = {t.name for t in FAMILIES.values() if t.name.startswith("hw.")}
    assert sent <= set(rows)


def test_each_convention_without_a_difference_is_what_we_send() -> None:
    known = conventions()
    for name, cells in comparison_rows().items():
        ours = {f: t for f, t in FAMILIES.items() if t.name == name}
        if cells[3].startswith("none"):
            family = re.findall(r"`(gpu_[a-z_]+)`", cells[2])[0]
            assert family in ours, (name, family)
            assert (ours[family].kind, ours[family].unit) == known[name], name
        elif "not sent" in cells[2]:
            assert ours == {}, name


def test_attribute_names_are_the_conventions() -> None:
    hw = pytest.importorskip("opentelemetry.semconv._incubating.attributes.hw_attributes")
    spelled = {getattr(hw, a) for a in dir(hw) if a.startswith("HW_")}
    ours = {v for v in LABELS.values() if v.startswith("hw.")} | {"hw.type"}
    assert ours <= spelled, ours - spelled
    assert LABELS["name"] == hw.HW_MODEL
