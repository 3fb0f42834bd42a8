"""One device, one series: the merge of every backend's view of a device, in one place.

Several backends can see the same GPU: a vendor library and the kernel's files
(Level Zero and i915/xe sysfs, amdsmi and amdgpu sysfs), and the per-process fdinfo
scan beside either. Devices are joined by ``DeviceInfo.key`` (the PCI bus id; a
synthetic key such as ``soc0`` for a GPU without one; the MIG or partition id of a
slice). For each key the samples are ordered by their backend's priority
(``backends.base``: LIBRARY < KERNEL < DERIVED) and merged field by field:

- a scalar comes from the first sample that has it (not None);
- a mapping (temperatures by sensor, clocks, engines, ...) is merged key by key, the
  first sample that has a key wins that key; the two engine families count as one
  (a source that reports engine X in either owns X in both, so fdinfo sums never sit
  beside a driver's own figure for the same engine);
- processes are merged pid by pid, each of their fields the same way, and only then
  capped at ``--max-processes-per-gpu`` (the most device memory first): one cap per
  GPU whatever the number of sources, each cut process cut once;
- identity (name, UUID, serial, driver version, ...) takes the first non-empty value.

The source of every value is kept (``field_sources``, per field or per (field, key)),
so each series still says which backend produced it. A new source only declares its
priority; nothing here knows a vendor.

A device is up when a serving primary backend reports it up; only then are values
merged (a dashboard never shows numbers for a GPU that is lost or whose backend
stopped answering). An augmenting backend (fdinfo) never creates a device. A device a
primary backend has reported stays, with up=False, after every backend stopped
reporting it (a GPU is never silently dropped); a slice (MIG instance, partition) is
configuration and simply goes when it is no longer reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

import structlog

from exporter.core.fieldspec import value_specs
from exporter.core.model import (
    KEY_GROUPS,
    DeviceInfo,
    DeviceSample,
    DeviceValues,
    ProcessSample,
    copy_with,
)
from exporter.sources.base import Enricher

log = structlog.get_logger(__name__)

# The values to merge: the fields that declare a metric (exporter.core.model's field table).
VALUE_FIELDS = tuple(name for name, _ in value_specs(DeviceValues))
PROCESS_VALUE_FIELDS = tuple(name for name, _ in value_specs(ProcessSample))
INFO_FIELDS = tuple(f.name for f in fields(DeviceInfo))


def _mappings(cls: type) -> frozenset[str]:
    """The value fields of ``cls`` that are mappings (merged key by key): those with a
    default factory (fieldspec.mapping), known up front instead of an isinstance per value."""
    return frozenset(f.name for f in fields(cls)
                     if f.name in dict(value_specs(cls)) and f.default_factory is not MISSING)


DEVICE_MAPPINGS, PROCESS_MAPPINGS = _mappings(DeviceValues), _mappings(ProcessSample)


@dataclass(frozen=True)
class View:
    """One backend's devices as the merge sees them."""

    priority: int
    serving: bool  # open, answering, not stale: its values may be used
    devices: Sequence[DeviceSample]


def _first_info(infos: Sequence[DeviceInfo]) -> DeviceInfo:
    """Identity field by field: the best source's non-empty value."""
    best = infos[0]
    changes: dict[str, Any] = {}
    for name in INFO_FIELDS:
        value = getattr(best, name)
        if value:
            continue
        if isinstance(value, Mapping):
            merged: dict[str, str] = {}
            for info in reversed(infos):
                merged.update(getattr(info, name))
            if merged:
                changes[name] = merged
            continue
        for info in infos[1:]:
            other = getattr(info, name)
            if other:
                changes[name] = other
                break
    return replace(best, **changes) if changes else best


