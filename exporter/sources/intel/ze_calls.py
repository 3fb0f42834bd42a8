"""ctypes declarations of the Level Zero Sysman surface the level_zero backend uses, and
the one guarded call: where ``ze_result_t`` codes become values, skips or failures.

Declarations written from the public spec headers, not copied:
- ``zes_api.h`` / ``ze_api.h`` v1.4-r1.4.8 (oneapi-src/level-zero loader 1.8.12, Debian
  12 package libze-dev) for every struct, enum and function below except the three
  sysman-only entry points;
- ``zesInit``, ``zesDriverGet``, ``zesDeviceGet`` from ``include/zes_api.h``
  v1.15-r1.15.31 (oneapi-src/level-zero @ 0194bca654ee0a54ca39fa3867f71f2a94300d44),
  added in spec 1.5; the later enum values used here (engine group MEDIA_CODEC_SINGLE,
  frequency domain MEDIA) come from the same header. Structs have not changed layout
  between the two (the spec extends through ``pNext`` chains, never in place).
tests/fakes/ze_stub checks every layout against the C compiler: sizeof and offsetof of
each field, from the stub's own declarations and, where the real header is installed,
from ``<level_zero/zes_api.h>``.

``Caller.call`` classifies each ``ze_result_t`` (see its docstring) for the shared
guarded call (exporter.sources.calls), which acts on it as it does for NVML and amdsmi:
a function the loaded library does not export or answers ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
for is remembered per handle and never asked again.
"""

from __future__ import annotations

import ctypes
import sys
from collections import Counter
from ctypes import POINTER, c_char, c_double, c_int32, c_int64, c_uint8, c_uint32, c_uint64
from ctypes import c_void_p as Handle
from typing import Any

from exporter.core.labels import ErrorReason
from exporter.sources.calls import DeviceLost as DeviceLost  # what the readers catch
from exporter.sources.calls import Guard, Verdict

# The loader, found at run time through the dynamic linker's search (LD_LIBRARY_PATH,
# ld.so.cache). On Windows the same loader is ``ze_loader.dll``.
LIBRARY = "ze_loader.dll" if sys.platform == "win32" else "libze_loader.so.1"

# ze_result_t (ze_api.h)
SUCCESS = 0
ERROR_DEVICE_LOST = 0x70000001
ERROR_INSUFFICIENT_PERMISSIONS = 0x70010000
ERROR_NOT_AVAILABLE = 0x70010001
ERROR_UNINITIALIZED = 0x78000001
ERROR_UNSUPPORTED_FEATURE = 0x78000003
RESULT_NAMES = {
    0x70000001: "ZE_RESULT_ERROR_DEVICE_LOST",
    0x70000002: "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY",
    0x70000006: "ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET",
    0x70010000: "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
    0x70010001: "ZE_RESULT_ERROR_NOT_AVAILABLE",
    0x70020000: "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE",
    0x78000001: "ZE_RESULT_ERROR_UNINITIALIZED",
    0x78000003: "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
    0x78000004: "ZE_RESULT_ERROR_INVALID_ARGUMENT",
    0x7FFFFFFE: "ZE_RESULT_ERROR_UNKNOWN",
}

# zes_structure_type_t
STYPE_DEVICE_PROPERTIES = 0x1
STYPE_PCI_PROPERTIES = 0x2
STYPE_ENGINE_PROPERTIES = 0x5
STYPE_FREQ_PROPERTIES = 0x9
STYPE_MEM_PROPERTIES = 0xB
STYPE_POWER_PROPERTIES = 0xD
STYPE_RAS_PROPERTIES = 0xF
STYPE_TEMP_PROPERTIES = 0x14
STYPE_PROCESS_STATE = 0x16
STYPE_FREQ_STATE = 0x1B
STYPE_MEM_STATE = 0x1E
STYPE_RAS_STATE = 0x22
ZE_STYPE_DEVICE_PROPERTIES = 0x3  # ze_structure_type_t, for the embedded core properties

