"""dcgm-exporter's names, units and labels (``--metric-names=dcgm|both``), filled from our samples.

NVIDIA's dcgm-exporter writes one family per DCGM field, named after the field
(``DCGM_FI_DEV_GPU_UTIL``), in the field's own unit (MiB, MHz, %, mJ), labelled ``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, the driver version as
``DCGM_FI_DRIVER_VERSION``, ``GPU_I_PROFILE``/``GPU_I_ID`` on a MIG instance, and
``container``/``namespace``/``pod`` under Kubernetes. Facts from github.com/NVIDIA/dcgm-exporter
at commit 7ad58324b4447b64dc3dedf946b889b648b7f476: ``etc/default-counters.csv`` (fields,
types, units), ``internal/pkg/rendermetrics/render_metrics.go`` (labels),
``internal/pkg/hostname/hostname.go`` (``NODE_NAME`` before the host name).

Dashboards and alerts written for dcgm-exporter query those names, so this table fills them
from DeviceSample fields wherever the meaning is the same, for every vendor: one dashboard
covers a mixed fleet. docs/dcgm-compat.md lists each field, its source, and the fields we
cannot fill. Per-process and gpu_exporter_* families keep our names (render.py).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

from exporter.health import Verdict
from exporter.model import DeviceInfo, DeviceSample, PodRef

MIB = float(1 << 20)
Value = Callable[[DeviceSample], float | None]


@dataclass(frozen=True)
class Field:
    """One dcgm-exporter family: its name, help, how to fill it, and its declared type."""

    name: str
    doc: str
    value: Value
    # dcgm-exporter declares it a counter. Exposed untyped (``unknown`` in OpenMetrics): a
    # counter family of prometheus-client (and of OpenMetrics) must name its samples
    # ``<name>_total``, and dashboards query the bare DCGM name. rate() works on either.
    counter: bool = False


def _tidy(value: float | int | None) -> float | None:
    """12 significant digits: 22.000000000000004 % (0.22 * 100) is 22 %. Monotonic, so a
    counter stays a counter."""
    return None if value is None else float(f"{float(value):.12g}")


def _first(values: Mapping[str, float], *keys: str) -> float | None:
    return next((values[k] for k in keys if k in values), None)


def _times(value: float | int | None, factor: float) -> float | None:
    return _tidy(None if value is None else value * factor)


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _total(values: Iterable[float]) -> float | None:
    """The sum of a mapping's values, or None when it has none (never a made-up 0)."""
    items = list(values)
    return _tidy(sum(items)) if items else None


def _nvlink_errors(kind: str) -> Value:
    return lambda d: _total(v for (_, t), v in d.nvlink_errors.items() if t == kind)


def _profiling(key: str) -> Value:
    return lambda d: _tidy(d.profiling_ratio.get(key))


