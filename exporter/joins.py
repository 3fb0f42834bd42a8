"""Join series: ``..._info`` families a backend hands the renderer besides its devices.

Some facts are not per-GPU values but series to join on: the labels of a pod
(``gpu_kubernetes_pod_labels_info``), the Slurm jobs holding a GPU
(``gpu_slurm_job_info``). A backend hands a ``JoinSource`` through its ``joins()`` hook
(exporter.backends.base.Joins); the collector keeps the last one per backend, like the
enricher, and ``join_families``
turns every serving backend's rows into metric families, after the per-GPU ones, in
every ``--metric-names`` mode (our names, like the per-process families).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from exporter.model import DeviceSample

if TYPE_CHECKING:
    from exporter.state import Snapshot

Row = tuple[str, str, dict[str, str]]  # (family name, help text, labels); value 1


class JoinSource(Protocol):
    def join_rows(self, devices: Sequence[tuple[str, DeviceSample]]) -> Iterable[Row]:
        """The rows to serve, given the merged devices as (``gpu`` label, sample).

        Answers from memory (maps refreshed on the backend's own tier): it runs on
        the render path.
        """
        ...


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
