"""The PromQL of the fleet view, for the exporter's own names and for ``--metric-names
dcgm`` (docs/dcgm-compat.md: ``DCGM_FI_DEV_GPU_UTIL`` in %, ``DCGM_FI_DEV_FB_*`` in MiB,
``DCGM_FI_DEV_POWER_USAGE`` in W, pods as labels of the DCGM series; ``gpu_health_status``
and the ``gpu_process_*`` families keep their names in every mode) or ``dcgm4.9`` (the same
fields under dcgm-exporter 4.9's names and units, as exporter.output.dcgm's generations
name them: a DCGM field is written here by its first-generation name and unit).

The waste expressions (an allocated GPU left idle, a process holding memory with no
engine time, the idle power of each namespace's GPUs) are written once, here: the alerts
``GpuAllocatedIdle`` and ``GpuProcessMemoryIdle`` and the record
``namespace:gpu_idle_energy_joules:rate5m`` of deploy/prometheus/gpu-exporter.rules.yml
are this text with no selector, the processes dashboard's waste row is it with the
dashboard's variables (tests/test_fleet_rules.py compares them), and the fleet reader
runs it with a node's selector. Each answer has one series per node, or per GPU or
process of one node: the fleet's per-GPU and per-process series are summed and counted
by Prometheus, never sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from exporter.core.config import MetricNames
from exporter.output.dcgm import generation

IDLE_WINDOW = "5m"  # the mean (and the engine-time rate) a GPU or process is judged over
DEFAULT_IDLE_UTILIZATION = 0.05
IDLE_THRESHOLD_RECORD = ":gpu_waste_idle_utilization_ratio:threshold"
WASTE_ALERTS = ("GpuAllocatedIdle", "GpuProcessMemoryIdle")
MIB = 1048576
# Labels that copy one DCGM series per container sharing a GPU (docs/dcgm-compat.md,
# "Shared GPUs"): dropped before a per-GPU value is summed or averaged.
POD_LABELS = ("namespace", "pod", "container")
IN_A_POD = 'pod!=""'


def idle_threshold() -> str:
    """The idle threshold: the operator's (the rules' threshold record, which the Helm
    chart sets) or the default where the rules are not loaded."""
    return f"scalar({IDLE_THRESHOLD_RECORD} or vector({DEFAULT_IDLE_UTILIZATION:g}))"


def quote(value: str) -> str:
    """A PromQL string literal (Go's escapes, which JSON's are a subset of)."""
    return json.dumps(value, ensure_ascii=False)


def vocabulary(names: MetricNames) -> MetricNames:
    """The names the fleet view reads for exporters run with ``names``: the exporter's own
    where they are served (``both``, ``both-dcgm4.9``), else the DCGM generation's."""
    return MetricNames.GPU if names.gpu else names


