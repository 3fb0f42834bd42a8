"""Per-process GPU use from DRM fdinfo: the ``fdinfo`` backend (``--collector.fdinfo``,
old name ``--collector.processes``).

Owns what the DRM clients found by each /proc scan (exporter.sources.fdinfo.scan)
add up to between scans: busy counters turned into ratios, per-process and
per-device busy counters, and the DeviceSamples of the AMD/Intel GPUs they belong
to. The text format lives in exporter.sources.kernel.drm_fdinfo.

Choices (docs/vendors-fdinfo.md has the per-driver detail):
- Only amdgpu, i915 and xe are exported (vendors docs/metrics.md knows). Other drivers
  (v3d, msm, amdxdna NPUs, ...) are skipped and logged once per driver name; they
  are not errors, so a Raspberry Pi does not count one every scan.
- No card bound to one of those drivers, nothing to find: ``open()`` says so
  (backend_up 0 with the reason) instead of walking every process's fds, which is
  the whole cost of this backend on an NVIDIA-only host. The check is a listdir of
  ``class/drm`` (DrmDiscovery), so the collector repeats it on its back-off, at most
  ``retry_interval`` apart, and at once when a card is added (Hub.reprobe).
- A scan past ``processes_budget`` stops, counts ``budget``, keeps the last values
  of the clients of the pids it did not reach, and the next scan starts where this
  one stopped (at the fd, inside one process's walk), so on a very busy host every
  pid is still reached in turn.
- A busy counter that goes backwards keeps its larger previous value (the
  drm-usage-stats rule) and yields no ratio for that interval; a new client id is
  a new baseline. Ratios are clamped to 0..1.
- A busy counter that grows faster than its engines can be busy in the time since
  the last read (``units.plausible_increase``; a new client: since boot, the
  monotonic clock) is not believed: that read is dropped and counted
  (``implausible``) and the last good value stays the baseline, so one garbled
  ``18446744073709551615 ns`` neither adds 584 years nor stops the counting after it.
  A second implausible read in a row is a counter that really moved: it becomes the
  baseline, counting nothing. A new client whose first count is implausible starts
  from it, counting nothing.
- Bounded state: at most ``MAX_CLIENTS`` clients are followed (scan.py says why and
  what a scan keeps); a new client past that is counted (``table_full``) at every
  scan and not kept. Processes and their counters exist only for followed clients.
- Busy-seconds counters, per device and per (process, device), are running sums of
  the clients' increments, so they stay monotonic while clients come and go (a
  process that closes one of its two clients keeps what both did). A process's
  counters are forgotten when its pid goes, unless its identity is known and one of
  its clients is still followed (``MISSES_BEFORE_FORGET`` scans): a process missing
  from one listing of /proc comes back with its counters, a pid reused meanwhile
  starts from nothing; a device's when its card goes. A process's name is read
  once, at first sight of its identity: a later ``comm`` does not rename its series.
- A process is its pid and its start time (``/proc/<pid>/stat`` field 22; not a
  label). A pid reused between two scans (even under the same name) is a new process
  whose counters start from its own clients, not the old process's sum. Its series
  keep the same labels, so Prometheus sees the drop as a counter reset, which is
  what it is: rate() and increase() count the new process from zero, as for any
  restarted counter. For one identity a counter never goes back.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from exporter.core.config import Config
from exporter.core.fs import ProcFS, SysFS
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample, ProcessSample, pci_uuid
from exporter.core.units import bounded, clamp_ratio, plausible_increase, process_name
from exporter.sources.base import DERIVED, BackendFailed, BackendUnavailable, Capabilities, Cycle
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.fdinfo.scan import (
    MAX_CLIENTS,
    ClientKey,
    ClientRead,
    KnownCards,
    ProcScanner,
    ScanResult,
)
from exporter.sources.kernel.drm_fdinfo import VENDOR_OF_DRIVER, engine_label, memory_split

log = structlog.get_logger(__name__)

SOURCE = "fdinfo"  # per-process figures from DRM fdinfo, summed per device
MISSES_BEFORE_FORGET = 3  # scans a vanished client's baseline is kept (a flapping read)
DeviceKey = tuple[str, int]  # (pci bus id, pid): one process on one GPU
MAX_CAPACITY = 64  # engines behind one name the plausibility bound believes at most


@dataclass
class _Client:
    """What the backend keeps about one client between scans."""

    pid: int
    vendor: str
    driver: str
    ns: dict[str, tuple[int, float]] = field(default_factory=dict)  # engine -> (ns, at)
    cycles: dict[str, tuple[int, int]] = field(default_factory=dict)  # engine -> (busy, total)
    ratio: dict[str, float] = field(default_factory=dict)  # engine label -> busy share
    local_bytes: int | None = None
    host_bytes: int | None = None
    live: bool = True  # part of the current output
    misses: int = 0
    jumped: set[str] = field(default_factory=set)  # engines whose last read was implausible

    def update(self, r: ClientRead, errors: Counter[ErrorReason], *busy_ns: Counter[str]) -> None:
        """Take a new read; add this client's busy-time increments to each of ``busy_ns``."""
        s = r.stats
        self.pid, self.live, self.misses = r.pid, True, 0
        self.local_bytes, self.host_bytes = memory_split(s)
        ratio: defaultdict[str, float] = defaultdict(float)
        for engine, ns in s.engine_ns.items():
            label = engine_label(engine)
            base = self.ns.get(engine)
            if base is not None and ns < base[0]:
                continue  # went backwards: keep the larger value until it catches up
            # A new client's count is since it was opened: at most since boot.
            elapsed = r.at - base[1] if base is not None else r.at
            engines = min(s.capacity(engine), MAX_CAPACITY)
            if not plausible_increase((ns - (base[0] if base else 0)) / 1e9, elapsed, engines):
                errors[ErrorReason.IMPLAUSIBLE] += 1
                if base is not None and engine not in self.jumped:
                    self.jumped.add(engine)  # dropped: the last good value stays the baseline
                    continue
                self.jumped.discard(engine)  # twice in a row: it moved; count from here
                self.ns[engine] = (ns, r.at)
                continue
            self.jumped.discard(engine)
            for counter in busy_ns:  # a new client's whole count is news to them
                counter[label] += ns - (base[0] if base else 0)
            if base is not None and r.at > base[1]:
                ratio[label] += (ns - base[0]) / 1e9 / (r.at - base[1]) / s.capacity(engine)
            self.ns[engine] = (ns, r.at)
        for engine, busy in s.cycles.items():
            total = s.total_cycles.get(engine)
            if engine in s.engine_ns or total is None:
                continue  # msm/panfrost: drm-engine-* ns already covers it
            label = engine_label(engine)
            prev = self.cycles.get(engine)
            if prev is not None:
                if busy < prev[0] or total < prev[1]:
                    continue
                if total > prev[1]:
                    ratio[label] += (busy - prev[0]) / (total - prev[1]) / s.capacity(engine)
            self.cycles[engine] = (busy, total)
        self.ratio = dict(ratio)


