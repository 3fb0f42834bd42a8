"""dcgm-exporter's second generation of names (``--metric-names dcgm4.9``), built from
exporter/output/dcgm_generations.yml: DCGM 4.7's renamed fields, some in new units, and the
``hostname`` / ``DCGM_FI_SYSTEM_DRIVER_VERSION`` labels.

Expected values are written out from the sample's own numbers in the new units (Hz, J,
ratio, bytes, B/s); the names' sources are in the YAML file's header.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from exporter.core.config import ConfigError, MetricNames, parse_choice
from exporter.core.labels import Check
from exporter.core.model import DeviceInfo, DeviceSample
from exporter.output.dcgm import (
    FACTORS,
    FIELDS,
    HEALTH_FAMILY,
    UNITS,
    _generation,
    dcgm_families,
    generation,
    generations,
    health_family,
    parse_counters,
)
from exporter.output.render.selection import Selection
from exporter.pipeline.health import Verdict

REPO = Path(__file__).resolve().parent.parent
DOC = (REPO / "docs" / "dcgm-compat.md").read_text()
DATA = yaml.safe_load((REPO / "exporter" / "output" / "dcgm_generations.yml").read_text())
MIB = 1 << 20
HOST = "node-a"
NEW = generation("dcgm4.9")
H100 = DeviceInfo(vendor="nvidia", pci_bus_id="0000:18:00.0", uuid="GPU-5f6e0000",
                  name="NVIDIA H100 80GB HBM3", driver_version="550.127.05",
                  device_node="nvidia0")
SAMPLE = DeviceSample(
    info=H100, source="nvml", utilization_ratio=0.37, memory_utilization_ratio=0.22,
    memory_used_bytes=19818 * MIB, memory_free_bytes=61262 * MIB,
    memory_reserved_bytes=479 * MIB, temperatures_celsius={"gpu": 62.0, "memory": 57.0},
    power_watts=631.25, energy_joules=987654.321,
    clocks_hertz={"graphics": 1.98e9, "sm": 1.975e9, "memory": 2.619e9},
    pcie_throughput_bytes_per_second={"tx": 7432192.0, "rx": 15491072.0},
    nvlink_throughput_bytes_per_second={("0", "tx"): 1.5e9, ("0", "rx"): 2.5e9},
    pcie_replay_errors=9, engine_utilization_ratio={"encoder": 0.12, "decoder": 0.03},
    remapped_rows={"correctable": 2, "uncorrectable": 1}, remap_failed=True,
    ecc_errors={"corrected": 5, "uncorrected": 1}, xid_last=79,
    retired_pages={"single_bit": 3, "double_bit": 4},
    nvlink_errors={("0", "crc_flit"): 6, ("0", "crc_data"): 7, ("0", "replay"): 8,
                   ("0", "recovery"): 9},
    clock_event_seconds={"sw_power_cap": 1.5, "sw_thermal": 0.25, "hw_thermal": 0.5},
    profiling_ratio={"graphics_engine_active": 0.995, "sm_active": 0.961,
                     "sm_occupancy": 0.142, "tensor_active": 0.933, "dram_active": 0.156,
                     "fp64_active": 0.0, "fp32_active": 0.015, "fp16_active": 0.5})


def served(gen: str) -> dict[str, tuple[float, dict[str, str]]]:
    out = {}
    for family in dcgm_families([("0", SAMPLE)], HOST, generation(gen).fields,
                                generation(gen)):
        (s,) = family.samples
        out[s.name] = (s.value, dict(s.labels))
    return out


def test_every_field_in_its_new_name_and_unit_with_the_new_labels() -> None:
    found = served("dcgm4.9")
    assert {n: v for n, (v, _) in found.items()} == {
        "DCGM_FI_DEV_SM_CLOCK_HERTZ": 1.975e9, "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": 2.619e9,
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS": 62, "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": 57,
        "DCGM_FI_DEV_BOARD_POWER_WATTS": 631.25,
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": 987654.321,
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": 9, "DCGM_FI_DEV_GPU_UTIL_RATIO": 0.37,
        "DCGM_FI_DEV_MEMORY_UTIL_RATIO": 0.22, "DCGM_FI_DEV_ENC_UTIL_RATIO": 0.12,
        "DCGM_FI_DEV_DEC_UTIL_RATIO": 0.03, "DCGM_FI_DEV_XID_ERROR": 79,
        "DCGM_FI_DEV_FB_USED_BYTES": 19818 * MIB, "DCGM_FI_DEV_FB_FREE_BYTES": 61262 * MIB,
        "DCGM_FI_DEV_FB_RESERVED_BYTES": 479 * MIB,
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND": 4e9,
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": 2,
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": 1, "DCGM_FI_DEV_ROW_REMAP_FAILED": 1,
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": 0.995, "DCGM_FI_PROF_TENSOR_UTIL_RATIO": 0.933,
        "DCGM_FI_PROF_DRAM_UTIL_RATIO": 0.156,
        "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": 7432192,
        "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND": 15491072,
        "DCGM_FI_PROF_SM_UTIL_RATIO": 0.961, "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": 0.142,
        "DCGM_FI_PROF_FP64_UTIL_RATIO": 0.0, "DCGM_FI_PROF_FP32_UTIL_RATIO": 0.015,
        "DCGM_FI_PROF_FP16_UTIL_RATIO": 0.5,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 5, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1,
        "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL": 3, "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL": 4,
        "DCGM_FI_DEV_POWER_VIOLATION": 1.5e9, "DCGM_FI_DEV_THERMAL_VIOLATION": 0.75e9,
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": 6,
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": 7,
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL": 8,
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL": 9,
    }
    labels = found["DCGM_FI_DEV_GPU_TEMP_CELSIUS"][1]
    assert labels == {"gpu": "0", "UUID": "GPU-5f6e0000", "pci_bus_id": "00000000:18:00.0",
                      "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
                      "hostname": HOST, "DCGM_FI_SYSTEM_DRIVER_VERSION": "550.127.05"}
    assert found["DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"][1]["source"] == "nvml"  # as in dcgm


def test_the_first_generation_is_unchanged_by_the_second() -> None:
    old = served("dcgm")
    assert len(old) == len(served("dcgm4.9"))
    assert old["DCGM_FI_DEV_SM_CLOCK"][0] == 1975 and old["DCGM_FI_DEV_FB_USED"][0] == 19818
    assert {"Hostname", "DCGM_FI_DRIVER_VERSION"} <= set(old["DCGM_FI_DEV_GPU_TEMP"][1])
    assert generation("dcgm").fields == FIELDS


def test_each_renamed_field_is_the_old_one_converted_and_every_row_is_applied() -> None:
    old, new = served("dcgm"), served("dcgm4.9")
    rows = DATA["generations"]["dcgm4.9"]["fields"]
    for before, after in zip(FIELDS, NEW.fields, strict=True):
        assert after.key == before.name and after.reads == before.reads
        row = rows.get(before.name)
        assert after.name == (row["name"] if row else before.name)
        assert after.unit == (row.get("unit", before.unit) if row else before.unit)
        if before.name not in old:
            continue
        # the same reading, through each generation's factor from the table's unit
        unit = UNITS[before.reads[0].field]
        ratio = FACTORS[unit, after.unit] / FACTORS[unit, before.unit]
        assert new[after.name][0] == pytest.approx(old[before.name][0] * ratio, rel=1e-11)
    renamed = {f.name for f in NEW.fields} - {f.name for f in FIELDS}
    assert len(renamed) == len(rows)  # every row renames a field, no two to one name


def test_the_unit_changes_are_those_of_dcgm_exporter_4_9() -> None:
    changed = {f.key: (old.unit, f.unit) for old, f in zip(FIELDS, NEW.fields, strict=True)
               if old.unit != f.unit}
    assert changed == {
        "DCGM_FI_DEV_SM_CLOCK": ("MHz", "Hz"), "DCGM_FI_DEV_MEM_CLOCK": ("MHz", "Hz"),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("mJ", "J"),
        "DCGM_FI_DEV_GPU_UTIL": ("%", "ratio"), "DCGM_FI_DEV_MEM_COPY_UTIL": ("%", "ratio"),
        "DCGM_FI_DEV_ENC_UTIL": ("%", "ratio"), "DCGM_FI_DEV_DEC_UTIL": ("%", "ratio"),
        "DCGM_FI_DEV_FB_FREE": ("MiB", "B"), "DCGM_FI_DEV_FB_USED": ("MiB", "B"),
        "DCGM_FI_DEV_FB_RESERVED": ("MiB", "B"),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("~MB/s", "B/s")}


def test_a_row_for_a_field_we_do_not_serve_or_in_a_unit_we_cannot_convert_to_fails() -> None:
    labels = DATA["generations"]["dcgm4.9"]["labels"]
    with pytest.raises(ValueError, match="no such field"):
        _generation("x", {"labels": labels, "fields": {"DCGM_FI_DEV_NOPE": {"name": "Y"}}})
    with pytest.raises(ValueError, match="no clocks_hertz in hertz -> kHz"):
        _generation("x", {"labels": labels,
                          "fields": {"DCGM_FI_DEV_SM_CLOCK": {"name": "Y", "unit": "kHz"}}})


def test_health_status_carries_the_generations_labels() -> None:
    verdict = Verdict(status=0, checks={Check.THERMAL: 0})
    (family,) = health_family([("0", SAMPLE, verdict)], HOST, NEW)
    (s,) = family.samples
    assert s.name == HEALTH_FAMILY
    assert s.labels["hostname"] == HOST and "Hostname" not in s.labels
    assert s.labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] == "550.127.05"


def test_counters_of_either_generation_select_the_same_fields() -> None:
    old = parse_counters("DCGM_FI_DEV_GPU_TEMP, gauge, x\nDCGM_FI_DEV_FB_USED, gauge, x\n")
    new = parse_counters("DCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, x\n"
                         "DCGM_FI_DEV_FB_USED_BYTES, gauge, x\n")
    assert old == new and old.fields == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"}
    selection = Selection(dcgm_fields=new.fields)
    kept = [f.name for f in NEW.fields if selection.allows_dcgm(f.key, f.name)]
    assert kept == ["DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_FB_USED_BYTES"]
    # the regexes see the name served
    narrowed = Selection(exclude="DCGM_FI_DEV_FB_USED_BYTES", dcgm_fields=new.fields)
    assert not narrowed.allows_dcgm("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES")


def exposition(families: list[Metric]) -> str:
    class Collector:
        def collect(self) -> list[Metric]:
            return families

    registry = CollectorRegistry()
    registry.register(Collector())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_counters_keep_the_bare_name_even_when_it_ends_in_total() -> None:
    text = exposition(list(dcgm_families([("0", SAMPLE)], HOST, NEW.fields, NEW)))
    assert "# TYPE DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL untyped\n" in text
    assert re.search(r"^DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL\{.*\} 987654\.321$", text, re.M)
    assert "_total" not in text


@pytest.mark.parametrize(("word", "gpu", "dcgm"), [
    ("gpu", True, None), ("dcgm", False, "dcgm"), ("dcgm4.9", False, "dcgm4.9"),
    ("both", True, "dcgm"), ("both-dcgm4.9", True, "dcgm4.9")])
def test_metric_names_words(word: str, gpu: bool, dcgm: str | None) -> None:
    names = parse_choice("metric-names", word, MetricNames)
    assert (names.gpu, names.dcgm) == (gpu, dcgm)
    assert dcgm is None or dcgm in generations()


def test_an_unknown_generation_is_refused() -> None:
    with pytest.raises(ConfigError, match="metric-names"):
        parse_choice("metric-names", "dcgm4.8", MetricNames)


# -- the doc's table is the data ----------------------------------------------------------

SOURCES = {"go-dcgm": "DCGM", "dcgm-4.7": "DCGM 4.7 ¹", "4.10": "4.10 ²"}


def rename_table() -> str:
    rows = ["| `dcgm` (up to 4.8) | `dcgm4.9` (4.9 and later) | unit | source of the name |",
            "|---|---|---|---|"]
    table = DATA["generations"]["dcgm4.9"]["fields"]
    for old, new in zip(FIELDS, NEW.fields, strict=True):
        unit = old.unit if new.unit == old.unit else f"{old.unit} → {new.unit}"
        row = table.get(old.name)
        source = SOURCES[row["source"]] if row else "unchanged"
        rows.append(f"| `{old.name}` | `{new.name}` | {unit} | {source} |")
    return "\n".join(rows) + "\n"


def test_the_compatibility_doc_has_the_rename_table_of_the_data() -> None:
    assert rename_table() in DOC, f"docs/dcgm-compat.md: the rename table is now\n" \
        f"{rename_table()}"
    for label in DATA["generations"]["dcgm4.9"]["labels"].values():
        assert f"`{label['name']}`" in DOC
