"""NVML field values: many readings in one ``nvmlDeviceGetFieldValues`` call.

Some readings exist only as field values (HBM temperature, instant power, NVLink
throughput counters per link); they are asked for together, one call per tier.
A request is ``(field id, scope id)``: the scope is the NVLink link for per-link
fields (nvml.h, "NVLink throughput counters field values": "Link ID needs to be
specified in the scopeId field"), 0 otherwise.

Each value carries its own return code: a field the device does not support is
dropped from later calls (and costs nothing after the first cycle), a lost GPU
raises ``GpuLost``, anything else is counted. The value's union member is picked by
its ``valueType`` (NVML_VALUE_TYPE_*), never assumed.

Field ids come from the installed nvidia-ml-py, looked up by name; a name that this
nvidia-ml-py lacks is simply not asked for. Ids NVIDIA renumbered between releases
(the clock-event duration fields: 251-253 in some nvml.h, 269-271 in nvidia-ml-py
13.615) are not used at all: a newer binding against an older driver would read
another field under the same number.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

from exporter.backends.nvidia.calls import Caller, Nvml

FieldKey = tuple[int, int]  # (field id, scope id)

# NVML_VALUE_TYPE_* -> the c_nvmlValue_t union member holding it (nvml.h nvmlValue_t).
_MEMBERS = {
    "NVML_VALUE_TYPE_DOUBLE": "dVal",
    "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
    "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
}


class FieldValue(NamedTuple):
    value: float | int
    timestamp_us: int  # when NVML took the reading (CPU clock, microseconds)


def field_id(nvml: Any, name: str) -> int | None:
    """``NVML_FI_DEV_*`` by name from the nvidia-ml-py in use, or None if it lacks it."""
    value = getattr(nvml, name, None)
    return value if isinstance(value, int) else None


class FieldReader:
    """Field values of one device handle; remembers which (field, scope) it lacks."""

    def __init__(self, call: Caller) -> None:
        self.call = call
        self.nvml = call.nvml
        self.dropped: set[FieldKey] = set()
        self._members = {getattr(self.nvml, k): m for k, m in _MEMBERS.items()
                         if hasattr(self.nvml, k)}
        self._success = getattr(self.nvml, "NVML_SUCCESS", 0)

    def read(self, errors: Counter[str], wanted: Iterable[FieldKey]) -> dict[FieldKey, FieldValue]:
        """One call for every wanted (field, scope) not known to be unsupported."""
        keys = tuple(k for k in wanted if k not in self.dropped)
        if not keys:
            return {}
        values = self.call.get(errors, Nvml.DEVICE_GET_FIELD_VALUES, keys)
        if values is None:  # the call itself is unsupported (or failed and was counted)
            return {}
        out: dict[FieldKey, FieldValue] = {}
        for key, fv in zip(keys, values, strict=False):
            code = int(fv.nvmlReturn)
            if code != self._success:
                if self.call.is_skip(code) or self.call.is_absent(code):
                    self.dropped.add(key)
                else:
                    self.call.check(code)  # GPU lost / NVML gone: raises
                    errors["nvml_error"] += 1
                continue
            member = self._members.get(int(fv.valueType))
            if member is None:
                errors["parse"] += 1
                continue
            out[key] = FieldValue(getattr(fv.value, member), int(fv.timestamp))
        return out
