"""The energy split refuses readings no GPU can give: power far over its limit is never
integrated, an energy counter that jumps faster than that power allows moves nothing;
each refusal is counted and served under ``backend="estimate"``."""

from __future__ import annotations

import pytest

from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample, ProcessSample
from exporter.output.render.selfmetrics import exporter_families
from exporter.pipeline.energy_split import EnergySplit, Window
from exporter.pipeline.state import Snapshot
from tests.test_energy_split import Clock

INFO = DeviceInfo(vendor="nvidia", pci_bus_id="0000:3b:00.0", uuid="GPU-1")


def device(power: float | None, energy: float | None = None, gfx: float = 1.0,
           limit: float | None = 236.0) -> DeviceSample:
    return DeviceSample(info=INFO, source="nvml", power_watts=power, energy_joules=energy,
                        power_limit_watts=limit,
                        processes=(ProcessSample(pid=1, process="app",
                                                 engine_busy_seconds={"gfx": gfx}),))


def test_a_power_reading_far_over_the_limit_is_never_integrated() -> None:
    """One 99,999 W reading of a 236 W card added about 220 kJ in 2.6 s to the estimate
    and the idle share, and a counter never comes back down."""
    clock, windows = Clock(), list[Window]()
    s = EnergySplit(max_window=21.0, reading_interval=10.0, clock=clock,
                    on_window=windows.append)
    totals = []
    for n, watts in enumerate((200.0, 200.0, 99_999.0, 200.0)):
        (d,) = s.attribute(n, [device(watts, gfx=float(n))])
        totals.append((d.estimated_energy_joules, d.idle_energy_joules))
        clock.now += 2.6
    assert [t for t, _ in totals] == pytest.approx([0.0, 520.0, 520.0, 1040.0])
    assert all(idle is not None and idle < 1040.0 for _, idle in totals)
    assert s.errors == {ErrorReason.IMPLAUSIBLE: 1}
    # A card without a known limit is bounded by its unit's range only: its readings count.
    (d,) = s.attribute(9, [device(300.0, gfx=9.0, limit=None)])
    assert d.estimated_energy_joules == pytest.approx(1040.0 + 300.0 * 2.6)


def test_an_energy_counter_that_jumps_faster_than_the_power_allows_moves_nothing() -> None:
    clock, windows = Clock(), list[Window]()
    s = EnergySplit(max_window=21.0, reading_interval=10.0, clock=clock,
                    on_window=windows.append)
    s.attribute(0, [device(200.0, energy=1000.0, gfx=0.0)])
    clock.now += 10
    s.attribute(1, [device(200.0, energy=3000.0, gfx=5.0)])  # 200 W for 10 s
    clock.now += 10
    (d,) = s.attribute(2, [device(200.0, energy=3000.0 + 2.2e5, gfx=10.0)])  # 22 kW
    assert s.errors == {ErrorReason.IMPLAUSIBLE: 1}
    before = (d.processes[0].energy_joules, d.idle_energy_joules)
    assert sum(w.joules for w in windows) == 2000.0  # the jump went nowhere
    clock.now += 10
    (d,) = s.attribute(3, [device(200.0, energy=3000.0 + 2.2e5 + 2000.0, gfx=15.0)])
    assert sum(w.joules for w in windows) == 4000.0  # and counting goes on from it
    after = (d.processes[0].energy_joules, d.idle_energy_joules)
    assert after[0] is not None and before[0] is not None and after[0] > before[0]


def test_the_refusals_are_served_as_the_estimates_collection_errors() -> None:
    snapshot = Snapshot(generation=1, created=0.0, ready=True, backends=(), gpu_index={},
                        estimate_errors_total={ErrorReason.IMPLAUSIBLE: 3})
    (family,) = [f for f in exporter_families(snapshot, {})
                 if f.name == "gpu_exporter_collection_errors"]
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"backend": "estimate", "reason": "implausible"}, 3.0)]
