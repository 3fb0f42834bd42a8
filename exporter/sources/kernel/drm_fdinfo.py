"""Pure parser for DRM client usage stats (``/proc/<pid>/fdinfo/<fd>`` of a DRM node).

Owns the text format and its vendor semantics, nothing else: no file reads, no
state. The format is the kernel's Documentation/gpu/drm-usage-stats.rst, as the
drivers really print it (the shapes of public samples, each one a case in
tests/test_fdinfo_parse.py):

- ``key:<TAB>value``, but also spaces, space+TAB (amdgpu ``drm-memory-gtt: \\t``)
  or nothing after the colon; lines re-printed with leading blanks; ``grep``
  output with a ``/proc/<pid>/fdinfo/<fd>:`` prefix.
- memory in bytes, ``KiB`` or ``MiB``; engine time in ``ns``; ``drm-maxfreq-`` in
  Hz/KHz/MHz.
- keys printed twice (kernels where the DRM core and amdgpu both print
  ``drm-driver``/``drm-pdev``/``drm-client-id``): the FIRST one wins. The core
  prints first, and the pair is only used consistently as an identity.
- unknown keys (``pos``, ``pasid``, ``v3d-jobs-*``, ``drm-curfreq-*``) are ignored;
  a ``drm-`` key with a value that is not the documented shape is counted in
  ``malformed`` and dropped. Numbers go through ``units.parse_int`` and must fit a
  u64 once their unit is applied (the kernel prints u64s): a 400-digit counter is
  a dropped line, not an int that overflows every later float conversion.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.core.model import normalize_pci_bus_id
from exporter.core.units import U64_MAX, parse_int

# Bounds against a garbled or hostile file: names become label values.
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}\Z")
MAX_NAMES = 32  # engines or regions per category per client

_MEM_UNITS = {"": 1, "KiB": 1024, "MiB": 1024 * 1024}
_FREQ_UNITS = {"Hz": 1, "KHz": 1000, "kHz": 1000, "MHz": 1_000_000}
_PREFIX_RE = re.compile(r"/proc/\d+/fdinfo/\d+:")  # grep -H output

# (key prefix, field name). Longer prefixes first: "drm-engine-capacity-x" is not
# engine "capacity-x", "drm-total-cycles-x" is not memory region "cycles-x".
_SCALARS = {"drm-driver": "driver", "drm-pdev": "pdev", "drm-client-id": "client_id",
            "drm-client-name": "client_name"}
_PREFIXES = (
    ("drm-engine-capacity-", "engine_capacity"),
    ("drm-engine-", "engine_ns"),
    ("drm-total-cycles-", "total_cycles"),
    ("drm-cycles-", "cycles"),
    ("drm-maxfreq-", "maxfreq_hz"),
    ("drm-memory-", "memory"),  # deprecated alias of drm-resident-
    ("drm-resident-", "resident"),
    ("drm-total-", "total"),
    ("drm-shared-", "shared"),
    ("drm-active-", "active"),
    ("drm-purgeable-", "purgeable"),
    ("amd-", "amd"),  # amdgpu legacy: amd-memory-visible-vram, amd-requested-gtt, ...
)
_COUNT = {"": 1}
_UNIT_OF = {"engine_ns": {"ns": 1}, "maxfreq_hz": _FREQ_UNITS, "engine_capacity": _COUNT,
            "total_cycles": _COUNT, "cycles": _COUNT}  # everything else: memory units

_EMPTY: Mapping[str, int] = MappingProxyType({})


def _empty() -> Mapping[str, int]:
    return _EMPTY  # a mappingproxy default is rejected by dataclasses before Python 3.12


@dataclass(frozen=True)
class DrmClientStats:
    """One DRM client (one ``struct drm_file``) as its fdinfo described it.

    Memory maps are region -> bytes; engine maps are the driver's engine name ->
    value. ``None`` / a missing key: the driver did not print it.
    """

    driver: str | None = None
    pdev: str | None = None  # normalised "0000:03:00.0"
    client_id: int | None = None
    client_name: str | None = None
    engine_ns: Mapping[str, int] = field(default_factory=_empty)
    engine_capacity: Mapping[str, int] = field(default_factory=_empty)
    cycles: Mapping[str, int] = field(default_factory=_empty)
    total_cycles: Mapping[str, int] = field(default_factory=_empty)
    maxfreq_hz: Mapping[str, int] = field(default_factory=_empty)
    # drm-resident-*, or the legacy drm-memory-* alias where resident is not printed
    resident: Mapping[str, int] = field(default_factory=_empty)
    total: Mapping[str, int] = field(default_factory=_empty)
    shared: Mapping[str, int] = field(default_factory=_empty)
    active: Mapping[str, int] = field(default_factory=_empty)
    purgeable: Mapping[str, int] = field(default_factory=_empty)
    amd: Mapping[str, int] = field(default_factory=_empty)  # amd-* keys, bytes, key without "amd-"
    malformed: int = 0  # drm-* lines dropped for a bad value or name

    def capacity(self, engine: str) -> int:
        """Identical hardware engines behind this name; the spec says 1 when absent."""
        return self.engine_capacity.get(engine, 1)


@dataclass
class _Builder:
    scalars: dict[str, str] = field(default_factory=dict)
    maps: dict[str, dict[str, int]] = field(default_factory=dict)
    malformed: int = 0


def _number(value: str, units: Mapping[str, int]) -> int | None:
    """``"<digits> [unit]"`` -> an int in 0..u64 after the unit is applied, else None."""
    parts = value.split()
    if not 1 <= len(parts) <= 2:
        return None
    scale = units.get(parts[1] if len(parts) == 2 else "")
    number = parse_int(parts[0])
    if scale is None or number is None or number < 0:
        return None
    number *= scale
    # The kernel prints u64s: anything larger is garbage, and would not fit a float later.
    return number if number <= U64_MAX else None


def _feed(b: _Builder, key: str, value: str) -> None:
    scalar = _SCALARS.get(key)
    if scalar is not None:
        if value and scalar not in b.scalars:
            b.scalars[scalar] = value
        return
    found = next(((p, n) for p, n in _PREFIXES if key.startswith(p)), None)
    if found is None:
        return  # not a key we know: ignored, not an error
    prefix, name = found
    sub = key[len(prefix):]
    target = b.maps.setdefault(name, {})
    number = _number(value, _UNIT_OF.get(name, _MEM_UNITS))
    full = sub not in target and len(target) >= MAX_NAMES
    if number is None or not _NAME_RE.match(sub) or full:
        b.malformed += 1
        return
    target.setdefault(sub, number)  # first print wins


def parse_fdinfo(text: str) -> DrmClientStats:
    """Parse one fdinfo file. Never raises; a file with no ``drm-driver`` is not a client."""
    b = _Builder()
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("/proc/"):
            m = _PREFIX_RE.match(line)
            if m:
                line = line[m.end():]
        key, sep, value = line.partition(":")
        if not sep or not (key.startswith("drm-") or key.startswith("amd-")):
            continue
        if not _NAME_RE.match(key):
            b.malformed += 1
            continue
        _feed(b, key, value.strip())

    maps = b.maps
    resident = dict(maps.get("resident", {}))
    for region, size in maps.get("memory", {}).items():
        resident.setdefault(region, size)  # the spec: drm-memory-* aliases drm-resident-*
    capacity = {k: v for k, v in maps.get("engine_capacity", {}).items() if v > 0}
    malformed = b.malformed + len(maps.get("engine_capacity", {})) - len(capacity)

    raw_id = b.scalars.get("client_id")
    client_id = _number(raw_id, _COUNT) if raw_id is not None else None
    if raw_id is not None and client_id is None:
        malformed += 1
    pdev = b.scalars.get("pdev")
    driver = b.scalars.get("driver")

    def frozen(d: Mapping[str, int] | None) -> Mapping[str, int]:
        return MappingProxyType(dict(d)) if d else _EMPTY

    return DrmClientStats(
        driver=driver.split()[0] if driver else None,
        pdev=normalize_pci_bus_id(pdev) if pdev else None,
        client_id=client_id,
        client_name=b.scalars.get("client_name"),
        engine_ns=frozen(maps.get("engine_ns")),
        engine_capacity=frozen(capacity),
        cycles=frozen(maps.get("cycles")),
        total_cycles=frozen(maps.get("total_cycles")),
        maxfreq_hz=frozen(maps.get("maxfreq_hz")),
        resident=frozen(resident),
        total=frozen(maps.get("total")),
        shared=frozen(maps.get("shared")),
        active=frozen(maps.get("active")),
        purgeable=frozen(maps.get("purgeable")),
        amd=frozen(maps.get("amd")),
        malformed=malformed,
    )


# --- vendor semantics: which region is device-local, which engine name to export ---

VENDOR_OF_DRIVER = MappingProxyType({"amdgpu": "amd", "i915": "intel", "xe": "intel"})

# xe prints engine *classes*; export them under the names i915 uses for the same
# hardware so one dashboard covers both Intel drivers (intel_gpu_top does the same).
_ENGINE_NAMES = MappingProxyType({
    "rcs": "render", "bcs": "copy", "vcs": "video", "vecs": "video_enhance", "ccs": "compute",
    "dec": "decoder", "enc": "encoder",  # amdgpu's short names -> docs/metrics.md's
})


def engine_label(engine: str) -> str:
    """The ``engine`` label value for a driver's engine name."""
    return _ENGINE_NAMES.get(engine, engine.replace("-", "_"))


