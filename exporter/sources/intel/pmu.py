"""Intel engine utilisation from the i915/xe PMU (perf events): the ``pmu`` backend.

Owns one persistent perf counter group per Intel GPU and what its reads add up to:
``engine_utilization_ratio`` and ``engine_busy_seconds`` per engine class (the names
fdinfo uses: render, copy, video, video_enhance, compute), and ``utilization_ratio``
= the busiest engine, as for AMD. It reads what intel_gpu_top reads and needs no
rights over other processes, only the right to open the GPU's perf events
(CAP_PERFMON, CAP_SYS_ADMIN or ``kernel.perf_event_paranoid`` <= 0).

- Cards come from DrmDiscovery (``cards(["i915", "xe"])``); each is matched to its
  PMU by PCI address (exporter.sources.kernel.i915_xe_pmu). The integrated GPU's PMU is the
  bare ``i915``. A card's group is opened once, on the CPU its ``cpumask`` names,
  and again only when the card comes back (hotplug) or the backend is reopened.
- i915: ``<engine><N>-busy`` counts busy nanoseconds; a class's utilisation is the
  busy delta of its instances over the group's enabled-time delta times the number
  of instances (fdinfo's ``drm-engine-capacity`` rule), its busy seconds their sum.
- xe: per engine, active / total ticks between two reads; a class's utilisation is
  the mean over its instances, its busy seconds the running sum of ratio x enabled
  time (the ticks' frequency is not exported, the enabled time is the kernel's).
- The read right after opening is the baseline, so the first cycle has a window
  (one shorter than 1 ms waits for the next). Busy-seconds counters are kept per
  card and engine across reopens, so they never go back; a counter that does go
  back gives no value that cycle and is counted (``counter_reset``).
- Cost (bench/pmu_read.py, a 2-core x86 VM, task-clock counters standing in for the
  GPU's): one group read of 20 counters 3.7 us median against 37 us for 20 separate
  reads; ``sample()`` for a B580 (20 counters, fake kernel) about 40 us of Python.
- EACCES/EPERM on open: ``open()`` raises BackendUnavailable naming the missing
  right (logged once by the collector); fdinfo sums keep serving. ENODEV on read:
  the card went away (``gpu_lost``), its group is closed and reopened when it is back.
- The perf and PMU parsers are imported with the first i915/xe card: a host without
  one (an NVIDIA-only one) never loads them.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from exporter.core import units
from exporter.core.config import Config
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample, pci_uuid
from exporter.sources.base import KERNEL, BackendUnavailable, Capabilities, Cycle
from exporter.sources.discovery import UDEV_POLL, DrmCard, DrmDiscovery

if TYPE_CHECKING:
    from exporter.sources.kernel import perf
    from exporter.sources.kernel.i915_xe_pmu import Pmu

log = structlog.get_logger(__name__).bind(backend="pmu")

DRIVERS = ("i915", "xe")
SOURCE = "pmu"
MIN_WINDOW_NS = 1_000_000  # a window under 1 ms says nothing about utilisation
DENIED_HINT = ("perf_event_open denied ({code}): the i915/xe PMU needs CAP_PERFMON "
               "(or CAP_SYS_ADMIN, or kernel.perf_event_paranoid <= 0); "
               "engine utilisation comes from fdinfo sums instead")


@dataclass(frozen=True)
class _Member:
    """One counter of a card's group: the engine it belongs to and what it counts."""

    label: str  # the `engine` label: "render", "video", ...
    engine: str  # one hardware engine: "vcs1", "gt1/vcs0"
    kind: str  # "busy" (i915 ns), "active" or "total" (xe ticks)


@dataclass
class _Card:
    info: DeviceInfo
    group: perf.CounterGroup
    members: list[_Member]  # one per opened counter, in group order
    previous: perf.GroupRead | None = None
    ratios: dict[str, float] = field(default_factory=dict)  # last cycle's, by label


