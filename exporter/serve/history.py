"""The ring buffer of recent per-GPU values behind the landing page's charts, and the
current tables (GPUs, backends, top processes) that the page and ``gpu-exporter top``
refresh from ``/api/v1/history``.

Fed by the Hub's publishing thread (``History.add``, a subscriber), never by
a scrape or a page view: ``/`` and ``/api/v1/history`` read what is already here and never
touch a driver. Bounded: ``capacity`` samples per GPU (``--web.history`` divided by
``--collector.interval``), one sample per interval however often backends publish, and a
GPU gone for a whole window is forgotten. Beside the samples, each GPU's processes of
the latest recorded snapshot (exporter.serve.tables' ``top_processes``: made once per
recorded snapshot, when first asked for), so the page's tables refresh without a
reload. What it serves is exporter.serve.view's typed view (``History.view``), the
contract with the page, the JSON and ``gpu-exporter top``.
bench/history_memory.py measures its size.

Time: the one-sample-per-interval throttle and the forgetting of a gone GPU run on the
monotonic clock, so a wall clock stepped back (NTP, a bad RTC) never stops the recording.
Wall time is only the label of a sample (``t``, and the reply's ``now``): the wall clock,
or, while it reads earlier than the last label, that label plus half the monotonic time
since, so labels never go back (a client's ``since``, the last label it has, always finds
the samples after it) and meet the wall clock again after twice the step.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.core.model import DeviceSample
from exporter.pipeline.state import Snapshot
from exporter.serve import view
from exporter.serve.tables import (
    critical,
    current,
    hottest,
    memory_ratio,
    otlp_view,
    temperature,
    top_processes,
)
from exporter.serve.view import MAX_ROWS

CATCH_UP = 0.5  # how fast labels move while the wall clock reads earlier than the last
MAX_CAPACITY = 86_400  # a day of 1 s samples per GPU: a hard bound whatever the flags say
# Samples per GPU one page or /api/v1/history serves at most (every k-th beyond it): a
# day of 1 s samples on 8 GPUs was a 22 MiB body and +206 MiB while it was built.
MAX_POINTS = 1_000


@dataclass(frozen=True)
class Series:
    """One chart: its key in the JSON, title, unit, fixed range (None: the GPU's own
    top, ``scale``, else 0 to the largest value seen), how a sample's value is read and
    how the GPU's own top of the scale is (its power limit, its hottest sensor's
    critical limit)."""

    key: str
    title: str
    unit: str
    high: float | None
    read: Callable[[DeviceSample], float | None]
    scale: Callable[[DeviceSample], float | None] | None = None

    @property
    def view(self) -> view.Series:
        return view.Series(self.key, self.title, self.unit, self.high)


def critical_of_hottest(d: DeviceSample) -> float | None:
    hot = hottest(d)
    return None if hot is None else critical(d, hot[0])


SERIES = (
    Series("utilization", "Utilisation", "%", 100.0,
           lambda d: None if d.utilization_ratio is None else 100 * d.utilization_ratio),
    Series("memory", "Memory used", "%", 100.0,
           lambda d: None if (r := memory_ratio(d)) is None else 100 * r),
    Series("power", "Power", "W", None, lambda d: d.power_watts,
           lambda d: d.power_limit_watts or None),
    Series("temperature", "Temperature", "°C", None, temperature, critical_of_hottest),
)
SERIES_VIEW = tuple(s.view for s in SERIES)
SCALED = tuple(s for s in SERIES if s.high is None and s.scale is not None)


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

    def columns(self, since: float, limit: int | None = MAX_POINTS) -> list[list[float | None]]:
        """The samples newer than ``since`` as columns (time, then one per series), oldest
        first, None where unknown: array slices, not a Python loop per value. With
        ``limit``, every k-th sample so that at most ``limit`` are returned, the newest
        always among them."""
        first = (self.next - self.count) % self.capacity
        ordered = (self.data[first * WIDTH:(first + self.count) * WIDTH]
                   if first + self.count <= self.capacity
                   else self.data[first * WIDTH:] + self.data[:self.next * WIDTH])
        times = ordered[0::WIDTH]
        start = bisect.bisect_right(times, since)  # times only grow
        step, count = 1, len(times) - start
        if limit is not None and count > limit:
            step = math.ceil(count / limit)
            start += (count - 1) % step
        out: list[list[float | None]] = [list(times[start::step])]
        for i in range(1, WIDTH):
            out.append([None if v != v else v for v in ordered[i::WIDTH][start::step]])  # NaN
        return out

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
        # per GPU: the sample its processes are read from, replaced on each sample, and
        # its process rows, made when first asked for (not on the collector's thread)
        self._top: dict[str, DeviceSample] = {}
        self._rows: dict[str, tuple[DeviceSample, view.Processes]] = {}
        # per GPU: the top of each autoscaled chart where the GPU has one (power limit,
        # critical temperature), the last known: kept while the GPU is lost
        self._scale: dict[str, dict[str, float]] = {}
        self._last: dict[str, float] = {}
        # The latest recorded snapshot, whose tables (``current``) are built when a page
        # asks (once per snapshot), not on every sample; None until the first is
        # recorded (the JSON's null: "not known yet", not "none").
        self._recorded: Snapshot | None = None
        self._tables: tuple[Snapshot, tuple[view.Device, ...],
                            tuple[view.Backend, ...]] | None = None
        self._added = -math.inf  # when add() last read a snapshot (monotonic)
        self._label: tuple[float, float] | None = None  # the last label, its monotonic time
        self._lock = threading.Lock()

    def _now(self, now: float | None) -> tuple[float, float]:
        """(monotonic time, wall-time label): ``now``, where a caller gives one, is both
        (a test's or a bench's synthetic time)."""
        if now is not None:
            return now, now
        mono, wall = time.monotonic(), time.time()
        if self._label is not None:
            label, at = self._label
            # The wall clock stepped back: go on at half speed until it catches up.
            wall = max(wall, label + (mono - at) * CATCH_UP)
        return mono, wall

    def now(self) -> float:
        """The time the page, ``/api/v1/history`` and ``top`` draw against: the labels'
        clock (the wall clock, never earlier than the last label)."""
        with self._lock:
            return self._now(None)[1]

    def add(self, snapshot: Snapshot, now: float | None = None) -> None:
        """Hub subscriber: one sample per GPU per interval from the snapshot's merged devices."""
        # Backends publish several times an interval: before anything else, keep the
        # first of each interval, so a publish in between costs nothing here (the
        # snapshot arrives merged: exporter.pipeline.state.merged_view).
        if not snapshot.ready:  # not every backend has had its first cycle: GPUs missing
            return
        with self._lock:
            mono, label = self._now(now)
            if mono - self._added < self.interval * 0.9:
                return
            self._added = mono
            self._label = (label, mono)
            self._recorded = snapshot
            for gpu, d in snapshot.devices:
                if not d.up or d.info.parent_key:  # charts are per whole GPU
                    continue
                self._last[gpu] = mono
                ring = self._rings.get(gpu)
                if ring is None:
                    ring = self._rings[gpu] = _Ring(self.capacity)
                self._names[gpu] = d.info.name
                self._top[gpu] = d
                ring.append((round(label, 3), *(_finite(s.read(d)) for s in SERIES)))
                scale = self._scale.setdefault(gpu, {})
                for s in SCALED:
                    if (top := s.scale(d)) is not None and math.isfinite(top):  # type: ignore[misc]
                        scale[s.key] = float(top)
            for gpu in [g for g, t in self._last.items() if mono - t > self.window]:
                del self._rings[gpu], self._last[gpu], self._names[gpu], self._top[gpu]
                self._scale.pop(gpu, None)
                self._rows.pop(gpu, None)

    def points(self, since: float = 0.0, limit: int | None = MAX_POINTS
               ) -> Mapping[str, list[tuple[float | None, ...]]]:
        """A copy of each GPU's samples newer than ``since`` (unix time), at most
        ``limit`` of them (evenly spread, the newest included)."""
        with self._lock:
            return {gpu: ring.samples(since, limit) for gpu, ring in self._rings.items()}

    def processes(self, rows: int = MAX_ROWS) -> dict[str, view.Processes]:
        """Per GPU, the processes of the latest recorded snapshot, at most ``rows`` of
        them (the largest), made once per recorded snapshot and shared."""
        with self._lock:
            samples = dict(self._top)
            made = dict(self._rows)
        out = {}
        for gpu, d in samples.items():
            known = made.get(gpu)
            if known is None or known[0] is not d:
                known = (d, top_processes(d))
                with self._lock:
                    if self._top.get(gpu) is d:
                        self._rows[gpu] = known
            listed = known[1]
            out[gpu] = listed if rows >= len(listed.rows) else view.Processes(
                listed.rows[:rows], listed.more + len(listed.rows) - rows)
        return out

    def tables(self) -> tuple[tuple[view.Device, ...] | None, tuple[view.Backend, ...] | None]:
        """The devices and backends of the latest recorded snapshot (``current``)."""
        with self._lock:
            snapshot, tables = self._recorded, self._tables
        if snapshot is None:
            return None, None
        if tables is None or tables[0] is not snapshot:
            tables = (snapshot, *current(snapshot))
            with self._lock:
                self._tables = tables
        return tables[1], tables[2]

    def columns(self, since: float = 0.0) -> tuple[view.GpuHistory, ...]:
        """Each GPU's samples newer than ``since`` (at most MAX_POINTS, evenly spread) as
        columns, in GPU order, with its charts' scale."""
        with self._lock:
            copies = {gpu: (ring.columns(since), self._names.get(gpu, ""),
                            dict(self._scale.get(gpu, {})))
                      for gpu, ring in self._rings.items()}
        return tuple(view.GpuHistory(gpu, name, cols[0],  # type: ignore[arg-type]
                                     {s.key: cols[i] for i, s in enumerate(SERIES, start=1)},
                                     scale)
                     for gpu, (cols, name, scale) in sorted(copies.items(),
                                                            key=lambda kv: _gpu_order(kv[0])))

    def view(self, since: float = 0.0, now: float | None = None,
             otlp: Mapping[str, Any] | None = None,
             rows: int = MAX_ROWS) -> view.HistoryView:
        """What ``/api/v1/history`` serves: columns per GPU, None where unknown, the
        server's clock (``now``), which the page's charts are drawn against, and,
        whatever ``since`` (they replace what the page has), each GPU's processes, every
        whole GPU's current state (``devices``), every backend's (``backends``) and the
        OTLP pusher's (``otlp``, where it runs); ``rows``: process rows per GPU at most
        (the page asks for the ones it shows)."""
        devices, backends = self.tables()
        if now is None:
            now = self.now()
        return view.HistoryView(
            now=round(now, 3), interval=self.interval,
            window=self.window, capacity=self.capacity, series=SERIES_VIEW,
            gpus=self.columns(since), processes=self.processes(rows), devices=devices,
            backends=backends, otlp=otlp_view(otlp))

    def as_json(self, since: float = 0.0, now: float | None = None,
                otlp: Mapping[str, Any] | None = None,
                rows: int = MAX_ROWS) -> dict[str, Any]:
        """The body of ``/api/v1/history`` (``view`` as JSON)."""
        return self.view(since, now, otlp, rows).to_json()


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
