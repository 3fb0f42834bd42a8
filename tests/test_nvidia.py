"""The NVIDIA backend against FakeNVML (tests/fakes/fake_nvml.py) and fixture /proc trees."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.sources.base import BackendFailed, BackendUnavailable
from exporter.sources.nvidia.backend import ALL_LOST_REINIT, NvidiaBackend
from tests.fakes.fake_nvml import FakeGPU, FakeNVML, FakeProcess

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SHIM = REPO / "tests" / "fakes" / "pynvml_shim"
MIB = 1 << 20


def backend(fake: FakeNVML, procfs: Path | str = "/nonexistent", **config: Any) -> NvidiaBackend:
    b = NvidiaBackend(Config(procfs=str(procfs), **config), nvml=fake)
    b.open()
    return b


def one(fake: FakeNVML, slow: bool = True, **kw: Any) -> DeviceSample:
    return backend(fake, **kw).sample(slow=slow).devices[0]


def test_open_reports_identity() -> None:
    fake = FakeNVML([FakeGPU(index=0), FakeGPU(index=1)], driver_version="550.127.05")
    infos = NvidiaBackend(Config(), nvml=fake).open()
    assert [i.pci_bus_id for i in infos] == ["0000:18:00.0", "0000:2a:00.0"]
    i = infos[1]
    assert (i.vendor, i.driver, i.driver_version) == ("nvidia", "nvidia", "550.127.05")
    assert i.uuid == fake.gpus[1].uuid and i.uuid.startswith("GPU-")
    assert (i.name, i.compute_capability, i.architecture) == ("NVIDIA H100 80GB HBM3", "9.0",
                                                              "hopper")
    assert (i.device_node, i.serial, i.vbios_version) == ("nvidia1", "1654922000001",
                                                          "96.00.A5.00.01")


def test_fast_values_in_base_units() -> None:
    gpu = FakeGPU(utilization_gpu=37, utilization_memory=9, temperature_gpu=62,
                  temperature_memory=57, power_mw=631250, power_limit_mw=650000,
                  memory_total_bytes=81559 * MIB, memory_reserved_bytes=479 * MIB,
                  memory_used_bytes=19818 * MIB, fans=[30, 45],
                  clocks_mhz={"graphics": 1980, "sm": 1975, "memory": 2619, "video": 1545},
                  pstate=2, clocks_event_reasons=0x4 | 0x40, pcie_generation=4, pcie_width=8,
                  engines={"encoder": 12, "decoder": 3}, ecc_corrected=5, ecc_uncorrected=1,
                  remapped_rows=(2, 1, 0, 1))
    d = one(FakeNVML([gpu]), slow=False)
    assert d.up and d.source == "nvml"
    assert d.utilization_ratio == pytest.approx(0.37)
    assert d.memory_utilization_ratio == pytest.approx(0.09)
    assert d.memory_total_bytes == 81559 * MIB
    assert d.memory_used_bytes == 19818 * MIB  # v2 "used", as nvidia-smi shows it
    assert d.memory_reserved_bytes == 479 * MIB
    assert d.memory_free_bytes == (81559 - 479 - 19818) * MIB
    assert d.temperatures_celsius == {"gpu": 62.0, "memory": 57.0}
    assert d.temperature_thresholds_celsius == {"shutdown": 92.0, "slowdown": 89.0,
                                                "max_operating": 87.0,
                                                "memory_max_operating": 95.0}
    assert d.power_watts == pytest.approx(631.25)
    assert d.power_limit_watts == pytest.approx(650.0)
    assert d.fan_speed_ratio == {"0": pytest.approx(0.30), "1": pytest.approx(0.45)}
    assert d.clocks_hertz == {"graphics": 1.98e9, "sm": 1.975e9, "memory": 2.619e9,
                              "video": 1.545e9}
    assert d.clocks_max_hertz["sm"] == 1.98e9
    assert d.performance_state == 2
    assert {k for k, v in d.throttle_reasons.items() if v} == {"sw_power_cap", "hw_thermal"}
    assert set(d.throttle_reasons) == {"idle", "sw_power_cap", "hw_slowdown", "sw_thermal",
                                       "hw_thermal", "hw_power_brake", "sync_boost",
                                       "display_clocks"}
    assert (d.pcie_link_generation, d.pcie_link_width) == (4, 8)
    assert (d.pcie_link_max_generation, d.pcie_link_max_width) == (5, 16)
    assert d.engine_utilization_ratio == {"encoder": pytest.approx(0.12),
                                          "decoder": pytest.approx(0.03)}
    assert d.ecc_errors == {"corrected": 5, "uncorrected": 1}
    assert d.remapped_rows == {"correctable": 2, "uncorrectable": 1}
    assert d.remap_failed is True


def test_default_power_limit_is_read_once_in_watts() -> None:
    """nvmlDeviceGetPowerManagementDefaultLimit (mW) as gpu_power_limit_default_watts: the
    H100 SXM's nvidia-smi -q says "Default Power Limit : 700.00 W"; one a user lowered
    to 650 W keeps its default (static: read at open, not on every cycle)."""
    nvml = FakeNVML([FakeGPU(power_limit_mw=650000, power_default_limit_mw=700000)])
    b = backend(nvml)
    d = b.sample(slow=False).devices[0]
    assert (d.power_limit_watts, d.power_limit_default_watts) == (650.0, 700.0)
    assert b.sample(slow=True).devices[0].power_limit_default_watts == 700.0
    assert nvml.calls["nvmlDeviceGetPowerManagementDefaultLimit"] == 1


def test_encoder_sessions_are_nvml_s_session_count_read_on_the_slow_tier() -> None:
    """nvmlDeviceGetEncoderStats' sessionCount (nvidia-smi's encoder.stats.sessionCount)
    as gpu_encoder_sessions: two encodes running; 0 on an H100, which has no NVENC and
    answers zeros (nvidia-smi -q: "Active Sessions : 0"), served as 0; none where the
    driver lacks the call. A new session shows on the next slow cycle."""
    nvml = FakeNVML([FakeGPU(index=0, encoder_stats=(2, 60, 1500)), FakeGPU(index=1),
                     FakeGPU(index=2, not_supported={"nvmlDeviceGetEncoderStats"})])
    b = backend(nvml)
    cycle = b.sample(slow=True)
    assert [d.encoder_sessions for d in cycle.devices] == [2, 0, None]
    assert cycle.errors == {}
    nvml.gpus[0].encoder_stats = (3, 58, 1700)
    asked = nvml.calls["nvmlDeviceGetEncoderStats"]
    assert b.sample(slow=False).devices[0].encoder_sessions == 2  # the slow tier's value
    assert nvml.calls["nvmlDeviceGetEncoderStats"] == asked
    assert b.sample(slow=True).devices[0].encoder_sessions == 3
    assert nvml.calls["nvmlDeviceGetEncoderStats"] == asked + 2  # unsupported: not asked


def test_an_idle_gpu_is_not_asked_for_process_utilisation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """nvmlDeviceGetProcessUtilization answers "not found" on a GPU no process used, at
    2-3 ms of the driver's CPU on an H200: while no process list held anyone since the
    last read it is not asked; once a process is listed it is, from the last time the
    lists were seen empty (less LATE_US), so the new process's first samples count."""
    from exporter.sources.nvidia.processes import LATE_US, ProcessReader

    t0 = 1_700_000_000.0  # the fake NVML's sample clock starts here (us: x 1e6)
    now = [t0]
    monkeypatch.setattr(ProcessReader, "wall", staticmethod(lambda: now[0]))
    monkeypatch.setattr(ProcessReader, "mono", staticmethod(lambda: now[0] - t0))
    fake = FakeNVML([FakeGPU(processes=[
        FakeProcess(pid=76, used_memory_bytes=1 << 30, sm_util=50)])])
    asked: list[int] = []
    real = fake.nvmlDeviceGetProcessUtilization
    monkeypatch.setattr(fake, "nvmlDeviceGetProcessUtilization",
                        lambda h, since: asked.append(since) or real(h, since))

    def run(seconds: range) -> None:
        for second in seconds:
            now[0] = t0 + second
            b.sample(slow=second % 10 == 0)

    b = backend(fake)
    run(range(0, 1))  # the first slow cycle asks (nothing listed yet), and lists pid 76
    fake.gpus[0].processes.clear()  # 76 exits
    run(range(1, 31))  # asked once at 10 s (76 was listed since), not at 20 s and 30 s
    assert len(asked) == 2
    now[0] = t0 + 30.5  # a process starts between two fast cycles and is listed
    fake.gpus[0].processes.append(FakeProcess(pid=77, used_memory_bytes=1 << 30, sm_util=80))
    b.sample(slow=False)
    run(range(31, 41))
    assert len(asked) == 3
    # from the empty listing before the last skipped read (the 29 s cycle), less LATE_US
    assert asked[2] == int((t0 + 29) * 1e6) - LATE_US
    fake.gpus[0].processes.clear()  # 77 exits: asked once more (at 50 s), then not
    run(range(41, 71))
    assert len(asked) == 4


