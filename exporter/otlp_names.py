"""Prometheus family -> OTLP metric: name, UCUM unit, point kind and attribute names.

One table, read by exporter/otlp.py (the conversion) and by docs/otlp.md's generator
(``python -m exporter.otlp_names``), so the documented mapping is the pushed one.
Imports nothing of OpenTelemetry: the names are plain strings.

Names and attributes follow OpenTelemetry's hardware semantic conventions, version 1.44.0
(open-telemetry/semantic-conventions, docs/hardware/gpu.md, docs/hardware/common.md and
model/hardware; the same names as the opentelemetry-semantic-conventions package's
``_incubating.metrics.hw_metrics``) where a convention exists: ``hw.gpu.utilization``,
``hw.gpu.memory.usage``/``.limit``, ``hw.power``, ``hw.energy``, ``hw.temperature``,
``hw.status``, with ``hw.id``, ``hw.vendor``, ``hw.type``. Every other family gets a
``gpu.``-prefixed name (``gpu_exporter.`` for the exporter's own), by the same pattern.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# Point kinds: gauge, sum (monotonic cumulative: a Prometheus counter), updown
# (non-monotonic cumulative sum: the conventions' UpDownCounter) and histogram.
GAUGE, SUM, UPDOWN, HISTOGRAM = "gauge", "sum", "updown", "histogram"

# Label -> attribute, for every family. ``source`` stays (as gpu.source): every value
# keeps the name of the backend that read it.
LABELS = {
    "uuid": "hw.id",
    "vendor": "hw.vendor",
    "gpu": "gpu.index",
    "source": "gpu.source",
    "name": "hw.name",
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
    name: str
    unit: str
    kind: str = GAUGE
    labels: dict[str, str] = field(default_factory=dict)  # per-family label renames
    constant: dict[str, str] = field(default_factory=dict)  # attributes added to each point


def _own(prefix: str, labels: tuple[str, ...]) -> dict[str, str]:
    return {label: f"{prefix}.{label}" for label in labels}


_T = Target
FAMILIES: dict[str, Target] = {
    "gpu_info": _T("gpu.info", "1"),
    "gpu_up": _T("hw.status", "1", UPDOWN, constant={"hw.state": "ok"}),
    "gpu_kubernetes_allocation_info": _T("gpu.kubernetes.allocation", "1"),
    "gpu_utilization_ratio": _T("hw.gpu.utilization", "1", constant={"hw.gpu.task": "general"}),
    "gpu_memory_utilization_ratio": _T("gpu.memory.controller.utilization", "1"),
    "gpu_memory_total_bytes": _T("hw.gpu.memory.limit", "By", UPDOWN),
    "gpu_memory_used_bytes": _T("hw.gpu.memory.usage", "By", UPDOWN),
    "gpu_memory_free_bytes": _T("gpu.memory.free", "By"),
    "gpu_memory_reserved_bytes": _T("gpu.memory.reserved", "By"),
    "gpu_shared_memory_total_bytes": _T("gpu.shared_memory.limit", "By"),
    "gpu_shared_memory_used_bytes": _T("gpu.shared_memory.usage", "By"),
    "gpu_power_watts": _T("hw.power", "W"),
    "gpu_power_instant_watts": _T("gpu.power.instant", "W"),
    "gpu_power_limit_watts": _T("gpu.power.limit", "W"),
    "gpu_energy_joules_total": _T("hw.energy", "J", SUM),
    "gpu_idle_energy_joules_total": _T("gpu.idle_energy", "J", SUM),
    "gpu_performance_state": _T("gpu.performance_state", "1"),
    "gpu_pcie_link_generation": _T("gpu.pcie.link.generation", "1"),
    "gpu_pcie_link_width": _T("gpu.pcie.link.width", "{lane}"),
    "gpu_pcie_link_max_generation": _T("gpu.pcie.link.max_generation", "1"),
    "gpu_pcie_link_max_width": _T("gpu.pcie.link.max_width", "{lane}"),
    "gpu_pcie_replay_errors_total": _T("gpu.pcie.replay_errors", "{error}", SUM),
    "gpu_memory_remap_failed": _T("gpu.memory.remap.failed", "1"),
    "gpu_memory_remap_pending": _T("gpu.memory.remap.pending", "1"),
    "gpu_xid_last_timestamp_seconds": _T("gpu.xid.last_timestamp", "s"),
    "gpu_temperature_celsius": _T("hw.temperature", "Cel",
                                  labels={"sensor": "hw.sensor_location"}),
    "gpu_temperature_threshold_celsius": _T("gpu.temperature.threshold", "Cel"),
    "gpu_fan_speed_ratio": _T("gpu.fan.speed_ratio", "1"),
    "gpu_clock_hertz": _T("gpu.clock.frequency", "Hz"),
    "gpu_clock_max_hertz": _T("gpu.clock.max_frequency", "Hz"),
    "gpu_clock_throttle_active": _T("gpu.clock.throttle.active", "1"),
    "gpu_clock_event_seconds_total": _T("gpu.clock.event.time", "s", SUM),
    "gpu_pcie_throughput_bytes_per_second": _T("gpu.pcie.throughput", "By/s"),
    "gpu_engine_utilization_ratio": _T("gpu.engine.utilization", "1"),
    "gpu_engine_busy_seconds_total": _T("gpu.engine.busy_time", "s", SUM),
    "gpu_ecc_errors_total": _T("gpu.ecc.errors", "{error}", SUM),
    "gpu_memory_remapped_rows": _T("gpu.memory.remapped_rows", "{row}"),
    "gpu_memory_retired_pages": _T("gpu.memory.retired_pages", "{page}"),
    "gpu_xid_errors_total": _T("gpu.xid.errors", "{error}", SUM),
    "gpu_memory_bandwidth_bytes_per_second": _T("gpu.memory.bandwidth", "By/s"),
    "gpu_nvlink_up": _T("gpu.nvlink.up", "1"),
    "gpu_nvlink_throughput_bytes_per_second": _T("gpu.nvlink.throughput", "By/s"),
    "gpu_nvlink_errors_total": _T("gpu.nvlink.errors", "{error}", SUM),
    "gpu_xgmi_throughput_bytes_per_second": _T("gpu.xgmi.throughput", "By/s"),
    "gpu_ras_errors_total": _T("gpu.ras.errors", "{error}", SUM),
    "gpu_sm_active_ratio": _T("gpu.sm_active", "1"),
    "gpu_sm_occupancy_ratio": _T("gpu.sm_occupancy", "1"),
    "gpu_tensor_active_ratio": _T("gpu.tensor_active", "1"),
    "gpu_dram_active_ratio": _T("gpu.dram_active", "1"),
    "gpu_graphics_engine_active_ratio": _T("gpu.graphics_engine_active", "1"),
    "gpu_fp16_active_ratio": _T("gpu.fp16_active", "1"),
    "gpu_fp32_active_ratio": _T("gpu.fp32_active", "1"),
    "gpu_fp64_active_ratio": _T("gpu.fp64_active", "1"),
    "gpu_health_status": _T("gpu.health.status", "1"),
    "gpu_health_check_status": _T("gpu.health.check.status", "1"),
    "gpu_process_memory_used_bytes": _T("gpu.process.memory.usage", "By"),
    "gpu_process_shared_memory_used_bytes": _T("gpu.process.shared_memory.usage", "By"),
    "gpu_process_utilization_ratio": _T("gpu.process.utilization", "1"),
    "gpu_process_engine_busy_seconds_total": _T("gpu.process.engine.busy_time", "s", SUM),
    "gpu_process_host_memory_bytes": _T("gpu.process.host_memory.usage", "By"),
    "gpu_process_energy_joules_total": _T("gpu.process.energy", "J", SUM),
    # Join series; a pod label label_<name> becomes k8s.pod.label.<name> (the conventions').
    "gpu_kubernetes_pod_labels_info": _T("gpu.kubernetes.pod.labels", "1"),
    "gpu_kubernetes_unallocated_process_info": _T(
        "gpu.kubernetes.unallocated_process", "1",
        labels={"scope": "gpu.kubernetes.unallocated_process.scope"}),
    "gpu_slurm_job_info": _T("gpu.slurm.job", "1", labels={"job": "gpu.slurm.job.id"}),
    # The exporter's own: labels become gpu_exporter.<label>.
    "gpu_exporter_build_info": _T("gpu_exporter.build.info", "1",
                                  labels=_own("gpu_exporter", ("version", "python_version"))),
    "gpu_exporter_up": _T("gpu_exporter.up", "1"),
    "gpu_exporter_backend_up": _T("gpu_exporter.backend.up", "1"),
    "gpu_exporter_collection_duration_seconds": _T("gpu_exporter.collection.duration", "s",
                                                   HISTOGRAM),
    "gpu_exporter_collection_errors_total": _T("gpu_exporter.collection.errors", "{error}",
                                               SUM),
    "gpu_exporter_last_collection_timestamp_seconds": _T(
        "gpu_exporter.collection.last_timestamp", "s"),
    "gpu_exporter_processes_truncated_total": _T("gpu_exporter.processes.truncated",
                                                 "{process}", SUM),
    "gpu_exporter_backend_cpu_seconds_total": _T("gpu_exporter.backend.cpu.time", "s", SUM),
    "gpu_exporter_child_restarts_total": _T("gpu_exporter.child.restarts", "{restart}", SUM),
    "gpu_exporter_otlp_exports_total": _T("gpu_exporter.otlp.exports", "{export}", SUM),
    "gpu_exporter_config_last_reload_successful": _T(
        "gpu_exporter.config.last_reload.successful", "1"),
    "gpu_exporter_config_last_reload_success_timestamp_seconds": _T(
        "gpu_exporter.config.last_reload.success_timestamp", "s"),
}


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


def generate() -> str:
    """docs/otlp.md's mapping table."""
    kinds = {GAUGE: "gauge", SUM: "sum (monotonic, cumulative)",
             UPDOWN: "sum (non-monotonic, cumulative)", HISTOGRAM: "histogram (cumulative)"}
    lines = ["| Prometheus family | OTLP name | unit | OTLP type | attributes besides the "
             "common ones |", "|---|---|---|---|---|"]
    for family, t in FAMILIES.items():
        extra = [f"`{label}` -> `{attr}`" for label, attr in t.labels.items()]
        extra += [f"`{attr}`=`{value}`" for attr, value in t.constant.items()]
        lines.append(f"| `{family}` | `{t.name}` | `{t.unit}` | {kinds[t.kind]} | "
                     f"{', '.join(extra)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(generate(), end="")
