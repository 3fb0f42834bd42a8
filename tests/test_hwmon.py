"""exporter.sources.kernel.hwmon against the real-layout fixture trees and small tmp_path chips."""

from __future__ import annotations

import resource
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.fs import (
    FD_BUDGET,
    FDS_PER_READER,
    MAX_KEPT_FDS,
    AttrReader,
    kept_fd_limit,
    planned,
    raise_open_files_limit,
)
from exporter.sources.kernel import hwmon

FIXTURES = Path(__file__).parent / "fixtures"
RX7800XT = FIXTURES / "amd-rdna3-rx7800xt/sys/class/drm/card1/device"
PHOENIX = FIXTURES / "amd-apu-phoenix/sys/class/drm/card1/device"


@pytest.fixture
def rx7800xt_hwmon() -> Path:
    (d,) = hwmon.hwmon_dirs(RX7800XT)
    return d


def chip(tmp_path: Path, files: dict[str, str]) -> Path:
    d = tmp_path / "hwmon" / "hwmon3"
    d.mkdir(parents=True)
    for name, content in files.items():
        (d / name).write_text(content)
    return d


def test_finds_hwmon_dir_through_the_device_symlink(rx7800xt_hwmon: Path) -> None:
    assert rx7800xt_hwmon.name == "hwmon4"
    assert hwmon.hwmon_name(rx7800xt_hwmon) == "amdgpu"


def test_hwmon_dirs_order_numerically_and_ignore_other_entries(tmp_path: Path) -> None:
    for name in ("hwmon10", "hwmon2", "hwmonX", "power"):
        (tmp_path / "hwmon" / name).mkdir(parents=True)
    assert [d.name for d in hwmon.hwmon_dirs(tmp_path)] == ["hwmon2", "hwmon10"]
    assert hwmon.hwmon_dirs(tmp_path / "missing") == []


def test_rx7800xt_values_in_base_units(rx7800xt_hwmon: Path) -> None:
    d = rx7800xt_hwmon
    # temp1_input 24000 m°C, temp2 31000, temp3 48000
    assert hwmon.read_temperatures(d) == {"edge": 24.0, "junction": 31.0, "mem": 48.0}
    assert hwmon.read_temperature_thresholds(d, "crit") == {
        "edge": 100.0,
        "junction": 110.0,
        "mem": 108.0,
    }
    assert hwmon.read_temperature_thresholds(d, "emergency")["junction"] == 115.0
    assert hwmon.read_power(d) == {"PPT": 32.0}  # 32000000 µW
    assert hwmon.read_power_caps(d) == {"PPT": 236.0}
    assert hwmon.read_power_caps(d, "cap_max") == {"PPT": 280.0}
    assert hwmon.read_fan_ratios(d) == {"0": pytest.approx(89 / 255)}
    assert hwmon.read_frequencies(d) == {"sclk": 2_011_000_000.0, "mclk": 456_000_000.0}
    assert hwmon.read_voltages(d) == {"vddgfx": pytest.approx(0.985)}
    assert hwmon.read_energy(d) == {}


def test_power_prefers_average_over_input() -> None:
    (d,) = hwmon.hwmon_dirs(PHOENIX)
    # phoenix has power1_average 3103000 and power1_input 3142000
    assert hwmon.read_power(d) == {"PPT": pytest.approx(3.103)}


def test_power_input_when_no_average(tmp_path: Path) -> None:
    d = chip(tmp_path, {"power1_input": "12500000\n", "power1_label": "PPT\n"})
    assert hwmon.read_power(d) == {"PPT": 12.5}


def test_energy_and_unlabelled_channels(tmp_path: Path) -> None:
    d = chip(
        tmp_path,
        {
            "energy1_input": "123456789\n",
            "energy1_label": "card\n",
            "energy2_input": "5000000\n",
            "temp1_input": "41500\n",
        },
    )
    assert hwmon.read_energy(d) == {"card": pytest.approx(123.456789), "energy2": 5.0}
    assert hwmon.read_temperatures(d) == {"temp1": 41.5}


def test_fan_ratio_from_rpm_when_no_pwm(tmp_path: Path) -> None:
    d = chip(tmp_path, {"fan1_input": "1650\n", "fan1_max": "3300\n", "fan2_input": "900\n"})
    # fan2 has no max: no ratio rather than a guess
    assert hwmon.read_fan_ratios(d) == {"0": 0.5}


def test_pwm_without_max_uses_255(tmp_path: Path) -> None:
    d = chip(tmp_path, {"pwm1": "51\n"})
    assert hwmon.read_fan_ratios(d) == {"0": 0.2}


def test_bad_values_are_skipped_and_counted(tmp_path: Path) -> None:
    d = chip(
        tmp_path,
        {
            "temp1_input": "N/A\n",  # not exposed: skipped, not an error
            "temp2_input": "\0\0\0\0",  # empty after NUL strip: skipped
            "temp3_input": "hot\n",  # garbage: parse error
            "temp5_input": "50000   \n",  # trailing spaces are fine
        },
    )
    (d / "temp4_input").mkdir()  # listed but unreadable (EISDIR): read error
    (d / "temp6_input").symlink_to(d / "gone")  # dangling: read error
    errors: Counter[str] = Counter()
    assert hwmon.read_temperatures(d, errors) == {"temp5": 50.0}
    assert errors == {"read": 2, "parse": 1}


