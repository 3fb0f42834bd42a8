"""The processes on one NVIDIA GPU (or MIG device): NVML's process lists plus /proc.

NVML lists processes by the kind of context they hold, in three lists of the same
``nvmlProcessInfo_t`` (pid, usedGpuMemory, gpuInstanceId, computeInstanceId): compute,
graphics, and MPS compute (``nvmlDeviceGetMPSComputeRunningProcesses_v3``). A client of
the CUDA Multi-Process Service is in the third list only (its work runs in the MPS
server's context; the server, ``nvidia-cuda-mps-server``, is in the compute list), so an
exporter that reads the first two never sees it. Each process is served once, with the
kinds of list it was found in (``contexts``: compute, graphics, mps_client) and the
largest memory any list gave it. ``nvmlDeviceGetRunningProcessDetailList`` (R550+) gives
the same three lists again (plus the memory a confidential-computing GPU protects); it
is not read: it adds no process and no memory the lists above do not give.

Memory per process comes from NVML (fast tier: the list getters cost microseconds);
SM utilisation per process from ``nvmlDeviceGetProcessUtilization`` (slow tier:
milliseconds). The process name is the kernel's ``comm`` through
``units.process_name`` (the one reader every backend uses) and the host memory is the
resident set from ``statm`` (one short line, cheaper than ``status``), both read only
for the pids NVML listed and through ``ProcFS`` so a container sees the host's /proc.
The name is read once per process; the resident set when a pid is first listed and then
on the slow tier (bench/nvml_calls.py --stub --procs 64: opening ``statm`` of every GPU
process every second was most of a fast cycle's cost with many processes). A process is
its pid and its start time (``stat`` field 22, read with the resident set): a pid
reused by another process, even one NVML keeps listing, is named again. Its user and
command line (``ProcFS.owner``) are read once per process too.
On a MIG device handle the lists hold only that instance's processes, which is how a
process is attributed to its instance.

What NVML hands over is checked before it is kept (each drop counted): a pid must be one
the kernel can hand out (``units.valid_pid``: 0, the idle task, is no process), a
process's memory at most the GPU's total (``implausible``); at most ``MAX_PROCESSES``
processes a GPU are kept, the most memory first, the rest counted (``table_full``) and
forgotten (the per-process tables hold only the processes kept). A process's name is
fixed at first sight of its identity: a pid NVML still lists after its /proc entry went
keeps its ``comm`` (NVML's name for it would end its series and start another).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from exporter.core.fs import ProcFS
from exporter.core.labels import ErrorReason, ProcessContext
from exporter.core.model import ProcessSample
from exporter.core.units import parse_rss, parse_start_time, process_name, valid_pid
from exporter.core.units import ratio_from_percent as ratio
from exporter.sources.nvidia.calls import Caller, Nvml, text, u32, u64

# Each list NVML keeps and the context it stands for.
PROCESS_LISTS = ((Nvml.DEVICE_GET_COMPUTE_RUNNING_PROCESSES, ProcessContext.COMPUTE),
                 (Nvml.DEVICE_GET_GRAPHICS_RUNNING_PROCESSES, ProcessContext.GRAPHICS),
                 (Nvml.DEVICE_GET_MPS_COMPUTE_RUNNING_PROCESSES, ProcessContext.MPS_CLIENT))


def newest(nvml: Any, fn: Nvml) -> Callable[[Any], Any]:
    """``fn``'s newest version this driver has: pynvml's unversioned process getters call
    the ``_v3`` symbol and turn a driver without it into ``NVMLLibraryMismatchError``, which
    is no ``NVMLError`` (the guard would not see it). This asks for ``_v3`` and, once the
    driver says it has no such function, for ``_v2`` from then on (same struct fields)."""
    v3, v2 = getattr(nvml, f"{fn.value}_v3", None), getattr(nvml, f"{fn.value}_v2", None)
    not_found = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
    chosen: list[Any] = [v3 or v2 or getattr(nvml, fn.value)]

    def call(handle: Any) -> Any:
        try:
            return chosen[0](handle)
        except nvml.NVMLError as e:
            if chosen[0] is not v3 or v2 is None or getattr(e, "value", None) != not_found:
                raise
            chosen[0] = v2
            return v2(handle)

    return call
# Per-process utilisation (read_utilization): NVML averages each process's samples newer
# than the timestamp it is given (CPU time in microseconds, the wall clock's), from a
# sample buffer of its own. A reading describes the time since the reading before, so
# NVML is not given a timestamp older than that call (less LATE_US, for samples the driver
# records late): after a long idle the newest sample seen is old, and a process that
# turns busy would be averaged over all the idle time the buffer still holds.
# When that call was is the reader's monotonic clock's to say, not the wall clock's: a
# wall clock stepped back or forward (NTP, a VM resume) moves NVML's stamps with it, so
# the last read is placed on the wall clock as it is now (now less the monotonic time
# since). A sample stamped after now (plus LATE_US) or at or before that point is
# dropped and counted (``clock``): stamped before a step, or garbage. The newest sample
# seen keeps a sample from being counted twice only while it is not in the future, so
# one stamp from the future never silences the reader: the next read is back in step.
LATE_US = 1_000_000
MAX_PROCESSES = 1024  # processes kept per GPU: 16 x the default --max-processes-per-gpu


class ProcessReader:
    """Per-device process list with a name cache per process identity (pid, start time)."""

    def __init__(self, nvml: Any, call: Caller, proc: ProcFS) -> None:
        self.nvml = nvml
        self.call = call
        self.proc = proc
        self._names: dict[int, str] = {}
        self._owners: dict[int, tuple[str | None, str | None]] = {}  # pid -> (user, command)
        self._rss: dict[int, float | None] = {}  # pid -> bytes, from the slow tier
        self._started: dict[int, int] = {}  # pid -> start time, read with the RSS
        self._sm_util: dict[int, float] = {}  # pid -> ratio, from the last slow cycle
        self._last_util_ts = 0  # NVML timestamp (us) of the newest sample seen
        self._lists = [(fn, context, newest(nvml, fn)) for fn, context in PROCESS_LISTS]
        self._last_read: float | None = None  # the monotonic clock at the last utilisation read
        # Since that read: did a process list hold anyone, and when were they last all
        # empty (monotonic clock; None: not yet). A GPU no process used has no samples to
        # ask for.
        self._listed = False
        self._empty_at: float | None = None

    wall: Callable[[], float] = staticmethod(time.time)  # the clock of NVML's timestamps
    mono: Callable[[], float] = staticmethod(time.monotonic)  # the reader's own

    def read(self, errors: Counter[ErrorReason], slow: bool = True,
             total: float | None = None) -> tuple[ProcessSample, ...]:
        """Union of the compute, graphics and MPS client lists; a pid in several is
        reported once, with each context it holds. ``slow``: re-read every process's
        resident set (else only new pids'). ``total``: the GPU's memory in bytes, the most
        a process can hold."""
        memory: dict[int, int | None] = {}
        contexts: dict[int, dict[str, bool]] = {}
        for fn, context, getter in self._lists:
            for p in self.call.get_with(errors, fn, getter) or ():
                pid = u32(p.pid)
                if not valid_pid(pid):
                    errors[ErrorReason.IMPLAUSIBLE] += 1  # pid 0, or none the kernel has
                    continue
                assert pid is not None
                used = u64(p.usedGpuMemory)  # pynvml gives None for NVML_VALUE_NOT_AVAILABLE
                if used is not None and total is not None and used > total:
                    errors[ErrorReason.IMPLAUSIBLE] += 1  # more than the GPU has
                    used = None
                if pid in memory and memory[pid] is not None:
                    used = max(used or 0, memory[pid] or 0)  # same pid, several contexts
                memory[pid] = used
                contexts.setdefault(pid, {})[context] = True
        if len(memory) > MAX_PROCESSES:
            kept = sorted(memory, key=lambda pid: (-(memory[pid] or 0), pid))[:MAX_PROCESSES]
            errors[ErrorReason.TABLE_FULL] += len(memory) - MAX_PROCESSES
            memory = {pid: memory[pid] for pid in kept}
        if memory:
            self._listed = True
        else:
            self._empty_at = self.mono()
        self._names = {pid: n for pid, n in self._names.items() if pid in memory}
        self._owners = {pid: o for pid, o in self._owners.items() if pid in memory}
        self._rss = {pid: r for pid, r in self._rss.items() if pid in memory}
        self._started = {pid: t for pid, t in self._started.items() if pid in memory}
        out = []
        for pid, used in memory.items():
            util = self._sm_util.get(pid)
            if slow or pid not in self._rss:
                self._rss[pid] = parse_rss(self.proc.read_bytes(str(pid), "statm"), None)
                self._identify(pid)
            owner = self._owners.get(pid)
            if owner is None:
                owner = self._owners[pid] = self.proc.owner(pid)
            out.append(ProcessSample(
                pid=pid,
                process=self._name(pid),
                user=owner[0],
                command=owner[1],
                memory_used_bytes=None if used is None else float(used),
                utilization_ratio={} if util is None else {"sm": util},
                host_memory_bytes=self._rss[pid],
                contexts=contexts[pid],
            ))
        out.sort(key=lambda s: (-(s.memory_used_bytes or 0.0), s.pid))
        return tuple(out)

    def read_utilization(self, errors: Counter[ErrorReason]) -> None:
        """Per-process SM utilisation since the last slow cycle (slow tier; LATE_US).

        Not asked while no process list held anyone since the last read: no process can
        have run a kernel, and NVML's answer ("not found") costs 2-3 ms of the driver's
        CPU on an idle H200 (bench/nvml_profile.py), the largest part of an idle GPU's
        slow cycle. The read counts as made at the last empty listing, so a process
        that appears next is asked for from then on (LATE_US earlier), as after a read."""
        not_found = getattr(self.nvml, "NVML_ERROR_NOT_FOUND", 6)
        if self.call.absent(Nvml.DEVICE_GET_PROCESS_UTILIZATION):
            return
        listed, self._listed = self._listed, False
        if not listed and self._empty_at is not None:
            self._sm_util = {}
            self._last_read = self._empty_at
            return
        now, mono = int(self.wall() * 1_000_000), self.mono()
        if self._last_util_ts > now + LATE_US:
            self._last_util_ts = 0  # seen before the wall clock stepped back: resynchronise
        since = 0  # the first read: what the buffer holds
        if self._last_read is not None:
            # the last read on the wall clock as it is now, whatever the wall clock did since
            since = max(self._last_util_ts,
                        now - int((mono - self._last_read) * 1_000_000) - LATE_US)
        self._last_read = mono
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(self.call.handle, since)
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) == not_found:  # no process ran a kernel since then
                self._sm_util = {}
                return
            self.call.failed(errors, e, Nvml.DEVICE_GET_PROCESS_UTILIZATION)
            return
        latest: dict[int, tuple[int, float]] = {}
        for s in samples:
            pid, ts, sm = u32(s.pid), u64(s.timeStamp), ratio(u32(s.smUtil))
            if pid is None or ts is None or sm is None:
                continue
            if ts <= since or ts > now + LATE_US:
                # older than asked for (stamped before a clock step, or a stale entry of
                # an exited pid) or from the future: dropped, never the newest seen
                errors[ErrorReason.CLOCK] += 1
                continue
            if pid not in latest or ts >= latest[pid][0]:
                latest[pid] = (ts, sm)
            self._last_util_ts = max(self._last_util_ts, ts)
        self._sm_util = {pid: sm for pid, (_ts, sm) in latest.items()}

    def _identify(self, pid: int) -> None:
        """Forget the name of a pid that another process now holds (start time changed)."""
        stat = self.proc.read_bytes(str(pid), "stat")
        start = None if stat is None else parse_start_time(stat)
        if start is None:
            return  # gone from /proc (or another namespace's): nothing says it changed
        if self._started.setdefault(pid, start) != start:
            self._started[pid] = start
            self._names.pop(pid, None)
            self._owners.pop(pid, None)

    def _name(self, pid: int) -> str:
        name = self._names.get(pid)
        if name is None:
            comm = self.proc.read_bytes(str(pid), "comm")
            if comm is not None:
                name = process_name(comm)
            else:
                # Not in our /proc (another pid namespace): ask the driver, keep the basename.
                try:
                    name = process_name(os.path.basename(
                        text(self.nvml.nvmlSystemGetProcessName(pid))))
                except (self.nvml.NVMLError, AttributeError):
                    name = ""
            self._names[pid] = name
        return name
