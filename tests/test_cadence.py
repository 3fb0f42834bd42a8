"""The cadence each field declares (exporter.core.fieldspec.Cadence, per backend through
``MetricSpec.cadence_of``) is the one the backends keep, through their real code paths.

For each backend (NVIDIA on FakeNVML, amdgpu and xe on mutable copies of fixture sysfs
trees, amdsmi on its fake package) a table says how to move the source of every field
the backend produces there: a FakeGPU attribute, a fixture file, a value of the fake
amdsmi's GPU. Every source is moved at once after two slow
cycles, then: one fast cycle must show the new value of exactly the fields declared
``fast``; the following slow cycles (as many as the NVIDIA backend's rarest counter
tier needs) must show the new value of the ``slow`` ones and never that of a
``static`` one; a ``static`` one shows it after the backend is closed and opened again.
Which fields are checked, and what is expected of each, come from the declaration, so
declaring a field ``fast`` that a backend reads on the slow tier (or the reverse)
fails here, and so does a field a backend starts to produce without a row below.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.fieldspec import Cadence, MetricSpec, value_specs
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample, ProcessSample
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.intel.backend import IntelBackend, _link_dir
from exporter.sources.kernel.amdgpu_gpu_metrics import layout_for, layout_offsets
from exporter.sources.nvidia.device import COUNTERS_EVERY, RARE_EVERY
from exporter.sources.nvidia.nvlink import ERRORS_EVERY, THROUGHPUT_EVERY
from tests.fakes.fake_nvml import MIB, FakeGPU, FakeNVML, FakeProcess
from tests.fakes.fake_nvml_links import FakeNvLink
from tools.metricsdoc import generate

FIXTURES = Path(__file__).parent / "fixtures"
DEVICE = dict(value_specs(DeviceSample))
PROCESS = dict(value_specs(ProcessSample))
PROC = "process."  # a key "process.<field>": that field of the sample's first process
# Slow cycles after the sources move: enough for NVIDIA's counter, rare and NVLink tiers
# (each due every N-th slow cycle) to come round once.
SLOW_CYCLES = max(COUNTERS_EVERY, RARE_EVERY, THROUGHPUT_EVERY, ERRORS_EVERY)

Move = Callable[[Any], None]  # moves one field's source; given the scenario's handle


def spec_of(key: str) -> MetricSpec:
    return PROCESS[key.removeprefix(PROC)] if key.startswith(PROC) else DEVICE[key]


def values(sample: DeviceSample) -> dict[str, Any]:
    """Every field the sample has (device fields, and its first process's)."""
    out: dict[str, Any] = dict(sample.present())
    if sample.processes:
        p = sample.processes[0]
        out.update({PROC + name: v for name, _ in value_specs(ProcessSample)
                    if (v := getattr(p, name)) is not None and v != {}})
    return out


@dataclass
class Seen:
    """What one backend served for each field: before the sources moved, after one fast
    cycle, after each of the slow cycles that followed, and after a reopen."""

    backend: str
    moved: dict[str, Move]
    start: dict[str, Any]
    fast: dict[str, Any]
    slow: list[dict[str, Any]]
    reopened: dict[str, Any]


def observe(backend: Any, handle: Any, moved: dict[str, Move]) -> Seen:
    def sample(slow: bool) -> dict[str, Any]:
        (d,) = backend.sample(slow=slow).devices
        assert d.up
        return values(d)

    backend.open()
    sample(True)
    start = sample(True)  # a second cycle: rates and GPM ratios have a value
    for move in moved.values():
        move(handle)
    fast = sample(False)
    slow = [sample(True) for _ in range(SLOW_CYCLES)]
    backend.close()
    backend.open()
    reopened = sample(True)
    backend.close()
    return Seen(backend.name, moved, start, fast, slow, reopened)


def check(seen: Seen, key: str) -> None:
    cadence = spec_of(key).cadence_of(seen.backend)
    before = seen.start.get(key)
    assert (seen.fast.get(key) != before) == (cadence is Cadence.FAST), (
        f"{seen.backend} {key} declared {cadence.value}: after one fast cycle "
        f"{before!r} -> {seen.fast.get(key)!r}")
    if cadence is not Cadence.FAST:
        refreshed = any(s.get(key) != before for s in seen.slow)
        assert refreshed == (cadence is Cadence.SLOW), (
            f"{seen.backend} {key} declared {cadence.value}: over {SLOW_CYCLES} slow cycles "
            f"{before!r} -> {[s.get(key) for s in seen.slow]!r}")
    if cadence is Cadence.STATIC:
        assert seen.reopened.get(key) != before, f"{seen.backend} {key}: not re-read at open"


# -- NVIDIA on FakeNVML ----------------------------------------------------------------


def nvidia_gpu() -> FakeGPU:
    """An H100 with the optional sources a fixture can turn on turned on."""
    return FakeGPU(power_instant_mw=70000, fans=[30],
                   violation_ns={"power": 10**9, "thermal": 0, "sync_boost": 0},
                   ecc_locations={"dram": (0, 0), "sram": (0, 0)}, recovery_action=0,
                   fabric={"state": 3, "status": 0, "health_mask": 0, "health_summary": 1},
                   nvlinks=[FakeNvLink(errors={"replay": 0, "recovery": 0}), FakeNvLink()],
                   processes=[FakeProcess(4242, 1 << 30, sm_util=10)])


def _set(**attrs: Any) -> Move:
    def move(obj: Any) -> None:
        for name, value in attrs.items():
            setattr(obj, name, value)
    return move


def _link(i: int, **attrs: Any) -> Move:
    return lambda g: _set(**attrs)(g.nvlinks[i])


def _item(attr: str, key: Any, value: Any) -> Move:
    return lambda g: getattr(g, attr).__setitem__(key, value)


NVIDIA: dict[str, Move] = {
    "utilization_ratio": _set(utilization_gpu=55),
    "memory_utilization_ratio": _set(utilization_memory=44),
    "memory_total_bytes": _set(memory_total_bytes=94000 * MIB),
    "memory_used_bytes": _set(memory_used_bytes=2048 * MIB),
    "memory_free_bytes": _set(memory_used_bytes=2048 * MIB),
    "memory_reserved_bytes": _set(memory_reserved_bytes=600 * MIB),
    "power_watts": _set(power_mw=250000),
    "power_instant_watts": _set(power_instant_mw=260000),
    "power_limit_watts": _set(power_limit_mw=450000),
    "power_limit_default_watts": _set(power_default_limit_mw=600000),
    "energy_joules": _set(energy_mj=10**12),
    "performance_state": _set(pstate=2),
    "encoder_sessions": _set(encoder_stats=(2, 60, 1500)),
    "pcie_link_generation": _set(pcie_generation=3),
    "pcie_link_width": _set(pcie_width=8),
    "pcie_link_max_generation": _set(pcie_max_generation=4),
    "pcie_link_max_width": _set(pcie_max_width=8),
    "pcie_replay_errors": _set(pcie_replays=99),
    "remap_failed": _set(remapped_rows=(3, 1, 1, 1)),
    "remap_pending": _set(remapped_rows=(3, 1, 1, 1)),
    "remapped_rows": _set(remapped_rows=(3, 1, 1, 1)),
    "temperatures_celsius": _set(temperature_gpu=77),
    "temperature_limits_celsius": _item("thresholds", "shutdown", 95),
    "fan_speed_ratio": _item("fans", 0, 65),
    "clocks_hertz": _item("clocks_mhz", "sm", 1755),
    "clocks_max_hertz": _item("max_clocks_mhz", "sm", 1755),
    "throttle_reasons": _set(clocks_event_reasons=0x4),
    "clock_event_seconds": _item("violation_ns", "power", 5 * 10**9),
    "pcie_throughput_bytes_per_second": _set(pcie_tx_kbps=9999),
    "engine_utilization_ratio": _item("engines", "encoder", 30),
    "ecc_errors": _set(ecc_corrected=7),
    "ras_errors": _item("ecc_locations", "dram", (3, 0)),
    "recovery_action": _set(recovery_action=1),
    "recovery_action_info": _set(recovery_action=1),
    "fabric_state": _item("fabric", "state", 2),
    "fabric_status": _item("fabric", "status", 999),
    "fabric_health_mask": _item("fabric", "health_mask", 1),
    "fabric_health_summary": _item("fabric", "health_summary", 3),
    "nvlink_up": _link(1, state=0),
    "nvlink_throughput_bytes_per_second": _link(0, tx_kib=10**9),
    "nvlink_errors": _link(0, errors={"replay": 5, "recovery": 0}),
    "profiling_ratio": _item("gpm", "sm_util", 50.0),
    PROC + "memory_used_bytes": lambda g: _set(used_memory_bytes=3 << 30)(g.processes[0]),
    PROC + "utilization_ratio": lambda g: _set(sm_util=80)(g.processes[0]),
    PROC + "contexts": lambda g: _set(mps=True)(g.processes[0]),  # now an MPS client
}
# An XID event re-reads the rare tier and the link state on the next cycle (by design):
# moved on its own, so that it does not move the other fields' reads.
NVIDIA_XID: dict[str, Move] = {
    name: (lambda g: g.xids.append(31))
    for name in ("xid_errors", "xid_info", "xid_last", "xid_last_timestamp_seconds",
                 "xid_seen_seconds")}


def nvidia(moved: dict[str, Move]) -> Seen:
    from exporter.sources.nvidia.backend import NvidiaBackend

    gpu = nvidia_gpu()
    return observe(NvidiaBackend(Config(procfs="/nonexistent"), nvml=FakeNVML([gpu])), gpu,
                   moved)


# -- amdgpu and xe on copies of fixture trees ----------------------------------------------


def tree(tmp: Path, name: str) -> tuple[Path, Path]:
    """(sysfs root, the card's PCI function dir) of a mutable copy of a fixture machine."""
    root = tmp / name / "sys"
    shutil.copytree(FIXTURES / name / "sys", root, symlinks=True)
    card = next(n for n in sorted(os.listdir(root / "class/drm")) if n[4:].isdigit())
    return root, (root / "class/drm" / card / "device").resolve()


def _write(rel: str, text: str) -> Move:
    def move(dev: Path) -> None:
        (dev / rel).write_text(text + "\n")
    return move


def _both(*moves: Move) -> Move:
    def move(dev: Path) -> None:
        for m in moves:
            m(dev)
    return move


def _hwmon(name: str, text: str) -> Move:
    return lambda dev: _write(name, text)(next((dev / "hwmon").iterdir()))


def _gpu_metrics(**fields: int) -> Move:
    """Sets plain fields of the card's binary gpu_metrics table (its own layout)."""
    def move(dev: Path) -> None:
        path = dev / "gpu_metrics"
        data = bytearray(path.read_bytes())
        layout = layout_for(data[2], data[3], struct.unpack_from("<H", data)[0])
        assert layout is not None
        offsets = {name: (offset, code) for name, offset, code in layout_offsets(layout)[0]}
        for name, value in fields.items():
            offset, code = offsets[name]
            assert isinstance(code, str)
            struct.pack_into("<" + code, data, offset, value)
        path.write_bytes(bytes(data))
    return move


AMD: dict[str, Move] = {  # amd-rdna2-rx6900xt
    "utilization_ratio": _write("gpu_busy_percent", "77"),
    "memory_utilization_ratio": _write("mem_busy_percent", "33"),
    "memory_total_bytes": _write("mem_info_vram_total", "20000000000"),
    "memory_used_bytes": _write("mem_info_vram_used", "1000000000"),
    "memory_free_bytes": _write("mem_info_vram_used", "1000000000"),
    "shared_memory_total_bytes": _write("mem_info_gtt_total", "20000000000"),
    "shared_memory_used_bytes": _write("mem_info_gtt_used", "123456789"),
    "power_watts": _hwmon("power1_average", "250000000"),
    "power_limit_watts": _hwmon("power1_cap", "250000000"),
    "temperatures_celsius": _hwmon("temp1_input", "66000"),
    "temperature_limits_celsius": _hwmon("temp1_crit", "95000"),
    "fan_speed_ratio": _hwmon("pwm1", "128"),
    "voltages_volts": _hwmon("in0_input", "900"),
    "clocks_hertz": _hwmon("freq1_input", "1500000000"),
    "clocks_max_hertz": _write("pp_dpm_sclk", "0: 500Mhz *\n1: 2400Mhz "),
    "pcie_link_generation": _write("pp_dpm_pcie",
                                   "0: 2.5GT/s, x1 310Mhz *\n1: 16.0GT/s, x16 619Mhz "),
    "pcie_link_width": _write("pp_dpm_pcie", "0: 2.5GT/s, x1 310Mhz *\n1: 16.0GT/s, x16 619Mhz "),
    "pcie_link_max_generation": _write("max_link_speed", "8.0 GT/s PCIe"),
    "pcie_link_max_width": _write("max_link_width", "8"),
    "pcie_replay_errors": _write("pcie_replay_count", "7"),
    # from the gpu_metrics table, where the card's text files are silent
    "engine_utilization_ratio": _gpu_metrics(average_gfx_activity=61),
    "energy_joules": _gpu_metrics(energy_accumulator=1 << 40),
    "throttle_reasons": _gpu_metrics(indep_throttle_status=1),  # the PPT0 bit
}


def amd(tmp: Path, moved: dict[str, Move]) -> Seen:
    root, dev = tree(tmp, "amd-rdna2-rx6900xt")
    backend = AmdBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False))
    return observe(backend, dev, moved)


