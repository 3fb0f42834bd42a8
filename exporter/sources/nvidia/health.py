"""Health counters of one NVIDIA GPU that change slowly: read on the slow or rare tier.

- Clock-event durations -> ``clock_event_seconds[reason]``: ``nvmlDeviceGetViolationStatus``
  per perf policy (nvml.h nvmlViolationTime_t: ``violationTime`` in nanoseconds since
  the driver loaded). POWER is the software power cap (``sw_power_cap``), THERMAL the
  driver's thermal slowdown (``sw_thermal``), SYNC_BOOST ``sync_boost``: the reasons
  nvidia-smi -q lists under "Clocks Event Reasons Counters" that this API carries. The
  hardware slowdown and power-brake durations exist only as field ids that NVIDIA
  renumbered between releases (see fields.py), so they are not exported.
- ECC by location -> ``ras_errors[(block, severity)]`` (rare tier):
  ``nvmlDeviceGetMemoryErrorCounter`` with the VOLATILE counter (since driver load, like
  ``gpu_ecc_errors_total``) for every
  nvmlMemoryLocation_t; a location this GPU does not split out answers NOT_SUPPORTED once
  and is not asked again (an H100 has ``dram`` and ``sram``; Volta also L1/L2/register
  file/texture). The AGGREGATE counters (lifetime, kept in the InfoROM) are not exported:
  docs/metrics.md has no family for a lifetime count, and over the exporter's life they move
  exactly like the volatile ones.
- Retired pages (before Ampere; Ampere and later remap rows instead and answer N/A) ->
  ``retired_pages[cause]``: field values NVML_FI_DEV_RETIRED_SBE / _DBE (page counts),
  asked for in the slow field batch, with NVML_FI_DEV_RETIRED_PENDING (1 while a retirement
  waits for the next reset) -> ``retired_pages_pending``.
- GPU recovery action -> ``recovery_action``: field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
  (230 in nvml.h; drivers from R570 answer it, older ones NOT_SUPPORTED, which drops it
  from later batches), the driver's own word on what the GPU needs (nvml.h
  nvmlDeviceGpuRecoveryAction_t), also served as ``recovery_action_info``. A value outside
  that enum is counted as ``parse``.
- NVSwitch fabric -> ``fabric_state``, ``fabric_status``, ``fabric_health_mask``,
  ``fabric_health_summary``: ``nvmlDeviceGetGpuFabricInfoV`` with the newest structure
  both this nvidia-ml-py and the driver know (nvml.h ``nvmlGpuFabricInfo_v3_t``, which adds
  ``healthSummary`` to v2's ``healthMask``; a driver that knows only v2 answers
  ARGUMENT_VERSION_MISMATCH to v3, and v2 is used from then on). A GPU outside any fabric
  (a PCIe card, a board without NVSwitch) answers NOT_SUPPORTED or the state
  NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: nothing is served and it is not asked again. The
  status is the registration's result, meaningful once the state is COMPLETED.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from ctypes import byref
from typing import Any, TypeVar

from exporter.core.labels import (
    ErrorReason,
    RecoveryAction,
    RetireCause,
    Severity,
    ThrottleReason,
)
from exporter.core.model import DeviceValues
from exporter.core.units import scaled
from exporter.sources.nvidia.calls import Caller, Nvml, u64
from exporter.sources.nvidia.fields import FieldKey, FieldValue, field_id

K = TypeVar("K")
VIOLATIONS = {ThrottleReason.SW_POWER_CAP: "NVML_PERF_POLICY_POWER",
              ThrottleReason.SW_THERMAL: "NVML_PERF_POLICY_THERMAL",
              ThrottleReason.SYNC_BOOST: "NVML_PERF_POLICY_SYNC_BOOST"}
# nvmlMemoryLocation_t -> block label; DEVICE_MEMORY and DRAM are the same value (2).
LOCATIONS = {"NVML_MEMORY_LOCATION_L1_CACHE": "l1_cache",
             "NVML_MEMORY_LOCATION_L2_CACHE": "l2_cache",
             "NVML_MEMORY_LOCATION_DRAM": "dram",
             "NVML_MEMORY_LOCATION_REGISTER_FILE": "register_file",
             "NVML_MEMORY_LOCATION_TEXTURE_MEMORY": "texture_memory",
             "NVML_MEMORY_LOCATION_TEXTURE_SHM": "texture_shm",
             "NVML_MEMORY_LOCATION_CBU": "cbu",
             "NVML_MEMORY_LOCATION_SRAM": "sram"}
SEVERITIES = {Severity.CORRECTED: "NVML_MEMORY_ERROR_TYPE_CORRECTED",
              Severity.UNCORRECTED: "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"}
RETIRED_FIELDS = {RetireCause.SINGLE_BIT: "NVML_FI_DEV_RETIRED_SBE",
                  RetireCause.DOUBLE_BIT: "NVML_FI_DEV_RETIRED_DBE"}
PENDING_FIELD = "NVML_FI_DEV_RETIRED_PENDING"
RECOVERY_FIELD = "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"
# nvml.h nvmlDeviceGpuRecoveryAction_t -> the name exporter.pipeline.health classifies.
RECOVERY_ACTIONS = {0: RecoveryAction.NONE, 1: RecoveryAction.GPU_RESET,
                    2: RecoveryAction.NODE_REBOOT, 3: RecoveryAction.DRAIN_P2P,
                    4: RecoveryAction.DRAIN_AND_RESET, 5: RecoveryAction.RECOVER_IMEX_DOMAIN,
                    6: RecoveryAction.BUS_RESET, 7: RecoveryAction.SYSTEM_REBOOT}
# nvmlDeviceGetGpuFabricInfoV's structures, newest first (nvml.h nvmlGpuFabricInfo_v3_t,
# nvmlGpuFabricInfo_v2_t; pynvml names them so), each one's version set by its constructor.
FABRIC_STRUCTS = ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")
# nvml.h nvmlGpuFabricState_t: NOT_SUPPORTED 0, NOT_STARTED 1, IN_PROGRESS 2, COMPLETED 3.
FABRIC_NOT_SUPPORTED, FABRIC_COMPLETED = 0, 3
FABRIC_STATES = frozenset({1, 2, 3})
# nvml.h NVML_GPU_FABRIC_HEALTH_SUMMARY_*: NOT_SUPPORTED 0, HEALTHY 1, UNHEALTHY 2,
# LIMITED_CAPACITY 3.
FABRIC_SUMMARIES = frozenset({1, 2, 3})
# Page retirement is what GPUs before Ampere do (nvml.h: row remapping replaced it).
RETIRES_PAGES = frozenset({"kepler", "maxwell", "pascal", "volta", "turing"})


def _constants(nvml: Any, names: Mapping[K, str]) -> dict[K, Any]:
    return {label: getattr(nvml, c) for label, c in names.items() if hasattr(nvml, c)}


class Health:
    """The slow health reads of one device handle."""

    def __init__(self, call: Caller, architecture: str) -> None:
        self.call = call
        nvml = call.nvml
        self.violations = _constants(nvml, VIOLATIONS)
        self.severities = _constants(nvml, SEVERITIES)
        self.volatile = getattr(nvml, "NVML_VOLATILE_ECC", None)
        locations: dict[int, str] = {}
        for const, label in LOCATIONS.items():
            if hasattr(nvml, const):
                locations.setdefault(getattr(nvml, const), label)
        self.locations = locations
        self.retired = {cause: fid for cause, name in RETIRED_FIELDS.items()
                        if (fid := field_id(nvml, name)) is not None
                        } if architecture in RETIRES_PAGES else {}
        self.pending = field_id(nvml, PENDING_FIELD) if architecture in RETIRES_PAGES else None
        self.recovery = field_id(nvml, RECOVERY_FIELD)
        self.fabric_structs = [name for name in FABRIC_STRUCTS if hasattr(nvml, name)]
        self.fabric_absent = False  # the GPU is in no fabric: not asked again
        self.events: dict[str, float] | None = None  # the last violation times read

    def fields(self) -> list[FieldKey]:
        """Requests for the slow-tier field batch."""
        extra = (fid for fid in (self.pending, self.recovery) if fid is not None)
        return [(fid, 0) for fid in (*self.retired.values(), *extra)]

    def read(self, errors: Counter[ErrorReason], values: dict[FieldKey, FieldValue],
             counters_due: bool = True) -> DeviceValues:
        """clock_event_seconds, retired_pages, retired_pages_pending, recovery_action (and
        its info), the fabric's state.
        The violation times are read when ``counters_due`` (every COUNTERS_EVERY-th slow
        cycle when a reader came since, exporter.sources.nvidia.device), else kept."""
        g = self.call.get
        if counters_due or self.events is None:
            events: dict[str, float] = {}
            for reason, policy in self.violations.items():
                v = g(errors, Nvml.DEVICE_GET_VIOLATION_STATUS, policy)
                seconds = None if v is None else scaled(u64(v.violationTime), 1e-9, "seconds")
                if seconds is not None:
                    events[reason] = seconds
            self.events = events
        events = self.events
        retired: dict[str, int] = {}
        for cause, fid in self.retired.items():
            pages = self._value(values, fid)
            if pages is not None:
                retired[cause] = pages
        pending = self._value(values, self.pending)
        action = self._value(values, self.recovery)
        recovery = None
        if action is not None:
            recovery = RECOVERY_ACTIONS.get(action)
            if recovery is None:
                errors[ErrorReason.PARSE] += 1
        return DeviceValues(clock_event_seconds=events, retired_pages=retired,
                            retired_pages_pending=None if pending is None else pending != 0,
                            recovery_action=recovery,
                            recovery_action_info={recovery: True} if recovery else {},
                            ).overlay(self.read_fabric(errors))

    def read_fabric(self, errors: Counter[ErrorReason]) -> DeviceValues:
        """The GPU's NVSwitch fabric registration and health, where it has a fabric."""
        if self.fabric_absent or not self.fabric_structs:
            return DeviceValues()
        info = self.call.get_with(errors, Nvml.DEVICE_GET_GPU_FABRIC_INFO_V, self._fabric)
        if info is None:
            return DeviceValues()
        state = int(info.state)
        if state not in FABRIC_STATES:
            if state == FABRIC_NOT_SUPPORTED:
                self.fabric_absent = True
            else:
                errors[ErrorReason.PARSE] += 1
            return DeviceValues()
        summary = getattr(info, "healthSummary", None)  # v3 only
        return DeviceValues(
            fabric_state=state,
            fabric_status=int(info.status) if state == FABRIC_COMPLETED else None,
            fabric_health_mask=u64(info.healthMask),
            fabric_health_summary=int(summary) if summary in FABRIC_SUMMARIES else None)

    def _fabric(self, handle: Any) -> Any:
        """nvmlDeviceGetGpuFabricInfoV with the newest structure the driver knows: one that
        answers ARGUMENT_VERSION_MISMATCH to a structure is never given it again."""
        nvml = self.call.nvml
        mismatch = getattr(nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", None)
        while True:
            info = getattr(nvml, self.fabric_structs[0])()
            try:
                nvml.nvmlDeviceGetGpuFabricInfoV(handle, byref(info))
                return info
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != mismatch or len(self.fabric_structs) == 1:
                    raise
                self.fabric_structs.pop(0)

    def read_ras(self, errors: Counter[ErrorReason]) -> dict[tuple[str, str], int]:
        """ECC by location (the rare tier: device.py RARE_EVERY)."""
        ras: dict[tuple[str, str], int] = {}
        if self.volatile is not None:
            for location, block in self.locations.items():
                for severity, kind in self.severities.items():
                    n = u64(self.call.get(errors, Nvml.DEVICE_GET_MEMORY_ERROR_COUNTER, kind,
                                          self.volatile, location))
                    if n is not None:
                        ras[(block, severity)] = n
        return ras

    @staticmethod
    def _value(values: dict[FieldKey, FieldValue], fid: int | None) -> int | None:
        fv = None if fid is None else values.get((fid, 0))
        return None if fv is None else u64(fv.value)
