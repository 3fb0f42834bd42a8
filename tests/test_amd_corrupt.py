"""Issue 8 item 11: corrupted sysfs numbers never reach the output, never take a card down.

Each case writes one hostile value into one file of a copy of the RX 7800 XT machine
and samples it through the real backend: the value is dropped and counted as
``parse``, the card stays up, every other value is still there, and nothing in the
sample is NaN, infinite, negative where its unit cannot be, or absurd (1.8e16 °C).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.discovery import DrmDiscovery

pytestmark = pytest.mark.slow  # a copied machine and a full read per hostile value

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = {
    "nan": "NaN",
    "inf": "inf",
    "1e400": "1e400",
    "400 digits": "9" * 400,
    "u64 max": str(2**64 - 1),
    "negative": "-5",
}
FILES = (
    "hwmon/hwmon4/temp1_input", "hwmon/hwmon4/freq1_input", "hwmon/hwmon4/power1_average",
    "hwmon/hwmon4/temp2_crit", "hwmon/hwmon4/pwm1", "gpu_busy_percent", "mem_info_vram_used",
    "current_link_width", "max_link_width", "pcie_replay_count",
)  # fmt: skip
# -5 °C is a real (cold) reading, not garbage.
NOT_GARBAGE = {("hwmon/hwmon4/temp1_input", "negative"), ("hwmon/hwmon4/temp2_crit", "negative")}


@pytest.fixture
def machine(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt/sys", root, symlinks=True)
    return root, (root / "class/drm/card1/device").resolve()


def sample(root: Path) -> tuple[DeviceSample, dict[str, int]]:
    b = AmdBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False))
    b.open()
    cycle = b.sample(slow=True)
    (d,) = cycle.devices
    return d, dict(cycle.errors)


def assert_sane(d: DeviceSample) -> None:
    """No value of any field is NaN/inf, negative where the unit forbids it, or absurd."""
    for f in fields(d):
        value = getattr(d, f.name)
        items = value.items() if hasattr(value, "items") else [(f.name, value)]
        for key, v in items:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            assert math.isfinite(v), (f.name, key, v)
            if "celsius" in f.name:
                assert -60 <= v <= 250, (f.name, key, v)
            elif f.name != "info":
                assert v >= 0, (f.name, key, v)
            if f.name.endswith("_ratio"):
                assert v <= 1, (f.name, key, v)


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("name", FILES)
def test_hostile_value_is_dropped_and_counted(machine: tuple[Path, Path], name: str,
                                             case: str) -> None:
    """A hostile value behaves exactly like an absent file, plus one ``parse`` error."""
    root, dev = machine
    if (name, case) in NOT_GARBAGE:
        pytest.skip("a plausible reading")
    content = (dev / name).read_text() if (dev / name).exists() else None
    (dev / name).unlink(missing_ok=True)
    absent, absent_errors = sample(root)
    assert absent_errors == {}
    (dev / name).write_text(HOSTILE[case] + "\n")
    d, errors = sample(root)
    assert d.up, "one bad value must not mark the card down"
    assert_sane(d)
    # current_link_width is only read when pp_dpm_pcie has no current level
    assert errors == ({} if name == "current_link_width" else {"parse": 1})
    assert d == absent
    if content is not None:
        (dev / name).write_text(content)
        assert sample(root)[1] == {}


def test_hostile_dpm_table_keeps_the_card(machine: tuple[Path, Path]) -> None:
    root, dev = machine
    (dev / "pp_dpm_sclk").write_text(f"0: 500Mhz\n1: {'9' * 400}Mhz *\n2: 2254Mhz\n")
    (dev / "pp_dpm_mclk").write_text("0: -5Mhz *\n")  # not a level line: skipped
    d, errors = sample(root)
    assert d.up and errors.get("parse") == 1
    assert d.clocks_max_hertz == {"graphics": 2254e6}
    assert_sane(d)


def test_hostile_ras_counts(machine: tuple[Path, Path]) -> None:
    root, dev = machine
    (dev / "ras").mkdir()
    (dev / "ras/umc_err_count").write_text(f"ue: {'9' * 400}\nce: 4\n")
    (dev / "ras/gfx_err_count").write_text("ue: 18446744073709551615\nce: 2\n")
    d, errors = sample(root)
    assert d.up and errors.get("parse") == 2
    assert d.ecc_errors == {"corrected": 6}


def test_hostile_gpu_metrics_field(machine: tuple[Path, Path]) -> None:
    root, dev = machine
    blob = bytearray((dev / "gpu_metrics").read_bytes())
    blob[4:6] = (60000).to_bytes(2, "little")  # temperature_edge: 60,000 °C, not all-ones
    (dev / "gpu_metrics").write_bytes(bytes(blob))
    (dev / "hwmon/hwmon4/temp1_input").unlink()  # so the table is the edge source
    (dev / "hwmon/hwmon4/temp1_label").unlink()
    d, errors = sample(root)
    assert "edge" not in d.temperatures_celsius
    assert errors.get("parse") == 1
    assert_sane(d)
