"""Per-process GPU energy (exporter.pipeline.energy_split) on fixture machines and synthetic runs.

The fixture checks run the real backends (amdgpu or i915 sysfs + the fdinfo scan) in a
Hub over two moments of ``tests/fixtures/energy-split`` (tests/fixtures/build_energy.py),
10 s apart on the split's clock, and compare what the split attributed with numbers
computed here from the fixture files alone: the fdinfo engine nanoseconds of each
process, the GPU's energy file.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceInfo, DeviceSample, ProcessSample
from exporter.output.render.exposition import snapshot_families
from exporter.output.render.families import RenderOptions
from exporter.pipeline.energy_split import SOURCE, EnergySplit, Window
from exporter.pipeline.hub import Hub
from exporter.pipeline.state import Snapshot
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.fdinfo.backend import FdinfoBackend
from tests.fakes.fake_nvml import FakeGPU, FakeNVML, FakeProcess

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SPLIT = FIXTURES / "energy-split"
WINDOW = 10.0  # seconds between the two moments, on the split's clock


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- numbers from the fixture files, read here --------------------------------------------

def engine_ns(proc: Path) -> dict[int, dict[str, int]]:
    """pid -> engine -> ns, each DRM client (drm-client-id) counted once."""
    out: dict[int, dict[str, int]] = {}
    seen: set[str] = set()
    for pid_dir in sorted(p for p in proc.iterdir() if p.name.isdigit()):
        for info in sorted((pid_dir / "fdinfo").iterdir()):
            fields = {}
            for line in info.read_text().splitlines():
                key, _, val = line.partition(":")
                fields[key.strip()] = val.strip()
            client = fields.get("drm-client-id")
            if client is None or client in seen:
                continue
            seen.add(client)
            for key, val in fields.items():
                if key.startswith("drm-engine-") and val.endswith(" ns"):
                    engines = out.setdefault(int(pid_dir.name), {})
                    name = key.removeprefix("drm-engine-")
                    engines[name] = engines.get(name, 0) + int(val.removesuffix(" ns"))
    return out


def expected_split(machine: str, joules: float) -> tuple[dict[int, float], float]:
    """Each process's joules and idle from the fixture's fdinfo alone: the busiest engine's
    share of the window is the busy fraction, split by each process's busy ns."""
    before = engine_ns(SPLIT / machine / "0" / "proc")
    after = engine_ns(SPLIT / machine / "1" / "proc")
    busy = {pid: {e: ns - before[pid].get(e, 0) for e, ns in engines.items()}
            for pid, engines in after.items() if pid in before}
    per_engine: dict[str, int] = {}
    for engines in busy.values():
        for e, ns in engines.items():
            per_engine[e] = per_engine.get(e, 0) + ns
    fraction = min(1.0, max(per_engine.values()) / 1e9 / WINDOW)
    total = sum(per_engine.values())
    parts = {pid: joules * fraction * sum(e.values()) / total
             for pid, e in busy.items() if sum(e.values())}
    return parts, joules - sum(parts.values())


# -- the two moments through the real backends --------------------------------------------

def _machine(tmp: Path, machine: str) -> tuple[Path, Path]:
    sys_root = tmp / "sys"
    shutil.copytree(FIXTURES / machine / "sys", sys_root, symlinks=True)
    shutil.copytree(SPLIT / machine / "0" / "proc", tmp / "proc", symlinks=True)
    return sys_root, tmp / "proc"


def _second_moment(tmp: Path, machine: str, energy_file: Path) -> None:
    shutil.rmtree(tmp / "proc")
    shutil.copytree(SPLIT / machine / "1" / "proc", tmp / "proc", symlinks=True)
    new = SPLIT / machine / "1" / energy_file.name
    energy_file.write_bytes(new.read_bytes())


