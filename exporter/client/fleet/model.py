"""``gpu-exporter top --prometheus``'s state: what Prometheus said of the fleet
(``FleetModel``: the node list of exporter.client.fleet.nodes, most waste first, the load in
progress, the failed queries), what the operator looks at (``FleetView``: the selected
node, the list's scroll, the node drilled into) and what each key does (``key``).

A node drilled into is shown as the one-daemon view shows a daemon: its GPUs become
exporter.serve.view ``Device``s and its processes ``Process``es in a topmodel ``Model``,
drawn by the same panels, rows and process table, driven by the same keys.

Prometheus is not trusted: every string of its answers (node, GPU, model and process
names, pods, error messages) is stripped of control and escape characters
(exporter.serve.untrusted) here, before anything draws it. The node's own name is kept
as Prometheus gave it only to ask for that node again.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from exporter.client.fleet.nodes import (
    Fleet,
    GpuRow,
    History,
    NodeDetail,
    NodeSummary,
    ProcessRow,
    Progress,
)
from exporter.client.top.model import (
    DOWN,
    END,
    HOME,
    PAGE_DOWN,
    PAGE_UP,
    QUIT,
    UP,
)
from exporter.client.top.model import Model as NodeModel
from exporter.client.top.model import View as NodeView
from exporter.client.top.model import key as node_key
from exporter.core.labels import HealthStatus
from exporter.serve.untrusted import text
from exporter.serve.view import Device, Health, Process, Processes, Reason, State, Temperature

ENTER = {"\r", "\n", "\x1b[C", "\x1bOC"}  # Enter, or → on the node list
BACK = {"\x1b", "\x7f", "\x08"}  # Esc, Backspace (DEL or ^H)
NODE_NAME = 253  # characters of a node name shown (a DNS name's most)
KEYS_HELP = (
    ("↑ ↓ j k", "select the previous / next node"),
    ("PgUp PgDn space", "page the node list"),
    ("Home End g G", "first / last node"),
    ("Enter →", "the selected node: its GPUs and processes"),
    ("Esc Backspace", "back to the node list"),
    ("on a node", "← → Tab: GPU; ↑ ↓ PgUp PgDn: processes; s S r: sort; l: layout"),
    ("? h", "this help (any key closes it)"),
    ("q Ctrl-C", "quit"),
)
HEALTH = {0: HealthStatus.HEALTHY, 1: HealthStatus.DEGRADED, 2: HealthStatus.FAILED}


def clean(value: str, limit: int = 256) -> str:
    return text(value, limit)


@dataclass
class Load:
    """A load under way: what is loaded (None: the node list; else a node) and how far."""

    node: str | None
    progress: Progress


@dataclass
class NodeState:
    """The node drilled into, as the one-daemon view's model, and its answers' state."""

    node: str  # as Prometheus gave it
    shown: str  # printable
    model: NodeModel = field(default_factory=NodeModel)
    view: NodeView = field(default_factory=NodeView)
    loaded: bool = False
    errors: tuple[str, ...] = ()
    truncated: bool = False
    seconds: float = 0.0
    stale: bool = False  # the last load had no answer: the GPUs shown are the ones before


@dataclass
class FleetModel:
    """The latest node list and the state of the loads. ``nodes``: names printable;
    ``keys``: the same nodes' names as Prometheus gave them."""

    source: str = ""
    refresh: float = 10.0
    max_series: int = 0
    nodes: tuple[NodeSummary, ...] = ()
    keys: tuple[str, ...] = ()
    loaded: bool = False  # a node list came (with or without nodes)
    updated: float | None = None
    errors: tuple[str, ...] = ()  # the last load's failed queries, printable
    queries: int = 0  # how many a load of the list asks (from its progress)
    truncated: bool = False
    series: int = 0
    seconds: float = 0.0
    idle_threshold: float = 0.05
    load: Load | None = None
    stale: bool = False  # the last load had no answer: the list is the one before

    @property
    def gpus(self) -> int:
        return sum(n.gpus or 0 for n in self.nodes)

    @property
    def failed(self) -> bool:
        """The last load had no answer at all: every query failed."""
        return bool(self.errors) and len(self.errors) >= self.queries

    def take_progress(self, node: str | None, progress: Progress) -> None:
        self.load = None if progress.done >= progress.total else Load(node, progress)
        if node is None:
            self.queries = progress.total

    def take_fleet(self, fleet: Fleet) -> None:
        self.load = None
        self.errors = tuple(clean(e, 300) for e in fleet.errors)
        self.truncated = fleet.truncated
        if self.failed and self.nodes:  # no answer at all: the last list stays, stale
            self.stale = True
            return
        self.loaded, self.stale = True, False
        self.updated = time.time()
        self.nodes = tuple(dataclasses.replace(n, node=clean(n.node, NODE_NAME))
                           for n in fleet.nodes)
        self.keys = tuple(n.node for n in fleet.nodes)
        self.series, self.seconds = fleet.series, fleet.seconds
        self.idle_threshold = fleet.idle_threshold