def _sum_or_none(values: Iterable[int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return bounded(sum(present), "bytes") if present else None


def _ratios(values: Mapping[str, float]) -> dict[str, float]:
    """Summed ratios into 0..1 (several clients can overlap on one engine)."""
    return {k: r for k, v in sorted(values.items()) if (r := clamp_ratio(v)) is not None}


def _seconds(busy_ns: Mapping[str, int], errors: Counter[ErrorReason]) -> dict[str, float]:
    out = {}
    for label, ns in sorted(busy_ns.items()):
        seconds = bounded(ns / 1e9, "seconds")
        if seconds is None:
            errors[ErrorReason.PARSE] += 1
        else:
            out[label] = seconds
    return out


class FdinfoBackend:
    """Augmenting backend: per-process rows and fdinfo engine sums for AMD/Intel GPUs."""

    name = "fdinfo"
    source = SOURCE
    priority = DERIVED

    def __init__(self, config: Config, discovery: DrmDiscovery | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval: float | None = config.processes_interval
        # open() is a listdir of class/drm: the collector may retry it every fast cycle.
        self._fast_interval = config.interval
        self.budget = config.processes_budget
        self.clock = clock
        self.discovery = discovery or DrmDiscovery(SysFS(config.sysfs), hotplug=False)
        self.scanner = ProcScanner(ProcFS(config.procfs), clock)
        self._clients: dict[ClientKey, _Client] = {}
        # pid -> (name, RSS, user, command line)
        self._procs: dict[int, tuple[str, float | None, str | None, str | None]] = {}
        self._started: dict[int, int] = {}  # pid -> start time (clock ticks): its identity
        self._names: dict[int, str] = {}  # pid -> its name at first sight of that identity
        self._devices: dict[str, tuple[str, str]] = {}  # bus -> (vendor, driver)
        self._device_busy_ns: dict[str, Counter[str]] = {}
        self._process_busy_ns: dict[DeviceKey, Counter[str]] = {}
        self._device_engines: dict[str, set[str]] = {}  # labels that had a ratio before
        self._resume = (0, 0)
        self._over_budget = False
        self._unsupported_logged: set[str] = set()
        self._denied_logged = False

    def _known_cards(self) -> KnownCards | None:
        """The cards whose driver writes usage stats, or None when there is none."""
        cards = self.discovery.cards(VENDOR_OF_DRIVER)
        if not cards:
            return None
        return KnownCards(
            driver_of={c.pci_bus_id: c.driver for c in cards},
            bus_of_node={n: c.pci_bus_id for c in cards for n in (c.card, c.render_node) if n})

    def _no_cards(self) -> str:
        root = self.discovery.sysfs.path("class", "drm")
        return f"no amdgpu, i915 or xe card under {root}: no DRM usage stats to read"

    @property
    def capabilities(self) -> Capabilities:
        return self.discovery.capabilities(self._fast_interval)  # open() reads its list

    def open(self) -> Sequence[DeviceInfo]:
        self.discovery.start()  # udev events on a real /sys (idempotent; shared with amd)
        if self._known_cards() is None:
            raise BackendUnavailable(self._no_cards())
        try:
            self.scanner.pids()
        except OSError as e:
            raise BackendUnavailable(f"cannot list {self.scanner.proc.root}: {e.strerror}") from e
        return ()  # GPUs appear with their first client; the collector joins by pci_bus_id

    def close(self) -> None:
        # No handle to release. Client baselines are kept on purpose: forgetting them
        # would add every client's whole history to the device counters again.
        pass

    def sample(self, slow: bool) -> Cycle:
        cards = self._known_cards()
        if cards is None:  # the last such card went: back to open(), which says why
            raise BackendFailed(self._no_cards())
        try:
            pids = self.scanner.pids()
        except OSError as e:
            raise BackendFailed(f"cannot list {self.scanner.proc.root}: {e.strerror}") from e
        scan = self.scanner.scan(pids, self.clock() + self.budget, cards, self._resume,
                                 self._clients.keys())
        self._resume = scan.resume
        self._log_changes(scan)
        alive = set(pids)
        self._account(scan, alive)
        self._forget(alive, cards)
        return Cycle(devices=self._devices_out(scan.errors), errors=dict(scan.errors))

    def _forget(self, alive: set[int], cards: KnownCards) -> None:
        """Drop the state of GPUs that went and the counters of processes that exited."""
        for bus in set(self._devices) - set(cards.driver_of):
            del self._devices[bus]
            self._device_busy_ns.pop(bus, None)
            self._device_engines.pop(bus, None)
            for client in [k for k in self._clients if k[0] == bus]:
                del self._clients[client]
        # A pid missing from this listing whose identity (start time) is known and whose
        # clients are still followed may be back next scan: it keeps its counters, and
        # _read_processes tells whether it is the same process.
        owners = {st.pid for st in self._clients.values()}
        self._started = {pid: t for pid, t in self._started.items()
                         if pid in alive or pid in owners}
        for key in list(self._process_busy_ns):
            if (key[1] not in alive and key[1] not in self._started) \
                    or key[0] not in self._devices:
                del self._process_busy_ns[key]
        self._names = {pid: n for pid, n in self._names.items() if pid in self._started}

    def _read_processes(self, scan: ScanResult) -> None:
        """Name, RSS and identity of each process with a client in this scan; a pid whose
        start time changed is another process: its counters start again from nothing."""
        for pid in sorted({r.pid for r in scan.clients.values()}):
            info = self.scanner.read_process(pid)
            if info is None:
                self.scanner.count(pid, ErrorReason.VANISHED, scan.errors)
                self._procs.pop(pid, None)
                continue
            name, rss, start = info
            known = self._procs.get(pid)
            if start is not None and self._started.setdefault(pid, start) != start:
                self._started[pid] = start
                known = None  # another process: its owner is read again
                self._names.pop(pid, None)
                for key in [k for k in self._process_busy_ns if k[1] == pid]:
                    del self._process_busy_ns[key]
            if start is not None:
                name = self._names.setdefault(pid, name)  # fixed at first sight
            user, command = (known[2], known[3]) if known else self.scanner.proc.owner(pid)
            self._procs[pid] = (name, rss, user, command)

    def _account(self, scan: ScanResult, alive: set[int]) -> None:
        room = MAX_CLIENTS - len(self._clients)
        for key in [k for k in scan.clients if k not in self._clients]:
            room -= 1
            if room < 0:  # not followed, never kept (nor its process read)
                del scan.clients[key]
                scan.errors[ErrorReason.TABLE_FULL] += 1
        self._read_processes(scan)
        for key, r in scan.clients.items():
            st = self._clients.get(key)
            if st is None:
                driver = r.stats.driver or ""
                st = self._clients[key] = _Client(r.pid, VENDOR_OF_DRIVER[driver], driver)
            bus = key[0]
            st.update(r, scan.errors, self._device_busy_ns.setdefault(bus, Counter()),
                      self._process_busy_ns.setdefault((bus, r.pid), Counter()))
            self._devices.setdefault(bus, (st.vendor, st.driver))
        for key, st in list(self._clients.items()):
            if key in scan.clients:
                continue
            if st.pid in alive and st.pid not in scan.reached:
                continue  # not reached within the budget: keep its last values
            st.live, st.misses = False, st.misses + 1
            if st.misses >= MISSES_BEFORE_FORGET:
                del self._clients[key]
        owners = {st.pid for st in self._clients.values() if st.live}
        for pid in list(self._procs):
            if pid not in owners:
                del self._procs[pid]
        for st in self._clients.values():
            st.live = st.live and st.pid in self._procs

    def _devices_out(self, errors: Counter[ErrorReason]) -> list[DeviceSample]:
        grouped: dict[str, dict[int, list[_Client]]] = {bus: {} for bus in self._devices}
        for (bus, _), st in self._clients.items():
            if st.live:
                grouped[bus].setdefault(st.pid, []).append(st)
        out = []
        for bus, by_pid in sorted(grouped.items()):
            vendor, driver = self._devices[bus]
            device_ratio: defaultdict[str, float] = defaultdict(float)
            processes = []
            for pid, clients in sorted(by_pid.items()):
                ratio: defaultdict[str, float] = defaultdict(float)
                for c in clients:
                    for k, v in c.ratio.items():
                        ratio[k] += v
                        device_ratio[k] += v
                comm, rss, user, command = self._procs[pid]
                processes.append(ProcessSample(
                    pid=pid,
                    process=comm,
                    memory_used_bytes=_sum_or_none(c.local_bytes for c in clients),
                    shared_memory_used_bytes=_sum_or_none(c.host_bytes for c in clients),
                    utilization_ratio=_ratios(ratio),
                    engine_busy_seconds=_seconds(
                        self._process_busy_ns.get((bus, pid), Counter()), errors),
                    host_memory_bytes=rss,
                    user=user,
                    command=command,
                ))
            # An engine that had a ratio before and has no busy client now is idle (0),
            # not unknown; an engine seen for the first time waits for its second read.
            known = self._device_engines.setdefault(bus, set())
            util = {k: 0.0 for k in known}
            util.update(_ratios(device_ratio))
            known.update(device_ratio)
            out.append(DeviceSample(
                info=DeviceInfo(vendor=vendor, pci_bus_id=bus, uuid=pci_uuid(bus), driver=driver),
                source=SOURCE,
                primary=False,
                engine_utilization_ratio=dict(sorted(util.items())),
                engine_busy_seconds=_seconds(self._device_busy_ns.get(bus, Counter()), errors),
                processes=tuple(processes),
            ))
        return out
    def _log_denied(self, pid: int) -> None:
        """The first process whose fdinfo the kernel refused, and why that happens to this
        user (counted as errors_total{reason="permission"}, once per process)."""
        comm = self.scanner.proc.read_bytes(str(pid), "comm")
        euid = os.geteuid()
        hint = (("running as root, so a capability or a security module refuses: in a "
                 "container, add CAP_SYS_PTRACE (root's is dropped by default); else check "
                 "AppArmor/SELinux and kernel.yama.ptrace_scope")
                if euid == 0 else
                "processes of other users need CAP_SYS_PTRACE (docs/vendors-fdinfo.md)")
        log.warning("process fdinfo unreadable: permission denied", pid=pid,
                    process=process_name(comm) if comm is not None else "",
                    euid=euid, hint=hint)

    def _log_changes(self, scan: ScanResult) -> None:
        denied = self.scanner.first_denied
        if denied is not None and not self._denied_logged:
            self._denied_logged = True  # once per run: the count goes on in errors_total
            self._log_denied(denied)
        for driver in scan.unsupported - self._unsupported_logged:
            self._unsupported_logged.add(driver)
            log.info("fdinfo_driver_skipped", driver=driver,
                     reason="no vendor mapping (only amdgpu, i915, xe are exported)")
        over = ErrorReason.BUDGET in scan.errors
        if over != self._over_budget:
            self._over_budget = over
            if over:
                log.warning("process_scan_over_budget", budget_seconds=self.budget,
                            hint="the scan resumes where it stopped; raise the budget")
            else:
                log.info("process_scan_within_budget", budget_seconds=self.budget)
