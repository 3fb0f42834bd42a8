"""The one reader of files a user or another process can place: configuration files,
secrets, state files, CDI specs, anything but the kernel's own files (those are
exporter.core.fs's).

Each read follows the rules of its ``Kind``:

- a regular file only: a FIFO, a device, a socket or a directory is refused before any
  byte is read (opened non-blocking, so a FIFO cannot hold ``open()``, then ``fstat``);
- a symbolic link is not followed where the file is ours to write (``follow=False``:
  the state directory), so another user's link cannot make us read or clobber a file;
- at most ``max_bytes``: a file that says it is larger, or grows past it while read, is
  refused, never truncated into something that parses;
- a deadline for the whole read (``seconds``), checked between chunks;
- every failure is an ``UnreadableFile`` (an ``OSError``) whose message names the file
  and the rule it broke, never a byte of its contents: a secret file or a configuration
  holding a password may be the one refused.

Other modules never ``open()`` such a path themselves (tests/test_untrusted_files.py
reads the package for it); a path handed to a library that opens it itself (ssl's
certificate and CA files) is checked with ``check`` first.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass

_CHUNK = 1 << 16
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Kind:
    """A kind of untrusted file and its rules."""

    name: str  # how an error calls it: "secret file"
    max_bytes: int
    follow: bool = True  # False: a symlink is refused (a file we write ourselves)
    seconds: float = 5.0  # for the whole read


CONFIG = Kind("configuration file", 4 << 20)  # a web config with inline PEM chains
SECRET = Kind("secret file", 64 << 10)  # a token, a password (Prometheus reads 64 KiB too)
PEM = Kind("certificate or key file", 1 << 20)
STATE = Kind("state file", 64 << 10, follow=False)  # ours to write: never through a link
LIST = Kind("list file", 1 << 20)  # --dcgm.counters, Slurm's per-GPU job files


class UnreadableFile(OSError):
    """A file that was not read: ``reason`` says which rule, never what the file holds."""

    def __init__(self, path: str | os.PathLike[str], kind: Kind, reason: str,
                 code: int = errno.EINVAL) -> None:
        super().__init__(code, reason)
        self.path = os.fspath(path)
        self.kind = kind
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB"


def _file_type(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _open(path: str | os.PathLike[str], kind: Kind) -> int:
    """A descriptor on the regular file at ``path`` (its size checked), else UnreadableFile."""
    flags = _FLAGS if kind.follow else _FLAGS | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not kind.follow and e.errno == errno.ELOOP and os.path.islink(path):
            raise UnreadableFile(path, kind, f"a symbolic link (not followed: a {kind.name} "
                                 "is read only from a file of its own)", e.errno) from None
        raise UnreadableFile(path, kind, e.strerror or type(e).__name__,
                             e.errno or errno.EIO) from None
    except ValueError:  # a NUL byte in the path
        raise UnreadableFile(path, kind, "not a valid path") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(path, kind, f"{_file_type(st.st_mode)}; a regular file is "
                                 "needed")
        if st.st_size > kind.max_bytes:
            raise UnreadableFile(path, kind, f"larger than the {_size(kind.max_bytes)} a "
                                 f"{kind.name} may hold", errno.EFBIG)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check(path: str | os.PathLike[str], kind: Kind) -> None:
    """Raise UnreadableFile unless ``path`` is a file ``read`` would read: for a path a
    library opens itself (ssl's ``load_cert_chain``, ``load_verify_locations``)."""
    os.close(_open(path, kind))


def read(path: str | os.PathLike[str], kind: Kind) -> bytes:
    """The whole file under ``kind``'s rules, else UnreadableFile (an OSError)."""
    deadline = time.monotonic() + kind.seconds
    fd = _open(path, kind)
    try:
        chunks: list[bytes] = []
        got = 0
        while True:
            if time.monotonic() > deadline:
                raise UnreadableFile(path, kind, f"not read within {kind.seconds:g} s",
                                     errno.ETIMEDOUT)
            try:
                chunk = os.read(fd, min(_CHUNK, kind.max_bytes + 1 - got))
            except OSError as e:
                raise UnreadableFile(path, kind, e.strerror or type(e).__name__,
                                     e.errno or errno.EIO) from None
            if not chunk:
                return b"".join(chunks)
            got += len(chunk)
            if got > kind.max_bytes:  # grew while read
                raise UnreadableFile(path, kind, f"larger than the {_size(kind.max_bytes)} "
                                     f"a {kind.name} may hold", errno.EFBIG)
            chunks.append(chunk)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], kind: Kind, errors: str = "strict") -> str:
    """``read`` decoded as UTF-8; bytes that are not UTF-8 are an UnreadableFile naming
    the offset (``errors="replace"``: replaced instead)."""
    raw = read(path, kind)
    try:
        return raw.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise UnreadableFile(path, kind, f"not UTF-8 text ({e.reason} at byte {e.start})") \
            from None
