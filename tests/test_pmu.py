"""The ``pmu`` backend on the Intel fixture machines, with the kernel's perf_event_open
answered by tests/fakes/fake_perf.py (the fixture's ``perf.json`` unless a test says
otherwise). Expected values are worked out from perf.json here, not by the backend."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample
from exporter.pipeline.registry import COLLECTORS, build_backends
from exporter.sources.base import BackendUnavailable
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.intel.pmu import PmuBackend
from tests.daemon import machine_args, running, values_of
from tests.fakes.fake_perf import FakePerf

FIXTURES = Path(__file__).parent / "fixtures"
COMETLAKE, ARC, B580 = "intel-i915-cometlake", "intel-i915-arc-a380", "intel-xe-b580"
SECOND = 1_000_000_000


def perf_json(machine: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((FIXTURES / machine / "perf.json").read_text())
    return config


def make(machine: str, kernel: FakePerf | None = None, root: Path | None = None
         ) -> tuple[PmuBackend, FakePerf]:
    sysfs = root or FIXTURES / machine / "sys"
    kernel = kernel or FakePerf(perf_json(machine))
    backend = PmuBackend(Config(sysfs=str(sysfs)), DrmDiscovery(SysFS(str(sysfs)),
                                                                 hotplug=False), kernel)
    return backend, kernel


def one(backend: PmuBackend) -> tuple[DeviceSample, dict[str, int]]:
    cycle = backend.sample(slow=False)
    (device,) = cycle.devices
    return device, dict(cycle.errors)


def test_i915_busy_ns_over_enabled_time_per_engine_class() -> None:
    backend, kernel = make(COMETLAKE)
    assert backend.open() == ()  # augmenting: the intel backend owns the GPU's identity
    pmu = perf_json(COMETLAKE)["pmus"]["12"]
    step = {config: c[1] for config, c in pmu["counters"].items()}
    device, errors = one(backend)
    assert errors == {} and device.source == "pmu" and not device.primary
    assert device.info.pci_bus_id == "0000:00:02.0"
    assert dict(device.engine_utilization_ratio) == {
        "render": step["0x0"] / pmu["time_step_ns"], "copy": 0.0,
        "video": step["0x2000"] / pmu["time_step_ns"], "video_enhance": 0.0}
    assert device.utilization_ratio == 0.25  # the busiest engine (render)
    device, _ = one(backend)
    assert device.engine_busy_seconds["render"] == pytest.approx(2 * step["0x0"] / 1e9)
    # opened on the CPU cpumask names, type from the tree, the busy counters only
    assert {(t, cpu) for t, _, cpu in kernel.opens} == {(12, 0)}
    assert sorted(c for _, c, _ in kernel.opens) == [0x0, 0x1000, 0x2000, 0x3000]


def test_two_instances_of_a_class_share_its_ratio() -> None:
    backend, _ = make(ARC)
    backend.open()
    device, _ = one(backend)
    # vcs0 busy 0.5 s, vcs1 idle, over 1 s: "video" is half of one engine's worth
    assert device.engine_utilization_ratio["video"] == 0.25
    assert device.engine_busy_seconds["video"] == 0.5
    assert device.utilization_ratio == 0.75  # ccs0


def test_xe_active_over_total_ticks_on_the_engines_the_kernel_has() -> None:
    backend, kernel = make(B580)
    backend.open()
    device, errors = one(backend)
    assert errors == {}
    # perf.json: rcs0 half the ticks, ccs0 all of them (1 of 4 ccs), vcs0 a quarter (1 of 2)
    assert dict(device.engine_utilization_ratio) == {
        "render": 0.5, "copy": 0.0, "compute": 0.25, "video": 0.125, "video_enhance": 0.0}
    assert device.engine_busy_seconds["compute"] == 1.0
    # 90 candidates probed (2 GTs x 5 classes x 9 instances); ENOENT for the missing ones
    # is the answer, not an error. The 10 engines of perf.json opened, 2 counters each.
    assert len(kernel.opens) == 20 and kernel.attempts == 180


def test_a_counter_that_goes_back_gives_no_value_and_counters_never_go_back() -> None:
    config = perf_json(COMETLAKE)
    config["pmus"]["12"]["back"] = {"0x0": 3}  # render's 3rd read is below its 2nd
    backend, _ = make(COMETLAKE, FakePerf(config))
    backend.open()
    first, _ = one(backend)
    second, errors = one(backend)
    assert errors == {"counter_reset": 1}
    assert "render" not in second.engine_utilization_ratio
    assert second.engine_utilization_ratio["video"] == 0.1  # the others carry on
    assert second.engine_busy_seconds["render"] == first.engine_busy_seconds["render"]
    third, errors = one(backend)
    assert errors == {} and third.engine_busy_seconds["render"] >= \
        second.engine_busy_seconds["render"]


def test_without_cap_perfmon_the_backend_is_down_with_the_reason() -> None:
    config = perf_json(COMETLAKE)
    config["pmus"]["12"]["open_errno"] = "EACCES"
    backend, kernel = make(COMETLAKE, FakePerf(config))
    with pytest.raises(BackendUnavailable, match="EACCES.*CAP_PERFMON.*fdinfo"):
        backend.open()
    assert kernel.attempts == 1 and kernel.open_fds == set()


@pytest.mark.parametrize("code", ["EINVAL", "ENODEV"])
def test_other_open_errors_say_which(code: str) -> None:
    config = perf_json(ARC)
    config["pmus"]["23"]["open_errno"] = code
    backend, kernel = make(ARC, FakePerf(config))
    with pytest.raises(BackendUnavailable, match=f"i915_0000_08_00.0: perf_event_open {code}"):
        backend.open()
    assert kernel.open_fds == set()


def test_a_card_whose_pmu_went_away_is_lost_then_reopened() -> None:
    config = perf_json(ARC)
    config["pmus"]["23"].update(read_errno="ENODEV", read_errno_after=2)
    backend, kernel = make(ARC, FakePerf(config))
    backend.open()  # read 1: the baseline
    assert one(backend)[1] == {}  # read 2
    cycle = backend.sample(slow=False)  # read 3: ENODEV
    assert cycle.devices == [] and cycle.errors == {"gpu_lost": 1}
    assert kernel.open_fds == set()
    before = len(kernel.opens)
    device, errors = one(backend)  # the card is still bound: a fresh group
    assert len(kernel.opens) == 2 * before and errors == {}
    assert device.engine_busy_seconds["compute"] == 1.5  # kept across the new group


@pytest.mark.parametrize("code", ["EIO", "EINVAL", "EAGAIN"])
def test_a_failing_read_is_counted_and_the_card_stays(code: str) -> None:
    config = perf_json(COMETLAKE)
    config["pmus"]["12"].update(read_errno=code, read_errno_after=1)
    backend, kernel = make(COMETLAKE, FakePerf(config))
    backend.open()
    for _ in range(3):
        cycle = backend.sample(slow=False)
        assert cycle.devices == [] and cycle.errors == {"read": 1}
    assert len(kernel.open_fds) == 4  # not closed, not reopened


def test_busy_seconds_survive_a_reopen() -> None:
    backend, _ = make(COMETLAKE)
    backend.open()
    one(backend)
    before, _ = one(backend)
    backend.close()
    backend.open()
    after, _ = one(backend)
    assert after.engine_busy_seconds["render"] > before.engine_busy_seconds["render"]


def test_no_pmu_in_the_tree_says_where_it_looked(tmp_path: Path) -> None:
    from exporter.sources.discovery import HOTPLUG_POLL, UDEV_POLL

    backend, _ = make(COMETLAKE, root=FIXTURES / "intel-xe-tigerlake" / "sys")
    assert backend.capabilities.retry_interval == HOTPLUG_POLL  # no udev for a fixture root
    with pytest.raises(BackendUnavailable, match="no i915/xe PMU under .*event_source"):
        backend.open()
    # A card without a PMU stays so until a card or driver comes (which wakes it):
    # the collector's back-off grows to UDEV_POLL meanwhile, not HOTPLUG_POLL.
    assert backend.capabilities.retry_interval == UDEV_POLL
    backend, _ = make(COMETLAKE, root=FIXTURES / "amd-polaris-rx580" / "sys")
    with pytest.raises(BackendUnavailable, match="no i915/xe card"):
        backend.open()
    assert backend.capabilities.retry_interval == HOTPLUG_POLL


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the PMU is Linux only")
def test_switch_defaults_on_and_turns_off() -> None:
    assert COLLECTORS["pmu"] is None
    assert "pmu" in [b.name for b in build_backends(Config())]
    off = Config(collectors={**COLLECTORS, "pmu": False})
    assert "pmu" not in [b.name for b in build_backends(off)]


@pytest.mark.slow
def test_daemon_without_cap_perfmon_keeps_fdinfo_engine_sums(tmp_path: Path) -> None:
    """The user's path: EACCES turns the pmu source off (once, with the reason) and the
    per-process fdinfo sums still give the engines their utilisation."""
    config = perf_json(COMETLAKE)
    config["pmus"]["12"]["open_errno"] = "EACCES"
    fake = tmp_path / "perf.json"
    fake.write_text(json.dumps(config))
    args = [*machine_args(FIXTURES / COMETLAKE), "--collector.interval", "100ms"]
    with running(args, tmp_path, env={"FAKE_PERF_JSON": str(fake)}) as daemon:
        text = daemon.get().text
        time.sleep(0.5)  # a few retries of open(): still one log line
        log = daemon.log()
    assert values_of(text, "gpu_exporter_backend_up", backend="pmu") == [0.0]
    assert values_of(text, "gpu_engine_busy_seconds_total", engine="render", source="fdinfo")
    assert not values_of(text, "gpu_engine_busy_seconds_total", source="pmu")
    downs = [line for line in log.splitlines() if "backend down" in line and '"pmu"' in line]
    assert len(downs) == 1 and "CAP_PERFMON" in downs[0]


@pytest.mark.slow
def test_daemon_with_the_pmu_serves_it_over_fdinfo(tmp_path: Path) -> None:
    with running(machine_args(FIXTURES / COMETLAKE), tmp_path) as daemon:
        text = daemon.get().text
    assert values_of(text, "gpu_exporter_backend_up", backend="pmu") == [1.0]
    assert values_of(text, "gpu_engine_utilization_ratio", engine="render", source="pmu")
    assert values_of(text, "gpu_utilization_ratio", vendor="intel", source="pmu")
    assert not values_of(text, "gpu_engine_busy_seconds_total", engine="render",
                         source="fdinfo")  # one engine, one series: the PMU's wins


def test_an_xe_pmu_without_engine_events_says_so(tmp_path: Path) -> None:
    """xe registers its PMU without engine-*-ticks where GuC has no engine activity."""
    import shutil

    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / B580 / "sys", root, symlinks=True)
    events = root / "devices" / "xe_0000_09_00.0" / "events"
    for name in ("engine-active-ticks", "engine-total-ticks"):
        (events / name).unlink()
    backend, kernel = make(B580, root=root)
    with pytest.raises(BackendUnavailable, match="xe_0000_09_00.0 lists no engine busy events"):
        backend.open()
    assert kernel.attempts == 0


def test_hotplug_closes_a_removed_cards_group_and_opens_it_when_back(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / ARC / "sys", root, symlinks=True)
    link = root / "class" / "drm" / "card0"
    target = link.readlink()
    backend, kernel = make(ARC, root=root)
    backend.open()
    assert one(backend)[1] == {}
    link.unlink()  # the card is unbound: its class link goes first
    cycle = backend.sample(slow=False)
    assert cycle.devices == [] and kernel.open_fds == set()
    link.symlink_to(target)
    device, errors = one(backend)
    assert errors == {} and len(kernel.open_fds) == 7
    assert device.engine_busy_seconds["compute"] == 1.5  # 0.75 x 2 cycles, never reset


def test_a_discrete_card_never_takes_the_integrated_gpus_pmu(tmp_path: Path) -> None:
    """The Arc's own PMU gone, the bare `i915` of an iGPU present: the Arc has no PMU."""
    import shutil

    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / ARC / "sys", root, symlinks=True)
    devices = root / "bus" / "event_source" / "devices"
    (devices / "i915_0000_08_00.0").rename(devices / "i915")
    backend, _ = make(ARC, root=root)
    with pytest.raises(BackendUnavailable, match=r"no PMU for card0 \(0000:08:00.0\)"):
        backend.open()


