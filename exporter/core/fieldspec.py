"""The field table's vocabulary: how a sample field declares the metric it is served as.

A value field of ``exporter.core.model``'s samples is declared with ``value(...)`` or
``mapping(...)``, which put a ``MetricSpec`` in the field's metadata; ``value_specs(cls)``
reads them back, in declaration order. Render, merge, ``metricsdoc`` and ``dcgm`` read
the table through ``value_specs``; the ``gpu_exporter_*`` families declare their specs in
``exporter.output.render.selfmetrics``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from enum import Enum
from functools import cache
from types import MappingProxyType
from typing import Any

EMPTY: Mapping[Any, Any] = MappingProxyType({})
SPEC = "metric"  # the metadata key of a field's MetricSpec


class Cadence(str, Enum):
    """How often a value is read from its source: the tier of the backend's read that
    owns it (docs/metrics.md, cadence column)."""

    FAST = "fast"  # every collection cycle (--collector.interval)
    SLOW = "slow"  # on the slow tier (--collector.slow-interval) or rarer: costly reads
    # when the device is opened or found again after it was lost (hotplug, a reset), never
    # on a timer
    STATIC = "static"


class Kind(str, Enum):
    """A family's Prometheus type."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


# OTLP point kinds: gauge, sum (monotonic cumulative: a Prometheus counter), updown
# (non-monotonic cumulative sum: the conventions' UpDownCounter) and histogram.
GAUGE, SUM, UPDOWN, HISTOGRAM = "gauge", "sum", "updown", "histogram"
# units.RANGES key -> UCUM unit of the OTLP metric. "count" has none: a family of counts
# names what it counts, as the conventions do ({error}, {row}); so does a family of states
# or flags ({state}), of info series ({info}) or of other numbers ({generation}), declared
# in its Otlp: only a ratio is "1", since Prometheus's OTLP translation (otlptranslator's
# normalizeName) appends _ratio to every gauge of unit "1" and drops an annotation unit.
UCUM: Mapping[str, str] = MappingProxyType({
    "ratio": "1", "bytes": "By", "bytes_per_second": "By/s", "watts": "W",
    "joules": "J", "celsius": "Cel", "hertz": "Hz", "seconds": "s", "volts": "V"})


@dataclass(frozen=True)
class Route:
    """Some values of a label that the conventions give a metric of their own: a point whose
    ``label`` is one of ``values`` goes to the metric ``name`` (another family's, of the same
    unit and kind), the value as ``attribute`` instead of the label."""

    label: str
    values: frozenset[str]
    name: str
    attribute: str


@dataclass(frozen=True)
class Otlp:
    """How a family is pushed over OTLP (exporter.output.otlp, docs/otlp.md): declared beside its
    Prometheus name. ``name`` holds "{key}" for a spec served as one family per key."""

    name: str
    unit: str = ""  # the UCUM unit; "": from the spec's unit (UCUM above)
    updown: bool = False  # a non-monotonic sum (the conventions' UpDownCounter), not a gauge
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)  # label -> attribute
    constant: Mapping[str, str] = field(default_factory=lambda: EMPTY)  # added to each point
    route: Route | None = None


class Exposure(Enum):
    """Where a declared value goes."""

    SERVED = "served"  # a family under ``name`` (and its OTLP name)
    DCGM_ONLY = "dcgm_only"  # only as a dcgm-exporter field, in dcgm mode (exporter.output.dcgm)
    INTERNAL = "internal"  # an input of the health verdict (exporter.pipeline.health), never served


