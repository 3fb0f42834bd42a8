"""Each GPU's energy split between its processes by their engine busy time: an estimate.

Owns ``gpu_process_energy_joules_total``, ``gpu_idle_energy_joules_total`` and
``gpu_estimated_energy_joules_total`` (the fields ``ProcessSample.energy_joules``,
``DeviceValues.idle_energy_joules`` and ``DeviceValues.estimated_energy_joules``, served
with ``source="estimate"``): the state that carries them from one snapshot to the next,
and the rule that splits a window. docs/energy.md says it for users.

The counter is the GPU's own energy counter; for a GPU that reports its power but has
no counter, the estimate: its power integrated over time, from 0 when the split first
sees the GPU (each power reading, an average over the last second or so, counts for
the time since the snapshot before; a gap counts ``max_window`` at most, a GPU down
counts nothing). A GPU whose counter appears later follows it from then on.

A window is the time between two closes on one GPU. At a close the counter has moved by
``joules`` over ``seconds``; each process's busy time in the window, per engine, is

- the increase of its ``engine_busy_seconds`` counter (DRM fdinfo for AMD and Intel,
  amdsmi), clamped to the window;
- else what its ``utilization_ratio`` readings say (NVML's per-process SM samples, read
  every slow cycle; xe's cycle ratios, every /proc scan). A reading describes the
  reading interval before it (``reading_interval``, or ``intervals`` by the process's
  source; shorter where the GPU's readings changed sooner) and stays in the snapshots
  until the next one. So the busy time of the window (T0, T] is the ratios shown,
  integrated over the window's snapshots, plus the interval times the ratio shown at
  T (the reading of the window's last interval) less the interval times the ratio
  shown at T0 (it described the window before, which counted it). A process first shown
  inside the window showed 0 at T0: its first reading counts, all of it, however long
  every process was idle before.

The GPU was busy for ``busy`` seconds: its busiest engine's busy time summed over the
processes, at most the window; where that came from ratios alone and the GPU's own
``utilization_ratio`` (each reading, of the last second or less, counting for the time
since the snapshot before, as the power does) says it was busy longer, that (NVML's SM samples
are the SMs' activity while kernels run: they share the GPU out, the GPU's utilisation
is the time a kernel ran). The busy part of the counter's increase is the share
of the window's energy drawn in its ``busy`` highest-power seconds: the power readings
of the window's snapshots, ranked (where they cover at least ``COVERED`` of the window;
else ``busy / seconds``, a share by time). A GPU draws more when it works, so a window
that mixes busy and idle time charges the busy part at busy power, not at the window's
mean. The busy part goes to the processes in proportion to their busy time over all
engines, the rest to idle. So the parts plus idle are the counter's increase, exactly,
and nothing is ever taken back.

When a window closes: where some process has busy counters (sampled by the /proc scan,
slower than the energy counter), when a counter moved and the energy counter moved too
(or the window is older than ``max_window``: an idle GPU's idle share still grows); else
when the energy counter moved and a ratio reading came with it (NVML reads the counter
in a slow cycle, which also reads the samples), or no process shows any. A process
counts from the first snapshot it shows engine data in (its series starts at 0 then);
what it used before goes to the others or to idle. A process keeps its total while the
snapshots list it, and for ``max_window`` after (a missed scan must not restart its
counter); then its state is dropped. Its series goes with its row. A pid seen under
another name is another process.

Plausibility (``units.plausible_increase``, the check every counter input passes): a
power reading above ``RATE_SLACK`` (twice) the GPU's power limit (its enforced limit,
else its default) is not integrated, and an increase of the GPU's energy counter larger
than that power allows over the time since the counter last moved restarts the window
at the new value, attributing nothing: one 99,999 W reading of a 236 W card would otherwise add
220 kJ in 2.6 s, to the estimate and the idle share, for good. Each is counted in
``errors`` (``implausible``), served as ``gpu_exporter_collection_errors_total
{backend="estimate"}``. A GPU without a known limit is bounded by its unit's range only.

Fed by the Hub as it publishes (``exporter.pipeline.state.merged_view``, once per snapshot):
``attribute`` feeds a snapshot's merged devices only when its generation is newer than
the last fed one, so a generation given twice, or an older one late, counts nothing twice.
The state is bounded by the GPUs, the processes the merge keeps
(``--max-processes-per-gpu``) and ``MAX_STEPS`` power readings per GPU.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceSample, ProcessSample, copy_with
from exporter.core.units import plausible_increase

SOURCE = "estimate"
COVERED = 0.9  # power readings must cover this share of a window to rank its seconds
MAX_STEPS = 512  # power readings kept per open window; beyond, neighbours by power merge


@dataclass(frozen=True)
class Window:
    """One closed window of one GPU: what the counter gained and where it went."""

    key: str  # the device key (PCI bus id, MIG UUID, ...)
    seconds: float
    joules: float  # the GPU counter's increase
    parts: Mapping[int, float]  # pid -> joules attributed
    idle: float
    busy: float = 0.0  # seconds the GPU was busy in it (its busiest engine)


@dataclass
class _Process:
    name: str
    interval: float  # how long one of its ratio readings describes
    joules: float = 0.0
    seen: float = 0.0  # clock of the last snapshot that listed it
    busy: dict[str, float] = field(default_factory=dict)  # engine -> counter at last close
    # engine -> s: its ratios held over the snapshots since the last close, less what
    # the close counted ahead (the module doc)
    pending: dict[str, float] = field(default_factory=dict)
    ratio: dict[str, float] = field(default_factory=dict)  # engine -> the ratio shown now


@dataclass
class _Gpu:
    energy: float  # the GPU counter at the last close
    at: float  # clock of the last close
    estimated: bool  # the counter is the power estimate (``total``)
    total: float = 0.0  # the estimate now
    fed: float | None = None  # clock of the last snapshot fed; None: down since
    # The GPU counter at the last snapshot fed, and the clock of the snapshot that last
    # moved it (a counter read less often than the snapshots stands still in between).
    last: float = 0.0
    last_at: float = 0.0
    idle: float = 0.0
    processes: dict[int, _Process] = field(default_factory=dict)
    ratios: dict[int, dict[str, float]] = field(default_factory=dict)  # the last reading
    ratio_at: float = 0.0  # clock of the last ratio reading
    changed_at: float | None = None  # clock of the last new ratio shown
    gap: float | None = None  # seconds between the last two new ratios shown
    power: list[tuple[float, float]] = field(default_factory=list)  # (s, W) since last close
    used: float = 0.0  # s the GPU's own utilisation says it was busy since the last close
    used_over: float = 0.0  # s its utilisation readings cover since the last close


def _has_data(p: ProcessSample) -> bool:
    return bool(p.engine_busy_seconds or p.utilization_ratio)


def _ratios(p: ProcessSample) -> dict[str, float]:
    if p.engine_busy_seconds:
        return {}
    return {engine: min(1.0, max(0.0, r)) for engine, r in p.utilization_ratio.items()}


class EnergySplit:
    """The split of every GPU's energy counter (module doc), fed merged snapshots."""

    def __init__(self, max_window: float, reading_interval: float,
                 clock: Callable[[], float] = time.monotonic,
                 on_window: Callable[[Window], None] | None = None,
                 intervals: Mapping[str, float] | None = None) -> None:
        self.reading_interval = reading_interval  # how often ratios are read (slow tier)
        self.intervals = dict(intervals or {})  # process source -> its reading interval
        self.max_window = max_window
        self.clock = clock
        self.on_window = on_window  # bench/energy_split.py checks every window
        self._gpus: dict[str, _Gpu] = {}
        self._generation = -1
        self._lock = threading.Lock()
        self.errors: Counter[ErrorReason] = Counter()  # readings refused (module doc)

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
            key = d.info.key
            present.add(key)
            g = self._gpus.get(key)
            if not d.up:
                if g is not None:
                    g.fed = None  # nothing is integrated over the time it was down
                continue
            watts = self._watts(d)
            if d.energy_joules is not None:
                switch = g is not None and g.estimated  # a counter came: follow it from now
                jumped = (not switch and g is not None and watts is not None
                          and d.energy_joules > g.last
                          and not plausible_increase(d.energy_joules - g.last,
                                                     now - g.last_at, watts))
                if jumped:
                    self.errors[ErrorReason.IMPLAUSIBLE] += 1
                self._update(key, g, d.energy_joules, d, now, restart=switch or jumped)
            elif d.power_watts is not None and (g is None or g.estimated):
                step = 0.0 if g is None else self._step(g, now)
                power = max(0.0, d.power_watts)
                if watts is not None and not plausible_increase(power * step, step, watts, 0.0):
                    self.errors[ErrorReason.IMPLAUSIBLE] += 1  # never integrated
                    power = 0.0
                total = 0.0 if g is None else g.total + power * step
                self._update(key, g, total, d, now)
        for key in set(self._gpus) - present:
            del self._gpus[key]

    @staticmethod
    def _watts(d: DeviceSample) -> float | None:
        """The most a GPU can draw on average (its power limit), None where unknown."""
        limit = d.power_limit_watts or d.power_limit_default_watts
        return limit if limit is not None and limit > 0 else None

    def _step(self, g: _Gpu, now: float) -> float:
        """Seconds since the snapshot before (0 after the GPU was down), ``max_window`` at most."""
        return 0.0 if g.fed is None else min(max(0.0, now - g.fed), self.max_window)

    def _interval(self, p: ProcessSample) -> float:
        return self.intervals.get(p.source, self.reading_interval)

    def _update(self, key: str, g: _Gpu | None, energy: float, d: DeviceSample,
                now: float, restart: bool = False) -> None:
        first = g is None
        if g is None:
            g = self._gpus[key] = _Gpu(energy=energy, at=now, estimated=d.energy_joules is None,
                                       ratio_at=now)
        step = self._step(g, now)
        if first or energy != g.last:
            g.last, g.last_at = energy, now
        g.fed = now
        if restart:
            g.estimated = False
        elif g.estimated:
            g.total = energy
        power = None if d.power_watts is None else max(0.0, d.power_watts)
        watts = self._watts(d)
        if power is not None and watts is not None and \
                not plausible_increase(power, 1.0, watts, 0.0):
            power = None  # not ranked either (counted where it would have been integrated)
        if step > 0 and power is not None:
            _add_power(g.power, step, power)
        if step > 0 and d.utilization_ratio is not None:
            g.used += min(1.0, max(0.0, d.utilization_ratio)) * step
            g.used_over += step
        listed = {p.pid: p for p in d.processes if _has_data(p)}
        for p in d.processes:
            known = g.processes.get(p.pid)
            if p.pid in listed and (known is None or known.name != p.process):
                # new, or the pid was reused: counted from now on
                known = g.processes[p.pid] = _Process(p.process, self._interval(p),
                                                      busy=dict(p.engine_busy_seconds))
                if first:  # its reading describes the time before the first window
                    known.pending = {e: -known.interval * r for e, r in _ratios(p).items()}
            if known is not None and known.name == p.process:
                known.seen = now
        reading = self._reading(g, self._hold(g, listed, step, now), now)
        if restart or energy < g.energy:  # a new counter, or it went back (driver reload)
            self._restart(g, energy, d.processes, now)
        elif energy > g.energy and self._closes(g, listed, reading, now):
            self._close(key, g, energy, listed, now)
        for pid in [pid for pid, st in g.processes.items() if now - st.seen > self.max_window]:
            del g.processes[pid]

    def _hold(self, g: _Gpu, listed: Mapping[int, ProcessSample], step: float,
              now: float) -> dict[int, dict[str, float]]:
        """The ratios shown since the snapshot before count for the time since it; then
        the ones shown now (returned) are held."""
        shown = {}
        for pid, p in listed.items():
            if not p.engine_busy_seconds and p.utilization_ratio:
                shown[pid] = _ratios(p)
        new = False
        for pid, st in g.processes.items():
            if st.ratio:
                for engine, r in st.ratio.items():
                    st.pending[engine] = st.pending.get(engine, 0.0) + r * step
            ratios = shown.get(pid)
            if ratios is not None:
                new = new or ratios != st.ratio
                st.ratio = ratios
            elif st.ratio:
                st.ratio = {}
        if new:  # a reading (a process that vanishes is not one: it may have exited)
            if g.changed_at is not None and now > g.changed_at:
                g.gap = now - g.changed_at
            g.changed_at = now
        return shown

    def _reading(self, g: _Gpu, shown: dict[int, dict[str, float]], now: float) -> bool:
        """A new ratio reading (changed, or a reading interval later): True."""
        if not shown and not g.ratios:
            g.ratio_at = now
            return False
        interval = min((g.processes[pid].interval for pid in shown),
                       default=self.reading_interval)
        if shown == g.ratios and now - g.ratio_at < 0.95 * interval:
            return False
        g.ratios, g.ratio_at = shown, now
        return True

    def _closes(self, g: _Gpu, listed: Mapping[int, ProcessSample], reading: bool,
                now: float) -> bool:
        """The energy counter moved: close when per-process data came with it (a counter
        moved, a new ratio reading), when there is none (all idle), or on a long wait."""
        if not listed or reading or now - g.at >= self.max_window:
            return True
        return any(g.processes[p.pid].busy != dict(p.engine_busy_seconds)
                   for p in listed.values() if p.engine_busy_seconds)

    @staticmethod
    def _ahead(g: _Gpu, st: _Process) -> float:
        """How long the ratio shown now describes: the reading interval, or less where
        the GPU's last two readings came sooner (a reader faster than configured)."""
        return st.interval if g.gap is None else min(st.interval, g.gap)

    def _restart(self, g: _Gpu, energy: float, processes: Sequence[ProcessSample],
                 now: float) -> None:
        """A new baseline at ``energy``: the window restarts now, nothing attributed."""
        g.energy, g.at, g.power, g.used, g.used_over = energy, now, [], 0.0, 0.0
        engines = {p.pid: p.engine_busy_seconds for p in processes if p.engine_busy_seconds}
        for pid, st in g.processes.items():
            if pid in engines:
                st.busy = dict(engines[pid])
            st.pending = {e: -self._ahead(g, st) * r for e, r in st.ratio.items()}

    def _close(self, key: str, g: _Gpu, energy: float, listed: Mapping[int, ProcessSample],
               now: float) -> None:
        seconds = now - g.at
        busy: dict[int, dict[str, float]] = {}
        counted = False  # some process's busy time came from engine counters
        for pid, st in g.processes.items():
            p = listed.get(pid)
            if p is not None and p.engine_busy_seconds:
                busy[pid] = _counted(st, p, seconds)
                counted = counted or bool(busy[pid])
            else:
                busy[pid] = _held(st, self._ahead(g, st), seconds)
        by_engine: dict[str, float] = {}
        for engines in busy.values():
            for engine, s in engines.items():
                by_engine[engine] = by_engine.get(engine, 0.0) + s
        total = sum(by_engine.values())
        busiest = max(by_engine.values(), default=0.0)
        busy_seconds = min(seconds, busiest) if seconds > 0 else busiest
        if total > 0 and not counted and g.used_over >= COVERED * seconds > 0:
            # ratios (NVML's SM samples) share the GPU out; its own utilisation (the time
            # a kernel ran) says how long it was busy, where it says longer
            busy_seconds = max(busy_seconds, min(seconds, g.used * seconds / g.used_over))
        share = _busy_share(g.power, busy_seconds, seconds) if total > 0 else 0.0
        joules = energy - g.energy
        parts: dict[int, float] = {}
        if total > 0:
            for pid, engines in busy.items():
                mine = sum(engines.values())
                if mine > 0:
                    parts[pid] = joules * share * mine / total
        idle = max(0.0, joules - sum(parts.values()))
        for pid, part in parts.items():
            g.processes[pid].joules += part
        g.idle += idle
        g.energy, g.at, g.power, g.used, g.used_over = energy, now, [], 0.0, 0.0
        for pid, p in listed.items():
            g.processes[pid].busy = dict(p.engine_busy_seconds)
        if self.on_window is not None:
            self.on_window(Window(key, seconds, joules, parts, idle, busy_seconds))

    # -- output -----------------------------------------------------------------------
    def _apply(self, d: DeviceSample) -> DeviceSample:
        g = self._gpus.get(d.info.key)
        if g is None or not d.up:
            return d
        processes = tuple(_with_energy(p, g.processes.get(p.pid)) for p in d.processes)
        sources = {**d.field_sources, "idle_energy_joules": SOURCE}
        if g.estimated:
            sources["estimated_energy_joules"] = SOURCE
            return copy_with(d, idle_energy_joules=g.idle, estimated_energy_joules=g.total,
                             processes=processes, field_sources=sources)
        return copy_with(d, idle_energy_joules=g.idle, processes=processes,
                         field_sources=sources)