def _run(tmp: Path, machine: str, vendor_backend: Any, energy_glob: str
         ) -> tuple[list[Window], Snapshot, Snapshot]:
    sys_root, proc = _machine(tmp, machine)
    config = Config(sysfs=str(sys_root), procfs=str(proc),
                    amdgpu_ids=str(FIXTURES / machine / "usr/share/libdrm/amdgpu.ids"))
    discovery = DrmDiscovery(SysFS(str(sys_root)), hotplug=False)
    clock, windows = Clock(), list[Window]()
    # The /proc scan times its reads on the same clock: the fixture's counters move by
    # WINDOW seconds of busy time, which a real clock would not have let pass.
    hub = Hub(config, [vendor_backend(config, discovery),
                       FdinfoBackend(config, discovery, clock=clock)])
    hub.energy.clock, hub.energy.on_window = clock, windows.append
    first = hub.collect_once()
    first.devices  # noqa: B018 - merged (and fed) before the files change
    (energy_file,) = sys_root.glob(energy_glob)
    _second_moment(tmp, machine, energy_file)
    clock.now += WINDOW
    second = hub.collect_once()
    second.devices  # noqa: B018
    return windows, first, second


def _device(s: Snapshot, vendor: str) -> DeviceSample:
    (d,) = [d for _, d in s.devices if d.info.vendor == vendor and not d.info.parent_key]
    return d


def _amd(config: Config, discovery: DrmDiscovery) -> Any:
    from exporter.sources.amd.backend import AmdBackend
    return AmdBackend(config, discovery)


def _intel(config: Config, discovery: DrmDiscovery) -> Any:
    from exporter.sources.intel.backend import IntelBackend
    return IntelBackend(config, discovery)


def test_amd_split_is_the_fdinfo_engine_time_split_of_the_counter(tmp_path: Path) -> None:
    windows, first, second = _run(tmp_path, "amd-mi300x", _amd, "devices/**/gpu_metrics")
    before, after = _device(first, "amd"), _device(second, "amd")
    assert before.energy_joules is not None and after.energy_joules is not None
    joules = after.energy_joules - before.energy_joules
    assert joules == 1500.0  # the fixture's accumulator gain: 98 304 000 x 2^-16 J
    (w,) = windows
    assert w.seconds == WINDOW and w.joules == joules
    parts, idle = expected_split("amd-mi300x", joules)
    assert parts.keys() == {4100, 4200}  # notebook idle, prep gone, eval new
    assert w.parts == pytest.approx(parts)
    assert w.parts[4100] / w.parts[4200] == pytest.approx(3.0)
    assert w.idle == pytest.approx(idle)
    assert sum(w.parts.values()) + w.idle == pytest.approx(joules)
    energy = {p.pid: p.energy_joules for p in after.processes}
    assert energy[4100] == pytest.approx(parts[4100])
    assert energy[4300] == 0.0 and energy[4500] == 0.0  # idle, and new at this moment
    assert 4400 not in energy  # exited: its series went with its row
    assert after.idle_energy_joules == pytest.approx(idle)
    assert after.source_of("idle_energy_joules") == SOURCE


def test_intel_split_counts_every_engine_and_the_busiest_sets_the_busy_share(
        tmp_path: Path) -> None:
    windows, first, second = _run(tmp_path, "intel-i915-arc-a380", _intel,
                                  "devices/**/hwmon/*/energy1_input")
    (hwmon,) = (FIXTURES / "intel-i915-arc-a380" / "sys" / "class" / "hwmon").iterdir()
    joules = (int((SPLIT / "intel-i915-arc-a380" / "1" / "energy1_input").read_text())
              - int((hwmon / "energy1_input").read_text())) / 1e6
    after = _device(second, "intel")
    assert after.energy_joules is not None
    assert after.energy_joules - (_device(first, "intel").energy_joules or 0) == \
        pytest.approx(joules)
    (w,) = windows
    parts, idle = expected_split("intel-i915-arc-a380", joules)
    assert w.parts == pytest.approx(parts)
    assert w.parts[5100] / w.parts[5200] == pytest.approx(3.0)
    assert sum(w.parts.values()) == pytest.approx(0.3 * joules)  # render: 3 s of 10
    assert w.idle == pytest.approx(idle)


