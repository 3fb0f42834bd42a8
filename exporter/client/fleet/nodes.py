"""The fleet, as a Prometheus that scrapes it sees it: the data of ``gpu-exporter top
--prometheus``.

``load_fleet`` gives the node list (one row per node: GPUs, mean utilisation, memory,
power, the worst health verdict, waste), sorted by waste; ``load_node`` one node's GPUs
and processes, as the one-node view shows them; ``load_history`` utilisation over time
for sparklines. Each runs a fixed set of PromQL queries (exporter.client.fleet.ql), a few
at a time, and reports each answer to a progress callback as it comes, so that a view
can draw a large fleet's progress. Nothing raises on a bad or missing answer: a value
nobody answered is None ("no data"), and the failures are listed in ``errors``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from exporter.client.fleet.promapi import Answer, PrometheusAPI, Series
from exporter.client.fleet.ql import DEFAULT_IDLE_UTILIZATION, WASTE_ALERTS, FleetQL, vocabulary
from exporter.core.config import MetricNames
from exporter.pipeline.health import STATUS_NAMES

PARALLEL = 4  # queries in flight at once against the server


@dataclass(frozen=True)
class Progress:
    """``done`` of ``total`` queries answered; ``what`` names the last one."""

    done: int
    total: int
    what: str


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True)
class Waste:
    """What a node (or GPU) holds and does not use, now.

    ``idle_gpus``: GPUs allocated to a pod whose mean utilisation over the last 5 minutes
    is under the idle threshold; ``idle_watts``: the power they draw. ``idle_processes``:
    processes holding device memory that kept no engine busy over 5 minutes;
    ``idle_memory_bytes``: the memory they hold. ``alerts``: waste alerts firing
    (GpuAllocatedIdle, GpuProcessMemoryIdle: idle for the rules' whole duration), where
    Prometheus runs the shipped rules."""

    idle_gpus: int = 0
    idle_watts: float = 0.0
    idle_processes: int = 0
    idle_memory_bytes: float = 0.0
    alerts: int = 0

    @property
    def any(self) -> bool:
        return bool(self.idle_gpus or self.idle_processes or self.alerts)

    def key(self) -> tuple[float, ...]:
        """Larger is more waste: firing alerts, idle allocated GPUs, their power, idle
        processes, their memory."""
        return (self.alerts, self.idle_gpus, self.idle_watts, self.idle_processes,
                self.idle_memory_bytes)


@dataclass(frozen=True)
class NodeSummary:
    """One node of the list. A value no answer gave is None."""

    node: str
    gpus: int | None = None
    lost_gpus: int | None = None  # gpu_up 0 (the exporter's names only)
    utilization: float | None = None  # mean of the GPUs, 0..1
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    health: int | None = None  # worst verdict: 0 healthy, 1 degraded, 2 failed
    up: bool | None = None  # Prometheus' scrape of the exporter
    waste: Waste = Waste()

    @property
    def health_name(self) -> str | None:
        return None if self.health is None else STATUS_NAMES[self.health]


@dataclass(frozen=True)
class Fleet:
    """The node list, most waste first (then by name). ``errors``: one line per query
    that gave no usable answer; ``truncated``: some answer was cut at the series cap."""

    nodes: tuple[NodeSummary, ...]
    idle_threshold: float
    errors: tuple[str, ...] = ()
    truncated: bool = False
    series: int = 0  # series read, all answers together
    seconds: float = 0.0  # wall time of the load
    slowest: float = 0.0  # the slowest query's time

    @property
    def gpus(self) -> int:
        return sum(n.gpus or 0 for n in self.nodes)


@dataclass(frozen=True)
class Allocation:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class GpuRow:
    """One GPU (or MIG slice / partition) of a node, as the one-node view shows it."""

    node: str
    gpu: str  # the exporter's index
    uuid: str
    vendor: str = ""
    name: str = ""
    up: bool | None = None
    utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None  # the hottest sensor
    health: int | None = None
    allocations: tuple[Allocation, ...] = ()
    idle: bool = False  # allocated, and under the idle threshold
    alert: bool = False  # a waste alert fires for it

    @property
    def health_name(self) -> str | None:
        return None if self.health is None else STATUS_NAMES[self.health]


@dataclass(frozen=True)
class ProcessRow:
    node: str
    gpu: str
    uuid: str
    pid: str
    process: str
    namespace: str = ""
    pod: str = ""
    container: str = ""
    memory_used_bytes: float | None = None
    engine_busy: float | None = None  # engine seconds per second, summed over engines
    utilization: float | None = None  # the source's busy ratios, summed over engines
    idle: bool = False  # holds memory, no engine time
    alert: bool = False


@dataclass(frozen=True)
class NodeDetail:
    """One node: its GPUs (by index) and processes (idle first, then by memory)."""

    node: str
    gpus: tuple[GpuRow, ...]
    processes: tuple[ProcessRow, ...]
    errors: tuple[str, ...] = ()
    truncated: bool = False
    series: int = 0
    seconds: float = 0.0

    @property
    def waste(self) -> Waste:
        idle = [g for g in self.gpus if g.idle]
        procs = [p for p in self.processes if p.idle]
        return Waste(idle_gpus=len(idle),
                     idle_watts=sum(g.power_watts or 0.0 for g in idle),
                     idle_processes=len(procs),
                     idle_memory_bytes=sum(p.memory_used_bytes or 0.0 for p in procs),
                     alerts=sum(g.alert for g in self.gpus)
                     + sum(p.alert for p in self.processes))


@dataclass(frozen=True)
class History:
    """Utilisation over time: per node (``node`` None) or per GPU of one node, keyed by
    node name or GPU index; points are (unix time, ratio)."""

    node: str | None
    series: Mapping[str, tuple[tuple[float, float], ...]]
    error: str | None = None
    truncated: bool = False


# ---------------------------------------------------------------- running the queries


def _run(api: PrometheusAPI, queries: Mapping[str, str], progress: ProgressCallback | None,
         at: float | None) -> dict[str, Answer]:
    """Every query, PARALLEL at a time; progress after each answer. The workers are
    daemon threads: a view that quits while a query waits on a slow server exits at once
    (a ThreadPoolExecutor's workers are joined at exit, each query up to its timeout)."""
    out: dict[str, Answer] = {}
    total = len(queries)
    todo: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
    for item in queries.items():
        todo.put(item)
    answered: queue.SimpleQueue[tuple[str, Answer]] = queue.SimpleQueue()

    def work() -> None:
        while True:
            try:
                name, expr = todo.get_nowait()
            except queue.Empty:
                return
            try:
                answer = api.query(expr, at)  # returns every failure as an Answer
            except Exception as e:  # noqa: BLE001 - a bug here must not hang the load
                answer = Answer(expr, error=f"{type(e).__name__}: {e}"[:300])
            answered.put((name, answer))

    for _ in range(min(PARALLEL, total)):
        threading.Thread(target=work, name="prometheus", daemon=True).start()
    while len(out) < total:
        name, answer = answered.get()
        out[name] = answer
        if progress is not None:
            try:
                progress(Progress(len(out), total, name))
            except Exception:  # noqa: BLE001 - a view's callback never stops a load
                pass
    return out


def _errors(answers: Mapping[str, Answer]) -> tuple[str, ...]:
    return tuple(f"{name}: {a.error}" for name, a in sorted(answers.items()) if a.error)


def _by(answer: Answer | None, label: str) -> dict[str, float]:
    """label value -> value, for an answer with one series per value of ``label``."""
    if answer is None:
        return {}
    return {s.labels[label]: s.value for s in answer.series if s.labels.get(label)}


def _counts(answer: Answer | None, label: str) -> dict[str, int]:
    return {k: int(v) for k, v in _by(answer, label).items()}


def load_fleet(api: PrometheusAPI, names: MetricNames = MetricNames.GPU,
               node_label: str = "instance", matchers: str = "",
               progress: ProgressCallback | None = None, at: float | None = None) -> Fleet:
    """The node list. ``names``: the vocabulary the exporters serve (``both`` and
    ``both-dcgm4.9`` read the exporter's names); ``node_label``: the label naming a node;
    ``matchers``: extra matchers for every selector (``job="gpu-exporter"``); ``at``:
    evaluation time (unix), now if None."""
    started = time.monotonic()
    ql = FleetQL(vocabulary(names), node_label, matchers)
    answers = _run(api, ql.node_queries(), progress, at)
    n = node_label
    gpus, util = _counts(answers.get("gpus"), n), _by(answers.get("util"), n)
    used, total = _by(answers.get("mem_used"), n), _by(answers.get("mem_total"), n)
    power, health = _by(answers.get("power"), n), _counts(answers.get("health"), n)
    lost = _counts(answers.get("lost"), n) if "lost" in answers else None
    idle_gpus, idle_watts = _counts(answers.get("idle_gpus"), n), _by(answers.get("idle_watts"), n)
    idle_procs = _counts(answers.get("idle_procs"), n)
    idle_memory = _by(answers.get("idle_memory"), n)
    alerts, up = _counts(answers.get("alerts"), n), _by(answers.get("up"), n)
    known = set(gpus) | set(up)
    # A node whose exporter is up but serves no GPU has 0 GPUs; unknown (None) only where
    # the count failed or the exporter is not scraped (down: its series went stale).
    counted = answers.get("gpus") is not None and not answers["gpus"].error
    nodes = []
    for node in known:
        waste = Waste(idle_gpus=idle_gpus.get(node, 0), idle_watts=idle_watts.get(node, 0.0),
                      idle_processes=idle_procs.get(node, 0),
                      idle_memory_bytes=idle_memory.get(node, 0.0), alerts=alerts.get(node, 0))
        nodes.append(NodeSummary(
            node=node, gpus=gpus.get(node, 0 if counted and up.get(node) == 1 else None),
            lost_gpus=None if lost is None or node not in gpus else lost.get(node, 0),
            utilization=util.get(node), memory_used_bytes=used.get(node),
            memory_total_bytes=total.get(node), power_watts=power.get(node),
            health=_verdict(health.get(node)), up=None if node not in up else up[node] == 1,
            waste=waste))
    threshold_answer = answers.get("threshold")
    threshold = (threshold_answer.series[0].value
                 if threshold_answer is not None and threshold_answer.series
                 else DEFAULT_IDLE_UTILIZATION)
    return Fleet(nodes=tuple(sort_by_waste(nodes)), idle_threshold=threshold,
                 errors=_errors(answers), truncated=any(a.truncated for a in answers.values()),
                 series=sum(len(a.series) for a in answers.values()),
                 seconds=time.monotonic() - started,
                 slowest=max((a.seconds for a in answers.values()), default=0.0))


def sort_by_waste(nodes: Iterable[NodeSummary]) -> list[NodeSummary]:
    """Most waste first; then the nodes whose exporter is down; then by name."""
    return sorted(nodes, key=lambda s: (tuple(-x for x in s.waste.key()), s.up is not False,
                                        s.node))


def _verdict(value: float | int | None) -> int | None:
    if value is None:
        return None
    v = int(value)
    return v if 0 <= v < len(STATUS_NAMES) else None


def _gpu_key(labels: Mapping[str, str], dcgm: bool) -> tuple[str, str]:
    """(gpu index, device id): the uuid, or for a DCGM series its MIG instance."""
    if dcgm:
        return labels.get("gpu", ""), labels.get("GPU_I_ID", "")
    return labels.get("gpu", ""), labels.get("uuid", "")


def load_node(api: PrometheusAPI, node: str, names: MetricNames = MetricNames.GPU,
              node_label: str = "instance", matchers: str = "",
              progress: ProgressCallback | None = None, at: float | None = None) -> NodeDetail:
    """One node's GPUs and processes (``node`` is a value of ``node_label``)."""
    started = time.monotonic()
    ql = FleetQL(vocabulary(names), node_label, matchers)
    dcgm = ql.dcgm
    answers = _run(api, ql.gpu_queries(node), progress, at)

    def values(name: str) -> dict[tuple[str, str], float]:
        a = answers.get(name)
        return {} if a is None else {_gpu_key(s.labels, dcgm): s.value for s in a.series
                                     if s.labels.get("gpu")}

    rows: dict[tuple[str, str], dict[str, object]] = {}
    for name in ("seen", "info", "util", "mem_used", "mem_total", "power", "temp", "health"):
        a = answers.get(name)
        for s in a.series if a is not None else ():
            if not s.labels.get("gpu"):
                continue
            key = _gpu_key(s.labels, dcgm)
            row = rows.setdefault(key, {"gpu": key[0], "uuid": ""})
            if not row["uuid"]:  # DCGM series: the parent's UUID; ours: the device's
                row["uuid"] = s.labels.get("UUID") or s.labels.get("uuid", "")
            if not row.get("vendor"):  # the DCGM series carry none; our families do
                row["vendor"] = s.labels.get("vendor", "")
            if name == "info":
                row["name"] = s.labels.get("modelName" if dcgm else "name", "")
    seen, util, used = values("seen"), values("util"), values("mem_used")
    total, power, temp, health = (values("mem_total"), values("power"), values("temp"),
                                  values("health"))
    allocations: dict[tuple[str, str], set[Allocation]] = {}
    alloc = answers.get("alloc")
    for s in alloc.series if alloc is not None else ():
        if s.labels.get("pod"):
            allocations.setdefault(_gpu_key(s.labels, dcgm), set()).add(Allocation(
                s.labels.get("namespace", ""), s.labels["pod"], s.labels.get("container", "")))
    idle_gpus = {_gpu_key(s.labels, dcgm) for s in _series(answers.get("idle_gpus"))}
    alerts = [s.labels for s in _series(answers.get("alerts"))]
    alert_gpus = {(a.get("gpu", ""), a.get("uuid", "")) for a in alerts
                  if a.get("alertname") == WASTE_ALERTS[0]}
    alert_pids = {(a.get("gpu", ""), a.get("pid", "")) for a in alerts
                  if a.get("alertname") == WASTE_ALERTS[1]}
    gpus = []
    for key, row in sorted(rows.items(), key=lambda kv: (_index(kv[0][0]), kv[0][1])):
        gpus.append(GpuRow(
            node=node, gpu=key[0], uuid=str(row["uuid"]), vendor=str(row.get("vendor", "")),
            name=str(row.get("name", "")),
            up=None if dcgm or key not in seen else seen[key] == 1,
            utilization=util.get(key), memory_used_bytes=used.get(key),
            memory_total_bytes=total.get(key), power_watts=power.get(key),
            temperature_celsius=temp.get(key), health=_verdict(health.get(key)),
            allocations=tuple(sorted(allocations.get(key, ()),
                                     key=lambda a: (a.namespace, a.pod, a.container))),
            idle=key in idle_gpus,
            alert=(key[0], str(row["uuid"])) in alert_gpus
            or (dcgm and any(g == key[0] for g, _ in alert_gpus))))
    processes = _processes(node, answers, alert_pids)
    return NodeDetail(node=node, gpus=tuple(gpus), processes=processes,
                      errors=_errors(answers),
                      truncated=any(a.truncated for a in answers.values()),
                      series=sum(len(a.series) for a in answers.values()),
                      seconds=time.monotonic() - started)


def _series(answer: Answer | None) -> tuple[Series, ...]:
    return answer.series if answer is not None else ()


def _index(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def _processes(node: str, answers: Mapping[str, Answer],
               alert_pids: set[tuple[str, str]]) -> tuple[ProcessRow, ...]:
    def pid_key(labels: Mapping[str, str]) -> tuple[str, str, str]:
        return labels.get("gpu", ""), labels.get("uuid", ""), labels.get("pid", "")

    def per_pid(name: str) -> dict[tuple[str, str, str], float]:
        a = answers.get(name)
        return {} if a is None else {pid_key(s.labels): s.value for s in a.series}

    busy, util = per_pid("proc_busy"), per_pid("proc_util")
    idle = set(per_pid("idle_procs"))
    rows = []
    memory = answers.get("proc_memory")
    for s in memory.series if memory is not None else ():
        labels = s.labels
        if not labels.get("pid") or not labels.get("gpu"):
            continue
        key = pid_key(labels)
        rows.append(ProcessRow(
            node=node, gpu=key[0], uuid=key[1], pid=key[2],
            process=labels.get("process", ""), namespace=labels.get("namespace", ""),
            pod=labels.get("pod", ""), container=labels.get("container", ""),
            memory_used_bytes=s.value, engine_busy=busy.get(key), utilization=util.get(key),
            idle=key in idle, alert=(key[0], key[2]) in alert_pids))
    rows.sort(key=lambda p: (not p.idle, -(p.memory_used_bytes or 0.0), _index(p.gpu),
                             _index(p.pid)))
    return tuple(rows)


def load_history(api: PrometheusAPI, node: str | None = None,
                 names: MetricNames = MetricNames.GPU, node_label: str = "instance",
                 matchers: str = "", window: float = 3600.0, points: int = 120,
                 end: float | None = None) -> History:
    """Utilisation over the last ``window`` seconds in ``points`` steps (at most 11,000:
    Prometheus' own cap): per node, or per GPU of ``node``."""
    ql = FleetQL(vocabulary(names), node_label, matchers)
    dcgm = ql.dcgm
    points = max(2, min(points, 11_000))
    end = time.time() if end is None else end
    answer = api.query_range(ql.history(node), end - window, end, window / (points - 1))
    label = node_label if node is None else "gpu"
    series: dict[str, tuple[tuple[float, float], ...]] = {}
    for r in answer.ranges:
        key = r.labels.get(label, "")
        if node is not None and (r.labels.get("GPU_I_ID") or "") and dcgm:
            key = f"{key}/{r.labels['GPU_I_ID']}"
        if key:  # no more points than asked for are kept (a server may send millions)
            series[key] = r.points[-points:]
    return History(node=node, series=series, error=answer.error, truncated=answer.truncated)
