"""What a backend reports, and the one table of what each value is served as.

Backends build these frozen dataclasses and never touch prometheus-client; the renderer
turns them into metric families and never touches a vendor library. ``None`` (or a key
that is absent from a mapping) means "this source does not expose it" and produces no
series: never 0, never NaN.

Every value field declares its metric once, in ``field(metadata=...)``: family name,
help, type, unit and the label name(s) of a mapping's key (``MetricSpec``, see
``exporter.core.fieldspec``). Render, merge, docs/metrics.md (``tools.metricsdoc``) and
the dcgm mapping read that table (``value_specs``), so a new field is one declaration
here. Mapping fields are keyed by
the label value (``temperatures_celsius[Sensor.JUNCTION]``, ``clocks_hertz["sm"]``);
the closed vocabularies are the enums of ``exporter.core.labels``.

Readers build a ``DeviceValues`` (a typed partial sample, values only) and the backend
wraps it with its identity: ``DeviceSample.of(values, info=..., source=...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import Any, Literal, TypeVar

from exporter.core.fieldspec import (
    EMPTY,
    Cadence,
    Exposure,
    Kind,
    Otlp,
    Route,
    empty,
    mapping,
    value,
    value_specs,
)
from exporter.core.labels import Engine, ErrorReason, Profiling, Sensor
from exporter.core.xid import MAX_CODES as MAX_XID_CODES

INTERNAL = Exposure.INTERNAL  # an input of the health verdict, not a family of its own
# The tiers a field declares (Cadence): how often the backends read it.
FAST, SLOW, STATIC = Cadence.FAST, Cadence.SLOW, Cadence.STATIC


def normalize_pci_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML) or ``0000:3b:00.0`` (sysfs) -> ``0000:3b:00.0``."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep or not rest:
        return bus_id
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id


@dataclass(frozen=True)
class DeviceInfo:
    """Static identity of one GPU, known at discovery and refreshed on rediscovery."""

    vendor: str  # nvidia, amd, intel, apple
    pci_bus_id: str  # normalised "0000:03:00.0"; the key that joins backends
    uuid: str  # NVML UUID, AMD unique_id, else "pci-<pci_bus_id>"
    name: str = ""
    driver: str = ""  # kernel driver: nvidia, amdgpu, i915, xe
    driver_version: str = ""
    vbios_version: str = ""
    compute_capability: str = ""
    architecture: str = ""
    serial: str = ""
    device_node: str = ""  # "nvidia0", "card1": the dcgm-exporter `device` label
    # The join key where there is no PCI bus id of its own: "soc0" for an Apple SoC GPU,
    # the MIG UUID of a MIG instance, the partition's id of an AMD partition. Empty for a
    # PCI GPU, whose key is its bus id. See ``key``.
    device_key: str = ""
    # A slice of a GPU (MIG instance, AMD partition): the parent's key. Its series carry
    # the parent's `gpu` index plus ``slice_labels``.
    parent_key: str = ""
    # Labels that identify a slice next to `gpu` (docs/metrics.md: gpu_instance_id,
    # compute_instance_id, mig_profile for NVIDIA MIG; partition_id for AMD).
    slice_labels: Mapping[str, str] = empty()
    # Extra gpu_info labels where the source knows them (docs/metrics.md: partition, mig_mode).
    info_labels: Mapping[str, str] = empty()

    @property
    def key(self) -> str:
        """What joins backends' views of one device: the PCI bus id, else ``device_key``."""
        return self.device_key or self.pci_bus_id


T = TypeVar("T")


def copy_with(sample: T, **changes: Any) -> T:
    """``dataclasses.replace(sample, **changes)`` without re-running ``__init__`` over
    every field (9 us for a DeviceValues; a third of a merge of 512 processes): the
    samples here have no ``__post_init__`` and keep nothing but their fields in
    ``__dict__`` (tests/test_model_overlay.py holds them to it). The one place this is
    done: the merge, the energy split, the AMD table fill and ``overlay`` call it, and the
    Hub for a backend's state after each cycle."""
    new = object.__new__(type(sample))
    new.__dict__.update(sample.__dict__)
    new.__dict__.update(changes)
    return new