def _merge_values(samples: Sequence[Any], names: Iterable[str], mappings: frozenset[str],
                  source_of: Callable[..., str], base_source: str
                  ) -> tuple[dict[str, Any], dict[Any, str]]:
    """Field-by-field (and key-by-key) merge of ``samples`` in priority order.

    Returns the merged field values and the sources that differ from ``base_source``.
    ``source_of(sample, field, key)`` names the source of one value of one sample.
    """
    out: dict[str, Any] = {}
    sources: dict[Any, str] = {}
    owners: dict[tuple[str, Any], int] = {}  # (key group, key) -> index of owning sample
    if len(samples) > 1:
        for index, sample in enumerate(samples):
            for name, owned_by in KEY_GROUPS.items():
                for key in getattr(sample, name, None) or ():
                    owners.setdefault((owned_by, key), index)
    for name in names:
        group = KEY_GROUPS.get(name) if owners else None
        merged: dict[Any, Any] | None = None
        for index, sample in enumerate(samples):
            value = getattr(sample, name)
            if value is None:
                continue
            if name in mappings:
                if not value:
                    continue
                if merged is None:
                    merged = {}
                for key, v in value.items():
                    if key in merged:
                        continue
                    if group is not None and owners[(group, key)] != index:
                        continue
                    merged[key] = v
                    src = source_of(sample, name, key)
                    if src != base_source:
                        sources[(name, key)] = src
                continue
            out[name] = value
            src = source_of(sample, name, None)
            if src != base_source:
                sources[name] = src
            break
        if merged is not None:
            out[name] = merged
    return out, sources


def _device_source(d: DeviceSample, name: str, key: Any) -> str:
    return d.source_of(name, key)


def merge_processes(samples: Sequence[tuple[DeviceSample, Sequence[ProcessSample]]]
                    ) -> tuple[ProcessSample, ...]:
    """Processes of one device from several sources, pid by pid, in priority order."""
    by_pid: dict[int, list[ProcessSample]] = {}
    device_source: dict[int, str] = {}  # id(process sample) -> the source of its device
    for device, processes in samples:
        source = device.source_of("processes")
        for p in processes:
            by_pid.setdefault(p.pid, []).append(p)
            device_source[id(p)] = source

    def source_of(sample: ProcessSample, name: str, key: Any) -> str:
        fs = sample.field_sources
        return (fs.get((name, key)) or fs.get(name) if fs else None) or device_source[id(sample)]

    out = []
    for views in by_pid.values():
        first = views[0]
        base = device_source[id(first)]
        values, sources = _merge_values(views, PROCESS_VALUE_FIELDS, PROCESS_MAPPINGS,
                                         source_of, base)
        name = next((v.process for v in views if v.process), first.process)
        user = next((v.user for v in views if v.user), None)
        command = next((v.command for v in views if v.command), None)
        out.append(copy_with(first, **values, process=name, user=user, command=command,
                             source=base, field_sources=sources))
    out.sort(key=lambda p: (-(p.memory_used_bytes or 0.0), p.pid))
    return tuple(out)


def merge_device(group: Sequence[tuple[View, DeviceSample]]) -> DeviceSample | None:
    """The merged sample of one device key; None when no primary backend reports it."""
    if len(group) == 1 and (alone := _alone(*group[0])) is not None:
        return alone
    return merge_group(group)


def merge_group(group: Sequence[tuple[View, DeviceSample]]) -> DeviceSample | None:
    """merge_device's general case: identity, values and processes field by field."""
    primaries = [(v, d) for v, d in group if d.primary]
    if not primaries:
        return None
    info = _first_info([d.info for _, d in primaries])
    lead = next((d for v, d in primaries if v.serving and d.up), primaries[0][1])
    up = any(v.serving and d.up for v, d in primaries)
    if not up:
        return DeviceSample(info=info, source=lead.source, up=False)
    live = [d for v, d in group if v.serving and d.up]
    values, sources = _merge_values(live, VALUE_FIELDS, DEVICE_MAPPINGS, _device_source,
                                     lead.source)
    processes = merge_processes([(d, d.processes) for d in live if d.processes])
    return DeviceSample(info=info, source=lead.source, up=True, field_sources=sources,
                        processes=processes, **values)


