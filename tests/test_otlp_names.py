"""The catalogue's Prometheus -> OTLP mapping: complete, documented, applied as documented."""

from __future__ import annotations

import importlib
import os
import re
from typing import Any

import pytest
from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from exporter.output.catalogue import FAMILIES, LABELS, attribute_name
from exporter.output.metricsdoc import generate as metrics_doc


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
