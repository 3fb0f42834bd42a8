"""The closed label vocabularies of the mapping fields, declared once.

A mapping field of ``DeviceSample`` is keyed by a label value (``temperatures_celsius``
by sensor, ``clocks_hertz`` by clock, ...). Where the set of values is closed, it is an
enum here, and readers key their mappings with its members. Each enum is also a ``str``
whose value is the label value served, so ``d.clocks_hertz["sm"]`` and
``d.clocks_hertz[Clock.SM]`` are the same key, and a sample built with plain strings
(the kernel-file backends) merges with one built with members.

Open vocabularies stay strings: fan indices, NVLink link numbers, XID codes, RAS blocks.
``Engine`` names the engines readers map to, but stays open: DRM fdinfo passes a driver's
own engine names through.
"""

from __future__ import annotations

from enum import Enum


class Vocabulary(str, Enum):
    """A label value: compares, hashes, prints and formats as its string."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class Sensor(Vocabulary):
    """``gpu_temperature_celsius{sensor}``."""

    GPU = "gpu"  # NVIDIA's die sensor
    MEMORY = "memory"  # NVIDIA HBM
    EDGE = "edge"
    JUNCTION = "junction"
    VRAM = "vram"
    PACKAGE = "package"


class Threshold(Vocabulary):
    """``gpu_temperature_threshold_celsius{threshold}``."""

    SHUTDOWN = "shutdown"
    SLOWDOWN = "slowdown"
    MAX_OPERATING = "max_operating"
    MEMORY_MAX_OPERATING = "memory_max_operating"
    CRITICAL = "critical"


class Clock(Vocabulary):
    """``gpu_clock_hertz{clock}``, ``gpu_clock_max_hertz{clock}``."""

    GRAPHICS = "graphics"
    SM = "sm"
    MEMORY = "memory"
    VIDEO = "video"


class ThrottleReason(Vocabulary):
    """``gpu_clock_throttle_active{reason}``, ``gpu_clock_event_seconds_total{reason}``:
    nvml.h's clocks event reasons."""

    IDLE = "idle"
    SW_POWER_CAP = "sw_power_cap"
    HW_SLOWDOWN = "hw_slowdown"
    SYNC_BOOST = "sync_boost"
    SW_THERMAL = "sw_thermal"
    HW_THERMAL = "hw_thermal"
    HW_POWER_BRAKE = "hw_power_brake"
    DISPLAY_CLOCKS = "display_clocks"


class Direction(Vocabulary):
    """``direction`` of PCIe, NVLink, XGMI throughput and memory bandwidth."""

    TX = "tx"
    RX = "rx"
    READ = "read"
    WRITE = "write"


class Severity(Vocabulary):
    """``gpu_ecc_errors_total{severity}`` (corrected/uncorrected),
    ``gpu_memory_remapped_rows{severity}`` (correctable/uncorrectable), RAS severities."""

    CORRECTED = "corrected"
    UNCORRECTED = "uncorrected"
    CORRECTABLE = "correctable"
    UNCORRECTABLE = "uncorrectable"


class RetireCause(Vocabulary):
    """``gpu_memory_retired_pages{cause}``."""

    SINGLE_BIT = "single_bit"
    DOUBLE_BIT = "double_bit"


class NvLinkError(Vocabulary):
    """``gpu_nvlink_errors_total{type}``."""

    REPLAY = "replay"
    RECOVERY = "recovery"
    CRC_FLIT = "crc_flit"
    CRC_DATA = "crc_data"


class Remote(Vocabulary):
    """``gpu_nvlink_up{remote}``: what a link connects to."""

    GPU = "gpu"
    SWITCH = "switch"
    CPU = "cpu"  # an IBM NPU
    UNKNOWN = "unknown"


class Engine(Vocabulary):
    """``engine`` of the engine and per-process families: the names readers map their
    engines to. Open: DRM fdinfo passes a driver's own engine names through."""

    GFX = "gfx"
    COMPUTE = "compute"
    RENDER = "render"
    COPY = "copy"
    DMA = "dma"
    VIDEO = "video"
    VIDEO_ENHANCE = "video_enhance"
    ENCODER = "encoder"
    DECODER = "decoder"
    JPEG = "jpeg"
    OFA = "ofa"
    SM = "sm"