def test_slow_values_in_base_units() -> None:
    gpu = FakeGPU(energy_mj=987654321, pcie_tx_kbps=7258, pcie_rx_kbps=15128, pcie_replays=9)
    d = one(FakeNVML([gpu]), slow=True)
    assert d.energy_joules == pytest.approx(987654.321)
    assert d.pcie_throughput_bytes_per_second == {"tx": 7258 * 1024.0, "rx": 15128 * 1024.0}
    assert d.pcie_replay_errors == 9


def test_slow_tier_values_reused_on_fast_cycles() -> None:
    fake = FakeNVML([FakeGPU(energy_mj=1000, energy_step_mj=500, pcie_tx_kbps=10)])
    b = backend(fake)
    first = b.sample(slow=True).devices[0]
    fake.gpus[0].pcie_tx_kbps = 20
    fake.gpus[0].power_mw = 100000
    fast = b.sample(slow=False).devices[0]
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 2  # tx + rx, once
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 1  # on the slow cycle only
    assert fast.energy_joules == first.energy_joules == 1.0
    assert fast.pcie_throughput_bytes_per_second["tx"] == 10 * 1024.0
    assert fast.power_watts == 100.0  # the fast tier moved on
    again = b.sample(slow=True).devices[0]
    # energy is a spinning counter: read every COUNTERS_EVERY-th slow cycle (the next test)
    assert again.energy_joules == 1.0
    assert again.pcie_throughput_bytes_per_second["tx"] == 20 * 1024.0


