"""The amdsmi backend against the fake ``amdsmi`` package fed from the MI300X machine.

Expected values are read from ``tests/fixtures/amd-mi300x/amdsmi.json`` here and
converted by hand (MiB -> bytes, µJ -> J, MHz -> Hz, MT/s -> PCIe generation), not
through the backend's code.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.pipeline.registry import COLLECTORS, build_backends
from exporter.sources.amd.amdsmi import AmdSmiBackend
from exporter.sources.base import BackendFailed, BackendUnavailable
from tests.daemon import REPO, machine_args, running, values_of

FAKES = REPO / "tests" / "fakes"
MACHINE = REPO / "tests" / "fixtures" / "amd-mi300x"
DATA: dict[str, Any] = json.loads((MACHINE / "amdsmi.json").read_text())
MIB = 1 << 20


def load_fake(monkeypatch: pytest.MonkeyPatch, config: dict[str, Any] | Path,
              tmp_path: Path) -> ModuleType:
    path = config if isinstance(config, Path) else tmp_path / "amdsmi.json"
    if not isinstance(config, Path):
        path.write_text(json.dumps(config))
    monkeypatch.setenv("FAKE_AMDSMI_JSON", str(path))
    monkeypatch.syspath_prepend(str(FAKES))
    sys.modules.pop("amdsmi", None)
    module = importlib.import_module("amdsmi")
    assert getattr(module, "__fake__", False)
    return module


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ModuleType]:
    yield load_fake(monkeypatch, MACHINE / "amdsmi.json", tmp_path)
    sys.modules.pop("amdsmi", None)


def by_key(devices: Any) -> dict[str, DeviceSample]:
    return {d.info.key: d for d in devices}


def test_partitions_are_devices_of_their_own(fake: ModuleType) -> None:
    b = AmdSmiBackend(Config())
    infos = {i.key: i for i in b.open()}
    assert sorted(infos) == ["0000:05:00.0", "0000:05:00.0:partition0",
                             "0000:05:00.0:partition1"]
    gpu = infos["0000:05:00.0"]
    assert gpu.name == DATA["gpus"][0]["asic"]["market_name"] == "AMD Instinct MI300X"
    assert gpu.info_labels == {"partition": "DPX/NPS1"}
    assert gpu.uuid == DATA["gpus"][0]["uuid"] and gpu.driver_version == "6.12.12"
    p1 = infos["0000:05:00.0:partition1"]
    assert p1.parent_key == "0000:05:00.0" and p1.slice_labels == {"partition_id": "1"}
    assert p1.uuid == DATA["gpus"][1]["uuid"] and p1.pci_bus_id == "0000:05:00.0"
    b.close()


def test_values_in_base_units(fake: ModuleType) -> None:
    g0, g1 = DATA["gpus"]
    b = AmdSmiBackend(Config())
    b.open()
    cycle = b.sample(slow=True)
    assert cycle.errors == {}
    d = by_key(cycle.devices)
    gpu, p0, p1 = d["0000:05:00.0"], d["0000:05:00.0:partition0"], d["0000:05:00.0:partition1"]
    assert all(x.source == "amdsmi" and x.up for x in d.values())
    assert gpu.power_instant_watts == g0["power"]["current_socket_power"] == 142
    assert gpu.power_watts == 142.0 and gpu.power_limit_watts == 750.0
    assert gpu.energy_joules == pytest.approx(1366610844 * 15.3 / 1e6)  # 20,909,145.9 J
    assert gpu.temperatures_celsius == {"junction": 40.0, "memory": 38.0}
    assert gpu.temperature_thresholds_celsius == {"critical": 100.0, "shutdown": 105.0}
    assert gpu.clocks_hertz == {"graphics": 132e6, "memory": 900e6}
    assert gpu.clocks_max_hertz == {"graphics": 2100e6, "memory": 1300e6}
    assert (gpu.pcie_link_generation, gpu.pcie_link_width) == (5, 16)  # 32000 MT/s
    assert gpu.ras_errors[("xgmi_wafl", "corrected")] == 2 and gpu.ecc_errors == {
        "corrected": 2, "uncorrected": 0}
    assert gpu.nvlink_up == {(str(i), "gpu"): True for i in range(7)}  # 7 XGMI peers
    assert gpu.memory_used_bytes is None and gpu.processes == ()  # per partition instead
    assert p0.memory_total_bytes == 196592 * MIB and p0.memory_used_bytes == 283 * MIB
    assert p1.memory_total_bytes == 98296 * MIB and p1.memory_used_bytes == 492 * MIB
    assert p0.utilization_ratio == 0.0 and p1.utilization_ratio is None  # "N/A"
    (proc,) = p1.processes
    assert (proc.pid, proc.process) == (4242, "rccl-tests")
    assert proc.memory_used_bytes == g1["processes"][0]["vram_mem"] == 205520896
    assert proc.engine_busy_seconds == {"gfx": 0.25, "encoder": 0.0}
    assert p1.power_watts is None  # device-wide values live on the GPU, not a partition

    time.sleep(0.05)
    second = by_key(b.sample(slow=False).devices)["0000:05:00.0"]
    rates = second.xgmi_throughput_bytes_per_second
    assert set(rates) == {(str(i), d) for i in range(7) for d in ("rx", "tx")}
    assert all(r > 0 for r in rates.values())
    assert second.ras_errors == gpu.ras_errors  # slow values kept between slow cycles
    b.close()


def test_not_supported_is_not_asked_again(fake: ModuleType) -> None:
    b = AmdSmiBackend(Config())
    b.open()
    b.sample(slow=True)
    before = fake.calls.get("amdsmi_get_power_info", 0)
    b.sample(slow=False)
    # one call for the GPU (partition 0); partition 1's NOT_SUPPORTED is remembered
    assert fake.calls["amdsmi_get_power_info"] - before == 1
    b.close()


def test_vram_used_is_exact_bytes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """amdsmi_get_gpu_memory_usage's bytes, not amdsmi_get_gpu_vram_usage's whole MiB: on an
    idle MI300X the library holds 297,771,008 B, which the MiB getter truncates to 283 MiB."""
    g0, g1 = (json.loads(json.dumps(g)) for g in DATA["gpus"])
    g0["vram"]["vram_used_bytes"] = 297771008
    g1["not_supported"] = ["amdsmi_get_gpu_memory_usage"]  # an amdsmi without it: MiB
    load_fake(monkeypatch, {**DATA, "gpus": [g0, g1]}, tmp_path)
    b = AmdSmiBackend(Config())
    b.open()
    d = by_key(b.sample(slow=False).devices)
    p0, p1 = d["0000:05:00.0:partition0"], d["0000:05:00.0:partition1"]
    assert p0.memory_used_bytes == 297771008 != g0["vram"]["vram_used"] * MIB
    assert p0.memory_total_bytes == 196592 * MIB
    assert p0.memory_free_bytes == 196592 * MIB - 297771008
    assert p1.memory_used_bytes == 492 * MIB and p1.memory_total_bytes == 98296 * MIB
    b.close()
    sys.modules.pop("amdsmi", None)


def test_missing_package_and_forced_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.modules.pop("amdsmi", None)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != FAKES])
    assert importlib.util.find_spec("amdsmi") is None
    names = [b.name for b in build_backends(Config())]
    assert "amdsmi" not in names  # auto: absent package, no backend, no series
    forced = Config(collectors={**COLLECTORS, "amdsmi": True})
    (b,) = [b for b in build_backends(forced) if b.name == "amdsmi"]
    with pytest.raises(BackendUnavailable,
                       match=r"pip install '\.\[amd\]' in the gpu-exporter checkout"):
        b.open()


def test_init_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    load_fake(monkeypatch, {**DATA, "faults": {"init_error": 34}}, tmp_path)
    with pytest.raises(BackendUnavailable, match="amdsmi_init failed.*34"):
        AmdSmiBackend(Config()).open()
    sys.modules.pop("amdsmi", None)


def test_a_vanished_partition_reports_down(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    load_fake(monkeypatch, {**DATA, "faults": {"lost": ["0000:05:00.1"]}}, tmp_path)
    b = AmdSmiBackend(Config())
    b.open()
    cycle = b.sample(slow=True)
    d = by_key(cycle.devices)
    assert d["0000:05:00.0:partition1"].up is False
    assert d["0000:05:00.0"].up and d["0000:05:00.0:partition0"].up
    assert cycle.errors == {"gpu_lost": 1}
    sys.modules.pop("amdsmi", None)


def test_library_gone_bad_is_backend_failed(fake: ModuleType) -> None:
    b = AmdSmiBackend(Config())
    b.open()
    fake.amdsmi_shut_down()  # every call now answers AMDSMI_STATUS_NOT_INIT
    with pytest.raises(BackendFailed):
        b.sample(slow=False)


def amdsmi_env(config: Path) -> dict[str, str]:
    from tests.daemon import SHIM

    return {"PYTHONPATH": f"{SHIM}:{FAKES}:{REPO}", "FAKE_AMDSMI_JSON": str(config)}


@pytest.mark.slow
def test_daemon_serves_amdsmi(tmp_path: Path) -> None:
    args = [*machine_args(MACHINE), "--collector.interval", "200ms"]
    with running(args, tmp_path, env=amdsmi_env(MACHINE / "amdsmi.json")) as d:
        text = d.get().text
        assert values_of(text, "gpu_exporter_backend_up", backend="amdsmi") == [1.0]
        assert 205520896.0 in values_of(text, "gpu_process_memory_used_bytes", pid="4242",
                                        source="amdsmi")


@pytest.mark.slow
def test_hung_call_is_marked_stale(tmp_path: Path) -> None:
    config = tmp_path / "hang.json"
    config.write_text(json.dumps({**DATA, "faults": {
        "hang": {"function": "amdsmi_get_gpu_activity", "after_seconds": 1.5}}}))
    args = [*machine_args(MACHINE), "--collector.interval", "200ms", "--stale-after", "1s"]
    with running(args, tmp_path, env=amdsmi_env(config)) as d:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            text = d.get().text
            if not values_of(text, "gpu_process_memory_used_bytes", source="amdsmi"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("amdsmi series still served after the call hung")
        # sysfs keeps serving the same GPU
        assert values_of(text, "gpu_exporter_backend_up", backend="amd") == [1.0]
        assert "backend stale" in d.log()
