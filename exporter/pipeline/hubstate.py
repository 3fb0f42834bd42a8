"""What the Hub records about each backend and each GPU, and how a record changes.

Owns the transitions of one backend's ``BackendState`` (exporter.pipeline.state): opened, down,
recovered, errors counted, a sample accepted, stale (the ``Watchdog``'s look, with each
backend's stale limit) or answering again; each change that people should see gets its
one log line here, never one per cycle. Owns ``down_code``: a down reason's free text as
one of the closed set of codes (labels.DownReason) that gpu_exporter_backend_down_reason
serves; a backend that stays down for one code logs it once, whatever the text says
meanwhile (a lost kubelet and the reopen that finds its socket gone are one event).
Owns ``KnownGpus``: the ``gpu`` numbering, what is reported (``gpu_up 0``) for a device no
backend reports any more, and the log lines of a GPU that appeared, was lost, came back or is gone.

Nothing here takes a lock or starts a thread: the Hub (exporter.pipeline.hub) decides when
a change happens and calls these with its lock held.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

import structlog

from exporter.core.config import Config
from exporter.core.labels import DownReason, ErrorReason
from exporter.core.model import BackendSample, DeviceInfo, DeviceSample, copy_with
from exporter.pipeline.state import DURATION_BUCKETS, BackendState
from exporter.sources.base import Backend, Cycle

log = structlog.get_logger(__name__)

NOT_WATCHED = float("inf")


# -- why a backend is down, as a code --------------------------------------------------
# The Hub's own words (exporter.pipeline.hub): what it puts before a backend's message.
_RAISED = ("sample raised ", "open failed: ")
_WENT_BAD = "failed: "
# (pattern, code), the first that matches a reason's text wins; the patterns are the
# wording of the backends' BackendUnavailable / BackendFailed messages and of the
# libraries' errors they pass on (NVML's nvmlErrorString, amdsmi's status names, gRPC's
# status codes, strerror). tests/test_hubstate.py holds every backend's message to it.
_CODES: tuple[tuple[re.Pattern[str], DownReason], ...] = tuple(
    (re.compile(pattern, re.I), code) for pattern, code in (
        (r"permission|denied|not permitted|no_perm|eacces|eperm", DownReason.PERMISSION),
        (r"not installed|not importable|not loadable|shared library not found"
         r"|loader \S+ not found|^macmon not found|: no such file or directory$",
         DownReason.NOT_INSTALLED),
        (r"driver not loaded|version mismatch|rm has detected", DownReason.DRIVER),
        (r"^not on |not supported|unsupported|no i915/xe pmu|no pmu events|exec format"
         r"|older than",
         DownReason.UNSUPPORTED),
        (r"socket \S+ not found|: unavailable\b|timed out|deadline|connection refused"
         r"|not answering", DownReason.UNREACHABLE),
        (r"^no [\w/, ]+ card\b|found no|no device|no usable",
         DownReason.NO_DEVICE),
        (r"could not start|could not list|init\w* failed|exited with status"
         r"|^cannot (?:run|list) ",
         DownReason.INIT_FAILED),
    ))


def down_code(reason: str) -> DownReason:
    """The code of a down reason's text (never raises; OTHER where no pattern says)."""
    if reason == "not started":
        return DownReason.NOT_STARTED
    if reason.startswith(_RAISED):
        return DownReason.EXCEPTION
    went_bad = reason.startswith(_WENT_BAD)
    text = reason.removeprefix(_WENT_BAD) if went_bad else reason
    for pattern, code in _CODES:
        if pattern.search(text):
            return code
    return DownReason.FAILED if went_bad else DownReason.OTHER


# -- one backend's state --------------------------------------------------------------
def opened(state: BackendState, gpus: int, now: float) -> BackendState:
    """Its open() returned ``gpus`` devices at ``now`` (monotonic). A backend that adds to
    other backends' GPUs (fdinfo, pmu, kubernetes) opens with none: no count is logged."""
    if not state.up and not state.failing:
        log.info("backend up", backend=state.name, **({"gpus": gpus} if gpus else {}))
    return replace(state, up=True, reason="", code=DownReason.NOT_STARTED, attempted=True,
                   stale=False, alive_at=now, logged="" if not state.failing else state.logged)