def test_first_cycle_fills_slow_values_even_when_fast() -> None:
    d = one(FakeNVML([FakeGPU(energy_mj=2000)]), slow=False)
    assert d.energy_joules == 2.0


def test_not_supported_gives_no_value_and_is_not_asked_again() -> None:
    gpu = FakeGPU(not_supported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
                                 "nvmlDeviceGetFieldValues", "nvmlDeviceGetJpgUtilization"},
                  temperature_memory=None)
    fake = FakeNVML([gpu])
    b = backend(fake)
    for slow in (True, False, True):
        cycle = b.sample(slow=slow)
    d = cycle.devices[0]
    assert cycle.errors == {}
    assert d.power_watts is None and d.energy_joules is None
    assert "memory" not in d.temperatures_celsius and d.temperatures_celsius["gpu"] == 41.0
    assert "jpeg" not in d.engine_utilization_ratio and "encoder" in d.engine_utilization_ratio
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1


def test_memory_temperature_not_supported_in_field_value() -> None:
    d = one(FakeNVML([FakeGPU(temperature_memory=None)]))
    assert d.temperatures_celsius == {"gpu": 41.0}


def test_no_fans_means_no_fan_series() -> None:
    assert one(FakeNVML([FakeGPU(fans=[])])).fan_speed_ratio == {}


