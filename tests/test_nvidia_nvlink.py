"""NVLink through the NVIDIA backend against FakeNVML: state, remote type, throughput, errors."""

from __future__ import annotations

import time
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.device import RARE_EVERY
from exporter.sources.nvidia.nvlink import ERRORS_EVERY, THROUGHPUT_EVERY
from tests.fakes.fake_nvml import FakeGPU, FakeNvLink, FakeNVML
from tests.fakes.nvml_real import N

GIB_KIB = 1 << 20
# NVML functions that change a GPU's state (nvml.h); the exporter calls none of them.
CHANGES_THE_GPU = ("nvmlDeviceSet", "nvmlDeviceReset", "nvmlDeviceFreeze", "nvmlDeviceClear",
                   "nvmlDeviceCreate", "nvmlGpuInstanceCreate", "nvmlGpuInstanceDestroy",
                   "nvmlComputeInstanceDestroy")


def backend(fake: FakeNVML) -> NvidiaBackend:
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=fake)
    b.open()
    return b


def links(n: int, **kw: Any) -> list[FakeNvLink]:
    return [FakeNvLink(**kw) for _ in range(n)]


def test_a_gpu_without_nvlink_has_no_series_and_stops_asking() -> None:
    fake = FakeNVML([FakeGPU(nvlinks=[])])
    b = backend(fake)
    cycle = b.sample(slow=True)
    d = cycle.devices[0]
    assert (d.nvlink_up, d.nvlink_throughput_bytes_per_second, d.nvlink_errors) == ({}, {}, {})
    assert cycle.errors == {}
    asked = fake.calls["nvmlDeviceGetNvLinkState"]
    assert asked == N.NVML_NVLINK_MAX_LINKS  # every index once, at open: all NOT_SUPPORTED
    for slow in (False, True, False):
        b.sample(slow=slow)
    assert fake.calls["nvmlDeviceGetNvLinkState"] == asked
    assert fake.calls["nvmlDeviceGetNvLinkErrorCounter"] == 0


def test_links_that_exist_and_came_up_with_their_remote_type() -> None:
    gpu = FakeGPU(nvlinks=[FakeNvLink(remote="gpu"), FakeNvLink(remote="switch"),
                           FakeNvLink(remote="npu"), FakeNvLink(remote="unknown"),
                           FakeNvLink(state=0)])
    cycle = backend(FakeNVML([gpu])).sample(slow=True)
    # Link 4 never came up: no series. Indexes past the last link (INVALID_ARGUMENT) are
    # "absent", not errors.
    assert cycle.devices[0].nvlink_up == {("0", "gpu"): True, ("1", "switch"): True,
                                          ("2", "cpu"): True, ("3", "unknown"): True}
    assert cycle.errors == {}


def test_a_link_that_goes_down_keeps_its_series_at_0_and_comes_back() -> None:
    fake = FakeNVML([FakeGPU(nvlinks=links(2))])
    b = backend(fake)
    assert b.sample(slow=True).devices[0].nvlink_up == {("0", "switch"): True,
                                                        ("1", "switch"): True}
    fake.gpus[0].nvlinks[1].state = 0
    # Link state is on the rare tier: fast and slow cycles serve the last reading.
    assert b.sample(slow=False).devices[0].nvlink_up[("1", "switch")] is True
    assert rare(b).nvlink_up[("1", "switch")] is False
    fake.gpus[0].nvlinks[1].state = 1
    assert rare(b).nvlink_up[("1", "switch")] is True


def rare(b: NvidiaBackend) -> DeviceSample:
    """The next rare cycle's sample (every RARE_EVERY-th slow one); the slow ones before
    it still serve the link state read last."""
    before = None
    for _ in range(RARE_EVERY - 1):
        up = b.sample(slow=True).devices[0].nvlink_up
        assert before is None or up == before
        before = up
    return b.sample(slow=True).devices[0]


