"""The collection hub: one sampling thread per backend, one thread that publishes.

Each backend thread opens its backend (once; reopened with back-off after it
fails), samples it on a fixed cadence with the slow tier every
``--collector.slow-interval``, and records the result in the Hub. One publishing
thread merges what the backends recorded into an immutable ``Snapshot``
(exporter.pipeline.state; swapped atomically) and hands it to the subscribers (the
renderer, the live page's history) in generation order. A backend thread never
merges and never runs a subscriber: it records its cycle under the Hub's lock and
wakes the publisher. Backends that tick together (a shared epoch) are merged once:
the publisher waits for those still sampling, up to an interval (one stuck in a
driver call is not waited for).

Failure handling, all here: a backend whose open() fails, whose handle goes bad
(BackendFailed) or whose sample() raises is closed and reopened with a back-off
that is carried across opens and reset only after several good cycles; its devices
stay with ``gpu_up 0``. A backend that cannot open costs nothing between its retries:
it is not asked every cycle, only on the back-off (capped by its ``retry_interval``)
and at once when ``reprobe()`` says something appeared (a DRM card added), after
which its back-off starts from the bottom. A watchdog notices a backend that stopped
answering (stuck inside a driver call, even in its very first sample) and publishes it as stale, so
its device series are withdrawn (``gpu_up 0`` stays, also for the devices its open()
returned when no sample ever completed) while everything else keeps being served. Ages
are measured on the monotonic clock: an NTP step changes nothing. How a backend's record
and the GPU numbering change, and their log lines, are exporter.pipeline.hubstate's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeAlias

from exporter.core import logs
from exporter.core.config import Config
from exporter.core.labels import ErrorReason
from exporter.core.model import BackendSample
from exporter.pipeline import hubstate
from exporter.pipeline.energy_split import EnergySplit
from exporter.pipeline.merge import cap_processes as cap_processes  # the rule, for tests and bench
from exporter.pipeline.state import BackendState, CutCounter, Snapshot, merged_view
from exporter.sources.base import (
    REOPEN_BACKOFF,
    Backend,
    BackendFailed,
    BackendUnavailable,
    Cycle,
)

Subscriber: TypeAlias = Callable[[Snapshot], None]  # gets every published snapshot, in order

TIMING_INTERVAL = 60.0  # seconds between two debug lines of one backend's cycle time

GOOD_CYCLES_TO_RESET = 3  # good cycles in a row before the back-off starts from the bottom
OPEN_WAIT = 5.0  # how long start() waits for every backend's first open before numbering GPUs
# How long the publisher waits for a backend whose tick has come before its thread
# starts the cycle (woken with the others, then waiting for the interpreter).
TICK_GRACE = 0.02


class Clock:
    """The Hub's monotonic clock and its waits (cadence, back-off, watchdog): the real
    one by default; a test passes one whose time it steps, so back-off needs no sleep."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait ``seconds`` or until ``stop`` is set; True when it is set."""
        return stop.wait(seconds)


def _close_quietly(backend: Backend) -> None:
    """Close a backend; a library that fails to close must not stop a re-open or shutdown."""
    try:
        backend.close()
    except Exception:  # noqa: BLE001
        pass


