"""NVML's error classifier over the shared guarded call (exporter.sources.calls).

Every telemetry getter of the NVIDIA backend goes through ``Caller.get``; the
``pynvml.NVMLError`` return codes are sorted here and acted on by ``calls.Guard``:

- not supported / function not found: skip ("not exposed", never asked again);
- no permission: skip, counted once;
- GPU lost: ``DeviceLost`` (also known here as ``GpuLost``), the device reports up=0;
- the library itself gone bad (uninitialised, driver unloaded, RM mismatch):
  ``BackendFailed``, so the collector closes NVML and re-initialises it with back-off;
- anything else: ``None`` and one ``nvml_error`` count.

``Caller.probe`` is ``get`` for calls that ask whether something exists (an NVLink
index past the last link answers INVALID_ARGUMENT): those answers are "absent", not
errors. It also filters the sentinels NVML uses for "not available" (all-ones integers).
"""

from __future__ import annotations

from collections import Counter
from enum import Enum
from typing import Any

from exporter.core.labels import ErrorReason
from exporter.sources.calls import DeviceLost, Guard, Verdict

U32_NA = 0xFFFFFFFF
U64_LIMIT = 1 << 63  # a u64 counter this large is a sentinel, never a reading

# NVML return codes (nvml.h); looked up on the module in use with these fallbacks.
_SKIP_CODES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")
_PERMISSION_CODE = "NVML_ERROR_NO_PERMISSION"
_LOST_CODES = ("NVML_ERROR_GPU_IS_LOST",)
_ABSENT_CODES = ("NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_FOUND")
_DEAD_CODES = (
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
)


GpuLost = DeviceLost  # the name the NVIDIA readers use


class Nvml(str, Enum):
    """The NVML functions the backend calls, by name: what ``Caller.get`` / ``probe`` take
    and what the guard remembers (a typo is a type error, not a call never made). The
    getters of plain scalars are named once, in the rows of ``nvidia.scalars``
    (``Caller.read``); tests/test_nvidia_scalars.py holds both to nvidia-ml-py."""

    DEVICE_GET_ARCHITECTURE = "nvmlDeviceGetArchitecture"
    DEVICE_GET_CLOCK_INFO = "nvmlDeviceGetClockInfo"
    DEVICE_GET_COMPUTE_RUNNING_PROCESSES = "nvmlDeviceGetComputeRunningProcesses"
    DEVICE_GET_CUDA_COMPUTE_CAPABILITY = "nvmlDeviceGetCudaComputeCapability"
    DEVICE_GET_CURRENT_CLOCKS_EVENT_REASONS = "nvmlDeviceGetCurrentClocksEventReasons"
    DEVICE_GET_CURRENT_CLOCKS_THROTTLE_REASONS = "nvmlDeviceGetCurrentClocksThrottleReasons"
    DEVICE_GET_DECODER_UTILIZATION = "nvmlDeviceGetDecoderUtilization"
    DEVICE_GET_ENCODER_UTILIZATION = "nvmlDeviceGetEncoderUtilization"
    DEVICE_GET_FIELD_VALUES = "nvmlDeviceGetFieldValues"
    DEVICE_GET_FAN_SPEED_V2 = "nvmlDeviceGetFanSpeed_v2"
    DEVICE_GET_GPU_FABRIC_INFO_V = "nvmlDeviceGetGpuFabricInfoV"
    DEVICE_GET_GPU_INSTANCE_ID = "nvmlDeviceGetGpuInstanceId"
    DEVICE_GET_GRAPHICS_RUNNING_PROCESSES = "nvmlDeviceGetGraphicsRunningProcesses"
    DEVICE_GET_JPG_UTILIZATION = "nvmlDeviceGetJpgUtilization"
    DEVICE_GET_MAX_CLOCK_INFO = "nvmlDeviceGetMaxClockInfo"
    DEVICE_GET_MAX_MIG_DEVICE_COUNT = "nvmlDeviceGetMaxMigDeviceCount"
    DEVICE_GET_MEMORY_ERROR_COUNTER = "nvmlDeviceGetMemoryErrorCounter"
    DEVICE_GET_MEMORY_INFO = "nvmlDeviceGetMemoryInfo"
    DEVICE_GET_MIG_DEVICE_HANDLE_BY_INDEX = "nvmlDeviceGetMigDeviceHandleByIndex"
    DEVICE_GET_MIG_MODE = "nvmlDeviceGetMigMode"
    DEVICE_GET_MINOR_NUMBER = "nvmlDeviceGetMinorNumber"
    DEVICE_GET_MPS_COMPUTE_RUNNING_PROCESSES = "nvmlDeviceGetMPSComputeRunningProcesses"
    DEVICE_GET_NAME = "nvmlDeviceGetName"
    DEVICE_GET_NUM_FANS = "nvmlDeviceGetNumFans"
    DEVICE_GET_NV_LINK_ERROR_COUNTER = "nvmlDeviceGetNvLinkErrorCounter"
    DEVICE_GET_NV_LINK_REMOTE_DEVICE_TYPE = "nvmlDeviceGetNvLinkRemoteDeviceType"
    DEVICE_GET_NV_LINK_STATE = "nvmlDeviceGetNvLinkState"
    DEVICE_GET_NV_LINK_UTILIZATION_CONTROL = "nvmlDeviceGetNvLinkUtilizationControl"
    DEVICE_GET_NV_LINK_UTILIZATION_COUNTER = "nvmlDeviceGetNvLinkUtilizationCounter"
    DEVICE_GET_OFA_UTILIZATION = "nvmlDeviceGetOfaUtilization"
    DEVICE_GET_PCIE_THROUGHPUT = "nvmlDeviceGetPcieThroughput"
    DEVICE_GET_PROCESS_UTILIZATION = "nvmlDeviceGetProcessUtilization"
    DEVICE_GET_REMAPPED_ROWS = "nvmlDeviceGetRemappedRows"
    DEVICE_GET_SERIAL = "nvmlDeviceGetSerial"
    DEVICE_GET_TEMPERATURE = "nvmlDeviceGetTemperature"
    DEVICE_GET_TEMPERATURE_THRESHOLD = "nvmlDeviceGetTemperatureThreshold"
    DEVICE_GET_TOTAL_ECC_ERRORS = "nvmlDeviceGetTotalEccErrors"
    DEVICE_GET_TOTAL_ENERGY_CONSUMPTION = "nvmlDeviceGetTotalEnergyConsumption"
    DEVICE_GET_UTILIZATION_RATES = "nvmlDeviceGetUtilizationRates"
    DEVICE_GET_VBIOS_VERSION = "nvmlDeviceGetVbiosVersion"
    DEVICE_GET_VIOLATION_STATUS = "nvmlDeviceGetViolationStatus"
    GPM_MIG_SAMPLE_GET = "nvmlGpmMigSampleGet"
    GPM_QUERY_DEVICE_SUPPORT = "nvmlGpmQueryDeviceSupport"
    GPM_SAMPLE_GET = "nvmlGpmSampleGet"


