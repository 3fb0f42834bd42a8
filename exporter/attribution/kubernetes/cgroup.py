"""Which container a process runs in, from ``/proc/<pid>/cgroup``.

Owns the parsing of the cgroup file (``parse_cgroup``, pure) and a bounded cache of
the answer per process (``ContainerCache``), read through ``ProcFS`` so tests use
fixture trees. The container runtime and the kubelet's cgroup driver decide the
path; the last path component that names a container id wins, and a ``pod<uid>``
component gives the pod:

- cgroup v2 (``0::<path>``) and v1 (``<n>:<controllers>:<path>``, every line tried);
- systemd driver: ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid
  with _>.slice/cri-containerd-<id>.scope`` (containerd), ``crio-<id>.scope`` (CRI-O),
  ``docker-<id>.scope`` (cri-dockerd); Guaranteed pods have no QoS slice;
- cgroupfs driver: ``/kubepods/besteffort/pod<uid>/<id>`` (containerd, docker),
  ``.../pod<uid>/crio-<id>`` (CRI-O); plain docker ``/docker/<id>``;
- a sub-cgroup below the container (crun's ``.../crio-<id>.scope/container``,
  ``.../<id>/kube-proxy``), a node inside a container (kind:
  ``.../kubelet.slice/kubelet-kubepods.slice/...``), and the ``<slice>:cri-containerd:<id>``
  form some containerd versions write.

tests/fixtures/k8s-node/SOURCES.md names the public captures each shape comes from.

A path under ``kubepods`` that names no container is a format we do not know: it is
counted (``cgroup_format``), never guessed. Anything else is a host process.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass

from exporter.core.fs import ProcFS
from exporter.core.labels import ErrorReason
from exporter.core.units import parse_start_time

MAX_CGROUP_BYTES = 64 * 1024  # a real file is a few hundred bytes even with v1's 13 lines
CACHE_LIMIT = 4096  # processes remembered; far above max-processes-per-gpu x GPUs

# "/" between cgroups; ":" in the systemd driver's "<slice>:<prefix>:<id>" form that some
# containerd versions leave in the path (falcosecurity/libs containerd_unknown case).
_SEPARATORS = re.compile(r"[/:]")
_CONTAINER = re.compile(
    r"(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?")
# Pod UIDs are RFC 4122 UUIDs (the systemd driver writes their dashes as underscores);
# a static pod's UID is the 32-hex hash of its manifest.
_POD = re.compile(
    r"(?:^|-)pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?$")


@dataclass(frozen=True)
class CgroupRef:
    """Where a process sits: its container id and pod UID (both None for a host process)."""

    container_id: str | None = None
    pod_uid: str | None = None


HOST = CgroupRef()


def parse_cgroup_path(path: str) -> CgroupRef | None:
    """One cgroup path -> its container/pod; HOST when it is no container; None: unknown."""
    container_id = pod_uid = None
    for part in reversed(_SEPARATORS.split(path)):
        if container_id is None and (m := _CONTAINER.fullmatch(part)):
            container_id = m.group(1)
        elif pod_uid is None and (m := _POD.search(part)):
            pod_uid = m.group(1).replace("_", "-")
    if container_id is not None:
        return CgroupRef(container_id, pod_uid)
    if pod_uid is not None or "kubepods" in path:
        return None
    return HOST


def parse_cgroup(text: str) -> CgroupRef | None:
    """The whole ``/proc/<pid>/cgroup`` file; None when no line is in a format we know."""
    found_host = False
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        ref = parse_cgroup_path(parts[2])
        if ref is None:
            return None
        if ref.container_id is not None:
            return ref
        found_host = True
    return HOST if found_host else None


class ContainerCache:
    """pid -> CgroupRef, read once per process and kept while its start time holds.

    ``lookup`` is called from the collector's merge: a pid it has seen costs a dict
    lookup; a new pid costs one read of ``stat`` and one of ``cgroup``. ``sweep`` runs
    on the kubernetes backend's own tier and drops every entry whose process exited
    or whose pid now belongs to another process (start time changed), so a reused
    pid is attributed to its old container for at most one kubernetes interval.
    Bounded: the least recently used entry goes first. Thread-safe.
    """

    def __init__(self, proc: ProcFS, limit: int = CACHE_LIMIT) -> None:
        self.proc = proc
        self.limit = limit
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, tuple[int | None, CgroupRef | None]] = OrderedDict()
        self._errors: Counter[ErrorReason] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, pid: int) -> CgroupRef | None:
        """The process's container (HOST for a host process); None when unknown."""
        with self._lock:
            entry = self._entries.get(pid)
            if entry is not None:
                self._entries.move_to_end(pid)
                return entry[1]
        start, ref, error = self._read(pid)
        with self._lock:
            if error:
                self._errors[error] += 1
            self._entries[pid] = (start, ref)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)
        return ref

    def _read(self, pid: int) -> tuple[int | None, CgroupRef | None, ErrorReason | None]:
        stat = self.proc.read_bytes(str(pid), "stat")
        raw = self.proc.read_bytes(str(pid), "cgroup")
        if raw is None or len(raw) > MAX_CGROUP_BYTES:
            # Exited, or not visible (an exporter without hostPID sees no host pids).
            start = None if stat is None else parse_start_time(stat)
            return start, None, ErrorReason.CGROUP_UNREADABLE
        start = None if stat is None else parse_start_time(stat)
        ref = parse_cgroup(raw.decode("utf-8", "replace"))
        return start, ref, None if ref is not None else ErrorReason.CGROUP_FORMAT

    def sweep(self) -> None:
        """Forget processes that exited or whose pid was reused (off the merge path)."""
        with self._lock:
            pids = list(self._entries.items())
        gone = []
        for pid, (start, _) in pids:
            stat = self.proc.read_bytes(str(pid), "stat")
            now = None if stat is None else parse_start_time(stat)
            if now is None or now != start:
                gone.append(pid)
        with self._lock:
            for pid in gone:
                self._entries.pop(pid, None)

    def take_errors(self) -> Counter[ErrorReason]:
        """Errors counted since the last call (reported in the backend's next cycle)."""
        with self._lock:
            errors, self._errors = self._errors, Counter()
        return errors
