"""The exporter's own families (``gpu_exporter_*``): declared once, served and documented.

``EXPORTER`` is the one declaration of each family's name, help, type and labels;
``exporter_families`` serves them from a Snapshot and docs/metrics.md is generated from
the same specs. Also here: the CPU time of the exporter's threads, per backend.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from exporter import __version__
from exporter.core.fieldspec import Kind, MetricSpec, Otlp
from exporter.core.labels import DownReason
from exporter.pipeline.state import DURATION_BUCKETS, Snapshot

BUILD = MetricSpec("gpu_exporter_build_info", "Build information; value 1.",
                   labels=("version", "python_version"),
                   otlp=Otlp("gpu_exporter.build.info", "{info}",
                             labels={"version": "gpu_exporter.version",
                                     "python_version": "gpu_exporter.python_version"}))
UP = MetricSpec("gpu_exporter_up", "1 once the first collection has completed.",
                otlp=Otlp("gpu_exporter.up", "{state}"))
BACKEND_UP = MetricSpec(
    "gpu_exporter_backend_up", "1 if the backend is open and answering.", labels=("backend",),
    note="Why it is off: `gpu_exporter_backend_down_reason`; the reason's words are logged "
    "once and shown by `gpu-exporter snapshot`.",
    otlp=Otlp("gpu_exporter.backend.up", "{state}"))
BACKEND_DOWN = MetricSpec(
    "gpu_exporter_backend_down_reason",
    "1 for the reason a backend is off, while gpu_exporter_backend_up is 0.",
    labels=("backend", "reason"),
    note="`reason` is one of " + ", ".join(f"`{r}`" for r in DownReason)
    + " ([troubleshooting.md](troubleshooting.md)); a backend that answers has no series.",
    otlp=Otlp("gpu_exporter.backend.down_reason", "{state}"))
DURATION = MetricSpec("gpu_exporter_collection_duration_seconds",
                      "Time one collection cycle took.", Kind.HISTOGRAM, "seconds",
                      labels=("backend",),
                      otlp=Otlp("gpu_exporter.collection.duration"))
ERRORS = MetricSpec("gpu_exporter_collection_errors_total",
                    "Values, devices or processes a collection had to drop.", Kind.COUNTER,
                    labels=("backend", "reason"),
                    note="Reasons include parse, permission, vanished, implausible (a reading "
                    "no hardware can give), clock, table_full; `backend=\"estimate\"` counts "
                    "the readings the energy split refused ([energy.md](energy.md)).",
                    otlp=Otlp("gpu_exporter.collection.errors", "{error}"))
LAST = MetricSpec("gpu_exporter_last_collection_timestamp_seconds",
                  "When the backend last completed a collection.", labels=("backend",),
                  otlp=Otlp("gpu_exporter.collection.last_timestamp", "s"))
RESTARTS = MetricSpec("gpu_exporter_child_restarts_total",
                      "Child processes (macmon) a backend restarted.", Kind.COUNTER,
                      labels=("backend",),
                      otlp=Otlp("gpu_exporter.child.restarts", "{restart}"))
TRUNCATED = MetricSpec("gpu_exporter_processes_truncated_total",
                       "Per-process series cut by --max-processes-per-gpu.", Kind.COUNTER,
                       otlp=Otlp("gpu_exporter.processes.truncated", "{process}"))
CPU = MetricSpec(
    "gpu_exporter_backend_cpu_seconds_total",
    "CPU time of each backend's collector thread, and of the renderer and the HTTP server.",
    Kind.COUNTER, "seconds", labels=("backend",),
    note="`renderer` runs renders and /snapshot, `server` the HTTP event loop and password "
    "checks, `otlp` the push thread (with --otlp.endpoint). Linux; absent where the platform "
    "has no per-thread CPU clock.",
    otlp=Otlp("gpu_exporter.backend.cpu.time"))
OTLP = MetricSpec("gpu_exporter_otlp_exports_total",
                  "OTLP pushes by result: sent, failed (after the exporter's retries), dropped "
                  "(a push still in flight when the next was due).", Kind.COUNTER,
                  labels=("result",), note="With --otlp.endpoint only; see [otlp.md](otlp.md).",
                  otlp=Otlp("gpu_exporter.otlp.exports", "{export}"))
RELOAD_OK = MetricSpec("gpu_exporter_config_last_reload_successful",
                       "1 if the last configuration reload (SIGHUP, or a changed web config "
                       "file) succeeded; 0 while the old settings are kept after an error.",
                       note="Served by the daemon with --config.file or --web.config.file "
                       "(what a reload reads); see [reload](reload.md).",
                       otlp=Otlp("gpu_exporter.config.last_reload.successful",
                                 "{state}"))
RELOAD_TIME = MetricSpec("gpu_exporter_config_last_reload_success_timestamp_seconds",
                         "When the configuration was last loaded successfully (start-up "
                         "included).", unit="seconds",
                         otlp=Otlp("gpu_exporter.config.last_reload.success_timestamp"))
EVICTED = MetricSpec(
    "gpu_exporter_http_connections_evicted_total",
    "Connections the HTTP server closed to make room for a new one when every connection "
    "slot was taken, by the state they were in.", Kind.COUNTER, labels=("state",),
    note="`state`: `stalled` (its answer not read, or pipelining), `unproven` (in its TLS "
    "handshake, before its first request, or failing authentication), `idle` (a keep-alive "
    "connection between requests). Served by a daemon that listens; see "
    "[security.md](security.md).",
    otlp=Otlp("gpu_exporter.http.connections.evicted", "{connection}"))
# The exporter's own families that the shipped alerts (deploy/prometheus) and a reload
# check watch: a metric selection that hides one is warned about at start and reload.
WATCHED = (UP, BACKEND_UP, BACKEND_DOWN, ERRORS, LAST, RELOAD_OK)
# In the order served.
EXPORTER = (BUILD, UP, BACKEND_UP, BACKEND_DOWN, DURATION, ERRORS, LAST, RESTARTS, TRUNCATED,
            CPU, OTLP, RELOAD_OK, RELOAD_TIME, EVICTED)


def _labels(spec: MetricSpec, value: float | None) -> list[str] | None:
    return list(spec.labels) if value is None else None


def _gauge(spec: MetricSpec, value: float | None = None) -> GaugeMetricFamily:
    """An empty family of ``spec`` (or a label-less one holding ``value``); so are the next."""
    return GaugeMetricFamily(spec.name, spec.help, value=value, labels=_labels(spec, value))


def _counter(spec: MetricSpec, value: float | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(spec.name, spec.help, value=value, labels=_labels(spec, value))


def _histogram(spec: MetricSpec) -> HistogramMetricFamily:
    return HistogramMetricFamily(spec.name, spec.help, labels=list(spec.labels))


def thread_cpu_seconds(thread: threading.Thread) -> float | None:
    """CPU time one thread has used (Linux and other systems with per-thread clocks)."""
    ident = thread.ident
    getclock = getattr(time, "pthread_getcpuclockid", None)
    if ident is None or getclock is None or not thread.is_alive():
        return None
    try:
        return float(time.clock_gettime(getclock(ident)))
    except OSError:
        return None


def exporter_families(s: Snapshot, threads: Mapping[str, Sequence[threading.Thread]],
                      otlp: Mapping[str, int] | None = None,
                      reload: tuple[bool, float] | None = None,
                      connections: Mapping[str, int] | None = None) -> Iterator[Metric]:
    """``otlp``: the OTLP pusher's export counts by result, with --otlp.endpoint only;
    ``reload``: (last reload successful, when it last succeeded), from a serving daemon;
    ``connections``: the HTTP server's evictions by state, from a serving daemon."""
    build = _gauge(BUILD)
    build.add_metric([__version__, platform.python_version()], 1)
    yield build
    yield _gauge(UP, 1 if s.ready else 0)
    up, last, down = _gauge(BACKEND_UP), _gauge(LAST), _gauge(BACKEND_DOWN)
    hist = _histogram(DURATION)
    errors, restarts = _counter(ERRORS), _counter(RESTARTS)
    for state in s.backends:
        up.add_metric([state.name], 1 if state.up and not state.stale else 0)
        if (why := state.down_reason) is not None:
            down.add_metric([state.name, why], 1)
        if state.duration_count:
            buckets = [(str(b), c) for b, c in
                       zip(DURATION_BUCKETS, state.duration_buckets, strict=True)]
            buckets.append(("+Inf", state.duration_count))
            hist.add_metric([state.name], buckets, state.duration_sum)
        for reason, n in sorted(state.errors_total.items()):
            errors.add_metric([state.name, reason], n)
        if state.last_success is not None:
            last.add_metric([state.name], state.last_success)
        if state.child_restarts is not None:
            restarts.add_metric([state.name], state.child_restarts)
    for reason, n in sorted(s.estimate_errors_total.items()):  # the energy split's refusals
        errors.add_metric(["estimate", reason], n)
    yield from (up, down, hist, errors, last)
    if restarts.samples:
        yield restarts
    yield _counter(TRUNCATED, s.processes_truncated_total)
    cpu = _counter(CPU)
    for name, group in threads.items():
        used = [t for t in (thread_cpu_seconds(th) for th in group) if t is not None]
        if used:
            cpu.add_metric([name], sum(used))
    if cpu.samples:
        yield cpu
    if otlp is not None:
        exports = _counter(OTLP)
        for result, n in otlp.items():
            exports.add_metric([result], n)
        yield exports
    if reload is not None:
        yield _gauge(RELOAD_OK, 1 if reload[0] else 0)
        yield _gauge(RELOAD_TIME, reload[1])
    if connections is not None:
        evicted = _counter(EVICTED)
        for kind, n in sorted(connections.items()):
            evicted.add_metric([kind], n)
        yield evicted