def test_sentinel_values_are_filtered() -> None:
    gpu = FakeGPU(power_mw=0xFFFFFFFF, energy_mj=(1 << 64) - 1, energy_step_mj=0, pstate=32,
                  pcie_replays=0xFFFFFFFF, ecc_corrected=(1 << 64) - 1,
                  processes=[FakeProcess(pid=77, used_memory_bytes=None)])
    d = one(FakeNVML([gpu]))
    assert d.power_watts is None
    assert d.energy_joules is None
    assert d.performance_state is None
    assert d.pcie_replay_errors is None
    assert d.ecc_errors == {"uncorrected": 0}
    assert d.processes[0].pid == 77 and d.processes[0].memory_used_bytes is None


def test_values_outside_the_units_range_gate_are_dropped_and_counted() -> None:
    """NVML's power, energy, clocks and temperatures pass units' range gate, as every
    other source does: 4000 C, 200 kW or 200 GHz is garbage on every GPU made."""
    gpu = FakeGPU(temperature_gpu=4000, temperature_memory=3000, power_mw=200_000_000,
                  power_limit_mw=650000, clocks_mhz={"graphics": 200_000, "sm": 1975,
                                                     "memory": 2619, "video": 1545},
                  thresholds={"shutdown": 5000, "slowdown": 90},
                  max_clocks_mhz={"graphics": 300_000, "sm": 1980, "memory": 2619,
                                  "video": 1545})
    sample = backend(FakeNVML([gpu])).sample(slow=True)
    d = sample.devices[0]
    assert d.temperatures_celsius == {}
    assert d.power_watts is None and d.power_limit_watts == 650.0
    assert d.clocks_hertz == {"sm": 1975e6, "memory": 2619e6, "video": 1545e6}
    assert "graphics" not in d.clocks_max_hertz and d.clocks_max_hertz["sm"] == 1980e6
    assert d.temperature_thresholds_celsius == {"slowdown": 90.0}
    # thresholds and max clocks are read at open (not this cycle's count)
    assert sample.errors["parse"] == 4  # gpu and HBM temperature, power, graphics clock


def test_memory_info_v1_fallback_without_reserved() -> None:
    gpu = FakeGPU(memory_used_bytes=1000 * MIB, not_supported={"nvmlDeviceGetMemoryInfo_v2"})
    d = one(FakeNVML([gpu]))
    assert d.memory_reserved_bytes is None
    assert d.memory_used_bytes == (1000 + 479) * MIB  # v1 counts the reservation as used


def test_gpu_lost_turns_that_gpu_down_while_others_report() -> None:
    fake = FakeNVML([FakeGPU(index=0), FakeGPU(index=1, power_mw=123000)])
    b = backend(fake)
    assert [d.up for d in b.sample(slow=True).devices] == [True, True]
    fake.gpus[0].lost = True
    cycle = b.sample(slow=False)
    lost, ok = cycle.devices
    assert not lost.up and lost.info.uuid == fake.gpus[0].uuid
    assert lost.power_watts is None and lost.processes == ()
    assert ok.up and ok.power_watts == 123.0
    assert cycle.errors == {"gpu_lost": 1}
    fake.gpus[0].lost = False
    back = b.sample(slow=False).devices[0]
    assert back.up and back.power_watts == pytest.approx(69.85)
    assert back.energy_joules is not None  # slow values re-read after a loss