def _pkg(suffix: str, text: str) -> Move:
    """The xe hwmon channel labelled pkg."""
    def move(dev: Path) -> None:
        hw = next((dev / "hwmon").iterdir())
        (ch,) = (f.name.removesuffix("_label") for f in hw.glob("temp*_label")
                 if f.read_text().strip() == "pkg")
        (hw / f"{ch}_{suffix}").write_text(text + "\n")
    return move


def _link_file(name: str, text: str) -> Move:
    return lambda dev: _write(name, text)(_link_dir(dev))


INTEL: dict[str, Move] = {  # intel-xe-b580
    "temperatures_celsius": _pkg("input", "71000"),
    "temperature_limits_celsius": _pkg("crit", "95000"),
    "energy_joules": _hwmon("energy1_input", "99031745544"),
    "power_watts": _hwmon("energy1_input", "99031745544"),  # from the energy delta
    "fan_speed_ratio": _hwmon("fan1_input", "2000"),
    "clocks_hertz": _write("tile0/gt0/freq0/act_freq", "1500"),
    "clocks_max_hertz": _write("tile0/gt0/freq0/rp0_freq", "2000"),
    # xe reads every reason and their OR (status) from one register: both move together.
    "throttle_reasons": _both(_write("tile0/gt0/freq0/throttle/reason_pl1", "1"),
                              _write("tile0/gt0/freq0/throttle/status", "1")),
    "power_limit_watts": _hwmon("power1_cap", "150000000"),
    "pcie_link_generation": _link_file("current_link_speed", "8.0 GT/s PCIe"),
    "pcie_link_width": _link_file("current_link_width", "4"),
    "pcie_link_max_generation": _link_file("max_link_speed", "16.0 GT/s PCIe"),
    "pcie_link_max_width": _link_file("max_link_width", "8"),
}


