"""AMD marketing names from libdrm's ``amdgpu.ids`` table (``AMD Radeon RX 6900 XT``).

amdgpu's sysfs has no name for consumer cards (``product_name`` exists only on boards
with a FRU EEPROM: Instinct, some Radeon Pro), so without amdsmi the ``name`` label
would be empty. libdrm ships the table every Mesa driver uses for the same purpose
(Debian package ``libdrm-common``, ``/usr/share/libdrm/amdgpu.ids``), one line per
``device_id,<TAB>revision_id,<TAB>product_name`` in hex, ``#`` comments, and a version
line (``1.0.0``) first. As libdrm does (``amdgpu_parse_asic_ids``), a name is found only
for the exact (device, revision) pair: the same device id is a different product at
another revision.

Where the file is: ``--path.amdgpu-ids`` when given, else ``usr/share/libdrm/amdgpu.ids``
beside the sysfs root (``/sys`` -> ``/usr/share/libdrm/amdgpu.ids``; a fixture machine's
``<machine>/sys`` -> ``<machine>/usr/share/libdrm/amdgpu.ids``; a container that mounts the
host's root at ``/host`` and reads ``/host/sys`` finds the host's table). The file is read
once, on first use; a missing or unreadable file means no names (logged once).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import structlog

from exporter import units
from exporter.fs import read_bytes

log = structlog.get_logger(__name__)

RELATIVE_PATH = Path("usr", "share", "libdrm", "amdgpu.ids")
MAX_BYTES = 1 << 20  # the real table is ~25 KB; anything far larger is not it


def default_path(sysfs_root: str) -> Path:
    """``usr/share/libdrm/amdgpu.ids`` beside the sysfs root."""
    return Path(sysfs_root).resolve().parent / RELATIVE_PATH


def parse_amdgpu_ids(text: str) -> dict[tuple[int, int], str]:
    """(device_id, revision_id) -> product name. Lines that are not entries are skipped."""
    table: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or not parts[2]:
            continue  # the version line, or garbage
        device = units.parse_int("0x" + parts[0])
        revision = units.parse_int("0x" + parts[1])
        if device is None or revision is None or not 0 <= device <= 0xFFFF \
                or not 0 <= revision <= 0xFF:
            continue
        name = "".join(ch for ch in parts[2] if ch.isprintable())[:128]
        table.setdefault((device, revision), name)
    return table


class AmdgpuIds:
    """The table of one file, loaded on first lookup."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._table: Mapping[tuple[int, int], str] | None = None

    def _load(self) -> Mapping[tuple[int, int], str]:
        raw = read_bytes(self.path)
        if raw is None or len(raw) > MAX_BYTES:
            log.info("amdgpu.ids not readable: AMD names come from sysfs only",
                     path=str(self.path))
            return {}
        return parse_amdgpu_ids(raw.decode("utf-8", "replace"))

    def name(self, device_id: str | None, revision: str | None) -> str:
        """The marketing name for sysfs ``device`` / ``revision`` text (``0x73bf``, ``0xc0``)."""
        device, rev = units.parse_int(device_id), units.parse_int(revision)
        if device is None or rev is None:
            return ""
        if self._table is None:
            self._table = self._load()
        return self._table.get((device, rev), "")
