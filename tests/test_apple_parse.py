"""macmon_parse against the recorded lines of every macmon release (tests/fixtures/macmon).

Expected values are read from the JSON here with plain arithmetic (MHz x 10^6, the
ratio as printed), not through the exporter's unit helpers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.sources.apple.parse import decode_line, parse_macmon

LINES = Path(__file__).parent / "fixtures" / "macmon"


def recorded(name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (LINES / name).read_text().splitlines() if line]


def test_every_recorded_line_decodes_and_converts_without_drops() -> None:
    files = sorted(LINES.glob("*.jsonl"))
    assert len(files) == 5
    for path in files:
        for raw in path.read_bytes().splitlines():
            doc = decode_line(raw)
            assert doc is not None, path
            values = parse_macmon(doc)
            assert values.dropped == 0, path
            assert values.gpu_power_watts == doc["gpu_power"]
            assert values.unified_memory_total_bytes == doc["memory"]["ram_total"]  # type: ignore[index]


def test_v05_pair_gives_clock_and_frequency_scaled_utilisation() -> None:
    for doc in recorded("early-v0.5.jsonl"):
        values = parse_macmon(doc)
        freq_mhz, ratio = doc["gpu_usage"]  # type: ignore[misc]
        assert values.gpu_clock_hertz == freq_mhz * 1_000_000
        assert values.gpu_utilization_ratio == ratio
        assert values.gpu_temperature_celsius == doc["temp"]["gpu_temp_avg"]  # type: ignore[index]
        assert values.unified_memory_used_bytes == doc["memory"]["ram_usage"]  # type: ignore[index]
        assert values.chip_name == "" and values.gpu_clock_max_hertz is None
        assert values.fan_speed_ratio == {}
    first, second = (parse_macmon(d) for d in recorded("early-v0.5.jsonl"))
    assert (first.gpu_clock_hertz, second.gpu_clock_hertz) == (169e6, 338e6)


def test_v07_soc_info_gives_the_chip_name_and_top_clock() -> None:
    (doc,) = recorded("v0.7-m1max-soc.jsonl")
    values = parse_macmon(doc)
    assert values.chip_name == "Apple M1 Max"
    assert values.gpu_clock_max_hertz == 1296 * 1_000_000  # last of soc.gpu_freqs
    assert values.gpu_clock_hertz == 388e6
    assert values.gpu_utilization_ratio == 0.132904022932053
    assert values.gpu_power_watts == 0.154958307743073
    assert values.gpu_temperature_celsius == 45.5415573120117
    assert values.unified_memory_total_bytes == 68719476736
    assert values.unified_memory_used_bytes == 33498726400


def test_v08_prefers_the_active_residency_and_reads_fans() -> None:
    (doc,) = recorded("v0.8dev-m1max.jsonl")
    values = parse_macmon(doc)
    assert values.gpu_utilization_ratio == doc["gpu_active_ratio"] == 0.6921621561050415
    assert values.gpu_clock_hertz == doc["gpu_freq_mhz"] * 1_000_000  # type: ignore[operator]
    assert values.fan_speed_ratio == {"0": 2311 / 5779, "1": 2514 / 6241}
    (readme,) = recorded("v0.8-readme-ILLUSTRATIVE.jsonl")
    values = parse_macmon(readme)
    assert values.gpu_utilization_ratio == 0.09
    assert values.gpu_clock_hertz == 461e6
    assert values.fan_speed_ratio == {"0": 999 / 4900, "1": 1200 / 5200}


def test_scaled_ratio_is_used_when_no_active_ratio_is_given() -> None:
    assert parse_macmon({"gpu_freq_mhz": 461, "gpu_scaled_ratio": 0.25}
                        ).gpu_utilization_ratio == 0.25
    assert parse_macmon({"gpu_usage_ratio": 0.5}).gpu_utilization_ratio == 0.5


def test_zero_temperature_is_macmons_no_sensor_not_a_reading() -> None:
    values = parse_macmon({"temp": {"cpu_temp_avg": 0.0, "gpu_temp_avg": 0.0}})
    assert values.gpu_temperature_celsius is None and values.dropped == 0


def test_missing_fields_give_nothing_and_unknown_fields_are_ignored() -> None:
    values = parse_macmon({"timestamp": "x", "brand_new_field": [1, 2], "usage": {"gpu": {}}})
    assert values.dropped == 0
    assert values.gpu_power_watts is None and values.gpu_clock_hertz is None
    assert values.gpu_utilization_ratio is None and values.unified_memory_total_bytes is None


def test_the_unreleased_restructured_layout_gives_only_the_memory() -> None:
    """macmon's main branch (crates/macmon/src/ffi.rs @ 0424a190c72ea3ece12d24b11a3f89e4c2674296,
    ``Metrics``/``UsageMetrics``/``PowerMetrics``/``TempMetrics``) nests usage and power and
    renames the temperatures; no release prints it. A line shaped by those structs (field
    names from the source, values ours) keeps only what kept its name: memory."""
    doc = {"usage": {"cpu": {"PCPU": [4, 3200, 0.5]}, "gpu": {"GPU": [10, 800, 0.2]}},
           "power": {"package": 3.0, "cpu": 2.0, "gpu": 0.5, "ram": 0.2, "gpu_ram": 0.01,
                     "ane": 0.0, "board": 9.0, "battery": 0.0, "dc_in": 12.0},
           "memory": {"ram_total": 17179869184, "ram_usage": 8589934592,
                      "swap_total": 0, "swap_usage": 0},
           "temp": {"cpu_avg": 45.0, "gpu_avg": 41.0}, "timestamp": "2026-03-15T10:00:00Z"}
    values = parse_macmon(doc)
    assert values.dropped == 0
    assert (values.unified_memory_total_bytes, values.unified_memory_used_bytes) == (
        17179869184, 8589934592)
    assert values.gpu_power_watts is None and values.gpu_temperature_celsius is None
    assert values.gpu_utilization_ratio is None and values.gpu_clock_hertz is None


@pytest.mark.parametrize(("doc", "dropped"), [
    ({"gpu_power": "1.5"}, 1),  # a string is not macmon's number
    ({"gpu_power": True}, 1),
    ({"gpu_power": -3.0}, 1),
    ({"gpu_power": 1e300}, 1),
    ({"gpu_usage": [388]}, 1),  # not a pair
    ({"gpu_usage": [388, 1.7]}, 1),  # ratio above 1
    ({"gpu_active_ratio": None}, 1),
    ({"temp": {"gpu_temp_avg": 900.0}}, 1),
    ({"memory": {"ram_total": -1, "ram_usage": 5}}, 1),
    ({"fans": [{"name": "fan0", "rpm": "fast", "max_rpm": 5000}, "fan1"]}, 2),
    ({"soc": {"chip_name": "Apple M4", "gpu_freqs": [0, "x", 1000]}}, 1),
])
def test_bad_values_are_dropped_and_counted(doc: dict[str, object], dropped: int) -> None:
    assert parse_macmon(doc).dropped == dropped


def test_fan_without_a_readable_maximum_has_no_ratio() -> None:
    values = parse_macmon({"fans": [{"rpm": 1200, "max_rpm": None}, {"rpm": 900, "max_rpm": 0},
                                    {"rpm": 6000, "max_rpm": 5000}]})
    assert values.fan_speed_ratio == {"2": 1.0}  # over its maximum: clamped
    assert values.dropped == 0


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b"\xff\xfe{", b"42",
                                 b'"a string"', b"[" * 100_000])
def test_decode_line_refuses_what_is_not_one_object(raw: bytes) -> None:
    assert decode_line(raw) is None