def intel(tmp: Path, moved: dict[str, Move]) -> Seen:
    root, dev = tree(tmp, "intel-xe-b580")
    backend = IntelBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False))
    return observe(backend, dev, moved)


# -- amdsmi on its fake package, one unpartitioned MI300X of the amd-mi300x machine ----------


def _at(*path: Any, value: Any) -> Move:
    """Sets one value of the fake amdsmi's GPU (its JSON, as the fake serves it)."""
    def move(gpu: dict[str, Any]) -> None:
        for key in path[:-1]:
            gpu = gpu[key]
        gpu[path[-1]] = value
    return move


AMDSMI: dict[str, Move] = {
    "utilization_ratio": _at("activity", "gfx_activity", value=50),
    "engine_utilization_ratio": _at("activity", "gfx_activity", value=50),
    "memory_utilization_ratio": _at("activity", "umc_activity", value=20),
    "memory_total_bytes": _at("vram", "vram_total", value=200000),
    "memory_used_bytes": _at("vram", "vram_used", value=1000),
    "memory_free_bytes": _at("vram", "vram_used", value=1000),
    "power_watts": _at("power", "socket_power", value=300),
    "power_instant_watts": _at("power", "current_socket_power", value=310),
    "power_limit_watts": _at("power", "power_limit", value=600),
    "energy_joules": _at("energy", "energy_accumulator", value=1 << 40),
    "temperatures_celsius": _at("temps", "HOTSPOT", value=70),
    "temperature_limits_celsius": _at("thresholds", "HOTSPOT", "CRITICAL", value=95),
    "clocks_hertz": _at("clocks", "GFX", "clk", value=1500),
    "clocks_max_hertz": _at("clocks", "GFX", "max_clk", value=2000),
    "pcie_link_generation": _at("pcie", "pcie_metric", "pcie_speed", value=16000),
    "pcie_link_width": _at("pcie", "pcie_metric", "pcie_width", value=8),
    "pcie_link_max_generation": _at("pcie", "pcie_static", "max_pcie_speed", value=16000),
    "pcie_link_max_width": _at("pcie", "pcie_static", "max_pcie_width", value=8),
    "pcie_replay_errors": _at("pcie", "pcie_metric", "pcie_replay_count", value=4),
    "ecc_errors": _at("ecc", "UMC", "correctable_count", value=3),
    "ras_errors": _at("ecc", "UMC", "correctable_count", value=3),
    "nvlink_up": _at("links", 0, "bit_rate", value=0),
    "xgmi_throughput_bytes_per_second": _at("links", 1, "read", value=10**9),
    PROC + "memory_used_bytes": _at("processes", 0, "vram_mem", value=10**9),
    PROC + "shared_memory_used_bytes": _at("processes", 0, "gtt_mem", value=10**8),
    PROC + "engine_busy_seconds": _at("processes", 0, "gfx_ns", value=9 * 10**9),
}


