"""The i915 and xe PMUs as sysfs lists them: ``bus/event_source/devices/<pmu>/``.

Owns finding a GPU's PMU, and turning its ``type``, ``cpumask``, ``events/*`` and
``format/*`` files into the ``perf_event_attr.config`` of each engine counter. Pure
parsing plus small readers; nothing here opens a perf event.

- i915 registers ``i915`` for an integrated GPU and ``i915_<pci address>`` for a
  discrete one, the address's colons turned into underscores (perf reserves them:
  i915_pmu.c, i915_pmu_register). Each engine has ``<engine><N>-busy`` (also ``-wait``,
  ``-sema``), whose file reads ``config=0x...``: nanoseconds the engine was busy
  (the DOC comment of i915_pmu.c; the names are the engines' uabi names, rcs, bcs,
  vcs, vecs, ccs). There is no ``format/`` directory.
- xe (Linux 6.15 and later) registers ``xe_<pci address>`` with
  ``engine-active-ticks`` and ``engine-total-ticks`` (``event=0x02`` / ``event=0x03``)
  and the ``format/`` bit fields ``gt`` (config:60-63), ``engine_class``
  (config:20-27), ``engine_instance`` (config:12-19), later ``function``: the DOC
  comment of xe_pmu.c. Utilisation is active / total ticks of the same engine.
  Which engines exist is the driver's answer to DRM_XE_DEVICE_QUERY_ENGINES; the
  PMU answers ENOENT for any other (xe_pmu_event_init), which is how the backend
  probes them.
- ``cpumask`` names the CPU the events must be opened on (an uncore-style PMU has
  no per-task context: a negative cpu is EINVAL).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from exporter.core.fs import read_text
from exporter.core.units import parse_int

EVENT_SOURCES = ("bus", "event_source", "devices")

_NAME_RE = re.compile(r"(i915|xe)(?:_([0-9a-f]{4,8})_([0-9a-f]{2})_([0-9a-f]{2})\.([0-7]))?\Z")
_I915_BUSY_RE = re.compile(r"(rcs|bcs|vcs|vecs|ccs)(\d{1,2})-busy\Z")
_FORMAT_RE = re.compile(r"config:(\d{1,2})(?:-(\d{1,2}))?\Z")

# DRM_XE_ENGINE_CLASS_* (include/uapi/drm/xe_drm.h) -> the engines' short names, which
# exporter.sources.kernel.drm_fdinfo.engine_label turns into the `engine` label.
XE_ENGINE_CLASSES: Mapping[int, str] = MappingProxyType(
    {0: "rcs", 1: "bcs", 2: "vcs", 3: "vecs", 4: "ccs"})
XE_MAX_INSTANCE = 8  # probed 0..8, as igt's xe_pmu test does (MAX_INSTANCE 9)
XE_ACTIVE, XE_TOTAL = "engine-active-ticks", "engine-total-ticks"


@dataclass(frozen=True)
class Pmu:
    """One GPU PMU as sysfs describes it."""

    name: str  # "i915", "i915_0000_03_00.0", "xe_0000_03_00.0"
    driver: str  # "i915" or "xe"
    pci_bus_id: str | None  # None for the integrated "i915": the card at 00:02.0
    type: int  # perf_event_attr.type
    cpu: int  # the first CPU of cpumask
    events: Mapping[str, str]  # event name -> its file's text ("config=0x0")
    formats: Mapping[str, tuple[tuple[int, int], ...]]  # field -> (low bit, high bit)...


def parse_pmu_name(name: str) -> tuple[str, str | None] | None:
    """``i915_0000_03_00.0`` -> ("i915", "0000:03:00.0"); ``i915`` -> ("i915", None)."""
    m = _NAME_RE.fullmatch(name)
    if m is None or (m.group(1) == "xe" and m.group(2) is None):
        return None
    if m.group(2) is None:
        return m.group(1), None
    domain, bus, dev, fn = m.group(2, 3, 4, 5)
    return m.group(1), f"{int(domain, 16):04x}:{bus}:{dev}.{fn}"


def parse_cpumask(text: str | None) -> int | None:
    """``0``, ``0-7`` or ``0,4`` -> the first CPU; anything else None."""
    first = (text or "").strip().split(",")[0].split("-")[0]
    cpu = parse_int(first) if first.isdigit() else None
    return cpu if cpu is not None and cpu < 1 << 20 else None


def parse_format(text: str | None) -> tuple[tuple[int, int], ...] | None:
    """``config:60-63`` -> ((60, 63),); ``config:7`` -> ((7, 7),). Only ``config``
    fields (not config1/config2, which these PMUs do not use) are accepted."""
    ranges = []
    for part in (text or "").strip().split(","):
        m = _FORMAT_RE.fullmatch(part.strip())
        if m is None:
            return None
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) else low
        if not low <= high <= 63:
            return None
        ranges.append((low, high))
    return tuple(ranges) or None


def parse_terms(text: str | None) -> dict[str, int] | None:
    """An event file, ``config=0x2010`` or ``event=0x02``: term -> value (a bare term is 1)."""
    out: dict[str, int] = {}
    for part in (text or "").strip().split(","):
        key, sep, raw = part.strip().partition("=")
        value = parse_int(raw) if sep else 1
        if not key or value is None or value < 0:
            return None
        out[key] = value
    return out or None


def encode(pmu: Pmu, event: str, **fields: int) -> int | None:
    """The config of ``event`` with format ``fields`` set; None when it cannot be built
    (no such event, an unknown term, a value wider than its field)."""
    terms = parse_terms(pmu.events.get(event))
    if terms is None:
        return None
    config = 0
    for key, value in {**terms, **fields}.items():
        if key == "config":
            config |= value
            continue
        ranges = pmu.formats.get(key)
        if ranges is None:
            return None
        for low, high in ranges:
            width = high - low + 1
            config |= (value & ((1 << width) - 1)) << low
            value >>= width
        if value:
            return None  # does not fit its field
    return config if config < 1 << 64 else None


def i915_engines(pmu: Pmu) -> dict[tuple[str, int], int]:
    """(engine name, instance) -> config of its ``-busy`` counter."""
    out: dict[tuple[str, int], int] = {}
    for name in sorted(pmu.events):
        m = _I915_BUSY_RE.fullmatch(name)
        config = encode(pmu, name) if m else None
        if m and config is not None:
            out[(m.group(1), int(m.group(2)))] = config
    return out


def xe_engine_candidates(pmu: Pmu, gts: list[int]) -> dict[tuple[str, int, int], tuple[int, int]]:
    """(engine name, gt, instance) -> configs of (active ticks, total ticks), for every
    class and instance an xe GPU could have on ``gts``; the kernel says which exist."""
    out: dict[tuple[str, int, int], tuple[int, int]] = {}
    for gt in gts:
        for number, name in XE_ENGINE_CLASSES.items():
            for instance in range(XE_MAX_INSTANCE + 1):
                fields = {"gt": gt, "engine_class": number, "engine_instance": instance}
                active = encode(pmu, XE_ACTIVE, **fields)
                total = encode(pmu, XE_TOTAL, **fields)
                if active is not None and total is not None:
                    out[(name, gt, instance)] = (active, total)
    return out


def read_pmu(directory: Path) -> Pmu | None:
    """One ``event_source/devices/<name>`` directory; None when it is not a GPU PMU or
    its ``type``/``cpumask`` cannot be read."""
    parsed = parse_pmu_name(directory.name)
    if parsed is None:
        return None
    type_ = parse_int(read_text(directory / "type"))
    cpu = parse_cpumask(read_text(directory / "cpumask"))
    if type_ is None or cpu is None or not 0 < type_ < 1 << 32:
        return None
    events = {name: text for name, text in _files(directory / "events").items()
              if "." not in name}  # "rc6-residency.unit", ".scale": not events
    formats = {name: r for name, text in _files(directory / "format").items()
               if (r := parse_format(text)) is not None}
    return Pmu(directory.name, parsed[0], parsed[1], type_, cpu,
               MappingProxyType(events), MappingProxyType(formats))


def read_pmus(sysfs_root: Path) -> list[Pmu]:
    """Every i915/xe PMU registered under ``<sysfs>/bus/event_source/devices``."""
    devices = sysfs_root.joinpath(*EVENT_SOURCES)
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        return []
    return [pmu for name in names if (pmu := read_pmu(devices / name)) is not None]


def _files(directory: Path) -> dict[str, str]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return {}
    out = {}
    for name in names:
        text = read_text(directory / name)
        if text is not None:
            out[name] = text
    return out
