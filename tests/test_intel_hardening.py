"""Intel regressions from issue 8: values checked against real hardware, and corrupted files.

- Item 15: discrete Arc on i915 has an unlabelled hwmon temp1 that i915 documents as
  the package temperature (fixture intel-i915-arc-a380, built from that ABI).
- Item 16: Battlemage on xe 6.16 leaves the ``card`` energy channel at 0 while ``pkg``
  counts: the exported counter must be one that counts, and never a splice of two.
- Item 11: NaN, infinities, 1e400, 400 digits, 2^64-1 in any Intel sysfs file never
  reach the output and never mark the card down; each is counted as ``parse``.

Expected values are worked out from the fixture files by hand (see build_intel.py).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from exporter.sources.energy import STUCK_CYCLES
from tests.daemon import machine_args, parse_samples, running
from tests.test_intel import B580_DEV, B580_GT0, B580_HWMON, FIXTURES, Clock, backend, sample_one

ARC_I915 = FIXTURES / "intel-i915-arc-a380" / "sys"
PKG_UJ = 19014248107  # b580 energy2_input ("pkg")
CARD_UJ = 11031745544  # b580 energy1_input ("card")


# --- item 15: discrete Arc on i915 ---------------------------------------------------


def test_i915_discrete_arc_reports_its_unlabelled_temp1_as_package() -> None:
    dev, errors = sample_one(ARC_I915)
    assert errors == {}
    assert (dev.info.driver, dev.info.name) == ("i915", "Intel Arc A380")
    hwmon_dir = next((ARC_I915 / "class" / "drm" / "card0" / "device" / "hwmon").iterdir())
    assert not list(hwmon_dir.glob("*_label"))  # i915 writes no label files
    mdeg = int((hwmon_dir / "temp1_input").read_text())
    assert dev.temperatures_celsius == {"package": mdeg / 1000}
    assert dev.energy_joules == pytest.approx(59540.970520)  # unlabelled energy1
    assert dev.power_limit_watts == pytest.approx(55.0)  # power1_max
    assert dev.clocks_max_hertz == {"graphics": 2450e6}


def test_xe_unlabelled_temp1_is_not_guessed(b580: Path) -> None:
    # Only i915 documents temp1 as the package; an xe chip's unlabelled channel stays out.
    (b580 / B580_HWMON / "temp1_input").write_text("40000\n")
    dev, _ = sample_one(b580)
    assert dev.temperatures_celsius == {"package": 54.0, "vram": 56.0}


# --- item 16: the energy channel that counts -------------------------------------------


def _energy(b580: Path, card: int | str, pkg: int) -> None:
    (b580 / B580_HWMON / "energy1_input").write_text(f"{card}\n")
    (b580 / B580_HWMON / "energy2_input").write_text(f"{pkg}\n")


def test_battlemage_card_channel_at_zero_exports_pkg(b580: Path) -> None:
    clock = Clock()
    b = backend(b580, clock)
    b.open()
    _energy(b580, 0, PKG_UJ)
    first = b.sample(slow=True).devices[0]
    assert first.energy_joules == pytest.approx(PKG_UJ / 1e6)  # not 0 J forever
    _energy(b580, 0, PKG_UJ + 30_000_000)  # pkg: 30 J in 2 s
    clock.now += 2.0
    second = b.sample(slow=False).devices[0]
    assert second.energy_joules == pytest.approx(PKG_UJ / 1e6 + 30.0)
    assert second.power_watts == pytest.approx(15.0)  # not 0 W


def test_card_channel_stuck_while_pkg_counts_is_withdrawn_not_spliced(b580: Path) -> None:
    clock = Clock()
    b = backend(b580, clock)
    b.open()
    exported = [b.sample(slow=True).devices[0].energy_joules]
    for step in range(1, STUCK_CYCLES + 2):
        _energy(b580, CARD_UJ, PKG_UJ + step * 10_000_000)  # card stands, pkg counts
        clock.now += 1.0
        exported.append(b.sample(slow=False).devices[0].energy_joules)
    # The card counter until it is known stuck, then nothing: never pkg's 19014 J.
    assert exported[:STUCK_CYCLES] == [pytest.approx(CARD_UJ / 1e6)] * STUCK_CYCLES
    assert exported[STUCK_CYCLES:] == [None, None]


def test_card_counting_slowly_stays_chosen(b580: Path) -> None:
    clock = Clock()
    b = backend(b580, clock)
    b.open()
    b.sample(slow=True)
    for step in range(1, STUCK_CYCLES + 3):
        _energy(b580, CARD_UJ + step * 1_000_000, PKG_UJ + step * 10_000_000)
        clock.now += 1.0
        dev = b.sample(slow=False).devices[0]
        assert dev.energy_joules == pytest.approx(CARD_UJ / 1e6 + step)
        assert dev.power_watts == pytest.approx(1.0)


def test_card_channel_that_never_reads_gives_way_to_pkg(b580: Path) -> None:
    clock = Clock()
    b = backend(b580, clock)
    b.open()
    _energy(b580, "N/A", PKG_UJ)  # `sensors` shows this card as "card: N/A"
    seen = []
    for _ in range(STUCK_CYCLES + 1):
        seen.append(b.sample(slow=False).devices[0].energy_joules)
        clock.now += 1.0
    assert seen[:STUCK_CYCLES] == [None] * STUCK_CYCLES  # waited for the preferred one
    assert seen[STUCK_CYCLES] == pytest.approx(PKG_UJ / 1e6)


# --- item 11: corrupted numbers ----------------------------------------------------------

GARBAGE = ["NaN", "nan", "inf", "-inf", "1e400", "9" * 400, str(2**64 - 1), "-5"]


@pytest.mark.parametrize("text", GARBAGE)
@pytest.mark.parametrize(
    "rel",
    [
        f"{B580_HWMON}/temp2_input",
        f"{B580_HWMON}/energy1_input",
        f"{B580_HWMON}/power1_cap",
        f"{B580_HWMON}/fan1_input",
        f"{B580_GT0}/act_freq",
        f"{B580_GT0}/rp0_freq",
        f"{B580_GT0}/throttle/reason_pl1",
    ],
)
def test_corrupted_number_is_dropped_and_counted(b580: Path, rel: str, text: str) -> None:
    (b580 / rel).write_text(text + "\n")
    dev, errors = sample_one(b580)
    assert dev.up
    if text == "-5" and rel.endswith("temp2_input"):
        assert dev.temperatures_celsius["package"] == -0.005  # -5 m°C is a temperature
        return
    assert errors.get("parse", 0) >= 1, errors
    assert set(errors) == {"parse"}
    for value in _numbers(dev):
        assert math.isfinite(value)
    # Nothing else on the card is lost.
    if "temp2" not in rel:
        assert dev.temperatures_celsius["package"] == 54.0
    if "act_freq" not in rel:
        assert dev.clocks_hertz["graphics"] == 0.0
    if "rp0_freq" in rel:  # falls back to max_freq (2850 MHz) rather than garbage
        assert dev.clocks_max_hertz["graphics"] == 2850e6
    if "temp2" in rel:
        assert "package" not in dev.temperatures_celsius
    if "fan1" in rel:
        assert "0" not in dev.fan_speed_ratio
    if "energy1" in rel:
        assert dev.energy_joules is None  # waits for "card", never splices to "pkg"


def test_vram_size_garbage_is_dropped(b580: Path) -> None:
    (b580 / B580_DEV / "tile0" / "physical_vram_size_bytes").write_text("9" * 400 + "\n")
    dev, errors = sample_one(b580)
    assert dev.up and dev.memory_total_bytes is None
    assert errors == {"parse": 1}


def _numbers(dev: object) -> list[float]:
    out: list[float] = []
    for name in ("energy_joules", "power_watts", "power_limit_watts", "memory_total_bytes"):
        value = getattr(dev, name)
        if value is not None:
            out.append(value)
    for name in ("temperatures_celsius", "temperature_thresholds_celsius", "fan_speed_ratio",
                 "clocks_hertz", "clocks_max_hertz"):
        out.extend(getattr(dev, name).values())
    return out


@pytest.mark.slow
def test_daemon_serves_no_garbage_from_a_corrupted_card(tmp_path: Path) -> None:
    machine = tmp_path / "machine"
    shutil.copytree(FIXTURES / "intel-xe-b580" / "sys", machine / "sys", symlinks=True)
    shutil.copytree(FIXTURES / "intel-xe-b580" / "proc", machine / "proc", symlinks=True)
    sys_root = machine / "sys"
    (sys_root / B580_HWMON / "temp2_input").write_text("9" * 400 + "\n")
    (sys_root / B580_HWMON / "temp3_input").write_text("NaN\n")
    (sys_root / B580_HWMON / "energy1_input").write_text("inf\n")
    (sys_root / B580_GT0 / "act_freq").write_text("1e400\n")
    (sys_root / B580_GT0 / "rp0_freq").write_text(f"{2**64 - 1}\n")
    with running([*machine_args(machine), "--collector.interval", "1h"], tmp_path) as d:
        samples = parse_samples(d.get().text)
    assert all(math.isfinite(v) for v in samples.values())
    ups = [v for (n, ls), v in samples.items() if n == "gpu_up" and ("source", "sysfs") in ls]
    assert ups == [1.0]
    names = {n for n, _ in samples}
    assert "gpu_temperature_celsius" not in names  # both temperatures were garbage
    assert "gpu_energy_joules_total" not in names
    errors = [v for (n, ls), v in samples.items()
              if n == "gpu_exporter_collection_errors_total"
              and dict(ls) == {"backend": "intel", "reason": "parse"}]
    # One count per bad file: hwmon drops a bad channel and keeps reading the others
    # (2^64-1 is the u64 "no value" sentinel, never a reading, also in energy1_input).
    assert errors == [5.0]


@pytest.fixture
def b580(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "intel-xe-b580" / "sys", root, symlinks=True)
    return root


# --- one error rule with the AMD backend: a PCIe link that is not a link is counted ---


@pytest.mark.parametrize(("name", "text"), [("current_link_speed", "99.9 GT/s PCIe"),
                                             ("current_link_width", "x16")])
def test_a_garbage_pcie_link_is_dropped_and_counted(b580: Path, name: str, text: str) -> None:
    # The B580 capture has no switch class files: its own function's link is read
    # (current and max 2.5 GT/s x1).
    (b580 / B580_DEV / name).write_text(text + "\n")
    dev, errors = sample_one(b580)
    assert errors == {"parse": 1}
    assert dev.up and (dev.pcie_link_max_generation, dev.pcie_link_max_width) == (1, 1)
    if name == "current_link_speed":
        assert (dev.pcie_link_generation, dev.pcie_link_width) == (None, 1)
    else:
        assert (dev.pcie_link_generation, dev.pcie_link_width) == (1, None)
