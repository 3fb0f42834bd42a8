"""The walk of ``--path.procfs`` for DRM clients: one scan, its errors, the processes found.

Owns which files are read (``<pid>/fd/*`` links to ``/dev/dri/*`` or ``/dev/accel/*``,
then ``<pid>/fdinfo/<fd>`` of those fds only, ``comm``, ``statm`` and ``stat`` (the
start time) of the processes that own a client), which clients a scan keeps, and how
its failures are counted.
The fdinfo text itself is parsed by exporter.sources.kernel.drm_fdinfo; what the clients add up
to between scans is exporter.sources.fdinfo.backend's.

Choices:
- A client counts only for a GPU this machine has: its ``drm-pdev`` (or the DRM node
  its fd links to, for drivers that print none) must be a card bound to the driver
  that wrote the fdinfo. Anything else (a garbled or foreign ``drm-pdev``, a card
  that was unplugged while a process still holds its fd) is ``unknown_device``, and
  can never make a GPU of its own.
- ``permission`` and ``vanished`` count processes, not attempts: a pid is counted
  once for each while it lives. Without CAP_SYS_PTRACE every other user's process
  fails on every scan, so per-attempt counts measured scan frequency x process
  count (15,405 in three minutes on an ordinary host), not trouble.
- A client shared by several processes (fork, passed fds) belongs to the lowest pid.
- Bounded state: a scan keeps at most ``MAX_CLIENTS`` clients the backend does not
  already follow (any local user can open a render node 40 times in 4,000 processes:
  160,000 clients, 1.6 KiB each, took the daemon past 340 MiB); each one past that is
  counted (``table_full``) and read again next scan, never kept. The pids whose
  failures were counted are at most ``MAX_COUNTED_PIDS``; past that, a failure of a
  pid not in the table is counted at every scan (more counts, never more memory).
- The budget is checked inside a process's fd walk too (every ``BUDGET_CHECK_FDS``
  fds, in fd order): one process with 20,000 DRM fds took 0.98 s against 0.5 s,
  uncounted. The walk stops there, counts ``budget`` and the next scan resumes at that
  fd; a process counts as reached only when all its fds were walked in one scan, so
  the clients of the fds not walked keep their last values.
"""

from __future__ import annotations

import errno
import os
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.core.fs import ProcFS
from exporter.core.labels import ErrorReason
from exporter.core.units import parse_rss, parse_start_time, process_name
from exporter.sources.kernel.drm_fdinfo import VENDOR_OF_DRIVER, DrmClientStats, parse_fdinfo

MAX_FDINFO_BYTES = 64 * 1024  # real files are < 4 KiB; anything bigger is garbage
_DRM_PREFIXES = ("/dev/dri/", "/dev/accel/")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOT_A_CLIENT = DrmClientStats()  # a DRM node whose driver prints no usage stats
_ONCE_PER_PROCESS = frozenset({ErrorReason.PERMISSION, ErrorReason.VANISHED})
BUDGET_CHECK_FDS = 64  # fds walked between two looks at the clock (~3 ms of fdinfo reads)
# 8 GPUs x 64 processes (the default --max-processes-per-gpu) x 16 clients each: a scan
# keeps this many new clients at most (about 1.6 KiB each, 13 MiB in all).
MAX_CLIENTS = 8 * 64 * 16
MAX_COUNTED_PIDS = 1 << 15  # pids whose once-per-process failures are remembered

ClientKey = tuple[str, str]  # (pci bus id, drm-client-id)


def error_reason(err: OSError) -> ErrorReason:
    if err.errno in (errno.ENOENT, errno.ESRCH):
        return ErrorReason.VANISHED  # the process exited or closed the fd mid-scan
    if err.errno in (errno.EACCES, errno.EPERM):
        return ErrorReason.PERMISSION  # another user's process without CAP_SYS_PTRACE
    return ErrorReason.UNREADABLE


@dataclass(frozen=True)
class KnownCards:
    """The GPUs clients may belong to: from DrmDiscovery, once per scan."""

    driver_of: Mapping[str, str]  # pci bus id -> driver bound to it
    bus_of_node: Mapping[str, str]  # "card1", "renderD128" -> pci bus id


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
    reached: set[int] = field(default_factory=set)  # pids whose every fd was walked
    walked: set[int] = field(default_factory=set)  # pids with some fds walked (reached too)
    errors: Counter[ErrorReason] = field(default_factory=Counter)
    unsupported: set[str] = field(default_factory=set)  # driver names skipped
    # (pid, fd) the next scan starts at; (0, 0) after a complete scan
    resume: tuple[int, int] = (0, 0)


