"""The per-GPU health verdict (exporter.pipeline.health) on what the real backends read.

NVIDIA through FakeNVML (XIDs of each class, recovery actions, row remapping, ECC, NVLink,
temperatures, throttle reasons, a lost GPU); AMD and Intel through the faulty fixture
machines (tests/fixtures/build_health.py), whose verdicts in the goldens are checked here
against the fixture files, read independently.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample
from exporter.output import dcgm
from exporter.pipeline import health
from exporter.pipeline.health import DEGRADED, FAILED, HEALTHY, Verdict, evaluate
from exporter.pipeline.hub import Hub
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.intel import ze_calls as ze
from exporter.sources.intel.backend import IntelBackend
from exporter.sources.intel.level_zero import LevelZeroBackend
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.device import RARE_EVERY
from tests.daemon import machine_args, parse_samples, running, values_of
from tests.fakes.fake_nvml import FakeGPU, FakeNvLink, FakeNVML
from tests.fakes.nvml_real import N
from tests.fakes.ze_build import build_stub

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
HOUR = 3600.0


def nvidia(gpu: FakeGPU, cycles: int = 1) -> DeviceSample:
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=FakeNVML([gpu]))
    b.open()
    for _ in range(cycles):
        d = b.sample(slow=True).devices[0]
    return d


def verdict(gpu: FakeGPU, now_offset: float = 0.0) -> Verdict:
    d = nvidia(gpu)
    seen = max(d.xid_seen_seconds.values(), default=0.0)
    return evaluate(d, seen + now_offset)


def test_an_idle_h100_is_healthy_on_every_check_it_has_inputs_for() -> None:
    v = verdict(FakeGPU())
    assert v.status == HEALTHY and v.findings == ()
    assert set(v.checks) == {"thermal", "memory", "xid", "power", "pcie", "driver"}
    assert set(v.checks.values()) == {HEALTHY}


@pytest.mark.parametrize("xids", [[13], [31], [43], [45], [13, 31, 13]])
def test_application_xids_alone_never_degrade_a_gpu(xids: list[int]) -> None:
    d = nvidia(FakeGPU(xids=xids))
    assert set(d.xid_errors) >= set(xids)  # the XIDs were read: the verdict saw them
    v = evaluate(d, max(d.xid_seen_seconds.values()))
    assert v.status == HEALTHY and v.checks["xid"] == HEALTHY


@pytest.mark.parametrize(("xid", "check", "status"), [
    (79, "pcie", FAILED), (48, "memory", FAILED), (95, "memory", FAILED),
    (64, "memory", FAILED), (119, "xid", FAILED), (74, "interconnect", FAILED),
    (63, "memory", DEGRADED), (94, "memory", DEGRADED), (92, "memory", DEGRADED),
    (150, "xid", DEGRADED),  # not classified by the health rules: look at it, no drain
])
def test_xids_by_class(xid: int, check: str, status: int) -> None:
    v = verdict(FakeGPU(xids=[13, xid]))
    assert v.checks[check] == status and v.status == status
    assert [f.reason.split(":")[0] for f in v.findings] == [f"XID {xid}"]


def test_an_xid_older_than_the_window_no_longer_counts() -> None:
    assert verdict(FakeGPU(xids=[79]), now_offset=HOUR - 1).status == FAILED
    assert verdict(FakeGPU(xids=[79]), now_offset=HOUR + 1).status == HEALTHY
    d = nvidia(FakeGPU(xids=[79]))
    assert evaluate(d, max(d.xid_seen_seconds.values()) + 2 * HOUR, xid_window=3 * HOUR
                    ).status == FAILED


@pytest.mark.parametrize(("code", "name", "status"), [
    (0, "none", HEALTHY), (1, "gpu_reset", FAILED), (2, "node_reboot", FAILED),
    (3, "drain_p2p", DEGRADED), (4, "drain_and_reset", FAILED),
    (5, "recover_imex_domain", DEGRADED), (6, "bus_reset", FAILED), (7, "system_reboot", FAILED),
])
def test_recovery_action(code: int, name: str, status: int) -> None:
    d = nvidia(FakeGPU(recovery_action=code))
    assert d.recovery_action == name
    v = evaluate(d, 0.0)
    assert v.checks["driver"] == status and v.status == status


def test_a_driver_without_the_recovery_field_is_not_asked_again() -> None:
    fake = FakeNVML([FakeGPU(recovery_action=None)])
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=fake)
    b.open()
    first = b.sample(slow=True).devices[0]
    batches = len(fake.field_batches)
    second = b.sample(slow=True).devices[0]
    assert first.recovery_action is None and second.recovery_action is None
    assert fake.field_batches[batches:] == [1]  # the fast batch (HBM temperature) only


def test_an_unknown_recovery_action_is_counted_not_guessed() -> None:
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=FakeNVML([FakeGPU(recovery_action=42)]))
    b.open()
    cycle = b.sample(slow=True)
    assert cycle.devices[0].recovery_action is None and cycle.errors.get("parse") == 1


def test_row_remapping_and_ecc() -> None:
    pending = verdict(FakeGPU(remapped_rows=(2, 0, 1, 0)))
    assert pending.checks["memory"] == DEGRADED and "reset" in pending.findings[0].reason
    failed = verdict(FakeGPU(remapped_rows=(2, 5, 0, 1)))
    assert failed.checks["memory"] == FAILED and failed.status == FAILED
    ecc = verdict(FakeGPU(ecc_uncorrected=3))
    assert ecc.checks["memory"] == FAILED
    assert "3 uncorrected ECC errors" in ecc.findings[0].reason
    assert verdict(FakeGPU(ecc_corrected=1000)).status == HEALTHY  # corrected: ECC working


def test_retired_pages_pending_before_ampere() -> None:
    volta = FakeGPU(architecture=N.NVML_DEVICE_ARCH_VOLTA,
                    retired_pages={"single_bit": 1, "double_bit": 0}, retired_pending=1)
    d = nvidia(volta)
    assert d.retired_pages_pending is True
    assert evaluate(d, 0.0).checks["memory"] == DEGRADED
    volta.retired_pending = 0
    assert evaluate(nvidia(volta), 0.0).status == HEALTHY


def test_an_nvlink_that_was_up_and_went_down() -> None:
    gpu = FakeGPU(nvlinks=[FakeNvLink(), FakeNvLink()])
    fake = FakeNVML([gpu])
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=fake)
    b.open()
    assert evaluate(b.sample(slow=True).devices[0], 0.0).checks["interconnect"] == HEALTHY
    gpu.nvlinks[1].state = 0
    for _ in range(RARE_EVERY):  # the link state is read on the rare tier
        d = b.sample(slow=True).devices[0]
    v = evaluate(d, 0.0)
    assert v.checks["interconnect"] == DEGRADED and v.findings[0].reason.endswith(": 1")


@pytest.mark.parametrize(("gpu", "memory", "status"), [
    (88, 48, HEALTHY),  # 1 °C under slowdown (89)
    (89, 48, DEGRADED),  # at slowdown: the GPU slows itself down
    (92, 48, FAILED),  # at shutdown
    (41, 95, DEGRADED),  # memory at its own maximum operating temperature
])
def test_nvidia_temperatures_against_their_own_thresholds(gpu: int, memory: int,
                                                         status: int) -> None:
    v = verdict(FakeGPU(temperature_gpu=gpu, temperature_memory=memory))
    assert v.checks["thermal"] == status


@pytest.mark.parametrize(("mask", "check"), [(0x40, "thermal"), (0x20, "thermal"),
                                             (0x8, "power"), (0x80, "power")])
def test_throttle_reasons(mask: int, check: str) -> None:
    v = verdict(FakeGPU(clocks_event_reasons=mask))
    assert v.checks[check] == DEGRADED and v.status == DEGRADED
    assert verdict(FakeGPU(clocks_event_reasons=0x4)).status == HEALTHY  # sw power cap


def test_a_lost_gpu_is_failed() -> None:
    v = verdict(FakeGPU(lost=True))
    assert v.status == FAILED and v.checks == {"driver": FAILED}


def test_a_slice_gets_no_verdict_of_its_own() -> None:
    d = nvidia(FakeGPU())
    mig = DeviceSample(info=type(d.info)(vendor="nvidia", pci_bus_id=d.info.pci_bus_id,
                                         uuid="MIG-x", device_key="MIG-x",
                                         parent_key=d.info.key), source="nvml")
    assert [gpu for gpu, _, _ in health.verdicts([("0", d), ("0", mig)], 0.0)] == ["0"]


# -- the faulty fixture machines: verdicts in the goldens, against the fixture files ------

def mdeg(path: Path) -> float:
    return int(path.read_text()) / 1000


def hwmon(machine: str, bus: str) -> Path:
    (device,) = (FIXTURES / machine / "sys" / "devices").rglob(bus)
    (only,) = (device / "hwmon").iterdir()
    return only


def status(text: str, check: str | None = None, **labels: str) -> float:
    name = "gpu_health_status" if check is None else "gpu_health_check_status"
    more = {} if check is None else {"check": check}
    (value,) = values_of(text, name, **labels, **more)
    return value


def test_amd_sensors_each_against_their_own_critical_threshold() -> None:
    text = (GOLDEN / "mixed-faulty.prom").read_text()
    amd = hwmon("mixed-faulty", "0000:03:00.0")
    assert mdeg(amd / "temp2_input") >= mdeg(amd / "temp2_crit")  # junction 112 vs 110
    assert mdeg(amd / "temp3_input") >= mdeg(amd / "temp3_crit")  # memory 109 vs 108
    assert mdeg(amd / "temp2_input") < mdeg(amd / "temp2_emergency")
    assert status(text, "thermal", vendor="amd") == DEGRADED
    assert status(text, vendor="amd") == DEGRADED


def test_checks_no_rule_can_fire_for_are_not_served() -> None:
    """A PCIe link alone is no pcie rule (a narrower link is no finding), a temperature with
    no threshold of its own no thermal rule: neither check is served as a 0."""
    from exporter.core.model import DeviceInfo

    info = DeviceInfo(vendor="amd", pci_bus_id="0000:64:00.0", uuid="pci-0000:64:00.0")
    apu = DeviceSample(info=info, source="sysfs", pcie_link_width=16,
                       temperatures_celsius={"edge": 45.0})
    assert set(evaluate(apu, 0.0).checks) == {"driver"}
    # A threshold of another sensor is no rule for this one either.
    other = DeviceSample(info=info, source="sysfs", temperatures_celsius={"edge": 45.0},
                         temperature_limits_celsius={("junction", "critical"): 110.0})
    assert set(evaluate(other, 0.0).checks) == {"driver"}
    own = DeviceSample(info=info, source="sysfs", temperatures_celsius={"edge": 45.0},
                       temperature_limits_celsius={("edge", "critical"): 100.0})
    assert evaluate(own, 0.0).checks == {"thermal": HEALTHY, "driver": HEALTHY}
    hot = DeviceSample(info=info, source="sysfs", temperatures_celsius={"edge": 100.0},
                       temperature_limits_celsius={("edge", "critical"): 100.0})
    assert evaluate(hot, 0.0).checks["thermal"] == DEGRADED


def test_intel_throttling_and_package_near_its_limit() -> None:
    text = (GOLDEN / "mixed-faulty.prom").read_text()
    intel = hwmon("mixed-faulty", "0000:09:00.0")
    assert mdeg(intel / "temp2_input") < mdeg(intel / "temp2_crit")  # 99 under 100: no finding
    (reason,) = (FIXTURES / "mixed-faulty" / "sys").rglob("tile0/gt0/freq0/throttle/"
                                                        "reason_thermal")
    assert reason.read_text().strip() == "1"  # the PCU holds the clocks for temperature
    assert status(text, "thermal", vendor="intel") == DEGRADED


def test_nvidia_application_xids_and_a_recovery_action_on_the_fixture() -> None:
    text = (GOLDEN / "mixed-faulty.prom").read_text()
    assert values_of(text, "gpu_xid_errors_total", xid="13") == [1.0]
    assert status(text, "xid", vendor="nvidia") == HEALTHY  # 13 and 31: application faults
    assert status(text, "driver", vendor="nvidia") == FAILED  # recovery action GPU_RESET
    assert status(text, vendor="nvidia") == FAILED


def test_amd_ras_uncorrectable_errors_fail_the_gpu() -> None:
    text = (GOLDEN / "amd-mi300x-faulty.prom").read_text()
    (umc,) = (FIXTURES / "amd-mi300x-faulty" / "sys").rglob("ras/umc_err_count")
    assert "ue: 2" in umc.read_text()
    assert status(text, "memory", vendor="amd") == FAILED and status(text) == FAILED
    assert status(text, "interconnect", vendor="amd") == HEALTHY  # XGMI: corrected only


def test_healthy_fixture_machines_read_healthy() -> None:
    for name in ("mixed", "amd-mi300x", "intel-xe-b580", "apple-m1max", "nvidia-t4"):
        text = (GOLDEN / f"{name}.prom").read_text()
        assert set(values_of(text, "gpu_health_status")) == {HEALTHY}, name
        assert set(values_of(text, "gpu_health_check_status")) == {HEALTHY}, name


@pytest.mark.slow
def test_reasons_in_snapshot_and_on_the_landing_page(tmp_path: Path) -> None:
    machine = FIXTURES / "mixed-faulty"
    with running(machine_args(machine), tmp_path, nvml_json=machine / "nvml.json") as daemon:
        devices = {d["info"]["vendor"]: d for d in daemon.get("/snapshot").json()["devices"]}
        landing = daemon.get("/").text
    nv = devices["nvidia"]["health"]
    assert nv["status"] == "failed" and nv["checks"]["xid"] == HEALTHY
    assert nv["reasons"] == [{"check": "driver", "status": "failed", "code": "recovery_action",
                              "reason": "driver asks for recovery action gpu_reset"}]
    amd = {r["reason"] for r in devices["amd"]["health"]["reasons"]}
    assert amd == {"junction 112 °C at or above its critical 110 °C",
                   "memory 109 °C at or above its critical 108 °C"}
    assert devices["intel"]["health"]["reasons"] == [
        {"check": "thermal", "status": "degraded", "reason": "clocks held back: sw_thermal",
         "code": "throttle_thermal"}]
    assert "<h2>GPU health</h2>" in landing
    assert "driver: driver asks for recovery action gpu_reset" in landing
    assert "junction 112 °C at or above its critical 110 °C" in landing


def test_a_driver_that_does_not_know_the_recovery_field_id_is_not_asked_again() -> None:
    gpu = FakeGPU(field_overrides={N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (
        N.NVML_ERROR_INVALID_ARGUMENT, N.NVML_VALUE_TYPE_UNSIGNED_INT, 0)})
    fake = FakeNVML([gpu])
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=fake)
    b.open()
    first = b.sample(slow=True)
    batches = len(fake.field_batches)
    second = b.sample(slow=True)
    assert first.errors == {} and second.errors == {}  # not an error, every cycle
    assert second.devices[0].recovery_action is None
    assert fake.field_batches[batches:] == [1]


@pytest.mark.slow
@pytest.mark.parametrize(("uncorrected", "check", "expected"), [
    ({"programming": 5, "display": 1}, "driver", HEALTHY),  # application and display errors
    ({"cache": 3}, "memory", FAILED),
    ({"reset": 1}, "driver", DEGRADED),  # the driver had to reset an engine
    ({"compute": 2}, "driver", FAILED),
])
def test_level_zero_ras_through_the_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         uncorrected: dict[str, int], check: str,
                                         expected: int) -> None:
    counts = "\t".join(str(uncorrected.get(c, 0)) for c in ze.RAS_CATEGORIES)
    data = tmp_path / "max1550.tsv"
    data.write_text(
        "device\t0\t3a\t00\t0\t0bd5\tIntel(R) Data Center GPU Max 1550\tLQAC12345\t1.3\n"
        "ras\t0\t0\t0\t0\t3\t0\t12\t0\n"  # corrected: never a finding
        f"ras\t1\t{counts}\n")
    monkeypatch.setenv("ZE_STUB_DATA", str(data))
    lib = build_stub(tmp_path / "lib")
    b = LevelZeroBackend(Config(procfs=str(FIXTURES / "empty-proc")), library=str(lib))
    b.open()
    try:
        d = b.sample(slow=True).devices[0]
    finally:
        b.close()
    assert {k: v for k, v in d.ras_errors.items() if v and k[1] == "uncorrected"} == {
        (c, "uncorrected"): n for c, n in uncorrected.items()}
    v = evaluate(d, 0.0)
    assert v.checks[check] == expected and v.status == expected
    assert v.checks["memory"] == (FAILED if "cache" in uncorrected else HEALTHY)


def test_dcgm_mode_serves_the_verdict_as_dcgm_exporters_health_watches() -> None:
    """DCGM_EXP_GPU_HEALTH_STATUS on the two-H100 fixture: gpu 0 has XID 79 (pcie failed)
    and a pending row remap (memory degraded), read here from its nvml.json."""
    spec = json.loads((FIXTURES / "nvidia-h100x2" / "nvml.json").read_text())["gpus"][0]
    assert 79 in spec["xids"] and spec["remapped_rows"][2] == 1
    text = (GOLDEN / "dcgm" / "nvidia-h100x2.prom").read_text()

    def watch(gpu: str, name: str) -> tuple[str, float]:
        found = [(dict(ls)["health_error_code"], v) for (n, ls), v in parse_samples(text).items()
                 if n == "DCGM_EXP_GPU_HEALTH_STATUS" and dict(ls)["gpu"] == gpu
                 and dict(ls)["health_watch"] == name]
        assert len(found) == 1, (gpu, name, found)
        return found[0]

    assert watch("0", "PCIE") == ("DCGM_FR_XID_ERROR", 20.0)
    assert watch("0", "MEM") == ("DCGM_FR_PENDING_ROW_REMAP", 10.0)
    assert watch("0", "THERMAL") == ("DCGM_FR_OK", 0.0)
    assert watch("1", "PCIE") == ("DCGM_FR_OK", 0.0)
    assert {dict(ls)["health_watch"] for (n, ls), _ in parse_samples(text).items()
            if n == "DCGM_EXP_GPU_HEALTH_STATUS"} <= set(dcgm.HEALTH_WATCHES.values())


@pytest.mark.parametrize(("machine", "bus", "make"), [
    ("amd-rdna3-rx7800xt", "0000:03:00.0", AmdBackend),
    ("intel-xe-b580", "0000:09:00.0", IntelBackend),
])
def test_a_card_that_is_gone_fails_its_gpu(tmp_path: Path, machine: str, bus: str,
                                           make: type[AmdBackend] | type[IntelBackend]) -> None:
    sys_root = tmp_path / "sys"
    shutil.copytree(FIXTURES / machine / "sys", sys_root, symlinks=True)
    config = Config(sysfs=str(sys_root), interval=0.1)
    discovery = DrmDiscovery(SysFS(sys_root), hotplug=False)
    hub = Hub(config, [make(config, discovery)])
    hub.start()

    def verdict() -> Verdict | None:
        found = [v for _, d, v in hub.snapshot.health if d.info.pci_bus_id == bus]
        return found[0] if found else None

    try:
        deadline = time.monotonic() + 5
        while (v := verdict()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert v is not None and v.checks["driver"] == HEALTHY
        for link in (sys_root / "class" / "drm").iterdir():  # udev says "remove"
            link.unlink()
        discovery.rescan()
        while (v := verdict()) is not None and v.status != FAILED \
                and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        assert v is not None and v.status == FAILED and v.checks == {"driver": FAILED}
        assert v.findings[0].code == "gpu_unreadable"
    finally:
        hub.stop()