# zes_engine_group_t
ENGINE_GROUP_ALL = 0
ENGINE_GROUP_COMPUTE_ALL = 1
ENGINE_GROUP_MEDIA_ALL = 2
ENGINE_GROUP_COPY_ALL = 3
ENGINE_GROUP_COMPUTE_SINGLE = 4
ENGINE_GROUP_RENDER_SINGLE = 5
ENGINE_GROUP_MEDIA_DECODE_SINGLE = 6
ENGINE_GROUP_MEDIA_ENCODE_SINGLE = 7
ENGINE_GROUP_COPY_SINGLE = 8
ENGINE_GROUP_MEDIA_ENHANCEMENT_SINGLE = 9
ENGINE_GROUP_RENDER_ALL = 12
ENGINE_GROUP_MEDIA_CODEC_SINGLE = 14  # spec 1.7+
MEM_LOC_DEVICE = 1  # zes_mem_loc_t (SYSTEM = 0)
TEMP_SENSORS_GPU = 1  # zes_temp_sensors_t (GLOBAL = 0, MEMORY = 2, *_MIN = 3..5)
TEMP_SENSORS_MEMORY = 2
FREQ_DOMAIN_GPU = 0  # zes_freq_domain_t
FREQ_DOMAIN_MEMORY = 1
FREQ_DOMAIN_MEDIA = 2  # spec 1.7+
RAS_ERROR_TYPE_CORRECTABLE = 0  # zes_ras_error_type_t (UNCORRECTABLE = 1)
# zes_freq_throttle_reason_flag_t bits
THROTTLE_AVE_PWR_CAP = 1 << 0
THROTTLE_BURST_PWR_CAP = 1 << 1
THROTTLE_CURRENT_LIMIT = 1 << 2
THROTTLE_THERMAL_LIMIT = 1 << 3
THROTTLE_PSU_ALERT = 1 << 4
# zes_ras_error_cat_t, index into zes_ras_state_t.category
RAS_CATEGORIES = ("reset", "programming", "driver", "compute", "non_compute", "cache", "display")

STRING_PROPERTY_SIZE = 64  # ZES_STRING_PROPERTY_SIZE
MAX_DEVICE_NAME = 256  # ZE_MAX_DEVICE_NAME
MAX_DEVICE_UUID_SIZE = 16  # ZE_MAX_DEVICE_UUID_SIZE
ZeBool = c_uint8  # ze_bool_t
Ptr = ctypes.c_void_p  # pNext: the extension chain, always null here
Enum = c_uint32  # every spec enum is 32-bit (``*_FORCE_UINT32 = 0x7fffffff``)


class _Struct(ctypes.Structure):
    pass


class ZeDeviceProperties(_Struct):
    _fields_ = [
        ("stype", Enum), ("pNext", Ptr), ("type", Enum),
        ("vendorId", c_uint32), ("deviceId", c_uint32), ("flags", c_uint32),
        ("subdeviceId", c_uint32), ("coreClockRate", c_uint32), ("maxMemAllocSize", c_uint64),
        ("maxHardwareContexts", c_uint32), ("maxCommandQueuePriority", c_uint32),
        ("numThreadsPerEU", c_uint32), ("physicalEUSimdWidth", c_uint32),
        ("numEUsPerSubslice", c_uint32), ("numSubslicesPerSlice", c_uint32),
        ("numSlices", c_uint32), ("timerResolution", c_uint64),
        ("timestampValidBits", c_uint32), ("kernelTimestampValidBits", c_uint32),
        ("uuid", c_uint8 * MAX_DEVICE_UUID_SIZE), ("name", c_char * MAX_DEVICE_NAME),
    ]


class ZesDeviceProperties(_Struct):
    _fields_ = [
        ("stype", Enum), ("pNext", Ptr), ("core", ZeDeviceProperties),
        ("numSubdevices", c_uint32),
        ("serialNumber", c_char * STRING_PROPERTY_SIZE),
        ("boardNumber", c_char * STRING_PROPERTY_SIZE),
        ("brandName", c_char * STRING_PROPERTY_SIZE),
        ("modelName", c_char * STRING_PROPERTY_SIZE),
        ("vendorName", c_char * STRING_PROPERTY_SIZE),
        ("driverVersion", c_char * STRING_PROPERTY_SIZE),
    ]


class ZesPciAddress(_Struct):
    _fields_ = [("domain", c_uint32), ("bus", c_uint32), ("device", c_uint32),
                ("function", c_uint32)]


class ZesPciSpeed(_Struct):
    _fields_ = [("gen", c_int32), ("width", c_int32), ("maxBandwidth", c_int64)]


class ZesPciProperties(_Struct):
    _fields_ = [
        ("stype", Enum), ("pNext", Ptr), ("address", ZesPciAddress),
        ("maxSpeed", ZesPciSpeed), ("haveBandwidthCounters", ZeBool),
        ("havePacketCounters", ZeBool), ("haveReplayCounters", ZeBool),
    ]


class ZesEngineProperties(_Struct):
    _fields_ = [("stype", Enum), ("pNext", Ptr), ("type", Enum),
                ("onSubdevice", ZeBool), ("subdeviceId", c_uint32)]


class ZesEngineStats(_Struct):
    _fields_ = [("activeTime", c_uint64), ("timestamp", c_uint64)]  # both µs