# Every field of dcgm-exporter's default-counters.csv we can fill, then the fields that
# the cited dashboards and alerts use beyond it (docs/dcgm-compat.md says which is which).
FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "SM clock (MHz); the shader clock on AMD and Intel.",
          lambda d: _times(_first(d.clocks_hertz, "sm", "graphics"), 1e-6)),
    Field("DCGM_FI_DEV_MEM_CLOCK", "Memory clock (MHz).",
          lambda d: _times(d.clocks_hertz.get("memory"), 1e-6)),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (C).",
          lambda d: _first(d.temperatures_celsius, "memory", "vram")),
    Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (C): die, AMD edge, Intel package.",
          lambda d: _first(d.temperatures_celsius, "gpu", "edge", "package")),
    Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (W).", lambda d: d.power_watts),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Energy since the driver loaded (mJ).",
          lambda d: _times(d.energy_joules, 1000), counter=True),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replays.",
          lambda d: _tidy(d.pcie_replay_errors), counter=True),
    Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%).",
          lambda d: _times(d.utilization_ratio, 100)),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory controller utilization (%).",
          lambda d: _times(d.memory_utilization_ratio, 100)),
    Field("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (%).",
          lambda d: _times(d.engine_utilization_ratio.get("encoder"), 100)),
    Field("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (%).",
          lambda d: _times(d.engine_utilization_ratio.get("decoder"), 100)),
    Field("DCGM_FI_DEV_XID_ERRORS", "Code of the last XID error (0: none since start).",
          lambda d: _tidy(d.xid_last)),
    Field("DCGM_FI_DEV_FB_FREE", "Device memory free (MiB).",
          lambda d: _times(d.memory_free_bytes, 1 / MIB)),
    Field("DCGM_FI_DEV_FB_USED", "Device memory used (MiB).",
          lambda d: _times(d.memory_used_bytes, 1 / MIB)),
    Field("DCGM_FI_DEV_FB_RESERVED", "Device memory reserved by the driver (MiB).",
          lambda d: _times(d.memory_reserved_bytes, 1 / MIB)),
    # DCGM reports NVLink throughput summed over links and directions, in KiB/s / 1000.
    Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "NVLink throughput, all links, tx+rx (~MB/s).",
          lambda d: _times(_total(d.nvlink_throughput_bytes_per_second.values()),
                           1 / 1024 / 1000)),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Rows remapped for uncorrectable errors.",
          lambda d: _tidy(d.remapped_rows.get("uncorrectable")), counter=True),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Rows remapped for correctable errors.",
          lambda d: _tidy(d.remapped_rows.get("correctable")), counter=True),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1 if a row remapping failed.",
          lambda d: _flag(d.remap_failed)),
    # GPM on NVIDIA; on AMD the GFX engine, which runs both graphics and compute queues.
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics/compute engine is busy.",
          lambda d: _tidy(d.profiling_ratio.get("graphics_engine_active",
                                                d.engine_utilization_ratio.get("gfx")))),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipes are busy.",
          _profiling("tensor_active")),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the memory interface is busy.",
          _profiling("dram_active")),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe transmit rate (B/s).",
          lambda d: _tidy(d.pcie_throughput_bytes_per_second.get("tx"))),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe receive rate (B/s).",
          lambda d: _tidy(d.pcie_throughput_bytes_per_second.get("rx"))),
    # -- beyond default-counters.csv ----------------------------------------------------
    Field("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has a warp assigned.",
          _profiling("sm_active")),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of resident warps to the SMs' maximum.",
          _profiling("sm_occupancy")),
    Field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the FP64 pipes are busy.",
          _profiling("fp64_active")),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the FP32 pipes are busy.",
          _profiling("fp32_active")),
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the FP16 pipes are busy.",
          _profiling("fp16_active")),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Corrected ECC errors since the driver loaded.",
          lambda d: _tidy(d.ecc_errors.get("corrected")), counter=True),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Uncorrected ECC errors since the driver loaded.",
          lambda d: _tidy(d.ecc_errors.get("uncorrected")), counter=True),
    Field("DCGM_FI_DEV_RETIRED_SBE", "Pages retired for single-bit errors.",
          lambda d: _tidy(d.retired_pages.get("single_bit")), counter=True),
    Field("DCGM_FI_DEV_RETIRED_DBE", "Pages retired for double-bit errors.",
          lambda d: _tidy(d.retired_pages.get("double_bit")), counter=True),
    Field("DCGM_FI_DEV_POWER_VIOLATION", "Time clocks were held back by the power cap (ns).",
          lambda d: _times(d.clock_event_seconds.get("sw_power_cap"), 1e9), counter=True),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", "Time clocks were held back for heat (ns).",
          lambda d: _times(_total(v for k, v in d.clock_event_seconds.items()
                                  if k in ("sw_thermal", "hw_thermal")), 1e9), counter=True),
    Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVLink flow-control CRC errors.",
          _nvlink_errors("crc_flit"), counter=True),
    Field("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "NVLink data CRC errors.",
          _nvlink_errors("crc_data"), counter=True),
    Field("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLink replays.",
          _nvlink_errors("replay"), counter=True),
    Field("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVLink recoveries.",
          _nvlink_errors("recovery"), counter=True),
)


def hostname() -> str:
    """The ``Hostname`` label, as dcgm-exporter picks it: ``NODE_NAME`` (set from the
    downward API in Kubernetes; tests set it for stable output), else the host's name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def dcgm_bus_id(pci_bus_id: str) -> str:
    """``0000:3b:00.0`` -> ``00000000:3B:00.0``, the form DCGM (and NVML) print."""
    domain, sep, rest = pci_bus_id.partition(":")
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}" if sep else pci_bus_id
    except ValueError:
        return pci_bus_id


def _labels(gpu: str, info: DeviceInfo, parent: DeviceInfo, host: str) -> dict[str, str]:
    """A slice (MIG instance, AMD partition) is shown as dcgm-exporter shows a GPU instance:
    the parent GPU's identity plus GPU_I_PROFILE and GPU_I_ID."""
    labels = {"gpu": gpu, "UUID": parent.uuid, "pci_bus_id": dcgm_bus_id(parent.pci_bus_id),
              "device": parent.device_node, "modelName": parent.name}
    if info.parent_key:
        s = info.slice_labels
        labels["GPU_I_PROFILE"] = s.get("mig_profile") or info.info_labels.get("partition", "")
        labels["GPU_I_ID"] = s.get("gpu_instance_id") or s.get("partition_id", "")
    labels["Hostname"] = host
    labels["DCGM_FI_DRIVER_VERSION"] = parent.driver_version
    # An empty label is the same as no label to Prometheus: leave it out.
    return {k: v for k, v in labels.items() if v or k in ("gpu", "UUID")}