def test_a_dgpu_without_an_energy_counter_splits_its_power_over_time(tmp_path: Path) -> None:
    """An RDNA3 dGPU: no energy counter (hwmon power1_average only, gpu_metrics without an
    accumulator), engine time moving in fdinfo. Its power over the window is the energy
    it splits, served as gpu_estimated_energy_joules_total."""
    windows, first, second = _run(tmp_path, "amd-rdna3-rx7800xt", _amd,
                                  "devices/**/hwmon/*/power1_average")
    before, after = _device(first, "amd"), _device(second, "amd")
    assert before.energy_joules is None and after.energy_joules is None  # no counter
    watts = int((SPLIT / "amd-rdna3-rx7800xt" / "1" / "power1_average").read_text()) / 1e6
    assert after.power_watts == watts == 180.0
    joules = watts * WINDOW  # the power read at the second moment counts for the window
    assert before.estimated_energy_joules == 0.0
    assert after.estimated_energy_joules == pytest.approx(joules)
    assert after.source_of("estimated_energy_joules") == SOURCE
    (w,) = windows
    assert w.seconds == WINDOW and w.joules == pytest.approx(joules)
    parts, idle = expected_split("amd-rdna3-rx7800xt", joules)
    assert parts.keys() == {6100, 6200}  # notebook idle
    assert w.parts == pytest.approx(parts)
    assert w.parts[6100] / w.parts[6200] == pytest.approx(4.0)  # 3 s gfx + 1 s compute : 1 s
    assert sum(w.parts.values()) == pytest.approx(0.4 * joules)  # gfx busy 4 s of 10
    assert w.idle == pytest.approx(idle)
    energy = {p.pid: p.energy_joules for p in after.processes}
    assert energy == pytest.approx({6100: parts[6100], 6200: parts[6200], 6300: 0.0})
    assert after.idle_energy_joules == pytest.approx(idle)
    served = {s.name: s for m in snapshot_families(second) for s in m.samples
              if s.name.startswith(("gpu_estimated_energy", "gpu_energy_joules"))}
    assert set(served) == {"gpu_estimated_energy_joules_total"}  # no measured counter
    estimate = served["gpu_estimated_energy_joules_total"]
    assert estimate.value == pytest.approx(joules) and estimate.labels["source"] == SOURCE


def test_served_energy_series_are_estimates_with_the_process_labels(tmp_path: Path) -> None:
    _, _, second = _run(tmp_path, "amd-mi300x", _amd, "devices/**/gpu_metrics")
    samples = [s for m in snapshot_families(second) for s in m.samples
               if s.name in ("gpu_process_energy_joules_total", "gpu_idle_energy_joules_total")]
    assert {s.labels["source"] for s in samples} == {SOURCE}
    pids = {s.labels["pid"] for s in samples if s.name == "gpu_process_energy_joules_total"}
    assert pids == {"4100", "4200", "4300", "4500"}
    (idle,) = [s for s in samples if s.name == "gpu_idle_energy_joules_total"]
    assert idle.labels["vendor"] == "amd"
    measured = [s for m in snapshot_families(second) for s in m.samples
                if s.name == "gpu_energy_joules_total"]
    assert {s.labels["source"] for s in measured} == {"sysfs"}


# -- NVIDIA: per-process SM samples through the fake NVML ------------------------------------

def test_nvidia_split_follows_the_sm_samples_and_their_sum_is_the_busy_share() -> None:
    from exporter.sources.nvidia.backend import NvidiaBackend

    fake = FakeNVML([FakeGPU(processes=[FakeProcess(100, 1 << 30, sm_util=60),
                                        FakeProcess(200, 1 << 30, sm_util=20),
                                        FakeProcess(300, 1 << 30)])])
    config = Config(procfs="/nonexistent", slow_interval=1.0)
    backend = NvidiaBackend(config, fake)
    hub = Hub(config, [backend])
    clock, windows = Clock(), list[Window]()
    hub.energy.clock, hub.energy.on_window = clock, windows.append
    hub.collect_once()
    for _ in range(6):  # the energy counter is read every third slow cycle
        clock.now += 1.0
        hub._sample(backend, slow=True)  # one open NVML handle, as the Hub's thread has
        hub.snapshot.devices  # noqa: B018
    assert len(windows) == 2
    step = fake.gpus[0].energy_step_mj / 1000
    for w in windows:
        assert w.joules == pytest.approx(step)
        assert w.parts[100] == pytest.approx(0.6 * step)  # 60 % + 20 % busy: 3:1 of 80 %
        assert w.parts[200] == pytest.approx(0.2 * step)
        assert 300 not in w.parts  # listed, no sample: not busy
        assert w.idle == pytest.approx(0.2 * step)


# -- the rules on synthetic samples ----------------------------------------------------------

INFO = DeviceInfo(vendor="amd", pci_bus_id="0000:03:00.0", uuid="pci-0000:03:00.0")


def device(energy: float | None, *processes: ProcessSample, up: bool = True,
           power: float | None = None, util: float | None = None) -> DeviceSample:
    return DeviceSample(info=INFO, source="sysfs", up=up, energy_joules=energy,
                        power_watts=power, utilization_ratio=util, processes=processes)