class PmuBackend:
    """Every i915/xe card whose PMU opens, read on the fast tier."""

    name = "pmu"
    source = SOURCE
    priority = KERNEL
    interval: float | None = None

    def __init__(self, config: Config, discovery: DrmDiscovery,
                 syscalls: perf.Syscalls | None = None) -> None:
        self._config = config
        self._discovery = discovery
        self._syscalls = syscalls  # None: perf.LIBC, the real one, bound at the first card
        self._cards: dict[DrmCard, _Card] = {}
        self._failed: set[DrmCard] = set()  # cards whose group did not open: retried on hotplug
        # (pci bus id, engine label) -> busy seconds: kept across reopens (never goes back)
        self._busy: dict[tuple[str, str], float] = {}
        # (what the last open() saw, why it opened nothing): an open() that would see the
        # same cards and the same PMUs fails alike without parsing every PMU again.
        self._unopened: tuple[object, str] | None = None

    @property
    def capabilities(self) -> Capabilities:
        """open() reads a cached card list and a few sysfs files: retried like intel's.
        Once it found cards whose PMU did not open (no PMU on this kernel, no events),
        only a card or driver that comes changes that, and a card added wakes the
        backend at once (Hub.reprobe): every UDEV_POLL is then enough."""
        if self._unopened is not None:
            return Capabilities(retry_interval=max(self._config.interval, UDEV_POLL))
        return self._discovery.capabilities(self._config.interval)

    def _seen(self, cards: Sequence[DrmCard]) -> object:
        """What an open() depends on: the cards, hotplug's generation, the PMUs registered."""
        from exporter.sources.kernel.i915_xe_pmu import EVENT_SOURCES

        try:
            pmus = sorted(os.listdir(Path(self._config.sysfs).joinpath(*EVENT_SOURCES)))
        except OSError:
            pmus = []
        return tuple(cards), self._discovery.generation, tuple(pmus)

    def open(self) -> Sequence[DeviceInfo]:
        self._discovery.start()
        cards = self._discovery.cards(DRIVERS)
        if not cards:
            raise BackendUnavailable(f"no i915/xe card under {self._config.sysfs}/class/drm")
        # Retried every cycle where nothing announces hotplug: a card whose PMU did not
        # open (no such event on this kernel) costs one listing, not a parse of every
        # PMU's events and a perf_event_open per counter (5 ms a cycle on a B580).
        seen = self._seen(cards)
        if self._unopened is not None and self._unopened[0] == seen:
            raise BackendUnavailable(self._unopened[1])
        from exporter.sources.kernel.i915_xe_pmu import read_pmus

        pmus = read_pmus(Path(self._config.sysfs))
        if not pmus:
            reason = f"no i915/xe PMU under {self._config.sysfs}/bus/event_source/devices"
            self._unopened = (seen, reason)
            raise BackendUnavailable(reason)
        errors: Counter[ErrorReason] = Counter()
        reasons = {}
        try:
            for card in cards:
                if card not in self._cards:  # never a second group for one card
                    reasons[card] = self._open_card(card, pmus, errors)
        except _Denied as exc:
            self.close()  # every other card would be refused alike
            raise BackendUnavailable(DENIED_HINT.format(code=exc.code)) from exc
        if not self._cards:  # the collector logs this reason once
            reason = next((r for r in reasons.values() if r), "no PMU events opened")
            self._unopened = (seen, reason)  # not after _Denied: a right may be granted
            raise BackendUnavailable(reason)
        self._unopened = None
        for card, reason in reasons.items():  # some cards opened: say why not the others
            if reason:
                log.warning("pmu card skipped", card=card.card, reason=reason)
        return ()  # augmenting: the intel backend reports the GPUs, joined by pci_bus_id

    def close(self) -> None:
        for card in self._cards.values():
            card.group.close()
        self._cards.clear()
        self._failed.clear()

    def _open_card(self, card: DrmCard, pmus: list[Pmu], errors: Counter[ErrorReason]) -> str:
        """Open one card's group; returns why not ("" when it opened). A permission error
        is raised as _Denied. A card that did not open waits for hotplug (or a reopen)."""
        from exporter.sources.kernel import perf
        from exporter.sources.kernel.drm_fdinfo import engine_label
        from exporter.sources.kernel.i915_xe_pmu import i915_engines, xe_engine_candidates

        if self._syscalls is None:
            self._syscalls = perf.LIBC
        pmu = _pmu_of(card, pmus)
        if pmu is None:
            self._failed.add(card)
            return f"no PMU for {card.card} ({card.pci_bus_id})"
        if pmu.driver == "i915":
            busy = i915_engines(pmu)
            members = [_Member(engine_label(n), f"{n}{i}", "busy") for n, i in busy]
            configs = list(busy.values())
        else:
            gts = _xe_gts(card.device_dir)
            members, configs = [], []
            for (name, gt, instance), pair in xe_engine_candidates(pmu, gts).items():
                engine = f"gt{gt}/{name}{instance}"
                members += [_Member(engine_label(name), engine, "active"),
                            _Member(engine_label(name), engine, "total")]
                configs += pair
        if not configs:  # xe without GuC engine activity lists no engine-*-ticks events
            self._failed.add(card)
            return f"{pmu.name} lists no engine busy events"
        try:
            group, failed = perf.open_group(self._syscalls, pmu.type, configs, pmu.cpu)
        except OSError as exc:
            self._failed.add(card)
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            if exc.errno in perf.DENIED:
                raise _Denied(code) from exc
            return f"{pmu.name}: perf_event_open {code}"
        # ENOENT/EINVAL for an xe engine the GPU lacks is the probe's answer, not an error.
        refused = sum(1 for e in failed.values() if e not in _ABSENT)
        if refused:
            errors[ErrorReason.READ] += refused
        kept = [members[i] for i in group.opened]
        info = DeviceInfo(vendor="intel", pci_bus_id=card.pci_bus_id,
                          uuid=pci_uuid(card.pci_bus_id), driver=card.driver,
                          device_node=card.card)
        state = self._cards[card] = _Card(info, group, kept)
        self._failed.discard(card)
        try:  # the baseline, so that the first cycle already has a window
            state.previous = group.read()
        except (OSError, ValueError):
            pass  # the first sample() counts it and takes the baseline then
        return ""

    def sample(self, slow: bool) -> Cycle:
        errors: Counter[ErrorReason] = Counter()
        cards = self._discovery.cards(DRIVERS)
        for gone in [c for c in self._cards if c not in cards]:
            self._cards.pop(gone).group.close()
        self._failed &= set(cards)
        new = [c for c in cards if c not in self._cards and c not in self._failed]
        if new:  # hotplug: a card that appeared (or came back) gets its group
            from exporter.sources.kernel.i915_xe_pmu import read_pmus

            pmus = read_pmus(Path(self._config.sysfs))
            for card in new:  # each logged once: a failed card waits for the next hotplug
                try:
                    reason = self._open_card(card, pmus, errors)
                except _Denied as exc:
                    errors[ErrorReason.PERMISSION] += 1
                    reason = DENIED_HINT.format(code=exc.code)
                if reason:
                    log.warning("pmu card skipped", card=card.card, reason=reason)
        devices = []
        for drm_card, state in list(self._cards.items()):
            sample = self._read(drm_card, state, errors)
            if sample is not None:
                devices.append(sample)
        return Cycle(devices=devices, errors=dict(errors))

    def _read(self, drm_card: DrmCard, card: _Card,
              errors: Counter[ErrorReason]) -> DeviceSample | None:
        try:
            now = card.group.read()
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # PMU unregistered: the card went away
                errors[ErrorReason.GPU_LOST] += 1
                self._cards.pop(drm_card).group.close()
                return None
            errors[ErrorReason.READ] += 1
            return None
        except ValueError:
            errors[ErrorReason.PARSE] += 1
            return None
        before = card.previous
        window = now.time_enabled_ns - before.time_enabled_ns if before else 0
        if before is None or window < 0:
            card.previous = now  # first read, or a clock that went back: a new baseline
            if before is not None:
                errors[ErrorReason.COUNTER_RESET] += 1
        elif window >= MIN_WINDOW_NS:  # else: keep the older baseline, wait for a longer one
            card.previous = now
            card.ratios = self._account(card, before, now, window, errors)
        busy = {label: seconds for (bus, label), seconds in self._busy.items()
                if bus == card.info.pci_bus_id}
        if not busy and not card.ratios:
            return None  # the baseline read: nothing to say yet
        return DeviceSample(
            info=card.info, source=SOURCE, primary=False,
            utilization_ratio=max(card.ratios.values()) if card.ratios else None,
            engine_utilization_ratio=dict(sorted(card.ratios.items())),
            engine_busy_seconds=dict(sorted(busy.items())),
        )

    def _account(self, card: _Card, before: perf.GroupRead, now: perf.GroupRead,
                 window: int, errors: Counter[ErrorReason]) -> dict[str, float]:
        """This window's ratio per engine label; adds the busy seconds to the counters."""
        deltas: dict[tuple[str, str], int] = {}  # (engine, kind) -> delta
        for member, old, new in zip(card.members, before.values, now.values, strict=True):
            deltas[(member.engine, member.kind)] = new - old
        shares: dict[str, list[float]] = {}  # label -> each engine's busy share
        for member in card.members:
            if member.kind == "total":
                continue
            delta = deltas[(member.engine, member.kind)]
            if member.kind == "busy":
                share = delta / window if delta >= 0 else None
            else:
                total = deltas.get((member.engine, "total"))
                share = delta / total if total and total > 0 and delta >= 0 else None
            share = units.clamp_ratio(share)
            if share is None:
                errors[ErrorReason.COUNTER_RESET] += 1
                continue
            shares.setdefault(member.label, []).append(share)
        ratios = {}
        for label, values in shares.items():
            ratio = units.bounded(sum(values) / len(values), "ratio")
            key = (card.info.pci_bus_id, label)
            seconds = units.bounded(self._busy.get(key, 0.0) + sum(values) * window / 1e9,
                                    "seconds")
            if ratio is None or seconds is None:
                errors[ErrorReason.PARSE] += 1
                continue
            ratios[label] = ratio
            self._busy[key] = seconds
        return ratios


_ABSENT = frozenset({errno.ENOENT, errno.EINVAL})


class _Denied(Exception):
    """perf_event_open refused for lack of a right (EACCES/EPERM)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _pmu_of(card: DrmCard, pmus: list[Pmu]) -> Pmu | None:
    """The card's own PMU by PCI address, else (an integrated i915) the bare ``i915``.

    i915 names its PMU plain ``i915`` for a GPU that is not discrete (i915_pmu.c), and
    Intel's integrated GPUs are always device 2 of bus 0: a discrete card whose own PMU
    is missing must not take the iGPU's.
    """
    for pmu in pmus:
        if pmu.pci_bus_id == card.pci_bus_id and pmu.driver == card.driver:
            return pmu
    if card.driver == "i915" and card.pci_bus_id.endswith(":00:02.0"):
        return next((p for p in pmus if p.driver == "i915" and p.pci_bus_id is None), None)
    return None


def _xe_gts(device_dir: Path) -> list[int]:
    """The GT ids of an xe card (``tile<T>/gt<G>``: G is the device-wide id), else [0]."""
    gts = sorted({int(gt.name[2:]) for gt in device_dir.glob("tile*/gt*")
                  if gt.name[2:].isdigit()})
    return gts or [0]