def _counted(state: _Process, p: ProcessSample, seconds: float) -> dict[str, float]:
    """Seconds each engine was busy for ``p`` in the window: its counters' increases,
    clamped to the window; one that went back counts nothing."""
    out = {}
    for engine, value in p.engine_busy_seconds.items():
        base = state.busy.get(engine)
        if base is not None and value > base:
            out[engine] = min(value - base, seconds) if seconds > 0 else value - base
    return out


def _held(state: _Process, ahead: float, seconds: float) -> dict[str, float]:
    """Seconds each engine was busy from the ratios: those held since the last close,
    and the one shown now for ``ahead`` (the module doc); then the next window starts
    less what this one counted ahead."""
    out = {}
    ratio, pending = state.ratio, state.pending
    for engine, r in ratio.items():
        s = pending.get(engine, 0.0) + ahead * r
        if s > 0:
            out[engine] = min(s, seconds) if seconds > 0 else s
    for engine, s in pending.items():
        if engine not in ratio and s > 0:
            out[engine] = min(s, seconds) if seconds > 0 else s
    state.pending = {e: -ahead * r for e, r in ratio.items()} if ratio else {}
    return out


def _add_power(steps: list[tuple[float, float]], seconds: float, watts: float) -> None:
    steps.append((seconds, watts))
    if len(steps) > MAX_STEPS:  # only the distribution is ranked: merge neighbours by power
        steps.sort(key=lambda s: s[1])
        merged = []
        for (s1, w1), (s2, w2) in zip(steps[::2], steps[1::2], strict=False):
            merged.append((s1 + s2, (s1 * w1 + s2 * w2) / (s1 + s2) if s1 + s2 else w1))
        if len(steps) % 2:
            merged.append(steps[-1])
        steps[:] = merged


def _busy_share(power: Sequence[tuple[float, float]], busy: float, seconds: float) -> float:
    """The share of a window's energy drawn in its ``busy`` highest-power seconds, from
    the power readings over it; the share by time (``busy / seconds``) where they cover
    less than ``COVERED`` of the window or show no power."""
    if busy <= 0:
        return 0.0
    if seconds <= 0:
        return 1.0
    fraction = min(1.0, busy / seconds)
    covered = sum(s for s, _ in power)
    drawn = sum(s * w for s, w in power)
    if covered < COVERED * seconds or drawn <= 0:
        return fraction
    left, top = fraction * covered, 0.0
    for s, w in sorted(power, key=lambda step: -step[1]):
        take = min(s, left)
        top += take * w
        left -= take
        if left <= 0:
            break
    return min(1.0, max(fraction, top / drawn))


def _with_energy(p: ProcessSample, state: _Process | None) -> ProcessSample:
    if state is None or state.name != p.process:
        return p
    return copy_with(p, energy_joules=state.joules,
                     field_sources={**p.field_sources, "energy_joules": SOURCE})
