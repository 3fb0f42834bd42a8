"""A module named ``pynvml`` for subprocess tests: the real backend runs against FakeNVML.

Start the daemon with ``PYTHONPATH=tests/fakes/pynvml_shim:<repo>`` and
``FAKE_NVML_JSON=<file.json>``. This module builds one FakeNVML from the JSON
and serves its surface at module level (``pynvml.nvmlInit``, ``pynvml.NVMLError``,
``pynvml.NVML_CLOCK_SM``, ...); constants, structs and error classes are the installed
nvidia-ml-py's. Without the variable it behaves as one idle H100.

JSON format (every key optional)::

    {
      "driver_version": "550.127.05",
      "no_gpu": false,                  # true: nvmlInit raises NVML_ERROR_DRIVER_NOT_LOADED
      "gpus": [                         # one object per GPU; omitted keys keep H100 defaults
        {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "pci_bus_id": "00000000:18:00.0",
         "serial": "...", "minor": 0, "vbios_version": "96.00.A5.00.01",
         "compute_capability": [9, 0], "architecture": 9,
         "memory_total_bytes": ..., "memory_reserved_bytes": ..., "memory_used_bytes": ...,
         "utilization_gpu": 0, "utilization_memory": 0,            # percent
         "temperature_gpu": 41, "temperature_memory": 48,          # C; null = not supported
         "thresholds": {"shutdown": 92, "slowdown": 89, "gpu_max": 87, "mem_max": 95},
         "power_mw": 69850, "power_limit_mw": 700000,
         "energy_mj": 123456789, "energy_step_mj": 69850,          # + step after each read
         "fans": [],                                               # percent per fan
         "clocks_mhz": {"graphics": 345, "sm": 345, "memory": 2619, "video": 765},
         "max_clocks_mhz": {...}, "pstate": 0, "clocks_event_reasons": 1,
         "pcie_generation": 5, "pcie_width": 16, "pcie_max_generation": 5,
         "pcie_max_width": 16, "pcie_tx_kbps": 352, "pcie_rx_kbps": 329, "pcie_replays": 9,
         "engines": {"encoder": 0, "decoder": 0, "jpeg": 0, "ofa": 0},
         "ecc_corrected": 0, "ecc_uncorrected": 0, "remapped_rows": [0, 0, 0, 0],
         "gpm": {"sm_util": 0.0, ...},       # percent by NVML_GPM_METRIC_<NAME> lower-cased
         "xids": [79],                       # XID events delivered on the first drain
         "processes": [{"pid": 4242, "used_memory_bytes": 1073741824,
                        "name": "python3", "sm_util": 35, "graphics": false,
                        "mps": false}],              # mps: a CUDA MPS client
         # Off unless given (fake_nvml_links.py has the behaviour):
         "power_instant_mw": 69620,
         "violation_ns": {"power": 0, "thermal": 0, "sync_boost": 0},
         "ecc_locations": {"dram": [0, 0], "sram": [0, 0]},   # (corrected, uncorrected)
         "retired_pages": {"single_bit": 0, "double_bit": 0},
         "nvlinks": [{"state": 1, "remote": "switch", "tx_kib": 0, "tx_step_kib": 0,
                      "rx_kib": 0, "rx_step_kib": 0, "errors": {"replay": 0}}],
         "nvlinks": {"count": 18, "state": 1, ...},  # or: this many identical links
         "mig_mode": 1,                      # null: no MIG, 0 disabled, 1 enabled
         "mig_devices": [{"gpu_instance_id": 2, "compute_instance_id": 0,
                          "profile": "3g.40gb", "uuid": "MIG-...",
                          "memory_total_bytes": ..., "memory_used_bytes": ...,
                          "gpm": {...}, "processes": [...]}]}
      ],
      "generate": {"gpus": 8, "processes_per_gpu": 64},   # instead of "gpus": many defaults
      "faults": {
        "lost_gpus": [1],                    # telemetry raises GPU_IS_LOST (identity answers)
        "not_supported": {"0": ["nvmlDeviceGetFanSpeed_v2", "nvmlDeviceGetPowerUsage"]},
        "hang": {"function": "nvmlDeviceGetPowerUsage", "after_seconds": 2.0, "gpu": 0},
        "missing": ["nvmlDeviceGetMPSComputeRunningProcesses_v3"]  # symbols the driver lacks
      }
    }

Generated processes get pids 10000 + gpu * 1000 + n, 64 MiB * (n + 1) each and
sm_util n % 100, so outputs stay deterministic.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

__fake_shim__ = True

_spec = importlib.util.spec_from_file_location(
    "_fake_nvml", Path(__file__).resolve().parent.parent / "fake_nvml.py")
assert _spec is not None and _spec.loader is not None
_fake = importlib.util.module_from_spec(_spec)
sys.modules["_fake_nvml"] = _fake
_spec.loader.exec_module(_fake)

MIB = 1 << 20


def _links(spec: Any) -> list[Any]:
    if isinstance(spec, dict):
        spec = dict(spec)
        count = int(spec.pop("count"))
        return [_fake.FakeNvLink(**spec) for _ in range(count)]
    return [_fake.FakeNvLink(**link) for link in spec]


def _mig(spec: dict[str, Any]) -> Any:
    spec = dict(spec)
    procs = [_fake.FakeProcess(**p) for p in spec.pop("processes", [])]
    return _fake.FakeMig(processes=procs, **spec)


def _gpu(index: int, spec: dict[str, Any]) -> Any:
    spec = dict(spec)
    procs = [_fake.FakeProcess(**p) for p in spec.pop("processes", [])]
    if "nvlinks" in spec:
        spec["nvlinks"] = _links(spec["nvlinks"])
    if "mig_devices" in spec:
        spec["mig_devices"] = [_mig(m) for m in spec["mig_devices"]]
    if "ecc_locations" in spec:
        spec["ecc_locations"] = {k: tuple(v) for k, v in spec["ecc_locations"].items()}
    if "compute_capability" in spec:
        spec["compute_capability"] = tuple(spec["compute_capability"])
    if "remapped_rows" in spec:
        spec["remapped_rows"] = tuple(spec["remapped_rows"])
    if "not_supported" in spec:
        spec["not_supported"] = set(spec["not_supported"])
    return _fake.FakeGPU(index=index, processes=procs, **spec)


def build(config: dict[str, Any]) -> Any:
    """A FakeNVML from the JSON format above."""
    gen = config.get("generate")
    if gen:
        specs: list[dict[str, Any]] = []
        for g in range(int(gen.get("gpus", 8))):
            specs.append({"processes": [
                {"pid": 10000 + g * 1000 + n, "used_memory_bytes": 64 * MIB * (n + 1),
                 "sm_util": n % 100}
                for n in range(int(gen.get("processes_per_gpu", 0)))]})
    else:
        specs = config.get("gpus", [{}])
    gpus = [_gpu(i, s) for i, s in enumerate(specs)]
    faults = config.get("faults", {})
    for i in faults.get("lost_gpus", []):
        gpus[int(i)].lost = True
    for i, names in faults.get("not_supported", {}).items():
        gpus[int(i)].not_supported.update(names)
    return _fake.FakeNVML(gpus, driver_version=config.get("driver_version", "550.127.05"),
                          no_gpu=bool(config.get("no_gpu", False)), hang=faults.get("hang"),
                          missing=set(faults.get("missing", ())))


def _load() -> Any:
    path = os.environ.get("FAKE_NVML_JSON")
    config = json.loads(Path(path).read_text()) if path else {}
    return build(config)


FAKE = _load()


def __getattr__(name: str) -> Any:
    return getattr(FAKE, name)
