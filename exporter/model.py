"""What a backend reports: frozen dataclasses with the unit in every field name.

Backends build these and never touch prometheus-client; the renderer turns them
into metric families and never touches a vendor library. ``None`` (or a key that
is absent from a mapping) means "this source does not expose it" and produces
no series: never 0, never NaN.

Mapping fields are keyed by the label value docs/metrics.md names for that family
(``temperatures_celsius["junction"]``, ``clocks_hertz["sm"]``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

EMPTY: Mapping[Any, Any] = MappingProxyType({})

VENDORS = ("nvidia", "amd", "intel", "apple")


def _empty() -> Any:
    """A default for Mapping fields: one shared read-only empty mapping."""
    return field(default_factory=lambda: EMPTY)


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

    vendor: str  # one of VENDORS
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
    slice_labels: Mapping[str, str] = _empty()
    # Extra gpu_info labels where the source knows them (docs/metrics.md: partition, mig_mode).
    info_labels: Mapping[str, str] = _empty()

    @property
    def key(self) -> str:
        """What joins backends' views of one device: the PCI bus id, else ``device_key``."""
        return self.device_key or self.pci_bus_id


@dataclass(frozen=True)
class ProcessSample:
    """One process's use of one GPU."""

    pid: int
    process: str  # the kernel's comm, already decoded safely
    memory_used_bytes: float | None = None  # device-local
    shared_memory_used_bytes: float | None = None  # GTT / system memory charged to it
    utilization_ratio: Mapping[str, float] = _empty()  # engine ("sm", "gfx", "render", ...) -> 0..1
    engine_busy_seconds: Mapping[str, float] = _empty()  # engine -> counter, seconds
    host_memory_bytes: float | None = None  # RSS
    container: str | None = None
    pod: str | None = None
    namespace: str | None = None
    # Set by the collector's merge: the source this process was reported by, and (as
    # DeviceSample.field_sources) where one of its fields came from another source.
    source: str = ""
    field_sources: Mapping[Any, str] = _empty()


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


@dataclass(frozen=True)
class DeviceSample:
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
    field_sources: Mapping[Any, str] = _empty()  # field or (field, key) -> source

    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    memory_free_bytes: float | None = None
    memory_reserved_bytes: float | None = None
    shared_memory_total_bytes: float | None = None
    shared_memory_used_bytes: float | None = None
    temperatures_celsius: Mapping[str, float] = _empty()  # sensor -> °C
    temperature_thresholds_celsius: Mapping[str, float] = _empty()  # threshold -> °C
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # counter since driver load
    fan_speed_ratio: Mapping[str, float] = _empty()  # fan -> 0..1
    clocks_hertz: Mapping[str, float] = _empty()  # clock -> Hz
    clocks_max_hertz: Mapping[str, float] = _empty()
    performance_state: int | None = None
    throttle_reasons: Mapping[str, bool] = _empty()  # reason -> active
    pcie_link_generation: int | None = None
    pcie_link_width: int | None = None
    pcie_link_max_generation: int | None = None
    pcie_link_max_width: int | None = None
    pcie_throughput_bytes_per_second: Mapping[str, float] = _empty()  # "tx" / "rx"
    pcie_replay_errors: int | None = None  # counter
    engine_utilization_ratio: Mapping[str, float] = _empty()  # engine -> 0..1
    engine_busy_seconds: Mapping[str, float] = _empty()  # engine -> counter, seconds
    ecc_errors: Mapping[str, int] = _empty()  # "corrected" / "uncorrected" -> counter
    remapped_rows: Mapping[str, int] = _empty()  # severity -> rows
    remap_failed: bool | None = None
    xid_errors: Mapping[int, int] = _empty()  # XID code -> counter
    profiling_ratio: Mapping[str, float] = _empty()  # "sm_active", "tensor_active", ... -> 0..1
    nvlink_throughput_bytes_per_second: Mapping[tuple[str, str], float] = _empty()  # (link, dir)
    power_instant_watts: float | None = None  # where the source splits it from the average
    clock_event_seconds: Mapping[str, float] = _empty()  # throttle reason -> counter, seconds
    remap_pending: bool | None = None  # a row remap waits for the next GPU reset
    retired_pages: Mapping[str, int] = _empty()  # "single_bit" / "double_bit" -> pages
    xid_last_timestamp_seconds: float | None = None  # wall clock of the newest XID event
    # Code of the newest XID event; 0 for a GPU registered for XID events that has had none
    # yet (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS, a last-value gauge).
    xid_last: int | None = None
    memory_bandwidth_bytes_per_second: Mapping[str, float] = _empty()  # "read" / "write"
    nvlink_up: Mapping[tuple[str, str], bool] = _empty()  # (link, remote) -> up
    nvlink_errors: Mapping[tuple[str, str], int] = _empty()  # (link, type) -> counter
    xgmi_throughput_bytes_per_second: Mapping[tuple[str, str], float] = _empty()  # (link, dir)
    ras_errors: Mapping[tuple[str, str], int] = _empty()  # (block, severity) -> counter
    # Health inputs (exporter.health), not families of their own: NVML's GPU recovery action
    # (nvmlDeviceGpuRecoveryAction_t as "none", "gpu_reset", "node_reboot", ...), a page
    # retirement waiting for a reset (before Ampere), and when each XID code last happened.
    recovery_action: str | None = None
    retired_pages_pending: bool | None = None
    xid_seen_seconds: Mapping[int, float] = _empty()  # XID code -> wall clock of its newest
    # (sensor, threshold) -> °C where each sensor has thresholds of its own (amdgpu hwmon
    # tempN_crit / tempN_emergency for edge, junction and memory alike).
    temperature_limits_celsius: Mapping[tuple[str, str], float] = _empty()
    processes: tuple[ProcessSample, ...] = ()
    # Filled by the collector after the merge (Kubernetes attribution), never by a backend.
    allocations: tuple[Allocation, ...] = ()

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
        return replace(self, processes=processes)


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
    errors: Mapping[str, int] = field(default_factory=dict)
