"""CUDA MPS clients and NVML's other process lists, against the fake NVML.

NVML keeps three process lists (compute, graphics, MPS compute); a client of the CUDA
Multi-Process Service is only in the third. The fake models nvidia-ml-py's getters
(``_v3``/``_v2`` symbols, the unversioned name's NVMLLibraryMismatchError); the real
lists on a GPU with a running MPS daemon are checked by tests/hardware/test_nvidia_mps.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.model import ProcessSample
from exporter.sources.nvidia.backend import NvidiaBackend
from tests.fakes.fake_nvml import FakeGPU, FakeNVML, FakeProcess
from tests.fakes.nvml_real import N

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MPS = FIXTURES / "nvidia-h100-mps"
MIB = 1 << 20
MPS_FN = "nvmlDeviceGetMPSComputeRunningProcesses"


def processes(fake: FakeNVML, procfs: Path | str = "/nonexistent",
              cycles: int = 1) -> dict[int, ProcessSample]:
    b = NvidiaBackend(Config(procfs=str(procfs)), nvml=fake)
    b.open()
    for _ in range(cycles - 1):
        b.sample(slow=True)
    return {p.pid: p for p in b.sample(slow=True).devices[0].processes}


def fixture_gpu() -> tuple[FakeNVML, dict[str, Any]]:
    config = json.loads((MPS / "nvml.json").read_text())
    spec = config["gpus"][0]
    procs = [FakeProcess(**p) for p in spec["processes"]]
    gpu = FakeGPU(index=0, **{k: v for k, v in spec.items() if k != "processes"},
                  processes=procs)
    return FakeNVML([gpu]), spec


def test_mps_clients_are_listed_apart_from_the_server_and_plain_compute() -> None:
    fake, spec = fixture_gpu()
    procs = processes(fake, MPS / "proc")
    by_pid = {p["pid"]: p for p in spec["processes"]}
    assert sorted(procs) == sorted(by_pid)  # every list's processes, once each
    for pid, p in procs.items():
        assert p.memory_used_bytes == by_pid[pid]["used_memory_bytes"]
        want = "mps_client" if by_pid[pid].get("mps") else "compute"
        assert dict(p.contexts) == {want: True}, pid
    assert procs[7001].process == "nvidia-cuda-mps"  # the server's comm, 15 characters
    assert procs[7010].process == procs[7011].process == "python3"
    assert procs[7010].host_memory_bytes == 1048576 * 1024  # its /proc statm, 4 KiB pages
    assert fake.calls[MPS_FN] == 1


def test_an_exporter_reading_two_lists_would_miss_the_clients() -> None:
    """The fake answers as NVML does: the clients are in the MPS list only."""
    fake, _ = fixture_gpu()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    listed = {p.pid for fn in (fake.nvmlDeviceGetComputeRunningProcesses_v3,
                               fake.nvmlDeviceGetGraphicsRunningProcesses_v3) for p in fn(h)}
    mps = {p.pid for p in fake.nvmlDeviceGetMPSComputeRunningProcesses_v3(h)}
    assert listed == {7001, 7020} and mps == {7010, 7011}


def test_a_pid_in_several_lists_is_one_process_with_each_context() -> None:
    gpu = FakeGPU(processes=[FakeProcess(pid=42, used_memory_bytes=100 * MIB, mps=True),
                             FakeProcess(pid=42, used_memory_bytes=300 * MIB),
                             FakeProcess(pid=42, used_memory_bytes=8 * MIB, graphics=True)])
    (p,) = processes(FakeNVML([gpu])).values()
    assert dict(p.contexts) == {"compute": True, "graphics": True, "mps_client": True}
    assert p.memory_used_bytes == 300 * MIB  # the largest any list gave it


def test_utilisation_joins_an_mps_client_by_pid_where_nvml_samples_it() -> None:
    gpu = FakeGPU(processes=[FakeProcess(pid=7010, used_memory_bytes=MIB, mps=True,
                                         sm_util=45),
                             FakeProcess(pid=7011, used_memory_bytes=MIB, mps=True)])
    procs = processes(FakeNVML([gpu]))
    assert procs[7010].utilization_ratio == {"sm": 0.45}
    assert procs[7011].utilization_ratio == {}  # no sample for it: no series, never 0


def test_a_driver_without_the_v3_symbols_is_read_through_v2() -> None:
    fake, spec = fixture_gpu()
    fake.missing = {f"nvmlDevice{kind}RunningProcesses_v3"
                    for kind in ("GetCompute", "GetGraphics", "GetMPSCompute")}
    procs = processes(fake, cycles=3)
    assert sorted(procs) == sorted(p["pid"] for p in spec["processes"])
    assert dict(procs[7010].contexts) == {"mps_client": True}
    # v3 asked once per list, then v2 only
    assert fake.calls[f"{MPS_FN}_v3"] == 1 and fake.calls[MPS_FN] == 3


def test_a_driver_with_no_mps_list_keeps_the_others_and_stops_asking() -> None:
    fake, _ = fixture_gpu()
    fake.missing = {f"{MPS_FN}_v3", f"{MPS_FN}_v2"}
    procs = processes(fake, cycles=3)
    assert sorted(procs) == [7001, 7020]  # the clients cannot be seen, nothing breaks
    assert fake.calls[f"{MPS_FN}_v3"] == 1 and fake.calls[f"{MPS_FN}_v2"] == 1


def test_the_fake_unversioned_getter_fails_as_nvidia_ml_py_does() -> None:
    """pynvml's @throwOnVersionMismatch: not an NVMLError, so no guard would catch it; the
    backend never calls the unversioned name."""
    fake = FakeNVML([FakeGPU()], missing={f"{MPS_FN}_v3"})
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(N.NVMLLibraryMismatchError):
        fake.nvmlDeviceGetMPSComputeRunningProcesses(h)
    assert not issubclass(N.NVMLLibraryMismatchError, N.NVMLError)
    assert [p.pid for p in fake.nvmlDeviceGetMPSComputeRunningProcesses_v2(h)] == []


def test_mps_list_not_supported_is_not_asked_again() -> None:
    gpu = FakeGPU(processes=[FakeProcess(pid=1, used_memory_bytes=MIB)],
                  not_supported={MPS_FN})
    fake = FakeNVML([gpu])
    assert sorted(processes(fake, cycles=3)) == [1]
    assert fake.calls[MPS_FN] == 1
