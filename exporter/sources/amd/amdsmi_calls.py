"""amdsmi's error classifier over the shared guarded call (exporter.sources.calls).

Every getter of the amdsmi backend goes through ``Caller.get``. The Python package
(``amdsmi``, ROCm's ``py-interface/amdsmi_interface.py``) raises
``AmdSmiLibraryException`` whose ``get_error_code()`` is an ``amdsmi_status_t``
(values from the package's ``amdsmi_wrapper.py``, amdsmi 7.0.2 / ROCm 7.0.2):

- not supported / not implemented / no data / no permission: ``None`` ("not
  exposed"), and that (function, arguments) pair is never asked again on this device;
  permission is also counted once;
- device not found (the GPU vanished, or a partition went away in a mode switch):
  ``DeviceLost`` (also known here as ``GpuLost``), so the device reports up=0 this cycle;
- library broken (not initialised, init error, driver not loaded, a module or symbol
  that does not load): ``BackendFailed``, so the collector shuts amdsmi down and
  re-initialises it with back-off;
- anything else (busy, timeout, retry, I/O): ``None`` and one ``amdsmi_error`` count.

The package turns all-ones "not available" fields into the string ``"N/A"``;
``number`` maps that to None without counting it, and sends every real number
through exporter.core.units.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from exporter.core import units
from exporter.core.labels import ErrorReason
from exporter.sources.calls import DeviceLost, Guard, Verdict

# amdsmi_status_t (amdsmi_wrapper.py: AMDSMI_STATUS_*)
NOT_SUPPORTED, NOT_YET_IMPLEMENTED, NO_PERM, NO_DATA = 2, 3, 10, 40
FAIL_LOAD_MODULE, FAIL_LOAD_SYMBOL, INIT_ERROR = 4, 5, 18
NOT_FOUND, NOT_INIT, DRIVER_NOT_LOADED = 31, 32, 34
SKIP_CODES = frozenset({NOT_SUPPORTED, NOT_YET_IMPLEMENTED, NO_DATA})
LOST_CODES = frozenset({NOT_FOUND})
DEAD_CODES = frozenset({NOT_INIT, INIT_ERROR, DRIVER_NOT_LOADED, FAIL_LOAD_MODULE,
                        FAIL_LOAD_SYMBOL})
NA = "N/A"


GpuLost = DeviceLost  # the name the amdsmi readers use


def error_code(exc: BaseException) -> int | None:
    getter = getattr(exc, "get_error_code", None)
    code = getter() if callable(getter) else getattr(exc, "err_code", None)
    return code if isinstance(code, int) else None


def number(value: Any, unit: str, scale: float = 1, errors: Counter[ErrorReason] | None = None,
           ) -> float | None:
    """A value from an amdsmi dict in base units: "N/A" -> None (not exposed), garbage
    (a string, NaN, out of range for ``unit``) -> None and one ``parse`` count."""
    if value is None or value == NA:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        parsed = units.parse_number(str(value)) if isinstance(value, str) else None
    else:
        parsed = value
    result = None if parsed == units.U64_MAX else units.scaled(parsed, scale, unit)
    if result is None and errors is not None:
        errors[ErrorReason.PARSE] += 1
    return result


def text(value: Any) -> str:
    """A string field; "N/A" and non-strings are ""."""
    if not isinstance(value, str) or value == NA:
        return ""
    return "".join(ch for ch in value.strip() if ch.isprintable())[:256]


def classify(code: int | None) -> Verdict:
    if code in SKIP_CODES:
        return Verdict.SKIP
    if code == NO_PERM:
        return Verdict.PERMISSION
    if code in LOST_CODES:
        return Verdict.LOST
    return Verdict.DEAD if code in DEAD_CODES else Verdict.ERROR


class Caller(Guard):
    """Guarded amdsmi getters for one processor handle; remembers what it lacks."""

    def __init__(self, lib: Any, handle: Any, where: str) -> None:
        super().__init__("amdsmi", "amdsmi", classify, device=where)
        self.lib = lib
        self.handle = handle
        exc = getattr(lib, "AmdSmiLibraryException", None)
        self._exc: type[BaseException] = exc if isinstance(exc, type) and issubclass(
            exc, BaseException) else Exception

    def get(self, errors: Counter[ErrorReason], fn: str, *args: Any) -> Any:
        """``amdsmi.<fn>(handle, *args)`` or None; raises DeviceLost / BackendFailed."""
        key = (fn, args)
        func = self.resolve(key, getattr(self.lib, fn, None))
        if func is None:
            return None
        try:
            return func(self.handle, *args)
        except self._exc as e:
            self.settle(errors, key, error_code(e), e)
            return None
