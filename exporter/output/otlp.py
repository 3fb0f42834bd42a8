"""OTLP push: the latest snapshot's metric families, sent over OTLP/HTTP on a thread of its own.

Imported only when ``--otlp.endpoint`` is set (it imports the OpenTelemetry SDK, the
``otlp`` extra). The push thread never calls a driver: every interval it takes the
Hub's latest Snapshot and projects its merged view through the catalogue: the walk that
builds ``/metrics`` (render.families.walk) puts each series straight into an OTLP point of
its spec's metric (exporter.output.catalogue.target); the join series and the exporter's own,
built as families, are converted with the names, units and types they declare. The
SDK's OTLPMetricExporter sends them: it retries 429, 502, 503 and 504 with exponential
back-off, honouring Retry-After, within ``--otlp.timeout`` (the OTLP/HTTP spec's retry
rules), and reads the standard ``OTEL_EXPORTER_OTLP_*``
variables for whatever the flags leave unset.

At most one export is in flight and nothing queues behind it: a tick that comes while
an export still runs (a slow or retrying receiver) is dropped and counted, so memory
stays bounded and collection and ``/metrics`` never wait for the receiver. Outcomes are
counted (``gpu_exporter_otlp_exports_total{result="sent|failed|dropped"}``); the last
error shows in ``/snapshot`` and the landing page, and is logged once per change.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import structlog
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.core import Metric as PromMetric

from exporter import __version__
from exporter.core.config import Config, MetricNames
from exporter.core.fieldspec import MetricSpec
from exporter.output.catalogue import (
    FAMILIES,
    GAUGE,
    HISTOGRAM,
    INT_ATTRIBUTES,
    SCHEMA_URL,
    SUM,
    Target,
    attribute_name,
    target,
)
from exporter.output.otlp_http import PushSession
from exporter.output.render import RenderOptions
from exporter.output.render.families import in_order, walk
from exporter.output.render.joins import join_families
from exporter.output.render.selection import Selection
from exporter.output.render.selfmetrics import exporter_families
from exporter.pipeline import health
from exporter.pipeline.hub import Hub
from exporter.pipeline.state import Snapshot

log = structlog.get_logger(__name__)
CUMULATIVE = AggregationTemporality.CUMULATIVE
RESULTS = ("sent", "failed", "dropped")
# A Prometheus histogram has no min and max; None leaves the optional proto fields unset.
UNKNOWN_MIN_MAX: dict[str, Any] = {"min": None, "max": None}


def metrics_endpoint(url: str) -> str:
    """A base URL (no path) gets the OTLP/HTTP metrics path, as OTEL_EXPORTER_OTLP_ENDPOINT
    does; a URL with a path is used as it is, as OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is."""
    return url.rstrip("/") + "/v1/metrics" if urlsplit(url).path in ("", "/") else url


def resource(environ: Mapping[str, str]) -> Resource:
    """host.name, service.name/version, k8s.node.name (the downward API's NODE_NAME) and
    service.instance.id: the node name, else the host name, so that it stays the same
    across restarts (the SDK's own is a random UUID per process, and Prometheus's OTLP
    receiver makes service.instance.id the ``instance`` label: every restart began new
    series). OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME override them, as in any SDK."""
    host = socket.gethostname()
    ours: dict[str, str] = {"host.name": host, "service.name": "gpu-exporter",
                            "service.version": __version__,
                            "service.instance.id": environ.get("NODE_NAME") or host}
    if environ.get("NODE_NAME"):
        ours["k8s.node.name"] = environ["NODE_NAME"]
    return Resource.create(ours, schema_url=SCHEMA_URL).merge(OTELResourceDetector().detect())


# -- families -> OTLP metrics ----------------------------------------------------------------

def _target(family: PromMetric) -> Target:
    key = family.name + "_total" if family.type == "counter" else family.name
    found = FAMILIES.get(key)
    if found is not None:
        return found
    # Not in the catalogue (tests/test_otlp_names.py keeps it complete): keep the Prometheus name.
    kind = {"counter": SUM, "histogram": HISTOGRAM}.get(family.type, GAUGE)
    return Target(key, "", kind)


def _attributes(key: str, target: Target, labels: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, value in labels.items():
        if value == "":  # an empty Prometheus label is an absent one
            continue
        name = attribute_name(key, label)
        out[name] = int(value) if name in INT_ATTRIBUTES and value.isdigit() else value
    if "uuid" in labels:
        out["hw.type"] = "gpu"
    out.update(target.constant)
    return out


def _point(key: str, target: Target, labels: Mapping[str, str], value: float, start: int,
           now: int) -> tuple[str, NumberDataPoint]:
    """One series' point, and the metric it goes to: the target's own, or the one its
    route sends that label value to (the value as the route's attribute)."""
    route = target.route
    if route is not None and labels.get(route.label) in route.values:
        rest = {k: v for k, v in labels.items() if k != route.label}
        attributes = {**_attributes(key, target, rest), route.attribute: labels[route.label]}
        return route.name, NumberDataPoint(attributes, start, now, float(value))
    return target.name, NumberDataPoint(_attributes(key, target, labels), start, now,
                                        float(value))


def _data(t: Target, points: list[NumberDataPoint]) -> Gauge | Sum:
    return Gauge(points) if t.kind == GAUGE else \
        Sum(points, CUMULATIVE, is_monotonic=t.kind == SUM)


def _histogram_points(key: str, target: Target, family: PromMetric, start: int, now: int
                      ) -> list[HistogramDataPoint]:
    """Prometheus' cumulative ``le`` buckets -> OTLP's per-bucket counts and bounds."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in family.samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        entry = series.setdefault(tuple(sorted(labels.items())), {"buckets": []})
        if s.name.endswith("_bucket"):
            entry["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            entry["sum"] = s.value
        elif s.name.endswith("_count"):
            entry["count"] = s.value
    points = []
    for labels_key, entry in series.items():
        buckets = sorted(entry["buckets"])
        counts, previous = [], 0.0
        for _, cumulative in buckets:
            counts.append(int(cumulative - previous))
            previous = cumulative
        points.append(HistogramDataPoint(
            attributes=_attributes(key, target, dict(labels_key)), start_time_unix_nano=start,
            time_unix_nano=now, count=int(entry.get("count", previous)),
            sum=entry.get("sum", 0.0), bucket_counts=counts,
            explicit_bounds=[b for b, _ in buckets if b != float("inf")],
            **UNKNOWN_MIN_MAX))
    return points


class _Points:
    """A sink of the merged view's walk (render.families.walk): each series becomes an OTLP
    point of its spec's catalogue metric (exporter.output.catalogue.target), with no family
    built and no name looked up. Families the selection excludes get no points."""

    def __init__(self, selection: Selection, start: int, now: int) -> None:
        self.allows = selection.allows
        self.start, self.now = start, now
        self.by_name: dict[str, tuple[MetricSpec, str, Target, list[NumberDataPoint]]] = {}
        # OTLP metric -> the points other families route to it (Target.route)
        self.routed: dict[str, list[NumberDataPoint]] = {}

    def add(self, spec: MetricSpec, key: str, labels: dict[str, str], value: float) -> None:
        name = spec.family(key) if key else spec.name
        entry = self.by_name.get(name)
        if entry is None:
            if not self.allows(name):
                return
            entry = self.by_name[name] = (spec, key, target(spec, key), [])
        to, point = _point(name, entry[2], labels, value, self.start, self.now)
        (entry[3] if to == entry[2].name else self.routed.setdefault(to, [])).append(point)

    def metrics(self) -> list[Metric]:
        """One metric per family with points, in the order /metrics serves them; a routed
        point goes with the metric it is routed to (after the family's own, if any)."""
        out, routed = [], dict(self.routed)  # complete: metrics() follows every add()
        sources: dict[str, tuple[str, Target]] = {}
        for name in in_order(self.by_name):
            spec, key, t, points = self.by_name[name]
            points = points + routed.pop(t.name, [])
            if t.route is not None:
                sources.setdefault(t.route.name, (spec.help, t))
            if points:
                out.append(Metric(t.name, spec.per_key[key] if key else spec.help, t.unit,
                                  _data(t, points)))
        for metric, points in routed.items():  # its own family has no series, or is hidden
            help_text, t = sources[metric]
            out.append(Metric(metric, help_text, t.unit, _data(t, points)))
        return out


def project(snapshot: Snapshot, options: RenderOptions, start: int, now: int) -> list[Metric]:
    """The merged view's per-GPU, per-process and health series as OTLP metrics, from the
    typed snapshot through the catalogue (the same walk as /metrics)."""
    points = _Points(options.selection, start, now)
    walk(snapshot, options, points)
    for spec, labels, value in health.series(snapshot.health):
        points.add(spec, "", labels, value)
    return points.metrics()


def to_otlp(families: Iterable[PromMetric], start: int, now: int) -> list[Metric]:
    """prometheus-client families -> OTLP metrics, one per family, in the same order."""
    out: list[tuple[str, str, Target, Any]] = []  # name, help, target, data or points
    routed: dict[str, tuple[str, Target, list[NumberDataPoint]]] = {}
    for family in families:
        if not family.samples:  # as in the exposition: a family without series is absent
            continue
        target = _target(family)
        key = family.name + "_total" if family.type == "counter" else family.name
        if target.kind == HISTOGRAM:
            out.append((target.name, family.documentation, target, Histogram(
                _histogram_points(key, target, family, start, now), CUMULATIVE)))
            continue
        points: list[NumberDataPoint] = []
        for s in family.samples:
            if not s.name.endswith("_created"):
                to, point = _point(key, target, s.labels, s.value, start, now)
                if to == target.name:
                    points.append(point)
                else:
                    routed.setdefault(to, (family.documentation, target, []))[2].append(point)
        if points:
            out.append((target.name, family.documentation, target, points))
    metrics = []
    for name, doc, target, data in out:  # routed points after the metric's own
        if isinstance(data, list):
            data = _data(target, data + routed.pop(name, ("", target, []))[2])
        metrics.append(Metric(name, doc, target.unit, data))
    for name, (doc, target, points) in routed.items():
        metrics.append(Metric(name, doc, target.unit, _data(target, points)))
    return metrics


# -- the push thread -------------------------------------------------------------------------

class _LastError(logging.Handler):
    """The SDK logs each failed try; here the last message is kept instead of printed
    (a log line per push would flood the log while a receiver is down)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < 8:  # one push's retries, at most
            self.messages.append(record.getMessage())

    def take(self) -> str:
        """This push's error: the last message, and the first (the cause: the last one
        of a push that ran out of retries only says so)."""
        messages, self.messages = self.messages, []
        if len(messages) > 1 and messages[0] != messages[-1]:
            return f"{messages[-1]} (first: {messages[0]})"
        return messages[-1] if messages else ""


class Pusher:
    """The push thread: every ``--otlp.interval``, the Hub's latest snapshot to the receiver."""

    def __init__(self, config: Config, hub: Hub, options: RenderOptions,
                 environ: Mapping[str, str] | None = None) -> None:
        assert config.otlp_endpoint is not None
        self.hub = hub
        self.interval = config.otlp_interval
        self.endpoint = metrics_endpoint(config.otlp_endpoint)
        # Our own names in every --metric-names mode: the conventions map ours.
        self.options = replace(options, metric_names=MetricNames.GPU)
        self.resource = resource(os.environ if environ is None else environ)
        self.scope = InstrumentationScope("gpu-exporter", __version__, SCHEMA_URL)
        self.session = PushSession(ca_file=config.otlp_ca_file is not None)
        self.exporter = OTLPMetricExporter(
            endpoint=self.endpoint, certificate_file=config.otlp_ca_file,
            headers={name: value.reveal() for name, value in config.otlp_headers}
            if config.otlp_headers else None,
            timeout=config.otlp_timeout,
            session=self.session)
        # The SDK's timeout: the flag, else OTEL_EXPORTER_OTLP_(METRICS_)TIMEOUT, else 10 s.
        resolved = getattr(getattr(self.exporter, "_client", None), "_timeout", None)
        self.timeout = float(resolved) if isinstance(resolved, (int, float)) and resolved > 0 \
            else (config.otlp_timeout or 10.0)
        self._errors = _LastError()
        sdk_log = logging.getLogger("opentelemetry")
        sdk_log.addHandler(self._errors)
        sdk_log.propagate = False
        self.counts = dict.fromkeys(RESULTS, 0)
        self.last_error = ""
        self.last_success: float | None = None
        self.start_ns = time.time_ns()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="otlp-push", daemon=True)

    def status(self) -> dict[str, Any]:
        """For /snapshot, the landing page and the self-metrics."""
        return {"endpoint": self.endpoint, "interval_seconds": self.interval,
                "exports": dict(self.counts), "last_error": self.last_error,
                "last_success_timestamp": self.last_success}

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Ends the push in flight and the thread; only the first call does anything."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.session.abort()  # ends a request in flight at once
        self.exporter.shutdown()  # ends a retry back-off at once
        if self.thread.ident is not None:  # started
            self.thread.join(timeout)

    def build(self, snapshot: Snapshot) -> MetricsData:
        threads = {name: (t,) for name, t in snapshot.threads.items()}
        threads["otlp"] = (self.thread,)
        now = max(int(snapshot.created * 1e9), self.start_ns)
        selection = self.options.selection
        # The join series and the exporter's own are built as families (their labels
        # come from the backends and the threads); converted through the catalogue too.
        rest = [*selection.keep(join_families(snapshot)),
                *selection.keep(exporter_families(snapshot, threads, self.counts, None))]
        metrics = project(snapshot, self.options, self.start_ns, now) + \
            to_otlp(rest, self.start_ns, now)
        return MetricsData([ResourceMetrics(
            self.resource, [ScopeMetrics(self.scope, metrics, SCHEMA_URL)], SCHEMA_URL)])

    def push_once(self) -> bool:
        self._errors.take()
        try:
            data = self.build(self.hub.snapshot)
            # The whole export, retries included, within --otlp.timeout of wall-clock time
            # (the SDK's own timeout bounds each socket read, not a trickling receiver).
            self.session.deadline = time.monotonic() + self.timeout
            self.session.timeout = self.timeout
            result = self.exporter.export(data)
        except Exception as e:  # noqa: BLE001 - never kill the thread; counted and shown
            result = MetricExportResult.FAILURE
            self._errors.emit(logging.makeLogRecord({"msg": repr(e)}))
        ok = result is MetricExportResult.SUCCESS
        self.counts["sent" if ok else "failed"] += 1
        if ok:
            self.last_success = time.time()
            if self.last_error:
                log.info("otlp export recovered", endpoint=self.endpoint)
            self.last_error = ""
        else:
            error = self._errors.take() or "export failed"
            if not self.last_error:
                log.warning("otlp export failing", endpoint=self.endpoint, error=error,
                            hint="retried every --otlp.interval; counted in "
                            "gpu_exporter_otlp_exports_total{result=\"failed\"}")
            self.last_error = error
        return ok

    def _run(self) -> None:
        epoch = time.monotonic()
        tick = 1
        while not self._stop.wait(max(0.0, epoch + tick * self.interval - time.monotonic())):
            self.push_once()
            # Ticks that passed during the export are dropped, not queued: the next
            # push sends the newest snapshot, which holds every counter's latest value.
            now_tick = int((time.monotonic() - epoch) / self.interval)
            self.counts["dropped"] += max(0, now_tick - tick)
            tick = max(tick, now_tick) + 1

