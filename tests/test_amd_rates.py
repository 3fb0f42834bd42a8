"""XGMI throughput and MI300 throttle flags from counter deltas: never a spike, never negative."""

from __future__ import annotations

import shutil
from pathlib import Path

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.amd.rates import AccumulatorRates, ResidencyFlags
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.kernel import amdgpu_gpu_metrics_layouts as layouts
from tests.test_amd_gpu_metrics_mi300 import MI300X, build

FIXTURES = Path(__file__).parent / "fixtures"


def test_rates_from_deltas() -> None:
    r: AccumulatorRates[str] = AccumulatorRates()
    assert r.update(10.0, {"a": 1000.0}) == {}  # one reading: no rate yet
    assert r.update(12.0, {"a": 5000.0}) == {"a": 2000.0}
    assert r.update(12.0, {"a": 9000.0}) == {"a": 2000.0}  # same timestamp: cached table
    assert r.update(13.0, {"a": 10.0}) == {}  # went back (driver reload): restart, no spike
    assert r.update(14.0, {"a": 110.0}) == {"a": 100.0}
    assert r.update(15.0, {"a": 110.0 + 1e15}) == {}  # 1 PB/s is not a link
    assert r.update(16.0, {}) == {} and r.update(17.0, {"a": 1.0}) == {}  # forgotten


def test_residency_flags() -> None:
    f = ResidencyFlags()
    reasons = {"ppt": "sw_power_cap", "hbm_thm": "sw_thermal", "socket_thm": "sw_thermal"}
    assert f.update({"ppt": 5, "hbm_thm": 1}, reasons) == {}
    assert f.update({"ppt": 9, "hbm_thm": 1, "socket_thm": 0}, reasons) == {
        "sw_power_cap": True, "sw_thermal": False}
    assert f.update({"ppt": 9, "hbm_thm": 2, "socket_thm": 0}, reasons) == {
        "sw_power_cap": False, "sw_thermal": True}


def test_sysfs_backend_reports_xgmi_and_throttling_of_a_v1_8_table(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt/sys", root, symlinks=True)
    dev = (root / "class/drm/card1/device").resolve()
    b = AmdBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False))
    b.open()

    def cycle(seconds: float, read_kb: int, ppt: int) -> DeviceSample:
        values = {**MI300X, "system_clock_counter": int(seconds * 1e9),
                  "xgmi_read_data_acc": [read_kb], "xgmi_write_data_acc": [0],
                  "ppt_residency_acc": ppt}
        (dev / "gpu_metrics").write_bytes(build(layouts.V1_8, 1, 8, values))
        (d,) = b.sample(slow=False).devices
        return d

    first = cycle(1.0, 1000, 7)
    assert first.xgmi_throughput_bytes_per_second == {}
    assert first.nvlink_up == {("0", "gpu"): True, ("1", "gpu"): False}
    second = cycle(3.0, 5000, 9)  # 4000 KB in 2 s
    assert second.xgmi_throughput_bytes_per_second == {
        ("0", "rx"): 2_000_000.0, ("0", "tx"): 0.0}
    assert second.throttle_reasons["sw_power_cap"] is True
    third = cycle(4.0, 10, 9)  # the driver was reloaded: no rate, no negative value
    assert ("0", "rx") not in third.xgmi_throughput_bytes_per_second
    assert third.throttle_reasons["sw_power_cap"] is False