# DCGM_EXP_GPU_HEALTH_STATUS: dcgm-exporter's health watch per GPU and DCGM health system
# (internal/pkg/collector/gpu_health_collector.go at commit
# 07a14b87917292035ab97d403a42c149b9e263e2: labels health_watch, health_error_code; value
# dcgm_structs.h dcgmHealthWatchResult_t PASS 0, WARN 10, FAIL 20). Our checks that are one
# of its systems, and our finding codes that are one of its DCGM_FR_* codes; the `xid`
# check has no system of its own there (docs/dcgm-compat.md).
HEALTH_FAMILY = "DCGM_EXP_GPU_HEALTH_STATUS"
HEALTH_WATCHES = {"pcie": "PCIE", "interconnect": "NVLINK", "memory": "MEM",
                  "thermal": "THERMAL", "power": "POWER", "driver": "DRIVER"}
HEALTH_RESULTS = (0, 10, 20)
HEALTH_CODES = {"xid": "DCGM_FR_XID_ERROR", "row_remap_failure": "DCGM_FR_ROW_REMAP_FAILURE",
                "row_remap_pending": "DCGM_FR_PENDING_ROW_REMAP",
                "page_retirement_pending": "DCGM_FR_PENDING_PAGE_RETIREMENTS",
                "ecc_uncorrected": "DCGM_FR_VOLATILE_DBE_DETECTED",
                "temperature": "DCGM_FR_TEMP_VIOLATION",
                "throttle_thermal": "DCGM_FR_CLOCK_THROTTLE_THERMAL",
                "throttle_power": "DCGM_FR_CLOCK_THROTTLE_POWER",
                "nvlink_down": "DCGM_FR_NVLINK_DOWN"}


def health_family(entries: Iterable[tuple[str, DeviceSample, Verdict]], host: str
                  ) -> list[Metric]:
    """DCGM_EXP_GPU_HEALTH_STATUS from the health verdicts: one series per GPU and check
    that has a DCGM health system; the code of the check's worst finding, else DCGM_FR_OK."""
    family = Metric(HEALTH_FAMILY, "GPU health status per DCGM health watch "
                    "(0 pass, 10 warn, 20 fail).", "gauge")
    for gpu, d, verdict in entries:
        base = _labels(gpu, d.info, d.info, host)
        for check, status in verdict.checks.items():
            watch = HEALTH_WATCHES.get(check)
            if watch is None:
                continue
            worst = max((f for f in verdict.findings if f.check == check),
                        key=lambda f: f.status, default=None)
            code = "DCGM_FR_OK" if worst is None else HEALTH_CODES.get(worst.code,
                                                                       "DCGM_FR_UNKNOWN")
            for pod in _pods(d):
                labels = {**base, "health_watch": watch, "health_error_code": code}
                if pod is not None:
                    labels.update(container=pod.container, namespace=pod.namespace,
                                  pod=pod.pod)
                family.add_sample(HEALTH_FAMILY, labels, HEALTH_RESULTS[status])
    return [family] if family.samples else []


def _pods(d: DeviceSample) -> list[PodRef | None]:
    """One series per container the kubelet gave this device to, as dcgm-exporter does with
    --kubernetes-virtual-gpus (shared GPUs); one unlabelled series for a device nobody has."""
    pods: list[PodRef | None] = list(dict.fromkeys(a.pod for a in d.allocations))
    return pods or [None]


def dcgm_families(devices: Iterable[tuple[str, DeviceSample]], host: str) -> Iterator[Metric]:
    """The dcgm-exporter families of ``devices``: (``gpu`` label value, merged sample) pairs
    of readable devices. A family without a value on any device is not emitted."""
    devices = list(devices)
    infos = {d.info.key: d.info for _, d in devices}
    families: dict[str, Metric] = {}
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for gpu, d in devices:
        base = _labels(gpu, d.info, infos.get(d.info.parent_key, d.info), host)
        values = [(f, f.value(d)) for f in FIELDS]
        for pod in _pods(d):
            labels = base if pod is None else {
                **base, "container": pod.container, "namespace": pod.namespace, "pod": pod.pod}
            for f, value in values:
                key = (f.name, frozenset(labels.items()))
                # A GPU instance split in compute instances is one dcgm entity: its first.
                if value is None or key in seen:
                    continue
                seen.add(key)
                family = families.get(f.name)
                if family is None:
                    family = families[f.name] = Metric(
                        f.name, f.doc, "unknown" if f.counter else "gauge")
                family.add_sample(f.name, labels, value)
    yield from (families[f.name] for f in FIELDS if f.name in families)
