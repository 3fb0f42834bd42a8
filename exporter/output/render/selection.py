"""Metric selection: which families are served (``--collector.metrics.include`` /
``--collector.metrics.exclude``, and ``--dcgm.counters`` in dcgm mode).

A family is matched by its name as docs/metrics.md writes it (a counter with its
``_total``), by fully anchored regular expressions, as node_exporter's collector filters
are. The renderer asks before it builds a family's samples (``render.families``), so an
excluded family costs neither samples nor bytes; the families built elsewhere (joins,
health, the exporter's own, the process and Python collectors) are dropped before
exposition. The dcgm field list narrows which DCGM_FI_* families are filled at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric

from exporter.core.config import MetricNames


def exposed_name(m: Metric) -> str:
    """A family's name as served and documented: prometheus-client drops a counter's _total."""
    return f"{m.name}_total" if m.type == "counter" else m.name


@dataclass(frozen=True, eq=False)
class Selection:
    """What the operator chose to serve. The default serves everything."""

    include: str | None = None
    exclude: str | None = None
    dcgm_fields: frozenset[str] | None = None  # the counters CSV's names; None: all
    _include: re.Pattern[str] | None = field(init=False, repr=False)
    _exclude: re.Pattern[str] | None = field(init=False, repr=False)
    _verdicts: dict[str, bool] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_include",
                           None if self.include is None else re.compile(self.include))
        object.__setattr__(self, "_exclude",
                           None if self.exclude is None else re.compile(self.exclude))

    @property
    def everything(self) -> bool:
        return self._include is None and self._exclude is None

    def allows(self, name: str) -> bool:
        """Whether family ``name`` is served; decided once per name."""
        verdict = self._verdicts.get(name)
        if verdict is None:
            verdict = (self._include is None or self._include.fullmatch(name) is not None) \
                and (self._exclude is None or self._exclude.fullmatch(name) is None)
            if len(self._verdicts) < 4096:  # family names are a closed set; bounded anyway
                self._verdicts[name] = verdict
        return verdict

    def allows_dcgm(self, key: str, name: str = "") -> bool:
        """A dcgm family: ``key`` its first generation's name (what the counters CSV's
        names were turned into), ``name`` the name served (what the regexes see)."""
        return ((self.dcgm_fields is None or key in self.dcgm_fields)
                and self.allows(name or key))

    def keep(self, families: Iterable[Metric]) -> Iterator[Metric]:
        """The families the operator chose, of ones already built."""
        if self.everything:
            yield from families
            return
        yield from (m for m in families if self.allows(exposed_name(m)))


class Filtered:
    """A prometheus-client collector (process, platform, gc) behind a Selection."""

    def __init__(self, collector: Any, selection: Selection) -> None:
        self.collector = collector
        self.selection = selection

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.selection.keep(self.collector.collect())


def hidden_watched(selection: Selection) -> list[str]:
    """The exporter's own watched families (selfmetrics.WATCHED) the selection hides."""
    from exporter.output.render.selfmetrics import WATCHED

    return [spec.name for spec in WATCHED if not selection.allows(spec.name)]


def _warn_hidden(selection: Selection) -> Selection:
    hidden = hidden_watched(selection)
    if hidden:
        import structlog

        structlog.get_logger(__name__).warning(
            "metric selection hides the exporter's own series", hidden=hidden,
            hint="the shipped alerts on them (GpuExporterNotReady, GpuExporterBackendDown, "
                 "GpuExporterBackendFailing, GpuExporterCollectionStale) never fire: add "
                 "|gpu_exporter_.* to --collector.metrics.include, or narrow "
                 "--collector.metrics.exclude")
    return selection


def load_selection(include: str | None, exclude: str | None, metric_names: MetricNames,
                   counters_file: str | None) -> Selection:
    """The operator's Selection. Reads ``--dcgm.counters`` (OSError where it cannot, a
    ValueError where it makes no sense) and says once, in one log line, which of its
    names we cannot fill and how many lines were not a field; says in one more which of
    the exporter's own watched families it hides."""
    if metric_names.dcgm is not None:  # its names, read once here: a broken install stops
        from exporter.output.dcgm import generation  # the start, not every render

        generation(metric_names.dcgm)
    if counters_file is None:
        return _warn_hidden(Selection(include, exclude))
    if metric_names.dcgm is None:
        raise ValueError("--dcgm.counters needs --metric-names dcgm, dcgm4.9, both or "
                         "both-dcgm4.9")
    import structlog

    from exporter.core import untrusted_file
    from exporter.output.dcgm import parse_counters

    # A FIFO is refused, not waited on; dcgm-exporter's own file is 5 KiB.
    counters = parse_counters(untrusted_file.read_text(counters_file, untrusted_file.LIST,
                                                       errors="replace"))
    if counters.unknown or counters.malformed:
        structlog.get_logger(__name__).warning(
            "dcgm counters: fields not served", file=counters_file,
            unknown=list(counters.unknown), malformed_lines=counters.malformed,
            hint="docs/dcgm-compat.md lists the fields this exporter fills")
    return _warn_hidden(Selection(include, exclude, counters.fields))