class ZesMemProperties(_Struct):
    _fields_ = [
        ("stype", Enum), ("pNext", Ptr), ("type", Enum), ("onSubdevice", ZeBool),
        ("subdeviceId", c_uint32), ("location", Enum), ("physicalSize", c_uint64),
        ("busWidth", c_int32), ("numChannels", c_int32),
    ]


class ZesMemState(_Struct):
    _fields_ = [("stype", Enum), ("pNext", Ptr), ("health", Enum),
                ("free", c_uint64), ("size", c_uint64)]


class ZesMemBandwidth(_Struct):
    _fields_ = [("readCounter", c_uint64), ("writeCounter", c_uint64),  # bytes
                ("maxBandwidth", c_uint64), ("timestamp", c_uint64)]  # B/s, µs


class ZesPowerProperties(_Struct):
    _fields_ = [
        ("stype", Enum), ("pNext", Ptr), ("onSubdevice", ZeBool),
        ("subdeviceId", c_uint32), ("canControl", ZeBool),
        ("isEnergyThresholdSupported", ZeBool), ("defaultLimit", c_int32),
        ("minLimit", c_int32), ("maxLimit", c_int32),
    ]


class ZesPowerEnergyCounter(_Struct):
    _fields_ = [("energy", c_uint64), ("timestamp", c_uint64)]  # µJ, µs


class ZesTempProperties(_Struct):
    _fields_ = [
        ("stype", Enum), ("pNext", Ptr), ("type", Enum), ("onSubdevice", ZeBool),
        ("subdeviceId", c_uint32), ("maxTemperature", c_double),
        ("isCriticalTempSupported", ZeBool), ("isThreshold1Supported", ZeBool),
        ("isThreshold2Supported", ZeBool),
    ]


class ZesFreqProperties(_Struct):
    _fields_ = [
        ("stype", Enum), ("pNext", Ptr), ("type", Enum), ("onSubdevice", ZeBool),
        ("subdeviceId", c_uint32), ("canControl", ZeBool),
        ("isThrottleEventSupported", ZeBool), ("min", c_double), ("max", c_double),
    ]


class ZesFreqState(_Struct):
    _fields_ = [
        ("stype", Enum), ("pNext", Ptr), ("currentVoltage", c_double),
        ("request", c_double), ("tdp", c_double), ("efficient", c_double),
        ("actual", c_double), ("throttleReasons", c_uint32),  # MHz; negative = unknown
    ]


class ZesRasProperties(_Struct):
    _fields_ = [("stype", Enum), ("pNext", Ptr), ("type", Enum),
                ("onSubdevice", ZeBool), ("subdeviceId", c_uint32)]


class ZesRasState(_Struct):
    _fields_ = [("stype", Enum), ("pNext", Ptr),
                ("category", c_uint64 * len(RAS_CATEGORIES))]


class ZesProcessState(_Struct):
    _fields_ = [("stype", Enum), ("pNext", Ptr), ("processId", c_uint32),
                ("memSize", c_uint64), ("sharedSize", c_uint64), ("engines", c_uint32)]


STRUCTS: dict[str, type[ctypes.Structure]] = {
    "ze_device_properties_t": ZeDeviceProperties,
    "zes_device_properties_t": ZesDeviceProperties,
    "zes_pci_address_t": ZesPciAddress,
    "zes_pci_speed_t": ZesPciSpeed,
    "zes_pci_properties_t": ZesPciProperties,
    "zes_engine_properties_t": ZesEngineProperties,
    "zes_engine_stats_t": ZesEngineStats,
    "zes_mem_properties_t": ZesMemProperties,
    "zes_mem_state_t": ZesMemState,
    "zes_mem_bandwidth_t": ZesMemBandwidth,
    "zes_power_properties_t": ZesPowerProperties,
    "zes_power_energy_counter_t": ZesPowerEnergyCounter,
    "zes_temp_properties_t": ZesTempProperties,
    "zes_freq_properties_t": ZesFreqProperties,
    "zes_freq_state_t": ZesFreqState,
    "zes_ras_properties_t": ZesRasProperties,
    "zes_ras_state_t": ZesRasState,
    "zes_process_state_t": ZesProcessState,
}