def down(state: BackendState, reason: str, level: str, exc_info: bool = False,
         failing: bool = False) -> BackendState:
    """Its open() failed, its handle went bad or its sample raised: logged once per code
    (a raised exception once per distinct text: each is its own bug). The same failure
    again (a retry that saw what the last one saw) is the same state, built for nothing."""
    if (state.reason == reason and not state.up and not state.stale and state.attempted
            and state.failing == (failing or state.failing)):
        return state
    code = down_code(reason)
    key = reason if code is DownReason.EXCEPTION else code.value
    if state.logged != key:
        getattr(log, level)("backend down", backend=state.name, code=code.value,
                            reason=reason, exc_info=exc_info)
    return replace(state, up=False, stale=False, reason=reason, code=code, attempted=True,
                   logged=key, failing=failing or state.failing)


def recovered(state: BackendState) -> BackendState:
    """Enough good cycles in a row after failing (the Hub's GOOD_CYCLES_TO_RESET)."""
    if not state.failing:
        return state
    log.info("backend recovered", backend=state.name, after=state.logged)
    return replace(state, failing=False, logged="")


def counted(state: BackendState, errors: Mapping[ErrorReason, int]) -> BackendState:
    return replace(state, errors_total=_added(state.errors_total, errors))


def accepted(state: BackendState, sample: BackendSample, now: float,
             cycle: Cycle) -> BackendState:
    """A completed cycle at ``now`` (monotonic), with what the backend handed over in it."""
    duration = sample.duration_seconds
    buckets = tuple(c + (duration <= b)
                    for c, b in zip(state.duration_buckets, DURATION_BUCKETS, strict=True))
    if state.stale:
        log.info("backend answering again", backend=state.name)
    # Every backend's every cycle: copy_with, not replace's __init__ over every field.
    return copy_with(
        state, last=sample, last_success=sample.timestamp, alive_at=now,
        stale=False, errors_total=_added(state.errors_total, sample.errors),
        duration_buckets=buckets, duration_sum=state.duration_sum + duration,
        duration_count=state.duration_count + 1, enricher=cycle.enricher,
        joins=cycle.joins, child_restarts=cycle.child_restarts,
        reason=state.reason if not state.up else "")


def _watched(state: BackendState, limit: float, now: float) -> tuple[BackendState, float]:
    """The watchdog's look at one backend: its state with ``stale`` as its age says (the
    same object when that changes nothing), and in how many seconds it could go stale
    (NOT_WATCHED: down, stale or never opened)."""
    if not state.up or state.alive_at is None:
        return state, NOT_WATCHED
    age = now - state.alive_at
    stale = age > limit
    wake = NOT_WATCHED if stale else state.alive_at + limit - now
    if stale == state.stale:
        return state, wake
    if stale:
        log.warning("backend stale: no completed collection", backend=state.name,
                    seconds=round(age, 1))
    return replace(state, stale=stale), wake


class Watchdog:
    """Which backends are stale: opened, but no completed cycle for too long."""

    def __init__(self, config: Config, backends: Sequence[Backend]) -> None:
        # A backend on a slower tier of its own (the /proc scan) is stale only after
        # three of its own intervals, whatever --stale-after says for the fast tier.
        self.stale_after = {b.name: max(config.stale_after_seconds, 3 * (b.interval or 0))
                            for b in backends}

    def look(self, states: dict[str, BackendState], gpus: KnownGpus,
             now: float) -> tuple[bool, float]:
        """One look at ``now``: marks ``states`` stale (a stale backend's opened devices
        go to ``gpus``) or not; returns whether any changed and the seconds until the next
        backend could go stale."""
        changed = False
        wake = NOT_WATCHED
        for name, state in states.items():
            new, due = _watched(state, self.stale_after[name], now)
            wake = min(wake, due)
            if new is not state:
                changed = True
                states[name] = new
                if new.stale:
                    gpus.went_stale(name)
        # Nothing to watch (every backend down or stale): look again after a stale
        # period; a backend that comes up is watched from its next deadline on.
        if wake == NOT_WATCHED:
            wake = min(self.stale_after.values(), default=60.0)
        return changed, max(wake, 0.0)


def _added(total: Mapping[ErrorReason, int], errors: Mapping[ErrorReason, int]
           ) -> dict[ErrorReason, int]:
    out = dict(total)
    for reason, n in errors.items():
        out[reason] = out.get(reason, 0) + n
    return out