def quick_init(cls: type) -> type:
    """Give the frozen dataclass ``cls`` an ``__init__`` that fills ``__dict__`` at once.

    The generated one sets each of DeviceValues' 70-odd fields with ``object.__setattr__``
    and calls each mapping's default factory: 17 us for a one-value fragment, built
    several times per GPU per cycle. This one takes keywords only, checks the names like
    the generated one (TypeError on an unknown or a missing one), and gives every
    instance the same defaults: each default factory must return one shared object
    (``EMPTY``), which is checked here. Positional arguments go to the generated one.
    tests/test_model_overlay.py compares both on every field.
    """
    generated = vars(cls)["__init__"]  # the one @dataclass wrote for this class
    defaults: dict[str, Any] = {}
    required: list[str] = []
    for f in fields(cls):
        if f.default is not MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not MISSING:
            shared = f.default_factory()
            if f.default_factory() is not shared:
                raise TypeError(f"{cls.__name__}.{f.name}: a default factory of fresh objects")
            defaults[f.name] = shared
        else:
            required.append(f.name)
            defaults[f.name] = None  # a place in field order; a caller must give it
    names = frozenset(defaults)
    needed = frozenset(required)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if args or not (needed <= kwargs.keys() <= names):
            generated(self, *args, **kwargs)  # raises the TypeError the caller expects
            return
        state = self.__dict__
        state.update(defaults)
        state.update(kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__wrapped__ = generated  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls


@quick_init
@dataclass(frozen=True)
class ProcessSample:
    """One process's use of one GPU."""

    pid: int
    process: str  # the kernel's comm, already decoded safely
    memory_used_bytes: float | None = value(
        "gpu_process_memory_used_bytes",
        "Device-local memory used by the process on this GPU.", unit="bytes",
        cadence_by={"level_zero": SLOW},
        otlp=Otlp("gpu.process.memory.usage"))
    shared_memory_used_bytes: float | None = value(  # GTT / system memory charged to it
        "gpu_process_shared_memory_used_bytes",
        "System (GTT) memory charged to the process for this GPU.", unit="bytes",
        cadence_by={"level_zero": SLOW},
        otlp=Otlp("gpu.process.shared_memory.usage"))
    utilization_ratio: Mapping[str, float] = mapping(  # engine -> 0..1
        "gpu_process_utilization_ratio", "Fraction of time the process kept an engine busy.",
        "engine", unit="ratio",
        cadence=SLOW,
        otlp=Otlp("gpu.process.utilization"))
    engine_busy_seconds: Mapping[str, float] = mapping(  # engine -> counter
        "gpu_process_engine_busy_seconds_total", "Engine time used by the process.", "engine",
        kind=Kind.COUNTER, unit="seconds",
        otlp=Otlp("gpu.process.engine.busy_time"))
    host_memory_bytes: float | None = value(  # RSS
        "gpu_process_host_memory_bytes", "Resident host memory (RSS) of the GPU process.",
        unit="bytes",
        cadence=SLOW,
        otlp=Otlp("gpu.process.host_memory.usage"))
    contexts: Mapping[str, bool] = mapping(  # ProcessContext -> True, where the source lists
        "gpu_process_context_info",
        "1 for each kind of GPU context the process holds: compute, graphics, or mps_client "
        "(a client of the CUDA MPS server, whose work runs in the server's context).",
        "context",
        note="NVIDIA only (NVML's compute, graphics and MPS client process lists).",
        otlp=Otlp("gpu.process.context", "{info}"))
    # Filled after the merge by exporter.pipeline.energy_split, never by a backend.
    energy_joules: float | None = value(
        "gpu_process_energy_joules_total",
        "GPU energy attributed to the process by its share of engine busy time.",
        Kind.COUNTER, unit="joules", note="Source `estimate` (docs/energy.md).",
        otlp=Otlp("gpu.process.energy"))
    container: str | None = None
    pod: str | None = None
    namespace: str | None = None
    # Who runs it, for the live page's JSON and ``gpu-exporter top`` only, never a label:
    # a command line is unbounded text (and may hold what its user typed), and a user
    # label would change every per-process series' label set (ProcFS.owner).
    user: str | None = None
    command: str | None = None
    # Set by the collector's merge: the source this process was reported by, and (as
    # DeviceSample.field_sources) where one of its fields came from another source.
    source: str = ""
    field_sources: Mapping[Any, str] = empty()


@dataclass(frozen=True)
class PodRef:
    """A Kubernetes container: what pod attribution puts on a series."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class Allocation:
    """The kubelet gave this device to this container, as ``resource`` (nvidia.com/gpu;
    a DRA driver's name, gpu.nvidia.com, for a device of a ResourceClaim)."""

    pod: PodRef
    resource: str
    pod_uid: str = ""  # from the container runtime; empty where it is not asked
    claim: str = ""  # "<namespace>/<name>" of the DRA ResourceClaim; empty for device plugins


_GPM = " (GPM)."


@quick_init
@dataclass(frozen=True)
class DeviceValues:
    """The values of one GPU, any of them absent: what a reader returns (a typed partial
    sample) and the value part of every ``DeviceSample``. Declared in the order served."""

    utilization_ratio: float | None = value(
        "gpu_utilization_ratio", "Fraction of time the GPU was busy.", unit="ratio",
        otlp=Otlp("hw.gpu.utilization", constant={"hw.gpu.task": "general"}))
    memory_utilization_ratio: float | None = value(
        "gpu_memory_utilization_ratio", "Fraction of time the memory controller was busy.",
        unit="ratio",
        otlp=Otlp("gpu.memory.controller.utilization"))
    memory_total_bytes: float | None = value(
        "gpu_memory_total_bytes", "Device-local memory in total.", unit="bytes",
        cadence_by={"amd": SLOW, "intel": SLOW},
        otlp=Otlp("hw.gpu.memory.limit", updown=True))
    memory_used_bytes: float | None = value(
        "gpu_memory_used_bytes", "Device-local memory in use.", unit="bytes",
        otlp=Otlp("hw.gpu.memory.usage", updown=True))
    memory_free_bytes: float | None = value(
        "gpu_memory_free_bytes", "Device-local memory free.", unit="bytes",
        otlp=Otlp("gpu.memory.free"))
    memory_reserved_bytes: float | None = value(
        "gpu_memory_reserved_bytes", "Device-local memory reserved by the driver.", unit="bytes",
        otlp=Otlp("gpu.memory.reserved"))
    shared_memory_total_bytes: float | None = value(
        "gpu_shared_memory_total_bytes", "System memory the GPU can map (GTT, unified memory).",
        unit="bytes",
        cadence=SLOW, cadence_by={"apple": FAST},
        otlp=Otlp("gpu.shared_memory.limit"))
    shared_memory_used_bytes: float | None = value(
        "gpu_shared_memory_used_bytes", "System memory mapped for the GPU in use.",
        unit="bytes",
        otlp=Otlp("gpu.shared_memory.usage"))
    power_watts: float | None = value(
        "gpu_power_watts", "Current power draw.", unit="watts",
        otlp=Otlp("hw.power"))
    power_instant_watts: float | None = value(  # where the source splits it from the average
        "gpu_power_instant_watts",
        "Instantaneous power draw, where the source splits it from the averaged one.",
        unit="watts",
        otlp=Otlp("gpu.power.instant"))
    power_limit_watts: float | None = value(
        "gpu_power_limit_watts", "Enforced power limit.", unit="watts",
        cadence=SLOW, cadence_by={"amdsmi": FAST},
        otlp=Otlp("gpu.power.limit"))
    power_limit_default_watts: float | None = value(
        "gpu_power_limit_default_watts",
        "Default power limit: the one the driver sets again when it is reloaded.",
        unit="watts", cadence=STATIC, otlp=Otlp("gpu.power.limit.default"))
    energy_joules: float | None = value(  # counter since driver load
        "gpu_energy_joules_total", "Energy consumed since the driver loaded.", Kind.COUNTER,
        unit="joules",
        cadence_by={"nvidia": SLOW},
        otlp=Otlp("hw.energy"))
    # Filled after the merge by exporter.pipeline.energy_split, never by a backend.
    idle_energy_joules: float | None = value(
        "gpu_idle_energy_joules_total",
        "GPU energy attributed to no process: idle time, and all of it where per-process "
        "engine data is missing.", Kind.COUNTER, unit="joules",
        note="Source `estimate` (docs/energy.md).",
        otlp=Otlp("gpu.idle_energy"))
    # Filled after the merge by exporter.pipeline.energy_split, never by a backend: for a GPU
    # that reports its power but has no energy counter.
    estimated_energy_joules: float | None = value(
        "gpu_estimated_energy_joules_total",
        "GPU energy estimated from its power draw over time, for a GPU without an energy "
        "counter.", Kind.COUNTER, unit="joules",
        note="Source `estimate`; counts from the exporter's start (docs/energy.md).",
        otlp=Otlp("gpu.estimated_energy"))
    performance_state: int | None = value(
        "gpu_performance_state", "Performance state (P-state number).",
        otlp=Otlp("gpu.performance_state", "{state}"))
    encoder_sessions: int | None = value(
        "gpu_encoder_sessions", "Video encoder sessions running on the GPU.", unit="count",
        cadence=SLOW, otlp=Otlp("gpu.encoder.sessions", "{session}"))
    pcie_link_generation: int | None = value(
        "gpu_pcie_link_generation", "Current PCIe link generation.",
        cadence=SLOW,
        otlp=Otlp("gpu.pcie.link.generation", "{generation}"))
    pcie_link_width: int | None = value(
        "gpu_pcie_link_width", "Current PCIe link width (lanes).",
        cadence=SLOW,
        otlp=Otlp("gpu.pcie.link.width", "{lane}"))
    pcie_link_max_generation: int | None = value(
        "gpu_pcie_link_max_generation", "Maximum PCIe generation.",
        cadence=SLOW, cadence_by={"nvidia": STATIC},
        otlp=Otlp("gpu.pcie.link.max_generation", "{generation}"))
    pcie_link_max_width: int | None = value(
        "gpu_pcie_link_max_width", "Maximum PCIe link width (lanes).",
        cadence=SLOW, cadence_by={"nvidia": STATIC},
        otlp=Otlp("gpu.pcie.link.max_width", "{lane}"))
    pcie_replay_errors: int | None = value(
        "gpu_pcie_replay_errors_total", "PCIe replay errors.", Kind.COUNTER, unit="count",
        cadence=SLOW,
        otlp=Otlp("gpu.pcie.replay_errors", "{error}"))
    remap_failed: bool | None = value(
        "gpu_memory_remap_failed", "1 if a memory row remapping failed.",
        cadence=SLOW,
        otlp=Otlp("gpu.memory.remap.failed", "{state}"))
    remap_pending: bool | None = value(  # a row remap waits for the next GPU reset
        "gpu_memory_remap_pending", "1 while a memory row remap waits for the next GPU reset.",
        cadence=SLOW,
        otlp=Otlp("gpu.memory.remap.pending", "{state}"))
    xid_last_timestamp_seconds: float | None = value(  # wall clock of the newest XID event
        "gpu_xid_last_timestamp_seconds",
        "When the most recent XID event happened (seconds since the epoch).",
        otlp=Otlp("gpu.xid.last_timestamp", "s"))
    # Code of the newest XID event; 0 for a GPU registered for XID events that has had none
    # yet. Served only under dcgm-exporter's name (DCGM_FI_DEV_XID_ERRORS, a last-value gauge).
    xid_last: int | None = value(help="Code of the newest XID event (0: none since start).",
                                 exposure=Exposure.DCGM_ONLY)

    temperatures_celsius: Mapping[str, float] = mapping(
        "gpu_temperature_celsius", "Temperature by sensor.", "sensor", unit="celsius",
        otlp=Otlp("hw.temperature", labels={"sensor": "hw.sensor_location"}))
    # (sensor, threshold) -> °C: each sensor's own thresholds (amdgpu hwmon tempN_crit /
    # tempN_emergency for edge, junction and memory alike; NVML's GPU and memory limits;
    # the i915/xe package's), so a sensor is drawn against its own limit.
    temperature_limits_celsius: Mapping[tuple[str, str], float] = mapping(
        "gpu_temperature_threshold_celsius", "Temperature thresholds, by sensor.", "sensor",
        "threshold", unit="celsius",
        cadence=SLOW, cadence_by={"nvidia": STATIC},
        otlp=Otlp("gpu.temperature.threshold", labels={"sensor": "hw.sensor_location"}))
    fan_speed_ratio: Mapping[str, float] = mapping(
        "gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum.", "fan", unit="ratio",
        otlp=Otlp("gpu.fan.speed_ratio"))
    voltages_volts: Mapping[str, float] = mapping(  # hwmon inN_label -> V
        "gpu_voltage_volts", "Voltage by rail.", "rail", unit="volts",
        otlp=Otlp("hw.voltage", labels={"rail": "hw.sensor_location"}))
    clocks_hertz: Mapping[str, float] = mapping(
        "gpu_clock_hertz", "Current clock frequency.", "clock", unit="hertz",
        otlp=Otlp("gpu.clock.frequency"))
    clocks_max_hertz: Mapping[str, float] = mapping(
        "gpu_clock_max_hertz", "Maximum clock frequency.", "clock", unit="hertz",
        cadence=SLOW,
        cadence_by={"nvidia": STATIC, "level_zero": STATIC, "amdsmi": FAST, "apple": FAST},
        otlp=Otlp("gpu.clock.max_frequency"))
    throttle_reasons: Mapping[str, bool] = mapping(  # reason -> active
        "gpu_clock_throttle_active", "1 while this clock throttle reason is active.", "reason",
        otlp=Otlp("gpu.clock.throttle.active", "{state}"))
    clock_event_seconds: Mapping[str, float] = mapping(  # throttle reason -> counter
        "gpu_clock_event_seconds_total", "Time the clocks were held back by this reason.",
        "reason", kind=Kind.COUNTER, unit="seconds",
        cadence=SLOW,
        otlp=Otlp("gpu.clock.event.time"))
    pcie_throughput_bytes_per_second: Mapping[str, float] = mapping(  # tx / rx
        "gpu_pcie_throughput_bytes_per_second", "PCIe throughput.", "direction",
        unit="bytes_per_second",
        cadence=SLOW,
        otlp=Otlp("gpu.pcie.throughput"))
    engine_utilization_ratio: Mapping[str, float] = mapping(  # engine -> 0..1
        "gpu_engine_utilization_ratio", "Fraction of time an engine was busy.", "engine",
        unit="ratio", group="engine",
        # the encoder's and decoder's are the conventions' GPU utilisation by task
        otlp=Otlp("gpu.engine.utilization", route=Route(
            "engine", frozenset({Engine.ENCODER.value, Engine.DECODER.value}), "hw.gpu.utilization",
            "hw.gpu.task")))
    engine_busy_seconds: Mapping[str, float] = mapping(  # engine -> counter
        "gpu_engine_busy_seconds_total", "Time an engine was busy.", "engine",
        kind=Kind.COUNTER, unit="seconds", group="engine",
        otlp=Otlp("gpu.engine.busy_time"))
    ecc_errors: Mapping[str, int] = mapping(  # corrected / uncorrected -> counter
        "gpu_ecc_errors_total", "ECC errors since the driver loaded.", "severity",
        kind=Kind.COUNTER, unit="count",
        cadence=SLOW,
        # the conventions' GPU errors: error.type "corrected" / "uncorrected"
        otlp=Otlp("hw.errors", "{error}", labels={"severity": "error.type"}))
    remapped_rows: Mapping[str, int] = mapping(
        "gpu_memory_remapped_rows", "Memory rows remapped.", "severity", unit="count",
        cadence=SLOW,
        otlp=Otlp("gpu.memory.remapped_rows", "{row}"))
    retired_pages: Mapping[str, int] = mapping(  # single_bit / double_bit -> pages
        "gpu_memory_retired_pages", "Memory pages retired (pre-Ampere page retirement).",
        "cause", unit="count",
        cadence=SLOW,
        otlp=Otlp("gpu.memory.retired_pages", "{page}"))
    xid_errors: Mapping[int, int] = mapping(  # XID code -> counter
        "gpu_xid_errors_total", "NVIDIA XID error events by code.", "xid", kind=Kind.COUNTER,
        unit="count",
        note=f"At most {MAX_XID_CODES} codes per GPU: the events of any code past them count "
        "under `xid=\"other\"`.",
        otlp=Otlp("gpu.xid.errors", "{error}"))
    xid_info: Mapping[tuple[int, str], bool] = mapping(  # (XID code, its meaning) -> True
        "gpu_xid_info",
        "1 for each XID code counted on this GPU, with its meaning in NVIDIA's XID catalogue "
        "(unknown for a code the exporter's table does not list).", "xid", "meaning",
        note="Join on `xid` with `gpu_xid_errors_total`; no series for the `xid=\"0\"` "
        "marker.",
        otlp=Otlp("gpu.xid.info", "{info}"))
    memory_bandwidth_bytes_per_second: Mapping[str, float] = mapping(  # read / write
        "gpu_memory_bandwidth_bytes_per_second",
        "Device memory bandwidth, where the source measures it.", "direction",
        unit="bytes_per_second",
        otlp=Otlp("gpu.memory.bandwidth"))
    nvlink_up: Mapping[tuple[str, str], bool] = mapping(
        "gpu_nvlink_up", "1 if this NVLink link is up; remote is what it connects to.",
        "link", "remote",
        cadence=SLOW, cadence_by={"amd": FAST, "amdsmi": FAST},
        otlp=Otlp("gpu.nvlink.up", "{state}"))
    nvlink_throughput_bytes_per_second: Mapping[tuple[str, str], float] = mapping(
        "gpu_nvlink_throughput_bytes_per_second", "NVLink throughput.", "link", "direction",
        unit="bytes_per_second",
        cadence=SLOW,
        otlp=Otlp("gpu.nvlink.throughput"))
    nvlink_errors: Mapping[tuple[str, str], int] = mapping(
        "gpu_nvlink_errors_total", "NVLink errors by type.", "link", "type", kind=Kind.COUNTER,
        unit="count",
        cadence=SLOW,
        otlp=Otlp("gpu.nvlink.errors", "{error}"))
    xgmi_throughput_bytes_per_second: Mapping[tuple[str, str], float] = mapping(
        "gpu_xgmi_throughput_bytes_per_second", "AMD XGMI link throughput.", "link",
        "direction", unit="bytes_per_second",
        otlp=Otlp("gpu.xgmi.throughput"))
    ras_errors: Mapping[tuple[str, str], int] = mapping(
        "gpu_ras_errors_total", "RAS / ECC errors by hardware block.", "block", "severity",
        kind=Kind.COUNTER, unit="count",
        cadence=SLOW,
        otlp=Otlp("gpu.ras.errors", "{error}"))
    profiling_ratio: Mapping[str, float] = mapping(  # Profiling key -> 0..1, one family each
        "gpu_{key}_ratio", "", unit="ratio", note="Source `nvml_gpm`.", per_key={
            Profiling.SM_ACTIVE: "Fraction of time at least one warp was active on an SM" + _GPM,
            Profiling.SM_OCCUPANCY: "Fraction of the maximum warps resident on SMs" + _GPM,
            Profiling.TENSOR_ACTIVE: "Fraction of cycles the tensor pipes were active" + _GPM,
            Profiling.DRAM_ACTIVE:
                "Fraction of cycles the device memory interface was active" + _GPM,
            Profiling.GRAPHICS_ENGINE_ACTIVE:
                "Fraction of time the graphics engine was active" + _GPM,
            Profiling.FP16_ACTIVE: "Fraction of cycles the FP16 pipes were active" + _GPM,
            Profiling.FP32_ACTIVE: "Fraction of cycles the FP32 pipes were active" + _GPM,
            Profiling.FP64_ACTIVE: "Fraction of cycles the FP64 pipes were active" + _GPM,
        },
        cadence=SLOW,
        otlp=Otlp("gpu.{key}"))

    recovery_action_info: Mapping[str, bool] = mapping(  # the action's word -> True
        "gpu_recovery_action_info",
        "1 with the recovery action the NVIDIA driver asks for before the GPU can be used "
        "again (none when it needs nothing).", "action",
        note="`action` is `none`, `gpu_reset`, `node_reboot`, `drain_p2p`, "
        "`drain_and_reset`, `recover_imex_domain`, `bus_reset` or `system_reboot` "
        "(NVML field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, nvml.h "
        "`nvmlDeviceGpuRecoveryAction_t`); no series where the driver has no such field. "
        "What each action does to the verdict: health.md.",
        cadence=SLOW,
        otlp=Otlp("gpu.recovery_action.info", "{info}"))
    # NVSwitch fabric (nvmlDeviceGetGpuFabricInfoV): only where the GPU takes part in one.
    fabric_state: int | None = value(
        "gpu_fabric_state",
        "The GPU's registration with the NVSwitch fabric: 1 not started, 2 in progress, "
        "3 completed.",
        note="nvml.h `nvmlGpuFabricState_t`; no series where the GPU has no fabric "
        "(NOT_SUPPORTED).",
        cadence=SLOW,
        otlp=Otlp("gpu.fabric.state", "{state}"))
    fabric_status: int | None = value(
        "gpu_fabric_status",
        "Result of the GPU's completed fabric registration: 0 success, else NVML's error "
        "code (nvmlReturn_t).",
        note="Served once the state is 3 (completed); a non-zero status is a GPU that "
        "cannot use NVLink peer-to-peer through the fabric (health.md).",
        cadence=SLOW,
        otlp=Otlp("gpu.fabric.status", "{status}"))
    fabric_health_mask: int | None = value(
        "gpu_fabric_health_mask",
        "The driver's fabric health mask of the GPU (nvmlGpuFabricInfo_v2 healthMask).",
        note="Two bits a field (nvml.h `NVML_GPU_FABRIC_HEALTH_MASK_*`: 0 not supported, "
        "1 true, 2 false), four for the configuration; the fields that reach the verdict "
        "are in health.md.",
        cadence=SLOW,
        otlp=Otlp("gpu.fabric.health_mask", "{mask}"))
    fabric_health_summary: int | None = value(
        "gpu_fabric_health",
        "The driver's fabric health summary: 1 healthy, 2 unhealthy, 3 limited capacity.",
        note="nvmlGpuFabricInfo_v3 healthSummary (`NVML_GPU_FABRIC_HEALTH_SUMMARY_*`), from "
        "drivers that have the v3 structure; no series where it is not supported.",
        cadence=SLOW,
        otlp=Otlp("gpu.fabric.health", "{state}"))

    # Health inputs (exporter.pipeline.health), not families of their own.
    recovery_action: str | None = value(  # nvmlDeviceGpuRecoveryAction_t as a word
        help="NVML's GPU recovery action: none, gpu_reset, node_reboot, drain_p2p, ...",
        cadence=SLOW, exposure=INTERNAL)
    retired_pages_pending: bool | None = value(
        help="A page retirement waits for the next GPU reset (before Ampere).",
        cadence=SLOW, exposure=INTERNAL)
    xid_seen_seconds: Mapping[int, float] = mapping(  # XID code -> wall clock of its newest
        "", "When each XID code last happened.", exposure=INTERNAL)

    @property
    def temperature_thresholds_celsius(self) -> dict[str, float]:
        """threshold -> °C of the sensor that throttles (junction, else edge, gpu, package,
        then the others): each threshold once, from ``temperature_limits_celsius``."""
        limits = self.temperature_limits_celsius
        if not limits:
            return {}
        out: dict[str, float] = {}
        for (_sensor, threshold), celsius in sorted(
                limits.items(), key=lambda item: (_SENSOR_ORDER.get(item[0][0], 99), item[0])):
            out.setdefault(threshold, celsius)
        return out

    def present(self) -> dict[str, Any]:
        """The values this fragment has (not None, not empty), by field name."""
        values = self.__dict__  # a frozen dataclass without slots: the fields, by name
        if type(self) is DeviceValues:  # a reader's fragment: nothing but value fields
            # Mostly defaults: None, or the one shared empty mapping; a falsy value left
            # is an empty mapping (dropped) or a scalar such as 0.0 (kept).
            return {name: value for name, value in values.items()
                    if value is not None and value is not EMPTY
                    and (value or name not in _MAPPING_FIELDS)}
        return {name: value for name, is_mapping in _value_fields()
                if (value := values[name]) is not None and not (is_mapping and not value)}

    def overlay(self, *others: DeviceValues) -> DeviceValues:
        """This fragment with every value the others have (the last one that has it wins)."""
        changes: dict[str, Any] = {}
        for other in others:
            changes.update(other.present())
        if not changes:
            return self
        return copy_with(self, **changes)  # replace() was 10 % of an NVML fast cycle


# Every value field of DeviceValues, by name, for the type checker: a reader that builds
# values by name (the NVIDIA backend's fast tier, its table of plain scalars,
# exporter.sources.nvidia.scalars) names them through it, so a misspelt name fails mypy,
# not a cycle. tests/test_model_overlay.py keeps it equal to the fields, in their order.
ValueField = Literal[
    "utilization_ratio", "memory_utilization_ratio", "memory_total_bytes", "memory_used_bytes",
    "memory_free_bytes", "memory_reserved_bytes", "shared_memory_total_bytes",
    "shared_memory_used_bytes", "power_watts", "power_instant_watts", "power_limit_watts",
    "power_limit_default_watts", "energy_joules", "idle_energy_joules",
    "estimated_energy_joules", "performance_state", "encoder_sessions",
    "pcie_link_generation", "pcie_link_width", "pcie_link_max_generation",
    "pcie_link_max_width", "pcie_replay_errors", "remap_failed", "remap_pending",
    "xid_last_timestamp_seconds", "xid_last", "temperatures_celsius",
    "temperature_limits_celsius", "fan_speed_ratio", "voltages_volts", "clocks_hertz",
    "clocks_max_hertz", "throttle_reasons", "clock_event_seconds",
    "pcie_throughput_bytes_per_second", "engine_utilization_ratio", "engine_busy_seconds",
    "ecc_errors", "remapped_rows", "retired_pages", "xid_errors", "xid_info",
    "memory_bandwidth_bytes_per_second", "nvlink_up", "nvlink_throughput_bytes_per_second",
    "nvlink_errors", "xgmi_throughput_bytes_per_second", "ras_errors", "profiling_ratio",
    "recovery_action_info", "fabric_state", "fabric_status", "fabric_health_mask",
    "fabric_health_summary", "recovery_action", "retired_pages_pending", "xid_seen_seconds",
]

# The order in which a sensor's thresholds stand for the GPU's (the throttling sensor first).
_SENSOR_ORDER: dict[str, int] = {Sensor.JUNCTION: 0, Sensor.EDGE: 1, Sensor.GPU: 2,
                                 Sensor.PACKAGE: 3}


@cache
def _value_fields() -> tuple[tuple[str, bool], ...]:
    """(name, is a mapping) of each DeviceValues value field. A mapping field is one with
    a default factory (fieldspec.mapping); knowing it up front spares present() an
    isinstance against the Mapping ABC per field, which was 40 % of an NVML fast cycle
    (bench/nvml_calls.py --stub --cycle)."""
    factory = {f.name: f.default_factory is not MISSING for f in fields(DeviceValues)}
    return tuple((name, factory[name]) for name, _ in value_specs(DeviceValues))


_MAPPING_FIELDS = frozenset(name for name, is_mapping in _value_fields() if is_mapping)


@quick_init
@dataclass(frozen=True, kw_only=True)
class DeviceSample(DeviceValues):
    """One backend's view of one GPU at one moment.

    ``source`` labels every value of this sample unless ``field_sources`` names
    another source for a field (e.g. ``{"profiling_ratio": "nvml_gpm"}`` or
    ``{"power_watts": "sysfs_energy_delta"}``) or for one key of a mapping field
    (``{("temperatures_celsius", "junction"): "sysfs"}``, what the merge writes).

    ``primary`` is False for augmenting backends (fdinfo): their values join the
    GPU that a primary backend reported with the same ``pci_bus_id``, and they
    never emit ``gpu_info`` / ``gpu_up`` themselves.
    """

    info: DeviceInfo
    source: str
    up: bool = True
    primary: bool = True
    field_sources: Mapping[Any, str] = empty()  # field or (field, key) -> source
    processes: tuple[ProcessSample, ...] = ()
    # Filled by the collector after the merge (Kubernetes attribution), never by a backend.
    allocations: tuple[Allocation, ...] = ()

    @classmethod
    def of(cls, values: DeviceValues, *, info: DeviceInfo, source: str,
           field_sources: Mapping[Any, str] = EMPTY,
           processes: tuple[ProcessSample, ...] = ()) -> DeviceSample:
        """A sample of ``values`` (a reader's typed fragment) with its identity."""
        return cls(info=info, source=source, field_sources=field_sources, processes=processes,
                   **values.present())

    def source_of(self, field_name: str, key: Any = None) -> str:
        """The source of one field, or of one key of a mapping field."""
        sources = self.field_sources
        if not sources:
            return self.source
        if key is not None:
            found = sources.get((field_name, key))
            if found is not None:
                return found
        return sources.get(field_name, self.source)

    def with_processes(self, processes: tuple[ProcessSample, ...]) -> DeviceSample:
        return copy_with(self, processes=processes)


def pci_uuid(pci_bus_id: str) -> str:
    """The fallback identity docs/metrics.md names for a GPU without a stable id."""
    return f"pci-{pci_bus_id}"


@dataclass(frozen=True)
class BackendSample:
    """Everything one backend produced in one collection cycle."""

    backend: str
    timestamp: float  # wall clock, seconds since the epoch, at the end of the cycle
    duration_seconds: float
    devices: tuple[DeviceSample, ...] = ()
    # reason -> how many values/processes this cycle dropped (per-cycle, not cumulative)
    errors: Mapping[ErrorReason, int] = field(default_factory=dict)


# Mapping fields whose keys are owned together (one engine, one owner): the merge's rule
# (exporter.pipeline.merge), which a source that pre-merges its own files follows too.
KEY_GROUPS: Mapping[str, str] = {
    name: spec.group for name, spec in (*value_specs(DeviceValues), *value_specs(ProcessSample))
    if spec.group}
