"""What the Hub publishes: the immutable ``Snapshot`` and each backend's ``BackendState``.

A Snapshot is swapped atomically by the Hub (exporter.pipeline.hub) and read by the renderer,
the landing page, ``/snapshot``, history and the OTLP pusher. Its merged devices (one per
device key, exporter.pipeline.merge), the process cap, pod attribution and the health verdicts are
computed once, by the Hub as it publishes (``merged_view``); readers only read.
``CutCounter`` carries the cap's count from one snapshot to the next, in generation order.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.core.joins import JoinSource
from exporter.core.labels import DownReason, ErrorReason
from exporter.core.model import BackendSample, DeviceSample
from exporter.pipeline.energy_split import EnergySplit
from exporter.pipeline.health import DEFAULT_XID_WINDOW, Verdict, verdicts
from exporter.pipeline.merge import View, cap, enrich, merge
from exporter.sources.base import Enricher

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class BackendState:
    name: str
    up: bool = False
    reason: str = "not started"
    # The reason as one of a closed set of codes (gpu_exporter_backend_down_reason),
    # mapped from ``reason`` by exporter.pipeline.hubstate.down_code.
    code: DownReason = DownReason.NOT_STARTED
    attempted: bool = False  # open() has been tried at least once
    stale: bool = False  # opened, but no completed cycle within --stale-after
    last: BackendSample | None = None
    last_success: float | None = None  # wall clock of the last completed cycle (for display)
    # Monotonic clock of the last completed cycle, else of the last open: what ages are from.
    alive_at: float | None = None
    priority: int = 0
    enricher: Enricher | None = None  # its last cycle's (Cycle.enricher)
    joins: JoinSource | None = None  # its last cycle's (Cycle.joins)
    child_restarts: int | None = None  # its last cycle's (Cycle.child_restarts)
    # What was last logged of a down reason (its code; an exception's text), and whether
    # it came after a successful open (a handle that went bad, a sample that raised): a
    # backend that opens and fails again and again logs its failure once, and "recovered"
    # after GOOD_CYCLES_TO_RESET good cycles (exporter.pipeline.hub).
    logged: str = ""
    failing: bool = False
    errors_total: Mapping[ErrorReason, int] = field(default_factory=dict)
    duration_buckets: tuple[int, ...] = (0,) * len(DURATION_BUCKETS)
    duration_sum: float = 0.0
    duration_count: int = 0

    @property
    def down_reason(self) -> DownReason | None:
        """Why it serves no values now (None while it is up and answering)."""
        if self.up:
            return DownReason.STALE if self.stale else None
        return self.code

    @property
    def serving(self) -> bool:
        """Its device values are exported (not withdrawn)."""
        return self.up and not self.stale and self.last is not None


@dataclass(frozen=True)
class Snapshot:
    """One published state: what every reader (renderer, dcgm, OTLP, ``/snapshot``, the
    landing page, history) projects. Its merged view is computed once, by the Hub when it
    publishes (``merged_view``), never by a reader."""

    generation: int
    created: float
    ready: bool  # every backend has completed a cycle, is known to be off, or is stale
    backends: tuple[BackendState, ...]
    gpu_index: Mapping[str, int]  # device key -> exporter-wide "gpu" label
    # device key -> what to report (up=False) for a device no backend reports any more
    seen: Mapping[str, DeviceSample] = field(default_factory=dict)
    max_processes_per_gpu: int = 64
    # backend -> its collector thread (gpu_exporter_backend_cpu_seconds_total)
    threads: Mapping[str, threading.Thread] = field(default_factory=dict)
    health_xid_window: float = DEFAULT_XID_WINDOW  # --health.xid-window
    # (``gpu`` label, merged sample) of every device, one per key, ordered by ``gpu``
    devices: tuple[tuple[str, DeviceSample], ...] = ()
    # (``gpu``, merged sample, verdict) of every whole GPU (exporter.pipeline.health)
    health: tuple[tuple[str, DeviceSample, Verdict], ...] = ()
    # Processes the cap has cut so far, this snapshot's cut included: advances in
    # generation order (gpu_exporter_processes_truncated_total).
    processes_truncated_total: int = 0
    # Readings the energy split refused so far (exporter.pipeline.energy_split), by reason:
    # gpu_exporter_collection_errors_total{backend="estimate"}.
    estimate_errors_total: Mapping[ErrorReason, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MergedView:
    """What ``merged_view`` computes for one snapshot."""

    devices: tuple[tuple[str, DeviceSample], ...]
    health: tuple[tuple[str, DeviceSample, Verdict], ...]
    cut: frozenset[tuple[str, int]]  # (device key, pid) pairs the process cap cut


def merged_view(backends: Sequence[BackendState], seen: Mapping[str, DeviceSample],
                gpu_index: Mapping[str, int], max_processes_per_gpu: int, created: float,
                xid_window: float, energy: EnergySplit | None = None,
                generation: int = 0) -> MergedView:
    """The merge, then the process cap, then pod attribution, then the per-process energy
    split (fed once per generation), then the health verdicts: once per snapshot, on the
    publishing side (exporter.pipeline.hub.Hub.publish)."""
    views = [View(s.priority, s.serving, s.last.devices) for s in backends if s.last is not None]
    merged, cut = cap(merge(views, seen), max_processes_per_gpu)
    enricher = next((s.enricher for s in backends if s.serving and s.enricher), None)
    merged = enrich(merged, enricher)
    if energy is not None:
        merged = energy.attribute(generation, merged)
    out = []
    for d in merged:
        index = gpu_index.get(d.info.parent_key or d.info.key)
        if index is not None:
            out.append((index, bool(d.info.parent_key), d.info.key, d))
    out.sort(key=lambda t: t[:3])
    devices = tuple((str(index), d) for index, _, _, d in out)
    return MergedView(devices, verdicts(devices, created, xid_window), cut)


class CutCounter:
    """``gpu_exporter_processes_truncated_total``: each process the cap cuts counts once.

    A (device, pid) pair counts when a merged view cuts it and the view merged before
    did not; it counts again only after it was served (or gone) in between. Fed by the
    Hub's publish step only, one snapshot after the other, in generation order.
    """

    def __init__(self) -> None:
        self._cut: frozenset[tuple[str, int]] = frozenset()
        self.total = 0

    def add(self, cut: frozenset[tuple[str, int]]) -> int:
        self.total += len(cut - self._cut)
        self._cut = cut
        return self.total
