"""One guarded NVML call: the single place where NVML errors become values, skips or failures.

Every telemetry getter of the NVIDIA backend goes through ``Caller.get``. It turns
the ``pynvml.NVMLError`` subclasses into what the backend needs:

- not supported / function not found / no permission: ``None`` ("not exposed"),
  and that (function, arguments) pair is never asked again on this device, so a card
  that lacks a field costs nothing per cycle and logs nothing per cycle;
- GPU lost: ``GpuLost``, so the device stops being read this cycle and reports up=0;
- the library itself gone bad (uninitialised, driver unloaded, RM mismatch):
  ``BackendFailed``, so the collector closes NVML and re-initialises it with back-off;
- anything else: ``None`` and one count in the cycle's errors.

``Caller.probe`` is ``get`` for calls that ask whether something exists (an NVLink
index past the last link answers INVALID_ARGUMENT): those answers are "absent", not
errors. It also filters the sentinels NVML uses for "not available" (all-ones integers).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import structlog

from exporter.backends.base import BackendFailed

log = structlog.get_logger(__name__)

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


class GpuLost(Exception):
    """This GPU fell off the bus (or needs a reset): stop reading it this cycle."""


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


class Caller:
    """Guarded NVML getters for one device handle; remembers what the device lacks."""

    def __init__(self, nvml: Any, handle: Any, gpu: int) -> None:
        self.nvml = nvml
        self.handle = handle
        self.gpu = gpu
        self.unsupported: set[tuple[str, tuple[Any, ...]]] = set()
        self._skip = codes(nvml, _SKIP_CODES)
        self._perm = codes(nvml, (_PERMISSION_CODE,))
        self._lost = codes(nvml, _LOST_CODES)
        self._dead = codes(nvml, _DEAD_CODES)
        self._absent = codes(nvml, _ABSENT_CODES)

    def get(self, errors: Counter[str], fn: str, *args: Any, **kwargs: Any) -> Any:
        """``nvml.<fn>(handle, *args)`` or None; raises GpuLost / BackendFailed."""
        return self._call(errors, fn, args, kwargs, absent=False)

    def probe(self, errors: Counter[str], fn: str, *args: Any) -> Any:
        """As ``get``, but INVALID_ARGUMENT / NOT_FOUND mean "no such thing" (remembered)."""
        return self._call(errors, fn, args, {}, absent=True)

    def _call(self, errors: Counter[str], fn: str, args: tuple[Any, ...],
              kwargs: dict[str, Any], absent: bool) -> Any:
        key = (fn, args + tuple(sorted(kwargs.items()))) if kwargs else (fn, args)
        if key in self.unsupported:
            return None
        func = getattr(self.nvml, fn, None)
        if func is None:  # an older nvidia-ml-py without this binding
            self.unsupported.add(key)
            return None
        try:
            return func(self.handle, *args, **kwargs)
        except self.nvml.NVMLError as e:
            if absent and getattr(e, "value", None) in self._absent:
                self.unsupported.add(key)
                return None
            return self.failed(errors, key, e)

    def is_skip(self, code: int) -> bool:
        """A per-value return code (field values, GPM metrics) that means "not supported"."""
        return code in self._skip

    def is_absent(self, code: int) -> bool:
        """A per-value return code that says this driver has no such field or scope (a field
        id newer than the driver answers INVALID_ARGUMENT): it never will, so stop asking."""
        return code in self._absent

    def check(self, code: int) -> None:
        """Raise for a per-value return code that says the GPU or NVML is gone."""
        if code in self._lost:
            raise GpuLost(f"NVML return code {code}")
        if code in self._dead:
            raise BackendFailed(f"NVML went bad: return code {code}")

    def failed(self, errors: Counter[str], key: tuple[str, Any], e: Exception) -> None:
        """Sort one NVMLError into skip / lost / dead / counted (see the module docstring)."""
        code = getattr(e, "value", None)
        if code in self._skip:
            self.unsupported.add(key)
            return None
        if code in self._perm:
            # Permission does not change while we run: count it once, then skip.
            self.unsupported.add(key)
            errors["permission"] += 1
            log.info("nvml_permission_denied", gpu=self.gpu, call=key[0])
            return None
        if code in self._lost:
            raise GpuLost(str(e))
        if code in self._dead:
            raise BackendFailed(f"NVML went bad during {key[0]}: {e}")
        errors["nvml_error"] += 1
        return None
