"""The ring buffer of recent per-GPU values behind the landing page's charts, and the
current tables (GPUs, backends, top processes) that the page and ``gpu-exporter top``
refresh from ``/api/v1/history``.

Fed by the Hub's snapshot listener (``History.add``, on the collector's thread), never by
a scrape or a page view: ``/`` and ``/api/v1/history`` read what is already here and never
touch a driver. Bounded: ``capacity`` samples per GPU (``--web.history`` divided by
``--collector.interval``), one sample per interval however often backends publish, and a
GPU gone for a whole window is forgotten. Beside the samples, each GPU's top processes of
the latest recorded snapshot (``top_processes``: computed once per recorded snapshot, the
same rows the page renders), so the page's tables refresh without a reload.
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

from exporter.health import STATUS_NAMES, Verdict
from exporter.labels import Clock, Sensor
from exporter.model import DeviceSample
from exporter.state import BackendState, Snapshot

TOP_PROCESSES = 5  # the rows of a GPU's "Top processes" table
CATCH_UP = 0.5  # how fast labels move while the wall clock reads earlier than the last
MAX_CAPACITY = 86_400  # a day of 1 s samples per GPU: a hard bound whatever the flags say
# Where two sensors read the same, the one named first (die, edge, package) is shown.
TEMPERATURE_SENSORS = (Sensor.GPU, Sensor.EDGE, Sensor.PACKAGE, Sensor.JUNCTION,
                       Sensor.MEMORY, Sensor.VRAM)
# The limit a temperature is drawn and judged against, the first a GPU has: the hottest
# sensor's own (amdgpu hwmon's crit), else the GPU's: the one where the GPU starts to slow
# itself down, which the health verdict counts as degraded (docs/health.md), before the
# one where it shuts down. NVIDIA's memory sensor has a limit of its own.
CRITICAL_THRESHOLDS = ("critical", "slowdown", "shutdown", "max_operating")
SENSOR_THRESHOLDS: dict[str, str] = {Sensor.MEMORY: "memory_max_operating"}
GIB = float(1 << 30)


def hottest(d: DeviceSample) -> tuple[str, float] | None:
    """(sensor, °C) of the GPU's hottest sensor (the one its health and Grafana watch)."""
    temps = d.temperatures_celsius
    if not temps:
        return None
    order: dict[str, int] = {s: i for i, s in enumerate(TEMPERATURE_SENSORS)}
    sensor = min(temps, key=lambda s: (-float(temps[s]), order.get(s, len(order)), s))
    return str(sensor), float(temps[sensor])
# Samples per GPU one page or /api/v1/history serves at most (every k-th beyond it): a
# day of 1 s samples on 8 GPUs was a 22 MiB body and +206 MiB while it was built.
MAX_POINTS = 1_000


def temperature(d: DeviceSample) -> float | None:
    """The hottest sensor's temperature: what the page's chart and table show."""
    hot = hottest(d)
    return None if hot is None else hot[1]


def critical(d: DeviceSample, sensor: str) -> float | None:
    """The temperature at which ``sensor`` is critical: its own limit where the source
    reads one per sensor (amdgpu hwmon), else the GPU's threshold."""
    for name in CRITICAL_THRESHOLDS:
        limit = d.temperature_limits_celsius.get((sensor, name))
        if limit is not None:
            return float(limit)
    thresholds = d.temperature_thresholds_celsius
    own = SENSOR_THRESHOLDS.get(sensor)
    if own is not None and own in thresholds:
        return float(thresholds[own])
    return next((float(thresholds[n]) for n in CRITICAL_THRESHOLDS if n in thresholds), None)


def heat(celsius: float | None, limit: float | None) -> str:
    """cool / warm / hot / critical: a share of the critical limit (below 60 %, 85 %,
    100 %, at or above it), or with no known limit 50 / 75 °C and above."""
    if celsius is None:
        return ""
    if limit:
        share = celsius / limit
        return ("cool" if share < 0.6 else "warm" if share < 0.85 else
                "hot" if share < 1.0 else "critical")
    return "cool" if celsius < 50 else "warm" if celsius < 75 else "hot"


def memory_ratio(d: DeviceSample) -> float | None:
    if d.memory_used_bytes is None or not d.memory_total_bytes:
        return None
    return min(1.0, max(0.0, d.memory_used_bytes / d.memory_total_bytes))