def amdsmi(tmp: Path, moved: dict[str, Move]) -> Seen:
    from exporter.sources.amd.amdsmi import AmdSmiBackend

    config = json.loads((FIXTURES / "amd-mi300x" / "amdsmi.json").read_text())
    gpu = config["gpus"][0]  # alone: an unpartitioned GPU; counters that move only when moved
    gpu["energy"]["step"] = gpu["link_step_kb"] = 0
    path = tmp / "amdsmi.json"
    path.write_text(json.dumps({"gpus": [gpu]}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAKE_AMDSMI_JSON", str(path))
        mp.syspath_prepend(str(Path(__file__).parent / "fakes"))
        mp.delitem(sys.modules, "amdsmi", raising=False)
        fake = importlib.import_module("amdsmi")
        assert getattr(fake, "__fake__", False)
        try:
            return observe(AmdSmiBackend(Config()), fake._GPUS[0], moved)
        finally:
            sys.modules.pop("amdsmi", None)


# -- the checks ------------------------------------------------------------------------------

SCENARIOS: dict[str, Callable[[Path], list[Seen]]] = {
    "nvidia": lambda tmp: [nvidia(NVIDIA), nvidia(NVIDIA_XID)],
    "amd": lambda tmp: [amd(tmp, AMD)],
    "intel": lambda tmp: [intel(tmp, INTEL)],
    "amdsmi": lambda tmp: [amdsmi(tmp, AMDSMI)],
}


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Seen]]:
    return {name: run(tmp_path_factory.mktemp(name)) for name, run in SCENARIOS.items()}


