"""The Level Zero backend against a stub loader compiled from tests/fakes/ze_stub.

The stub exports the loader's Sysman symbols and answers from a data file
(tests/fixtures/intel-xe-b580/level_zero.tsv for the B580 machine); the backend loads it
through the same ctypes path as the real libze_loader.so.1 (only the library name
differs). Expected values are computed here from the data file, not from the backend.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.pipeline.hub import Hub
from exporter.pipeline.registry import COLLECTORS, build_backends
from exporter.sources.base import BackendFailed, BackendUnavailable
from exporter.sources.intel import ze_calls as ze
from exporter.sources.intel.level_zero import LevelZeroBackend
from tests.fakes.ze_build import build_stub, real_header_layout

FIXTURES = Path(__file__).parent / "fixtures"
B580 = FIXTURES / "intel-xe-b580"
DATA = B580 / "level_zero.tsv"


def table(path: Path = DATA) -> dict[str, list[list[str]]]:
    """The stub's data file, read independently of the backend: kind -> rows."""
    rows: dict[str, list[list[str]]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            kind, *fields = line.split("\t")
            rows.setdefault(kind, []).append(fields)
    return rows


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """A freshly compiled stub (its own path, so its own state) fed the B580 data."""
    path = build_stub(tmp_path / "lib")
    monkeypatch.setenv("ZE_STUB_DATA", str(DATA))
    lib = ctypes.CDLL(str(path))
    lib.zeStubLayout.restype = ctypes.c_char_p
    yield lib


def backend(lib: ctypes.CDLL) -> LevelZeroBackend:
    return LevelZeroBackend(Config(procfs=str(B580 / "proc")), library=lib._name)


# --- struct layouts ---------------------------------------------------------------------


def _layout(text: str) -> dict[tuple[str, str], int]:
    out = {}
    for line in text.splitlines():
        struct, member, value = line.split()
        out[(struct, member)] = int(value)
    return out


def _ctypes_layout() -> dict[tuple[str, str], int]:
    out = {}
    for name, cls in ze.STRUCTS.items():
        out[(name, "-")] = ctypes.sizeof(cls)
        for member, _ in cls._fields_:
            out[(name, member)] = getattr(cls, member).offset
    return out


@pytest.mark.slow
def test_ctypes_layout_matches_the_c_compiler(stub: ctypes.CDLL) -> None:
    assert _layout(stub.zeStubLayout().decode()) == _ctypes_layout()


@pytest.mark.slow
def test_ctypes_layout_matches_the_spec_header(tmp_path: Path) -> None:
    assert _layout(real_header_layout(tmp_path)) == _ctypes_layout()


# --- the B580 machine ---------------------------------------------------------------------


@pytest.mark.slow
def test_b580_reads_every_family_from_sysman(stub: ctypes.CDLL) -> None:
    rows = table()
    b = backend(stub)
    (info,) = b.open()
    device = rows["device"][0]
    assert info.pci_bus_id == f"{int(device[0]):04x}:{device[1]}:{device[2]}.{device[3]}"
    assert (info.vendor, info.uuid) == ("intel", f"pci-{info.pci_bus_id}")
    assert (info.name, info.driver_version) == (device[5], device[7])
    assert info.serial == ""  # the spec's "unknown" is not a serial number

    first = b.sample(slow=True).devices[0]
    second = b.sample(slow=False).devices[0]
    assert first.source == "level_zero" and first.up

    # Engines: activity deltas between the two reads; several engines of a kind averaged.
    label = {"4": "compute", "5": "render", "6": "decoder", "7": "encoder", "8": "copy",
             "9": "video_enhance"}
    steps: dict[str, list[float]] = {}
    busy: dict[str, float] = {}
    for group, active, _ts, active_step, ts_step in rows["engine"]:
        if group == "0":
            assert second.utilization_ratio == pytest.approx(int(active_step) / int(ts_step))
            continue
        steps.setdefault(label[group], []).append(int(active_step) / int(ts_step))
        busy[label[group]] = busy.get(label[group], 0.0) + (int(active) + int(active_step)) / 1e6
    assert first.engine_utilization_ratio == {} and first.utilization_ratio is None
    assert second.engine_utilization_ratio == pytest.approx(
        {k: sum(v) / len(v) for k, v in steps.items()})
    assert second.engine_busy_seconds == pytest.approx(busy)

    (memory,) = rows["memory"]
    size, free = int(memory[2]), int(memory[3])
    assert (second.memory_total_bytes, second.memory_used_bytes, second.memory_free_bytes) == (
        size, size - free, free)
    seconds = int(memory[9]) / 1e6
    assert second.memory_bandwidth_bytes_per_second == pytest.approx(
        {"read": int(memory[6]) / seconds, "write": int(memory[7]) / seconds})

    (power,) = rows["power"]
    assert first.energy_joules == pytest.approx(int(power[1]) / 1e6)
    assert first.power_watts is None
    assert second.energy_joules == pytest.approx((int(power[1]) + int(power[3])) / 1e6)
    assert second.power_watts == pytest.approx(int(power[3]) / int(power[4]))

    temps = {t: float(c) for t, c in rows["temp"]}
    assert second.temperatures_celsius == {"gpu": temps["1"], "vram": temps["2"]}
    freqs = {f[0]: f for f in rows["freq"]}
    assert second.clocks_hertz == {"graphics": float(freqs["0"][4]) * 1e6,
                                   "video": float(freqs["2"][4]) * 1e6}
    assert second.clocks_max_hertz == {"graphics": float(freqs["0"][2]) * 1e6,
                                       "video": float(freqs["2"][2]) * 1e6}
    assert second.throttle_reasons == dict.fromkeys(
        ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_power_brake"), False)

    comm = {p.name: (p / "comm").read_text().strip() for p in (B580 / "proc").iterdir()
            if p.name.isdigit()}
    expected = {(int(pid), comm[pid], int(mem), int(shared))
                for pid, mem, shared, _engines in rows["process"]}
    assert {(p.pid, p.process, p.memory_used_bytes, p.shared_memory_used_bytes)
            for p in second.processes} == expected
    assert second.ras_errors == {}  # a client Arc card has no RAS error sets


@pytest.mark.slow
def test_throttle_reasons_and_ras_counts(stub: ctypes.CDLL, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "max1550.tsv"
    data.write_text(
        "device\t0\t3a\t00\t0\t0bd5\tIntel(R) Data Center GPU Max 1550\tLQAC12345\t1.3\n"
        "freq\t0\t300\t1600\t1600\t1550\t9\n"  # AVE_PWR_CAP | THERMAL_LIMIT
        "ras\t0\t0\t0\t0\t3\t0\t12\t0\n"
        "ras\t1\t1\t0\t0\t0\t2\t0\t0\n")
    monkeypatch.setenv("ZE_STUB_DATA", str(data))
    b = backend(stub)
    (info,) = b.open()
    assert (info.pci_bus_id, info.serial) == ("0000:3a:00.0", "LQAC12345")
    dev = b.sample(slow=True).devices[0]
    assert dev.clocks_hertz == {"graphics": 1550e6}
    assert dev.throttle_reasons == {"sw_power_cap": True, "hw_slowdown": False,
                                    "sw_thermal": True, "hw_power_brake": False}
    assert dev.ras_errors == {
        **{(c, "corrected"): 0 for c in ze.RAS_CATEGORIES},
        **{(c, "uncorrected"): 0 for c in ze.RAS_CATEGORIES},
        ("compute", "corrected"): 3, ("cache", "corrected"): 12,
        ("reset", "uncorrected"): 1, ("non_compute", "uncorrected"): 2,
    }


# --- opt-in, unsupported calls, faults ------------------------------------------------------


def test_off_by_default_and_on_with_the_flag() -> None:
    assert COLLECTORS["level-zero"] is False
    assert "level_zero" not in [b.name for b in build_backends(Config())]
    on = Config(collectors={**COLLECTORS, "level-zero": True})
    assert "level_zero" in [b.name for b in build_backends(on)]


def test_missing_loader_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "libze_loader.so.1"
    b = LevelZeroBackend(Config(), library=str(missing))
    with pytest.raises(BackendUnavailable, match=f"Level Zero loader {missing} not found"):
        b.open()


@pytest.mark.slow
def test_loader_without_zesinit_is_unavailable(tmp_path: Path) -> None:
    path = build_stub(tmp_path, with_zesinit=False)
    b = LevelZeroBackend(Config(), library=str(path))
    with pytest.raises(BackendUnavailable, match="has no zesInit .*older than spec 1.5"):
        b.open()


@pytest.mark.slow
def test_the_real_loader_on_this_machine_says_why_it_is_off() -> None:
    """The user's path exactly: the default library name, found by the dynamic linker."""
    if ctypes.util.find_library("ze_loader") is None:
        pytest.skip("no Level Zero loader installed (Debian: apt-get install libze1)")
    with pytest.raises(BackendUnavailable, match="zesInit"):
        LevelZeroBackend(Config()).open()  # no Intel GPU driver here, or a pre-1.5 loader


@pytest.mark.slow
def test_zesinit_failure_is_unavailable_with_the_code(stub: ctypes.CDLL) -> None:
    stub.zeStubSetInitResult(ctypes.c_uint32(0x78000001))
    with pytest.raises(BackendUnavailable,
                       match="zesInit failed: ZE_RESULT_ERROR_UNINITIALIZED"):
        backend(stub).open()


@pytest.mark.slow
def test_unsupported_call_gives_no_series_and_is_not_asked_again(
        stub: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "no-bandwidth.tsv"
    data.write_text(DATA.read_text() + "unsupported\tzesMemoryGetBandwidth\n"
                    "unsupported\tzesDeviceProcessesGetState\n")
    monkeypatch.setenv("ZE_STUB_DATA", str(data))
    b = backend(stub)
    b.open()
    for _ in range(3):
        cycle = b.sample(slow=True)
    dev = cycle.devices[0]
    assert dev.memory_bandwidth_bytes_per_second == {} and dev.processes == ()
    assert dev.memory_used_bytes == 12884901888 - 536870912  # the rest still reads
    assert dict(cycle.errors) == {}
    assert stub.zeStubCalls(b"zesMemoryGetBandwidth") == 1
    assert stub.zeStubCalls(b"zesDeviceProcessesGetState") == 1
    assert stub.zeStubCalls(b"zesMemoryGetState") == 3


@pytest.mark.slow
def test_permission_denied_is_counted_once_and_skipped(
        stub: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "no-processes.tsv"
    data.write_text(DATA.read_text() + "denied\tzesDeviceProcessesGetState\n")
    monkeypatch.setenv("ZE_STUB_DATA", str(data))
    b = backend(stub)
    b.open()
    first, second = b.sample(slow=True), b.sample(slow=True)
    assert dict(first.errors) == {"permission": 1} and dict(second.errors) == {}
    assert second.devices[0].processes == () and second.devices[0].up
    assert stub.zeStubCalls(b"zesDeviceProcessesGetState") == 1


@pytest.mark.slow
def test_a_vanished_device_is_down_and_comes_back(stub: ctypes.CDLL) -> None:
    b = backend(stub)
    b.open()
    assert b.sample(slow=True).devices[0].up
    stub.zeStubSetLost(0, 1)
    cycle = b.sample(slow=True)
    assert [d.up for d in cycle.devices] == [False]
    assert dict(cycle.errors) == {"gpu_lost": 1}
    stub.zeStubSetLost(0, 0)
    assert b.sample(slow=True).devices[0].up


@pytest.mark.slow
def test_uninitialised_sysman_fails_the_backend_for_a_reopen(stub: ctypes.CDLL) -> None:
    # What every call answers once sysman is gone (the stub before any zesInit).
    caller = ze.Caller(ze.load(stub._name))
    count = ctypes.c_uint32(0)
    with pytest.raises(BackendFailed, match="zesDriverGet: ZE_RESULT_ERROR_UNINITIALIZED"):
        caller.call(Counter(), "zesDriverGet", None, ctypes.byref(count), None)


@pytest.mark.slow
def test_a_hung_call_marks_the_backend_stale_until_it_answers(stub: ctypes.CDLL) -> None:
    hub = Hub(Config(interval=0.05, stale_after=0.3), [backend(stub)])
    hub.start()
    try:
        assert _wait(lambda: hub.snapshot.backends[0].last is not None)
        assert not hub.snapshot.backends[0].stale
        stub.zeStubSetHang(1)  # zesEngineGetActivity now blocks, as a driver call can
        assert _wait(lambda: hub.snapshot.backends[0].stale)
        stub.zeStubSetHang(0)
        assert _wait(lambda: not hub.snapshot.backends[0].stale)
    finally:
        stub.zeStubSetHang(0)
        hub.stop()


def _wait(condition: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False
