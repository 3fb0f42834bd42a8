"""Snapshot -> cached exposition bytes: the renderer's thread, its cache and its schedule.

The exposition is rendered on the renderer's thread, for text 0.0.4 and OpenMetrics and
their gzip forms, at most once per snapshot and format and only for formats someone
scrapes; ``/metrics`` returns bytes. Each render builds its own collector, bound to the
snapshot and the options in force (``SnapshotCollector``): nothing is shared between
renders, and a reload's new selection is the options the next render is bound to. The
families come from ``render.families`` (the devices) and ``render.selfmetrics`` (the
exporter itself).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import gzip
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from prometheus_client import exposition as text_format
from prometheus_client.core import Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.openmetrics import exposition as om_format
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from exporter.output.render.families import RenderOptions, device_families
from exporter.output.render.joins import join_families
from exporter.output.render.selection import Filtered, Selection
from exporter.output.render.selfmetrics import exporter_families
from exporter.output.render.telemetry import Telemetry
from exporter.pipeline.state import Snapshot
from exporter.sources.readers import Readers

TEXT_CONTENT_TYPE = getattr(text_format, "CONTENT_TYPE_PLAIN_0_0_4",
                            "text/plain; version=0.0.4; charset=utf-8")
OPENMETRICS_CONTENT_TYPE = om_format.CONTENT_TYPE_LATEST
T = TypeVar("T")
ESCAPING = "allow-utf-8"  # prometheus_client's ALLOWUTF8


def snapshot_families(s: Snapshot, opts: RenderOptions | None = None,
                      threads: Mapping[str, Sequence[threading.Thread]] | None = None,
                      otlp: Mapping[str, int] | None = None,
                      reload: tuple[bool, float] | None = None,
                      connections: Mapping[str, int] | None = None) -> Iterator[Metric]:
    """Every family of a snapshot; ``otlp``: the OTLP pusher's counts (--otlp.endpoint);
    ``reload``: the daemon's last configuration reload (exporter.app.reload);
    ``connections``: the HTTP server's evictions (exporter.serve.slots)."""
    opts = opts or RenderOptions()
    yield from device_families(s, opts)
    yield from opts.selection.keep(join_families(s))
    yield from opts.selection.keep(exporter_families(s, threads or {}, otlp, reload,
                                                     connections))


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity, as registries do
class SnapshotCollector:
    """One render's families: a snapshot, bound to the options in force when its render
    was asked for. Built per render and never changed, so renders need no lock and a
    reload (a new selection) changes only which collector the next render builds."""

    snapshot: Snapshot
    options: RenderOptions
    threads: Mapping[str, Sequence[threading.Thread]]  # label -> threads (CPU time)
    otlp: Mapping[str, int] | None = None  # the OTLP pusher's counts (--otlp.endpoint)
    reload: tuple[bool, float] | None = None  # the last configuration reload
    connections: Mapping[str, int] | None = None  # the HTTP server's evictions

    def describe(self) -> list[Metric]:
        return []  # so registering never calls collect()

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        threads = {**{name: (t,) for name, t in s.threads.items()}, **self.threads}
        yield from snapshot_families(s, self.options, threads, self.otlp, self.reload,
                                     self.connections)


class Variant(str, enum.Enum):
    """One form of the exposition: a format, gzipped or not (negotiated per scrape by
    exporter.serve.server.negotiate)."""

    TEXT = "text"
    TEXT_GZIP = "text+gzip"
    OPENMETRICS = "openmetrics"
    OPENMETRICS_GZIP = "openmetrics+gzip"

    @property
    def openmetrics(self) -> bool:
        return self in (Variant.OPENMETRICS, Variant.OPENMETRICS_GZIP)

    @property
    def gzip(self) -> bool:
        return self in (Variant.TEXT_GZIP, Variant.OPENMETRICS_GZIP)

    @property
    def plain(self) -> Variant:
        """The same format, not compressed."""
        return Variant.OPENMETRICS if self.openmetrics else Variant.TEXT

    @property
    def content_type(self) -> str:
        return OPENMETRICS_CONTENT_TYPE if self.openmetrics else TEXT_CONTENT_TYPE

    @classmethod
    def of(cls, openmetrics: bool, gzip: bool) -> Variant:
        if openmetrics:
            return cls.OPENMETRICS_GZIP if gzip else cls.OPENMETRICS
        return cls.TEXT_GZIP if gzip else cls.TEXT


VARIANTS = tuple(Variant)
WANT_TTL = 300.0  # a format nobody asked for in 5 minutes is no longer rendered ahead


