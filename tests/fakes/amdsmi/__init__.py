"""A fake ``amdsmi`` package: the surface the amdsmi backend uses, with behaviour.

Put ``tests/fakes`` on PYTHONPATH and name a JSON file in ``FAKE_AMDSMI_JSON``. Names,
dict keys, enum members and values, and exception types are the real package's
(PyPI ``amdsmi`` 7.0.2 = ROCm 7.0.2 ``py-interface``: ``amdsmi_interface.py``,
``amdsmi_wrapper.py``, ``amdsmi_exception.py``); ``tests/test_amdsmi_fake.py`` checks them
against those sources where they are available. Like the real functions, these return
the string ``"N/A"`` for a field the GPU does not fill and raise
``AmdSmiLibraryException(code)`` for a failed call.

JSON (every key optional)::

    {"gpus": [{"bdf": "0000:05:00.0", "uuid": "...", "asic": {...}, "driver": {...},
               "vbios": {...}, "kfd": {...}, "compute_partition": "DPX",
               "memory_partition": "NPS1", "activity": {...},
               "vram": {"vram_total": MiB, "vram_used": MiB, "vram_used_bytes": B},
               "power": {...}, "energy": {"energy_accumulator": N,
               "counter_resolution": 15.3, "step": N}, "temps": {"EDGE": 40, ...},
               "thresholds": {"CRITICAL": 110}, "clocks": {"GFX": {...}}, "pcie": {...},
               "ecc": {"UMC": {...}}, "links": [...], "link_step_kb": N,
               "processes": [...], "not_supported": ["amdsmi_get_gpu_activity"]}],
     "faults": {"init_error": 18, "lost": ["0000:05:00.1"], "lost_after_seconds": 0,
                "hang": {"function": "amdsmi_get_power_info", "after_seconds": 1.0}}}
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from enum import IntEnum
from pathlib import Path
from typing import Any

__fake__ = True
__version__ = "7.0.2-fake"

# amdsmi_status_t (amdsmi_wrapper.py)
AMDSMI_STATUS_SUCCESS, AMDSMI_STATUS_NOT_SUPPORTED, AMDSMI_STATUS_TIMEOUT = 0, 2, 8
AMDSMI_STATUS_RETRY, AMDSMI_STATUS_INIT_ERROR, AMDSMI_STATUS_NOT_FOUND = 9, 18, 31
AMDSMI_STATUS_NOT_INIT, AMDSMI_STATUS_DRIVER_NOT_LOADED = 32, 34


class AmdSmiException(Exception):
    """Base smi exception class (amdsmi_exception.py)."""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | fake amdsmi status {self.err_code}"


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(AMDSMI_STATUS_RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(AMDSMI_STATUS_TIMEOUT)


class AmdSmiParameterException(AmdSmiException):
    pass


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 4294967295
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8
    INIT_AMD_APUS = 3


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6
    PLX = 7


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    CRITICAL = 5
    EMERGENCY = 7


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4
    PCIE = 5
    VCLK0 = 6
    VCLK1 = 7
    DCLK0 = 8
    DCLK1 = 9


class AmdSmiGpuBlock(IntEnum):
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128
    DF = 256
    SMN = 512
    SEM = 1024
    MP0 = 2048
    MP1 = 4096
    FUSE = 8192
    MCA = 16384
    VCN = 32768
    JPEG = 65536
    IH = 131072
    MPIO = 262144


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiLinkType(IntEnum):
    AMDSMI_LINK_TYPE_INTERNAL = 0
    AMDSMI_LINK_TYPE_PCIE = 1
    AMDSMI_LINK_TYPE_XGMI = 2
    AMDSMI_LINK_TYPE_NOT_APPLICABLE = 3
    AMDSMI_LINK_TYPE_UNKNOWN = 4


NA = "N/A"
_CONFIG: dict[str, Any] = json.loads(Path(os.environ["FAKE_AMDSMI_JSON"]).read_text()) \
    if os.environ.get("FAKE_AMDSMI_JSON") else {"gpus": []}
_GPUS: list[dict[str, Any]] = _CONFIG.get("gpus", [])
_FAULTS: dict[str, Any] = _CONFIG.get("faults", {})
_STATE = {"init": False, "born": time.monotonic(), "reads": {}}
calls: dict[str, int] = {}


def _gpu(handle: Any, fn: str) -> dict[str, Any]:
    """The GPU behind a handle, after the faults of this call."""
    calls[fn] = calls.get(fn, 0) + 1
    if not _STATE["init"]:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
    if not isinstance(handle, ctypes.c_void_p) or not handle.value:
        raise AmdSmiParameterException(handle)
    gpu = _GPUS[handle.value - 1]
    hang = _FAULTS.get("hang")
    if hang and hang.get("function") == fn and \
            time.monotonic() - _STATE["born"] >= float(hang.get("after_seconds", 0)):
        while True:  # stuck inside the driver, as a real hung ioctl is
            time.sleep(3600)
    lost_after = float(_FAULTS.get("lost_after_seconds", 0))
    if gpu["bdf"] in _FAULTS.get("lost", []) and time.monotonic() - _STATE["born"] >= lost_after \
            and fn != "amdsmi_get_gpu_device_bdf":
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_FOUND)
    if fn in gpu.get("not_supported", []):
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return gpu


def _fields(values: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any]:
    values = values or {}
    return {k: values.get(k, NA) for k in keys}


def _need(gpu: dict[str, Any], key: str) -> Any:
    if key not in gpu:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return gpu[key]


def _advance(handle: Any, fn: str) -> int:
    """How many times this handle has answered ``fn`` before (counters move per read)."""
    reads: dict[tuple[int, str], int] = _STATE["reads"]  # type: ignore[assignment]
    n = reads.get((handle.value, fn), 0)
    reads[(handle.value, fn)] = n + 1
    return n


# -- library ------------------------------------------------------------------------------
def amdsmi_init(flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    calls["amdsmi_init"] = calls.get("amdsmi_init", 0) + 1
    if not isinstance(flag, AmdSmiInitFlags):
        raise AmdSmiParameterException(flag)
    if _FAULTS.get("init_error"):
        raise AmdSmiLibraryException(int(_FAULTS["init_error"]))
    _STATE["init"] = True


def amdsmi_shut_down() -> None:
    _STATE["init"] = False


def amdsmi_get_processor_handles() -> list[ctypes.c_void_p]:
    if not _STATE["init"]:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
    return [ctypes.c_void_p(i + 1) for i in range(len(_GPUS))]


# -- identity -----------------------------------------------------------------------------
def amdsmi_get_gpu_device_bdf(h: Any) -> str:
    return str(_gpu(h, "amdsmi_get_gpu_device_bdf")["bdf"])


def amdsmi_get_gpu_device_uuid(h: Any) -> str:
    return str(_need(_gpu(h, "amdsmi_get_gpu_device_uuid"), "uuid"))


def amdsmi_get_gpu_asic_info(h: Any) -> dict[str, Any]:
    return _fields(_gpu(h, "amdsmi_get_gpu_asic_info").get("asic"), (
        "market_name", "vendor_id", "vendor_name", "subvendor_id", "device_id", "rev_id",
        "asic_serial", "oam_id", "num_compute_units", "target_graphics_version",
        "subsystem_id"))


def amdsmi_get_gpu_driver_info(h: Any) -> dict[str, Any]:
    return _fields(_gpu(h, "amdsmi_get_gpu_driver_info").get("driver"),
                   ("driver_name", "driver_version", "driver_date"))


def amdsmi_get_gpu_vbios_info(h: Any) -> dict[str, Any]:
    return _fields(_gpu(h, "amdsmi_get_gpu_vbios_info").get("vbios"),
                   ("name", "build_date", "part_number", "version"))


def amdsmi_get_gpu_kfd_info(h: Any) -> dict[str, Any]:
    return _fields(_gpu(h, "amdsmi_get_gpu_kfd_info").get("kfd"),
                   ("kfd_id", "node_id", "current_partition_id"))


def amdsmi_get_gpu_compute_partition(h: Any) -> str:
    return str(_need(_gpu(h, "amdsmi_get_gpu_compute_partition"), "compute_partition"))


def amdsmi_get_gpu_memory_partition(h: Any) -> str:
    return str(_need(_gpu(h, "amdsmi_get_gpu_memory_partition"), "memory_partition"))


# -- telemetry ----------------------------------------------------------------------------
def amdsmi_get_gpu_activity(h: Any) -> dict[str, Any]:
    return _fields(_need(_gpu(h, "amdsmi_get_gpu_activity"), "activity"),
                   ("gfx_activity", "umc_activity", "mm_activity"))


def amdsmi_get_gpu_vram_usage(h: Any) -> dict[str, Any]:
    vram = _need(_gpu(h, "amdsmi_get_gpu_vram_usage"), "vram")
    return {"vram_total": vram["vram_total"], "vram_used": vram["vram_used"]}


def _memory(h: Any, fn: str, mem_type: AmdSmiMemoryType, key: str) -> int:
    """Bytes of VRAM: ``{key}_bytes`` where the JSON has it (what the library reads from the
    driver), else the MiB figure times 2**20; other memory types are not in the JSON."""
    vram = _need(_gpu(h, fn), "vram")
    if not isinstance(mem_type, AmdSmiMemoryType):
        raise AmdSmiParameterException(mem_type)
    if mem_type != AmdSmiMemoryType.VRAM:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return int(vram.get(f"{key}_bytes", vram[key] << 20))


def amdsmi_get_gpu_memory_total(h: Any, mem_type: AmdSmiMemoryType) -> int:
    return _memory(h, "amdsmi_get_gpu_memory_total", mem_type, "vram_total")


def amdsmi_get_gpu_memory_usage(h: Any, mem_type: AmdSmiMemoryType) -> int:
    return _memory(h, "amdsmi_get_gpu_memory_usage", mem_type, "vram_used")


def amdsmi_get_power_info(h: Any) -> dict[str, Any]:
    return _fields(_need(_gpu(h, "amdsmi_get_power_info"), "power"), (
        "socket_power", "current_socket_power", "average_socket_power", "gfx_voltage",
        "soc_voltage", "mem_voltage", "power_limit"))


def amdsmi_get_energy_count(h: Any) -> dict[str, Any]:
    e = _need(_gpu(h, "amdsmi_get_energy_count"), "energy")
    n = _advance(h, "amdsmi_get_energy_count")
    return {"energy_accumulator": e["energy_accumulator"] + n * e.get("step", 0),
            "counter_resolution": e["counter_resolution"], "timestamp": e.get("timestamp", 0)}


def amdsmi_get_temp_metric(h: Any, sensor_type: AmdSmiTemperatureType,
                           metric: AmdSmiTemperatureMetric) -> int:
    gpu = _gpu(h, "amdsmi_get_temp_metric")
    if not isinstance(sensor_type, AmdSmiTemperatureType) or \
            not isinstance(metric, AmdSmiTemperatureMetric):
        raise AmdSmiParameterException(sensor_type)
    table = gpu.get("temps", {}) if metric == AmdSmiTemperatureMetric.CURRENT else \
        gpu.get("thresholds", {}).get(sensor_type.name, {})
    key = sensor_type.name if metric == AmdSmiTemperatureMetric.CURRENT else metric.name
    if key not in table:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return int(table[key])


def amdsmi_get_clock_info(h: Any, clock_type: AmdSmiClkType) -> dict[str, Any]:
    clocks = _gpu(h, "amdsmi_get_clock_info").get("clocks", {})
    # By value: GFX is an alias of SYS (both 0), as in the real IntEnum.
    key = next((k for k in clocks if AmdSmiClkType[k] == clock_type), None)
    if key is None:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return _fields(clocks[key],
                   ("clk", "min_clk", "max_clk", "clk_locked", "clk_deep_sleep"))


def amdsmi_get_pcie_info(h: Any) -> dict[str, Any]:
    p = _need(_gpu(h, "amdsmi_get_pcie_info"), "pcie")
    return {"pcie_static": _fields(p.get("pcie_static"), (
                "max_pcie_width", "max_pcie_speed", "pcie_interface_version", "slot_type")),
            "pcie_metric": _fields(p.get("pcie_metric"), (
                "pcie_width", "pcie_speed", "pcie_bandwidth", "pcie_replay_count",
                "pcie_l0_to_recovery_count", "pcie_replay_roll_over_count",
                "pcie_nak_sent_count", "pcie_nak_received_count",
                "pcie_lc_perf_other_end_recovery_count"))}


def amdsmi_get_gpu_ecc_count(h: Any, block: AmdSmiGpuBlock) -> dict[str, int]:
    ecc = _gpu(h, "amdsmi_get_gpu_ecc_count").get("ecc", {})
    if not isinstance(block, AmdSmiGpuBlock) or block.name not in ecc:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return {k: ecc[block.name].get(k, 0)
            for k in ("correctable_count", "uncorrectable_count", "deferred_count")}


def amdsmi_get_link_metrics(h: Any) -> dict[str, Any]:
    gpu = _gpu(h, "amdsmi_get_link_metrics")
    links = _need(gpu, "links")
    n = _advance(h, "amdsmi_get_link_metrics")
    step = gpu.get("link_step_kb", 0)
    out = [{"bdf": link.get("bdf", "0000:00:00.0"), "bit_rate": link["bit_rate"],
            "max_bandwidth": link["max_bandwidth"], "link_type": link["link_type"],
            "read": link["read"] + n * step, "write": link["write"] + n * step // 2}
           for link in links]
    return {"num_links": len(out), "links": out}


def amdsmi_get_gpu_process_list(h: Any) -> list[dict[str, Any]]:
    gpu = _gpu(h, "amdsmi_get_gpu_process_list")
    return [{"name": p["name"], "pid": p["pid"], "mem": p.get("mem", 0),
             "engine_usage": {"gfx": p.get("gfx_ns", 0), "enc": p.get("enc_ns", 0)},
             "memory_usage": {"gtt_mem": p.get("gtt_mem", 0), "cpu_mem": p.get("cpu_mem", 0),
                              "vram_mem": p.get("vram_mem", 0)},
             "cu_occupancy": p.get("cu_occupancy", NA)} for p in gpu.get("processes", [])]