def _alone(view: View, d: DeviceSample) -> DeviceSample | None:
    """The merge of a device that one serving primary backend reports up, and no other:
    what merge_group would build, without its field-by-field pass (the common case, one
    backend per GPU, where that pass was most of a publish). None where merge_group must
    run: allocations, a pid twice, a process with sources of its own."""
    if not (d.primary and view.serving and d.up) or d.allocations:
        return None
    base = d.source_of("processes")
    if d.processes and (len({p.pid for p in d.processes}) != len(d.processes)
                        or any(p.field_sources for p in d.processes)):
        return None
    # The sources merge_group records: per value present, and per key of a mapping,
    # where they differ from the sample's own source.
    values = d.__dict__
    sources: dict[Any, str] = {}
    for name in {key[0] if isinstance(key, tuple) else key for key in d.field_sources}:
        value = values.get(name)
        if value is None:
            continue
        if name in DEVICE_MAPPINGS:
            for key in value:
                if (src := d.source_of(name, key)) != d.source:
                    sources[(name, key)] = src
        elif (src := d.source_of(name)) != d.source:
            sources[name] = src
    processes = tuple(sorted((p if p.source == base else copy_with(p, source=base)
                              for p in d.processes),
                             key=lambda p: (-(p.memory_used_bytes or 0.0), p.pid)))
    if sources == d.field_sources and processes == d.processes:
        return d
    return copy_with(d, field_sources=sources, processes=processes)


def merge(views: Sequence[View], seen: Mapping[str, DeviceSample]) -> list[DeviceSample]:
    """Every device key once, merged; ``seen`` holds what to report for a vanished device."""
    groups: dict[str, list[tuple[View, DeviceSample]]] = {}
    for view in sorted(views, key=lambda v: v.priority):
        for d in view.devices:
            groups.setdefault(d.info.key, []).append((view, d))
    out = []
    for group in groups.values():
        merged = merge_device(group)
        if merged is not None:
            out.append(merged)
    present = {d.info.key for d in out}
    out.extend(gone for key, gone in seen.items() if key not in present)
    return out


def cap_processes(device: DeviceSample, limit: int) -> tuple[DeviceSample, tuple[int, ...]]:
    """Keep the ``limit`` processes holding the most device memory; return the cut pids."""
    if len(device.processes) <= limit:
        return device, ()
    ranked = sorted(device.processes, key=lambda p: (-(p.memory_used_bytes or 0.0), p.pid))
    return device.with_processes(tuple(ranked[:limit])), tuple(p.pid for p in ranked[limit:])


def cap(devices: Sequence[DeviceSample], limit: int
        ) -> tuple[list[DeviceSample], frozenset[tuple[str, int]]]:
    """Every merged device capped; returns them and the (device key, pid) pairs cut."""
    out: list[DeviceSample] = []
    cut: set[tuple[str, int]] = set()
    for device in devices:
        capped, pids = cap_processes(device, limit)
        out.append(capped)
        cut.update((device.info.key, pid) for pid in pids)
    return out, frozenset(cut)


def enrich(devices: Sequence[DeviceSample], enricher: Enricher | None) -> list[DeviceSample]:
    """Apply pod attribution after the merge. A lookup that raises attributes nothing: the
    device keeps its series, without pod labels."""
    if enricher is None:
        return list(devices)
    out = []
    for d in devices:
        try:
            allocations = tuple(enricher.allocations(d.info))
        except Exception:  # noqa: BLE001 - attribution must never cost the device its series
            allocations = ()
        processes = []
        for p in d.processes:
            try:
                ref = enricher.pod_of(p.pid)
            except Exception:  # noqa: BLE001
                ref = None
            processes.append(p if ref is None else replace(
                p, pod=ref.pod, namespace=ref.namespace, container=ref.container))
        out.append(replace(d, allocations=allocations, processes=tuple(processes)))
    return out