class _Demand:
    """When one format was last asked for, and the gap before that: the scrape cadence.

    Prometheus scrapes on a fixed cadence, usually much slower than the collection
    interval; rendering every snapshot ahead of time would render fifteen to serve one.
    So at most one snapshot is rendered ahead per expected scrape, the first one that
    comes within ``lead`` seconds of it. A scrape that comes early, or after a newer
    snapshot, still gets the newest snapshot, rendered on the spot.
    """

    def __init__(self) -> None:
        self.last: float | None = None
        self.period: float | None = None
        self.ahead = False  # a snapshot was rendered ahead since the last request

    def asked(self, now: float) -> None:
        if self.last is not None:
            self.period = now - self.last
        self.last = now
        self.ahead = False

    def due(self, now: float, lead: float) -> bool:
        """Render ahead only once the scrape cadence is known (two requests), once per
        expected scrape: before that a snapshot rendered ahead is almost always replaced
        before anyone asks."""
        if self.last is None or self.period is None or self.ahead or \
                now - self.last > WANT_TTL:
            return False
        return now - self.last >= self.period - lead


class Exposition:
    """The bytes of one snapshot under one set of options, in every format, rendered on
    demand and kept."""

    def __init__(self, snapshot: Snapshot, options: RenderOptions,
                 render: Callable[[Snapshot, RenderOptions, bool], bytes]) -> None:
        self.snapshot = snapshot
        self.options = options
        self._render = render
        self._bodies: dict[Variant, bytes] = {}
        self._lock = threading.Lock()

    def cached(self, variant: Variant) -> bytes | None:
        return self._bodies.get(variant)

    def body(self, variant: Variant) -> bytes:
        variant = Variant(variant)
        cached = self._bodies.get(variant)
        if cached is not None:
            return cached
        with self._lock:
            if variant not in self._bodies:
                plain = variant.plain
                raw = self._bodies.get(plain)
                if raw is None:
                    raw = self._bodies[plain] = self._render(self.snapshot, self.options,
                                                             plain.openmetrics)
                if variant.gzip:
                    self._bodies[variant] = gzip.compress(raw, compresslevel=6)
            return self._bodies[variant]


class Busy(Exception):
    """A bounded Worker's queue is full: the caller answers 503."""


