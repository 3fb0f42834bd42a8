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

The call goes through ``field_values`` below, never through nvidia-ml-py's own
``nvmlDeviceGetFieldValues``: that one allocates exactly ``count`` entries, and the
driver reads the entry one past ``count`` when the batch ends in an NVLink throughput
field (and writes its timestamp when that entry holds an NVLink throughput id). Two
NVLinked H200s on driver 580.159.04 (18 links each) showed it: with exactly sized
arrays the bytes after the array belong to another heap object, and whenever they
read as field 138/139 the driver wrote 8 bytes into it, which crashed the daemon in
seconds. ``field_values`` gives the driver zeroed spare entries (field id 0) after the
requested ones, so whatever it reads or writes past ``count`` is memory we own and a
field id it ignores. The other NVML calls that take arrays (running processes, process
utilisation samples, GPM metrics) size their arrays from the library's own count and
carry no caller-filled ids: they have not shown this.

Field ids come from the installed nvidia-ml-py, looked up by name; a name that this
nvidia-ml-py lacks is simply not asked for. Ids NVIDIA renumbered between releases
(the clock-event duration fields: 251-253 in some nvml.h, 269-271 in nvidia-ml-py
13.615) are not used at all: a newer binding against an older driver would read
another field under the same number.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from exporter.core.labels import ErrorReason
from exporter.sources.nvidia.calls import Caller, Nvml

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


# Zeroed entries after the requested ones, owned by us (see the module docstring).
SPARE_ENTRIES = 2


def field_values(nvml: Any, handle: Any, keys: Sequence[FieldKey]) -> Any:
    """``nvmlDeviceGetFieldValues`` for ``keys`` over an array with ``SPARE_ENTRIES``
    zeroed entries after them; returns the requested entries. Raises ``NVMLError``."""
    values = (nvml.c_nvmlFieldValue_t * (len(keys) + SPARE_ENTRIES))()
    for entry, (fid, scope) in zip(values, keys, strict=False):
        entry.fieldId, entry.scopeId = fid, scope
    fn = nvml._nvmlGetFunctionPointer(Nvml.DEVICE_GET_FIELD_VALUES.value)
    nvml._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(keys)), ctypes.byref(values)))
    return values[:len(keys)]


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

    def read(self, errors: Counter[ErrorReason],
             wanted: Iterable[FieldKey]) -> dict[FieldKey, FieldValue]:
        """One call for every wanted (field, scope) not known to be unsupported."""
        keys = tuple(k for k in wanted if k not in self.dropped)
        if not keys:
            return {}
        values = self.call.get_with(errors, Nvml.DEVICE_GET_FIELD_VALUES,
                                    lambda handle, k: field_values(self.nvml, handle, k), keys)
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
                    errors[ErrorReason.NVML_ERROR] += 1
                continue
            member = self._members.get(int(fv.valueType))
            if member is None:
                errors[ErrorReason.PARSE] += 1
                continue
            out[key] = FieldValue(getattr(fv.value, member), int(fv.timestamp))
        return out