class ProcScanner:
    """Finds DRM clients under a procfs root. Reads each DRM fd's fdinfo once per scan."""

    def __init__(self, proc: ProcFS, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.clock = clock
        self._root = str(proc.root)
        # pid -> reasons already counted for it; only pids alive at the last scan.
        self._counted: dict[int, set[str]] = {}
        self.first_denied: int | None = None  # the first process whose files were refused
        self._known: Container[ClientKey] = frozenset()  # the current scan's ``known``

    def pids(self) -> list[int]:
        """Every process, numerically ordered. Raises OSError when procfs is unreadable."""
        return sorted(int(n) for n in os.listdir(self._root) if n.isdigit())

    def count(self, pid: int, reason: ErrorReason, errors: Counter[ErrorReason]) -> None:
        """Count one failure; ``permission``/``vanished`` once per process while it lives."""
        if reason in _ONCE_PER_PROCESS and (
                pid in self._counted or len(self._counted) < MAX_COUNTED_PIDS):
            seen = self._counted.setdefault(pid, set())
            if reason in seen:
                return
            seen.add(reason)
            if reason is ErrorReason.PERMISSION and self.first_denied is None:
                self.first_denied = pid
        errors[reason] += 1

    def scan(self, pids: Sequence[int], deadline: float, cards: KnownCards,
             resume: tuple[int, int] = (0, 0),
             known: Container[ClientKey] = frozenset()) -> ScanResult:
        """Walk ``pids`` until ``deadline``; ``known``: the clients the caller follows,
        always kept (the others only while the scan holds fewer than MAX_CLIENTS)."""
        out = ScanResult()
        self._known = known
        if self._counted:  # forget the pids that are gone: bounded by the live processes
            alive = set(pids)
            self._counted = {p: r for p, r in self._counted.items() if p in alive}
        start = bisect_left(pids, resume[0]) if resume[0] else 0
        order = [*pids[start:], *pids[:start]]
        for i, pid in enumerate(order):
            if i and self.clock() > deadline:
                out.errors[ErrorReason.BUDGET] += 1
                out.resume = (pid, 0)
                break
            first_fd = resume[1] if i == 0 and pid == resume[0] else 0
            out.walked.add(pid)
            cut = self._scan_pid(pid, cards, out, deadline, first_fd)
            if cut is not None:
                out.errors[ErrorReason.BUDGET] += 1
                out.resume = (pid, cut)
                break
            if not first_fd:
                out.reached.add(pid)
        return out

    def _scan_pid(self, pid: int, cards: KnownCards, out: ScanResult, deadline: float,
                  first_fd: int = 0) -> int | None:
        """Walk the fds of ``pid`` from ``first_fd`` on; the fd to resume at if the
        deadline passed first, else None."""
        # Links are read relative to an open fd directory: one path walk per process
        # instead of one per fd, the main cost on a host with 100k open files.
        try:
            dir_fd = os.open(f"{self._root}/{pid}/fd", _DIR_FLAGS)
        except OSError as e:
            self.count(pid, error_reason(e), out.errors)
            return None
        try:
            fds = sorted(n for name in os.listdir(dir_fd)
                         if name.isdigit() and (n := int(name)) >= first_fd)
            for walked, fd in enumerate(fds):
                if walked and walked % BUDGET_CHECK_FDS == 0 and self.clock() > deadline:
                    return fd
                try:
                    target = os.readlink(str(fd), dir_fd=dir_fd)
                except OSError as e:
                    self.count(pid, error_reason(e), out.errors)
                    continue
                if target.startswith(_DRM_PREFIXES):
                    self._read_client(pid, str(fd), target, cards, out)
        except OSError as e:
            self.count(pid, error_reason(e), out.errors)
        finally:
            os.close(dir_fd)
        return None

    def _read_client(self, pid: int, fd: str, target: str, cards: KnownCards,
                     out: ScanResult) -> None:
        try:
            with open(f"{self._root}/{pid}/fdinfo/{fd}", "rb") as f:
                raw = f.read(MAX_FDINFO_BYTES + 1)
        except OSError as e:
            self.count(pid, error_reason(e), out.errors)
            return
        at = self.clock()
        if len(raw) > MAX_FDINFO_BYTES:
            out.errors[ErrorReason.TOO_LARGE] += 1
            return
        stats = parse_fdinfo(raw.decode("utf-8", "replace"))
        if stats.driver is None:
            if stats != _NOT_A_CLIENT:
                out.errors[ErrorReason.PARSE] += 1  # drm- lines but no drm-driver: garbled
            return
        if stats.malformed:
            out.errors[ErrorReason.PARSE] += 1  # the good lines are still used
        if stats.driver not in VENDOR_OF_DRIVER:
            out.unsupported.add(stats.driver)
            return
        node = target.removesuffix(" (deleted)").rsplit("/", 1)[-1]
        bus = stats.pdev or cards.bus_of_node.get(node)
        if bus is None:
            out.errors[ErrorReason.UNKNOWN_DEVICE] += 1  # no drm-pdev, and no such node here
            return
        if cards.driver_of.get(bus) != stats.driver:
            out.errors[ErrorReason.UNKNOWN_DEVICE] += 1
            return
        # Without a client id nothing can be deduplicated: the fd itself is the client.
        cid = str(stats.client_id) if stats.client_id is not None else f"fd-{pid}-{fd}"
        key = (bus, cid)
        seen = out.clients.get(key)
        if seen is None and len(out.clients) >= MAX_CLIENTS and key not in self._known:
            out.errors[ErrorReason.TABLE_FULL] += 1  # read again next scan, never kept
            return
        if seen is None or pid < seen.pid:
            out.clients[key] = ClientRead(key, pid, stats, at)

    def read_process(self, pid: int) -> tuple[str, float | None, int | None] | None:
        """(``process`` label, RSS bytes, start time in clock ticks or None where ``stat``
        does not say), or None when the process is gone."""
        comm = self.proc.read_bytes(str(pid), "comm")
        if comm is None:
            return None
        statm = self.proc.read_bytes(str(pid), "statm")
        status = None if statm else self.proc.read_bytes(str(pid), "status")
        stat = self.proc.read_bytes(str(pid), "stat")
        start = None if stat is None else parse_start_time(stat)
        return process_name(comm), parse_rss(statm, status), start