_COUNT = POINTER(c_uint32)
# function -> argument types; every one returns ze_result_t.
FUNCTIONS: dict[str, list[Any]] = {
    "zesInit": [c_uint32],
    "zesDriverGet": [_COUNT, POINTER(Handle)],
    "zesDeviceGet": [Handle, _COUNT, POINTER(Handle)],
    "zesDeviceGetProperties": [Handle, POINTER(ZesDeviceProperties)],
    "zesDevicePciGetProperties": [Handle, POINTER(ZesPciProperties)],
    "zesDeviceEnumEngineGroups": [Handle, _COUNT, POINTER(Handle)],
    "zesEngineGetProperties": [Handle, POINTER(ZesEngineProperties)],
    "zesEngineGetActivity": [Handle, POINTER(ZesEngineStats)],
    "zesDeviceEnumMemoryModules": [Handle, _COUNT, POINTER(Handle)],
    "zesMemoryGetProperties": [Handle, POINTER(ZesMemProperties)],
    "zesMemoryGetState": [Handle, POINTER(ZesMemState)],
    "zesMemoryGetBandwidth": [Handle, POINTER(ZesMemBandwidth)],
    "zesDeviceEnumPowerDomains": [Handle, _COUNT, POINTER(Handle)],
    "zesPowerGetProperties": [Handle, POINTER(ZesPowerProperties)],
    "zesPowerGetEnergyCounter": [Handle, POINTER(ZesPowerEnergyCounter)],
    "zesDeviceEnumTemperatureSensors": [Handle, _COUNT, POINTER(Handle)],
    "zesTemperatureGetProperties": [Handle, POINTER(ZesTempProperties)],
    "zesTemperatureGetState": [Handle, POINTER(c_double)],
    "zesDeviceEnumFrequencyDomains": [Handle, _COUNT, POINTER(Handle)],
    "zesFrequencyGetProperties": [Handle, POINTER(ZesFreqProperties)],
    "zesFrequencyGetState": [Handle, POINTER(ZesFreqState)],
    "zesDeviceEnumRasErrorSets": [Handle, _COUNT, POINTER(Handle)],
    "zesRasGetProperties": [Handle, POINTER(ZesRasProperties)],
    "zesRasGetState": [Handle, ZeBool, POINTER(ZesRasState)],
    "zesDeviceProcessesGetState": [Handle, _COUNT, POINTER(ZesProcessState)],
}


def result_name(code: int) -> str:
    return RESULT_NAMES.get(code, f"ze_result_t 0x{code:08x}")


def load(path: str | None = None) -> ctypes.CDLL:
    """The loader library, with the argument/return types of every function it exports.

    ``path`` is ``LIBRARY`` for users (found by the dynamic linker); tests pass the path
    of their compiled stub. Missing library: OSError, for the caller to report.
    """
    lib = ctypes.CDLL(path or LIBRARY)
    for name, argtypes in FUNCTIONS.items():
        func = getattr(lib, name, None)
        if func is not None:
            func.argtypes = argtypes
            func.restype = c_uint32
    return lib


def classify(code: int | None) -> Verdict:
    if code == ERROR_UNSUPPORTED_FEATURE:
        return Verdict.SKIP
    if code == ERROR_INSUFFICIENT_PERMISSIONS:
        return Verdict.PERMISSION
    if code == ERROR_DEVICE_LOST:
        return Verdict.LOST
    return Verdict.DEAD if code == ERROR_UNINITIALIZED else Verdict.ERROR


class Caller(Guard):
    """Guarded Sysman calls on one loaded library; remembers what each handle lacks.

    ``call`` returns True on success. Otherwise:
    - the library does not export the function, or answers UNSUPPORTED_FEATURE: False,
      and that (function, handle) is never asked again;
    - INSUFFICIENT_PERMISSIONS: False, counted once as ``permission``, never asked again;
    - DEVICE_LOST: raises DeviceLost;
    - UNINITIALIZED (the driver went away under sysman): raises BackendFailed, so the
      collector closes the backend and opens it again with back-off;
    - anything else: False, counted as ``level_zero_error``.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        super().__init__("level_zero", "Level Zero", classify)
        self.lib = lib

    def has(self, fn: str) -> bool:
        return getattr(self.lib, fn, None) is not None

    def call(self, errors: Counter[ErrorReason], fn: str, handle: Handle | None,
             *args: Any) -> bool:
        key = (fn, handle.value if handle is not None else None)
        func = self.resolve(key, getattr(self.lib, fn, None))
        if func is None:
            return False
        code = int(func(handle, *args) if handle is not None else func(*args))
        if code == SUCCESS:
            return True
        self.settle(errors, key, code, result_name(code))
        return False

    def handles(self, errors: Counter[ErrorReason], fn: str, parent: Handle) -> list[Handle]:
        """The component handles an ``zesDeviceEnum*`` function lists (count, then fill)."""
        count = c_uint32(0)
        if not self.call(errors, fn, parent, ctypes.byref(count), None) or not count.value:
            return []
        array = (Handle * count.value)()
        if not self.call(errors, fn, parent, ctypes.byref(count), array):
            return []
        return [Handle(array[i]) for i in range(min(count.value, len(array)))]


def text(raw: bytes) -> str:
    """A NUL-terminated char array of a property struct as a clean string."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
