"""Each GPU's energy split between its processes by their engine busy time: an estimate.

Owns ``gpu_process_energy_joules_total`` and ``gpu_idle_energy_joules_total`` (the fields
``ProcessSample.energy_joules`` and ``DeviceValues.idle_energy_joules``, served with
``source="estimate"``): the state that carries them from one snapshot to the next, and
the rule that splits a window. docs/energy.md says it for users.

A window is the time between two closes on one GPU. At a close the GPU's own energy
counter has moved by ``joules``; each process's busy time in the window is, per engine,
the increase of its ``engine_busy_seconds`` counter (DRM fdinfo for AMD and Intel,
amdsmi), else the sum of its ``utilization_ratio`` readings (NVML's per-process SM
samples, read every slow cycle: each reading times the time since the reading before).
The GPU was busy for the fraction ``f`` of the window that its busiest engine was busy,
summed over processes (at most 1); ``f * joules`` goes to the processes in proportion to
their busy time over all engines, the rest to idle. So the parts plus idle are the
counter's increase, exactly, and nothing is ever taken back.

When a window closes: where some process has busy counters (sampled by the /proc scan,
slower than the energy counter), when a counter moved and the energy counter moved too
(or the window is older than ``max_window``: an idle GPU's idle share still grows); else
when the energy counter moved (NVML reads it in a slow cycle that also reads the
samples). A process counts from the first snapshot it shows engine data in (its series
starts at 0 then); what it used before, or after its last reading, goes to the others or
to idle. A process keeps its total while the snapshots list it, and for ``max_window``
after (a missed scan must not restart its counter); then its state is dropped. Its
series goes with its row. A pid seen under another name is another process.

Fed by the Hub as it publishes (``exporter.collect.state.merged_view``, once per snapshot):
``attribute`` feeds a snapshot's merged devices only when its generation is newer than
the last fed one, so a generation given twice, or an older one late, counts nothing twice.
The state is bounded by the GPUs and the processes the merge keeps (``--max-processes-per-gpu``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.core.model import DeviceSample, ProcessSample, copy_with

SOURCE = "estimate"


@dataclass(frozen=True)
class Window:
    """One closed window of one GPU: what the counter gained and where it went."""

    key: str  # the device key (PCI bus id, MIG UUID, ...)
    seconds: float
    joules: float  # the GPU counter's increase
    parts: Mapping[int, float]  # pid -> joules attributed
    idle: float


@dataclass
class _Process:
    name: str
    joules: float = 0.0
    seen: float = 0.0  # clock of the last snapshot that listed it
    busy: dict[str, float] = field(default_factory=dict)  # engine -> counter at last close
    pending: dict[str, float] = field(default_factory=dict)  # engine -> s from ratios


@dataclass
class _Gpu:
    energy: float  # the GPU counter at the last close
    at: float  # clock of the last close
    idle: float = 0.0
    processes: dict[int, _Process] = field(default_factory=dict)
    ratios: dict[int, dict[str, float]] = field(default_factory=dict)  # the last reading
    ratio_at: float = 0.0  # clock of the last ratio reading


def _has_data(p: ProcessSample) -> bool:
    return bool(p.engine_busy_seconds or p.utilization_ratio)


class EnergySplit:
    """The split of every GPU's energy counter (module doc), fed merged snapshots."""

    def __init__(self, max_window: float, reading_interval: float,
                 clock: Callable[[], float] = time.monotonic,
                 on_window: Callable[[Window], None] | None = None) -> None:
        self.reading_interval = reading_interval  # how often ratios are read (slow tier)
        self.max_window = max_window
        self.clock = clock
        self.on_window = on_window  # bench/energy_split.py checks every window
        self._gpus: dict[str, _Gpu] = {}
        self._generation = -1
        self._lock = threading.Lock()

    def attribute(self, generation: int, devices: Sequence[DeviceSample]) -> list[DeviceSample]:
        """``devices`` (one snapshot's merged devices) with the energy totals filled in,
        after feeding them if ``generation`` is newer than any fed before."""
        with self._lock:
            if generation > self._generation:
                self._generation = generation
                self._feed(devices, self.clock())
            return [self._apply(d) for d in devices]

    # -- state ------------------------------------------------------------------------
    def _feed(self, devices: Sequence[DeviceSample], now: float) -> None:
        present = set()
        for d in devices:
            present.add(d.info.key)
            if d.up and d.energy_joules is not None:
                self._update(d.info.key, d.energy_joules, d.processes, now)
        for key in set(self._gpus) - present:
            del self._gpus[key]

    def _update(self, key: str, energy: float, processes: Sequence[ProcessSample],
                now: float) -> None:
        g = self._gpus.get(key)
        if g is None:
            g = self._gpus[key] = _Gpu(energy=energy, at=now, ratio_at=now)
        listed = {p.pid: p for p in processes if _has_data(p)}
        for p in processes:
            known = g.processes.get(p.pid)
            if p.pid in listed and (known is None or known.name != p.process):
                # new, or the pid was reused: counted from now on
                known = g.processes[p.pid] = _Process(p.process,
                                                      busy=dict(p.engine_busy_seconds))
            if known is not None and known.name == p.process:
                known.seen = now
        reading = self._integrate(g, listed, now)
        if energy < g.energy:  # the counter went back (driver reload): a new baseline
            g.energy, g.at = energy, now
            for pid, p in listed.items():
                g.processes[pid].busy = dict(p.engine_busy_seconds)
        elif energy > g.energy and self._closes(g, listed, reading, now):
            self._close(key, g, energy, listed, now)
        for pid in [pid for pid, st in g.processes.items() if now - st.seen > self.max_window]:
            del g.processes[pid]

    def _integrate(self, g: _Gpu, listed: Mapping[int, ProcessSample], now: float) -> bool:
        """Ratios (NVML's per-process samples, xe's cycle counts) describe the time since
        the reading before: a new reading (changed, or a reading interval later) adds
        ratio x that time. True when there was one."""
        ratios = {pid: dict(p.utilization_ratio) for pid, p in listed.items()
                  if not p.engine_busy_seconds}
        if not ratios and not g.ratios:
            g.ratio_at = now
            return False
        if ratios == g.ratios and now - g.ratio_at < 0.95 * self.reading_interval:
            return False
        seconds = max(0.0, now - g.ratio_at)
        for pid, engines in ratios.items():
            pending = g.processes[pid].pending
            for engine, r in engines.items():
                pending[engine] = pending.get(engine, 0.0) + min(1.0, max(0.0, r)) * seconds
        g.ratios, g.ratio_at = ratios, now
        return True

    def _closes(self, g: _Gpu, listed: Mapping[int, ProcessSample], reading: bool,
                now: float) -> bool:
        """The energy counter moved: close when per-process data came with it (a counter
        moved, a new ratio reading), when there is none (all idle), or on a long wait."""
        if not listed or reading or now - g.at >= self.max_window:
            return True
        return any(g.processes[p.pid].busy != dict(p.engine_busy_seconds)
                   for p in listed.values() if p.engine_busy_seconds)

    def _close(self, key: str, g: _Gpu, energy: float, listed: Mapping[int, ProcessSample],
               now: float) -> None:
        seconds = now - g.at
        busy: dict[int, dict[str, float]] = {}
        for pid, st in g.processes.items():
            p = listed.get(pid)
            busy[pid] = _busy(st, p, seconds) if p is not None else dict(st.pending)
            st.pending = {}
        by_engine: dict[str, float] = {}
        for engines in busy.values():
            for engine, s in engines.items():
                by_engine[engine] = by_engine.get(engine, 0.0) + s
        total = sum(by_engine.values())
        if seconds > 0:
            fraction = min(1.0, max(by_engine.values(), default=0.0) / seconds)
        else:
            fraction = 1.0 if total > 0 else 0.0
        joules = energy - g.energy
        parts: dict[int, float] = {}
        if total > 0:
            for pid, engines in busy.items():
                share = sum(engines.values())
                if share > 0:
                    parts[pid] = joules * fraction * share / total
        idle = max(0.0, joules - sum(parts.values()))
        for pid, part in parts.items():
            g.processes[pid].joules += part
        g.idle += idle
        g.energy, g.at = energy, now
        for pid, p in listed.items():
            g.processes[pid].busy = dict(p.engine_busy_seconds)
        if self.on_window is not None:
            self.on_window(Window(key, seconds, joules, parts, idle))

    # -- output -----------------------------------------------------------------------
    def _apply(self, d: DeviceSample) -> DeviceSample:
        g = self._gpus.get(d.info.key)
        if g is None or not d.up:
            return d
        processes = tuple(_with_energy(p, g.processes.get(p.pid)) for p in d.processes)
        return copy_with(d, idle_energy_joules=g.idle, processes=processes,
                         field_sources={**d.field_sources, "idle_energy_joules": SOURCE})


def _busy(state: _Process, p: ProcessSample, seconds: float) -> dict[str, float]:
    """Seconds each engine was busy for ``p`` in the window: its counters' increases
    (clamped to the window; one that went back counts nothing), else what its ratio
    readings added up to (``_integrate``)."""
    if not p.engine_busy_seconds:
        return dict(state.pending)
    out = {}
    for engine, value in p.engine_busy_seconds.items():
        base = state.busy.get(engine)
        if base is not None and value > base:
            out[engine] = min(value - base, seconds) if seconds > 0 else value - base
    return out


def _with_energy(p: ProcessSample, state: _Process | None) -> ProcessSample:
    if state is None or state.name != p.process:
        return p
    return copy_with(p, energy_joules=state.joules,
                     field_sources={**p.field_sources, "energy_joules": SOURCE})

