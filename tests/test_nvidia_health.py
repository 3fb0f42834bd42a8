"""Health depth of the NVIDIA backend against FakeNVML: instant power, clock-event counters,
ECC by location, retired pages, row-remap pending, and the field-value batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.sources.base import BackendFailed
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.device import COUNTERS_EVERY, RARE_EVERY
from tests.fakes.fake_nvml import FakeGPU, FakeNVML, FakeProcess
from tests.fakes.nvml_real import N

H100_ECC = {"dram": (0, 0), "sram": (0, 0)}  # nvidia-smi --query-gpu on the H100 capture
VOLTA = N.NVML_DEVICE_ARCH_VOLTA


def backend(fake: FakeNVML, procfs: Path | str = "/nonexistent") -> NvidiaBackend:
    b = NvidiaBackend(Config(procfs=str(procfs)), nvml=fake)
    b.open()
    return b


def test_instant_power_next_to_the_averaged_one() -> None:
    # power.draw.average 631.95 W, power.draw.instant 625.68 W on the H100 capture under load
    d = backend(FakeNVML([FakeGPU(power_mw=631950, power_instant_mw=625680)])).sample(
        slow=False).devices[0]
    assert d.power_watts == pytest.approx(631.95)
    assert d.power_instant_watts == pytest.approx(625.68)


def test_instant_power_absent_where_not_supported_and_not_asked_again() -> None:
    fake = FakeNVML([FakeGPU(power_instant_mw=None, temperature_memory=48)])
    b = backend(fake)
    for _ in range(3):
        d = b.sample(slow=False).devices[0]
    assert d.power_instant_watts is None and d.temperatures_celsius["memory"] == 48.0
    # the first cycle's one batch (the 2 fast fields and the slow tier's recovery action,
    # NOT_SUPPORTED by this driver), then fast without instant power: dropped after its
    # first NOT_SUPPORTED
    assert fake.field_batches == [3, 1, 1]


def test_field_values_decode_by_value_type() -> None:
    gpu = FakeGPU(field_overrides={
        N.NVML_FI_DEV_POWER_INSTANT: (N.NVML_SUCCESS, N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                                      701234),
        N.NVML_FI_DEV_MEMORY_TEMP: (N.NVML_SUCCESS, N.NVML_VALUE_TYPE_SIGNED_INT, 57)})
    d = backend(FakeNVML([gpu])).sample(slow=False).devices[0]
    assert d.power_instant_watts == pytest.approx(701.234)
    assert d.temperatures_celsius["memory"] == 57.0


def test_a_field_of_an_unknown_value_type_is_dropped_and_counted() -> None:
    gpu = FakeGPU(field_overrides={N.NVML_FI_DEV_POWER_INSTANT: (N.NVML_SUCCESS, 99, 1)})
    cycle = backend(FakeNVML([gpu])).sample(slow=False)
    assert cycle.devices[0].power_instant_watts is None and cycle.errors == {"parse": 1}


def test_a_field_that_says_the_gpu_is_lost_turns_it_down() -> None:
    fake = FakeNVML([FakeGPU()])
    b = backend(fake)
    fake.gpus[0].field_overrides = {
        N.NVML_FI_DEV_MEMORY_TEMP: (N.NVML_ERROR_GPU_IS_LOST, N.NVML_VALUE_TYPE_UNSIGNED_INT, 0)}
    cycle = b.sample(slow=False)
    assert not cycle.devices[0].up and cycle.errors == {"gpu_lost": 1}


def test_a_field_that_says_nvml_is_gone_fails_the_backend() -> None:
    fake = FakeNVML([FakeGPU()])
    b = backend(fake)
    fake.gpus[0].field_overrides = {
        N.NVML_FI_DEV_POWER_INSTANT: (N.NVML_ERROR_UNINITIALIZED,
                                      N.NVML_VALUE_TYPE_UNSIGNED_INT, 0)}
    with pytest.raises(BackendFailed):
        b.sample(slow=False)


def test_other_field_errors_are_counted_and_asked_again() -> None:
    fake = FakeNVML([FakeGPU(power_instant_mw=70000)])
    b = backend(fake)
    fake.gpus[0].field_overrides = {
        N.NVML_FI_DEV_POWER_INSTANT: (N.NVML_ERROR_UNKNOWN, N.NVML_VALUE_TYPE_UNSIGNED_INT, 0)}
    cycle = b.sample(slow=False)
    assert cycle.errors == {"nvml_error": 1} and cycle.devices[0].power_instant_watts is None
    fake.gpus[0].field_overrides = {}
    assert b.sample(slow=False).devices[0].power_instant_watts == 70.0


def test_clock_event_durations_are_counters_in_seconds() -> None:
    gpu = FakeGPU(violation_ns={"power": 12_345_678_901, "thermal": 250_000_000,
                                "sync_boost": 0})
    fake = FakeNVML([gpu])
    b = backend(fake)
    d = b.sample(slow=True).devices[0]
    assert d.clock_event_seconds == {"sw_power_cap": pytest.approx(12.345678901),
                                     "sw_thermal": pytest.approx(0.25), "sync_boost": 0.0}
    asked = fake.calls["nvmlDeviceGetViolationStatus"]
    gpu.violation_ns["power"] += 1_000_000_000
    assert b.sample(slow=False).devices[0].clock_event_seconds["sw_power_cap"] == \
        pytest.approx(12.345678901)  # slow tier: the last value until the next slow cycle
    assert fake.calls["nvmlDeviceGetViolationStatus"] == asked
    # read again on the COUNTERS_EVERY-th slow cycle (tests/test_nvidia.py), kept meanwhile
    for _ in range(COUNTERS_EVERY - 1):
        assert b.sample(slow=True).devices[0].clock_event_seconds["sw_power_cap"] == \
            pytest.approx(12.345678901)
    assert b.sample(slow=True).devices[0].clock_event_seconds["sw_power_cap"] == \
        pytest.approx(13.345678901)


def test_no_clock_event_series_where_the_driver_has_none() -> None:
    d = backend(FakeNVML([FakeGPU(violation_ns=None)])).sample(slow=True).devices[0]
    assert d.clock_event_seconds == {}


def test_ecc_by_location_where_the_driver_splits_it() -> None:
    gpu = FakeGPU(ecc_locations={"dram": (3, 1), "sram": (0, 2)}, ecc_corrected=3,
                  ecc_uncorrected=3)
    fake = FakeNVML([gpu])
    b = backend(fake)
    d = b.sample(slow=True).devices[0]
    assert d.ras_errors == {("dram", "corrected"): 3, ("dram", "uncorrected"): 1,
                            ("sram", "corrected"): 0, ("sram", "uncorrected"): 2}
    assert d.ecc_errors == {"corrected": 3, "uncorrected": 3}  # the volatile totals stay
    asked = fake.calls["nvmlDeviceGetMemoryErrorCounter"]
    for _ in range(RARE_EVERY - 1):  # ECC by location is on the rare tier: kept meanwhile
        assert b.sample(slow=True).devices[0].ras_errors == d.ras_errors
    assert fake.calls["nvmlDeviceGetMemoryErrorCounter"] == asked
    b.sample(slow=True)
    # 2 locations x 2 severities answer; the 6 other locations were asked once at first.
    assert asked == 8 * 2 and fake.calls["nvmlDeviceGetMemoryErrorCounter"] == asked + 4


def test_ecc_locations_of_a_volta() -> None:
    gpu = FakeGPU(architecture=VOLTA, ecc_locations={
        "l1_cache": (1, 0), "l2_cache": (2, 0), "dram": (3, 0), "register_file": (4, 0),
        "texture_memory": (5, 0), "texture_shm": (6, 0), "cbu": (0, 7)})
    d = backend(FakeNVML([gpu])).sample(slow=True).devices[0]
    assert {b for b, _ in d.ras_errors} == {"l1_cache", "l2_cache", "dram", "register_file",
                                            "texture_memory", "texture_shm", "cbu"}
    assert d.ras_errors[("cbu", "uncorrected")] == 7


def test_retired_pages_before_ampere_only() -> None:
    volta = FakeGPU(architecture=VOLTA, retired_pages={"single_bit": 2, "double_bit": 1})
    fake = FakeNVML([volta])
    assert backend(fake).sample(slow=True).devices[0].retired_pages == {"single_bit": 2,
                                                                        "double_bit": 1}
    hopper = FakeGPU(retired_pages={"single_bit": 2, "double_bit": 1})  # never asked
    fake = FakeNVML([hopper])
    d = backend(fake).sample(slow=True).devices[0]
    assert d.retired_pages == {}
    # one batch: the 2 fast fields and the recovery action, no retired-page fields
    assert fake.field_batches == [3]


def test_remap_pending() -> None:
    d = backend(FakeNVML([FakeGPU(remapped_rows=(2, 0, 1, 0))])).sample(False).devices[0]
    assert d.remap_pending is True and d.remap_failed is False
    d = backend(FakeNVML([FakeGPU(remapped_rows=(0, 0, 0, 0))])).sample(False).devices[0]
    assert d.remap_pending is False


def test_fast_fields_in_one_call_per_cycle() -> None:
    fake = FakeNVML([FakeGPU(temperature_memory=48, power_instant_mw=70000)])
    b = backend(fake)
    for slow in (True, False, False, True):
        b.sample(slow=slow)
    # one call per cycle, the slow fields with the fast ones on a slow cycle. No NVLink,
    # Hopper: the only slow field is the recovery action, which this driver does not have
    # (NOT_SUPPORTED once, then never asked again)
    assert fake.field_batches == [3, 2, 2, 2]


def test_energy_only_on_the_slow_tier() -> None:
    fake = FakeNVML([FakeGPU()])
    b = backend(fake)
    for slow in (True, False, False, False, *(True,) * COUNTERS_EVERY):
        b.sample(slow=slow)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2


def test_process_name_and_rss_through_the_shared_readers(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "777").mkdir(parents=True)
    (proc / "777" / "comm").write_bytes(b"\x1b[31mtrain\xff\n")  # escape + invalid UTF-8
    (proc / "777" / "statm").write_text("50000 1234 256 10 0 4000 0\n")
    (proc / "777" / "status").write_text("Name:\tbogus\nVmRSS:\t999999 kB\n")
    gpu = FakeGPU(processes=[FakeProcess(pid=777, used_memory_bytes=1 << 20)])
    p = backend(FakeNVML([gpu]), procfs=proc).sample(slow=True).devices[0].processes[0]
    assert p.process == "[31mtrain\ufffd"  # control characters dropped, bytes decoded
    import os

    assert p.host_memory_bytes == 1234 * os.sysconf("SC_PAGE_SIZE")  # statm, not status


def test_host_rss_on_first_sight_then_on_the_slow_tier(tmp_path: Path) -> None:
    import os

    page = os.sysconf("SC_PAGE_SIZE")
    proc = tmp_path / "proc"
    for pid in ("11", "12"):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "comm").write_text("python3\n")
        (proc / pid / "statm").write_text("9000 100 0 0 0 0 0\n")
    gpu = FakeGPU(processes=[FakeProcess(pid=11, used_memory_bytes=1 << 20)])
    b = backend(FakeNVML([gpu]), procfs=proc)
    assert b.sample(slow=True).devices[0].processes[0].host_memory_bytes == 100 * page
    (proc / "11" / "statm").write_text("9000 200 0 0 0 0 0\n")
    gpu.processes.append(FakeProcess(pid=12, used_memory_bytes=1 << 20))
    fast = {p.pid: p.host_memory_bytes for p in b.sample(slow=False).devices[0].processes}
    assert fast == {11: 100 * page, 12: 100 * page}  # 11 unchanged until slow; 12 is new
    slow = {p.pid: p.host_memory_bytes for p in b.sample(slow=True).devices[0].processes}
    assert slow == {11: 200 * page, 12: 100 * page}
