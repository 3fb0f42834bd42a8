"""AMD marketing names from libdrm's ``amdgpu.ids`` table (``AMD Radeon RX 6900 XT``).

amdgpu's sysfs has no name for consumer cards (``product_name`` exists only on boards
with a FRU EEPROM: Instinct, some Radeon Pro), so without amdsmi the ``name`` label
would be empty. libdrm ships the table every Mesa driver uses for the same purpose
(Debian package ``libdrm-common``, ``/usr/share/libdrm/amdgpu.ids``), one line per
``device_id,<TAB>revision_id,<TAB>product_name`` in hex, ``#`` comments, and a version
line (``1.0.0``) first. As libdrm does (``amdgpu_parse_asic_ids``), a name is found only
for the exact (device, revision) pair: the same device id is a different product at
another revision.

Where names come from, first match wins (``lookup_paths``):

1. ``--path.amdgpu-ids`` when given (then only that table), else ``usr/share/libdrm/
   amdgpu.ids`` beside the sysfs root (``/sys`` -> ``/usr/share/libdrm/amdgpu.ids``; a
   fixture machine's ``<machine>/sys`` -> ``<machine>/usr/share/libdrm/amdgpu.ids``; a
   container that reads the host's ``/host/sys`` finds the host's table), then the one in
   the exporter's own file system (``/usr/share/libdrm/amdgpu.ids``: the container image
   installs Debian's ``libdrm-common``);
2. the PCI ids database (``pci.ids``, ``usr/share/misc`` or ``usr/share/hwdata``), beside
   the sysfs root, then (without the flag) in the exporter's own file system: a device-
   level name (``Navi 32 [Radeon RX 7700 XT / 7800 XT]``), no revision needed;
3. a stable synthetic name, ``AMD 0x747e``, so that a card always has a name to alert on.

Tables are read once, on first use. No readable amdgpu.ids at all is a warning, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from exporter.core import units, untrusted_file

log = structlog.get_logger(__name__)

RELATIVE_PATH = Path("usr", "share", "libdrm", "amdgpu.ids")
MAX_BYTES = 1 << 20  # the real table is ~25 KB; anything far larger is not it


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


PCI_IDS = (Path("usr", "share", "misc", "pci.ids"), Path("usr", "share", "hwdata", "pci.ids"))
AMD_VENDOR = "1002"
MAX_PCI_BYTES = 8 << 20  # pci.ids is ~1.5 MB


def parse_pci_ids(text: str, vendor: str = AMD_VENDOR) -> dict[int, str]:
    """Device id -> name for one vendor of a ``pci.ids`` file (``vendor  name`` lines,
    then its devices one tab in, subsystems two tabs in)."""
    table: dict[int, str] = {}
    inside = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            inside = line[:4].lower() == vendor and line[4:6] == "  "
            continue
        if not inside or line.startswith("\t\t"):
            continue
        device, _, name = line[1:].partition("  ")
        number = units.parse_int("0x" + device.strip())
        name = "".join(ch for ch in name.strip() if ch.isprintable())[:128]
        if number is not None and 0 <= number <= 0xFFFF and name:
            table.setdefault(number, name)
    return table


def lookup_paths(sysfs_root: str, flag: str | None,
                 system_root: Path = Path("/")) -> tuple[list[Path], list[Path]]:
    """(amdgpu.ids tables, pci.ids files) in the order tried, without repeats."""
    beside = Path(sysfs_root).resolve().parent
    if flag:
        tables, pcis = [Path(flag)], [beside / p for p in PCI_IDS]
    else:
        tables = [beside / RELATIVE_PATH, system_root / RELATIVE_PATH]
        pcis = [beside / p for p in PCI_IDS] + [system_root / p for p in PCI_IDS]
    return list(dict.fromkeys(tables)), list(dict.fromkeys(pcis))


def _read(path: Path, limit: int) -> str | None:
    """The file as text (exporter.core.untrusted_file: a regular file of at most
    ``limit`` bytes), None where it cannot be read so."""
    try:
        return untrusted_file.read_text(path, untrusted_file.Kind("ids file", limit), "replace")
    except OSError:
        return None


class AmdgpuIds:
    """The names of the tables and pci.ids files given, loaded on first lookup."""

    def __init__(self, tables: Sequence[Path], pci_ids: Sequence[Path] = ()) -> None:
        self.tables = list(tables)
        self.pci_ids = list(pci_ids)
        self._loaded: tuple[list[Mapping[tuple[int, int], str]], Mapping[int, str]] | None = None

    def _load(self) -> tuple[list[Mapping[tuple[int, int], str]], Mapping[int, str]]:
        tables: list[Mapping[tuple[int, int], str]] = [parse_amdgpu_ids(text) for text in
                  (_read(p, MAX_BYTES) for p in self.tables) if text is not None]
        if not tables:
            log.warning("no amdgpu.ids table readable: AMD cards without a product name in "
                        "sysfs are named from pci.ids or as AMD 0x<device>",
                        paths=[str(p) for p in self.tables],
                        hint="install libdrm-common or mount the host's /usr/share/libdrm")
        pci: Mapping[int, str] = {}
        for path in self.pci_ids:
            text = _read(path, MAX_PCI_BYTES)
            if text is not None:
                pci = parse_pci_ids(text)
                break
        return tables, pci

    def name(self, device_id: str | None, revision: str | None) -> str:
        """The marketing name for sysfs ``device`` / ``revision`` text (``0x73bf``, ``0xc0``):
        from an amdgpu.ids table (exact revision), else pci.ids, else ``AMD 0x73bf``."""
        device, rev = units.parse_int(device_id), units.parse_int(revision)
        if device is None or not 0 <= device <= 0xFFFF:
            return ""
        if self._loaded is None:
            self._loaded = self._load()
        tables, pci = self._loaded
        if rev is not None:
            for table in tables:
                if (device, rev) in table:
                    return table[(device, rev)]
        return f"AMD {pci[device]}" if device in pci else f"AMD 0x{device:04x}"
