"""The one guarded vendor-library call (exporter.sources.calls), through each library's
classifier: NVML, amdsmi and Level Zero sort their own codes, and a lost device, a dead
library, a permission refusal and an unknown error then behave the same for all three."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from exporter.sources.amd import amdsmi_calls
from exporter.sources.base import BackendFailed
from exporter.sources.calls import DeviceLost
from exporter.sources.intel import ze_calls
from exporter.sources.nvidia import calls as nvml_calls


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class AmdSmiLibraryException(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code

    def get_error_code(self) -> int:
        return self.code


# Codes from nvml.h, amdsmi_wrapper.py and ze_api.h: (skip, permission, lost, dead, other)
NVML = dict(NVML_ERROR_NOT_SUPPORTED=3, NVML_ERROR_NO_PERMISSION=4, NVML_ERROR_GPU_IS_LOST=15,
            NVML_ERROR_UNINITIALIZED=1, NVML_ERROR_UNKNOWN=999)
CODES = {
    "nvml": (3, 4, 15, 1, 999),
    "amdsmi": (2, 10, 31, 32, 8),
    "level_zero": (0x78000003, 0x70010000, 0x70000001, 0x78000001, 0x7FFFFFFE),
}


def _caller(library: str, code: int) -> Callable[[Counter[str]], Any]:
    """One call of ``fn`` on each library's Caller, the function failing with ``code``."""
    if library == "nvml":
        def fail_nvml(handle: Any) -> Any:
            raise NVMLError(code)
        nvml = SimpleNamespace(NVMLError=NVMLError, fn=fail_nvml, **NVML)
        c = nvml_calls.Caller(nvml, handle=object(), gpu=0)
        return lambda errors: c.get(errors, "fn")
    if library == "amdsmi":
        def fail_amdsmi(handle: Any) -> Any:
            raise AmdSmiLibraryException(code)
        lib = SimpleNamespace(AmdSmiLibraryException=AmdSmiLibraryException, fn=fail_amdsmi)
        a = amdsmi_calls.Caller(lib, handle=object(), where="0000:05:00.0")
        return lambda errors: a.get(errors, "fn")
    z = ze_calls.Caller(SimpleNamespace(fn=lambda handle: code))  # type: ignore[arg-type]
    return lambda errors: z.call(errors, "fn", ctypes.c_void_p(1))


@pytest.mark.parametrize("library", sorted(CODES))
def test_each_library_sorts_its_codes_into_the_same_outcomes(library: str) -> None:
    skip, permission, lost, dead, other = CODES[library]
    errors: Counter[str] = Counter()

    call = _caller(library, skip)
    assert not call(errors) and not call(errors) and errors == {}

    call = _caller(library, permission)
    call(errors), call(errors)  # refused once, then never asked again
    assert errors == {"permission": 1}

    call = _caller(library, other)
    call(errors), call(errors)  # an unknown error is asked again and counted each time
    assert errors == {"permission": 1, f"{library}_error": 2}

    with pytest.raises(DeviceLost):
        _caller(library, lost)(errors)
    with pytest.raises(BackendFailed, match="went bad during fn"):
        _caller(library, dead)(errors)


def test_one_device_lost_for_every_library() -> None:
    assert nvml_calls.GpuLost is amdsmi_calls.GpuLost is ze_calls.DeviceLost is DeviceLost
