"""File-system roots as values, and the one reader of sysfs attributes at the syscall floor.

``SysFS(root)`` and ``ProcFS(root)`` are set from ``--path.sysfs`` / ``--path.procfs``
so tests run the real readers against fixture trees. Reads are forgiving in the
ways the kernel needs: hwmon drivers return EAGAIN/ENODATA, some attributes read
as ``N/A`` or empty, copied captures are NUL-padded. Any of these gives ``None``
("not exposed"), never an exception.

``AttrReader`` is what the AMD, Intel and hwmon readers share for the values they
read every cycle (see its docstring): the layout of a card's directories is listed
once, and hot attributes are re-read with ``os.pread`` on descriptors kept open.
"""

from __future__ import annotations

import functools
import os
import resource
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TypeVar

from exporter.core import units
from exporter.core.labels import ErrorReason

MAX_ATTR_BYTES = 1 << 20  # no sysfs attribute we read is near this; bounds garbage
PAGE = 4096  # a sysfs text attribute is at most one page (Documentation/filesystems/sysfs.rst)
# O_NONBLOCK: a FIFO (or any special file) where an attribute should be must never
# block a collector thread in open() or read(); O_CLOEXEC: no leak into children.
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
FDS_PER_READER = 96  # one card: ~40 hot attributes on amdgpu, fewer on i915/xe
MAX_KEPT_FDS = 1024  # the whole process, and never more than a quarter of RLIMIT_NOFILE


class _Root:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*(p.lstrip("/") for p in parts))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"


def read_bytes(path: str | os.PathLike[str], limit: int = MAX_ATTR_BYTES) -> bytes | None:
    """Whole file (at most ``limit`` bytes), or None on any OS error (missing, EACCES,
    EAGAIN, ENODATA, EIO...). Opened non-blocking (``OPEN_FLAGS``): a FIFO where a
    file should be reads as empty instead of blocking the caller for good."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except (OSError, ValueError):
        return None
    try:
        chunks = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def clean_text(raw: bytes) -> str | None:
    """Strip NUL padding and whitespace; ``N/A`` and empty become None."""
    text = raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
    if not text or text.upper() == "N/A":
        return None
    return text


def read_text(path: Path) -> str | None:
    raw = read_bytes(path)
    return None if raw is None else clean_text(raw)


def read_int(path: Path) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


class SysFS(_Root):
    """A sysfs mount (``/sys`` or a fixture tree)."""

    def read_text(self, *parts: str) -> str | None:
        return read_text(self.path(*parts))

    def read_int(self, *parts: str) -> int | None:
        return read_int(self.path(*parts))

    def read_bytes(self, *parts: str) -> bytes | None:
        return read_bytes(self.path(*parts))


class ProcFS(_Root):
    """A procfs mount (``/proc``, the host's ``/proc`` in a container, or a fixture tree)."""

    def read_text(self, *parts: str) -> str | None:
        return read_text(self.path(*parts))

    def read_bytes(self, *parts: str) -> bytes | None:
        return read_bytes(self.path(*parts))

    def owner(self, pid: int) -> tuple[str | None, str | None]:
        """(user, command line) of a process, for the live page and ``gpu-exporter top``
        (never a label): the real uid of ``status`` as a name where this system's user
        database knows it, else the number (a container's /etc/passwd is not the
        host's); ``cmdline`` bounded and stripped of control characters
        (units.command_line). None where unreadable."""
        status = read_bytes(self.path(str(pid), "status"), PAGE)
        uid = units.parse_uid(status)
        command = units.command_line(read_bytes(self.path(str(pid), "cmdline"),
                                                4 * units.MAX_COMMAND))
        return (None if uid is None else user_name(uid)), command


@functools.lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    """The name of ``uid`` in this system's user database, else the number."""
    import pwd

    try:
        return units.printable(pwd.getpwuid(uid).pw_name, 32) or str(uid)
    except (KeyError, OverflowError):
        return str(uid)


def driver_version(sysfs: str, procfs: str, module: str) -> str:
    """A kernel driver's version: ``/sys/module/<module>/version`` where the module has one
    (an out-of-tree build: ROCm's DKMS amdgpu, Intel's backport i915), else the kernel
    release (``/proc/sys/kernel/osrelease``), which is an in-tree driver's version (those
    declare no MODULE_VERSION, so their module directory has no ``version``): what
    rocm-smi and amd-smi report for amdgpu. "" where neither can be read."""
    return (SysFS(sysfs).read_text("module", module, "version")
            or ProcFS(procfs).read_text("sys", "kernel", "osrelease") or "")


def open_files_limit() -> int | None:
    """The soft RLIMIT_NOFILE, None where it is unlimited: what the kept descriptors here
    and the HTTP server's connections (exporter.serve.server) are sized from."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def kept_fd_limit() -> int:
    """How many attribute descriptors the process may keep open: the HTTP server and
    the /proc scan need the rest of RLIMIT_NOFILE (1024 in many containers)."""
    try:
        soft = open_files_limit()
    except (OSError, ValueError):
        return 0
    return MAX_KEPT_FDS if soft is None else max(0, min(MAX_KEPT_FDS, soft // 4))


class _FdBudget:
    """The process-wide count of kept descriptors (readers live in several threads)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)

    def resize(self, limit: int) -> None:
        """A new limit; descriptors kept beyond it are kept until given back."""
        with self._lock:
            self.limit = limit


