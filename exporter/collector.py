"""The collection hub: one sampling thread per backend, and the immutable Snapshot.

Each backend thread opens its backend (once; reopened with back-off after it
fails), samples it on a fixed cadence with the slow tier every
``--collector.slow-interval``, and hands the result to the Hub. The Hub keeps the
latest sample of every backend and publishes an immutable ``Snapshot`` (swapped
atomically) to its listener, the renderer. A watchdog tick notices a backend that
stopped answering (stuck inside a driver call) and publishes it as stale, so its
device series are withdrawn while everything else keeps being served.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import structlog

from exporter.backends.base import Backend, BackendFailed, BackendUnavailable, Cycle
from exporter.config import Config
from exporter.model import BackendSample, DeviceInfo, DeviceSample

log = structlog.get_logger(__name__)

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
REOPEN_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # seconds between open attempts
OPEN_WAIT = 5.0  # how long start() waits for every backend's first open before numbering GPUs


@dataclass(frozen=True)
class BackendState:
    name: str
    up: bool = False
    reason: str = "not started"
    attempted: bool = False  # open() has been tried at least once
    stale: bool = False  # opened, but no completed cycle within --stale-after
    last: BackendSample | None = None
    last_success: float | None = None  # wall clock of the last completed cycle
    errors_total: Mapping[str, int] = field(default_factory=dict)
    duration_buckets: tuple[int, ...] = (0,) * len(DURATION_BUCKETS)
    duration_sum: float = 0.0
    duration_count: int = 0

    @property
    def serving(self) -> bool:
        """Its device values are exported (not withdrawn)."""
        return self.up and not self.stale and self.last is not None


@dataclass(frozen=True)
class Snapshot:
    generation: int
    created: float
    ready: bool  # every backend has completed a cycle or is known to be unavailable
    backends: tuple[BackendState, ...]
    gpu_index: Mapping[str, int]  # pci_bus_id -> exporter-wide "gpu" label
    identities: Mapping[str, DeviceInfo]  # pci_bus_id -> identity from a primary backend
    processes_truncated_total: int = 0


def cap_processes(device: DeviceSample, limit: int) -> tuple[DeviceSample, int]:
    """Keep the ``limit`` processes holding the most device memory; return how many were cut."""
    if len(device.processes) <= limit:
        return device, 0
    ranked = sorted(device.processes, key=lambda p: (-(p.memory_used_bytes or 0.0), p.pid))
    return device.with_processes(tuple(ranked[:limit])), len(device.processes) - limit


def _close_quietly(backend: Backend) -> None:
    """Close a backend; a library that fails to close must not stop a re-open or shutdown."""
    try:
        backend.close()
    except Exception:  # noqa: BLE001
        pass


class Hub:
    """Holds the latest state of every backend and publishes Snapshots."""

    def __init__(self, config: Config, backends: Sequence[Backend],
                 listener: Callable[[Snapshot], None] | None = None) -> None:
        self.config = config
        self.backends = list(backends)
        self.listener = listener
        self._lock = threading.Lock()
        self._states = {b.name: BackendState(b.name) for b in self.backends}
        # A backend on a slower tier of its own (the /proc scan) is stale only after
        # three of its own intervals, whatever --stale-after says for the fast tier.
        self._stale_after = {b.name: max(config.stale_after_seconds, 3 * (b.interval or 0))
                             for b in self.backends}
        self._gpu_index: dict[str, int] = {}
        self._numbered = False
        self._truncated = 0
        self._generation = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._all_attempted = threading.Event()
        self.snapshot = self._build()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        epoch = time.monotonic()
        for backend in self.backends:
            t = threading.Thread(target=self._run, args=(backend, epoch),
                                 name=f"collector-{backend.name}", daemon=True)
            t.start()
            self._threads.append(t)
        if not self.backends:
            self._all_attempted.set()
        self._all_attempted.wait(OPEN_WAIT)
        with self._lock:
            self._number_gpus()
        self.publish()
        w = threading.Thread(target=self._watchdog, name="collector-watchdog", daemon=True)
        w.start()
        self._threads.append(w)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the threads; a thread stuck inside a driver call is a daemon and is left."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for backend in self.backends:
            _close_quietly(backend)

    def collect_once(self) -> Snapshot:
        """Open and sample every backend once, synchronously (``gpu-exporter snapshot``)."""
        for backend in self.backends:
            if self._open(backend):
                self._sample(backend, slow=True)
        with self._lock:
            self._number_gpus()
        return self.publish()

    # -- backend threads ----------------------------------------------------------------
    def _run(self, backend: Backend, epoch: float) -> None:
        attempt = 0
        while not self._stop.is_set():
            if not self._open(backend):
                # A backend whose open() is cheap (a cached DRM listing) retries every
                # cycle, so a hotplugged card is picked up within one interval.
                delay = min(REOPEN_BACKOFF[min(attempt, len(REOPEN_BACKOFF) - 1)],
                            getattr(backend, "retry_interval", None) or float("inf"))
                attempt += 1
                self._stop.wait(delay)
                continue
            attempt = 0
            self._loop(backend, epoch)

    def _loop(self, backend: Backend, epoch: float) -> None:
        interval = backend.interval or self.config.interval
        next_slow = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            slow = now >= next_slow
            if slow:
                next_slow = now + self.config.slow_interval
            if not self._sample(backend, slow):
                return  # handle went bad: back to _run, which reopens with back-off
            # Fixed cadence aligned on a shared epoch, so backends publish together and
            # renders coalesce; a cycle that overran skips the ticks it missed.
            now = time.monotonic()
            next_tick = epoch + (int((now - epoch) / interval) + 1) * interval
            self._stop.wait(next_tick - now)

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
            state = self._states[backend.name]
            self._states[backend.name] = replace(state, up=True, reason="", attempted=True)
            if not state.up:
                log.info("backend up", backend=backend.name, gpus=len(infos))
            if self._numbered:
                for info in infos:
                    self._index_of(info.pci_bus_id)
            else:
                for info in infos:
                    self._gpu_index.setdefault(info.pci_bus_id, -1)
            self._check_attempted()
        return True

    def _sample(self, backend: Backend, slow: bool) -> bool:
        t0 = time.perf_counter()
        try:
            cycle = backend.sample(slow)
        except BackendFailed as e:
            _close_quietly(backend)
            self._set_down(backend.name, f"failed: {e}", level="warning")
            return False
        except Exception as e:  # noqa: BLE001 - a bug in one backend must not stop the others
            cycle = Cycle(devices=(), errors={"exception": 1})
            self._log_once(backend.name, f"sample raised {e!r}")
        self._accept(backend.name, cycle, time.perf_counter() - t0)
        self.publish()
        return True

    # -- state changes ------------------------------------------------------------------
    def _set_down(self, name: str, reason: str, level: str) -> None:
        with self._lock:
            state = self._states[name]
            if state.reason != reason or state.up:
                getattr(log, level)("backend down", backend=name, reason=reason)
            self._states[name] = replace(state, up=False, reason=reason, attempted=True)
            self._check_attempted()
        self.publish()

    def _log_once(self, name: str, reason: str) -> None:
        with self._lock:
            state = self._states[name]
            if state.reason != reason:
                log.error("backend error", backend=name, reason=reason)
                self._states[name] = replace(state, reason=reason)

    def _accept(self, name: str, cycle: Cycle, duration: float) -> None:
        devices = []
        truncated = 0
        for device in cycle.devices:
            device, cut = cap_processes(device, self.config.max_processes_per_gpu)
            truncated += cut
            devices.append(device)
        sample = BackendSample(backend=name, timestamp=time.time(), duration_seconds=duration,
                               devices=tuple(devices), errors=dict(cycle.errors))
        with self._lock:
            state = self._states[name]
            self._log_device_changes(state.last, sample)
            errors = dict(state.errors_total)
            for reason, n in cycle.errors.items():
                errors[reason] = errors.get(reason, 0) + n
            buckets = tuple(c + (duration <= b)
                            for c, b in zip(state.duration_buckets, DURATION_BUCKETS, strict=True))
            if state.stale:
                log.info("backend answering again", backend=name)
            self._states[name] = replace(
                state, last=sample, last_success=sample.timestamp, stale=False,
                errors_total=errors, duration_buckets=buckets,
                duration_sum=state.duration_sum + duration, duration_count=state.duration_count + 1,
                reason=state.reason if not state.up or "exception" in cycle.errors else "")
            self._truncated += truncated
            if self._numbered:
                for device in devices:
                    self._index_of(device.info.pci_bus_id)

    @staticmethod
    def _log_device_changes(old: BackendSample | None, new: BackendSample) -> None:
        before = {d.info.pci_bus_id: d.up for d in old.devices} if old else {}
        for d in new.devices:
            if not d.primary:
                continue
            was = before.get(d.info.pci_bus_id)
            if was is None and old is not None:
                log.info("gpu appeared", backend=new.backend, pci_bus_id=d.info.pci_bus_id)
            elif was is True and not d.up:
                log.warning("gpu lost", backend=new.backend, pci_bus_id=d.info.pci_bus_id)
            elif was is False and d.up:
                log.info("gpu back", backend=new.backend, pci_bus_id=d.info.pci_bus_id)

    def _check_attempted(self) -> None:
        if all(s.attempted for s in self._states.values()):
            self._all_attempted.set()

    def _number_gpus(self) -> None:
        """First numbering: every GPU known so far, ordered by PCI bus id. Later: append."""
        if self._numbered:
            return
        known = set(self._gpu_index)
        for state in self._states.values():
            if state.last:
                known.update(d.info.pci_bus_id for d in state.last.devices)
        self._gpu_index = {bus: i for i, bus in enumerate(sorted(known))}
        self._numbered = True

    def _index_of(self, pci_bus_id: str) -> int:
        if pci_bus_id not in self._gpu_index:
            self._gpu_index[pci_bus_id] = len(self._gpu_index)
        return self._gpu_index[pci_bus_id]

    # -- snapshots ----------------------------------------------------------------------
    def _watchdog(self) -> None:
        """Mark backends stale and keep the exporter's own series fresh without GPUs."""
        tick = min(self.config.interval, self.config.stale_after_seconds / 2)
        while not self._stop.wait(tick):
            now = time.time()
            changed = False
            with self._lock:
                for name, state in self._states.items():
                    age = now - (state.last_success or now)
                    stale = state.up and age > self._stale_after[name]
                    if stale != state.stale:
                        changed = True
                        self._states[name] = replace(state, stale=stale)
                        if stale:
                            log.warning("backend stale: no completed collection",
                                        backend=name, seconds=round(age, 1))
            if changed or now - self.snapshot.created >= self.config.interval:
                self.publish()

    def _build(self) -> Snapshot:
        identities: dict[str, DeviceInfo] = {}
        for state in self._states.values():
            if state.last:
                for d in state.last.devices:
                    if d.primary:
                        identities[d.info.pci_bus_id] = d.info
        ready = all(s.attempted and (not s.up or s.last is not None)
                    for s in self._states.values()) and self._numbered
        self._generation += 1
        return Snapshot(generation=self._generation, created=time.time(), ready=ready,
                        backends=tuple(self._states.values()),
                        gpu_index={k: v for k, v in self._gpu_index.items() if v >= 0},
                        identities=identities, processes_truncated_total=self._truncated)

    def publish(self) -> Snapshot:
        with self._lock:
            snapshot = self._build()
            self.snapshot = snapshot
        if self.listener is not None:
            self.listener(snapshot)
        return snapshot
