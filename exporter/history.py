"""The ring buffer of recent per-GPU values behind the landing page's charts.

Fed by the Hub's snapshot listener (``History.add``, on the collector's thread), never by
a scrape or a page view: ``/`` and ``/api/v1/history`` read what is already here and never
touch a driver. Bounded: ``capacity`` samples per GPU (``--web.history`` divided by
``--collector.interval``), one sample per interval however often backends publish, and a
GPU gone for a whole window is forgotten. Beside the samples, each GPU's top processes of
the latest recorded snapshot (``top_processes``: computed once per recorded snapshot, the
same rows the page renders), so the page's tables refresh without a reload.
bench/history_memory.py measures its size.
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.labels import Sensor
from exporter.model import DeviceSample
from exporter.state import Snapshot

TOP_PROCESSES = 5  # the rows of a GPU's "Top processes" table
MAX_CAPACITY = 86_400  # a day of 1 s samples per GPU: a hard bound whatever the flags say
# Samples per GPU one page or /api/v1/history serves at most (every k-th beyond it): a
# day of 1 s samples on 8 GPUs was a 22 MiB body and +206 MiB while it was built.
MAX_POINTS = 1_000
# The temperature a chart shows: the first sensor a GPU has (die, AMD edge, Intel package).
TEMPERATURE_SENSORS = (Sensor.GPU, Sensor.EDGE, Sensor.PACKAGE, Sensor.JUNCTION)


def temperature(d: DeviceSample) -> float | None:
    temps = d.temperatures_celsius
    return next((float(temps[s]) for s in TEMPERATURE_SENSORS if s in temps), None)


def memory_ratio(d: DeviceSample) -> float | None:
    if d.memory_used_bytes is None or not d.memory_total_bytes:
        return None
    return min(1.0, max(0.0, d.memory_used_bytes / d.memory_total_bytes))


def top_processes(d: DeviceSample) -> tuple[tuple[dict[str, Any], ...], int]:
    """The TOP_PROCESSES processes using the most memory, largest first, as the page shows
    them (pid, process, memory_bytes or None, pod as namespace/pod or "", container or ""),
    and how many more there are. The one ranking behind the server render and the JSON."""
    top = sorted(d.processes, key=lambda p: -(p.memory_used_bytes or 0))[:TOP_PROCESSES]
    rows = tuple({"pid": p.pid, "process": p.process, "memory_bytes": p.memory_used_bytes,
                  "pod": f"{p.namespace}/{p.pod}" if p.pod else "",
                  "container": p.container or ""} for p in top)
    return rows, len(d.processes) - len(rows)


@dataclass(frozen=True)
class Series:
    """One chart: its key in the JSON, title, unit, fixed range (None: 0 to the largest
    value seen) and how a sample's value is read."""

    key: str
    title: str
    unit: str
    high: float | None
    read: Callable[[DeviceSample], float | None]


SERIES = (
    Series("utilization", "Utilisation", "%", 100.0,
           lambda d: None if d.utilization_ratio is None else 100 * d.utilization_ratio),
    Series("memory", "Memory used", "%", 100.0,
           lambda d: None if (r := memory_ratio(d)) is None else 100 * r),
    Series("power", "Power", "W", None, lambda d: d.power_watts),
    Series("temperature", "Temperature", "°C", None, temperature),
)


def _finite(value: float | None) -> float:
    """A value as stored: NaN where unknown (or not finite), shown as None/null."""
    return math.nan if value is None or not math.isfinite(value) else round(float(value), 3)


WIDTH = 1 + len(SERIES)  # a sample: unix time, then one value per series