def proc(pid: int, gfx: float | None = None, name: str = "app",
         ratio: float | None = None) -> ProcessSample:
    return ProcessSample(pid=pid, process=name,
                         engine_busy_seconds={} if gfx is None else {"gfx": gfx},
                         utilization_ratio={} if ratio is None else {"sm": ratio})


def split(clock: Clock, windows: list[Window]) -> EnergySplit:
    return EnergySplit(max_window=21.0, reading_interval=10.0, clock=clock,
                       on_window=windows.append)


def test_a_snapshot_read_twice_or_late_counts_nothing_twice() -> None:
    clock, windows = Clock(), list[Window]()
    s = split(clock, windows)
    s.attribute(1, [device(100.0, proc(1, gfx=10.0))])
    clock.now += 10
    devices = [device(200.0, proc(1, gfx=15.0))]
    first = s.attribute(2, devices)
    again = s.attribute(2, devices)
    late = s.attribute(1, [device(100.0, proc(1, gfx=10.0))])
    assert len(windows) == 1
    assert first[0].processes[0].energy_joules == again[0].processes[0].energy_joules == 50.0
    assert late[0].processes[0].energy_joules == 50.0
    assert first[0].idle_energy_joules == 50.0


def test_no_per_process_engine_data_puts_everything_in_idle() -> None:
    """A MIG parent (processes on its instances, no samples) or a source without per-process
    engine time: the whole increase is idle, and no process gets a series."""
    clock, windows = Clock(), list[Window]()
    s = split(clock, windows)
    s.attribute(1, [device(100.0, ProcessSample(pid=7, process="x", memory_used_bytes=1.0))])
    clock.now += 5
    (d,) = s.attribute(2, [device(130.0, ProcessSample(pid=7, process="x",
                                                        memory_used_bytes=1.0))])
    assert d.idle_energy_joules == 30.0
    assert d.processes[0].energy_joules is None
    assert windows[0].parts == {}


def test_counters_never_go_back_and_windows_always_add_up_through_churn() -> None:
    """Random processes (engine counters or ratios) come, go, come back under the same pid
    or another name, their counters reset, power readings come and go, the GPU counter
    resets once: every window adds up to the counter's
    increase, and no served counter ever goes back for one process identity."""
    rng = random.Random(31)
    clock, windows = Clock(), list[Window]()
    s = split(clock, windows)
    energy = 1000.0
    counters: dict[int, float] = {}
    names = {pid: "a" for pid in range(1, 6)}
    served: dict[tuple[int, str], float] = {}
    listed_at: dict[tuple[int, str], float] = {}
    idle = 0.0
    for generation in range(1, 400):
        clock.now += rng.choice((0.5, 1.0, 5.0, 25.0))
        energy = 50.0 if generation == 200 else energy + rng.uniform(0, 300)
        for pid in names:
            if rng.random() < 0.05:
                names[pid] = rng.choice("abc")  # pid reused by another program
                counters[pid] = 0.0
            if rng.random() < 0.8:
                counters[pid] = counters.get(pid, 0.0) + rng.uniform(0, 3)
        listed = [proc(pid, gfx=counters[pid], name=names[pid]) if pid % 2 else
                  proc(pid, ratio=rng.random(), name=names[pid]) for pid in names
                  if pid in counters and rng.random() < 0.7]
        power = rng.choice((None, rng.uniform(50, 700)))
        closed = len(windows)
        (d,) = s.attribute(generation, [device(energy, *listed, power=power)])
        fresh = windows[-1].parts if len(windows) > closed else {}
        assert d.idle_energy_joules is not None and d.idle_energy_joules >= idle
        idle = d.idle_energy_joules
        for p in d.processes:
            if p.energy_joules is None:
                continue
            key = (p.pid, p.process)
            if p.energy_joules < served.get(key, 0.0):  # only a process gone for longer
                # than max_window starts again: from 0, and this snapshot's part
                assert p.energy_joules == pytest.approx(fresh.get(p.pid, 0.0))
                assert clock.now - listed_at[key] > 21.0
            served[key] = p.energy_joules
        for p in d.processes:
            listed_at[(p.pid, p.process)] = clock.now
            for other in [k for k in served if k[0] == p.pid and k[1] != p.process]:
                del served[other]  # the pid is another program's now: a new identity
            assert p.field_sources["energy_joules"] == SOURCE
    assert len(windows) > 100
    for w in windows:
        assert w.joules >= 0 and w.idle >= 0 and all(v >= 0 for v in w.parts.values())
        assert sum(w.parts.values()) + w.idle == pytest.approx(w.joules)