def _is_device_local(region: str) -> bool:
    # amdgpu "vram", xe "vram0".., i915 "local0".. and "stolen-local0" (LMEM)
    return region.startswith(("vram", "local", "stolen-local"))


def _is_host(region: str) -> bool:
    # amdgpu "gtt"/"cpu", xe "gtt"/"system", i915 "system0", the spec's "memory";
    # i915 "stolen-system0" is system RAM reserved for the iGPU.
    return region in ("gtt", "cpu", "memory", "stolen-system") or region.startswith(
        ("system", "stolen-system")
    )


def region_sizes(stats: DrmClientStats) -> Mapping[str, int]:
    """Bytes per region: resident where printed, else total (v3d/amdxdna print only total)."""
    sizes = dict(stats.total)
    sizes.update(stats.resident)
    return sizes


def memory_split(stats: DrmClientStats) -> tuple[int | None, int | None]:
    """(device-local bytes, host/shared bytes); None where the client has no such region.

    xe's bare "stolen" sits in VRAM on a discrete card and in system RAM on an
    iGPU: it follows the client's other regions.
    """
    sizes = region_sizes(stats)
    local = [v for r, v in sizes.items() if _is_device_local(r)]
    host = [v for r, v in sizes.items() if _is_host(r)]
    stolen = sizes.get("stolen")
    if stolen is not None:
        (local if local else host).append(stolen)
    return (sum(local) if local else None, sum(host) if host else None)
