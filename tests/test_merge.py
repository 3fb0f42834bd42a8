"""One device, one series: the collector's merge of several backends' views of a device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from exporter.core.labels import Clock, Sensor
from exporter.core.model import (
    Allocation,
    DeviceInfo,
    DeviceSample,
    DeviceValues,
    PodRef,
    ProcessSample,
)
from exporter.pipeline.merge import (
    PROCESS_VALUE_FIELDS,
    View,
    enrich,
    merge,
    merge_device,
    merge_group,
)
from exporter.sources.base import DERIVED, KERNEL, LIBRARY

BUS = "0000:03:00.0"


def info(source: str, **kw: str) -> DeviceInfo:
    bus = kw.pop("bus", BUS)
    return DeviceInfo(vendor="amd", pci_bus_id=bus, uuid=kw.pop("uuid", f"pci-{bus}"), **kw)


def view(priority: int, *devices: DeviceSample, serving: bool = True) -> View:
    return View(priority, serving, devices)


def only(devices: Sequence[DeviceSample]) -> DeviceSample:
    assert len(devices) == 1, devices
    return devices[0]


def test_library_wins_each_value_it_has_and_sysfs_fills_the_rest() -> None:
    library = DeviceSample(info=info("amdsmi", uuid="ab12", name=""), source="amdsmi",
                           utilization_ratio=0.5, temperatures_celsius={"edge": 50.0})
    sysfs = DeviceSample(info=info("sysfs", name="Radeon RX 7800 XT", vbios_version="113"),
                         source="sysfs", utilization_ratio=0.9, power_watts=120.0,
                         temperatures_celsius={"edge": 99.0, "junction": 60.0})
    # The order the backends come in does not matter: priority does.
    d = only(merge([view(KERNEL, sysfs), view(LIBRARY, library)], {}))
    assert d.source == "amdsmi" and d.up
    assert d.utilization_ratio == 0.5 and d.source_of("utilization_ratio") == "amdsmi"
    assert d.power_watts == 120.0 and d.source_of("power_watts") == "sysfs"
    assert d.temperatures_celsius == {"edge": 50.0, "junction": 60.0}
    assert d.source_of("temperatures_celsius", "edge") == "amdsmi"
    assert d.source_of("temperatures_celsius", "junction") == "sysfs"
    # Identity: the library's non-empty fields, the rest from sysfs.
    assert d.info.uuid == "ab12" and d.info.name == "Radeon RX 7800 XT"
    assert d.info.vbios_version == "113"


def test_an_engine_belongs_to_one_source_in_both_engine_families() -> None:
    sysfs = DeviceSample(info=info("sysfs"), source="sysfs", engine_utilization_ratio={"gfx": 0.3})
    sums = DeviceSample(info=info("fdinfo"), source="fdinfo", primary=False,
                        engine_utilization_ratio={"gfx": 0.28, "dma": 0.01},
                        engine_busy_seconds={"gfx": 12.0, "dma": 1.0})
    d = only(merge([view(KERNEL, sysfs), view(DERIVED, sums)], {}))
    assert d.engine_utilization_ratio == {"gfx": 0.3, "dma": 0.01}
    # sysfs owns gfx, so fdinfo's gfx busy counter does not sit beside it.
    assert d.engine_busy_seconds == {"dma": 1.0}
    assert d.source_of("engine_utilization_ratio", "dma") == "fdinfo"


def test_processes_merge_pid_by_pid_with_the_source_of_each_field() -> None:
    library = DeviceSample(info=info("level_zero"), source="level_zero", processes=(
        ProcessSample(pid=10, process="python", memory_used_bytes=100.0),))
    sums = DeviceSample(info=info("fdinfo"), source="fdinfo", primary=False, processes=(
        ProcessSample(pid=10, process="python", memory_used_bytes=90.0,
                      engine_busy_seconds={"render": 2.0}, host_memory_bytes=5.0),
        ProcessSample(pid=11, process="Xorg", memory_used_bytes=7.0)))
    d = only(merge([view(LIBRARY, library), view(DERIVED, sums)], {}))
    by_pid = {p.pid: p for p in d.processes}
    assert set(by_pid) == {10, 11}
    p10 = by_pid[10]
    assert p10.memory_used_bytes == 100.0 and p10.source == "level_zero"
    assert p10.engine_busy_seconds == {"render": 2.0} and p10.host_memory_bytes == 5.0
    assert p10.field_sources[("engine_busy_seconds", "render")] == "fdinfo"
    assert p10.field_sources["host_memory_bytes"] == "fdinfo"
    assert "memory_used_bytes" not in p10.field_sources
    assert by_pid[11].source == "fdinfo"


def test_an_augmenting_backend_alone_makes_no_device() -> None:
    sums = DeviceSample(info=info("fdinfo"), source="fdinfo", primary=False,
                        engine_busy_seconds={"gfx": 1.0})
    assert merge([view(DERIVED, sums)], {}) == []


def test_values_only_from_serving_backends_and_up_devices() -> None:
    stale = DeviceSample(info=info("amdsmi"), source="amdsmi", power_watts=300.0)
    sysfs = DeviceSample(info=info("sysfs"), source="sysfs", power_watts=120.0)
    d = only(merge([view(LIBRARY, stale, serving=False), view(KERNEL, sysfs)], {}))
    assert d.up and d.power_watts == 120.0 and d.source == "sysfs"
    lost = DeviceSample(info=info("sysfs"), source="sysfs", up=False, power_watts=1.0)
    sums = DeviceSample(info=info("fdinfo"), source="fdinfo", primary=False,
                        engine_busy_seconds={"gfx": 1.0})
    d = only(merge([view(KERNEL, lost), view(DERIVED, sums)], {}))
    assert not d.up and d.power_watts is None and not d.engine_busy_seconds


def test_a_device_no_backend_reports_any_more_stays_down_a_slice_goes() -> None:
    gone = DeviceSample(info=info("sysfs", bus="0000:41:00.0", uuid="pci-0000:41:00.0"),
                        source="sysfs", up=False)
    here = DeviceSample(info=info("sysfs"), source="sysfs", power_watts=1.0)
    devices = merge([view(KERNEL, here)], {gone.info.key: gone, here.info.key: here})
    assert {d.info.key: d.up for d in devices} == {BUS: True, "0000:41:00.0": False}


def test_slices_and_non_pci_devices_are_joined_by_their_key() -> None:
    parent = DeviceSample(info=DeviceInfo(vendor="nvidia", pci_bus_id=BUS, uuid="GPU-1"),
                          source="nvml")
    mig = DeviceSample(info=DeviceInfo(vendor="nvidia", pci_bus_id=BUS, uuid="MIG-1",
                                       device_key="MIG-1", parent_key=BUS,
                                       slice_labels={"gpu_instance_id": "1"}),
                       source="nvml", memory_used_bytes=5.0)
    soc = DeviceSample(info=DeviceInfo(vendor="apple", pci_bus_id="", uuid="soc0",
                                       device_key="soc0"), source="macmon")
    keys = sorted(d.info.key for d in merge([view(LIBRARY, parent, mig, soc)], {}))
    assert keys == [BUS, "MIG-1", "soc0"]


class Kubelet:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def allocations(self, info: DeviceInfo) -> Sequence[Allocation]:
        if self.fail:
            raise RuntimeError("socket gone")
        return [Allocation(PodRef("ml", "trainer-0", "main"), "amd.com/gpu")]

    def pod_of(self, pid: int) -> PodRef | None:
        return PodRef("ml", "trainer-0", "main") if pid == 10 else None


def test_enrich_labels_devices_and_processes_and_survives_a_failing_enricher() -> None:
    d = DeviceSample(info=info("sysfs"), source="sysfs", processes=(
        ProcessSample(pid=10, process="python"), ProcessSample(pid=11, process="Xorg")))
    [out] = enrich([d], Kubelet())
    assert out.allocations[0].pod.pod == "trainer-0"
    assert [(p.pid, p.pod) for p in out.processes] == [(10, "trainer-0"), (11, None)]
    [out] = enrich([d], Kubelet(fail=True))
    assert out.allocations == () and len(out.processes) == 2


def test_a_vocabulary_member_and_its_string_are_one_key_in_the_merge_and_the_output() -> None:
    """Library readers key mappings with exporter.core.labels members, kernel-file readers with
    plain strings: one label value either way, so one series, owned by the priority winner."""
    library = DeviceSample(info=info("amdsmi"), source="amdsmi",
                           temperatures_celsius={Sensor.EDGE: 50.0},
                           clocks_hertz={Clock.MEMORY: 1.0e9})
    sysfs = DeviceSample(info=info("sysfs"), source="sysfs",
                         temperatures_celsius={"edge": 99.0, "junction": 60.0},
                         clocks_hertz={"memory": 2.0e9, "graphics": 2.5e9})
    d = only(merge([view(KERNEL, sysfs), view(LIBRARY, library)], {}))
    assert d.temperatures_celsius == {"edge": 50.0, "junction": 60.0}
    assert d.clocks_hertz == {"memory": 1.0e9, "graphics": 2.5e9}
    assert d.source_of("clocks_hertz", "memory") == "amdsmi"
    assert [f"{k}" for k in d.temperatures_celsius] == ["edge", "junction"]
    assert [str(k) for k in d.clocks_hertz] == ["memory", "graphics"]


def test_device_values_fragments_overlay_and_wrap_into_a_sample() -> None:
    """Readers' typed partial samples: a later fragment's values win, an absent (None or
    empty) value never hides one that is there."""
    fast = DeviceValues(power_watts=100.0, temperatures_celsius={"gpu": 60.0})
    slow = DeviceValues(energy_joules=5.0, power_watts=None, temperatures_celsius={})
    newer = DeviceValues(power_watts=120.0)
    merged = fast.overlay(slow, newer)
    assert (merged.power_watts, merged.energy_joules) == (120.0, 5.0)
    assert merged.temperatures_celsius == {"gpu": 60.0}
    assert fast.overlay() is fast and fast.power_watts == 100.0  # frozen, untouched
    d = DeviceSample.of(merged, info=info("nvml"), source="nvml")
    assert (d.source, d.power_watts, d.energy_joules) == ("nvml", 120.0, 5.0)
    assert d.clocks_hertz == {} and d.utilization_ratio is None


# -- one serving backend per device: merge_device returns the sample as the general merge
# would rebuild it (exporter.pipeline.merge._alone), or falls back to that merge.

def _same(a: DeviceSample | None, b: DeviceSample | None) -> None:
    """Equal as served: identity, every value, and the source of every value and key."""
    assert a is not None and b is not None
    assert a == b
    assert [vars(p) for p in a.processes] == [vars(p) for p in b.processes]
    assert (a.info, a.source, a.up, a.primary, a.allocations) == \
        (b.info, b.source, b.up, b.primary, b.allocations)
    assert a.present() == b.present()
    for name, value in a.present().items():
        if isinstance(value, Mapping):
            for key in value:
                assert a.source_of(name, key) == b.source_of(name, key), (name, key)
        else:
            assert a.source_of(name) == b.source_of(name), name
    assert [(p.pid, p.process, p.source, p.memory_used_bytes) for p in a.processes] == \
        [(p.pid, p.process, p.source, p.memory_used_bytes) for p in b.processes]
    for pa, pb in zip(a.processes, b.processes, strict=True):
        assert {f: getattr(pa, f) for f in PROCESS_VALUE_FIELDS} == \
            {f: getattr(pb, f) for f in PROCESS_VALUE_FIELDS}


def _procs(*pids_mem: tuple[int, float], source: str = "nvml") -> tuple[ProcessSample, ...]:
    return tuple(ProcessSample(pid=pid, process=f"p{pid}", memory_used_bytes=mem, source=source)
                 for pid, mem in pids_mem)


ALONE_CASES = {
    "plain": DeviceSample(info=info("nvml"), source="nvml", utilization_ratio=0.5,
                          power_watts=0.0, clocks_hertz={Clock.SM: 1.98e9}),
    "field-level source of a mapping": DeviceSample(
        info=info("nvml"), source="nvml", profiling_ratio={"sm_active": 0.25},
        field_sources={"profiling_ratio": "nvml_gpm"}),
    "per-key source": DeviceSample(
        info=info("amdsmi"), source="amdsmi", temperatures_celsius={Sensor.EDGE: 40.0},
        field_sources={("temperatures_celsius", Sensor.EDGE): "sysfs"}),
    "processes out of order": DeviceSample(
        info=info("nvml"), source="nvml", processes=_procs((7, 1.0), (3, 5.0), (5, 5.0))),
    "own source named": DeviceSample(info=info("nvml"), source="nvml", power_watts=3.0,
                                     field_sources={"power_watts": "nvml"}),
    "source of an absent value": DeviceSample(info=info("nvml"), source="nvml",
                                              field_sources={"power_watts": "energy"}),
    "empty mapping with a source": DeviceSample(
        info=info("nvml"), source="nvml", clocks_hertz={},
        field_sources={"clocks_hertz": "other"}),
    "duplicate pids": DeviceSample(info=info("nvml"), source="nvml",
                                   processes=_procs((3, 1.0), (3, 2.0))),
    "process of another source": DeviceSample(
        info=info("nvml"), source="nvml", processes=_procs((3, 1.0), source="fdinfo")),
    "processes with no source of their own": DeviceSample(
        info=info("nvml"), source="nvml", processes=_procs((3, 1.0), (4, 2.0), source="")),
    "processes with sources of their own": DeviceSample(
        info=info("nvml"), source="nvml", processes=(ProcessSample(
            pid=3, process="p3", memory_used_bytes=1.0, source="nvml",
            utilization_ratio={"sm": 0.5},
            field_sources={("utilization_ratio", "sm"): "other"}),)),
    "per-key source over a field's": DeviceSample(
        info=info("amdsmi"), source="amdsmi",
        temperatures_celsius={Sensor.EDGE: 40.0, Sensor.JUNCTION: 50.0},
        field_sources={"temperatures_celsius": "sysfs",
                       ("temperatures_celsius", Sensor.EDGE): "amdsmi"}),
    "device down": DeviceSample(info=info("nvml"), source="nvml", up=False, power_watts=1.0),
}


@pytest.mark.parametrize("case", ALONE_CASES)
@pytest.mark.parametrize("serving", [True, False])
def test_one_backend_per_device_merges_as_the_general_merge(case: str, serving: bool) -> None:
    group = [(view(LIBRARY, serving=serving), ALONE_CASES[case])]
    _same(merge_device(group), merge_group(group))


def test_one_backend_per_device_is_served_without_a_copy() -> None:
    sample = ALONE_CASES["plain"]
    assert merge_device([(view(LIBRARY), sample)]) is sample
