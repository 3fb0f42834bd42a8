"""``--kubernetes.pod-labels REGEX``: selected pod labels as one join series per pod.

The CRI ``ListPodSandbox`` answer carries each pod sandbox's labels: the pod's own
labels plus the kubelet's ``io.kubernetes.pod.{name,namespace,uid}`` (kubernetes/
kubernetes ``pkg/kubelet/kuberuntime/labels.go`` newPodLabels), so no API-server
credentials are needed. Labels whose name fully matches the regex (the kubelet's own
left out) become ``gpu_kubernetes_pod_labels_info{namespace, pod, label_<name>...} 1``,
as kube-state-metrics' ``kube_pod_labels`` does: a series to join on, never copied onto
every GPU series. A name is sanitised as Prometheus requires (every character outside
``[a-zA-Z0-9_]`` becomes ``_``); two names that sanitise alike keep the first in sorted
order and count ``pod_label_conflict``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from exporter.attribution.kubernetes.cri import clean
from exporter.core.fieldspec import MetricSpec, Otlp
from exporter.core.labels import ErrorReason

SPEC = MetricSpec("gpu_kubernetes_pod_labels_info",
                  "The pod's labels whose names match --kubernetes.pod-labels, as label_<name> "
                  "(read from the CRI runtime); value 1.",
                  labels=("namespace", "pod", "source", "label_<name>..."),
                  note="Source `cri`.",
                  otlp=Otlp("gpu.kubernetes.pod.labels", "{info}"))
FAMILY, DOC = SPEC.name, SPEC.help
KUBELET_PREFIX = "io.kubernetes.pod."
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


@dataclass(frozen=True)
class PodLabels:
    namespace: str
    pod: str
    labels: tuple[tuple[str, str], ...]  # (label_<sanitised name>, value), sorted


def label_name(name: str) -> str:
    return "label_" + _INVALID.sub("_", name)


def parse_sandboxes(response: Any, allow: re.Pattern[str]) -> tuple[tuple[PodLabels, ...],
                                                                   Counter[ErrorReason]]:
    """A ListPodSandboxResponse -> the allowed labels of each pod that has any."""
    errors: Counter[ErrorReason] = Counter()
    newest: dict[tuple[str, str], tuple[int, Any]] = {}
    for sandbox in response.items:
        meta = sandbox.metadata
        if not meta.name or not meta.namespace:
            continue
        key = (clean(meta.namespace), clean(meta.name))
        # A restarted pod may briefly have two ready sandboxes: the newest is the pod's.
        if key not in newest or sandbox.created_at > newest[key][0]:
            newest[key] = (sandbox.created_at, sandbox)
    out = []
    for (namespace, pod), (_, sandbox) in sorted(newest.items()):
        labels, conflicts = select(sandbox.labels.items(), allow)
        errors[ErrorReason.POD_LABEL_CONFLICT] += conflicts
        if labels:
            out.append(PodLabels(namespace, pod, labels))
    return tuple(out), +errors


def select(labels: Iterable[tuple[str, str]], allow: re.Pattern[str]
           ) -> tuple[tuple[tuple[str, str], ...], int]:
    """The allowed (sanitised name, value) pairs, and how many names collided."""
    chosen: dict[str, str] = {}
    conflicts = 0
    for name, value in sorted(labels):
        if name.startswith(KUBELET_PREFIX) or not allow.fullmatch(name):
            continue
        sanitised = label_name(name)
        if sanitised in chosen:
            conflicts += 1
            continue
        chosen[sanitised] = clean(value)
    return tuple(sorted(chosen.items())), conflicts
