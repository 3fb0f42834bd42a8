"""MIG through the NVIDIA backend against FakeNVML: instances as devices that come and go."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.sources.nvidia.backend import NvidiaBackend
from tests.fakes.fake_nvml import FakeGPU, FakeMig, FakeNvLink, FakeNVML, FakeProcess
from tests.test_nvidia_nvlink import CHANGES_THE_GPU

MIB = 1 << 20
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def backend(fake: FakeNVML, procfs: Path | str = "/nonexistent") -> NvidiaBackend:
    b = NvidiaBackend(Config(procfs=str(procfs)), nvml=fake)
    b.open()
    return b


def by_uuid(devices: list[DeviceSample] | tuple[DeviceSample, ...]) -> dict[str, DeviceSample]:
    return {d.info.uuid: d for d in devices}


def mig_gpu(**kw: object) -> FakeGPU:
    """An H100 split as the H100 MIG capture shows (nvidia_smi/...h100-mig...txt)."""
    return FakeGPU(mig_mode=1, utilization_gpu=55, mig_devices=[
        FakeMig(gpu_instance_id=2, profile="3g.40gb", memory_total_bytes=40448 * MIB,
                memory_used_bytes=11091 * MIB, gpm={"sm_util": 96.1},
                processes=[FakeProcess(pid=21198, used_memory_bytes=7484 * MIB),
                           FakeProcess(pid=21180, used_memory_bytes=2296 * MIB)]),
        FakeMig(gpu_instance_id=9, profile="1g.10gb", memory_total_bytes=9984 * MIB,
                memory_used_bytes=9 * MIB, gpm={"sm_util": 0.0})], **kw)  # type: ignore[arg-type]


def test_each_instance_is_a_device_of_its_own() -> None:
    fake = FakeNVML([mig_gpu()])
    parent, big, small = backend(fake).sample(slow=True).devices
    gpu = fake.gpus[0]
    assert parent.info.uuid == gpu.uuid and parent.info.key == "0000:18:00.0"
    assert parent.info.info_labels == {"mig_mode": "enabled"}
    for d, mig in ((big, gpu.mig_devices[0]), (small, gpu.mig_devices[1])):
        assert d.up and d.source == "nvml"
        assert d.info.uuid == d.info.device_key == d.info.key == mig.uuid
        assert d.info.uuid.startswith("MIG-")
        assert d.info.parent_key == "0000:18:00.0" and d.info.pci_bus_id == "0000:18:00.0"
        assert d.info.info_labels == {}
        assert d.info.name == f"NVIDIA H100 80GB HBM3 MIG {mig.profile}"
        assert d.memory_total_bytes == mig.memory_total_bytes
        assert d.memory_used_bytes == mig.memory_used_bytes
    assert big.info.slice_labels == {"gpu_instance_id": "2", "compute_instance_id": "0",
                                     "mig_profile": "3g.40gb"}
    assert small.info.slice_labels["mig_profile"] == "1g.10gb"
    assert big.memory_free_bytes == (40448 - 11091) * MIB


def test_processes_belong_to_their_instance_not_to_the_parent() -> None:
    parent, big, small = backend(FakeNVML([mig_gpu()])).sample(slow=True).devices
    assert parent.processes == ()
    assert [(p.pid, p.memory_used_bytes) for p in big.processes] == [
        (21198, 7484 * MIB), (21180, 2296 * MIB)]
    assert small.processes == ()


def test_gpm_activity_per_gpu_instance() -> None:
    parent, big, small = backend(FakeNVML([mig_gpu()])).sample(slow=True).devices
    assert big.profiling_ratio == {"sm_active": pytest.approx(0.961)}
    assert big.source_of("profiling_ratio") == "nvml_gpm"
    assert small.profiling_ratio == {"sm_active": 0.0}


def test_compute_instances_of_one_gpu_instance_share_its_gpm_and_name_their_profile() -> None:
    gpu = FakeGPU(mig_mode=1, mig_devices=[
        FakeMig(gpu_instance_id=1, compute_instance_id=0, profile="1c.3g.40gb",
                gpm={"sm_util": 40.0}),
        FakeMig(gpu_instance_id=1, compute_instance_id=1, profile="2c.3g.40gb")])
    fake = FakeNVML([gpu])
    _, ci0, ci1 = backend(fake).sample(slow=True).devices
    assert (ci0.info.slice_labels["compute_instance_id"],
            ci1.info.slice_labels["compute_instance_id"]) == ("0", "1")
    assert ci0.info.slice_labels["mig_profile"] == "1c.3g.40gb"
    assert ci0.profiling_ratio == ci1.profiling_ratio == {"sm_active": pytest.approx(0.4)}
    assert fake.calls["nvmlGpmMigSampleGet"] == 2  # one sampler for GPU instance 1: 2 samples


def test_the_parent_keeps_its_own_device_level_series() -> None:
    parent = backend(FakeNVML([mig_gpu(power_mw=433780)])).sample(slow=True).devices[0]
    assert parent.up and parent.power_watts == pytest.approx(433.78)
    assert parent.temperatures_celsius["gpu"] == 41.0
    assert parent.memory_total_bytes == 81559 * MIB
    # NVML refuses utilisation on a MIG-enabled GPU: absent, not 0, and not an error.
    assert parent.utilization_ratio is None


def test_instances_appear_and_vanish_between_cycles() -> None:
    fake = FakeNVML([mig_gpu()])
    b = backend(fake)
    gpu = fake.gpus[0]
    first = by_uuid(b.sample(slow=True).devices)
    assert len(first) == 3
    gone = gpu.mig_devices.pop(1)
    new = FakeMig(gpu_instance_id=13, profile="1g.20gb", memory_total_bytes=19968 * MIB)
    gpu.mig_devices.append(new)
    cycle = b.sample(slow=False)
    second = by_uuid(cycle.devices)
    assert gone.uuid not in second and new.uuid in second
    assert second[new.uuid].info.slice_labels == {"gpu_instance_id": "13",
                                                  "compute_instance_id": "0",
                                                  "mig_profile": "1g.20gb"}
    assert second[new.uuid].memory_total_bytes == 19968 * MIB
    assert cycle.errors == {}
    # Destroyed and re-created with the same ids: a new MIG UUID, a new device.
    recreated = FakeMig(gpu_instance_id=13, profile="1g.20gb", uuid="MIG-recreated")
    gpu.mig_devices[-1] = recreated
    third = by_uuid(b.sample(slow=False).devices)
    assert "MIG-recreated" in third and new.uuid not in third


def test_mig_mode_changes_at_run_time_are_followed() -> None:
    gpu = FakeGPU(mig_mode=0, utilization_gpu=30, nvlinks=[FakeNvLink()],
                  processes=[FakeProcess(pid=4242, used_memory_bytes=MIB)])
    fake = FakeNVML([gpu])
    b = backend(fake)
    (off,) = b.sample(slow=True).devices
    assert off.info.info_labels == {"mig_mode": "disabled"}
    assert off.utilization_ratio == pytest.approx(0.3) and [p.pid for p in off.processes] == [4242]
    assert off.nvlink_up == {("0", "switch"): True}
    gpu.mig_mode = 1
    gpu.mig_devices = [FakeMig(gpu_instance_id=2, profile="3g.40gb",
                               processes=[FakeProcess(pid=4242, used_memory_bytes=MIB)])]
    on, instance = b.sample(slow=True).devices
    assert on.info.info_labels == {"mig_mode": "enabled"} and on.utilization_ratio is None
    assert on.processes == () and [p.pid for p in instance.processes] == [4242]
    assert on.nvlink_up == {}  # NVLink queries are refused in MIG mode
    gpu.mig_mode = 0
    (back,) = b.sample(slow=True).devices  # the instance is gone with the mode
    # What MIG mode refused is asked again: utilisation and NVLink are back.
    assert back.info.info_labels == {"mig_mode": "disabled"}
    assert back.utilization_ratio == pytest.approx(0.3)
    assert back.nvlink_up == {("0", "switch"): True}
    assert [p.pid for p in back.processes] == [4242]


def test_a_gpu_without_mig_has_no_mig_label_and_is_asked_once() -> None:
    fake = FakeNVML([FakeGPU(mig_mode=None)])
    b = backend(fake)
    for slow in (True, False, False):
        d = b.sample(slow=slow).devices[0]
    assert d.info.info_labels == {}
    assert fake.calls["nvmlDeviceGetMigMode"] == 1
    assert fake.calls["nvmlDeviceGetMaxMigDeviceCount"] == 0


def test_a_lost_parent_takes_its_instances_down_with_it() -> None:
    fake = FakeNVML([mig_gpu()])
    b = backend(fake)
    b.sample(slow=True)
    fake.gpus[0].lost = True
    cycle = b.sample(slow=False)
    assert [d.up for d in cycle.devices] == [False, False, False]
    assert {d.info.uuid for d in cycle.devices[1:]} == {m.uuid for m in fake.gpus[0].mig_devices}
    assert cycle.errors == {"gpu_lost": 1}
    fake.gpus[0].lost = False
    assert all(d.up for d in b.sample(slow=False).devices)


def test_mig_settings_are_never_changed() -> None:
    fake = FakeNVML([mig_gpu()])
    b = backend(fake)
    for slow in (True, False, True):
        b.sample(slow=slow)
    b.close()
    assert not [fn for fn in fake.calls if fn.startswith(CHANGES_THE_GPU)]


def test_mig_fixture_machine_against_the_capture() -> None:
    """nvidia-h100-mig follows the H100 MIG capture's instances and process table."""
    import json

    from tests.test_nvidia import _load_shim

    root = FIXTURES / "nvidia-h100-mig"
    config = json.loads((root / "nvml.json").read_text())
    fake = _load_shim().build(config)
    b = NvidiaBackend(Config(procfs=str(root / "proc")), nvml=fake)
    b.open()
    parent, *instances = b.sample(slow=True).devices
    assert parent.info.info_labels == {"mig_mode": "enabled"}
    assert [(d.info.slice_labels["gpu_instance_id"], d.info.slice_labels["mig_profile"],
             d.memory_total_bytes / MIB, d.memory_used_bytes / MIB)
            for d in sorted(instances, key=lambda d: int(d.info.slice_labels["gpu_instance_id"]))
            ] == [("2", "3g.40gb", 40448, 11091), ("3", "2g.20gb", 20096, 17),
                  ("9", "1g.10gb", 9984, 9), ("10", "1g.10gb", 9984, 9)]
    busy = next(d for d in instances if d.info.slice_labels["gpu_instance_id"] == "2")
    assert {(p.pid, p.process, p.memory_used_bytes / MIB) for p in busy.processes} == {
        (21180, "memhog", 2296), (21181, "memhog", 1272), (21198, "gpu_burn", 7484)}


def test_the_mig_mode_is_asked_on_the_slow_tier_only() -> None:
    """A mode change takes a GPU reset, and the call costs a third of a fast cycle on an
    H100: fast cycles reuse the mode, instances are still walked every cycle."""
    gpu = mig_gpu()
    fake = FakeNVML([gpu])
    b = backend(fake)
    b.sample(slow=False)  # the first cycle reads everything
    for _ in range(3):
        devices = b.sample(slow=False).devices
    assert fake.calls["nvmlDeviceGetMigMode"] == 1
    assert len(devices) == 1 + len(gpu.mig_devices)
    gpu.mig_devices = gpu.mig_devices[:1]  # an instance destroyed: seen at the next cycle
    assert len(b.sample(slow=False).devices) == 2
    gpu.mig_mode = 0
    parent = b.sample(slow=False).devices[0]  # the mode waits for the slow tier
    assert parent.info.info_labels == {"mig_mode": "enabled"}
    (parent,) = b.sample(slow=True).devices
    assert fake.calls["nvmlDeviceGetMigMode"] == 2
    assert parent.info.info_labels == {"mig_mode": "disabled"}
