"""Merged devices -> prometheus-client metric families, driven by the field table.

Every value family comes from the ``MetricSpec`` its ``DeviceSample`` / ``ProcessSample``
field declares (``exporter.core.model``): name, help, type and the label names of a mapping's
key. The families are built fresh from an immutable Snapshot on every render (no stateful
``Gauge.labels().set()``), so a process or GPU that is gone is simply not there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from exporter.core.config import MetricNames
from exporter.core.fieldspec import Cadence, Kind, MetricSpec, Otlp, value_specs
from exporter.core.model import DeviceSample, DeviceValues, PodRef, ProcessSample
from exporter.output import dcgm
from exporter.output.render.selection import Selection
from exporter.pipeline import health
from exporter.pipeline.health import Verdict
from exporter.pipeline.state import Snapshot

GPU_LABELS = ("gpu", "uuid", "vendor", "source")
PROCESS_LABELS = (*GPU_LABELS, "pid", "process")
INFO_LABELS = (*GPU_LABELS, "name", "pci_bus_id", "driver", "driver_version", "vbios_version",
               "compute_capability", "architecture", "serial")
POD_LABELS = ("container", "pod", "namespace")
ALLOCATION_SOURCE = "kubelet"  # the kubelet's pod-resources API

# The per-GPU families that are not values of a sample.
INFO = MetricSpec("gpu_info", "GPU identity; value 1.", labels=INFO_LABELS[len(GPU_LABELS):],
                  note="`partition`, `mig_mode` where the source knows them.",
                  otlp=Otlp("gpu.info", "{info}"),  # NVIDIA's MIG mode is asked on the slow tier
                  cadence=Cadence.STATIC, cadence_by={"nvidia": Cadence.SLOW})
UP = MetricSpec("gpu_up", "1 if the GPU was readable at the last sample, 0 if lost or its "
                "backend stopped answering.",
                otlp=Otlp("hw.status", "1", updown=True, constant={"hw.state": "ok"}))
ALLOCATION = MetricSpec("gpu_kubernetes_allocation_info",
                        "Which container the kubelet allocated this GPU to; value 1.",
                        labels=(*POD_LABELS, "resource", "pod_uid", "claim"),
                        note="Source `kubelet`. `claim` is `<namespace>/<name>` of a DRA "
                        "claim, empty for a device-plugin allocation; `resource` is then the "
                        "DRA driver's name.",
                        otlp=Otlp("gpu.kubernetes.allocation", "{info}"))
DEVICE_SPECS = value_specs(DeviceValues)
PROCESS_SPECS = value_specs(ProcessSample)
# The table split by shape once, so a render does no per-value type tests:
# (field, spec) of scalars, of mappings keyed by label value(s), of one family per key.
SCALARS = tuple((n, s) for n, s in DEVICE_SPECS if s.served and not s.labels and not s.per_key)
LABELLED = tuple((n, s) for n, s in DEVICE_SPECS if s.labels)
PER_KEY = tuple((n, s) for n, s in DEVICE_SPECS if s.per_key)
PROCESS_SCALARS = tuple((n, s) for n, s in PROCESS_SPECS if not s.labels)
PROCESS_LABELLED = tuple((n, s) for n, s in PROCESS_SPECS if s.labels)


def families_of(spec: MetricSpec) -> tuple[tuple[str, str], ...]:
    """(family name, help) of every family a spec serves: one, or one per key."""
    if spec.per_key:
        return tuple((spec.family(key), doc) for key, doc in spec.per_key.items())
    return ((spec.name, spec.help),) if spec.served else ()


@dataclass(frozen=True)
class RenderOptions:
    """What the operator chose about label shapes and what is served. A render is bound
    to one (exporter.output.render.exposition); a reload replaces it whole, never in place."""

    pod_labels: bool = False  # kubernetes attribution on: process series carry pod labels
    device_pod_labels: bool = False  # --kubernetes.device-labels
    metric_names: MetricNames = MetricNames.GPU
    hostname: str = dataclass_field(default_factory=dcgm.hostname)  # dcgm's Hostname label
    selection: Selection = dataclass_field(default_factory=Selection)  # what is served


class Sink(Protocol):
    """Where a walk over the merged devices puts each series: prometheus-client families
    (``_Families``, here) or OTLP points (exporter.output.otlp). ``key``: the key of a spec
    served as one family per key, else ""."""

    def add(self, spec: MetricSpec, key: str, labels: dict[str, str], value: float) -> None:
        ...


class _Families:
    """Families by name, created on first use, so a family with no samples is not emitted.

    Samples are added with their own label dict: a MIG slice's series carry labels
    (gpu_instance_id, ...) that a whole GPU's series in the same family do not.
    """

    def __init__(self, selection: Selection) -> None:
        self.by_name: dict[str, Metric] = {}
        self.allows = selection.allows

    def add(self, spec: MetricSpec, key: str, labels: dict[str, str], value: float) -> None:
        name = spec.family(key) if key else spec.name
        family = self.by_name.get(name)
        if family is None:
            if not self.allows(name):  # not selected: no samples built
                return
            # prometheus-client names a counter family without its samples' _total.
            kind = spec.kind
            base = name.removesuffix("_total") if kind is Kind.COUNTER else name
            doc = spec.per_key[key] if key else spec.help
            family = self.by_name[name] = Metric(base, doc, kind.value)
        family.samples.append(Sample(name, labels, float(value)))


def _exclusive_pod(d: DeviceSample) -> PodRef | None:
    pods = {a.pod for a in d.allocations}
    return next(iter(pods)) if len(pods) == 1 else None


def _device_families(f: Sink, gpu: str, d: DeviceSample, opts: RenderOptions) -> None:
    info = d.info
    extra: dict[str, str] = dict(info.slice_labels)
    if opts.device_pod_labels and (pod := _exclusive_pod(d)) is not None:
        extra.update(container=pod.container, pod=pod.pod, namespace=pod.namespace)

    def labels(source: str, **more: str) -> dict[str, str]:
        return {"gpu": gpu, "uuid": info.uuid, "vendor": info.vendor, "source": source,
                **extra, **more}

    f.add(INFO, "", {
        **labels(d.source), "name": info.name, "pci_bus_id": info.pci_bus_id,
        "driver": info.driver, "driver_version": info.driver_version,
        "vbios_version": info.vbios_version, "compute_capability": info.compute_capability,
        "architecture": info.architecture, "serial": info.serial, **info.info_labels}, 1)
    f.add(UP, "", labels(d.source), 1 if d.up else 0)
    seen_pods = set()
    for a in d.allocations:
        if (a.pod, a.resource, a.claim) not in seen_pods:
            seen_pods.add((a.pod, a.resource, a.claim))
            f.add(ALLOCATION, "", labels(
                ALLOCATION_SOURCE, container=a.pod.container, pod=a.pod.pod,
                namespace=a.pod.namespace, resource=a.resource, pod_uid=a.pod_uid,
                claim=a.claim), 1)
    if not d.up:
        return
    scalars, labelled, per_key, process_scalars, process_labelled = _tables(opts.selection)
    for field, spec in scalars:
        value = getattr(d, field)
        if value is not None:
            f.add(spec, "", labels(d.source_of(field)), value)
    for field, spec in labelled:
        names = spec.labels
        for key, value in getattr(d, field).items():
            keys = key if isinstance(key, tuple) else (key,)
            f.add(spec, "", labels(
                d.source_of(field, key), **{n: str(k) for n, k in zip(names, keys, strict=True)}),
                value)
    for field, spec in per_key:
        docs = spec.per_key
        for key, value in getattr(d, field).items():
            if key in docs:
                f.add(spec, key, labels(d.source_of(field, key)), value)
    if process_scalars or process_labelled:
        for p in d.processes:
            _process_families(f, labels, d, p, opts, process_scalars, process_labelled)


Table = tuple[tuple[str, MetricSpec], ...]


@functools.lru_cache(maxsize=8)
def _tables(selection: Selection) -> tuple[Table, Table, Table, Table, Table]:
    """The field table less the families not selected, once per Selection: a family
    excluded costs no label dicts either."""
    def keep(table: Table) -> Table:
        return tuple((n, s) for n, s in table
                     if any(selection.allows(name) for name, _ in families_of(s)))
    return (keep(SCALARS), keep(LABELLED), keep(PER_KEY), keep(PROCESS_SCALARS),
            keep(PROCESS_LABELLED))


def _process_families(f: Sink, labels: Callable[..., dict[str, str]], d: DeviceSample,
                      p: ProcessSample, opts: RenderOptions, scalars: Table,
                      labelled: Table) -> None:
    base_source = p.source or d.source_of("processes")
    pod = {}
    if opts.pod_labels:
        pod = {"container": p.container or "", "pod": p.pod or "",
               "namespace": p.namespace or ""}

    def source(field: str, key: Any = None) -> str:
        if not p.field_sources:
            return base_source
        return p.field_sources.get((field, key)) or p.field_sources.get(field) or base_source

    pid = str(p.pid)
    for field, spec in labelled:
        (label,) = spec.labels
        for key, v in getattr(p, field).items():
            f.add(spec, "", labels(
                source(field, key), pid=pid, process=p.process, **pod, **{label: key}), v)
    for field, spec in scalars:
        value = getattr(p, field)
        if value is not None:
            f.add(spec, "", labels(
                source(field), pid=pid, process=p.process, **pod), value)


# Families in this order in every output, whichever device happens to come first.
FAMILY_ORDER = (INFO.name, UP.name, ALLOCATION.name,
                *(name for _, spec in DEVICE_SPECS for name, _ in families_of(spec)),
                *(spec.name for _, spec in PROCESS_SPECS))
_RANK = {name: i for i, name in enumerate(FAMILY_ORDER)}


def walk(s: Snapshot, opts: RenderOptions, sink: Sink) -> None:
    """Every per-GPU and per-process series of a snapshot's merged devices, into ``sink``
    (the families the selection excludes: only those a sink lets through)."""
    for gpu, d in s.devices:
        _device_families(sink, gpu, d, opts)


def in_order(names: Iterable[str]) -> list[str]:
    """Family names in FAMILY_ORDER (names it lacks last)."""
    return sorted(names, key=lambda n: _RANK.get(n, len(_RANK)))


def device_families(s: Snapshot, opts: RenderOptions) -> list[Metric]:
    """The per-GPU and per-process families of a snapshot's merged devices."""
    f = _Families(opts.selection)
    walk(s, opts, f)
    ours = [f.by_name[n] for n in in_order(f.by_name)]
    ours += opts.selection.keep(health_families(s.health))
    word = opts.metric_names.dcgm
    if word is None:
        return ours
    # dcgm replaces the per-GPU families; per-process and health ones (dcgm-exporter has
    # no counterpart: docs/dcgm-compat.md) keep our names in every mode.
    kept = ours if opts.metric_names.gpu else [
        m for m in ours if m.name.startswith(("gpu_process_", "gpu_health_"))]
    gen = dcgm.generation(word)
    fields = tuple(f for f in gen.fields if opts.selection.allows_dcgm(f.key, f.name))
    return (kept + list(dcgm.dcgm_families(((g, d) for g, d in s.devices if d.up), opts.hostname,
                                           fields, gen))
            + (dcgm.health_family(s.health, opts.hostname, gen)
               if opts.selection.allows_dcgm(dcgm.HEALTH_FAMILY) else []))


def health_families(entries: Iterable[tuple[str, DeviceSample, Verdict]]) -> list[Metric]:
    """``gpu_health_status`` and ``gpu_health_check_status`` of a snapshot's verdicts."""
    status = GaugeMetricFamily(health.STATUS.name, health.STATUS.help, labels=list(health.LABELS))
    checks = GaugeMetricFamily(health.CHECK.name, health.CHECK.help,
                               labels=[*health.LABELS, *health.CHECK.labels])
    for spec, labels, value in health.series(entries):
        family = status if spec is health.STATUS else checks
        family.samples.append(Sample(spec.name, labels, value))
    return [status, checks] if status.samples else []
