"""File-system roots as values: every sysfs/procfs read in the project goes through these.

``SysFS(root)`` and ``ProcFS(root)`` are set from ``--path.sysfs`` / ``--path.procfs``
so tests run the real readers against fixture trees. Reads are forgiving in the
ways the kernel needs: hwmon drivers return EAGAIN/ENODATA, some attributes read
as ``N/A`` or empty, copied captures are NUL-padded. Any of these gives ``None``
("not exposed"), never an exception.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_ATTR_BYTES = 1 << 20  # no sysfs attribute we read is near this; bounds garbage


class _Root:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*(p.lstrip("/") for p in parts))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"


def read_bytes(path: Path, limit: int = MAX_ATTR_BYTES) -> bytes | None:
    """Whole file, or None on any OS error (missing, EACCES, EAGAIN, ENODATA, EIO...)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except (OSError, ValueError):
        return None


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