def test_pod_labels_on_process_energy_series() -> None:
    clock, windows = Clock(), list[Window]()
    s = split(clock, windows)
    pod = replace(proc(1, gfx=1.0), pod="trainer-0", namespace="ml", container="main")
    s.attribute(1, [device(10.0, pod)])
    clock.now += 10
    (d,) = s.attribute(2, [device(20.0, replace(pod, engine_busy_seconds={"gfx": 6.0}))])
    from exporter.output.render import families as render

    f = render._Families(RenderOptions().selection)
    render._device_families(f, "0", d, RenderOptions(pod_labels=True))
    (sample,) = f.by_name["gpu_process_energy_joules_total"].samples
    assert sample.value == 5.0  # 5 s of 10: half the window busy, all of it this process
    assert (sample.labels["pod"], sample.labels["namespace"], sample.labels["container"]) == \
        ("trainer-0", "ml", "main")
    assert sample.labels["source"] == SOURCE


def test_ratio_readings_slower_than_the_energy_counter_close_windows_at_each_reading() -> None:
    """xe's per-process cycle ratios come with each /proc scan (here every 5 s) while its
    energy counter moves every second: windows close at the readings, each reading
    counting for the time since the one before, so nothing goes to idle that was busy."""
    clock, windows = Clock(), list[Window]()
    s = EnergySplit(max_window=21.0, reading_interval=5.0, clock=clock,
                    on_window=windows.append)
    shown = {0: 0.9, 5: 0.5, 10: 0.5, 15: 0.3}  # each reading: the 5 s before it
    ratio = 0.9
    for t in range(21):
        ratio = shown.get(t, ratio)
        (d,) = s.attribute(t + 1, [device(1000.0 + 10 * t, proc(1, ratio=ratio))])
        clock.now += 1.0
    assert [(w.seconds, w.joules) for w in windows] == [(5.0, 50.0)] * 4
    assert [w.parts[1] for w in windows] == pytest.approx([25.0, 25.0, 15.0, 15.0])
    assert d.processes[0].energy_joules == pytest.approx(80.0)
    assert d.idle_energy_joules == pytest.approx(120.0)


def test_a_window_that_mixes_busy_and_idle_charges_the_busy_seconds_at_their_power() -> None:
    """10 s busy at 600 W then 20 s idle at 150 W in one 30 s window: the process's 10 s
    are the window's 10 highest-power seconds, 6000 of its 9000 J, not a third of it."""
    clock, windows = Clock(), list[Window]()
    s = EnergySplit(max_window=61.0, reading_interval=10.0, clock=clock,
                    on_window=windows.append)
    energy, busy = 5000.0, 100.0
    s.attribute(0, [device(energy, proc(1, gfx=busy), power=150.0)])
    for t in range(1, 31):  # the busy counter moves only at the end (a slow scan)
        clock.now += 1.0
        watts = 600.0 if t <= 10 else 150.0
        energy += watts
        end = t == 30
        s.attribute(t, [device(energy, proc(1, gfx=busy + 10.0 if end else busy),
                               power=watts)])
    (w,) = windows
    assert (w.seconds, w.joules, w.busy) == (30.0, 9000.0, 10.0)
    assert w.parts[1] == pytest.approx(6000.0)  # by time it was 3000 J
    assert w.idle == pytest.approx(3000.0)


def test_without_power_readings_over_the_window_the_busy_share_is_by_time() -> None:
    clock, windows = Clock(), list[Window]()
    s = split(clock, windows)
    s.attribute(0, [device(1000.0, proc(1, gfx=0.0))])
    clock.now += 10
    s.attribute(1, [device(1900.0, proc(1, gfx=4.0), power=500.0)])  # 1 reading of 10 s
    clock.now += 10
    s.attribute(2, [device(2800.0, proc(1, gfx=8.0))])  # none over the second window
    assert [w.parts[1] for w in windows] == pytest.approx([360.0, 360.0])


