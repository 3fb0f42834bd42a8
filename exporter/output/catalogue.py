"""The catalogue: every family the exporter serves, from the one declaration of each.

A family is declared once, as a ``MetricSpec`` (exporter.core.fieldspec): the value fields of
exporter.core.model, the ``gpu_info``/``gpu_up``/allocation specs of render.families, the health
families, the join series (kubernetes.podlabels, slurm) and the ``gpu_exporter_*`` specs of
render.selfmetrics. Each spec names its Prometheus family, help, type and unit and, in
``Otlp``, its OTLP name (UCUM unit and point kind follow from the spec unless it says
otherwise). Render, dcgm, OTLP (exporter.output.otlp), docs/metrics.md and docs/otlp.md
(tools.metricsdoc) all read it from here or from the specs themselves.

OTLP names and attributes follow OpenTelemetry's hardware semantic conventions, version
1.44.0 (open-telemetry/semantic-conventions, docs/hardware/gpu.md, docs/hardware/common.md
and model/hardware; the names of the opentelemetry-semantic-conventions package's
``_incubating.metrics.hw_metrics``) where a convention exists: ``hw.gpu.utilization``,
``hw.gpu.memory.usage``/``.limit``, ``hw.errors``, ``hw.power``, ``hw.energy``,
``hw.temperature``, ``hw.voltage``, ``hw.status``, with ``hw.id``, ``hw.vendor``,
``hw.model``, ``hw.type`` (docs/otlp.md compares them, difference by difference). Every
other family gets a
``gpu.``-prefixed name (``gpu_exporter.`` for the exporter's own), by the same pattern.
Imports nothing of OpenTelemetry: the names are plain strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.attribution import slurm
from exporter.attribution.kubernetes import podlabels, unallocated
from exporter.core.fieldspec import GAUGE, HISTOGRAM, SUM, UPDOWN, MetricSpec, Route
from exporter.output.render.families import (
    ALLOCATION,
    DEVICE_SPECS,
    INFO,
    PROCESS_SPECS,
    UP,
)
from exporter.output.render.selfmetrics import EXPORTER
from exporter.pipeline import health

__all__ = ["FAMILIES", "GAUGE", "HISTOGRAM", "INT_ATTRIBUTES", "LABELS", "SCHEMA_URL", "SPECS",
           "SUM", "UPDOWN", "Target", "attribute_name", "otlp_table", "target"]

SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# Every spec that serves a family, in the order docs/metrics.md lists them.
SPECS: tuple[MetricSpec, ...] = (
    INFO, UP, ALLOCATION, *(s for _, s in DEVICE_SPECS if s.served), health.STATUS, health.CHECK,
    *(s for _, s in PROCESS_SPECS), podlabels.SPEC, unallocated.SPEC, slurm.SPEC, *EXPORTER)

# Label -> attribute, for every family. ``source`` stays (as gpu.source): every value
# keeps the name of the backend that read it.
LABELS = {
    "uuid": "hw.id",
    "vendor": "hw.vendor",
    "gpu": "gpu.index",
    "source": "gpu.source",
    "name": "hw.model",  # the marketing name: the conventions' "descriptive model name"
    "driver_version": "hw.driver_version",
    "vbios_version": "hw.firmware_version",
    "serial": "hw.serial_number",
    "pod": "k8s.pod.name",
    "namespace": "k8s.namespace.name",
    "container": "k8s.container.name",
    "pid": "process.pid",
    "process": "process.executable.name",
}
INT_ATTRIBUTES = frozenset({"process.pid"})  # sent as integers, as the conventions type them


@dataclass(frozen=True)
class Target:
    """One served family as OTLP sees it."""

    name: str
    unit: str
    kind: str = GAUGE
    labels: Mapping[str, str] = field(default_factory=dict)  # per-family label renames
    constant: Mapping[str, str] = field(default_factory=dict)  # attributes added to each point
    route: Route | None = None  # label values sent under another family's metric


def target(spec: MetricSpec, key: str = "") -> Target:
    """The OTLP metric of a spec's family (``key``: of a spec served one family per key)."""
    otlp = spec.otlp
    if otlp is None:
        raise ValueError(f"{spec.name}: a served family without its OTLP name")
    return Target(otlp.name.format(key=key), spec.otlp_unit(), spec.otlp_kind(), otlp.labels,
                  otlp.constant, otlp.route)


def _targets() -> Mapping[str, Target]:
    out: dict[str, Target] = {}
    for spec in SPECS:
        for key in spec.per_key or ("",):  # one family per key, or the one family
            out[spec.family(key)] = target(spec, key)
    by_name = {t.name: t for t in out.values()}
    for family, t in out.items():  # a route goes to a metric of the same unit and kind
        to = by_name.get(t.route.name) if t.route else None
        if t.route and (to is None or (to.unit, to.kind) != (t.unit, t.kind)):
            raise ValueError(f"{family}: routes to {t.route.name}, no metric of its unit")
    return MappingProxyType(out)


# Prometheus family (as served, a counter's with _total) -> its OTLP metric.
FAMILIES: Mapping[str, Target] = _targets()


def attribute_name(family: str, label: str) -> str:
    """The attribute a label becomes: the family's own rename, the common table, or
    ``gpu.<label>`` (``gpu_exporter.<label>`` for the exporter's own families)."""
    target = FAMILIES.get(family)
    if target is not None and label in target.labels:
        return target.labels[label]
    if label in LABELS:
        return LABELS[label]
    if label.startswith("label_"):
        return f"k8s.pod.label.{label[len('label_'):]}"
    prefix = "gpu_exporter" if family.startswith("gpu_exporter_") else "gpu"
    return f"{prefix}.{label}"


def otlp_table() -> str:
    """docs/otlp.md's mapping table."""
    kinds = {GAUGE: "gauge", SUM: "sum (monotonic, cumulative)",
             UPDOWN: "sum (non-monotonic, cumulative)", HISTOGRAM: "histogram (cumulative)"}
    lines = ["| Prometheus family | OTLP name | unit | OTLP type | attributes besides the "
             "common ones |", "|---|---|---|---|---|"]
    for family, t in FAMILIES.items():
        extra = [f"`{label}` -> `{attr}`" for label, attr in t.labels.items()]
        extra += [f"`{attr}`=`{value}`" for attr, value in t.constant.items()]
        if t.route:
            values = "\\|".join(f"`{v}`" for v in sorted(t.route.values))
            extra.append(f"`{t.route.label}` {values}: to `{t.route.name}`, as "
                         f"`{t.route.attribute}`")
        lines.append(f"| `{family}` | `{t.name}` | `{t.unit}` | {kinds[t.kind]} | "
                     f"{', '.join(extra)} |")
    return "\n".join(lines) + "\n"