@dataclass(frozen=True)
class FleetQL:
    """The queries for one vocabulary. ``node_label``: the label that names a node
    (``instance``, or a target label such as ``node``); ``matchers``: extra label
    matchers for every selector (``job="gpu-exporter"``), empty for none."""

    names: MetricNames = MetricNames.GPU
    node_label: str = "instance"
    matchers: str = ""

    @property
    def dcgm(self) -> bool:
        return vocabulary(self.names) is not MetricNames.GPU

    def field(self, name: str) -> tuple[str, str]:
        """A DCGM field (by its first-generation name) as the generation read spells it,
        and the arithmetic that brings it to base units (ratio, bytes) from its unit."""
        f = generation(self.names.dcgm or "dcgm").field_named(name)
        if f is None:
            raise KeyError(name)
        return f.name, {"%": " / 100", "MiB": f" * {MIB}"}.get(f.unit, "")

    # -- building blocks

    def sel(self, metric: str, *extra: str) -> str:
        parts = [p for p in (self.matchers, *extra) if p]
        return f"{metric}{{{', '.join(parts)}}}" if parts else metric

    def _keep(self, *labels: str) -> str:
        """A by-list that keeps the node label too."""
        out = list(labels)
        if self.node_label not in out:
            out.insert(0, self.node_label)
        return ", ".join(out)

    @property
    def gpu_on(self) -> str:
        """The labels that join a GPU's series (the DCGM series carry ``UUID``, the
        per-process ones ``uuid``: the index joins them)."""
        return "instance, job, gpu" if self.dcgm else "instance, job, gpu, uuid"

    def per_gpu(self, field: str, *extra: str) -> str:
        """One series per GPU for a quantity, in base units (ratio, bytes, watts,
        degrees, verdict)."""
        def s(metric: str) -> str:
            return self.sel(metric, *extra)

        if not self.dcgm:
            plain = {"util": "gpu_utilization_ratio", "mem_used": "gpu_memory_used_bytes",
                     "mem_total": "gpu_memory_total_bytes", "power": "gpu_power_watts",
                     "health": "gpu_health_status", "seen": "gpu_up"}
            if field in plain:
                return s(plain[field])
            if field == "temp":
                return (f"max by ({self._keep('instance', 'job', 'gpu', 'uuid')}) "
                        f"({s('gpu_temperature_celsius')})")
            raise KeyError(field)

        def one(metric: str) -> str:  # one series per GPU: the pods' copies dropped
            return f"max without ({', '.join(POD_LABELS)}) ({s(metric)})"

        f = self.field
        if field == "util":
            name, scale = f("DCGM_FI_DEV_GPU_UTIL")
            return f"{one(name)}{scale}"
        if field == "mem_used":
            name, scale = f("DCGM_FI_DEV_FB_USED")
            return f"{one(name)}{scale}"
        if field == "mem_total":
            (used_name, scale), (free_name, _) = f("DCGM_FI_DEV_FB_USED"), f("DCGM_FI_DEV_FB_FREE")
            used, free = s(used_name), s(free_name)
            reserved = f"({s(f('DCGM_FI_DEV_FB_RESERVED')[0])} or {used} * 0)"
            return (f"max without ({', '.join(POD_LABELS)}) "
                    f"({used} + {free} + {reserved}){scale}")
        if field == "power":
            return one(f("DCGM_FI_DEV_POWER_USAGE")[0])
        if field == "temp":
            return one(f("DCGM_FI_DEV_GPU_TEMP")[0])
        if field in ("health", "seen"):  # health keeps its name in dcgm mode
            return s("gpu_health_status")
        raise KeyError(field)

    # -- waste: the rules' expressions

    def idle_allocated(self, *extra: str) -> str:
        """One series per (GPU, container it is allocated to) whose mean utilisation over
        IDLE_WINDOW is under the idle threshold; the value is that mean."""
        threshold = idle_threshold()
        if self.dcgm:
            by = self._keep("instance", "job", "gpu", "UUID", *POD_LABELS)
            name, scale = self.field("DCGM_FI_DEV_GPU_UTIL")
            return (f"max by ({by}) (avg_over_time("
                    f"{self.sel(name, *extra, IN_A_POD)}"
                    f"[{IDLE_WINDOW}])){scale} < {threshold}")
        by = self._keep("instance", "job", "gpu", "uuid", "vendor", *POD_LABELS)
        return (
            f"max by ({by}) (\n"
            f"  {self.sel('gpu_kubernetes_allocation_info', *extra)}\n"
            f"  * on (instance, job, gpu, uuid) group_left ()\n"
            f"  (\n"
            f"    max by (instance, job, gpu, uuid) "
            f"(avg_over_time({self.sel('gpu_utilization_ratio', *extra)}[{IDLE_WINDOW}]))\n"
            f"    < {threshold}\n"
            f"  )\n"
            f")")

    def idle_processes(self, *extra: str) -> str:
        """One series per process that holds device memory and kept no engine busy over
        IDLE_WINDOW; the value is the memory it holds. "No engine time" is read from the
        best signal the process has: its engine-time counters (rate 0), else its
        utilisation ratios (all 0), else, for a process with neither (NVML sends no
        sample for a process that launched no kernel), its GPU: idle throughout, or
        reporting other processes' utilisation (so its silence means none)."""
        w = IDLE_WINDOW
        proc = "instance, job, gpu, uuid, pid"
        keep = self._keep("instance", "job", "gpu", "uuid", "vendor", "pid", "process",
                          *POD_LABELS)
        memory = f"max by ({keep}) ({self.sel('gpu_process_memory_used_bytes', *extra)} > 0)"
        busy = self.sel("gpu_process_engine_busy_seconds_total", *extra)
        ratio = self.sel("gpu_process_utilization_ratio", *extra)
        gpu = self.gpu_on
        if self.dcgm:
            gpu_idle = (f"max by ({gpu}) (max_over_time("
                        f"{self.sel(self.field('DCGM_FI_DEV_GPU_UTIL')[0], *extra)}[{w}]))"
                        f" == 0")
        else:
            gpu_idle = (f"max by ({gpu}) (max_over_time("
                        f"{self.sel('gpu_utilization_ratio', *extra)}[{w}])) == 0")
        return (
            f"(\n"
            f"  {memory}\n"
            f"  and on ({proc})\n"
            f"  (\n"
            f"    sum by ({proc}) (rate({busy}[{w}])) == 0\n"
            f"    or\n"
            f"    (\n"
            f"      sum by ({proc}) (max_over_time({ratio}[{w}])) == 0\n"
            f"      unless on ({proc}) {busy}\n"
            f"    )\n"
            f"  )\n"
            f")\n"
            f"or\n"
            f"(\n"
            f"  (\n"
            f"    {memory}\n"
            f"    unless on ({proc}) count_over_time({busy}[{w}])\n"
            f"    unless on ({proc}) count_over_time({ratio}[{w}])\n"
            f"  )\n"
            f"  and on ({gpu})\n"
            f"  (\n"
            f"    {gpu_idle}\n"
            f"    or\n"
            f"    count by ({gpu}) (count_over_time({ratio}[{w}]))\n"
            f"  )\n"
            f")")

    def idle_power_by_namespace(self, window: str = IDLE_WINDOW, *extra: str) -> str:
        """Idle watts of the GPUs allocated to each namespace: each GPU's idle energy rate
        (``gpu_idle_energy_joules_total``) split evenly between the containers it is
        allocated to (the record ``namespace:gpu_idle_energy_joules:rate5m``)."""
        alloc = (f"max by (instance, job, gpu, uuid, namespace, pod, container) "
                 f"({self.sel('gpu_kubernetes_allocation_info', *extra)})")
        return (
            f"sum by (namespace) (\n"
            f"  sum by (instance, job, gpu, uuid) "
            f"(rate({self.sel('gpu_idle_energy_joules_total', *extra)}[{window}]))\n"
            f"  * on (instance, job, gpu, uuid) group_right ()\n"
            f"  (\n"
            f"    {alloc}\n"
            f"    / on (instance, job, gpu, uuid) group_left ()\n"
            f"    count by (instance, job, gpu, uuid) ({alloc})\n"
            f"  )\n"
            f")")

    def waste_alerts(self, *extra: str) -> str:
        names = "|".join(WASTE_ALERTS)
        return self.sel("ALERTS", *extra, f'alertname=~"{names}"', 'alertstate="firing"')

    # -- the node list: one series per node each

    def node_queries(self) -> dict[str, str]:
        n = self.node_label
        by_gpu = self._keep("gpu")
        seen = self.per_gpu("seen")
        out = {
            "gpus": f"count by ({n}) (count by ({by_gpu}) ({seen}))",
            "util": f"avg by ({n}) ({self.per_gpu('util')})",
            "mem_used": f"sum by ({n}) ({self.per_gpu('mem_used')})",
            "mem_total": f"sum by ({n}) ({self.per_gpu('mem_total')})",
            "power": f"sum by ({n}) ({self.per_gpu('power')})",
            "health": f"max by ({n}) ({self.per_gpu('health')})",
            "idle_gpus": (f"count by ({n}) (count by ({self._keep('gpu')}) "
                          f"({self.idle_allocated()}))"),
            "idle_watts": (f"sum by ({n}) ({self.per_gpu('power')} and on ({self.gpu_on}) "
                           f"({self.idle_allocated()}))"),
            "idle_procs": f"count by ({n}) ({self.idle_processes()})",
            "idle_memory": f"sum by ({n}) ({self.idle_processes()})",
            "alerts": f"count by ({n}) ({self.waste_alerts()})",
            # The exporter's scrape target: up (0 when Prometheus cannot scrape it), for
            # targets that served the exporter's own series in the last hour.
            "up": (f"min by ({n}) ({self.sel('up')} and on (instance, job) "
                   f"max_over_time({self.sel('gpu_exporter_build_info')}[1h]))"),
            "threshold": f"{IDLE_THRESHOLD_RECORD} or vector({DEFAULT_IDLE_UTILIZATION:g})",
        }
        if not self.dcgm:
            out["lost"] = f"count by ({n}) ({seen} == 0)"
        return out

    # -- one node: one series per GPU or process each

    def node_matcher(self, node: str) -> str:
        return f"{self.node_label}={quote(node)}"

    def gpu_queries(self, node: str) -> dict[str, str]:
        m = self.node_matcher(node)
        out = {f: self.per_gpu(f, m) for f in ("seen", "util", "mem_used", "mem_total",
                                                "power", "temp", "health")}
        if self.dcgm:
            temp, util = self.field("DCGM_FI_DEV_GPU_TEMP")[0], \
                self.field("DCGM_FI_DEV_GPU_UTIL")[0]
            out["info"] = self.sel(temp, m)  # modelName, UUID, pods
            # pods are labels of every DCGM series: the two that every vendor fills
            out["alloc"] = (f"{self.sel(temp, m, IN_A_POD)} or "
                            f"{self.sel(util, m, IN_A_POD)}")
        else:
            out["info"] = self.sel("gpu_info", m)
            out["alloc"] = self.sel("gpu_kubernetes_allocation_info", m)
        out["idle_gpus"] = self.idle_allocated(m)
        out["alerts"] = self.waste_alerts(m)
        out["proc_memory"] = self.sel("gpu_process_memory_used_bytes", m)
        out["proc_busy"] = (f"sum by ({self._keep('instance', 'job', 'gpu', 'uuid', 'pid')}) "
                            f"(rate({self.sel('gpu_process_engine_busy_seconds_total', m)}"
                            f"[{IDLE_WINDOW}]))")
        out["proc_util"] = (f"sum by ({self._keep('instance', 'job', 'gpu', 'uuid', 'pid')}) "
                            f"({self.sel('gpu_process_utilization_ratio', m)})")
        out["idle_procs"] = self.idle_processes(m)
        return out

    def history(self, node: str | None = None) -> str:
        """Utilisation over time: per node (``node`` None) or per GPU of one node."""
        if node is None:
            return f"avg by ({self.node_label}) ({self.per_gpu('util')})"
        return self.per_gpu("util", self.node_matcher(node))