def test_a_link_that_comes_up_later_is_picked_up() -> None:
    fake = FakeNVML([FakeGPU(nvlinks=[FakeNvLink(), FakeNvLink(state=0)])])
    b = backend(fake)
    assert set(b.sample(slow=True).devices[0].nvlink_up) == {("0", "switch")}
    fake.gpus[0].nvlinks[1].state = 1
    assert set(rare(b).nvlink_up) == {("0", "switch"), ("1", "switch")}


def test_throughput_is_the_counter_rate_from_the_first_collection() -> None:
    # The fake moves each KiB counter by its step per read, one NVML second apart.
    gpu = FakeGPU(nvlinks=links(2, tx_kib=1000, tx_step_kib=4 * GIB_KIB, rx_kib=7,
                                rx_step_kib=512))
    d = backend(FakeNVML([gpu])).sample(slow=True).devices[0]
    assert d.nvlink_throughput_bytes_per_second == {
        ("0", "tx"): 4 * GIB_KIB * 1024.0, ("0", "rx"): 512 * 1024.0,
        ("1", "tx"): 4 * GIB_KIB * 1024.0, ("1", "rx"): 512 * 1024.0}


def test_throughput_on_the_slow_tier_in_the_cycles_one_field_call() -> None:
    fake = FakeNVML([FakeGPU(nvlinks=links(3, tx_step_kib=1), temperature_memory=48,
                             power_instant_mw=70000)])
    b = backend(fake)
    # the first reading, at open: tx+rx of 3 links and the recovery action (which this
    # driver does not have: NOT_SUPPORTED, never asked again)
    assert fake.field_batches == [7]
    b.sample(slow=True)
    b.sample(slow=False)
    b.sample(slow=False)
    # one call per cycle: memory temperature + instant power, and on the slow cycle the 6
    # counters with them
    assert fake.field_batches == [7, 8, 2, 2]


def nvlink_read(b: NvidiaBackend) -> DeviceSample:
    """The slow cycle that reads NVLink throughput again (every THROUGHPUT_EVERY-th)."""
    for _ in range(THROUGHPUT_EVERY - 1):
        b.sample(slow=True)
    return b.sample(slow=True).devices[0]


def test_a_counter_that_goes_back_gives_no_rate_then_resumes() -> None:
    fake = FakeNVML([FakeGPU(nvlinks=links(1, tx_kib=10 * GIB_KIB, tx_step_kib=GIB_KIB))])
    b = backend(fake)
    assert b.sample(slow=True).devices[0].nvlink_throughput_bytes_per_second[("0", "tx")] \
        == GIB_KIB * 1024.0
    fake.gpus[0].nvlinks[0].tx_kib = 5  # driver reload: the counter restarts
    reset = nvlink_read(b).nvlink_throughput_bytes_per_second
    assert ("0", "tx") not in reset and ("0", "rx") in reset
    after = nvlink_read(b).nvlink_throughput_bytes_per_second
    assert after[("0", "tx")] == GIB_KIB * 1024.0


def test_nvlink_is_read_on_its_own_slower_tiers() -> None:
    """On the H100s an error counter costs 0.79 ms of CPU, 18 links' throughput 13 ms:
    throughput every THROUGHPUT_EVERY-th slow cycle, errors every ERRORS_EVERY-th, the last
    values served in between."""
    fake = FakeNVML([FakeGPU(nvlinks=links(2, tx_step_kib=GIB_KIB))])
    b = backend(fake)
    reads, biggest, rates = [], [], []
    for _ in range(2 * ERRORS_EVERY):
        before, batches = fake.calls["nvmlDeviceGetNvLinkErrorCounter"], len(fake.field_batches)
        d = b.sample(slow=True).devices[0]
        reads.append(fake.calls["nvmlDeviceGetNvLinkErrorCounter"] > before)
        biggest.append(max(fake.field_batches[batches:], default=0))
        rates.append(d.nvlink_throughput_bytes_per_second[("0", "tx")])
    assert reads == [i % ERRORS_EVERY == 0 for i in range(2 * ERRORS_EVERY)]
    # the 4 throughput fields (tx, rx of 2 links) join the slow batch on its cycles only
    assert [n >= 4 for n in biggest] == [i % THROUGHPUT_EVERY == 0
                                          for i in range(2 * ERRORS_EVERY)]
    assert set(rates) == {GIB_KIB * 1024.0}  # served between reads too


