"""A fake kernel behind ``perf_event_open``: the exporter.sources.kernel.perf.Syscalls boundary.

It keeps the kernel's rules the backend depends on: a PMU type nobody registered or a
config the PMU does not have is ENOENT, a negative cpu is EINVAL (GPU PMUs have no
per-task context), members join their leader's group, and a group read returns
``nr, time_enabled, values...`` packed as u64. Counters advance by their step on
every read of their group, and so does the enabled time.

Configuration (a dict, or JSON through ``from_json``)::

    {"pmus": {"<type>": {
        "time_step_ns": 1000000000,                 # enabled time added per read
        "counters": {"0x2000": [start, step], ...}, # config -> first value, step per read
        "open_errno": "EACCES",                     # every open of this PMU fails so
        "read_errno": "ENODEV", "read_errno_after": 2,  # reads after the 2nd fail so
        "back": {"0x2000": 3}                       # this counter goes back on read 3
    }}}
"""

from __future__ import annotations

import errno
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.sources.kernel.perf import PerfEventAttr


@dataclass
class _Group:
    type: str
    configs: list[int] = field(default_factory=list)
    reads: int = 0


class FakePerf:
    def __init__(self, config: dict[str, Any]) -> None:
        self.pmus: dict[str, dict[str, Any]] = config.get("pmus", {})
        self._groups: dict[int, _Group] = {}  # leader fd -> group
        self._leader_of: dict[int, int] = {}  # any open fd -> its leader
        self._next_fd = 1000
        self.opens: list[tuple[int, int, int]] = []  # (type, config, cpu) of each success
        self.attempts = 0

    @classmethod
    def from_json(cls, path: str | Path) -> FakePerf:
        return cls(json.loads(Path(path).read_text()))

    @property
    def open_fds(self) -> set[int]:
        return set(self._leader_of)

    def open(self, attr: PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
        self.attempts += 1
        pmu = self.pmus.get(str(attr.type))
        if pmu is None:
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        if pmu.get("open_errno"):
            code = getattr(errno, pmu["open_errno"])
            raise OSError(code, os.strerror(code))
        if cpu < 0 or attr.sample_period or attr.size != 128:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if f"0x{attr.config:x}" not in pmu.get("counters", {}):
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        fd, self._next_fd = self._next_fd, self._next_fd + 1
        if group_fd == -1:
            self._groups[fd] = _Group(str(attr.type))
            leader = fd
        elif group_fd in self._groups:
            leader = group_fd
        else:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        self._groups[leader].configs.append(attr.config)
        self._leader_of[fd] = leader
        self.opens.append((attr.type, attr.config, cpu))
        return fd

    def read(self, fd: int, size: int) -> bytes:
        group = self._groups.get(fd)
        if group is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        pmu = self.pmus[group.type]
        group.reads += 1
        n = group.reads
        if pmu.get("read_errno") and n > pmu.get("read_errno_after", 0):
            code = getattr(errno, pmu["read_errno"])
            raise OSError(code, os.strerror(code))
        values = []
        for config in group.configs:
            key = f"0x{config:x}"
            start, step = pmu["counters"][key]
            value = start + step * n
            if pmu.get("back", {}).get(key) == n:
                value = start  # went back this read
            values.append(value)
        enabled = pmu.get("time_step_ns", 1_000_000_000) * n
        raw = struct.pack(f"={2 + len(values)}Q", len(values), enabled, *values)
        return raw[:size]

    def close(self, fd: int) -> None:
        if self._leader_of.pop(fd, None) is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        self._groups.pop(fd, None)