def test_every_gpu_lost_for_a_while_asks_for_nvml_to_be_reinitialised() -> None:
    fake = FakeNVML([FakeGPU(index=0), FakeGPU(index=1)])
    b = backend(fake)
    b.sample(slow=True)
    fake.gpus[0].lost = fake.gpus[1].lost = True
    for _ in range(ALL_LOST_REINIT - 1):
        assert [d.up for d in b.sample(slow=False).devices] == [False, False]
    with pytest.raises(BackendFailed, match="re-initialising NVML"):
        b.sample(slow=False)
    b.close()  # what the collector does, then open() again after its back-off
    assert fake.initialized == 0
    fake.gpus[0].lost = fake.gpus[1].lost = False
    assert len(b.open()) == 2 and fake.initialized == 1
    assert all(d.up for d in b.sample(slow=False).devices)


def test_gpu_lost_before_open_is_reported_down_not_dropped() -> None:
    fake = FakeNVML([FakeGPU(index=0), FakeGPU(index=1, lost=True)])
    b = NvidiaBackend(Config(), nvml=fake)
    assert len(b.open()) == 2
    assert [d.up for d in b.sample(slow=True).devices] == [True, False]


def test_init_failure_is_backend_unavailable_with_reason() -> None:
    with pytest.raises(BackendUnavailable, match="Driver Not Loaded"):
        NvidiaBackend(Config(), nvml=FakeNVML(no_gpu=True)).open()


def test_no_gpu_is_backend_unavailable_and_nvml_shut_down() -> None:
    fake = FakeNVML(gpus=[])
    with pytest.raises(BackendUnavailable, match="no usable NVIDIA GPU"):
        NvidiaBackend(Config(), nvml=fake).open()
    assert fake.initialized == 0


def test_nvml_going_bad_raises_backend_failed() -> None:
    fake = FakeNVML()
    b = backend(fake)
    b.sample(slow=True)
    fake.bad = True
    with pytest.raises(BackendFailed):
        b.sample(slow=False)


def test_one_nvml_init_for_the_life_of_the_backend() -> None:
    fake = FakeNVML([FakeGPU(index=0), FakeGPU(index=1)])
    b = backend(fake)
    for i in range(20):
        b.sample(slow=i % 10 == 0)
    assert fake.calls["nvmlInit"] == 1 and fake.initialized == 1
    b.close()
    assert fake.calls["nvmlShutdown"] == 1 and fake.initialized == 0
    b.open()  # the collector's reopen after BackendFailed
    assert fake.calls["nvmlInit"] == 2 and fake.initialized == 1


def test_xid_events_counted_per_code_across_cycles_and_reopen() -> None:
    fake = FakeNVML([FakeGPU(index=0, xids=[79, 13, 13]), FakeGPU(index=1)])
    b = backend(fake)
    before = time.time()
    first = b.sample(slow=False).devices
    assert first[0].xid_errors == {0: 0, 79: 1, 13: 2}
    assert before <= (first[0].xid_last_timestamp_seconds or 0) <= time.time()
    # Registered, no event yet: the code-0 marker alone, at 0, and no timestamp.
    assert first[1].xid_errors == {0: 0} and first[1].xid_last_timestamp_seconds is None
    fake.gpus[0].xids.append(79)
    fake.gpus[1].xids.append(48)
    second = b.sample(slow=False).devices
    assert second[0].xid_errors == {0: 0, 79: 2, 13: 2}
    assert second[1].xid_errors == {0: 0, 48: 1}
    stamp = second[1].xid_last_timestamp_seconds
    assert stamp is not None and stamp >= (first[0].xid_last_timestamp_seconds or 0)
    third = b.sample(slow=False).devices
    assert third[0].xid_errors == {0: 0, 79: 2, 13: 2}  # a counter, not a last value
    assert third[1].xid_last_timestamp_seconds == stamp  # no new event: the time stays
    b.close()
    b.open()
    again = b.sample(slow=False).devices
    assert again[0].xid_errors == {0: 0, 79: 2, 13: 2}
    assert again[1].xid_last_timestamp_seconds == stamp