def top_processes(d: DeviceSample) -> tuple[tuple[dict[str, Any], ...], int]:
    """The TOP_PROCESSES processes using the most memory, largest first, as the page shows
    them (pid, process, memory_bytes or None, pod as namespace/pod or "", container or "",
    utilization: the busiest engine's share or None), and how many more there are. The
    one ranking behind the server render, the JSON and ``gpu-exporter top``."""
    top = sorted(d.processes, key=lambda p: -(p.memory_used_bytes or 0))[:TOP_PROCESSES]
    rows = tuple({"pid": p.pid, "process": p.process, "memory_bytes": p.memory_used_bytes,
                  "pod": f"{p.namespace}/{p.pod}" if p.pod else "",
                  "container": p.container or "",
                  "utilization": max(p.utilization_ratio.values(), default=None)}
                 for p in top)
    return rows, len(d.processes) - len(rows)


def _fmt(value: float | None, unit: str, digits: int = 0) -> str:
    return "no data" if value is None else f"{value:.{digits}f} {unit}"


def _pct(ratio: float | None) -> str:
    return "no data" if ratio is None else f"{100 * ratio:.0f} %"


def device_state(d: DeviceSample, health: Verdict | None, stale: bool, gpu: str) -> dict[str, Any]:
    """One whole GPU as the page's tables and ``gpu-exporter top`` show it: identity,
    state (up, down, stale), the current values (``null``: never reported, never 0),
    the hottest sensor with its critical limit and heat, the health verdict with its
    reasons, and ``cells``, the page's table text, so the server render and the page's
    refresh write the same words."""
    hot = hottest(d)
    sensor, celsius = hot if hot is not None else ("", None)
    limit = critical(d, sensor) if hot is not None else None
    engines = d.engine_utilization_ratio
    clocks = d.clocks_hertz
    fans = list(d.fan_speed_ratio.values())
    state = "stale" if stale else "down" if not d.up else "up"  # stale: its values unknown
    status = STATUS_NAMES[health.status] if health is not None else ""
    reasons = [{"check": f.check, "status": STATUS_NAMES[f.status], "reason": f.reason}
               for f in health.findings] if health is not None else []
    used, total = d.memory_used_bytes, d.memory_total_bytes
    free = d.memory_free_bytes
    if free is None and used is not None and total:
        free = max(0.0, total - used)
    mem = memory_ratio(d)
    memory_text = "no data" if used is None else (
        f"{used / GIB:.1f} / {(total or 0) / GIB:.1f} GiB"
        + ("" if mem is None else f" ({100 * mem:.0f} %)"))
    temp_text = "no data" if celsius is None else (
        f"{celsius:.0f} °C {sensor}" + ("" if limit is None else f" (critical {limit:.0f})"))
    power_text = _fmt(d.power_watts, "W") + (
        "" if d.power_limit_watts is None or d.power_watts is None
        else f" / {d.power_limit_watts:.0f} W")
    return {
        "gpu": gpu, "name": d.info.name or d.info.uuid, "vendor": d.info.vendor,
        "uuid": d.info.uuid, "state": state,
        "utilization": d.utilization_ratio,
        "memory_utilization": d.memory_utilization_ratio,
        "encoder": engines.get("encoder"), "decoder": engines.get("decoder"),
        "memory_used_bytes": used, "memory_total_bytes": total, "memory_free_bytes": free,
        "power_watts": d.power_watts, "power_limit_watts": d.power_limit_watts,
        "temperature": {"sensor": sensor, "celsius": celsius, "critical": limit,
                        "heat": heat(celsius, limit)} if hot is not None else None,
        "temperatures": {str(k): float(v) for k, v in d.temperatures_celsius.items()},
        "fan": max(fans) if fans else None,
        "clocks": {c: clocks.get(c) for c in (Clock.GRAPHICS, Clock.MEMORY, Clock.SM)},
        "pcie": {"generation": d.pcie_link_generation, "width": d.pcie_link_width,
                 "max_generation": d.pcie_link_max_generation,
                 "max_width": d.pcie_link_max_width,
                 "tx": d.pcie_throughput_bytes_per_second.get("tx"),
                 "rx": d.pcie_throughput_bytes_per_second.get("rx")},
        "health": {"status": status, "reasons": reasons},
        "cells": {"state": state, "utilization": _pct(d.utilization_ratio),
                  "memory": memory_text, "power": power_text, "temperature": temp_text,
                  "health": status or "no data"},
    }


