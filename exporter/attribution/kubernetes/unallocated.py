"""GPUs used outside their allocation: a process on a GPU its pod was not given.

A privileged container, a pod started with ``NVIDIA_VISIBLE_DEVICES=all`` or a process
outside any pod can use a GPU the kubelet allocated to someone else (or to nobody). With
pod attribution on, every process a GPU lists is compared with the GPU's allocations
(device plugins and DRA claims, exporter.attribution.kubernetes.attribution): a process whose pod
holds no allocation of that GPU becomes one series

    gpu_kubernetes_unallocated_process_info{gpu, uuid, vendor, source, namespace, pod,
                                            container, pid, process, scope} 1

``scope="pod"`` for a process in a pod, ``scope="host"`` for one in no pod the runtime
names (a host process, a container the kubelet did not make, a cgroup whose format is
unknown: counted by the cgroup reader); the pod labels are then empty. The
comparison is per pod (a sidecar of the pod that holds the GPU is not flagged) and per
``gpu`` label (a MIG slice's allocations count for its whole GPU). ``source`` is the
source that reported the process. Nothing is served while the container runtime is not
answering: every process would look like a host process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from exporter.core.fieldspec import MetricSpec, Otlp
from exporter.core.model import DeviceSample

if TYPE_CHECKING:
    from exporter.core.joins import Row

SPEC = MetricSpec("gpu_kubernetes_unallocated_process_info",
                  "A process using this GPU whose pod was not allocated it (scope pod), or "
                  "that runs in no pod (scope host); value 1.",
                  labels=("gpu", "uuid", "vendor", "source", "namespace", "pod", "container",
                          "pid", "process", "scope"),
                  note="With Kubernetes attribution on, while the container runtime answers. "
                  "Pod labels empty for scope `host`.",
                  otlp=Otlp("gpu.kubernetes.unallocated_process", "{info}",
                            labels={"scope": "gpu.kubernetes.unallocated_process.scope"}))
FAMILY, DOC = SPEC.name, SPEC.help
POD, HOST = "pod", "host"


def unallocated_rows(devices: Sequence[tuple[str, DeviceSample]]) -> Iterable[Row]:
    """One row per (GPU, process) whose pod holds no allocation of the GPU."""
    allowed: dict[str, set[tuple[str, str]]] = {}
    for gpu, d in devices:
        allowed.setdefault(gpu, set()).update(
            (a.pod.namespace, a.pod.pod) for a in d.allocations)
    rows: list[Row] = []
    seen: set[tuple[str, str, int]] = set()
    for gpu, d in devices:
        if not d.up:
            continue
        holders = allowed[gpu]
        for p in d.processes:
            if p.pod is None:
                scope = HOST
            elif (p.namespace or "", p.pod) in holders:
                continue
            else:
                scope = POD
            if (gpu, d.info.uuid, p.pid) in seen:
                continue
            seen.add((gpu, d.info.uuid, p.pid))
            values = (gpu, d.info.uuid, d.info.vendor, p.source or d.source_of("processes"),
                      p.namespace or "", p.pod or "", p.container or "", str(p.pid),
                      p.process, scope)
            rows.append((FAMILY, DOC, dict(zip(SPEC.labels, values, strict=True))))
    return sorted(rows, key=lambda r: (int(r[2]["gpu"]) if r[2]["gpu"].isdigit() else 0,
                                       r[2]["gpu"], r[2]["uuid"], int(r[2]["pid"])))
