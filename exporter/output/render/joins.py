"""The join series of every serving backend as metric families (the rows come from each
backend's ``JoinSource``, exporter.core.joins), after the per-GPU ones, in every
``--metric-names`` mode."""

from __future__ import annotations

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from exporter.pipeline.state import Snapshot


def join_families(s: Snapshot) -> list[Metric]:
    families: dict[str, Metric] = {}
    for state in s.backends:
        if state.joins is None or not state.serving:
            continue
        for name, doc, labels in state.joins.join_rows(s.devices):
            family = families.get(name)
            if family is None:
                family = families[name] = Metric(name, doc, "gauge")
            family.samples.append(Sample(name, labels, 1.0))
    return [families[n] for n in sorted(families)]