def backend_state(s: BackendState) -> dict[str, Any]:
    """One backend as the page's backends table shows it."""
    return {"backend": s.name, "state": "stale" if s.stale else "up" if s.up else "down",
            "reason": "no completed collection within --stale-after" if s.stale else s.reason,
            "devices": len(s.last.devices) if s.last else 0}


def current(snapshot: Snapshot) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every whole GPU (``device_state``) and every backend (``backend_state``) of a
    snapshot: what the page's tables show, from the one function for both the server
    render and ``/api/v1/history``."""
    stale = {dev.info.key for s in snapshot.backends if s.stale and s.last is not None
             for dev in s.last.devices}
    verdicts = {gpu: v for gpu, _, v in snapshot.health}
    devices = [device_state(d, verdicts.get(gpu), d.info.key in stale, gpu)
               for gpu, d in snapshot.devices if not d.info.parent_key]
    return devices, [backend_state(s) for s in snapshot.backends]


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
        # per GPU: its top processes and the count of the others, replaced on each sample
        self._top: dict[str, tuple[tuple[dict[str, Any], ...], int]] = {}
        self._last: dict[str, float] = {}
        # The latest recorded snapshot, whose tables (``current``) are built when a page
        # asks (once per snapshot), not on every sample; None until the first is
        # recorded (the JSON's null: "not known yet", not "none").
        self._recorded: Snapshot | None = None
        self._tables: tuple[Snapshot, list[dict[str, Any]], list[dict[str, Any]]] | None = None
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

    def add(self, snapshot: Snapshot, now: float | None = None) -> None:
        """Hub listener: one sample per GPU per interval from the snapshot's merged devices."""
        # Backends publish several times an interval: before anything else, keep the
        # first of each interval, so a publish in between costs nothing here (the
        # snapshot arrives merged: exporter.state.merged_view).
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
                self._top[gpu] = top_processes(d)
                ring.append((round(label, 3), *(_finite(s.read(d)) for s in SERIES)))
            for gpu in [g for g, t in self._last.items() if mono - t > self.window]:
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

    def tables(self) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
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

    def as_json(self, since: float = 0.0, now: float | None = None,
                otlp: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The body of ``/api/v1/history``: columns per GPU, ``null`` where unknown, the
        server's clock (``now``), which the page's charts are drawn against, and, whatever
        ``since`` (they replace what the page has), each GPU's top processes, every whole
        GPU's current state (``devices``), every backend's (``backends``) and the OTLP
        pusher's (``otlp``, where it runs)."""
        gpus = []
        devices, backends = self.tables()
        with self._lock:
            copies = {gpu: ring.columns(since) for gpu, ring in self._rings.items()}
        for gpu, cols in sorted(copies.items(), key=lambda kv: _gpu_order(kv[0])):
            columns: dict[str, Any] = {"gpu": gpu, "name": self._names.get(gpu, ""),
                                       "t": cols[0]}
            for i, s in enumerate(SERIES, start=1):
                columns[s.key] = cols[i]
            gpus.append(columns)
        if now is None:
            with self._lock:
                now = self._now(None)[1]
        return {"now": round(now, 3),
                "interval": self.interval, "window": self.window, "capacity": self.capacity,
                "series": [{"key": s.key, "title": s.title, "unit": s.unit, "max": s.high}
                           for s in SERIES],
                "gpus": gpus, "processes": self.processes(), "devices": devices,
                "backends": backends,
                "otlp": None if otlp is None else {
                    "state": "failing" if otlp.get("last_error") else "ok",
                    "detail": str(otlp.get("last_error") or otlp.get("endpoint") or "")}}


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def fan_out(*listeners: Callable[[Snapshot], None]) -> Callable[[Snapshot], None]:
    """One Hub listener that calls each of ``listeners`` in turn (renderer, history)."""
    def publish(snapshot: Snapshot) -> None:
        for listener in listeners:
            listener(snapshot)
    return publish