class Profiling(Vocabulary):
    """The keys of ``profiling_ratio``: one ``gpu_<key>_ratio`` family each (GPM)."""

    SM_ACTIVE = "sm_active"
    SM_OCCUPANCY = "sm_occupancy"
    TENSOR_ACTIVE = "tensor_active"
    DRAM_ACTIVE = "dram_active"
    GRAPHICS_ENGINE_ACTIVE = "graphics_engine_active"
    FP16_ACTIVE = "fp16_active"
    FP32_ACTIVE = "fp32_active"
    FP64_ACTIVE = "fp64_active"


class ProcessContext(Vocabulary):
    """``gpu_process_context_info{context}``: the kinds of GPU context NVML lists a process
    under (its compute, graphics and MPS client process lists)."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    MPS_CLIENT = "mps_client"  # a client of the CUDA MPS server: its work runs in the server's


class Check(Vocabulary):
    """``gpu_health_check_status{check}``: the health checks (exporter.pipeline.health), in the
    order served."""

    THERMAL = "thermal"
    MEMORY = "memory"
    XID = "xid"
    INTERCONNECT = "interconnect"
    POWER = "power"
    PCIE = "pcie"
    DRIVER = "driver"


class HealthStatus(Vocabulary):
    """A health verdict, in the order of ``gpu_health_status``'s value (0 healthy, 1
    degraded, 2 failed): /snapshot, the live page, its JSON and ``gpu-exporter top``."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAILED = "failed"


class FindingCode(Vocabulary):
    """What kind of health finding (``/snapshot``'s ``code``; dcgm mode maps some to a
    DCGM_FR_* code)."""

    XID = "xid"
    ROW_REMAP_FAILURE = "row_remap_failure"
    ROW_REMAP_PENDING = "row_remap_pending"
    PAGE_RETIREMENT_PENDING = "page_retirement_pending"
    ECC_UNCORRECTED = "ecc_uncorrected"
    RAS_UNCORRECTED = "ras_uncorrected"
    TEMPERATURE = "temperature"
    THROTTLE_THERMAL = "throttle_thermal"
    THROTTLE_POWER = "throttle_power"
    NVLINK_DOWN = "nvlink_down"
    RECOVERY_ACTION = "recovery_action"
    FABRIC = "fabric"
    GPU_UNREADABLE = "gpu_unreadable"


class RecoveryAction(Vocabulary):
    """What the driver says must happen before the GPU is usable again: nvml.h's
    nvmlDeviceGpuRecoveryAction_t as a word (``DeviceSample.recovery_action``, a health
    input, exporter.pipeline.health)."""

    NONE = "none"
    GPU_RESET = "gpu_reset"
    NODE_REBOOT = "node_reboot"
    DRAIN_P2P = "drain_p2p"
    DRAIN_AND_RESET = "drain_and_reset"
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    BUS_RESET = "bus_reset"
    SYSTEM_REBOOT = "system_reboot"


