"""The fake ``amdsmi`` speaks the real package's surface: names, dict keys, enum values.

The real package cannot be imported here (importing it loads ROCm's libamd_smi.so), so
its sources are read as text with ``ast``: ``amdsmi_interface.py`` (functions, enums
whose members name ``amdsmi_wrapper`` constants, the string keys each function builds),
``amdsmi_wrapper.py`` (the constants' values) and ``amdsmi_exception.py``. Point
``AMDSMI_SOURCE`` at the package directory (e.g. an unpacked ``amdsmi-7.0.2`` wheel:
``pip download amdsmi==7.0.2 --no-deps`` and unzip), or install it; without either the
test is skipped and says so.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest

FAKES = Path(__file__).parent / "fakes"
MACHINE = Path(__file__).parent / "fixtures" / "amd-mi300x" / "amdsmi.json"


def real_source() -> Path | None:
    if os.environ.get("AMDSMI_SOURCE"):
        return Path(os.environ["AMDSMI_SOURCE"])
    for entry in sys.path:
        candidate = Path(entry or ".") / "amdsmi" / "amdsmi_interface.py"
        if candidate.is_file() and Path(entry or ".").resolve() != FAKES.resolve():
            return candidate.parent
    return None


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    src = real_source()
    if src is None:
        pytest.skip("the real amdsmi sources are not here: set AMDSMI_SOURCE to an unpacked "
                    "amdsmi wheel to compare the fake with them")
    wrapper: dict[str, int] = {}
    for node in ast.parse((src / "amdsmi_wrapper.py").read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, int) and isinstance(node.targets[0], ast.Name):
            wrapper[node.targets[0].id] = node.value.value
    functions: dict[str, set[str]] = {}
    enums: dict[str, dict[str, int]] = {}
    for node in ast.parse((src / "amdsmi_interface.py").read_text()).body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = {n.value for n in ast.walk(node)
                                    if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        elif isinstance(node, ast.ClassDef):
            members = {}
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Attribute) \
                        and isinstance(item.targets[0], ast.Name):
                    members[item.targets[0].id] = wrapper.get(item.value.attr, -1)
            enums[node.name] = members
    exceptions = {n.name for n in ast.parse((src / "amdsmi_exception.py").read_text()).body
                  if isinstance(n, ast.ClassDef)}
    return {"functions": functions, "enums": enums, "exceptions": exceptions,
            "wrapper": wrapper}


@pytest.fixture(scope="module")
def fake() -> Any:
    os.environ["FAKE_AMDSMI_JSON"] = str(MACHINE)
    spec = importlib.util.spec_from_file_location("_fake_amdsmi", FAKES / "amdsmi/__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_functions_exist_in_the_real_package(real: dict[str, Any], fake: Any) -> None:
    for name in dir(fake):
        if name.startswith("amdsmi_"):
            assert name in real["functions"], name


def test_enum_values_are_the_real_ones(real: dict[str, Any], fake: Any) -> None:
    for name in dir(fake):
        cls = getattr(fake, name)
        if isinstance(cls, type) and issubclass(cls, IntEnum) and cls is not IntEnum:
            for member, value in {**cls.__members__}.items():
                assert real["enums"][name].get(member) == int(value), (name, member)


def test_exceptions_and_status_codes(real: dict[str, Any], fake: Any) -> None:
    for name in ("AmdSmiException", "AmdSmiLibraryException", "AmdSmiRetryException",
                 "AmdSmiTimeoutException", "AmdSmiParameterException"):
        assert name in real["exceptions"] and hasattr(fake, name)
    from exporter.sources.amd import amdsmi_calls

    for name in ("NOT_SUPPORTED", "NOT_YET_IMPLEMENTED", "NO_PERM", "NO_DATA", "NOT_FOUND",
                 "NOT_INIT", "INIT_ERROR", "DRIVER_NOT_LOADED", "FAIL_LOAD_MODULE",
                 "FAIL_LOAD_SYMBOL"):
        assert real["wrapper"][f"AMDSMI_STATUS_{name}"] == getattr(amdsmi_calls, name)


def keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys(v)}
    return set()


def test_dict_keys_are_the_real_ones(real: dict[str, Any], fake: Any) -> None:
    fake.amdsmi_init(fake.AmdSmiInitFlags.INIT_AMD_GPUS)
    handle = fake.amdsmi_get_processor_handles()[0]
    data = json.loads(MACHINE.read_text())["gpus"][0]
    assert data["bdf"] == fake.amdsmi_get_gpu_device_bdf(handle)
    calls = {
        "amdsmi_get_gpu_asic_info": (), "amdsmi_get_gpu_driver_info": (),
        "amdsmi_get_gpu_vbios_info": (), "amdsmi_get_gpu_kfd_info": (),
        "amdsmi_get_gpu_activity": (), "amdsmi_get_gpu_vram_usage": (),
        "amdsmi_get_power_info": (), "amdsmi_get_energy_count": (),
        "amdsmi_get_clock_info": (fake.AmdSmiClkType.GFX,), "amdsmi_get_pcie_info": (),
        "amdsmi_get_gpu_ecc_count": (fake.AmdSmiGpuBlock.UMC,),
        "amdsmi_get_link_metrics": (), "amdsmi_get_gpu_process_list": (),
    }  # fmt: skip
    for fn, args in calls.items():
        got = keys(getattr(fake, fn)(handle, *args))
        assert got and got <= real["functions"][fn], (fn, got - real["functions"][fn])
