"""A fake of the ``pynvml`` surface the NVIDIA backend uses, with behaviour.

``FakeNVML(gpus=[FakeGPU(...), ...])`` answers like nvidia-ml-py: it returns the real
pynvml structs (``c_nvmlMemory_v2_t``, ``c_nvmlUtilization_t``, ``nvmlPciInfo_t``,
``c_nvmlFieldValue_t``, ``c_nvmlProcessUtilizationSample_t``, GPM structs) and raises
the real ``NVMLError`` subclasses (``pynvml.NVMLError(code)`` picks the subclass).
Constants, structs and error classes are taken from the installed pynvml module;
every NVML *function* the backend calls is implemented here, and any other one raises
AttributeError, so the real library is never touched.

Faults: ``FakeGPU.lost`` (telemetry calls raise GPU_IS_LOST; identity calls still
answer, as for a GPU that fell off after discovery), ``FakeGPU.not_supported`` (a set of
function names that raise NOT_SUPPORTED), ``FakeNVML.hang`` (a function that blocks
once the fake has lived ``after_seconds``, until ``release_hang()``), ``no_gpu``
(nvmlInit raises DRIVER_NOT_LOADED), ``FakeNVML.bad`` (every call raises UNINITIALIZED,
like a driver unloaded under us), ``FakeNVML.missing`` (versioned symbols an older driver
lacks). ``calls`` counts every function call by name.

NVLink, MIG (instances appear and vanish) and the health counters live in
``fake_nvml_links.py``; field values (``nvmlDeviceGetFieldValues``) take plain ids or
``(field id, scope id)`` pairs, as nvidia-ml-py does, and fill each value's own
return code and value type.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from tests.fakes.fake_nvml_links import FakeHandle, FakeMig, FakeNvLink, LinksAndMig

__all__ = ["FakeHandle", "FakeMig", "FakeNvLink", "FakeGPU", "FakeNVML", "FakeProcess"]
from tests.fakes.nvml_real import N

MIB = 1 << 20
# PCI bus ids of the eight GPUs of an HGX H100 board (NVML form).
HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
# Every look past a caller's array by any FakeNVML (tests/conftest.py fails the test).
OVERRUNS: list[tuple[str, int, int]] = []
# NVLink throughput field ids (nvml.h NVML_FI_DEV_NVLINK_THROUGHPUT_{DATA,RAW}_{TX,RX}).
NVLINK_THROUGHPUT_IDS = frozenset(getattr(N, f"NVML_FI_DEV_NVLINK_THROUGHPUT_{kind}_{d}")
                                  for kind in ("DATA", "RAW") for d in ("TX", "RX"))




@dataclass
class FakeProcess:
    pid: int
    used_memory_bytes: int | None  # None = NVML_VALUE_NOT_AVAILABLE
    name: str = "python3"  # what nvmlSystemGetProcessName answers
    sm_util: int | None = None  # percent; None = no utilisation sample for it
    graphics: bool = False  # listed by GetGraphicsRunningProcesses instead of Compute
    # A CUDA MPS client: listed by GetMPSComputeRunningProcesses instead of Compute (the
    # MPS server, nvidia-cuda-mps-server, is a plain compute process of its own).
    mps: bool = False
    # µs its utilisation samples are stamped ahead of the wall clock (a driver that stamps
    # one in the future; NVML stamps with the CPU's wall clock, ProcessReader.wall)
    stamp_ahead_us: int = 0

    @property
    def kind(self) -> str:
        return "mps" if self.mps else "graphics" if self.graphics else "compute"


@dataclass
class FakeGPU:
    """An H100 80GB HBM3 at idle by default (values as nvidia-smi -q shows on one)."""

    index: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    pci_bus_id: str = ""
    serial: str = ""
    minor: int | None = None
    vbios_version: str = "96.00.A5.00.01"
    compute_capability: tuple[int, int] = (9, 0)
    architecture: int = 9  # NVML_DEVICE_ARCH_HOPPER
    memory_total_bytes: int = 81559 * MIB
    memory_reserved_bytes: int = 479 * MIB
    memory_used_bytes: int | None = None  # None = sum of the processes' memory
    utilization_gpu: int = 0
    utilization_memory: int = 0
    temperature_gpu: int = 41
    temperature_memory: int | None = 48
    thresholds: dict[str, int] = field(default_factory=lambda: {
        "shutdown": 92, "slowdown": 89, "gpu_max": 87, "mem_max": 95})
    power_mw: int = 69850
    power_limit_mw: int = 700000
    power_default_limit_mw: int = 700000  # H100 SXM: "Default Power Limit : 700.00 W"
    energy_mj: int = 123456789
    energy_step_mj: int = 69850  # added after every energy read (1 s at power_mw)
    fans: list[int] = field(default_factory=list)  # percent per fan; H100 SXM has none
    clocks_mhz: dict[str, int] = field(default_factory=lambda: {
        "graphics": 345, "sm": 345, "memory": 2619, "video": 765})
    max_clocks_mhz: dict[str, int] = field(default_factory=lambda: {
        "graphics": 1980, "sm": 1980, "memory": 2619, "video": 1545})
    pstate: int = 0
    clocks_event_reasons: int = 0x1  # GpuIdle
    pcie_generation: int = 5
    pcie_width: int = 16
    pcie_max_generation: int = 5
    pcie_max_width: int = 16
    pcie_tx_kbps: int = 352
    pcie_rx_kbps: int = 329
    pcie_replays: int = 9
    engines: dict[str, int] = field(default_factory=lambda: {
        "encoder": 0, "decoder": 0, "jpeg": 0, "ofa": 0})
    # nvmlDeviceGetEncoderStats: (sessionCount, averageFps, averageLatency µs); an H100 has
    # no NVENC and answers zeros ("Encoder Stats: Active Sessions : 0", nvidia-smi -q)
    encoder_stats: tuple[int, int, int] = (0, 0, 0)
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    gpm: dict[str, float] = field(default_factory=lambda: {  # percent, by NVML_GPM_METRIC_*
        "graphics_util": 0.0, "sm_util": 0.0, "sm_occupancy": 0.0, "any_tensor_util": 0.0,
        "dram_bw_util": 0.0, "fp64_util": 0.0, "fp32_util": 0.0, "fp16_util": 0.0})
    xids: list[int] = field(default_factory=list)  # XID events pending on the event set
    processes: list[FakeProcess] = field(default_factory=list)
    # Off unless a test or fixture turns them on (a GeForce card has none of these).
    power_instant_mw: int | None = None  # NVML_FI_DEV_POWER_INSTANT
    nvlinks: list[FakeNvLink] = field(default_factory=list)  # empty: no NVLink
    violation_ns: dict[str, int] | None = None  # "power"/"thermal"/"sync_boost" -> ns
    ecc_locations: dict[str, tuple[int, int]] | None = None  # block -> (corrected, uncorrected)
    retired_pages: dict[str, int] | None = None  # "single_bit"/"double_bit" -> pages
    retired_pending: int | None = None  # NVML_FI_DEV_RETIRED_PENDING (pre-Ampere)
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvmlDeviceGpuRecoveryAction_t); None: a driver
    # older than the field, which answers NOT_SUPPORTED
    recovery_action: int | None = None
    # nvmlDeviceGetGpuFabricInfoV: None for a GPU in no NVSwitch fabric (NOT_SUPPORTED, as a
    # PCIe card answers); else {"state": nvmlGpuFabricState_t, "status": the registration's
    # nvmlReturn_t, "health_mask": healthMask, "health_summary": healthSummary}, where a
    # "health_summary" of None is a driver that knows only the v2 structure (it answers
    # ARGUMENT_VERSION_MISMATCH to v3, as versioned NVML structures do).
    fabric: dict[str, Any] | None = None
    mig_mode: int | None = None  # None: no MIG; 0 disabled; 1 enabled
    mig_devices: list[FakeMig] = field(default_factory=list)
    # field id -> (nvmlReturn, valueType, value): answer this instead (value types, faults)
    field_overrides: dict[int, tuple[int, int, Any]] = field(default_factory=dict)
    lost: bool = False
    not_supported: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        i = self.index
        self.uuid = self.uuid or f"GPU-{0x5f6e0000 + i:08x}-1c2d-4e3f-8a9b-{0xa1b2c3d4 + i:012x}"
        bus = HGX_BUS_IDS[i] if i < len(HGX_BUS_IDS) else f"{0x40 + i:02X}"
        self.pci_bus_id = self.pci_bus_id or f"00000000:{bus}:00.0"
        self.serial = self.serial or f"16549220{i:05d}"
        self.minor = i if self.minor is None else self.minor


class _GpmSampleBuf(ctypes.Structure):
    _fields_ = [("tag", ctypes.c_uint64)]  # gives every sample a distinct address


class FakeNVML(LinksAndMig):
    """Module-like object: ``fake.nvmlInit()``, ``fake.NVML_CLOCK_SM``, ``fake.NVMLError``..."""

    def __init__(self, gpus: list[FakeGPU] | None = None, driver_version: str = "550.127.05",
                 no_gpu: bool = False, hang: dict[str, Any] | None = None,
                 missing: set[str] | None = None) -> None:
        self.gpus = gpus if gpus is not None else [FakeGPU()]
        # Versioned functions this driver lacks (NVML_ERROR_FUNCTION_NOT_FOUND), such as
        # "nvmlDeviceGetComputeRunningProcesses_v3" on a driver older than that symbol.
        self.missing = set(missing or ())
        self.driver_version = driver_version
        self.no_gpu = no_gpu
        self.hang = hang  # {"function": name, "after_seconds": s, "gpu": index (optional)}
        self.bad = False
        self.initialized = 0
        self.calls: Counter[str] = Counter()
        self.started = time.monotonic()
        self._release = threading.Event()
        self._event_sets: dict[int, set[int]] = {}
        # sample address -> (gpu index, seq, GPU instance id or None)
        self._gpm_samples: dict[int, tuple[int, int, int | None]] = {}
        self._gpm_bufs: list[Any] = []
        self._seq = 0
        self._clock_us = 1_700_000_000_000_000
        self.field_batches: list[int] = []  # how many fields each FieldValues call asked for
        # (function, count, entries the caller owned): the driver looked past the caller's array
        self.overruns: list[tuple[str, int, int]] = []

    # --- plumbing -------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        value = getattr(N, name)
        if name.startswith("nvml") and callable(value) and not isinstance(value, type):
            raise AttributeError(f"FakeNVML does not implement {name}")
        return value

    def release_hang(self) -> None:
        self._release.set()

    def _enter(self, fn: str, handle: FakeHandle | None = None, identity: bool = False) -> None:
        self.calls[fn] += 1
        if self.bad:
            raise N.NVMLError(N.NVML_ERROR_UNINITIALIZED)
        if fn not in ("nvmlInit", "nvmlShutdown") and self.initialized <= 0:
            raise N.NVMLError(N.NVML_ERROR_UNINITIALIZED)
        h = self.hang
        gpu = None if handle is None else handle.gpu.index
        on_gpu = h and (h.get("gpu") is None or gpu == h["gpu"])
        if (h and on_gpu and h.get("function") == fn
                and time.monotonic() - self.started >= float(h.get("after_seconds", 0))):
            while not self._release.wait(0.05):  # blocks like a hung driver call
                pass
        if handle is None:
            return
        if handle.gpu.lost and not identity:
            raise N.NVMLError(N.NVML_ERROR_GPU_IS_LOST)
        if fn in handle.gpu.not_supported:
            raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)
        if not identity or handle.mig is not None:
            self._check_mig(fn, handle)

    # --- library --------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.no_gpu:
            raise N.NVMLError(N.NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        if self.initialized <= 0:
            raise N.NVMLError(N.NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._enter("nvmlSystemGetProcessName")
        for g in self.gpus:
            for p in g.processes:
                if p.pid == pid:
                    return p.name
        raise N.NVMLError(N.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise N.NVMLError(N.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(self.gpus[index])

    # --- identity (answer even for a lost GPU) --------------------------------
    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        self._enter("nvmlDeviceGetUUID", h, identity=True)
        return h.gpu.uuid if h.mig is None else h.mig.uuid

    def nvmlDeviceGetName(self, h: FakeHandle) -> str:
        self._enter("nvmlDeviceGetName", h, identity=True)
        # A MIG device's name carries its profile, as nvidia-smi -L prints it.
        return h.gpu.name if h.mig is None else f"{h.gpu.name} MIG {h.mig.profile}"

    def nvmlDeviceGetPciInfo(self, h: FakeHandle) -> Any:
        self._enter("nvmlDeviceGetPciInfo", h, identity=True)
        info = N.nvmlPciInfo_t()
        bus = h.gpu.pci_bus_id.encode()
        info.busId = bus
        info.busIdLegacy = bus[4:]
        domain, b, rest = h.gpu.pci_bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(b, 16), int(rest[:2], 16)
        info.pciDeviceId = 0x233010DE
        info.pciSubSystemId = 0x16C110DE
        return info

    def nvmlDeviceGetSerial(self, h: FakeHandle) -> str:
        self._enter("nvmlDeviceGetSerial", h, identity=True)
        return h.gpu.serial

    def nvmlDeviceGetMinorNumber(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMinorNumber", h, identity=True)
        return int(h.gpu.minor or 0)

    def nvmlDeviceGetVbiosVersion(self, h: FakeHandle) -> str:
        self._enter("nvmlDeviceGetVbiosVersion", h, identity=True)
        return h.gpu.vbios_version

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeHandle) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", h, identity=True)
        return h.gpu.compute_capability

    def nvmlDeviceGetArchitecture(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetArchitecture", h, identity=True)
        return h.gpu.architecture

    # --- telemetry --------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        return N.c_nvmlUtilization_t(gpu=h.gpu.utilization_gpu, memory=h.gpu.utilization_memory)

    def _used(self, g: FakeGPU | FakeMig) -> int:
        if g.memory_used_bytes is not None:
            return g.memory_used_bytes
        procs = list(g.processes)
        if isinstance(g, FakeGPU) and g.mig_mode == 1:
            procs += [p for m in g.mig_devices for p in m.processes]
        return sum(p.used_memory_bytes or 0 for p in procs)

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        if h.mig is not None:  # a MIG device: its GPU instance's memory, no reservation
            used = self._used(h.mig)
            total = h.mig.memory_total_bytes
            if version:
                return N.c_nvmlMemory_v2_t(version=version, total=total, reserved=0,
                                           free=total - used, used=used)
            return N.c_nvmlMemory_t(total=total, free=total - used, used=used)
        g = h.gpu
        used = self._used(g)
        if version:
            if "nvmlDeviceGetMemoryInfo_v2" in g.not_supported:
                raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
            free = g.memory_total_bytes - g.memory_reserved_bytes - used
            return N.c_nvmlMemory_v2_t(version=version, total=g.memory_total_bytes,
                                       reserved=g.memory_reserved_bytes, free=free, used=used)
        # v1 counts the driver's reservation as used, like old drivers did.
        used1 = used + g.memory_reserved_bytes
        return N.c_nvmlMemory_t(total=g.memory_total_bytes, free=g.memory_total_bytes - used1,
                                used=used1)

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        return h.gpu.temperature_gpu

    def nvmlDeviceGetTemperatureThreshold(self, h: FakeHandle, threshold: int) -> int:
        self._enter("nvmlDeviceGetTemperatureThreshold", h)
        names = {N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
                 N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
                 N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
                 N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "mem_max"}
        value = h.gpu.thresholds.get(names.get(threshold, ""))
        if value is None:
            raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)
        return value

    # --- field values: the driver's C function and nvidia-ml-py's wrapper of it ------
    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        """nvidia-ml-py's lookup of a C function in libnvidia-ml; the fake has the C level
        only for the call whose array handling matters (nvmlDeviceGetFieldValues)."""
        if name != "nvmlDeviceGetFieldValues":
            raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._c_field_values

    def nvmlDeviceGetFieldValues(self, h: FakeHandle, field_ids: Any) -> Any:
        """nvidia-ml-py's wrapper, as it is written (13.615 ``nvmlDeviceGetFieldValues``):
        an array of exactly ``len(field_ids)`` entries handed to the C function."""
        values = (N.c_nvmlFieldValue_t * len(field_ids))()
        for i, request in enumerate(field_ids):
            fid, scope = request if isinstance(request, tuple) else (request, 0)
            values[i].fieldId, values[i].scopeId = fid, scope
        N._nvmlCheckReturn(self._c_field_values(h, ctypes.c_int32(len(field_ids)),
                                                ctypes.byref(values)))
        return values

    def _c_field_values(self, h: FakeHandle, count: Any, ref: Any) -> int:
        """``nvmlReturn_t nvmlDeviceGetFieldValues(device, int valuesCount, nvmlFieldValue_t
        *values)`` as driver 580.159.04 behaves on NVLinked H200s: it fills the ``count``
        entries and, when the last requested field is an NVLink throughput field, reads the
        entry one past ``count`` and writes its timestamp if that entry's field id is an
        NVLink throughput id. The fake checks what a C library cannot: that the caller
        passed ``c_nvmlFieldValue_t`` entries, and whether the entry past ``count`` is in
        the caller's buffer at all. When it is not, a real driver reads (and may write)
        another heap object: that is recorded in ``overruns``, which tests assert empty."""
        try:
            self._enter("nvmlDeviceGetFieldValues", h)
        except N.NVMLError as e:
            return int(e.value)
        array = ref._obj  # the object byref() points at: its size is what the caller owns
        if getattr(type(array), "_type_", None) is not N.c_nvmlFieldValue_t:
            raise TypeError(f"nvmlDeviceGetFieldValues given {type(array).__name__}, "
                            "not an array of c_nvmlFieldValue_t")
        n, owned = int(count.value), len(array)
        if not 0 < n <= owned:
            return int(N.NVML_ERROR_INVALID_ARGUMENT)
        self.field_batches.append(n)
        self._fill_field_values(h, array, n)
        if array[n - 1].fieldId in NVLINK_THROUGHPUT_IDS:  # the driver looks one past the end
            if n >= owned:
                self.overruns.append(("nvmlDeviceGetFieldValues", n, owned))
                OVERRUNS.append(("nvmlDeviceGetFieldValues", n, owned))
            elif array[n].fieldId in NVLINK_THROUGHPUT_IDS:
                array[n].timestamp = self._clock_us
        return int(N.NVML_SUCCESS)

    def _fill_field_values(self, h: FakeHandle, values: Any, count: int) -> None:
        g = h.gpu
        retired = g.retired_pages or {}
        plain = {N.NVML_FI_DEV_MEMORY_TEMP: g.temperature_memory,
                 N.NVML_FI_DEV_POWER_INSTANT: g.power_instant_mw,
                 N.NVML_FI_DEV_RETIRED_SBE: retired.get("single_bit"),
                 N.NVML_FI_DEV_RETIRED_DBE: retired.get("double_bit"),
                 N.NVML_FI_DEV_RETIRED_PENDING: g.retired_pending,
                 N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: g.recovery_action}
        for i in range(count):
            v = values[i]
            fid, scope = v.fieldId, v.scopeId
            v.timestamp = self._clock_us
            if fid in g.field_overrides:
                v.nvmlReturn, v.valueType, value = g.field_overrides[fid]
                member = {N.NVML_VALUE_TYPE_DOUBLE: "dVal",
                          N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
                          N.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
                          N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal"}.get(v.valueType, "uiVal")
                setattr(v.value, member, value)
                continue
            if self.nvlink_field(h, fid, scope, v):
                continue
            value = plain.get(fid)
            if value is None:
                v.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
                continue
            v.valueType = N.NVML_VALUE_TYPE_UNSIGNED_INT
            v.value.uiVal = value
            v.nvmlReturn = N.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, h: FakeHandle, ref: Any) -> int:
        """nvidia-ml-py's wrapper hands the caller's structure (by reference) to the driver,
        which checks its ``version`` and fills it."""
        self._enter("nvmlDeviceGetGpuFabricInfoV", h)
        fabric = h.gpu.fabric
        if fabric is None:
            raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)
        info = ref._obj
        knows_v3 = fabric.get("health_summary") is not None
        if info.version == N.nvmlGpuFabricInfo_v3 and not knows_v3:
            raise N.NVMLError(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if info.version not in (N.nvmlGpuFabricInfo_v2, N.nvmlGpuFabricInfo_v3):
            raise N.NVMLError(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.state, info.status = fabric["state"], fabric.get("status", N.NVML_SUCCESS)
        info.healthMask = fabric.get("health_mask", 0)
        if info.version == N.nvmlGpuFabricInfo_v3:
            info.healthSummary = fabric["health_summary"]
        return int(N.NVML_SUCCESS)

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return h.gpu.power_mw

    def nvmlDeviceGetEncoderStats(self, h: FakeHandle) -> tuple[int, int, int]:
        self._enter("nvmlDeviceGetEncoderStats", h)
        return h.gpu.encoder_stats

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return h.gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPowerManagementDefaultLimit", h)
        return h.gpu.power_default_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        value = h.gpu.energy_mj
        h.gpu.energy_mj += h.gpu.energy_step_mj
        return value

    def nvmlDeviceGetNumFans(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetNumFans", h)
        return len(h.gpu.fans)

    def nvmlDeviceGetFanSpeed_v2(self, h: FakeHandle, fan: int) -> int:
        self._enter("nvmlDeviceGetFanSpeed_v2", h)
        if not 0 <= fan < len(h.gpu.fans):
            raise N.NVMLError(N.NVML_ERROR_INVALID_ARGUMENT)  # what an H200 answers for fan 0
        return h.gpu.fans[fan]

    def _clock_name(self, clock: int) -> str:
        return {N.NVML_CLOCK_GRAPHICS: "graphics", N.NVML_CLOCK_SM: "sm",
                N.NVML_CLOCK_MEM: "memory", N.NVML_CLOCK_VIDEO: "video"}[clock]

    def nvmlDeviceGetClockInfo(self, h: FakeHandle, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        return h.gpu.clocks_mhz[self._clock_name(clock)]

    def nvmlDeviceGetMaxClockInfo(self, h: FakeHandle, clock: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", h)
        return h.gpu.max_clocks_mhz[self._clock_name(clock)]

    def nvmlDeviceGetPerformanceState(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPerformanceState", h)
        return h.gpu.pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.gpu.clocks_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.gpu.clocks_event_reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return h.gpu.pcie_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return h.gpu.pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMaxPcieLinkGeneration", h)
        return h.gpu.pcie_max_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMaxPcieLinkWidth", h)
        return h.gpu.pcie_max_width

    def nvmlDeviceGetPcieThroughput(self, h: FakeHandle, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", h)
        return h.gpu.pcie_tx_kbps if counter == N.NVML_PCIE_UTIL_TX_BYTES else h.gpu.pcie_rx_kbps

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", h)
        return h.gpu.pcie_replays

    def _engine(self, fn: str, h: FakeHandle, key: str) -> list[int]:
        self._enter(fn, h)
        if key not in h.gpu.engines:
            raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)
        return [h.gpu.engines[key], 167000]  # [percent, sampling period us]

    def nvmlDeviceGetEncoderUtilization(self, h: FakeHandle) -> list[int]:
        return self._engine("nvmlDeviceGetEncoderUtilization", h, "encoder")

    def nvmlDeviceGetDecoderUtilization(self, h: FakeHandle) -> list[int]:
        return self._engine("nvmlDeviceGetDecoderUtilization", h, "decoder")

    def nvmlDeviceGetJpgUtilization(self, h: FakeHandle) -> list[int]:
        return self._engine("nvmlDeviceGetJpgUtilization", h, "jpeg")

    def nvmlDeviceGetOfaUtilization(self, h: FakeHandle) -> list[int]:
        return self._engine("nvmlDeviceGetOfaUtilization", h, "ofa")

    def nvmlDeviceGetTotalEccErrors(self, h: FakeHandle, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        if error_type == N.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return h.gpu.ecc_corrected
        return h.gpu.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, h: FakeHandle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", h)
        return h.gpu.remapped_rows

    # --- processes ----------------------------------------------------------------
    # nvidia-ml-py's getters (pynvml.py, nvidia-ml-py 13.615.71): ``<name>_v3`` and
    # ``<name>_v2`` ask the driver for that symbol (NVML_ERROR_FUNCTION_NOT_FOUND on a
    # driver without it) and return nvmlFriendlyObjects of c_nvmlProcessInfo_v3_t's fields
    # (pid, usedGpuMemory, gpuInstanceId, computeInstanceId), usedGpuMemory None for
    # NVML_VALUE_NOT_AVAILABLE; the unversioned name calls ``_v3`` and turns a missing
    # symbol into NVMLLibraryMismatchError (@throwOnVersionMismatch), no NVMLError. NVML
    # (nvml.h, nvmlDeviceGetMPSComputeRunningProcesses_v3): the MPS list holds the processes
    # with an MPS compute context, on a device or a MIG device handle.
    def _procs(self, fn: str, h: FakeHandle, kind: str, version: str = "_v3") -> list[Any]:
        if fn + version in self.missing:
            self.calls[fn + version] += 1
            raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
        self._enter(fn, h)
        g = h.gpu
        if h.mig is not None:  # a MIG handle lists its own instance's processes
            listed = [(p, h.mig) for p in h.mig.processes]
        elif g.mig_mode == 1:  # the parent (as root) lists every instance's
            listed = [(p, m) for m in g.mig_devices for p in m.processes]
        else:
            listed = [(p, None) for p in g.processes]
        out = []
        for p, mig in listed:
            if p.kind == kind:
                # pynvml turns NVML_VALUE_NOT_AVAILABLE into None (nvmlStructToFriendlyObject)
                out.append(N.nvmlFriendlyObject({
                    "pid": p.pid, "usedGpuMemory": p.used_memory_bytes,
                    "gpuInstanceId": 0xFFFFFFFF if mig is None else mig.gpu_instance_id,
                    "computeInstanceId": 0xFFFFFFFF if mig is None else mig.compute_instance_id}))
        return out

    def _unversioned(self, fn: str, h: FakeHandle, kind: str) -> list[Any]:
        try:
            return self._procs(fn, h, kind)
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise N.NVMLLibraryMismatchError(f"{fn}: no _v3 in this driver") from e
            raise

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: FakeHandle) -> list[Any]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses", h, "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: FakeHandle) -> list[Any]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses", h, "compute", "_v2")

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeHandle) -> list[Any]:
        return self._unversioned("nvmlDeviceGetComputeRunningProcesses", h, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: FakeHandle) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", h, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h: FakeHandle) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", h, "graphics", "_v2")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeHandle) -> list[Any]:
        return self._unversioned("nvmlDeviceGetGraphicsRunningProcesses", h, "graphics")

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, h: FakeHandle) -> list[Any]:
        return self._procs("nvmlDeviceGetMPSComputeRunningProcesses", h, "mps")

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, h: FakeHandle) -> list[Any]:
        return self._procs("nvmlDeviceGetMPSComputeRunningProcesses", h, "mps", "_v2")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: FakeHandle) -> list[Any]:
        return self._unversioned("nvmlDeviceGetMPSComputeRunningProcesses", h, "mps")

    def nvmlDeviceGetProcessUtilization(self, h: FakeHandle, since_us: int) -> list[Any]:
        from exporter.sources.nvidia.processes import ProcessReader

        self._enter("nvmlDeviceGetProcessUtilization", h)
        # Stamped with the host's wall clock, the one the reader reads (tests patch it).
        now_us = int(ProcessReader.wall() * 1_000_000)
        samples = [N.c_nvmlProcessUtilizationSample_t(
            pid=p.pid, timeStamp=now_us + p.stamp_ahead_us, smUtil=p.sm_util, memUtil=0,
            encUtil=0, decUtil=0) for p in h.gpu.processes if p.sm_util is not None]
        if not samples:
            raise N.NVMLError(N.NVML_ERROR_NOT_FOUND)  # NVML: no samples since since_us
        return samples

    # --- XID event set ----------------------------------------------------------------
    def nvmlEventSetCreate(self) -> int:
        self._enter("nvmlEventSetCreate")
        handle = len(self._event_sets) + 1
        self._event_sets[handle] = set()
        return handle

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, types: int, event_set: int) -> None:
        self._enter("nvmlDeviceRegisterEvents", h)
        self._event_sets[event_set].add(h.gpu.index)

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        for index in sorted(self._event_sets.get(event_set, ())):
            g = self.gpus[index]
            if g.xids:
                # c_nvmlEventData_t's fields; `device` is this fake's handle
                return SimpleNamespace(device=FakeHandle(g),
                                       eventType=N.nvmlEventTypeXidCriticalError,
                                       eventData=g.xids.pop(0), gpuInstanceId=0xFFFFFFFF,
                                       computeInstanceId=0xFFFFFFFF)
        raise N.NVMLError(N.NVML_ERROR_TIMEOUT)

    def nvmlEventSetWait(self, event_set: int, timeout_ms: int) -> Any:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: int) -> None:
        self._enter("nvmlEventSetFree")
        self._event_sets.pop(event_set, None)

    # --- GPM ----------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: FakeHandle) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        support = N.c_nvmlGpmSupport_t()
        support.version = N.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(h.gpu.architecture >= N.NVML_DEVICE_ARCH_HOPPER)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buf = _GpmSampleBuf()
        self._gpm_bufs.append(buf)  # keep it alive: its address is the sample's identity
        return ctypes.cast(ctypes.pointer(buf), N.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._gpm_samples.pop(ctypes.cast(sample, ctypes.c_void_p).value or 0, None)

    def nvmlGpmSampleGet(self, h: FakeHandle, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", h)
        self._seq += 1
        self._gpm_samples[ctypes.cast(sample, ctypes.c_void_p).value or 0] = (h.gpu.index,
                                                                              self._seq, None)
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        s1 = self._gpm_samples.get(ctypes.cast(mg.sample1, ctypes.c_void_p).value or 0)
        s2 = self._gpm_samples.get(ctypes.cast(mg.sample2, ctypes.c_void_p).value or 0)
        if s1 is None or s2 is None or s1[0] != s2[0] or s1[2] != s2[2] or s1[1] >= s2[1]:
            raise N.NVMLError(N.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[s1[0]]
        gpm = gpu.gpm if s1[2] is None else self.mig_gpm(gpu, s1[2])
        by_id = {getattr(N, "NVML_GPM_METRIC_" + k.upper()): v for k, v in gpm.items()}
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in by_id:
                m.value, m.nvmlReturn = by_id[m.metricId], N.NVML_SUCCESS
            else:
                m.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
        return mg