def test_xid_code_zero_or_garbage_never_counted() -> None:
    fake = FakeNVML([FakeGPU(index=0, xids=[0, 1 << 40, 31])])
    cycle = backend(fake).sample(slow=False)
    assert cycle.devices[0].xid_errors == {0: 0, 31: 1}  # the marker stays 0
    assert cycle.errors == {"parse": 2}


def test_no_xid_series_for_a_gpu_not_registered() -> None:
    gpu = FakeGPU(index=0, not_supported={"nvmlDeviceRegisterEvents"})
    d = one(FakeNVML([gpu, FakeGPU(index=1)]), slow=False)
    assert d.xid_errors == {} and d.xid_last_timestamp_seconds is None


def test_gpm_profiling_ratios() -> None:
    gpm = {"graphics_util": 99.5, "sm_util": 96.1, "sm_occupancy": 14.2, "any_tensor_util": 93.3,
           "dram_bw_util": 15.6, "fp64_util": 0.0, "fp32_util": 1.5, "fp16_util": 100.4}
    d = one(FakeNVML([FakeGPU(gpm=gpm)]))
    assert d.profiling_ratio == {
        "graphics_engine_active": pytest.approx(0.995), "sm_active": pytest.approx(0.961),
        "sm_occupancy": pytest.approx(0.142), "tensor_active": pytest.approx(0.933),
        "dram_active": pytest.approx(0.156), "fp64_active": 0.0,
        "fp32_active": pytest.approx(0.015), "fp16_active": 1.0}
    assert d.source_of("profiling_ratio") == "nvml_gpm"
    assert d.source_of("power_watts") == "nvml"


def test_gpm_metric_missing_is_absent_not_zero() -> None:
    d = one(FakeNVML([FakeGPU(gpm={"sm_util": 50.0})]))
    assert d.profiling_ratio == {"sm_active": 0.5}


def test_gpm_on_slow_tier_only_and_values_reused() -> None:
    fake = FakeNVML([FakeGPU(gpm={"sm_util": 40.0})])
    b = backend(fake)
    b.sample(slow=True)
    calls = fake.calls["nvmlGpmMetricsGet"]
    fast = b.sample(slow=False).devices[0]
    assert fake.calls["nvmlGpmMetricsGet"] == calls
    assert fast.profiling_ratio == {"sm_active": 0.4}


def test_gpm_absent_before_hopper_and_when_switched_off() -> None:
    ada = one(FakeNVML([FakeGPU(architecture=8, name="NVIDIA L40S")]))
    assert ada.profiling_ratio == {} and "profiling_ratio" not in ada.field_sources
    assert ada.info.architecture == "ada"
    fake = FakeNVML()
    off = one(fake, collectors={"gpm": False})
    assert off.profiling_ratio == {} and fake.calls["nvmlGpmSampleAlloc"] == 0


def test_forced_gpm_is_checked_against_what_the_opened_backend_says() -> None:
    """--collector.gpm forced on: the start-up check opens the nvidia backend and reads
    the sub-features its capabilities say it serves: a Hopper GPU serves GPM, an Ada one
    says why not, and a backend that does not list the feature is not taken at its word."""
    from exporter.pipeline.registry import forced_but_unavailable
    from exporter.sources.base import PLAIN

    config = Config(procfs="/nonexistent", collectors={"gpm": True})
    hopper = NvidiaBackend(config, nvml=FakeNVML([FakeGPU()]))
    assert forced_but_unavailable(config, [hopper]) is None
    ada = NvidiaBackend(config, nvml=FakeNVML([FakeGPU(architecture=8, name="NVIDIA L40S")]))
    reason = forced_but_unavailable(config, [ada])
    assert reason is not None
    assert reason.startswith("--collector.gpm is on but unavailable: GPU 0: "), reason
    class Silent(NvidiaBackend):
        capabilities = PLAIN  # type: ignore[assignment]

    silent = Silent(config, nvml=FakeNVML([FakeGPU()]))
    assert forced_but_unavailable(config, [silent]) == (
        "--collector.gpm is on but unavailable: the nvidia backend does not say whether it "
        "serves it")