def test_a_first_reading_after_every_process_was_idle_counts_for_its_whole_interval() -> None:
    """NVML's samples every 10 s, the counter every 30 s, snapshots every second: after
    a long idle (no samples: nothing shown), B's first reading says 60 % of the 10 s
    before it. It counts 6 s, not the 1 s since the snapshot before."""
    clock, windows = Clock(), list[Window]()
    s = EnergySplit(max_window=21.0, reading_interval=10.0, clock=clock,
                    on_window=windows.append)
    for t in range(0, 121):  # readings at 100 (0.6), 110 and 120 (0.9)
        shown = {} if t < 100 else {2: 0.6} if t < 110 else {2: 0.9}
        energy = 1000.0 + 100.0 * (t - t % 30)  # read every 30 s
        s.attribute(t, [device(energy, proc(1, name="a"),
                               *(proc(pid, ratio=r) for pid, r in shown.items()))])
        clock.now += 1.0
    last = windows[-1]
    assert last.seconds == 30.0
    assert last.parts[2] / last.joules == pytest.approx((6.0 + 9.0 + 9.0) / 30)


def test_a_gpu_without_a_counter_integrates_its_power_and_never_goes_back() -> None:
    """The estimate: each power reading for the time since the snapshot before; nothing
    while the GPU is down; a long gap counts max_window at most; and when a counter
    appears, the split follows it from then on, the served totals going on from where
    they were."""
    clock, windows = Clock(), list[Window]()
    s = split(clock, windows)
    (d,) = s.attribute(0, [device(None, proc(1, gfx=0.0), power=100.0)])
    assert d.estimated_energy_joules == 0.0 and d.idle_energy_joules == 0.0
    clock.now += 2
    (d,) = s.attribute(1, [device(None, proc(1, gfx=1.0), power=50.0)])
    assert d.estimated_energy_joules == 100.0  # 50 W for 2 s
    assert d.processes[0].energy_joules == pytest.approx(50.0)  # busy 1 s of 2
    clock.now += 5
    s.attribute(2, [device(None, proc(1, gfx=1.0), power=80.0, up=False)])
    clock.now += 1
    (d,) = s.attribute(3, [device(None, proc(1, gfx=1.0), power=80.0)])
    assert d.estimated_energy_joules == 100.0  # the first reading after it was down
    clock.now += 100
    (d,) = s.attribute(4, [device(None, proc(1, gfx=1.0), power=10.0)])
    assert d.estimated_energy_joules == 100.0 + 10.0 * 21.0  # max_window
    served = d.processes[0].energy_joules
    assert served is not None and d.idle_energy_joules is not None
    idle = d.idle_energy_joules
    clock.now += 1
    (d,) = s.attribute(5, [device(7000.0, proc(1, gfx=1.0), power=10.0)])  # a counter
    assert d.estimated_energy_joules is None and d.energy_joules == 7000.0
    assert (d.processes[0].energy_joules, d.idle_energy_joules) == (served, idle)
    clock.now += 10
    (d,) = s.attribute(6, [device(7100.0, proc(1, gfx=6.0), power=10.0)])
    assert d.processes[0].energy_joules == pytest.approx(served + 50.0)  # 5 s of 10
    assert d.idle_energy_joules == pytest.approx(idle + 50.0)
    for w in windows:
        assert sum(w.parts.values()) + w.idle == pytest.approx(w.joules)


@pytest.mark.parametrize("counters", [False, True])
def test_ratio_samples_share_the_gpu_out_and_its_own_utilisation_says_how_long(
        counters: bool) -> None:
    """NVML's per-process SM samples read 87 % for a loop that keeps a kernel running all
    the time (the GPU's utilisation: 100 %): the process gets the whole window, not 87 %
    of it. Engine counters (fdinfo) are busy time themselves: the GPU's utilisation
    changes nothing there."""
    clock, windows = Clock(), list[Window]()
    s = EnergySplit(max_window=21.0, reading_interval=10.0, clock=clock,
                    on_window=windows.append)

    def one(t: int) -> ProcessSample:
        return proc(1, gfx=8.7 * t / 10) if counters else proc(1, ratio=0.87)

    for t in range(0, 11):
        s.attribute(t, [device(1000.0 + 100.0 * (t - t % 10), one(t), util=1.0)])
        clock.now += 1.0
    (w,) = windows
    assert w.joules == 1000.0
    assert w.parts[1] == pytest.approx(870.0 if counters else 1000.0)
