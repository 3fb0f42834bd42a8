"""The driver's own word on a GPU: NVML's recovery action as a family, the NVSwitch fabric
(nvmlDeviceGetGpuFabricInfoV) as families and in the verdict, on FakeNVML and the goldens;
both reach the live page and ``gpu-exporter top`` as reasons.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.pipeline.health import DEGRADED, FAILED, HEALTHY, evaluate
from exporter.pipeline.hub import Hub
from exporter.serve import landing
from exporter.serve.history import History
from exporter.serve.tables import current
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.health import RECOVERY_ACTIONS
from tests.daemon import values_of
from tests.fakes.fake_nvml import FakeGPU, FakeNVML
from tests.fakes.nvml_real import N

GOLDEN = Path(__file__).parent / "golden"
# An HGX GPU once the fabric manager registered it; a driver with the v3 structure.
REGISTERED = {"state": 3, "status": 0, "health_mask": 0, "health_summary": 1}


def backend(gpu: FakeGPU) -> tuple[NvidiaBackend, FakeNVML]:
    fake = FakeNVML([gpu])
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=fake)
    b.open()
    return b, fake


def sample(gpu: FakeGPU) -> DeviceSample:
    b, _ = backend(gpu)
    (d,) = b.sample(slow=True).devices
    return d


@pytest.mark.parametrize("code", sorted(RECOVERY_ACTIONS))
def test_each_recovery_action_is_served_as_its_word(code: int) -> None:
    d = sample(FakeGPU(recovery_action=code))
    assert dict(d.recovery_action_info) == {RECOVERY_ACTIONS[code]: True}
    assert d.recovery_action == RECOVERY_ACTIONS[code]


def test_no_recovery_action_series_on_a_driver_without_the_field() -> None:
    b, _ = backend(FakeGPU(recovery_action=None))
    for _ in range(3):
        cycle = b.sample(slow=True)
        assert dict(cycle.devices[0].recovery_action_info) == {} and cycle.errors == {}


def test_recovery_action_on_the_fixture_golden() -> None:
    text = (GOLDEN / "mixed-faulty.prom").read_text()  # its H100 asks for a GPU reset
    assert values_of(text, "gpu_recovery_action_info", action="gpu_reset",
                     source="nvml") == [1.0]
    assert "gpu_recovery_action_info" not in (GOLDEN / "nvidia-t4.prom").read_text()


def test_xid_154_is_the_action_s_announcement_not_a_finding_of_its_own() -> None:
    """XID 154 says the recovery action changed: with the field read, only the action
    counts (a reset asked for fails the driver check; none leaves the GPU healthy)."""
    reset = sample(FakeGPU(xids=[154], recovery_action=1))
    v = evaluate(reset, max(reset.xid_seen_seconds.values()))
    assert [(f.check, f.status) for f in v.findings] == [("driver", FAILED)]
    assert v.checks["xid"] == HEALTHY
    cleared = sample(FakeGPU(xids=[154], recovery_action=0))
    assert evaluate(cleared, max(cleared.xid_seen_seconds.values())).status == HEALTHY
    # a driver without the field: the XID is all there is, unclassified (look at it)
    old = sample(FakeGPU(xids=[154], recovery_action=None))
    v = evaluate(old, max(old.xid_seen_seconds.values()))
    assert v.checks["xid"] == DEGRADED
    assert [f.reason for f in v.findings] == ["XID 154: GPU recovery action changed"]


def test_an_unknown_fabric_state_is_counted_not_served() -> None:
    b, _ = backend(FakeGPU(fabric={**REGISTERED, "state": 9}))
    cycle = b.sample(slow=True)
    assert cycle.devices[0].fabric_state is None and cycle.errors.get("parse") == 1


def test_a_gpu_in_no_fabric_serves_nothing_and_is_not_asked_again() -> None:
    b, fake = backend(FakeGPU())  # a PCIe card: NOT_SUPPORTED
    for _ in range(3):
        cycle = b.sample(slow=True)
        d = cycle.devices[0]
        assert (d.fabric_state, d.fabric_status, d.fabric_health_mask,
                d.fabric_health_summary) == (None, None, None, None)
        assert cycle.errors == {}
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 1
    assert "interconnect" not in evaluate(d, 0.0).checks


def test_a_registered_gpu_with_the_v3_structure() -> None:
    d = sample(FakeGPU(fabric=REGISTERED))
    assert (d.fabric_state, d.fabric_status, d.fabric_health_mask,
            d.fabric_health_summary) == (3, 0, 0, 1)
    v = evaluate(d, 0.0)
    assert v.checks["interconnect"] == HEALTHY and v.findings == ()


def test_a_driver_with_only_the_v2_structure_is_asked_v2_from_then_on() -> None:
    b, fake = backend(FakeGPU(fabric={"state": 3, "status": 0, "health_mask": 0}))
    for _ in range(3):
        cycle = b.sample(slow=True)
        assert cycle.errors == {}
        d = cycle.devices[0]
        assert (d.fabric_state, d.fabric_status, d.fabric_health_summary) == (3, 0, None)
    # v3 refused once (ARGUMENT_VERSION_MISMATCH), then v2 every slow cycle
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 1 + 3


def test_a_failed_registration_fails_the_interconnect_check() -> None:
    d = sample(FakeGPU(fabric={**REGISTERED, "status": N.NVML_ERROR_UNKNOWN}))
    assert (d.fabric_state, d.fabric_status) == (3, N.NVML_ERROR_UNKNOWN)
    v = evaluate(d, 0.0)
    assert v.checks["interconnect"] == FAILED and v.status == FAILED
    (finding,) = v.findings
    assert finding.code == "fabric"
    assert finding.reason == ("NVSwitch fabric registration failed (NVML error 999): "
                              "no NVLink peer-to-peer")


@pytest.mark.parametrize(("state", "words"), [(1, "not started"), (2, "in progress")])
def test_a_registration_not_yet_complete_degrades(state: int, words: str) -> None:
    d = sample(FakeGPU(fabric={**REGISTERED, "state": state}))
    assert d.fabric_state == state and d.fabric_status is None  # no result yet
    v = evaluate(d, 0.0)
    assert v.checks["interconnect"] == DEGRADED
    assert [f.reason for f in v.findings] == [
        f"NVSwitch fabric registration {words}: no NVLink peer-to-peer until it completes"]


@pytest.mark.parametrize(("fabric", "status", "reasons"), [
    ({"health_summary": 2}, FAILED, ["fabric health unhealthy"]),
    ({"health_summary": 3}, DEGRADED, ["fabric health limited capacity"]),
    # nvml.h: DEGRADED_BW TRUE (1) at shift 0; ROUTE_UNHEALTHY TRUE at shift 4
    ({"health_mask": 1 | 1 << 4}, DEGRADED, ["fabric bandwidth degraded",
                                              "fabric route unhealthy"]),
    # FALSE (2) in every two-bit field, INCORRECT_CONFIGURATION_NONE (1): all well
    ({"health_mask": 0b10101010 | 1 << 8}, HEALTHY, []),
    # INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS (5) at shift 8
    ({"health_mask": 5 << 8}, DEGRADED, ["fabric configuration: insufficient NVLinks"]),
])
def test_the_fabric_health(fabric: dict[str, int], status: int, reasons: list[str]) -> None:
    v = evaluate(sample(FakeGPU(fabric={**REGISTERED, **fabric})), 0.0)
    assert v.checks["interconnect"] == status
    assert [f.reason for f in v.findings] == reasons


def test_the_hgx_fixture_serves_its_fabric() -> None:
    text = (GOLDEN / "nvidia-h100x2.prom").read_text()
    assert values_of(text, "gpu_fabric_state", source="nvml") == [3.0, 3.0]
    assert values_of(text, "gpu_fabric_status", source="nvml") == [0.0, 0.0]
    assert values_of(text, "gpu_fabric_health_mask", source="nvml") == [0.0, 0.0]
    assert values_of(text, "gpu_fabric_health") == []  # a 550 driver: the v2 structure only
    mig = (GOLDEN / "nvidia-h100-mig.prom").read_text()  # a 590 driver: v3, its summary
    assert values_of(mig, "gpu_fabric_health", source="nvml") == [1.0]
    assert values_of(mig, "gpu_recovery_action_info", action="none") == [1.0]
    assert "gpu_fabric_state" not in (GOLDEN / "nvidia-t4.prom").read_text()


def test_the_page_and_top_say_why() -> None:
    gpu = FakeGPU(fabric={**REGISTERED, "status": N.NVML_ERROR_UNKNOWN}, recovery_action=2)
    snapshot = Hub(Config(procfs="/nonexistent"), [
        NvidiaBackend(Config(procfs="/nonexistent"), nvml=FakeNVML([gpu]))]).collect_once()
    page = landing.page(snapshot, History(900.0, 1.0), "/metrics")
    assert ("interconnect: NVSwitch fabric registration failed (NVML error 999): no NVLink "
            "peer-to-peer; driver: driver asks for recovery action node_reboot") in page
    from exporter.client.top.panels import panel

    (dev,), _ = current(snapshot)
    shown = "\n".join(line.plain for line in panel(dev, [], False, 120))
    assert "interconnect: NVSwitch fabric registration failed" in shown
    assert "driver: driver asks for recovery action node_reboot" in shown