def take_node(state: NodeState, detail: NodeDetail, history: History | None) -> None:
    """A node's answers into its one-daemon model: its GPUs as Devices, its processes as
    each GPU's table, its history as the sparklines (percent)."""
    model = state.model
    state.errors = tuple(clean(e, 300) for e in detail.errors) + (
        (clean(f"history: {history.error}", 300),) if history and history.error else ())
    state.truncated = detail.truncated or bool(history and history.truncated)
    state.seconds = detail.seconds
    if not detail.gpus and detail.errors and model.devices:  # no answer: the last stays
        state.stale = True
        return
    state.loaded, state.stale = True, False
    labels = _labels(detail.gpus)
    devices = tuple(device(g, label) for g, label in zip(detail.gpus, labels, strict=True))
    by_gpu: dict[str, list[Process]] = {}  # by index: the first device of an index
    for row in detail.processes:
        p = process(row)
        if p is not None:
            by_gpu.setdefault(clean(row.gpu, 12), []).append(p)
    model.devices = devices
    model.decoded = {gpu: Processes(tuple(rows)) for gpu, rows in by_gpu.items()}
    model.raw_processes = {}
    model.recorded = model.replied = True
    model.error = ""
    model.received = model.updated = time.time()
    if history is not None and history.error is None:
        util: dict[str, list[float | None]] = {}
        for gpu, points in history.series.items():
            util[clean(gpu, 16)] = [100 * v for _, v in points[-model.keep:]]
        model.util = util


def _labels(gpus: tuple[GpuRow, ...]) -> list[str]:
    """Each GPU's label on the screen: its index; where one index has several devices (a
    DCGM MIG instance each), index.n."""
    seen: dict[str, int] = {}
    out = []
    for g in gpus:
        gpu = clean(g.gpu, 12)
        n = seen[gpu] = seen.get(gpu, -1) + 1
        out.append(gpu if n == 0 else f"{gpu}.{n}")
    return out


def device(g: GpuRow, label: str) -> Device:
    """A GPU row as the one-daemon view's Device: what Prometheus does not hold is None
    ("n/a"), never 0."""
    used, total = g.memory_used_bytes, g.memory_total_bytes
    reasons: list[Reason] = []
    for a in g.allocations[:3]:
        who = "/".join(clean(x, 128) for x in (a.namespace, a.pod) if x)
        reasons.append(Reason("pod", None, who + (f" ({clean(a.container, 64)})"
                                                  if a.container else "")))
    if g.idle:
        reasons.append(Reason("waste", HealthStatus.DEGRADED,
                              "allocated and idle (under the idle threshold for 5 min)"
                              + ("; alert firing" if g.alert else "")))
    return Device(
        gpu=label, name=clean(g.name, 128), vendor=clean(g.vendor, 32), uuid=clean(g.uuid, 128),
        state=None if g.up is None else State.UP if g.up else State.DOWN,
        utilization=g.utilization, memory_used_bytes=used, memory_total_bytes=total,
        memory_free_bytes=None if used is None or total is None else max(0.0, total - used),
        power_watts=g.power_watts,
        temperature=None if g.temperature_celsius is None
        else Temperature("hottest", g.temperature_celsius),
        health=Health(None if g.health is None else HEALTH.get(g.health), tuple(reasons)))


def process(p: ProcessRow) -> Process | None:
    """A process row as the one-daemon view's Process; a pid that is not a number is
    left out."""
    if not p.pid.isdigit() or len(p.pid) > 10:
        return None
    name = clean(p.process, 64)
    pod = "/".join(clean(x, 128) for x in (p.namespace, p.pod) if x) if p.pod else ""
    busy = p.utilization if p.utilization is not None else p.engine_busy
    return Process(pid=int(p.pid), process=name, memory_bytes=p.memory_used_bytes, pod=pod,
                   container=clean(p.container, 128) if p.pod else "",
                   utilization=None if busy is None else min(1.0, max(0.0, busy)),
                   command=name + (" (idle: holds memory, no engine time)" if p.idle else ""))


@dataclass
class FleetView:
    selected: int = 0  # index into FleetModel.nodes
    selected_key: str | None = None  # the selected node's name, kept across reloads
    offset: int = 0  # first node row shown
    page: int = 10  # node rows on the screen, from the last frame
    help: bool = False
    node: NodeState | None = None  # the node drilled into

    def keep_selection(self, model: FleetModel) -> None:
        """After a reload: the same node selected where it is still listed."""
        if self.selected_key in model.keys:
            self.selected = model.keys.index(self.selected_key)
        self.selected = max(0, min(self.selected, len(model.keys) - 1))
        self.selected_key = model.keys[self.selected] if model.keys else None


def key(view: FleetView, model: FleetModel, k: str) -> tuple[bool, bool]:
    """Apply a key: (go on, the poller must look at what is wanted now)."""
    if view.help:  # any key closes the help; q still quits
        view.help = False
        return k not in QUIT, False
    if k in QUIT:
        return False, False
    if k in ("?", "h"):
        view.help = True
        return True, False
    if view.node is not None:
        if k in BACK:
            view.node = None
            return True, True
        if k == "b":  # the one-daemon view's backends: Prometheus has none to show
            return True, False
        return node_key(view.node.view, view.node.model, k), False
    n = len(model.nodes)
    if k in ENTER:
        if n:
            view.selected = max(0, min(view.selected, n - 1))
            raw = model.keys[view.selected]
            view.node = NodeState(raw, model.nodes[view.selected].node)
            return True, True
        return True, False
    if k in DOWN:
        view.selected += 1
    elif k in UP:
        view.selected -= 1
    elif k in PAGE_DOWN:
        view.selected += view.page
    elif k in PAGE_UP:
        view.selected -= view.page
    elif k in HOME:
        view.selected = 0
    elif k in END:
        view.selected = n - 1
    view.selected = max(0, min(view.selected, n - 1))
    view.selected_key = model.keys[view.selected] if n else None
    return True, False
