"""``perf_event_open(2)`` through ctypes: the one door to the kernel's perf events.

Owns the ``struct perf_event_attr`` layout, the syscall, and reading a counter group.
``struct perf_event_attr`` is declared field for field from the uapi header
``<linux/perf_event.h>`` (PERF_ATTR_SIZE_VER7, 128 bytes: Linux 5.13 to 6.2 headers;
a newer kernel accepts it as an older ABI version, an older one accepts it when the
tail it does not know is zero, which ours is). tests/test_pmu_perf.py compiles a C
program against the installed header and checks every offset and the size.

Counters are opened as one group per PMU (the first event leads), with
``PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED``: one ``read()`` returns every
counter of the group sampled together plus the nanoseconds the group was enabled,
which is the wall clock intel_gpu_top divides busy time by. The xe driver asks for
exactly this ("user must group these 2 counters", drm/xe/xe_pmu: engine activity).

``Syscalls`` is the boundary: ``LIBC`` is the real one, tests/fakes/fake_perf.py a fake
with behaviour (counters that advance or go back, EACCES/EINVAL/ENODEV).
Failures are OSError with the errno, never anything else.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# <linux/perf_event.h>
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_TASK_CLOCK = 1
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_GROUP = 1 << 3
PERF_FLAG_FD_CLOEXEC = 1 << 3
# Bits of the flags word (the bit-field run that starts with ``disabled``).
FLAG_EXCLUDE_KERNEL = 1 << 5
FLAG_EXCLUDE_HV = 1 << 6

# __NR_perf_event_open per architecture (arch/*/include/uapi/asm/unistd*.h and the
# generic table used by arm64 and riscv).
SYSCALL_NUMBERS = {"x86_64": 298, "aarch64": 241, "riscv64": 241, "ppc64le": 319,
                   "ppc64": 319, "s390x": 331, "i686": 336, "armv7l": 364}


class PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` (uapi), unions flattened to their first member."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),  # union with sample_freq
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),  # disabled:1, inherit:1, ... __reserved_1:26
        ("wakeup_events", ctypes.c_uint32),  # union with wakeup_watermark
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # union with bp_addr, kprobe_func, uprobe_path
        ("config2", ctypes.c_uint64),  # union with bp_len, kprobe_addr, probe_offset
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("__reserved_2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32),
        ("__reserved_3", ctypes.c_uint32),
        ("sig_data", ctypes.c_uint64),
    ]


def counting_attr(type_: int, config: int, read_format: int = 0,
                  flags: int = 0) -> PerfEventAttr:
    """A counting (never sampling) event: GPU PMUs reject a sample period with EINVAL."""
    attr = PerfEventAttr()
    attr.type, attr.size, attr.config = type_, ctypes.sizeof(PerfEventAttr), config
    attr.read_format, attr.flags = read_format, flags
    return attr


class Syscalls(Protocol):
    """The three calls a perf counter needs; each raises OSError(errno) on failure."""

    def open(self, attr: PerfEventAttr, pid: int, cpu: int, group_fd: int,
             flags: int) -> int: ...

    def read(self, fd: int, size: int) -> bytes: ...

    def close(self, fd: int) -> None: ...


class LibcSyscalls:
    """The real kernel, through libc's ``syscall(2)``."""

    def __init__(self) -> None:
        self._number = SYSCALL_NUMBERS.get(platform.machine())
        self._syscall = None
        name = ctypes.util.find_library("c")
        if name is not None and self._number is not None:
            self._syscall = ctypes.CDLL(name, use_errno=True).syscall
            self._syscall.restype = ctypes.c_long

    def open(self, attr: PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
        if self._syscall is None:
            raise OSError(38, f"perf_event_open: no libc syscall() for {platform.machine()}")
        fd = int(self._syscall(ctypes.c_long(self._number or 0), ctypes.byref(attr),
                               ctypes.c_int(pid), ctypes.c_int(cpu), ctypes.c_int(group_fd),
                               ctypes.c_ulong(flags)))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)


LIBC: Syscalls = LibcSyscalls()


@dataclass(frozen=True)
class GroupRead:
    """One read of a counter group: nanoseconds enabled and each member's count."""

    time_enabled_ns: int
    values: tuple[int, ...]


class CounterGroup:
    """Events of one PMU opened as one group on one CPU; closed as a whole.

    ``open_group`` keeps the members the kernel accepted (an engine a fused-off part
    lacks answers ENOENT/EINVAL) and says which ones failed; the leader must open.
    """

    def __init__(self, syscalls: Syscalls, fds: list[int], opened: list[int]) -> None:
        self._syscalls, self._fds, self.opened = syscalls, fds, opened

    def read(self) -> GroupRead:
        """Raises OSError from read(2), or ValueError when the kernel's answer is short."""
        size = 8 * (2 + len(self._fds))
        raw = self._syscalls.read(self._fds[0], size)
        if len(raw) != size:
            raise ValueError(f"short perf read: {len(raw)} of {size} bytes")
        nr, enabled, *values = struct.unpack(f"={2 + len(self._fds)}Q", raw)
        if nr != len(self._fds):
            raise ValueError(f"perf group of {nr} counters, opened {len(self._fds)}")
        return GroupRead(enabled, tuple(values))

    def close(self) -> None:
        for fd in reversed(self._fds):  # members before their leader
            try:
                self._syscalls.close(fd)
            except OSError:
                pass
        self._fds = []


DENIED = frozenset({errno.EACCES, errno.EPERM})


def open_group(syscalls: Syscalls, type_: int, configs: Sequence[int], cpu: int
               ) -> tuple[CounterGroup, dict[int, int]]:
    """Open ``configs`` of PMU ``type_`` as one group on ``cpu`` (any process: pid -1).

    The first config the kernel accepts leads. Returns the group (``opened`` = the
    indexes of ``configs`` it holds) and the errno of every config that failed. A
    permission error is raised as OSError at once (nothing else would open either),
    and so is the last error when no config opened at all.
    """
    read_format = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED
    fds: list[int] = []
    opened: list[int] = []
    failed: dict[int, int] = {}
    try:
        for index, config in enumerate(configs):
            attr = counting_attr(type_, config, read_format)
            try:
                fd = syscalls.open(attr, -1, cpu, fds[0] if fds else -1, PERF_FLAG_FD_CLOEXEC)
            except OSError as exc:
                if exc.errno in DENIED:
                    raise
                failed[index] = exc.errno or 0
                continue
            fds.append(fd)
            opened.append(index)
    except BaseException:
        CounterGroup(syscalls, fds, opened).close()
        raise
    if not fds:
        code = failed[max(failed)] if failed else errno.ENOENT
        raise OSError(code, f"no perf event of PMU type {type_} opened: {os.strerror(code)}")
    return CounterGroup(syscalls, fds, opened), failed