def test_older_driver_uses_the_utilization_counter_only_when_it_counts_bytes() -> None:
    byte_link = FakeNvLink(throughput_fields=False,
                           counter_units=N.NVML_NVLINK_COUNTER_UNIT_BYTES,
                           counter_tx_bytes=1000, counter_rx_bytes=500)
    cycle_link = FakeNvLink(throughput_fields=False,
                            counter_units=N.NVML_NVLINK_COUNTER_UNIT_CYCLES)
    fake = FakeNVML([FakeGPU(nvlinks=[byte_link, cycle_link])])
    t0 = time.monotonic()
    b = backend(fake)
    t1 = time.monotonic()
    byte_link.counter_tx_bytes += 3_000_000
    byte_link.counter_rx_bytes += 1_000_000
    time.sleep(0.05)
    t2 = time.monotonic()
    tp = b.sample(slow=True).devices[0].nvlink_throughput_bytes_per_second
    t3 = time.monotonic()
    assert set(tp) == {("0", "tx"), ("0", "rx")}  # link 1 counts cycles: no bytes to report
    assert 3_000_000 / (t3 - t0) <= tp[("0", "tx")] <= 3_000_000 / (t2 - t1)
    assert 1_000_000 / (t3 - t0) <= tp[("0", "rx")] <= 1_000_000 / (t2 - t1)
    # Never configured: no call that changes the GPU was made.
    assert not [fn for fn in fake.calls if fn.startswith(CHANGES_THE_GPU)]


def test_error_counters_per_link_and_type() -> None:
    gpu = FakeGPU(nvlinks=[FakeNvLink(errors={"crc_flit": 7, "replay": 2}),
                           FakeNvLink(errors={"recovery": 1, "crc_data": 3}),
                           FakeNvLink(state=0, errors={"replay": 99})])
    fake = FakeNVML([gpu])
    b = backend(fake)
    d = b.sample(slow=True).devices[0]
    assert d.nvlink_errors == {
        ("0", "replay"): 2, ("0", "recovery"): 0, ("0", "crc_flit"): 7, ("0", "crc_data"): 0,
        ("1", "replay"): 0, ("1", "recovery"): 1, ("1", "crc_flit"): 0, ("1", "crc_data"): 3}
    asked = fake.calls["nvmlDeviceGetNvLinkErrorCounter"]
    gpu.nvlinks[0].errors["crc_flit"] = 8
    fast = b.sample(slow=False).devices[0]
    assert fake.calls["nvmlDeviceGetNvLinkErrorCounter"] == asked  # slow tier only
    assert fast.nvlink_errors[("0", "crc_flit")] == 7  # the last slow value, reused
    for _ in range(ERRORS_EVERY - 1):
        assert b.sample(slow=True).devices[0].nvlink_errors[("0", "crc_flit")] == 7
    assert b.sample(slow=True).devices[0].nvlink_errors[("0", "crc_flit")] == 8


@pytest.mark.parametrize("remote, label", [("gpu", "gpu"), ("switch", "switch"),
                                           ("npu", "cpu"), ("unknown", "unknown")])
def test_remote_labels_follow_the_nvml_device_type(remote: str, label: str) -> None:
    d = backend(FakeNVML([FakeGPU(nvlinks=[FakeNvLink(remote=remote)])])).sample(True).devices[0]
    assert d.nvlink_up == {("0", label): True}


def test_a_lost_gpu_restarts_rates_from_a_fresh_pair() -> None:
    fake = FakeNVML([FakeGPU(nvlinks=links(1, tx_step_kib=GIB_KIB))])
    b = backend(fake)
    b.sample(slow=True)
    fake.gpus[0].lost = True
    assert not b.sample(slow=True).devices[0].up
    fake.gpus[0].lost = False
    back = b.sample(slow=True).devices[0]
    assert back.up and back.nvlink_throughput_bytes_per_second == {}  # one reading only
    assert nvlink_read(b).nvlink_throughput_bytes_per_second[("0", "tx")] == GIB_KIB * 1024.0