def codes(nvml: Any, names: tuple[str, ...]) -> frozenset[int]:
    return frozenset(int(getattr(nvml, n)) for n in names if hasattr(nvml, n))


def u32(value: Any) -> int | None:
    """A uint reading, or None for NVML's all-ones "not available"."""
    if value is None:
        return None
    v = int(value)
    return None if v < 0 or v >= U32_NA else v


def u64(value: Any) -> int | None:
    """A u64 reading, or None for NVML's 2^64-1 / >= 2^63 sentinels."""
    if value is None:
        return None
    v = int(value)
    return None if v < 0 or v >= U64_LIMIT else v


def text(value: Any) -> str:
    """pynvml returns str from most getters but bytes from struct char arrays."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip("\0 ").strip()
    return str(value).strip()


class Caller(Guard):
    """Guarded NVML getters for one device handle; remembers what the device lacks."""

    def __init__(self, nvml: Any, handle: Any, gpu: int) -> None:
        skip, perm = codes(nvml, _SKIP_CODES), codes(nvml, (_PERMISSION_CODE,))
        lost, dead = codes(nvml, _LOST_CODES), codes(nvml, _DEAD_CODES)

        def classify(code: int | None) -> Verdict:
            if code in skip:
                return Verdict.SKIP
            if code in perm:
                return Verdict.PERMISSION
            if code in lost:
                return Verdict.LOST
            return Verdict.DEAD if code in dead else Verdict.ERROR

        super().__init__("nvml", "NVML", classify, gpu=gpu)
        self.nvml = nvml
        self.handle = handle
        self.gpu = gpu
        self._skip = skip
        self._absent = codes(nvml, _ABSENT_CODES)

    def get(self, errors: Counter[ErrorReason], fn: Nvml, *args: Any, **kwargs: Any) -> Any:
        """``nvml.<fn>(handle, *args)`` or None; raises DeviceLost / BackendFailed."""
        return self._call(errors, fn, args, kwargs, absent=False)

    def read(self, errors: Counter[ErrorReason], getter: str) -> Any:
        """``get`` of a plain scalar's getter, named by its row (nvidia.scalars)."""
        return self._call(errors, getter, (), {}, absent=False)

    def get_with(self, errors: Counter[ErrorReason], fn: Nvml, func: Any, *args: Any) -> Any:
        """As ``get``, calling ``func(handle, *args)`` in place of ``nvml.<fn>`` (a safer
        wrapper of that NVML function); remembered and classified under ``fn``."""
        wrapped = func if getattr(self.nvml, fn, None) is not None else None
        return self._call(errors, fn, args, {}, absent=False, func=wrapped)

    def probe(self, errors: Counter[ErrorReason], fn: Nvml, *args: Any) -> Any:
        """As ``get``, but INVALID_ARGUMENT / NOT_FOUND mean "no such thing" (remembered)."""
        return self._call(errors, fn, args, {}, absent=True)

    def _call(self, errors: Counter[ErrorReason], fn: str, args: tuple[Any, ...],
              kwargs: dict[str, Any], absent: bool, func: Any = None) -> Any:
        key = (fn, args + tuple(sorted(kwargs.items()))) if kwargs else (fn, args)
        func = self.resolve(key, func if func is not None else getattr(self.nvml, fn, None))
        if func is None:
            return None
        try:
            return func(self.handle, *args, **kwargs)
        except self.nvml.NVMLError as e:
            if absent and getattr(e, "value", None) in self._absent:
                self.unsupported.add(key)
                return None
            self.settle(errors, key, getattr(e, "value", None), e)
            return None

    def is_skip(self, code: int) -> bool:
        """A per-value return code (field values, GPM metrics) that means "not supported"."""
        return code in self._skip

    def is_absent(self, code: int) -> bool:
        """A per-value return code that says this driver has no such field or scope (a field
        id newer than the driver answers INVALID_ARGUMENT): it never will, so stop asking."""
        return code in self._absent

    def failed(self, errors: Counter[ErrorReason], e: Exception, fn: Nvml, *args: Any) -> None:
        """Sort one NVMLError of ``fn(handle, *args)`` made outside ``get`` (see the module
        docstring): None, or raises."""
        self.settle(errors, (fn, args), getattr(e, "value", None), e)

    def absent(self, fn: Nvml, *args: Any) -> bool:
        """Whether ``fn(handle, *args)`` is known not to exist here (never asked again)."""
        return (fn, args) in self.unsupported
