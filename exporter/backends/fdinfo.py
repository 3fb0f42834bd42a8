"""Per-process GPU use from DRM fdinfo: the /proc scanner and the ``processes`` backend.

Owns the walk of ``--path.procfs`` (``<pid>/fd/*`` links to ``/dev/dri/*`` or
``/dev/accel/*``, then ``<pid>/fdinfo/<fd>`` of those fds only), deduplication of
DRM clients by (device, ``drm-client-id``), and the deltas between two scans that
turn busy counters into ratios. The text format lives in exporter.fdinfo_parse.

Choices (docs/vendors-fdinfo.md has the per-driver detail):
- Only amdgpu, i915 and xe are exported (vendors METRICS.md knows). Other drivers
  (v3d, msm, amdxdna NPUs, ...) are skipped and logged once per driver name; they
  are not errors, so a Raspberry Pi does not count one every scan.
- A client shared by several processes (fork, passed fds) belongs to the lowest pid.
- A scan past ``processes_budget`` stops, counts ``budget``, keeps the last values
  of the clients of the pids it did not reach, and the next scan starts where this
  one stopped, so on a very busy host every pid is still reached in turn.
- A busy counter that goes backwards keeps its larger previous value (the
  drm-usage-stats rule) and yields no ratio for that interval; a new client id is
  a new baseline. Ratios are clamped to 0..1.
- Device-wide ``engine_busy_seconds`` is a running sum of every client's increments,
  so it stays monotonic while clients come and go.
"""

from __future__ import annotations

import errno
import os
import time
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from exporter.backends.base import DERIVED, BackendFailed, BackendUnavailable, Cycle
from exporter.config import Config
from exporter.fdinfo_parse import (
    VENDOR_OF_DRIVER,
    DrmClientStats,
    engine_label,
    memory_split,
    parse_fdinfo,
)
from exporter.fs import ProcFS, SysFS
from exporter.model import DeviceInfo, DeviceSample, ProcessSample, normalize_pci_bus_id, pci_uuid

log = structlog.get_logger(__name__)

MAX_FDINFO_BYTES = 64 * 1024  # real files are < 4 KiB; anything bigger is garbage
MISSES_BEFORE_FORGET = 3  # scans a vanished client's baseline is kept (a flapping read)
_DRM_PREFIXES = ("/dev/dri/", "/dev/accel/")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOT_A_CLIENT = DrmClientStats()  # a DRM node whose driver prints no usage stats
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

ClientKey = tuple[str, str]  # (pci bus id, drm-client-id)


def error_reason(err: OSError) -> str:
    if err.errno in (errno.ENOENT, errno.ESRCH):
        return "vanished"  # the process exited or closed the fd mid-scan
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission"  # another user's process without CAP_SYS_PTRACE
    return "unreadable"


def process_label(raw: bytes) -> str:
    """``comm`` as a label value: any bytes decode, control characters are dropped."""
    text = raw.rstrip(b"\n").decode("utf-8", "replace")
    return "".join(ch for ch in text if ch.isprintable())


def parse_rss(statm: bytes | None, status: bytes | None) -> float | None:
    """Resident set size in bytes from ``statm`` (pages), else ``status`` VmRSS (kB)."""
    if statm:
        fields = statm.split()
        if len(fields) >= 2 and fields[1].isdigit():
            return float(int(fields[1]) * _PAGE_SIZE)
    for line in (status or b"").splitlines():
        if line.startswith(b"VmRSS:"):
            parts = line.split()
            if len(parts) == 3 and parts[1].isdigit() and parts[2] == b"kB":
                return float(int(parts[1]) * 1024)
    return None


@dataclass(frozen=True)
class ClientRead:
    """One DRM client as one scan saw it."""

    key: ClientKey
    pid: int
    stats: DrmClientStats
    at: float  # time.monotonic() right after its fdinfo was read