class ErrorReason(Vocabulary):
    """``gpu_exporter_collection_errors_total{reason}``: why a collection dropped a value,
    a device or a process. One word per cause, whichever backend meets it."""

    PARSE = "parse"  # a value or line that is not what its format says
    PERMISSION = "permission"  # the kernel or library refused (EACCES, NO_PERMISSION)
    GPU_LOST = "gpu_lost"  # the GPU is gone from under the backend
    READ = "read"  # a read that failed otherwise (a perf counter, ...)
    UNREADABLE = "unreadable"  # a file that exists but cannot be read
    VANISHED = "vanished"  # a process that exited mid-scan
    DRM_LISTING = "drm_listing"  # the DRM card listing failed; the last known one is used
    COUNTER_RESET = "counter_reset"  # a counter that went back: that interval is dropped
    BUDGET = "budget"  # the /proc scan ran out of its time budget
    TOO_LARGE = "too_large"  # an fdinfo file larger than any real one
    UNKNOWN_DEVICE = "unknown_device"  # a DRM client of no GPU of this machine
    CARD = "card"  # a card torn down mid-read
    INTERNAL = "internal"  # a reader's own bug, caught: the card keeps its other values
    # A reading no hardware can give: a counter that grew faster than time allows, a
    # value past its unit's range for this GPU (memory over its total, power over a
    # multiple of its limit, a pid outside the kernel's range): dropped (units.plausible)
    IMPLAUSIBLE = "implausible"
    # A sample stamped in the future, or before the reader's last read: dropped, and the
    # reader resynchronises to its own clock
    CLOCK = "clock"
    # A client, process or code past its state table's bound: left out, never kept
    TABLE_FULL = "table_full"
    GPU_METRICS = "gpu_metrics"  # amdgpu's gpu_metrics table unusable
    XID_EVENT = "xid_event"  # NVML's event wait failed
    EXCEPTION = "exception"  # sample() raised: the backend is reopened
    NVML_ERROR = "nvml_error"  # a library call failed otherwise (backends.calls)
    AMDSMI_ERROR = "amdsmi_error"
    LEVEL_ZERO_ERROR = "level_zero_error"
    CHILD_START_FAILED = "child_start_failed"  # macmon
    CHILD_GARBAGE = "child_garbage"
    CHILD_EXITED = "child_exited"
    CHILD_HUNG = "child_hung"
    UNKNOWN_DEVICE_ID = "unknown_device_id"  # a kubelet device id in no known format
    POD_LABEL_CONFLICT = "pod_label_conflict"
    CGROUP_UNREADABLE = "cgroup_unreadable"
    CGROUP_FORMAT = "cgroup_format"
    CDI_SPEC_UNREADABLE = "cdi_spec_unreadable"
    CDI_SPEC_TOO_LARGE = "cdi_spec_too_large"  # a spec past the size or device caps
    CRI_UNAVAILABLE = "cri_unavailable"  # the container runtime did not answer
    CDI_DEVICE_UNKNOWN = "cdi_device_unknown"
    CDI_DEVICE_CONFLICT = "cdi_device_conflict"
    DRA_DEVICE_NODE_UNKNOWN = "dra_device_node_unknown"
    DRA_DEVICE_SHARED = "dra_device_shared"
    # Slurm job mapping files
    NONCANONICAL_NAME = "noncanonical_name"  # a GPU index file named "01", not "1"
    JOBS_OVER_CAP = "jobs_over_cap"  # jobs past the per-GPU cap of one mapping file


class DownReason(Vocabulary):
    """``gpu_exporter_backend_down_reason{reason}``: why a backend is off, a closed set of
    codes mapped from its free-text reason (exporter.pipeline.hubstate.down_code); the text
    itself is logged once and shown in ``/snapshot``."""

    NOT_STARTED = "not_started"  # open() not tried yet
    NO_DEVICE = "no_device"  # no GPU (or card, or client) of its kind on this machine
    NOT_INSTALLED = "not_installed"  # its library, package or program is missing
    DRIVER = "driver"  # the kernel driver is not loaded, or does not match its library
    PERMISSION = "permission"  # the kernel or library refused (a device node, perf, /proc)
    UNSUPPORTED = "unsupported"  # not on this operating system, hardware or kernel
    UNREACHABLE = "unreachable"  # a socket it talks to is absent, refusing or timing out
    INIT_FAILED = "init_failed"  # its library would not start, for another reason
    FAILED = "failed"  # its handle went bad after it was open: reopened with back-off
    EXCEPTION = "exception"  # open() or sample() raised: a bug, reported
    STALE = "stale"  # open, but no completed collection for --stale-after
    OTHER = "other"  # none of the above


# label name -> its closed vocabulary (a label not named here is open).
VOCABULARIES: dict[str, type[Vocabulary]] = {
    "sensor": Sensor, "threshold": Threshold, "clock": Clock, "reason": ThrottleReason,
    "direction": Direction, "severity": Severity, "cause": RetireCause, "type": NvLinkError,
    "remote": Remote, "check": Check, "context": ProcessContext,
}
