"""FakeNVML's NVLink, MIG and health surface (mixed into FakeNVML in fake_nvml.py).

Behaviour follows NVML where real ``nvidia-smi`` captures show it (utkuozdemir/
nvidia_gpu_exporter ``internal/captures``, H100 and H100 MIG on driver 590.48.01):
- NVLink: a GPU without NVLink answers NOT_SUPPORTED for every link; a link index past
  the GPU's last link answers INVALID_ARGUMENT; in MIG mode every NVLink query answers
  NOT_SUPPORTED ("Nvlink queries are not supported for Devices in MIG mode", H100 MIG
  capture). Throughput counters are KiB (nvml.h); every read of one moves it by its
  step and its NVML timestamp by one second, so a rate is exactly ``step * 1024`` B/s.
- MIG: ``FakeGPU.mig_mode`` None = no MIG (NOT_SUPPORTED), 0 = disabled, 1 = enabled;
  ``mig_devices`` can be changed between cycles (instances appear and vanish). A MIG
  handle answers only what NVML answers for one (identity, memory, process lists);
  a handle of a destroyed instance answers INVALID_ARGUMENT. With MIG on, the parent's
  utilisation getters answer NOT_SUPPORTED (nvidia-smi --help-query-gpu, H100 MIG capture).
- Health: violation times (ns), ECC per memory location, retired pages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.fakes.nvml_real import N

MIB = 1 << 20
NVLINK_TS0_US = 1_700_000_000_000_000
REMOTE_TYPES = {"gpu": N.NVML_NVLINK_DEVICE_TYPE_GPU,
                "switch": N.NVML_NVLINK_DEVICE_TYPE_SWITCH,
                "npu": N.NVML_NVLINK_DEVICE_TYPE_IBMNPU,
                "unknown": N.NVML_NVLINK_DEVICE_TYPE_UNKNOWN}
NVLINK_ERRORS = {N.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
                 N.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                 N.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
                 N.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
POLICIES = {N.NVML_PERF_POLICY_POWER: "power", N.NVML_PERF_POLICY_THERMAL: "thermal",
            N.NVML_PERF_POLICY_SYNC_BOOST: "sync_boost"}
LOCATIONS = {N.NVML_MEMORY_LOCATION_L1_CACHE: "l1_cache",
             N.NVML_MEMORY_LOCATION_L2_CACHE: "l2_cache",
             N.NVML_MEMORY_LOCATION_DRAM: "dram",
             N.NVML_MEMORY_LOCATION_REGISTER_FILE: "register_file",
             N.NVML_MEMORY_LOCATION_TEXTURE_MEMORY: "texture_memory",
             N.NVML_MEMORY_LOCATION_TEXTURE_SHM: "texture_shm",
             N.NVML_MEMORY_LOCATION_CBU: "cbu",
             N.NVML_MEMORY_LOCATION_SRAM: "sram"}
# What a MIG device handle answers; anything else is NOT_SUPPORTED on it.
MIG_HANDLE_CALLS = frozenset({
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses"})
# What the parent refuses while MIG is on.
MIG_MODE_REFUSED = frozenset({
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetJpgUtilization",
    "nvmlDeviceGetOfaUtilization", "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetNvLinkUtilizationControl",
    "nvmlDeviceGetNvLinkUtilizationCounter"})


@dataclass
class FakeNvLink:
    state: int = 1  # nvmlDeviceGetNvLinkState: 1 active, 0 not
    remote: str = "switch"  # key of REMOTE_TYPES
    tx_kib: int = 0  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX counter
    rx_kib: int = 0
    tx_step_kib: int = 0  # added after every read
    rx_step_kib: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # replay/recovery/crc_flit/crc_data
    throughput_fields: bool = True  # False: the throughput fields answer NOT_SUPPORTED
    counter_units: int | None = None  # utilization counter 0's control units; None: unsupported
    counter_rx_bytes: int = 0
    counter_tx_bytes: int = 0
    ts_us: dict[str, int] = field(default_factory=lambda: {"tx": NVLINK_TS0_US,
                                                           "rx": NVLINK_TS0_US})


@dataclass
class FakeMig:
    """One MIG device (a compute instance) of a FakeGPU in MIG mode."""

    gpu_instance_id: int
    compute_instance_id: int = 0
    profile: str = "1g.10gb"
    uuid: str = ""
    memory_total_bytes: int = 9984 * MIB
    memory_used_bytes: int | None = None  # None: the sum of its processes
    processes: list[Any] = field(default_factory=list)  # FakeProcess
    gpm: dict[str, float] = field(default_factory=dict)  # percent by NVML_GPM_METRIC_*

    def __post_init__(self) -> None:
        gi, ci = self.gpu_instance_id, self.compute_instance_id
        self.uuid = self.uuid or f"MIG-{0x7a000000 + gi:08x}-{ci:04x}-5a6b-8c7d-{0xe0f0 + gi:012x}"


@dataclass
class FakeHandle:
    gpu: Any  # FakeGPU
    mig: FakeMig | None = None


def fail(code: int) -> None:
    raise N.NVMLError(code)


class LinksAndMig:
    """Mixin: the NVML functions for NVLink, MIG and the health counters."""

    gpus: list[Any]
    _gpm_samples: dict[int, tuple[int, int, int | None]]
    _seq: int

    def _enter(self, fn: str, handle: FakeHandle | None = None, identity: bool = False) -> None:
        raise NotImplementedError

    def _check_mig(self, fn: str, h: FakeHandle) -> None:
        """Called by _enter for every call on a handle."""
        if h.mig is not None:
            if h.gpu.mig_mode != 1 or h.mig not in h.gpu.mig_devices:
                fail(N.NVML_ERROR_INVALID_ARGUMENT)  # the instance is gone
            if fn not in MIG_HANDLE_CALLS:
                fail(N.NVML_ERROR_NOT_SUPPORTED)
        elif h.gpu.mig_mode == 1 and fn in MIG_MODE_REFUSED:
            fail(N.NVML_ERROR_NOT_SUPPORTED)

    # --- NVLink -------------------------------------------------------------------
    def _link(self, fn: str, h: FakeHandle, link: int) -> FakeNvLink:
        self._enter(fn, h)
        links = h.gpu.nvlinks
        if not links:
            fail(N.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links):
            fail(N.NVML_ERROR_INVALID_ARGUMENT)
        result: FakeNvLink = links[link]
        return result

    def nvmlDeviceGetNvLinkState(self, h: FakeHandle, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkState", h, link).state

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: FakeHandle, link: int) -> int:
        return REMOTE_TYPES[self._link("nvmlDeviceGetNvLinkRemoteDeviceType", h, link).remote]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: FakeHandle, link: int, counter: int) -> int:
        errors = self._link("nvmlDeviceGetNvLinkErrorCounter", h, link).errors
        return errors.get(NVLINK_ERRORS[counter], 0)

    def nvmlDeviceGetNvLinkUtilizationControl(self, h: FakeHandle, link: int,
                                              counter: int) -> Any:
        units = self._link("nvmlDeviceGetNvLinkUtilizationControl", h, link).counter_units
        if units is None:
            fail(N.NVML_ERROR_NOT_SUPPORTED)
        return N.nvmlNvLinkUtilizationControl_t(units=units,
                                                pktfilter=N.NVML_NVLINK_COUNTER_PKTFILTER_ALL)

    def nvmlDeviceGetNvLinkUtilizationCounter(self, h: FakeHandle, link: int,
                                              counter: int) -> tuple[int, int]:
        ln = self._link("nvmlDeviceGetNvLinkUtilizationCounter", h, link)
        if ln.counter_units is None:
            fail(N.NVML_ERROR_NOT_SUPPORTED)
        return (ln.counter_rx_bytes, ln.counter_tx_bytes)

    def nvlink_field(self, h: FakeHandle, fid: int, scope: int, v: Any) -> bool:
        """Fill one throughput field value; False when it is not an NVLink field."""
        direction = {N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx",
                     N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx"}.get(fid)
        if direction is None:
            return False
        links = h.gpu.nvlinks
        if h.gpu.mig_mode == 1 or not 0 <= scope < len(links) or not links[scope].throughput_fields:
            v.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
            return True
        ln = links[scope]
        v.valueType = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        v.value.ullVal = getattr(ln, f"{direction}_kib")
        v.timestamp = ln.ts_us[direction]
        v.nvmlReturn = N.NVML_SUCCESS
        setattr(ln, f"{direction}_kib",
                getattr(ln, f"{direction}_kib") + getattr(ln, f"{direction}_step_kib"))
        ln.ts_us[direction] += 1_000_000
        return True

    # --- health -------------------------------------------------------------------
    def nvmlDeviceGetViolationStatus(self, h: FakeHandle, policy: int) -> Any:
        self._enter("nvmlDeviceGetViolationStatus", h)
        ns = (h.gpu.violation_ns or {}).get(POLICIES.get(policy, ""))
        if ns is None:
            fail(N.NVML_ERROR_NOT_SUPPORTED)
        return N.c_nvmlViolationTime_t(referenceTime=1_700_000_000_000_000, violationTime=ns)

    def nvmlDeviceGetMemoryErrorCounter(self, h: FakeHandle, error_type: int, counter: int,
                                        location: int) -> int:
        self._enter("nvmlDeviceGetMemoryErrorCounter", h)
        counts = (h.gpu.ecc_locations or {}).get(LOCATIONS.get(location, ""))
        if counts is None or counter != N.NVML_VOLATILE_ECC:
            fail(N.NVML_ERROR_NOT_SUPPORTED)
        return int(counts[0 if error_type == N.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1])

    # --- MIG ----------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, h: FakeHandle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", h)
        if h.gpu.mig_mode is None:
            fail(N.NVML_ERROR_NOT_SUPPORTED)
        return [h.gpu.mig_mode, h.gpu.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7 if h.gpu.mig_mode == 1 else 0  # an H100 has 7 GPU slices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeHandle, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        migs = h.gpu.mig_devices if h.gpu.mig_mode == 1 else []
        if not 0 <= index < len(migs):
            fail(N.NVML_ERROR_NOT_FOUND)
        return FakeHandle(h.gpu, migs[index])

    def _mig_of(self, fn: str, h: FakeHandle) -> FakeMig:
        self._enter(fn, h)
        if h.mig is None:  # asked of a GPU, not a MIG device
            fail(N.NVML_ERROR_INVALID_ARGUMENT)
        assert h.mig is not None
        return h.mig

    def nvmlDeviceGetGpuInstanceId(self, h: FakeHandle) -> int:
        return self._mig_of("nvmlDeviceGetGpuInstanceId", h).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, h: FakeHandle) -> int:
        return self._mig_of("nvmlDeviceGetComputeInstanceId", h).compute_instance_id

    def nvmlGpmMigSampleGet(self, h: FakeHandle, gpu_instance_id: int, sample: Any) -> Any:
        import ctypes

        self._enter("nvmlGpmMigSampleGet", h)
        if not any(m.gpu_instance_id == gpu_instance_id for m in h.gpu.mig_devices):
            fail(N.NVML_ERROR_INVALID_ARGUMENT)
        self._seq += 1
        address = ctypes.cast(sample, ctypes.c_void_p).value or 0
        self._gpm_samples[address] = (h.gpu.index, self._seq, gpu_instance_id)
        return sample

    def mig_gpm(self, gpu: Any, gpu_instance_id: int) -> dict[str, float]:
        for m in gpu.mig_devices:
            if m.gpu_instance_id == gpu_instance_id:
                gpm: dict[str, float] = m.gpm
                return gpm
        return {}
