"""The Apple Silicon backend: one long-lived ``macmon pipe`` child streaming JSON lines.

Owns the child's life cycle: started in ``open()``, watched and replaced in
``sample()``, stopped in ``close()``. macmon (https://github.com/vladkens/macmon)
reads the same IOReport / SMC counters as ``powermetrics`` without root and prints
one JSON object per interval; the newest line is the sample, so ``sample()`` never
waits for the child. What a line means is ``macmon_parse``'s business; the process
itself is ``macmon_child``'s.

A child that exits, hangs (no JSON line within 3 intervals) or prints only garbage is
counted (``gpu_exporter_collection_errors_total{backend="apple"}`` reasons
``child_exited``, ``child_hung``, ``child_garbage`` per line, ``child_start_failed``),
killed, reaped, and replaced after a back-off (the collector's, REOPEN_BACKOFF); every
replacement is counted in each cycle's ``child_restarts``. While there is
no live child with a fresh line the GPU is reported with ``gpu_up 0`` and no values.

The GPU has no PCI address: its device key and uuid are ``soc0`` (one SoC per Mac),
known before macmon has said anything and the same for every macmon release. Its
``architecture`` is the chip's generation (M1, M2, ...) from macmon's ``soc.chip_name``,
its ``driver_version`` the macOS release (the GPU driver ships with macOS).
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from collections import Counter
from collections.abc import Sequence

import structlog

from exporter.core.config import Config
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample
from exporter.sources.apple.child import Child, Line
from exporter.sources.apple.parse import MacmonValues, chip_generation, parse_macmon
from exporter.sources.base import LIBRARY, PLAIN, REOPEN_BACKOFF, BackendUnavailable, Cycle

log = structlog.get_logger(__name__)

SOURCE = "macmon"
DEVICE_KEY = "soc0"
HANG_INTERVALS = 3  # no JSON line for this many intervals: the child is hung
STARTUP_GRACE = 2.0  # seconds a new child may take before its first interval starts
FIRST_LINE_WAIT = 5.0  # open() waits at most this long for the first line (or the hang)
BACKOFF_RESET = 60.0  # a child healthy this long starts the back-off again from the bottom
MIN_INTERVAL_MS = 100  # macmon's own floor for -i


class AppleBackend:
    name = "apple"
    source = SOURCE
    priority = LIBRARY
    capabilities = PLAIN
    interval: float | None = None

    def __init__(self, config: Config, backoff: Sequence[float] = REOPEN_BACKOFF) -> None:
        self._path = config.macmon_path
        self._interval = config.interval
        self._backoff = tuple(backoff)  # seconds before each successive restart
        self._soc_info = True  # macmon < 0.6.1 rejects --soc-info: dropped when it does
        self._exe = ""
        self._child: Child | None = None
        self._dying: list[Child] = []  # killed but not reaped yet
        self._restart_at = 0.0
        self._failures = 0  # consecutive failed children: the back-off step
        self._restarts = 0
        self._seen_seq = 0  # newest line of the current child already converted
        self._values: MacmonValues | None = None  # from the current child's newest line
        self._ever = False  # a line was ever seen: from then on the GPU is reported
        self._chip = ""
        self._os_version = macos_version()  # the driver's version: read once
        self._logged = ""

    # -- Backend ------------------------------------------------------------------------
    def open(self) -> Sequence[DeviceInfo]:
        """Start the child and wait (a little) for its first line, for the SoC's name.

        A child that exits before its first line makes the backend unavailable with
        macmon's own message (not Apple Silicon, a VM, ...); the collector retries.
        """
        self.close()
        self._exe = self._resolve()
        try:
            self._child = child = self._first_line(self._start())
        except OSError as e:
            raise BackendUnavailable(f"cannot run {self._exe}: {e.strerror or e}") from e
        line = child.newest()
        if line is not None:  # converted (and its errors counted) by the first sample()
            self._chip = parse_macmon(line.doc).chip_name or self._chip
        return [self._info()]

    def sample(self, slow: bool) -> Cycle:
        errors: Counter[ErrorReason] = Counter()
        now = time.monotonic()
        self._dying = [c for c in self._dying if not c.reap()]
        child = self._child
        if child is None:
            if now >= self._restart_at:
                self._restart(now, errors)
        else:
            self._watch(child, now, errors)
        return Cycle(devices=self._devices(), errors={k: n for k, n in errors.items() if n},
                     child_restarts=self._restarts)

    def close(self) -> None:
        for child in [*self._dying, *([self._child] if self._child else [])]:
            child.stop(grace=1.0)
        self._child, self._dying, self._values = None, [], None

    # -- the child ----------------------------------------------------------------------
    def _resolve(self) -> str:
        path = self._path
        found = (path if os.path.isfile(path) and os.access(path, os.X_OK) else None) \
            if os.sep in path else shutil.which(path)
        if found is None:
            raise BackendUnavailable(
                f"macmon not found ({path}): install it (brew install macmon) or set "
                "--macmon.path")
        return found

    def _first_line(self, child: Child) -> Child:
        deadline = time.monotonic() + min(
            FIRST_LINE_WAIT, STARTUP_GRACE + HANG_INTERVALS * self._interval)
        while child.newest() is None and time.monotonic() < deadline:
            if not child.wait_eof(0.05):
                continue
            child.stop(grace=0)
            if self._soc_info and child.returncode == 2 and "soc-info" in child.stderr_tail():
                self._soc_info = False  # macmon < 0.6.1 (clap usage error): ask without it
                child = self._start()
                continue
            raise BackendUnavailable(f"{self._exe} exited with status {child.returncode}: "
                                     f"{child.stderr_tail() or 'no output'}")
        return child

    def _start(self) -> Child:
        ms = max(MIN_INTERVAL_MS, round(self._interval * 1000))
        argv = [self._exe, "pipe", "-i", str(ms)]
        if self._soc_info:
            argv.append("--soc-info")
        self._seen_seq = 0
        return Child(argv)

    def _restart(self, now: float, errors: Counter[ErrorReason]) -> None:
        self._restarts += 1
        try:
            self._child = self._start()
        except OSError as e:
            errors[ErrorReason.CHILD_START_FAILED] += 1
            self._schedule_restart(now, f"cannot run {self._exe}: {e.strerror or e}")

    def _watch(self, child: Child, now: float, errors: Counter[ErrorReason]) -> None:
        line = child.newest()
        errors[ErrorReason.CHILD_GARBAGE] += child.take_garbage()
        if line is not None and line.seq != self._seen_seq:
            self._convert(line, errors)
        if child.exited:
            problem = ErrorReason.CHILD_EXITED
        elif now - _last_heard(child, line) > HANG_INTERVALS * self._interval:
            problem = ErrorReason.CHILD_HUNG
        else:
            if line is not None and now - child.started >= BACKOFF_RESET:
                self._failures, self._logged = 0, ""  # healthy: a new failure is news
            return
        errors[problem] += 1
        if not child.stop(grace=0):
            self._dying.append(child)
        self._child, self._values = None, None
        detail = f"status {child.returncode}" if problem is ErrorReason.CHILD_EXITED else \
            f"no line for {HANG_INTERVALS} intervals"
        tail = child.stderr_tail()
        self._schedule_restart(now, f"{problem}: {detail}" + (f": {tail}" if tail else ""))

    def _schedule_restart(self, now: float, reason: str) -> None:
        delay = self._backoff[min(self._failures, len(self._backoff) - 1)]
        self._failures += 1
        self._restart_at = now + delay
        if reason != self._logged:  # one line per state change, not per restart
            log.warning("macmon child failed", backend=self.name, reason=reason,
                        restart_in_seconds=delay)
            self._logged = reason

    def _convert(self, line: Line, errors: Counter[ErrorReason]) -> None:
        values = parse_macmon(line.doc)
        errors[ErrorReason.PARSE] += values.dropped
        self._seen_seq = line.seq
        self._values = values
        self._ever = True
        if values.chip_name:
            self._chip = values.chip_name

    # -- what is reported ---------------------------------------------------------------
    def _info(self) -> DeviceInfo:
        return DeviceInfo(vendor="apple", pci_bus_id="", uuid=DEVICE_KEY, name=self._chip,
                          architecture=chip_generation(self._chip),
                          driver_version=self._os_version, device_key=DEVICE_KEY)

    def _devices(self) -> tuple[DeviceSample, ...]:
        if not self._ever:
            return ()  # nothing known yet: no series rather than a GPU "lost" at start-up
        v = self._values
        if v is None:
            return (DeviceSample(info=self._info(), source=SOURCE, up=False),)
        return (DeviceSample(
            info=self._info(), source=SOURCE,
            utilization_ratio=v.gpu_utilization_ratio,
            power_watts=v.gpu_power_watts,
            temperatures_celsius=_one("gpu", v.gpu_temperature_celsius),
            clocks_hertz=_one("graphics", v.gpu_clock_hertz),
            clocks_max_hertz=_one("graphics", v.gpu_clock_max_hertz),
            shared_memory_total_bytes=v.unified_memory_total_bytes,
            shared_memory_used_bytes=v.unified_memory_used_bytes,
            fan_speed_ratio=v.fan_speed_ratio,
        ),)


def macos_version() -> str:
    """The macOS release ("14.5"): the GPU driver (AGXG13X and its kin) ships with macOS
    and has no version of its own. ``platform.mac_ver`` reads it from
    /System/Library/CoreServices/SystemVersion.plist; "" elsewhere."""
    return platform.mac_ver()[0]


def _last_heard(child: Child, line: Line | None) -> float:
    """When the child last printed a JSON line; a new child gets a start-up grace."""
    return line.received if line is not None else child.started + STARTUP_GRACE


def _one(key: str, value: float | None) -> dict[str, float]:
    return {} if value is None else {key: value}