class Worker:
    """One named thread that runs what it is given, in order: the renderer's, and the
    pages' (``limit``: at most that many waiting; more raise Busy).

    Renders (ahead of a scrape, or cold for a scrape that came early) run on the
    renderer's; the landing page, ``/api/v1/history`` and the ``/snapshot`` JSON on the
    pages' thread: never on the HTTP server's event loop, and never in front of a
    ``/metrics`` render or the snapshot it serves. Their CPU time is reported as the
    renderer's (``gpu_exporter_backend_cpu_seconds_total{backend="renderer"}``). A
    call whose future is cancelled before it starts (its client hung up) is skipped.
    Started on first use.
    """

    def __init__(self, name: str, limit: int | None = None) -> None:
        self.name = name
        self.limit = limit
        self.thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = \
            queue.SimpleQueue()
        self._waiting = 0
        self._stopped = False
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """``fn``'s future; once stopped, a future already cancelled (nothing runs)."""
        future: Future[T] = Future()
        with self._lock:
            if self._stopped:
                future.cancel()
                return future
            if self.limit is not None and self._waiting >= self.limit:
                raise Busy(self.name)
            self._waiting += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self.thread.start()
            self._queue.put((fn, future))
        return future

    @property
    def waiting(self) -> int:
        return self._waiting

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            with self._lock:
                self._waiting -= 1
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits for it
                future.set_exception(e)

    def stop(self, timeout: float = 2.0) -> None:
        """No call starts after this; what is queued runs, then the thread ends (waited
        for up to ``timeout``). Only the first call does anything."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            thread = self.thread
            self._queue.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


PAGE_QUEUE = 4  # page, history and snapshot renders waiting at most: more are 503


class Renderer:
    """Receives snapshots (from the Hub), renders them off the request path, serves bytes.

    Rendering runs on the renderer's own thread (``Worker``), so snapshots published in
    quick succession by several backends coalesce into one render, and only formats that
    scrapers ask for are rendered, shortly before they are expected to ask (see _Demand).
    A snapshot nobody scrapes is never rendered.
    """

    def __init__(self, lead: float = 2.0, options: RenderOptions | None = None,
                 telemetry: Telemetry | None = None, readers: Readers | None = None) -> None:
        self.lead = lead  # render ahead when a scrape is due within this many seconds
        # Every /metrics request counts as a read (exporter.sources.readers): the backends
        # take the readings only a reader sees when one came since.
        self.readers = readers or Readers()
        # The options in force: replaced whole on a reload (select()), never changed.
        self.options = options or RenderOptions()
        self.worker = Worker("renderer")
        self.pages = Worker("pages", PAGE_QUEUE)  # the page, its history, /snapshot
        self.telemetry = telemetry or Telemetry()  # the exporter's own threads, OTLP, reload
        # The process, platform and gc collectors (a throwaway registry: GCCollector
        # must register somewhere); each render puts them behind its own selection.
        scratch = CollectorRegistry()
        self._python = tuple(make(registry=scratch)
                             for make in (ProcessCollector, PlatformCollector, GCCollector))
        self._demand = {variant: _Demand() for variant in VARIANTS}
        self._pending: Snapshot | None = None
        self._scheduled = False
        self._lock = threading.Lock()
        self.current: Exposition | None = None
        self.coalesce = 0.02  # let backends that tick together land in one render

    def registry(self, snapshot: Snapshot, options: RenderOptions) -> CollectorRegistry:
        """One render's registry: the snapshot's collector bound to ``options``, and the
        process, platform and gc collectors behind its selection."""
        threads = {**self.telemetry.threads.as_dict(), "renderer": tuple(
            w.thread for w in (self.worker, self.pages) if w.thread is not None)}
        status = self.telemetry.otlp_status()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(
            snapshot, options, threads, None if status is None else status["exports"],
            self.telemetry.reload_status(), self.telemetry.connection_counts()))
        for collector in self._python:
            registry.register(Filtered(collector, options.selection))
        return registry

    def select(self, selection: Selection) -> None:
        """Serve ``selection`` from now on (a reload, exporter.app.reload): the next render is
        bound to the new options, and the current snapshot's bodies, rendered under the
        old ones, are no longer served (its next scrape renders it again)."""
        options = dataclasses.replace(self.options, selection=selection)
        with self._lock:
            self.options = options
            if self.current is not None:
                self.current = Exposition(self.current.snapshot, options, self._render_bytes)

    def _render_bytes(self, snapshot: Snapshot, options: RenderOptions,
                      openmetrics: bool) -> bytes:
        registry = self.registry(snapshot, options)
        # Every name here is a legacy Prometheus name, so "allow-utf-8" writes the
        # same bytes as the default "underscores", which checks each label name
        # character by character: 40 % of an OpenMetrics render (bench on H100).
        if openmetrics:
            body: bytes = om_format.generate_latest(  # type: ignore[no-untyped-call]
                registry, escaping=ESCAPING)
            return body
        return text_format.generate_latest(registry, escaping=ESCAPING)

    def render_now(self, snapshot: Snapshot, ahead: bool = True) -> Exposition:
        """Make ``snapshot`` current, rendering it in the formats due to be asked for soon
        (none with ``ahead`` False)."""
        exposition = Exposition(snapshot, self.options, self._render_bytes)
        now = time.monotonic()
        for variant, demand in self._demand.items():
            if ahead and demand.due(now, self.lead):
                demand.ahead = True
                exposition.body(variant)
        with self._lock:  # not interleaved with select()
            if exposition.options is not self.options:  # a reload came: not served
                exposition = Exposition(snapshot, self.options, self._render_bytes)
            current = self.current
            if current is None or snapshot.generation >= current.snapshot.generation:
                self.current = exposition
        return exposition

    def body(self, variant: Variant) -> tuple[bytes, Snapshot]:
        """The current snapshot's bytes, rendered on the calling thread if not cached."""
        self._demand[variant].asked(time.monotonic())
        self.readers.read()
        exposition = self.current
        assert exposition is not None, "Renderer.body() before the first snapshot"
        return exposition.body(variant), exposition.snapshot

    async def body_async(self, variant: Variant) -> tuple[bytes, Snapshot]:
        """As body(), for the event loop: a cold render runs on the renderer's thread."""
        self._demand[variant].asked(time.monotonic())
        self.readers.read()
        exposition = self.current
        assert exposition is not None, "Renderer.body() before the first snapshot"
        body = exposition.cached(variant)
        if body is None:
            body = await asyncio.wrap_future(self.worker.call(lambda: exposition.body(variant)))
        return body, exposition.snapshot

    # -- rendering ahead ------------------------------------------------------------------
    def submit(self, snapshot: Snapshot) -> None:
        """Hub listener: remember the newest snapshot; the worker picks it up once. Where
        no format is due to be rendered ahead (most snapshots: scrapes come every 15 s or
        so), it becomes current right here, on the publishing thread: there is nothing
        to render, so no thread is woken (at a 100 ms interval the wake-up was a tenth
        of the daemon's CPU)."""
        with self._lock:
            pending = self._pending
            if pending is None or snapshot.generation > pending.generation:
                self._pending = pending = snapshot
            if self._scheduled:
                return
            now = time.monotonic() + self.coalesce
            inline = not any(d.due(now, self.lead) for d in self._demand.values())
            if inline:
                self._pending = None
            else:
                self._scheduled = True
        if inline:
            self.render_now(pending, ahead=False)
        else:
            self.worker.call(self._render_pending)

    def _render_pending(self) -> None:
        time.sleep(self.coalesce)
        with self._lock:
            snapshot, self._scheduled = self._pending, False
        if snapshot is not None:
            self.render_now(snapshot)

    def stop(self, timeout: float = 2.0) -> None:
        """Its threads end (the Daemon calls this once the Hub no longer publishes)."""
        deadline = time.monotonic() + timeout
        self.worker.stop(timeout)
        self.pages.stop(max(0.0, deadline - time.monotonic()))