def test_processes_compute_and_graphics_with_proc_details() -> None:
    procfs = FIXTURES / "nvidia-h100x2" / "proc"
    gpu = FakeGPU(processes=[
        FakeProcess(pid=11345, used_memory_bytes=15690 * MIB, sm_util=99),
        FakeProcess(pid=2210, used_memory_bytes=38 * MIB, graphics=True),
        FakeProcess(pid=2210, used_memory_bytes=512 * MIB),
        FakeProcess(pid=40404, used_memory_bytes=300 * MIB, name="/opt/app/trainer"),
    ])
    fake = FakeNVML([gpu])
    b = backend(fake, procfs=procfs)
    procs = {p.pid: p for p in b.sample(slow=True).devices[0].processes}
    assert sorted(procs) == [2210, 11345, 40404]
    assert procs[11345].process == "gpu_burn"  # /proc/<pid>/comm
    assert procs[11345].memory_used_bytes == 15690 * MIB
    assert procs[11345].host_memory_bytes == 812340 * 1024  # VmRSS kB
    assert procs[11345].utilization_ratio == {"sm": 0.99}
    assert procs[2210].process == "Xorg" and procs[2210].memory_used_bytes == 512 * MIB
    assert procs[2210].utilization_ratio == {}
    assert procs[40404].process == "trainer"  # not in this /proc: NVML's name, basename
    assert procs[40404].host_memory_bytes is None
    fake.gpus[0].processes[0].sm_util = 10
    assert b.sample(slow=False).devices[0].processes[0].utilization_ratio == {"sm": 0.99}
    slow = b.sample(slow=True).devices[0].processes[0]
    assert slow.pid == 11345 and slow.utilization_ratio == {"sm": 0.10}


def test_exited_process_disappears() -> None:
    gpu = FakeGPU(processes=[FakeProcess(pid=1, used_memory_bytes=MIB),
                             FakeProcess(pid=2, used_memory_bytes=2 * MIB)])
    fake = FakeNVML([gpu])
    b = backend(fake)
    assert [p.pid for p in b.sample(slow=True).devices[0].processes] == [2, 1]
    gpu.processes.pop()
    assert [p.pid for p in b.sample(slow=False).devices[0].processes] == [1]