def test_open_twice_keeps_one_group_per_card() -> None:
    backend, kernel = make(COMETLAKE)
    backend.open()
    backend.open()
    assert len(kernel.open_fds) == 4


def test_a_card_refused_on_hotplug_is_counted_once_and_waits(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / ARC / "sys", root, symlinks=True)
    link = root / "class" / "drm" / "card0"
    target = link.readlink()
    backend, kernel = make(ARC, root=root)
    backend.open()
    link.unlink()
    backend.sample(slow=False)
    kernel.pmus["23"]["open_errno"] = "EACCES"  # e.g. the capability was dropped meanwhile
    link.symlink_to(target)
    first = backend.sample(slow=False)
    attempts = kernel.attempts
    second = backend.sample(slow=False)
    assert first.errors == {"permission": 1} and first.devices == []
    assert second.errors == {} and kernel.attempts == attempts  # no retry every cycle


def test_a_pmu_that_did_not_open_is_not_parsed_again_until_the_pmus_change(
        tmp_path: Path) -> None:
    # Retried every cycle without udev: the same cards and PMUs fail alike, so the retry
    # costs one listing, not a parse of every event and a perf_event_open per counter.
    import shutil

    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / ARC / "sys", root, symlinks=True)
    config = perf_json(ARC)
    config["pmus"]["23"]["open_errno"] = "ENODEV"
    backend, kernel = make(ARC, FakePerf(config), root=root)
    with pytest.raises(BackendUnavailable, match="i915_0000_08_00.0: perf_event_open ENODEV"):
        backend.open()
    first = kernel.attempts
    assert first > 0
    for _ in range(3):
        with pytest.raises(BackendUnavailable, match="i915_0000_08_00.0: perf_event_open ENODEV"):
            backend.open()
    assert kernel.attempts == first
    (root / "bus/event_source/devices/breakpoint").mkdir()  # a PMU registered meanwhile
    with pytest.raises(BackendUnavailable, match="ENODEV"):
        backend.open()
    assert kernel.attempts == 2 * first


def test_a_denied_pmu_is_asked_again_at_every_retry() -> None:
    # A right can be granted without any change in sysfs (perf_event_paranoid).
    config = perf_json(COMETLAKE)
    config["pmus"]["12"]["open_errno"] = "EACCES"
    backend, kernel = make(COMETLAKE, FakePerf(config))
    for _ in range(2):
        with pytest.raises(BackendUnavailable, match="EACCES"):
            backend.open()
    assert kernel.attempts == 2
