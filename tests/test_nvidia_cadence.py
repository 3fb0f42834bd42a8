"""Cadence per field on the NVIDIA backend: what a fast cycle reads, and when the slow,
rare and static tiers are read again (device.py RARE_EVERY), against FakeNVML's call
counts."""

from __future__ import annotations

from exporter.core.config import Config
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.device import RARE_EVERY
from tests.fakes.fake_nvml import FakeGPU, FakeNVML
from tests.fakes.fake_nvml_links import FakeNvLink

STATIC = ("nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetMaxClockInfo",
          "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
          "nvmlDeviceGetNumFans", "nvmlDeviceGetVbiosVersion")
RARE = ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows")
SLOW = ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetNvLinkState", "nvmlDeviceGetPcieThroughput")
FAST = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetClockInfo", "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons")


def opened(fake: FakeNVML) -> NvidiaBackend:
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=fake)
    b.open()
    b.sample(slow=True)
    return b


def nvlinked() -> FakeGPU:
    return FakeGPU(nvlinks=[FakeNvLink(), FakeNvLink()])


def test_a_fast_cycle_reads_only_fast_getters() -> None:
    fake = FakeNVML([nvlinked()])
    b = opened(fake)
    before = fake.calls.copy()
    b.sample(slow=False)
    called = {fn for fn, n in fake.calls.items() if n > before[fn]}
    assert set(FAST) <= called
    assert called.isdisjoint(STATIC + RARE + SLOW)


def test_fast_cycles_serve_the_last_rare_and_slow_values() -> None:
    gpu = FakeGPU(power_limit_mw=650000, pcie_generation=4, pcie_width=16, ecc_corrected=5,
                  remapped_rows=(2, 0, 0, 0))
    fake = FakeNVML([gpu])
    b = opened(fake)
    gpu.power_limit_mw, gpu.pcie_width, gpu.ecc_corrected, gpu.power_mw = 500000, 8, 6, 90000
    d = b.sample(slow=False).devices[0]
    assert d.power_watts == 90.0  # the fast tier moved on
    assert (d.power_limit_watts, d.ecc_errors["corrected"]) == (650.0, 5)  # rare: the last read
    assert d.remapped_rows["correctable"] == 2
    assert (d.pcie_link_generation, d.pcie_link_width) == (4, 16)  # slow: the last read
    d = b.sample(slow=True).devices[0]
    assert d.pcie_link_width == 8  # the slow tier refreshed
    assert d.power_limit_watts == 650.0  # the rare tier is not due yet


def test_rare_tier_refreshes_every_rare_every_slow_cycles() -> None:
    gpu = FakeGPU(power_limit_mw=650000, ecc_corrected=5)
    fake = FakeNVML([gpu])
    b = opened(fake)  # slow cycle 1 read the rare tier
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 1
    gpu.power_limit_mw, gpu.ecc_corrected = 500000, 7
    limits = []
    for _ in range(RARE_EVERY):
        for _ in range(9):
            b.sample(slow=False)
        limits.append(b.sample(slow=True).devices[0].power_limit_watts)
    assert limits == [650.0] * (RARE_EVERY - 1) + [500.0]
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 2
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 2 * 2  # corrected + uncorrected
    assert b.sample(slow=False).devices[0].ecc_errors["corrected"] == 7


def test_an_xid_rereads_the_rare_tier_on_the_next_cycle() -> None:
    gpu = FakeGPU(ecc_uncorrected=0, remapped_rows=(0, 0, 0, 0))
    fake = FakeNVML([gpu])
    b = opened(fake)
    gpu.ecc_uncorrected, gpu.remapped_rows = 1, (0, 1, 1, 0)
    gpu.xids.append(48)  # double-bit ECC error
    b.sample(slow=False)  # drains the XID
    d = b.sample(slow=False).devices[0]
    assert d.ecc_errors["uncorrected"] == 1 and d.remapped_rows["uncorrectable"] == 1
    assert d.remap_pending is True and d.xid_errors[48] == 1
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 2


def test_static_limits_are_read_at_open_and_after_the_gpu_was_lost() -> None:
    gpu = FakeGPU()
    fake = FakeNVML([gpu])
    b = opened(fake)
    at_open = {fn: fake.calls[fn] for fn in STATIC}
    assert at_open["nvmlDeviceGetMaxPcieLinkWidth"] == 1
    for slow in (False, True, False, True) * RARE_EVERY:
        d = b.sample(slow=slow).devices[0]
    assert d.clocks_max_hertz and d.temperature_thresholds_celsius
    assert {fn: fake.calls[fn] for fn in STATIC} == at_open
    gpu.lost = True
    assert b.sample(slow=False).devices[0].up is False
    gpu.lost, gpu.power_limit_mw = False, 400000
    d = b.sample(slow=False).devices[0]
    assert d.up and d.power_limit_watts == 400.0  # the rare tier read afresh after a loss
    assert fake.calls["nvmlDeviceGetMaxPcieLinkWidth"] == 2  # and the static one


def test_an_xid_rereads_the_link_state_on_the_next_cycle() -> None:
    gpu = nvlinked()
    fake = FakeNVML([gpu])
    b = opened(fake)
    gpu.nvlinks[1].state = 0
    assert b.sample(slow=False).devices[0].nvlink_up[("1", "switch")] is True  # not yet due
    gpu.xids.append(74)  # NVLink error
    b.sample(slow=False)
    assert b.sample(slow=False).devices[0].nvlink_up[("1", "switch")] is False