@dataclass
class ScanResult:
    clients: dict[ClientKey, ClientRead] = field(default_factory=dict)
    reached: set[int] = field(default_factory=set)
    errors: Counter[str] = field(default_factory=Counter)
    unsupported: set[str] = field(default_factory=set)  # driver names skipped
    resume: int = 0  # pid the next scan starts at; 0 after a complete scan


class ProcScanner:
    """Finds DRM clients under a procfs root. Reads each DRM fd's fdinfo once per scan."""

    def __init__(
        self, proc: ProcFS, sys: SysFS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.proc = proc
        self.sys = sys
        self.clock = clock
        self._root = str(proc.root)
        self._nodes: dict[str, str | None] = {}  # "/dev/dri/renderD128" -> bus id, per scan

    def pids(self) -> list[int]:
        """Every process, numerically ordered. Raises OSError when procfs is unreadable."""
        return sorted(int(n) for n in os.listdir(self._root) if n.isdigit())

    def scan(self, pids: Sequence[int], deadline: float, resume: int = 0) -> ScanResult:
        out = ScanResult()
        self._nodes.clear()  # device nodes can come and go with hotplug
        start = bisect_left(pids, resume) if resume else 0
        order = [*pids[start:], *pids[:start]]
        for i, pid in enumerate(order):
            if i and self.clock() > deadline:
                out.errors["budget"] += 1
                out.resume = pid
                break
            out.reached.add(pid)
            self._scan_pid(pid, out)
        return out

    def _scan_pid(self, pid: int, out: ScanResult) -> None:
        # Links are read relative to an open fd directory: one path walk per process
        # instead of one per fd, the main cost on a host with 100k open files.
        try:
            dir_fd = os.open(f"{self._root}/{pid}/fd", _DIR_FLAGS)
        except OSError as e:
            out.errors[error_reason(e)] += 1
            return
        drm: list[tuple[str, str]] = []
        try:
            for fd in os.listdir(dir_fd):
                try:
                    target = os.readlink(fd, dir_fd=dir_fd)
                except OSError as e:
                    out.errors[error_reason(e)] += 1
                    continue
                if target.startswith(_DRM_PREFIXES):
                    drm.append((fd, target))
        except OSError as e:
            out.errors[error_reason(e)] += 1
        finally:
            os.close(dir_fd)
        for fd, target in drm:
            self._read_client(pid, fd, target, out)

    def _read_client(self, pid: int, fd: str, target: str, out: ScanResult) -> None:
        try:
            with open(f"{self._root}/{pid}/fdinfo/{fd}", "rb") as f:
                raw = f.read(MAX_FDINFO_BYTES + 1)
        except OSError as e:
            out.errors[error_reason(e)] += 1
            return
        at = self.clock()
        if len(raw) > MAX_FDINFO_BYTES:
            out.errors["too_large"] += 1
            return
        stats = parse_fdinfo(raw.decode("utf-8", "replace"))
        if stats.driver is None:
            if stats != _NOT_A_CLIENT:
                out.errors["parse"] += 1  # drm- lines but no drm-driver: garbled
            return
        if stats.malformed:
            out.errors["parse"] += 1  # the good lines are still used
        if stats.driver not in VENDOR_OF_DRIVER:
            out.unsupported.add(stats.driver)
            return
        bus = stats.pdev or self._bus_of_node(target)
        if bus is None:
            out.errors["unresolved_device"] += 1
            return
        # Without a client id nothing can be deduplicated: the fd itself is the client.
        cid = str(stats.client_id) if stats.client_id is not None else f"fd-{pid}-{fd}"
        key = (bus, cid)
        seen = out.clients.get(key)
        if seen is None or pid < seen.pid:
            out.clients[key] = ClientRead(key, pid, stats, at)

    def _bus_of_node(self, target: str) -> str | None:
        """PCI bus id of a DRM node, for drivers that print no ``drm-pdev``."""
        if target not in self._nodes:
            node = target.removesuffix(" (deleted)").rsplit("/", 1)[-1]
            cls = "accel" if target.startswith("/dev/accel/") else "drm"
            real = os.path.realpath(self.sys.path("class", cls, node, "device"))
            name = os.path.basename(real)
            ok = name.count(":") == 2 and "." in name and os.path.isdir(real)
            self._nodes[target] = normalize_pci_bus_id(name) if ok else None
        return self._nodes[target]

    def read_process(self, pid: int) -> tuple[str, float | None] | None:
        """(comm label, RSS bytes), or None when the process is gone."""
        comm = self.proc.read_bytes(str(pid), "comm")
        if comm is None:
            return None
        statm = self.proc.read_bytes(str(pid), "statm")
        status = None if statm else self.proc.read_bytes(str(pid), "status")
        return process_label(comm), parse_rss(statm, status)


@dataclass
class _Client:
    """What the backend keeps about one client between scans."""

    pid: int
    vendor: str
    driver: str
    ns: dict[str, tuple[int, float]] = field(default_factory=dict)  # engine -> (ns, at)
    cycles: dict[str, tuple[int, int]] = field(default_factory=dict)  # engine -> (busy, total)
    ratio: dict[str, float] = field(default_factory=dict)  # engine label -> 0..1
    local_bytes: int | None = None
    host_bytes: int | None = None
    live: bool = True  # part of the current output
    misses: int = 0

    def update(self, r: ClientRead, device_busy_ns: Counter[str]) -> None:
        """Take a new read; add this client's busy-time increments to ``device_busy_ns``."""
        s = r.stats
        self.pid, self.live, self.misses = r.pid, True, 0
        self.local_bytes, self.host_bytes = memory_split(s)
        ratio: defaultdict[str, float] = defaultdict(float)
        for engine, ns in s.engine_ns.items():
            label = engine_label(engine)
            base = self.ns.get(engine)
            if base is None:
                device_busy_ns[label] += ns  # all of it is news to the device counter
            elif ns < base[0]:
                continue  # went backwards: keep the larger value until it catches up
            else:
                device_busy_ns[label] += ns - base[0]
                if r.at > base[1]:
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
        self.ratio = {k: min(1.0, v) for k, v in ratio.items()}

    def busy_seconds(self) -> dict[str, float]:
        out: defaultdict[str, float] = defaultdict(float)
        for engine, (ns, _) in self.ns.items():
            out[engine_label(engine)] += ns / 1e9
        return dict(out)


def _sum_or_none(values: Iterable[int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(sum(present)) if present else None


class FdinfoBackend:
    """Augmenting backend: per-process rows and fdinfo engine sums for AMD/Intel GPUs."""

    name = "processes"
    priority = DERIVED

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval: float | None = config.processes_interval
        self.budget = config.processes_budget
        self.clock = clock
        self.scanner = ProcScanner(ProcFS(config.procfs), SysFS(config.sysfs), clock)
        self._clients: dict[ClientKey, _Client] = {}
        self._procs: dict[int, tuple[str, float | None]] = {}
        self._devices: dict[str, tuple[str, str]] = {}  # bus -> (vendor, driver)
        self._device_busy_ns: dict[str, Counter[str]] = {}
        self._device_engines: dict[str, set[str]] = {}  # labels that had a ratio before
        self._resume = 0
        self._over_budget = False
        self._unsupported_logged: set[str] = set()

    def open(self) -> Sequence[DeviceInfo]:
        try:
            self.scanner.pids()
        except OSError as e:
            raise BackendUnavailable(f"cannot list {self.scanner.proc.root}: {e.strerror}") from e
        return ()  # GPUs appear with their first client; the renderer joins by pci_bus_id

    def close(self) -> None:
        # No handle to release. Client baselines are kept on purpose: forgetting them
        # would add every client's whole history to the device counters again.
        pass

    def sample(self, slow: bool) -> Cycle:
        try:
            pids = self.scanner.pids()
        except OSError as e:
            raise BackendFailed(f"cannot list {self.scanner.proc.root}: {e.strerror}") from e
        scan = self.scanner.scan(pids, self.clock() + self.budget, self._resume)
        self._resume = scan.resume
        self._log_changes(scan)
        self._account(scan, set(pids))
        return Cycle(devices=self._devices_out(), errors=dict(scan.errors))

    def _account(self, scan: ScanResult, alive: set[int]) -> None:
        for key, r in scan.clients.items():
            st = self._clients.get(key)
            if st is None:
                driver = r.stats.driver or ""
                st = self._clients[key] = _Client(r.pid, VENDOR_OF_DRIVER[driver], driver)
            busy = self._device_busy_ns.setdefault(key[0], Counter())
            st.update(r, busy)
            self._devices.setdefault(key[0], (st.vendor, st.driver))
        for key, st in list(self._clients.items()):
            if key in scan.clients:
                continue
            if st.pid in alive and st.pid not in scan.reached:
                continue  # not reached within the budget: keep its last values
            st.live, st.misses = False, st.misses + 1
            if st.misses >= MISSES_BEFORE_FORGET:
                del self._clients[key]
        owners = {st.pid for st in self._clients.values() if st.live}
        for pid in owners & scan.reached:
            info = self.scanner.read_process(pid)
            if info is None:
                scan.errors["vanished"] += 1
                self._procs.pop(pid, None)
            else:
                self._procs[pid] = info
        for pid in list(self._procs):
            if pid not in owners:
                del self._procs[pid]
        for st in self._clients.values():
            st.live = st.live and st.pid in self._procs

    def _devices_out(self) -> list[DeviceSample]:
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
                busy: defaultdict[str, float] = defaultdict(float)
                for c in clients:
                    for k, v in c.ratio.items():
                        ratio[k] += v
                        device_ratio[k] += v
                    for k, v in c.busy_seconds().items():
                        busy[k] += v
                comm, rss = self._procs[pid]
                processes.append(ProcessSample(
                    pid=pid,
                    process=comm,
                    memory_used_bytes=_sum_or_none(c.local_bytes for c in clients),
                    shared_memory_used_bytes=_sum_or_none(c.host_bytes for c in clients),
                    utilization_ratio={k: min(1.0, v) for k, v in sorted(ratio.items())},
                    engine_busy_seconds=dict(sorted(busy.items())),
                    host_memory_bytes=rss,
                ))
            # An engine that had a ratio before and has no busy client now is idle (0),
            # not unknown; an engine seen for the first time waits for its second read.
            known = self._device_engines.setdefault(bus, set())
            util = {k: 0.0 for k in known}
            util.update({k: min(1.0, v) for k, v in device_ratio.items()})
            known.update(device_ratio)
            busy_ns = self._device_busy_ns.get(bus, Counter())
            out.append(DeviceSample(
                info=DeviceInfo(vendor=vendor, pci_bus_id=bus, uuid=pci_uuid(bus), driver=driver),
                source="fdinfo",
                primary=False,
                engine_utilization_ratio=dict(sorted(util.items())),
                engine_busy_seconds={k: v / 1e9 for k, v in sorted(busy_ns.items())},
                processes=tuple(processes),
            ))
        return out

    def _log_changes(self, scan: ScanResult) -> None:
        for driver in scan.unsupported - self._unsupported_logged:
            self._unsupported_logged.add(driver)
            log.info("fdinfo_driver_skipped", driver=driver,
                     reason="no vendor mapping (only amdgpu, i915, xe are exported)")
        over = "budget" in scan.errors
        if over != self._over_budget:
            self._over_budget = over
            if over:
                log.warning("process_scan_over_budget", budget_seconds=self.budget,
                            hint="the scan resumes where it stopped; raise the budget")
            else:
                log.info("process_scan_within_budget", budget_seconds=self.budget)