def test_channels_and_labels_are_found_once_per_layout(tmp_path: Path) -> None:
    d = chip(tmp_path, {"temp1_input": "40000\n", "temp1_label": "edge\n"})
    reader = AttrReader()
    assert hwmon.read_temperatures(d, reader=reader) == {"edge": 40.0}
    (d / "temp1_label").write_text("junction\n")  # labels only change on hotplug
    (d / "temp1_input").write_text("41000\n")  # values are re-read every time
    (d / "temp2_input").write_text("42000\n")  # not in the layout listed at first
    assert hwmon.read_temperatures(d, reader=reader) == {"edge": 41.0}
    reader.reset()  # what a new discovery generation does
    assert hwmon.read_temperatures(d, reader=reader) == {"junction": 41.0, "temp2": 42.0}
    reader.close()


def test_kept_descriptors_are_bounded_per_reader_and_given_back(tmp_path: Path) -> None:
    n = FDS_PER_READER + 20
    d = chip(tmp_path, {f"temp{i}_input": f"{i * 100}\n" for i in range(1, n + 1)})
    used = FD_BUDGET.used
    reader = AttrReader()
    values = hwmon.read_temperatures(d, reader=reader)
    assert len(values) == n and values[f"temp{n}"] == n / 10  # past the bound: read anyway
    assert reader.kept == FDS_PER_READER and FD_BUDGET.used == used + FDS_PER_READER
    assert hwmon.read_temperatures(d, reader=reader) == values
    reader.close()
    assert reader.kept == 0 and FD_BUDGET.used == used


def test_kept_descriptors_are_at_most_a_quarter_of_the_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))
        assert kept_fd_limit() == 100
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 16), hard))
        assert kept_fd_limit() == min(MAX_KEPT_FDS, min(hard, 1 << 16) // 4)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_budget_is_sized_after_the_open_file_limit_is_raised() -> None:
    """The daemon raises the soft limit before any backend opens a file; the budget, made
    when exporter.core.fs was imported (under the old limit), follows the new one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = FD_BUDGET.limit
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))
        FD_BUDGET.resize(kept_fd_limit())  # as when imported under a limit of 400
        assert FD_BUDGET.limit == 100
        raise_open_files_limit()
        raised, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert raised > 400
        assert FD_BUDGET.limit == min(MAX_KEPT_FDS, raised // 4) > 100
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        FD_BUDGET.resize(before)


def test_numbers_reads_a_plan_as_number_reads_each_file(tmp_path: Path) -> None:
    """AttrReader.numbers (a card's fast plan in one loop) gives number()'s values and
    errors and keeps the same descriptors."""
    files = {"temp1_input": "40000\n", "temp2_input": "N/A\n", "temp3_input": "hot\n",
             "temp5_input": "0x10\n", "temp7_input": "18446744073709551615\n",
             "temp8_input": "99999999999999\n"}
    d = chip(tmp_path, files)
    (d / "temp4_input").mkdir()  # listed but unreadable: read error
    names = sorted([*files, "temp4_input"])
    one, errors_one = AttrReader(), Counter[str]()
    want = [one.number(str(d), n, errors_one, 0.001, "celsius") for n in names]
    many, errors_many = AttrReader(), Counter[str]()
    assert many.numbers([planned(f"{d}/{n}", 0.001, "celsius") for n in names],
                        errors_many) == want == [40.0, None, None, None, 0.016, None, None]
    assert errors_many == errors_one == {"read": 1, "parse": 3}
    assert many.kept == one.kept == len(files)
    one.close()
    many.close()


_CONTENT = st.one_of(
    st.integers(min_value=0, max_value=(1 << 70)).map(lambda n: f"{n}\n".encode()),
    st.sampled_from([b"N/A\n", b"\0\0", b"-5\n", b"0x1f\n", b"1.5\n", b" 42 \n", b"",
                     b"18446744073709551615\n", b"nan\n", b"1e400\n"]),
    st.binary(max_size=24))


@settings(max_examples=200, deadline=None)
@given(contents=st.lists(_CONTENT, min_size=1, max_size=6),
       kinds=st.lists(st.sampled_from([(0.001, "celsius"), (1e-6, "watts"), (1.0, "count"),
                                       (1.0, "bytes"), (1e-6, "joules"), (1.0, "hertz"),
                                       (0.001, "volts"), (1.0, "rpm")]),
                      min_size=6, max_size=6))
def test_numbers_gives_number_of_each_file_for_any_content(
        contents: list[bytes], kinds: list[tuple[float, str]]) -> None:
    """AttrReader.numbers' fast path is number()'s, value for value and error for error,
    whatever a file holds."""
    with tempfile.TemporaryDirectory() as tmp:
        for i, content in enumerate(contents):
            Path(tmp, f"in{i}_input").write_bytes(content)
        names = [f"in{i}_input" for i in range(len(contents))]
        one, errors_one = AttrReader(keep=False), Counter[str]()
        want = [one.number(tmp, n, errors_one, *kinds[i]) for i, n in enumerate(names)]
        errors_many: Counter[str] = Counter()
        got = AttrReader(keep=False).numbers(
            [planned(f"{tmp}/{n}", *kinds[i]) for i, n in enumerate(names)], errors_many)
        assert got == want and [type(v) for v in got] == [type(v) for v in want]
        assert errors_many == errors_one