def test_hang_fault_blocks_until_released() -> None:
    fake = FakeNVML(hang={"function": "nvmlDeviceGetPowerUsage", "after_seconds": 0})
    b = NvidiaBackend(Config(), nvml=fake)
    b.open()
    t = threading.Thread(target=b.sample, args=(False,), daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive()
    fake.release_hang()
    t.join(2)
    assert not t.is_alive()


def _load_shim() -> Any:
    spec = importlib.util.spec_from_file_location("pynvml_shim_under_test", SHIM / "pynvml.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    os.environ.pop("FAKE_NVML_JSON", None)
    spec.loader.exec_module(mod)
    return mod


def test_shim_builds_fakes_from_json() -> None:
    shim = _load_shim()
    many = shim.build({"generate": {"gpus": 8, "processes_per_gpu": 64}})
    assert len(many.gpus) == 8 and len(many.gpus[7].processes) == 64
    assert many.gpus[7].processes[63].pid == 10000 + 7 * 1000 + 63
    config = json.loads((FIXTURES / "nvidia-h100-lost" / "nvml.json").read_text())
    fake = shim.build(config)
    assert fake.gpus[1].lost and "nvmlDeviceGetFieldValues" in fake.gpus[0].not_supported
    assert shim.build({"no_gpu": True}).no_gpu


def test_fixture_machine_h100x2() -> None:
    shim = _load_shim()
    root = FIXTURES / "nvidia-h100x2"
    fake = shim.build(json.loads((root / "nvml.json").read_text()))
    b = NvidiaBackend(Config(sysfs=str(root / "sys"), procfs=str(root / "proc")), nvml=fake)
    b.open()
    busy, idle = b.sample(slow=True).devices
    assert busy.utilization_ratio == 1.0 and busy.power_watts == pytest.approx(631.25)
    assert busy.energy_joules == pytest.approx(987654.321)
    assert busy.xid_errors == {0: 0, 79: 1, 13: 2} and idle.xid_errors == {0: 0}
    assert busy.profiling_ratio["tensor_active"] == pytest.approx(0.933)
    assert len(busy.nvlink_up) == 18 and len(idle.nvlink_up) == 17  # idle link 17 never up
    assert busy.nvlink_throughput_bytes_per_second[("5", "tx")] == 4 * (1 << 30)
    assert busy.nvlink_errors[("3", "crc_flit")] == 2
    assert busy.power_instant_watts == pytest.approx(625.68) and busy.remap_pending is True
    assert busy.info.info_labels == {"mig_mode": "disabled"}
    assert busy.memory_used_bytes == (15690 + 2566 + 38 + 512) * MIB
    assert [(p.pid, p.process) for p in busy.processes] == [
        (11345, "gpu_burn"), (11327, "memhog"), (2210, "Xorg")]
    assert {p.pid: p.memory_used_bytes for p in idle.processes} == {40404: 300 * MIB,
                                                                    30001: None}
    assert idle.info.pci_bus_id == "0000:2a:00.0"


def test_fixture_machine_lost() -> None:
    shim = _load_shim()
    root = FIXTURES / "nvidia-h100-lost"
    fake = shim.build(json.loads((root / "nvml.json").read_text()))
    b = NvidiaBackend(Config(procfs=str(root / "proc")), nvml=fake)
    b.open()
    cycle = b.sample(slow=True)
    ok, lost = cycle.devices
    assert ok.up and not lost.up
    assert ok.energy_joules is None and "memory" not in ok.temperatures_celsius
    assert ok.processes[0].process == "python3"
    assert cycle.errors == {"gpu_lost": 1}


@pytest.mark.slow
def test_shim_is_pynvml_for_a_subprocess(tmp_path: Path) -> None:
    config = tmp_path / "nvml.json"
    config.write_text(json.dumps({"gpus": [{"name": "NVIDIA H200", "power_mw": 250000}, {}]}))
    code = ("from exporter.sources.nvidia.backend import NvidiaBackend\n"
            "from exporter.core.config import Config\n"
            "import pynvml\n"
            "b = NvidiaBackend(Config())\n"
            "print([i.name for i in b.open()], b.sample(slow=True).devices[0].power_watts,"
            " pynvml.__fake_shim__)\n")
    env = {**os.environ, "PYTHONPATH": f"{SHIM}{os.pathsep}{REPO}",
           "FAKE_NVML_JSON": str(config)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.strip().splitlines()[-1] == (
        "['NVIDIA H200', 'NVIDIA H100 80GB HBM3'] 250.0 True")


def test_spinning_counters_are_read_every_third_slow_cycle_and_kept_between() -> None:
    """Total energy and the violation times cost milliseconds of driver CPU each: read on
    the first slow cycle, then every COUNTERS_EVERY-th, the last value served between."""
    from exporter.sources.nvidia.device import COUNTERS_EVERY

    fake = FakeNVML([FakeGPU(violation_ns={"power": 10**9, "thermal": 0, "sync_boost": 0})])
    b = backend(fake)
    energies = []
    for _ in range(2 * COUNTERS_EVERY + 1):
        d = b.sample(slow=True).devices[0]
        energies.append(d.energy_joules)
        assert d.energy_joules is not None and d.clock_event_seconds
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 3  # cycles 1, 4 and 7
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 3 * 3  # 3 reasons, cycles 1, 4, 7
    assert energies == sorted(energies)  # a counter never goes back
