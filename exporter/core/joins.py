"""Join series: ``..._info`` families a backend hands the renderer besides its devices.

Some facts are not per-GPU values but series to join on: the labels of a pod
(``gpu_kubernetes_pod_labels_info``), the Slurm jobs holding a GPU
(``gpu_slurm_job_info``). A backend hands a ``JoinSource`` over in each cycle
(exporter.sources.base.Cycle.joins); the hub keeps the last one per backend, like the
enricher, and exporter.output.render.joins turns every serving backend's rows into
metric families, after the per-GPU ones, in every ``--metric-names`` mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from exporter.core.model import DeviceSample

Row = tuple[str, str, dict[str, str]]  # (family name, help text, labels); value 1


class JoinSource(Protocol):
    def join_rows(self, devices: Sequence[tuple[str, DeviceSample]]) -> Iterable[Row]:
        """The rows to serve, given the merged devices as (``gpu`` label, sample).

        Answers from memory (maps refreshed on the backend's own tier): it runs on
        the render path.
        """
        ...