FD_BUDGET = _FdBudget(kept_fd_limit())  # resized by raise_open_files_limit


def raise_open_files_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (connections must not starve the backends),
    then FD_BUDGET sized after the new limit: the daemon calls it before any backend
    opens a file."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            pass
    FD_BUDGET.resize(kept_fd_limit())
T = TypeVar("T")
U64_TEXT = str(units.U64_MAX)  # 2^64-1: a u64 attribute's "no value", never a reading
# number()'s fast path runs for nearly every file read each cycle: its look-ups bound once.
_MAX_DIGITS, _U64_MAX, _scaled = units.MAX_DIGITS, units.U64_MAX, units.scaled


# One file of a plan for AttrReader.numbers: path, scale, unit, units.scaling(scale, unit).
Planned = tuple[str, float, str, int, float, float, float]


def planned(path: str, scale: float, unit: str) -> Planned:
    """A plan entry: ``path`` read as ``number(..., scale, unit)`` would read it."""
    return (path, scale, unit, *units.scaling(scale, unit))


class AttrReader:
    """One card's sysfs attributes: layout listed once, values re-read with ``pread``.

    - Layout: ``names(directory)`` lists a directory once and remembers it, and
      ``memo(key, build)`` keeps anything derived from the layout (hwmon channels and
      their ``*_label`` texts). Both last until ``reset()``, which the backends call
      when discovery's generation changes (hotplug) or the card goes.
    - Values: an attribute is opened once (``OPEN_FLAGS``) and re-read with
      ``os.pread(fd, PAGE, 0)``: sysfs and hwmon regenerate an attribute's content on
      every read at offset 0. At most ``FDS_PER_READER`` descriptors per reader and
      ``FD_BUDGET`` in the process are kept; past that an attribute is opened, read
      and closed each time. A descriptor that fails is closed, so a file replaced
      meanwhile (a FIFO that became a normal file again) is reopened next time.
    - One error rule, for every caller: an attribute its directory does not list is
      "not exposed" (None, not counted); one that is listed but fails with an OS error
      (EAGAIN/ENODATA from a busy SMU, EIO, a dangling link, a directory, a FIFO)
      counts under ``read``; text that is not a plausible number under ``parse``.
      ``N/A``, empty and NUL padding are "not exposed" (``clean_text``).
    """

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep  # False: open, read, close (one-off reads, tests of one file)
        self._fds: dict[str, int] = {}
        self._names: dict[str, frozenset[str]] = {}
        self._memo: dict[Hashable, object] = {}

    # -- layout ------------------------------------------------------------------

    def names(self, directory: str) -> frozenset[str]:
        """The entries of ``directory`` as first listed (empty if it cannot be listed)."""
        found = self._names.get(directory)
        if found is None:
            try:
                found = frozenset(os.listdir(directory))
            except OSError:
                found = frozenset()
            self._names[directory] = found
        return found

    def memo(self, key: Hashable, build: Callable[[], T]) -> T:
        """``build()`` once per layout (until ``reset()``)."""
        if key in self._memo:
            return self._memo[key]  # type: ignore[return-value]
        value = self._memo[key] = build()
        return value

    def relist(self) -> None:
        """Forget the layout (listings and what was derived from them), keeping the open
        descriptors: a directory whose files were still being created when it was first
        listed (a card found again before its driver finished) is listed afresh."""
        self._names.clear()
        self._memo.clear()

    def reset(self) -> None:
        """Forget the layout and close every descriptor (hotplug, card gone, close)."""
        self._names.clear()
        self._memo.clear()
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            _close(fd)
        FD_BUDGET.give(len(fds))

    close = reset

    def __del__(self) -> None:
        # A reader dropped without close() (a backend object discarded) still gives
        # its descriptors and its share of FD_BUDGET back (not at interpreter exit,
        # where module globals may already be gone: the kernel closes them then).
        try:
            self.reset()
        except Exception:  # noqa: BLE001 - nothing to report from a finaliser
            pass

    # -- values ------------------------------------------------------------------

    def raw(self, directory: str, name: str, errors: Counter[ErrorReason] | None,
            size: int = PAGE, keep: bool = True) -> bytes | None:
        """The attribute's bytes (at most ``size``); None if not listed or unreadable.

        ``keep=False`` for what is read once per layout (labels, names): no descriptor
        is spent on it."""
        listed = self._names.get(directory)  # names(), without the call: every read asks
        if name not in (listed if listed is not None else self.names(directory)):
            return None
        path = f"{directory}/{name}"
        fd = self._fds.get(path)
        if fd is not None:  # the usual case: a kept descriptor
            try:
                return os.pread(fd, size, 0)
            except OSError:
                _count(errors, ErrorReason.READ)
                self._drop(path)
                return None
        return self._open_read(path, errors, size, keep)

    def _open_read(self, path: str, errors: Counter[ErrorReason] | None, size: int,
                   keep: bool) -> bytes | None:
        """Open ``path`` (kept where the budgets allow and ``keep``) and read it."""
        kept = False
        fd: int | None = None
        try:
            fd = os.open(path, OPEN_FLAGS)
            if keep and self.keep and len(self._fds) < FDS_PER_READER and FD_BUDGET.take():
                self._fds[path] = fd
                kept = True
            data = os.pread(fd, size, 0)
        except OSError:
            _count(errors, ErrorReason.READ)
            if kept:
                self._drop(path)
            elif fd is not None:
                _close(fd)
            return None
        if not kept:
            _close(fd)
        return data

    def numbers(self, plan: Sequence[Planned],
                errors: Counter[ErrorReason] | None) -> list[float | None]:
        """``number()`` of each file of ``plan`` (``planned()`` entries), in one loop:
        what a card's fast cycle reads, its paths found once per layout by the caller
        (each one a file its directory lists). The same descriptors, errors and values
        as ``number()`` file by file, without its per-file listing check, path building,
        calls and look-ups of the unit's range."""
        fds, pread = self._fds, os.pread
        out: list[float | None] = []
        for path, scale, unit, divisor, multiplier, low, high in plan:
            fd = fds.get(path)
            if fd is None:
                raw = self._open_read(path, errors, PAGE, True)
            else:
                try:
                    raw = pread(fd, PAGE, 0)
                except OSError:
                    _count(errors, ErrorReason.READ)
                    self._drop(path)
                    raw = None
            if raw is None:
                out.append(None)
                continue
            digits = raw.strip()
            if digits.isdigit() and len(digits) <= _MAX_DIGITS:  # number()'s fast path
                as_int = int(digits)
                v = as_int / divisor if divisor else as_int * multiplier
                if low <= v <= high and as_int != _U64_MAX:  # finite: at most 20 digits
                    out.append(v)
                    continue
                _count(errors, ErrorReason.PARSE)
                out.append(None)
            else:
                out.append(_parse_number(raw, errors, scale, unit))
        return out

    def text(self, directory: str, name: str, errors: Counter[ErrorReason] | None,
             keep: bool = True) -> str | None:
        raw = self.raw(directory, name, errors, PAGE, keep)
        return None if raw is None else clean_text(raw)

    def number(self, directory: str, name: str, errors: Counter[ErrorReason] | None,
               scale: float = 1.0, unit: str = "count") -> float | None:
        """A number in base units, bounded for ``unit`` by exporter.core.units; the u64
        all-ones "no value" and garbage are dropped and counted as ``parse``."""
        raw = self.raw(directory, name, errors)
        if raw is None:
            return None
        digits = raw.strip()
        if digits.isdigit() and len(digits) <= _MAX_DIGITS:
            # The common case, a plain decimal: units bounds it without the text path.
            as_int = int(digits)
            value = None if as_int == _U64_MAX else _scaled(as_int, scale, unit)
            if value is None:
                _count(errors, ErrorReason.PARSE)
            return value
        return _parse_number(raw, errors, scale, unit)

    def link_speed(self, directory: str, name: str,
                   errors: Counter[ErrorReason] | None) -> int | None:
        """A PCI ``*_link_speed`` ("16.0 GT/s PCIe") as a PCIe generation. "Unknown"
        (no link: an iGPU, a powered-down port) is not an error; a rate that is not a
        PCIe rate is ``parse``."""
        text = self.text(directory, name, errors)
        gen = units.parse_link_speed(text)
        if gen is None and text is not None and any(c.isdigit() for c in text):
            _count(errors, ErrorReason.PARSE)
        return gen

    def link_width(self, directory: str, name: str,
                   errors: Counter[ErrorReason] | None) -> int | None:
        """A PCI ``*_link_width`` in lanes; "0" (no link) is not an error, garbage is."""
        text = self.text(directory, name, errors)
        width = units.parse_link_width(text)
        if width is None and text is not None and text.strip() != "0":
            _count(errors, ErrorReason.PARSE)
        return width

    def _drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            _close(fd)
            FD_BUDGET.give(1)

    @property
    def kept(self) -> int:
        """How many descriptors this reader holds open now."""
        return len(self._fds)


def _parse_number(raw: bytes, errors: Counter[ErrorReason] | None, scale: float,
                  unit: str) -> float | None:
    """An attribute that is not a plain decimal: the text path (hex, a sign, a
    fraction, ``N/A``, NUL padding); garbage and the u64 "no value" count as ``parse``."""
    text = clean_text(raw)
    if text is None:
        return None
    value = None if text == U64_TEXT else units.parse_scaled(text, scale, unit)
    if value is None:
        _count(errors, ErrorReason.PARSE)
    return value


def _count(errors: Counter[ErrorReason] | None, reason: ErrorReason) -> None:
    if errors is not None:
        errors[reason] += 1


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