@dataclass(frozen=True)
class MetricSpec:
    """How one value is served: declared once, read by render, merge, docs and dcgm."""

    name: str  # the family as served; a counter's ends in _total ("" where not SERVED)
    help: str  # the HELP text served (and the docs/metrics.md help column)
    kind: Kind = Kind.GAUGE
    unit: str = ""  # a units.RANGES key ("" for states, flags, counts of things)
    # A mapping field: the label name of its key (one per element of a tuple key).
    # A gpu_exporter_* family: its labels.
    labels: tuple[str, ...] = ()
    note: str = ""  # said in docs/metrics.md after the help, never served
    # One family per key instead of a label: ``name`` holds "{key}"; key -> help.
    per_key: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    # Mapping fields whose keys are owned together in the merge (one engine, one owner).
    group: str = ""
    otlp: Otlp | None = None  # None only for a value served under dcgm names alone
    cadence: Cadence = Cadence.FAST  # how often the backends read it
    # Backend name -> its cadence, for a backend that reads the value at another tier.
    cadence_by: Mapping[str, Cadence] = field(default_factory=lambda: EMPTY)
    exposure: Exposure = Exposure.SERVED

    def __post_init__(self) -> None:
        if (self.exposure is Exposure.SERVED) != bool(self.name):
            raise ValueError(f"{self.name or self.help!r}: a served value has a name, "
                             "and only a served one")

    @property
    def served(self) -> bool:
        return self.exposure is Exposure.SERVED

    def family(self, key: str) -> str:
        return self.name.format(key=key)

    def cadence_of(self, backend: str) -> Cadence:
        """The tier at which ``backend`` reads this value."""
        return self.cadence_by.get(backend, self.cadence)

    def cadence_text(self) -> str:
        """The cadence as docs/metrics.md shows it: "slow", "slow (nvidia: static)"."""
        if not self.cadence_by:
            return self.cadence.value
        others = "; ".join(f"{b}: {c.value}" for b, c in sorted(self.cadence_by.items()))
        return f"{self.cadence.value} ({others})"

    def otlp_kind(self) -> str:
        """The OTLP point kind, from the Prometheus type (``Otlp.updown`` for a gauge that
        the conventions type as an UpDownCounter)."""
        if self.kind is Kind.COUNTER:
            return SUM
        if self.kind is Kind.HISTOGRAM:
            return HISTOGRAM
        return UPDOWN if self.otlp is not None and self.otlp.updown else GAUGE

    def otlp_unit(self) -> str:
        return (self.otlp.unit if self.otlp is not None else "") or UCUM.get(self.unit, "")


def value(name: str = "", help: str = "", kind: Kind = Kind.GAUGE, unit: str = "",
          note: str = "", otlp: Otlp | None = None, cadence: Cadence = Cadence.FAST,
          cadence_by: Mapping[str, Cadence] = EMPTY,
          exposure: Exposure = Exposure.SERVED) -> Any:
    """A scalar field: None where the source does not expose it. ``cadence``: how often
    the backends read it; ``cadence_by``: backend -> cadence where one reads it otherwise;
    ``exposure``: a value that is not a family of ours has no ``name``."""
    return field(default=None, metadata={SPEC: MetricSpec(
        name, help, kind, unit, note=note, otlp=otlp, cadence=cadence, cadence_by=cadence_by,
        exposure=exposure)})


def mapping(name: str, help: str, *labels: str, kind: Kind = Kind.GAUGE, unit: str = "",
            group: str = "", per_key: Mapping[str, str] = EMPTY, note: str = "",
            otlp: Otlp | None = None, cadence: Cadence = Cadence.FAST,
            cadence_by: Mapping[str, Cadence] = EMPTY,
            exposure: Exposure = Exposure.SERVED) -> Any:
    """A mapping field keyed by label value(s): empty where the source exposes none."""
    spec = MetricSpec(name, help, kind, unit, labels, note, per_key, group, otlp, cadence,
                      cadence_by, exposure)
    return field(default_factory=lambda: EMPTY, metadata={SPEC: spec})


def empty() -> Any:
    """A default for Mapping fields that are not values: one shared read-only empty mapping."""
    return field(default_factory=lambda: EMPTY)


def spec_of(f: Field[Any]) -> MetricSpec | None:
    spec = f.metadata.get(SPEC)
    return spec if isinstance(spec, MetricSpec) else None


@cache
def value_specs(cls: type) -> tuple[tuple[str, MetricSpec], ...]:
    """(field name, spec) of every value field of a sample class, in declaration order:
    the order families are served in."""
    return tuple((f.name, spec) for f in fields(cls) if (spec := spec_of(f)) is not None)


