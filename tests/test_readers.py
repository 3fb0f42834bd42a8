"""Readings only a reader sees are taken when a reader came since (exporter.sources.readers).

NVIDIA's NVLink throughput and error counters, GPM ratios, PCIe throughput and
clock-event times: no health verdict, live-page chart or energy split uses them, so the
backend takes them on their tier only when a scrape, ``/snapshot`` or push came since
the last time; the first reading is always taken. Checked against FakeNVML's call
counts, and through the daemon's renderer and server, which mark the reads.
"""

from __future__ import annotations

from exporter.core.config import Config
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.device import RARE_EVERY
from exporter.sources.nvidia.nvlink import ERRORS_EVERY
from exporter.sources.readers import Readers, Wanted
from tests.fakes.fake_nvml import FakeGPU, FakeNvLink, FakeNVML, FakeProcess

GATED = ("nvmlDeviceGetNvLinkErrorCounter", "nvmlGpmSampleGet", "nvmlDeviceGetPcieThroughput",
         "nvmlDeviceGetViolationStatus")
# The energy counter and per-process utilisation feed the energy split: never gated.
UNGATED = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetProcessUtilization")


def gpu() -> FakeGPU:
    # A process on it: with none listed, per-process utilisation is not asked for at all
    # (tests/test_nvidia.py, test_an_idle_gpu_is_not_asked_for_process_utilisation).
    return FakeGPU(nvlinks=[FakeNvLink(tx_step_kib=1), FakeNvLink(tx_step_kib=1)],
                   violation_ns={"power": 5, "thermal": 0, "sync_boost": 0},
                   gpm={"sm_util": 40.0}, power_instant_mw=70000,
                   processes=[FakeProcess(pid=4242, used_memory_bytes=1 << 30, sm_util=30)])


def opened(fake: FakeNVML, readers: Readers) -> NvidiaBackend:
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=fake, readers=readers)
    b.open()
    return b


def calls(fake: FakeNVML) -> dict[str, int]:
    return {fn: fake.calls[fn] for fn in (*GATED, "nvmlDeviceGetFieldValues", *UNGATED)}


def test_wanted_is_due_first_then_only_after_a_read() -> None:
    readers = Readers()
    wanted = Wanted(readers)
    assert [wanted.due(), wanted.due()] == [True, False]
    readers.read()
    readers.read()
    assert [wanted.due(), wanted.due()] == [True, False]  # two reads: one reading
    wanted.reset()
    assert wanted.due() is True
    always = Wanted(Readers(always=True))
    assert [always.due(), always.due()] == [True, True]


def test_unread_the_gated_readings_are_taken_once_then_when_a_reader_came() -> None:
    fake = FakeNVML([gpu()])
    readers = Readers()
    b = opened(fake, readers)
    first = b.sample(slow=True).devices[0]  # the first slow cycle reads every one
    assert first.nvlink_errors and first.nvlink_throughput_bytes_per_second
    assert first.profiling_ratio and first.pcie_throughput_bytes_per_second
    assert first.clock_event_seconds == {"sw_power_cap": 5e-9, "sw_thermal": 0.0,
                                         "sync_boost": 0.0}
    after_first = calls(fake)
    assert all(after_first[fn] for fn in GATED)
    for _ in range(2 * ERRORS_EVERY):  # every tier comes round twice, nobody reads
        d = b.sample(slow=True).devices[0]
    again = calls(fake)
    assert {fn: again[fn] for fn in GATED} == {fn: after_first[fn] for fn in GATED}
    # served from the last reading meanwhile, never dropped
    assert d.nvlink_errors == first.nvlink_errors and d.profiling_ratio == first.profiling_ratio
    assert d.pcie_throughput_bytes_per_second == first.pcie_throughput_bytes_per_second
    # the energy counter and the per-process utilisation keep their cadence
    assert all(again[fn] > after_first[fn] for fn in UNGATED)
    readers.read()  # a scrape
    for _ in range(ERRORS_EVERY):
        b.sample(slow=True)
    after_read = calls(fake)
    # each gated reading taken once more on its next due cycle, not on every one
    assert {fn: after_read[fn] - again[fn] for fn in GATED} == {
        "nvmlDeviceGetNvLinkErrorCounter": 2 * 4,  # 2 links x 4 counters, once
        "nvmlGpmSampleGet": 1, "nvmlDeviceGetPcieThroughput": 2,  # tx and rx
        "nvmlDeviceGetViolationStatus": 3}


def test_unread_nvlink_throughput_fields_leave_the_batch() -> None:
    fake = FakeNVML([gpu()])
    b = opened(fake, Readers())
    b.sample(slow=True)  # the first cycle: the fast fields and 2 x 2 counters (the recovery
    # action answered NOT_SUPPORTED at open, in this fake: not asked again)
    assert fake.field_batches[-1] == 2 + 4
    for _ in range(RARE_EVERY):
        b.sample(slow=True)
    assert fake.field_batches[-1] == 2  # the rare cycle, unread: fast fields only


def test_the_rate_after_a_read_is_the_average_since_the_last_reading() -> None:
    fake = FakeNVML([gpu()])
    readers = Readers()
    b = opened(fake, readers)
    b.sample(slow=True)
    link = fake.gpus[0].nvlinks[0]
    for _ in range(2 * RARE_EVERY):  # unread: the counter moves, nothing reads it
        b.sample(slow=True)
    link.tx_kib += 99 * 1024  # 99 MiB more by the next read, one NVML second later
    readers.read()
    for _ in range(RARE_EVERY):
        d = b.sample(slow=True).devices[0]
    assert d.nvlink_throughput_bytes_per_second[("0", "tx")] == (99 * 1024 + 1) * 1024.0


def test_always_reads_on_every_due_cycle() -> None:
    fake = FakeNVML([gpu()])
    b = opened(fake, Readers(always=True))
    b.sample(slow=True)
    before = calls(fake)
    for _ in range(ERRORS_EVERY):
        b.sample(slow=True)
    after = calls(fake)
    assert after["nvmlGpmSampleGet"] - before["nvmlGpmSampleGet"] == ERRORS_EVERY
    assert after["nvmlDeviceGetNvLinkErrorCounter"] - before["nvmlDeviceGetNvLinkErrorCounter"] \
        == 2 * 4


def test_metrics_and_snapshot_count_as_reads_the_page_does_not() -> None:
    import httpx

    from exporter.output.render import Renderer
    from exporter.pipeline.hub import Hub
    from exporter.serve.server import build_app
    from tests.test_server_hardening import in_process_server

    readers = Readers()
    hub = Hub(Config(), [])
    renderer = Renderer(readers=readers)
    renderer.render_now(hub.collect_once())
    try:
        with in_process_server(build_app(Config(), hub, renderer)) as port:
            def get(path: str) -> int:
                return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code

            assert readers.count == 0
            assert get("/metrics") == 200 and readers.count == 1
            assert get("/snapshot") == 200 and readers.count == 2
            assert get("/-/ready") == 200 and get("/api/v1/history") == 200
            assert readers.count == 2  # the page and its history show none of those readings
    finally:
        renderer.stop()


def test_the_daemon_counts_reads_unless_it_pushes() -> None:
    from exporter.pipeline.registry import Shared

    assert Shared(Config()).readers.always is False
    assert Shared(Config(otlp_endpoint="http://127.0.0.1:4318")).readers.always is True