TABLES: dict[str, tuple[dict[str, Move], ...]] = {
    "nvidia": (NVIDIA, NVIDIA_XID), "amd": (AMD,), "intel": (INTEL,), "amdsmi": (AMDSMI,)}
CASES = [(b, key) for b, tables in TABLES.items() for t in tables for key in t]


@pytest.mark.parametrize(("backend", "key"), CASES, ids=[f"{b}-{k}" for b, k in CASES])
def test_the_backend_reads_the_field_at_its_declared_cadence(
        seen: dict[str, list[Seen]], backend: str, key: str) -> None:
    (s,) = [s for s in seen[backend] if key in s.moved]
    served = (s.start, s.fast, *s.slow)  # an XID's time appears with the first XID
    assert any(key in v for v in served), f"{backend} never produces {key}: a dead row"
    check(s, key)


@pytest.mark.parametrize("backend", list(SCENARIOS))
def test_every_field_a_backend_produces_is_checked(seen: dict[str, list[Seen]],
                                                   backend: str) -> None:
    produced = {key for s in seen[backend] for key in s.start}
    moved = {key for s in seen[backend] for key in s.moved}
    assert produced - moved == set(), f"{backend}: no row says how to move their sources"


def test_each_backend_is_checked_at_every_cadence_it_declares() -> None:
    """The tables above hold fields of each tier: fast and slow everywhere, static on NVIDIA
    (amdgpu, xe and amdsmi re-read their limits on the slow tier: no static field)."""
    tiers = {b: {spec_of(k).cadence_of(b) for t in tables for k in t}
             for b, tables in TABLES.items()}
    fast_slow = {Cadence.FAST, Cadence.SLOW}
    assert tiers == {"nvidia": set(Cadence), "amd": fast_slow, "intel": fast_slow,
                     "amdsmi": fast_slow}
    assert {k for k in NVIDIA if spec_of(k).cadence_of("nvidia") is Cadence.STATIC} == {
        "temperature_limits_celsius", "clocks_max_hertz", "pcie_link_max_generation",
        "pcie_link_max_width", "power_limit_default_watts"}


def test_every_value_spec_declares_a_cadence_and_metrics_md_shows_it() -> None:
    doc = generate()
    # | name | type | extra labels | cadence | help |, in the per-GPU and per-process tables
    tables = [[c.strip() for c in line.split("|")] for line in doc.splitlines()
              if line.startswith("| `")]
    cadence = {cells[1].strip("`"): cells[4] for cells in tables if len(cells) == 7}
    for spec in (*DEVICE.values(), *PROCESS.values()):
        assert isinstance(spec.cadence, Cadence)
        assert all(isinstance(c, Cadence) for c in spec.cadence_by.values())
        for name in [spec.family(k) for k in spec.per_key] or [spec.name] * bool(spec.name):
            assert cadence[name] == spec.cadence_text(), name
    assert cadence["gpu_power_watts"] == "fast"
    assert cadence["gpu_ecc_errors_total"] == "slow"
    assert cadence["gpu_pcie_link_max_width"] == "slow (nvidia: static)"
    assert cadence["gpu_process_utilization_ratio"] == "slow"
    assert "`--collector.slow-interval`" in doc and "`--collector.interval`" in doc