class Hub:
    """Holds the latest state of every backend and publishes Snapshots."""

    def __init__(self, config: Config, backends: Sequence[Backend],
                 subscribers: Sequence[Subscriber] = (),
                 wall_clock: Callable[[], float] = time.time, clock: Clock | None = None
                 ) -> None:
        self.config = config
        self.wall_clock = wall_clock  # timestamps shown to people; never used for ages
        self.clock = clock or Clock()  # ages, cadence and back-off
        self.backends = list(backends)
        self._subscribers = list(subscribers)
        # Backend threads, the watchdog and start() record under _lock and wake the
        # publishing thread (_publish_loop); only it merges and runs the subscribers.
        self._lock = threading.Lock()
        self._states = {b.name: BackendState(b.name, priority=b.priority) for b in self.backends}
        self._watch = hubstate.Watchdog(config, self.backends)
        self._gpus = hubstate.KnownGpus()  # numbering and gone devices, under _lock
        self._threads_by_backend: Mapping[str, threading.Thread] = {}
        self._timing = logs.Every(TIMING_INTERVAL)  # --log.level debug: cycle times
        self._cuts = CutCounter()  # fed by _build only, under _publish_lock
        self._publish_lock = threading.Lock()  # one build at a time: generations in order
        # Per-process energy: fed each published generation, windows up to a few of the
        # slowest per-process tier (exporter.pipeline.energy_split).
        self.energy = EnergySplit(
            reading_interval=config.slow_interval,
            max_window=2 * max(config.slow_interval, config.processes_interval) + config.interval,
            clock=self.clock.now, intervals={"fdinfo": config.processes_interval})
        self._generation = 0
        # backend -> when its cycle in flight started: the publisher waits for backends
        # of the same tick before it merges (_due), so they merge once, not once each.
        self._sampling: dict[str, float] = {}
        # backend -> the tick its next cycle starts at, while it waits for it: one whose
        # tick has come but whose thread has not started yet is waited for too (TICK_GRACE)
        self._next_tick: dict[str, float] = {}
        self._pending = False  # something changed since the last publish (under _lock)
        self._wake = threading.Event()  # set when _pending is, or a cycle ends, or stop
        self._publisher: threading.Thread | None = None
        self._stop = threading.Event()
        self._life = threading.Lock()  # start() and stop(): no thread started after a stop
        self._threads: list[threading.Thread] = []
        self._all_attempted = threading.Event()
        # Per backend: set by reprobe() (and stop()) to end the wait of one that could
        # not open, so it retries now instead of at its next back-off step.
        self._probes = {b.name: threading.Event() for b in self.backends}
        self._published = threading.Condition()  # notified after each publish, and on stop
        with self._publish_lock:
            self.snapshot = self._build()

    # -- lifecycle ----------------------------------------------------------------------
    def subscribe(self, subscriber: Subscriber) -> None:
        """``subscriber`` gets every snapshot published from now on, on the publishing
        thread, in generation order (before start(), or it misses the ones before)."""
        self._subscribers.append(subscriber)

    def start(self) -> None:
        """The publishing thread and a thread per backend, then (once each has tried its
        first open, OPEN_WAIT at most) the GPU numbering, a first publish and the
        watchdog. A stop() that comes meanwhile wins: no thread is started after it."""
        epoch = self.clock.now()
        threads: dict[str, threading.Thread] = {}
        with self._life:
            if self._stop.is_set():
                return
            self._start_publisher()
            for backend in self.backends:
                t = threading.Thread(target=self._run, args=(backend, epoch),
                                     name=f"collector-{backend.name}", daemon=True)
                t.start()
                self._threads.append(t)
                threads[backend.name] = t
        if not self.backends:
            self._all_attempted.set()
        self._all_attempted.wait(OPEN_WAIT)
        if self._stop.is_set():
            return
        with self._lock:
            self._threads_by_backend = MappingProxyType(threads)
            self._gpus.number()
            numbered = self._generation
        # The publishing thread publishes it; start() returns once it has, so the
        # snapshot then holds every backend's first open (up, or down with the reason).
        self.request_publish()
        with self._published:
            self._published.wait_for(
                lambda: self.snapshot.generation > numbered or self._stop.is_set(), OPEN_WAIT)
        with self._life:
            if self._stop.is_set():
                return
            w = threading.Thread(target=self._watchdog, name="collector-watchdog", daemon=True)
            w.start()
            self._threads.append(w)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the threads, then close every backend; a thread stuck inside a driver call
        is a daemon and is left. Only the first call does anything."""
        with self._life:
            if self._stop.is_set():
                return
            self._stop.set()
            self._wake.set()  # the publisher leaves its wait, and ends
            for probe in self._probes.values():  # a backend waiting to retry its open ends
                probe.set()
            self._all_attempted.set()  # a start() waiting for first opens goes on, and ends
            threads = list(self._threads)
        with self._published:
            self._published.notify_all()  # ... as does one waiting for its first publish
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for backend in self.backends:
            _close_quietly(backend)

    def _start_publisher(self) -> None:
        """The publishing thread (start() starts it; called with ``_life`` held)."""
        t = threading.Thread(target=self._publish_loop, name="collector-publish", daemon=True)
        self._publisher = t
        t.start()
        self._threads.append(t)

    def reprobe(self) -> None:
        """Something appeared that may let a backend that could not open open now (the
        DRM discovery calls it for a card added): each such backend retries at once,
        its back-off from the bottom. A backend that is up is not disturbed."""
        for probe in self._probes.values():
            probe.set()

    def collect_once(self) -> Snapshot:
        """Open and sample every backend once, synchronously (``gpu-exporter snapshot``);
        with no publishing thread, each change is published on the calling thread."""
        for backend in self.backends:
            if self._open(backend):
                self._sample(backend, slow=True)
        with self._lock:
            self._gpus.number()
        return self.publish()

    # -- backend threads ----------------------------------------------------------------
    def _run(self, backend: Backend, epoch: float) -> None:
        # Back-off steps taken so far. Carried across a successful open: a backend that
        # opens and then fails its first cycles (a sample that always raises, NVML with
        # its only GPU lost for good) backs off like one that cannot open at all, and
        # starts from the bottom again only after GOOD_CYCLES_TO_RESET good cycles.
        attempt = 0
        probe = self._probes[backend.name]
        while not self._stop.is_set():
            probe.clear()  # a reprobe() from now on ends the wait below
            if self._open(backend):
                good = self._loop(backend, epoch)
                if self._stop.is_set():
                    return
                if good >= GOOD_CYCLES_TO_RESET:
                    attempt = 0
                delay = REOPEN_BACKOFF[min(attempt, len(REOPEN_BACKOFF) - 1)]
                attempt += 1
                self.clock.wait(self._stop, delay)
                continue
            # Down: retried on the back-off, which a backend whose open() is cheap (a
            # cached DRM listing, a socket check) caps at its retry_interval, not every
            # cycle; a card added (reprobe) ends the wait and starts the back-off over.
            delay = REOPEN_BACKOFF[min(attempt, len(REOPEN_BACKOFF) - 1)]
            retry = backend.capabilities.retry_interval
            if retry is not None:
                delay = min(delay, retry)
            attempt += 1
            if self.clock.wait(probe, delay) and not self._stop.is_set():
                attempt = 0

    def _loop(self, backend: Backend, epoch: float) -> int:
        """Sample on the cadence until the handle goes bad; returns the good cycles in a row
        at the end (what decides whether the back-off starts over)."""
        interval = backend.interval or self.config.interval
        next_slow = 0.0
        good = 0
        while not self._stop.is_set():
            now = self.clock.now()
            slow = now >= next_slow
            if slow:
                next_slow = now + self.config.slow_interval
            healthy = self._sample(backend, slow)
            if healthy is None:
                return good  # handle went bad: back to _run, which reopens with back-off
            good = good + 1 if healthy else 0
            if good == GOOD_CYCLES_TO_RESET:
                with self._lock:
                    self._states[backend.name] = hubstate.recovered(self._states[backend.name])
            # Fixed cadence aligned on a shared epoch, so backends publish together and
            # renders coalesce; a cycle that overran skips the ticks it missed.
            now = self.clock.now()
            next_tick = epoch + (int((now - epoch) / interval) + 1) * interval
            with self._lock:
                self._next_tick[backend.name] = next_tick
            self.clock.wait(self._stop, next_tick - now)
        return good

    def _open(self, backend: Backend) -> bool:
        try:
            infos = backend.open()
        except BackendUnavailable as e:
            self._set_down(backend.name, str(e) or "unavailable", level="info")
            return False
        except Exception as e:  # noqa: BLE001 - a broken library must not kill the thread
            self._set_down(backend.name, f"open failed: {e!r}", level="error")
            return False
        with self._lock:
            self._states[backend.name] = hubstate.opened(self._states[backend.name],
                                                         len(infos), self.clock.now())
            self._gpus.opened(backend.name, backend.source, infos)
            self._check_attempted()
        return True

    def _sample(self, backend: Backend, slow: bool) -> bool | None:
        """One cycle. True: a good cycle; False: it ran but every device is down;
        None: the handle went bad or sample() raised (closed; reopen with back-off)."""
        with self._lock:
            self._sampling[backend.name] = self.clock.now()
        t0 = time.perf_counter()
        try:
            cycle = backend.sample(slow)
        except BackendFailed as e:
            _close_quietly(backend)
            self._set_down(backend.name, f"failed: {e}", level="warning", failing=True)
            self._finish(backend.name, changed=False)
            return None
        except Exception as e:  # noqa: BLE001 - a bug in one backend must not stop the others
            # Its devices stay (gpu_up 0, from its last sample); the traceback is logged
            # once per distinct error, the count goes to errors_total{reason="exception"}.
            _close_quietly(backend)
            with self._lock:
                self._states[backend.name] = hubstate.counted(self._states[backend.name],
                                                              {ErrorReason.EXCEPTION: 1})
            self._set_down(backend.name, f"sample raised {e!r}", level="error", exc_info=True,
                           failing=True)
            self._finish(backend.name, changed=False)
            return None
        duration = time.perf_counter() - t0
        if logs.debug_enabled() and self._timing.allow(backend.name) is not None:
            with self._lock:
                gpus = self._gpus.numbers_of(cycle.devices)
            hubstate.log_cycle(backend.name, cycle, duration, gpus)
        self._accept(backend.name, cycle, duration)
        self._finish(backend.name, changed=True)
        return not cycle.devices or any(d.up for d in cycle.devices)

    def _finish(self, name: str, changed: bool) -> None:
        """After a backend's cycle (``changed``: it recorded a sample): the publisher
        is woken, to publish or to stop waiting for this backend (_due)."""
        with self._lock:
            self._sampling.pop(name, None)
            self._next_tick.pop(name, None)  # (its loop sets the next one, if it goes on)
            self._pending = self._pending or changed
        self._woken(changed)

    def request_publish(self) -> None:
        """Something outside the cycles changed (the GPU numbering, a reload's process
        cap): the next snapshot is due."""
        with self._lock:
            self._pending = True
        self._woken(True)

    def _woken(self, changed: bool) -> None:
        if self._publisher is not None:
            self._wake.set()
        elif changed:  # no publishing thread (collect_once, tests): publish right here
            with self._lock:
                self._pending = False
            self.publish()

    # -- state changes (exporter.pipeline.hubstate says how, and logs) ---------------------------
    def _set_down(self, name: str, reason: str, level: str, exc_info: bool = False,
                  failing: bool = False) -> None:
        with self._lock:
            state = self._states[name]
            new = self._states[name] = hubstate.down(state, reason, level, exc_info, failing)
            self._check_attempted()
        # A backend that retries its open() every cycle (no card yet) changes nothing:
        # no new snapshot, so nothing to render.
        if new is not state and new != state:
            self.request_publish()

    def _accept(self, name: str, cycle: Cycle, duration: float) -> None:
        sample = BackendSample(backend=name, timestamp=self.wall_clock(), duration_seconds=duration,
                               devices=tuple(cycle.devices), errors=dict(cycle.errors))
        with self._lock:
            state = self._states[name]
            self._states[name] = hubstate.accepted(state, sample, self.clock.now(), cycle)
            self._gpus.accepted(cycle.devices)
            self._gpus.log_changes(state.last, sample)  # after accepted: the gpu index

    def _check_attempted(self) -> None:
        if all(s.attempted for s in self._states.values()):
            self._all_attempted.set()

    # -- watchdog and snapshots ---------------------------------------------------------
    def _watchdog(self) -> None:
        """Mark backends stale: wakes only when the next backend could go stale."""
        while True:
            now = self.clock.now()
            with self._lock:
                changed, timeout = self._watch.look(self._states, self._gpus, now)
            if changed:
                self.request_publish()
            if self.clock.wait(self._stop, timeout + 0.01):
                return

    def _build(self) -> Snapshot:
        """The next snapshot; called with ``_publish_lock`` held, so that generations, the
        merge and the cap's count go in one order. The Hub's state is copied under
        ``_lock``; the merge runs outside it (backend threads keep accepting samples)."""
        with self._lock:
            ready = all(s.attempted and (not s.up or s.last is not None or s.stale)
                        for s in self._states.values()) and self._gpus.numbered
            self._generation += 1
            generation, created = self._generation, self.wall_clock()
            backends = tuple(self._states.values())
            gpu_index = self._gpus.index()
            seen, threads = self._gpus.seen, self._threads_by_backend
        view = merged_view(backends, seen, gpu_index, self.config.max_processes_per_gpu,
                           created, self.config.health_xid_window, self.energy, generation)
        return Snapshot(generation=generation, created=created, ready=ready,
                        backends=backends, gpu_index=gpu_index, seen=seen,
                        max_processes_per_gpu=self.config.max_processes_per_gpu,
                        threads=threads, health_xid_window=self.config.health_xid_window,
                        devices=view.devices, health=view.health,
                        processes_truncated_total=self._cuts.add(view.cut),
                        estimate_errors_total=dict(self.energy.errors))

    def _publish_loop(self) -> None:
        """The publishing thread: sleeps until a change, waits for the backends of the
        same tick (_due), then publishes once for all of them."""
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                with self._lock:
                    wait = self._due(self.clock.now())
                    if wait is None:
                        publish, self._pending = self._pending, False
                        break
                self.clock.wait(self._wake, wait)  # a cycle that ends wakes it sooner
                self._wake.clear()
            else:
                return
            if publish:
                self.publish()

    def _due(self, now: float) -> float | None:
        """None when the pending snapshot can go out now, else how long to wait: while a
        backend that started sampling less than an interval ago is still at it (it ticks
        with the others, and its end wakes the publisher). One that takes longer (a
        driver call that hangs) is not waited for. Called with ``_lock`` held."""
        if not self._pending:
            return None
        left = [started + self.config.interval - now for started in self._sampling.values()
                if now - started < self.config.interval]
        # Its tick has come, its thread has not started the cycle yet (another thread
        # held the interpreter): a moment's wait, not a publish of its own after it.
        left += [tick + TICK_GRACE - now for tick in self._next_tick.values()
                 if tick <= now < tick + TICK_GRACE]
        return min(left) if left else None

    def publish(self) -> Snapshot:
        """Build, merge and hand the next snapshot to every subscriber, on the calling
        thread: the publishing thread's step, and collect_once's. One build at a time, so
        generations go out in order."""
        with self._publish_lock:
            snapshot = self._build()
            self.snapshot = snapshot
        for subscriber in self._subscribers:
            subscriber(snapshot)
        with self._published:
            self._published.notify_all()
        return snapshot