# -- the GPUs -------------------------------------------------------------------------
class KnownGpus:
    """Every GPU any backend has reported: its ``gpu`` index, and what to report for it
    once no backend does."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._numbered = False
        self._seen: dict[str, DeviceSample] = {}
        self.seen: Mapping[str, DeviceSample] = MappingProxyType({})  # read-only, per change
        # backend -> the devices its last open() returned, as they are reported (gpu_up 0)
        # should it go stale before its first sample: an alert on gpu_up == 0 still fires.
        self._opened: dict[str, tuple[DeviceSample, ...]] = {}

    @property
    def numbered(self) -> bool:
        return self._numbered

    def index(self) -> dict[str, int]:
        """Device key -> ``gpu`` index, of the devices numbered so far."""
        return {k: v for k, v in self._index.items() if v >= 0}

    def opened(self, backend: str, source: str, infos: Sequence[DeviceInfo]) -> None:
        for info in infos:
            self.register(info)
        # The source label its samples will carry (the contract's Backend.source), so
        # the gpu_up 0 series is the one its first sample continues.
        self._opened[backend] = tuple(
            DeviceSample(info=i, source=source, up=False) for i in infos if not i.parent_key)

    def accepted(self, devices: Sequence[DeviceSample]) -> None:
        for device in devices:
            if not device.primary:
                continue  # an augmenting backend never makes a device of its own
            self.register(device.info)
            known = self._seen.get(device.info.key)
            if not device.info.parent_key and (known is None or known.info != device.info):
                # (the same device as last cycle, the usual case, builds nothing)
                self._remember(DeviceSample(info=device.info, source=device.source, up=False))

    def went_stale(self, backend: str) -> None:
        """Its opened devices are reported from now on, unless a sample said more."""
        for device in self._opened.get(backend, ()):
            self._remember(device, replace_known=False)

    def _remember(self, gone: DeviceSample, replace_known: bool = True) -> None:
        """What to report (up=False) for this device once no backend reports it."""
        known = self._seen.get(gone.info.key)
        if known is None or (replace_known and known.info != gone.info):
            self._seen[gone.info.key] = gone
            self.seen = MappingProxyType(dict(self._seen))

    def register(self, info: DeviceInfo) -> None:
        """Give a device (not a slice: it carries its parent's index) its ``gpu`` index.

        Before the first numbering, keys are only collected (-1); after it, a new key
        gets the next index.
        """
        key = info.parent_key or info.key
        if key in self._index:
            return
        self._index[key] = len(self._index) if self._numbered else -1

    def number(self) -> None:
        """First numbering: every device known so far, ordered by key (PCI bus ids, then
        synthetic keys such as ``soc0``). Later: append."""
        if self._numbered:
            return
        self._index = {key: i for i, key in enumerate(sorted(self._index))}
        self._numbered = True

    def numbers_of(self, devices: Sequence[DeviceSample]) -> list[str]:
        """The ``gpu`` indices of these devices (slices: their parent's), numbered ones only."""
        return sorted({str(self._index.get(d.info.parent_key or d.info.key, -1))
                       for d in devices} - {"-1"}, key=int)

    def log_changes(self, old: BackendSample | None, new: BackendSample) -> None:
        """One line per device that appeared, was lost, came back or is gone, with the
        ``gpu`` index its series carry (where numbered yet) beside its key."""
        # Primary devices only, on both sides: an augmenting backend's (fdinfo) devices
        # are not "gone" in every cycle.
        def where(key: str) -> dict[str, object]:
            index = self._index.get(key, -1)
            return {"device": key, **({"gpu": str(index)} if index >= 0 else {})}

        before = {d.info.key: d.up for d in old.devices if d.primary} if old else {}
        after = set()
        for d in new.devices:
            if not d.primary:
                continue
            key = d.info.key
            after.add(key)
            was = before.get(key)
            if was is None and old is not None:
                log.info("gpu appeared", backend=new.backend, **where(key))
            elif was is True and not d.up:
                log.warning("gpu lost", backend=new.backend, **where(key))
            elif was is False and d.up:
                log.info("gpu back", backend=new.backend, **where(key))
        for key in before.keys() - after:
            log.warning("gpu gone", backend=new.backend, **where(key))


def log_cycle(name: str, cycle: Cycle, duration: float, gpus: list[str]) -> None:
    """``--log.level debug``: how long one cycle of a backend took, and per device (the
    cycle divided by the devices it read); the Hub calls it at most once a TIMING_INTERVAL."""
    log.debug("backend cycle", backend=name, seconds=round(duration, 6), gpus=gpus,
              devices=len(cycle.devices),
              seconds_per_device=round(duration / max(len(cycle.devices), 1), 6))