class _Ring:
    """``capacity`` samples in one flat array of doubles (NaN: unknown): 8 bytes a value,
    where a deque of tuples of floats costs about 160 bytes a sample."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data = array("d", bytes(8 * WIDTH * capacity))
        self.next = 0  # where the next sample goes
        self.count = 0

    def append(self, sample: tuple[float, ...]) -> None:
        at = self.next * WIDTH
        self.data[at:at + WIDTH] = array("d", sample)
        self.next = (self.next + 1) % self.capacity
        self.count = min(self.count + 1, self.capacity)

    def samples(self, since: float, limit: int | None = None) -> list[tuple[float | None, ...]]:
        """The samples newer than ``since``; with ``limit``, every k-th of them so that
        at most ``limit`` are returned, the newest always among them."""
        first = (self.next - self.count) % self.capacity
        newer = [at for i in range(self.count)
                 if self.data[at := (first + i) % self.capacity * WIDTH] > since]
        if limit is not None and len(newer) > limit:
            step = math.ceil(len(newer) / limit)
            newer = newer[(len(newer) - 1) % step::step]
        return [tuple(None if math.isnan(v) else v for v in self.data[at:at + WIDTH])
                for at in newer]


class History:
    """Per GPU (by its ``gpu`` label), the last ``capacity`` samples:
    (unix time, one value or None per SERIES)."""

    def __init__(self, window: float, interval: float) -> None:
        self.window = window
        self.interval = interval
        self.capacity = max(2, min(MAX_CAPACITY, math.ceil(window / interval)))
        self._rings: dict[str, _Ring] = {}
        self._names: dict[str, str] = {}
        # per GPU: its top processes and the count of the others, replaced on each sample
        self._top: dict[str, tuple[tuple[dict[str, Any], ...], int]] = {}
        self._last: dict[str, float] = {}
        self._added = -math.inf  # when add() last read a snapshot
        self._lock = threading.Lock()

    def add(self, snapshot: Snapshot, now: float | None = None) -> None:
        """Hub listener: one sample per GPU per interval from the snapshot's merged devices."""
        now = time.time() if now is None else now
        # Backends publish several times an interval: before anything else, keep the
        # first of each interval. Reading ``devices`` merges the snapshot (once, cached
        # for the renderer), so a publish in between costs nothing here.
        if not snapshot.ready:  # not every backend has had its first cycle: GPUs missing
            return
        with self._lock:
            if now - self._added < self.interval * 0.9:
                return
            self._added = now
            for gpu, d in snapshot.devices:
                if not d.up or d.info.parent_key:  # charts are per whole GPU
                    continue
                self._last[gpu] = now
                ring = self._rings.get(gpu)
                if ring is None:
                    ring = self._rings[gpu] = _Ring(self.capacity)
                self._names[gpu] = d.info.name
                self._top[gpu] = top_processes(d)
                ring.append((round(now, 3), *(_finite(s.read(d)) for s in SERIES)))
            for gpu in [g for g, t in self._last.items() if now - t > self.window]:
                del self._rings[gpu], self._last[gpu], self._names[gpu], self._top[gpu]

    def points(self, since: float = 0.0, limit: int | None = MAX_POINTS
               ) -> Mapping[str, list[tuple[float | None, ...]]]:
        """A copy of each GPU's samples newer than ``since`` (unix time), at most
        ``limit`` of them (evenly spread, the newest included)."""
        with self._lock:
            return {gpu: ring.samples(since, limit) for gpu, ring in self._rings.items()}

    def processes(self) -> dict[str, dict[str, Any]]:
        """Per GPU, the top processes of the latest recorded snapshot (``rows``) and how
        many more it had (``more``): the rows are shared, never changed once stored."""
        with self._lock:
            return {gpu: {"rows": list(rows), "more": more}
                    for gpu, (rows, more) in self._top.items()}

    def as_json(self, since: float = 0.0, now: float | None = None) -> dict[str, Any]:
        """The body of ``/api/v1/history``: columns per GPU, ``null`` where unknown, the
        server's clock (``now``), which the page's charts are drawn against, and each
        GPU's top processes (whatever ``since``: they replace what the page has)."""
        gpus = []
        for gpu, points in sorted(self.points(since).items(), key=lambda kv: _gpu_order(kv[0])):
            columns: dict[str, Any] = {"gpu": gpu, "name": self._names.get(gpu, ""),
                                       "t": [p[0] for p in points]}
            for i, s in enumerate(SERIES, start=1):
                columns[s.key] = [p[i] for p in points]
            gpus.append(columns)
        return {"now": round(time.time() if now is None else now, 3),
                "interval": self.interval, "window": self.window, "capacity": self.capacity,
                "series": [{"key": s.key, "title": s.title, "unit": s.unit, "max": s.high}
                           for s in SERIES],
                "gpus": gpus, "processes": self.processes()}


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def fan_out(*listeners: Callable[[Snapshot], None]) -> Callable[[Snapshot], None]:
    """One Hub listener that calls each of ``listeners`` in turn (renderer, history)."""
    def publish(snapshot: Snapshot) -> None:
        for listener in listeners:
            listener(snapshot)
    return publish
