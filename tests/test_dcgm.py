"""exporter/output/dcgm.py: dcgm-exporter names, units and labels from DeviceSamples.

Expected values are written out from the sample's own numbers and dcgm-exporter's units
(MiB, MHz, %, mJ, ns); the sources of those units are in tests/dcgm/references.yml.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from exporter.core.config import Config
from exporter.core.fieldspec import value_specs
from exporter.core.model import (
    Allocation,
    DeviceInfo,
    DeviceSample,
    DeviceValues,
    PodRef,
)
from exporter.output.dcgm import (
    FIELDS,
    HEALTH_FAMILY,
    Field,
    Read,
    dcgm_bus_id,
    dcgm_families,
    generations,
    hostname,
)
from exporter.sources.nvidia.backend import NvidiaBackend
from tests.fakes.fake_nvml import FakeGPU, FakeNVML

REPO = Path(__file__).resolve().parent.parent
REFERENCES = yaml.safe_load((REPO / "tests" / "dcgm" / "references.yml").read_text())
DOC = (REPO / "docs" / "dcgm-compat.md").read_text()
MIB = 1 << 20
HOST = "node-a"

H100 = DeviceInfo(vendor="nvidia", pci_bus_id="0000:18:00.0", uuid="GPU-5f6e0000",
                  name="NVIDIA H100 80GB HBM3", driver_version="550.127.05",
                  device_node="nvidia0")
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def series(devices: list[tuple[str, DeviceSample]], host: str = HOST) -> Series:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in dcgm_families(devices, host) for s in family.samples}


def values(found: Series, name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in found.items() if n == name and set(labels.items()) <= ls]


def only(found: Series, name: str, **labels: str) -> float:
    (value,) = values(found, name, **labels)
    return value


# -- the contract: every default counter mapped or said to be missing -------------------


def test_each_field_is_filled_from_fields_of_the_table_and_the_doc_names_their_families(
) -> None:
    """dcgm.py reads DeviceValues fields by their name in the field table, converts from
    the unit the table declares, and docs/dcgm-compat.md names each family it is filled
    from (the family the table serves that field as)."""
    specs = dict(value_specs(DeviceValues))
    rows: dict[str, str] = {}  # a field's first row: the tables of what fills it
    for row in DOC.splitlines():
        if row.startswith("| `DCGM_"):
            for name in re.findall(r"`(DCGM_[A-Z0-9_]+)`", row.split("|")[1]):
                rows.setdefault(name, row)
    for f in FIELDS:
        for r in f.reads:
            spec = specs[r.field]
            families = [spec.family(k) for k in r.keys] if spec.per_key else [spec.name]
            for family in filter(None, families):  # xid_last: served under dcgm's name only
                assert family in rows[f.name], (f.name, family)


def test_a_read_of_a_field_not_in_the_table_or_of_another_unit_fails_at_import() -> None:
    with pytest.raises(ValueError, match="power_watt"):
        Field("DCGM_X", "x", "W", (Read("power_watt"),))
    with pytest.raises(ValueError, match="clocks_hertz in hertz -> MiB"):
        Field("DCGM_X", "x", "MiB", (Read("clocks_hertz", ("sm",)),))
    assert Field("DCGM_X", "x", "MHz", (Read("clocks_hertz", ("sm",)),)).value(
        DeviceValues(clocks_hertz={"sm": 1.98e9})) == 1980.0

NOT_PROVIDED = {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}  # docs/dcgm-compat.md says why


def test_every_default_counter_is_filled_with_its_declared_type_or_documented_missing() -> None:
    fields = {f.name: f for f in FIELDS}
    for name, declared in REFERENCES["default_counters"]:
        if name in NOT_PROVIDED:
            assert name not in fields
            continue
        assert name in fields, f"{name} neither mapped nor listed as not provided"
        assert fields[name].counter == (declared == "counter"), name


def test_the_compatibility_doc_lists_every_field_and_every_gap() -> None:
    in_doc = set(re.findall(r"`(DCGM_[A-Z0-9_]+)`", DOC))
    produced = {f.name for g in generations().values() for f in g.fields} | {HEALTH_FAMILY}
    assert produced <= in_doc, produced - in_doc
    assert NOT_PROVIDED <= in_doc
    defaults = {name for name, _ in REFERENCES["default_counters"]}
    labels = {g.driver_label for g in generations().values()}
    unknown = in_doc - produced - NOT_PROVIDED - defaults - labels
    # Anything else the doc names must be in its "not provided" section, said so in words.
    not_provided_section = DOC.split("## Not provided", 1)[1]
    for name in unknown:
        assert f"`{name}`" in not_provided_section, name


# -- values and units ---------------------------------------------------------------------

def test_nvidia_values_in_dcgm_units_and_labels() -> None:
    d = DeviceSample(
        info=H100, source="nvml", utilization_ratio=0.37, memory_utilization_ratio=0.22,
        memory_used_bytes=19818 * MIB, memory_free_bytes=61262 * MIB,
        memory_reserved_bytes=479 * MIB, temperatures_celsius={"gpu": 62.0, "memory": 57.0},
        power_watts=631.25, energy_joules=987654.321,
        clocks_hertz={"graphics": 1.98e9, "sm": 1.975e9, "memory": 2.619e9},
        pcie_throughput_bytes_per_second={"tx": 7432192.0, "rx": 15491072.0},
        pcie_replay_errors=9, engine_utilization_ratio={"encoder": 0.12, "decoder": 0.03},
        remapped_rows={"correctable": 2, "uncorrectable": 1}, remap_failed=True,
        ecc_errors={"corrected": 5, "uncorrected": 1}, xid_last=79,
        profiling_ratio={"graphics_engine_active": 0.995, "sm_active": 0.961,
                         "sm_occupancy": 0.142, "tensor_active": 0.933, "dram_active": 0.156,
                         "fp64_active": 0.0, "fp32_active": 0.015, "fp16_active": 0.5})
    found = series([("0", d)])
    expected = {
        "DCGM_FI_DEV_SM_CLOCK": 1975, "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_GPU_TEMP": 62, "DCGM_FI_DEV_MEMORY_TEMP": 57,
        "DCGM_FI_DEV_POWER_USAGE": 631.25, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 987654321,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 9, "DCGM_FI_DEV_GPU_UTIL": 37,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 22, "DCGM_FI_DEV_ENC_UTIL": 12, "DCGM_FI_DEV_DEC_UTIL": 3,
        "DCGM_FI_DEV_XID_ERRORS": 79, "DCGM_FI_DEV_FB_USED": 19818, "DCGM_FI_DEV_FB_FREE": 61262,
        "DCGM_FI_DEV_FB_RESERVED": 479, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 5, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.995, "DCGM_FI_PROF_SM_ACTIVE": 0.961,
        "DCGM_FI_PROF_SM_OCCUPANCY": 0.142, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.933,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.156, "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.015, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.5,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 7432192, "DCGM_FI_PROF_PCIE_RX_BYTES": 15491072,
    }
    assert {n: v for (n, _), v in found.items()} == expected  # exact: no float noise
    labels = {dict(ls)["gpu"]: dict(ls) for _, ls in found}
    assert labels["0"] == {"gpu": "0", "UUID": "GPU-5f6e0000", "pci_bus_id": "00000000:18:00.0",
                           "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
                           "Hostname": HOST, "DCGM_FI_DRIVER_VERSION": "550.127.05"}
    assert set(labels["0"]) == set(REFERENCES["labels"])


def test_amd_and_intel_fill_the_same_names_where_the_meaning_is_the_same() -> None:
    amd = DeviceSample(
        info=DeviceInfo(vendor="amd", pci_bus_id="0000:03:00.0", uuid="0x1234", driver="amdgpu",
                        device_node="card1"),
        source="sysfs", utilization_ratio=0.02, memory_utilization_ratio=0.0,
        temperatures_celsius={"edge": 24.0, "junction": 31.0, "memory": 48.0},
        clocks_hertz={"graphics": 2.011e9, "memory": 4.56e8}, power_watts=32.0,
        engine_utilization_ratio={"gfx": 0.24, "video": 0.1})
    intel = DeviceSample(
        info=DeviceInfo(vendor="intel", pci_bus_id="0000:09:00.0", uuid="pci-0000:09:00.0",
                        name="Intel Arc B580", device_node="card2"),
        source="sysfs", temperatures_celsius={"package": 54.0, "vram": 56.0},
        clocks_hertz={"graphics": 2.85e9}, energy_joules=11031.745544)
    found = series([("0", amd), ("2", intel)])
    assert only(found, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 24  # edge, not the junction hot spot
    assert only(found, "DCGM_FI_DEV_MEMORY_TEMP", gpu="0") == 48
    assert only(found, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 2011  # the shader clock
    assert only(found, "DCGM_FI_DEV_MEM_CLOCK", gpu="0") == 456
    assert only(found, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 2
    assert only(found, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="0") == 0.24  # the GFX engine
    assert values(found, "DCGM_FI_DEV_ENC_UTIL") == []  # VCN encodes and decodes: neither
    assert only(found, "DCGM_FI_DEV_GPU_TEMP", gpu="2") == 54  # package
    assert only(found, "DCGM_FI_DEV_MEMORY_TEMP", gpu="2") == 56  # vram
    assert only(found, "DCGM_FI_DEV_SM_CLOCK", gpu="2") == 2850
    assert only(found, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="2") == 11031745.544
    amd_labels = dict(next(ls for (_, ls) in found if ("gpu", "0") in ls))
    # Unknown identity strings are left out, as Prometheus treats an empty label as absent.
    assert amd_labels == {"gpu": "0", "UUID": "0x1234", "pci_bus_id": "00000000:03:00.0",
                          "device": "card1", "Hostname": HOST}


def test_gr_engine_active_is_the_closest_measure_of_each_vendor_and_says_its_source() -> None:
    """GPM's graphics activity where there is GPM; AMD's GFX engine; Intel's busier of
    render and compute; else the device's busy fraction (NVML before Hopper)."""
    def info(vendor: str, bus: str) -> DeviceInfo:
        return DeviceInfo(vendor=vendor, pci_bus_id=bus, uuid=f"pci-{bus}")

    hopper = DeviceSample(info=H100, source="nvml", utilization_ratio=1.0,
                          profiling_ratio={"graphics_engine_active": 0.995},
                          field_sources={"profiling_ratio": "nvml_gpm"})
    ada = DeviceSample(info=info("nvidia", "0000:05:00.0"), source="nvml",
                       utilization_ratio=0.4, engine_utilization_ratio={"encoder": 0.9})
    amd = DeviceSample(info=info("amd", "0000:03:00.0"), source="sysfs", utilization_ratio=0.02,
                       engine_utilization_ratio={"gfx": 0.24, "video": 0.5})
    intel = DeviceSample(info=info("intel", "0000:09:00.0"), source="pmu",
                         utilization_ratio=0.9,  # the busiest engine of all: video here
                         engine_utilization_ratio={"render": 0.25, "compute": 0.5,
                                                   "video": 0.9})
    apple = DeviceSample(info=info("apple", "soc0"), source="macmon", utilization_ratio=0.31)
    found = series([("0", hopper), ("1", ada), ("2", amd), ("3", intel), ("4", apple)])
    got = {dict(ls)["gpu"]: (v, dict(ls)["source"]) for (n, ls), v in found.items()
           if n == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    assert got == {"0": (0.995, "nvml_gpm"), "1": (0.4, "nvml"), "2": (0.24, "sysfs"),
                   "3": (0.5, "pmu"), "4": (0.31, "macmon")}
    # Only this family carries source: the others keep dcgm-exporter's label set.
    assert {n for (n, ls) in found if "source" in dict(ls)} == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE"}


def test_a_gpu_without_memory_of_its_own_shows_the_memory_it_maps_as_framebuffer() -> None:
    """An APU's (or Apple's) framebuffer is system memory: FB_USED is what it maps, FB_FREE
    derived as total - used; a GPU with device memory never reads its GTT as framebuffer."""
    apu = DeviceSample(info=DeviceInfo(vendor="amd", pci_bus_id="0000:64:00.0", uuid="apu"),
                       source="sysfs", shared_memory_total_bytes=34074 * MIB,
                       shared_memory_used_bytes=1415.5 * MIB)
    dgpu = DeviceSample(info=DeviceInfo(vendor="amd", pci_bus_id="0000:03:00.0", uuid="dgpu"),
                        source="sysfs", memory_total_bytes=16368 * MIB,
                        memory_used_bytes=14569 * MIB, memory_free_bytes=1799 * MIB,
                        shared_memory_total_bytes=32000 * MIB, shared_memory_used_bytes=MIB)
    total_only = DeviceSample(info=DeviceInfo(vendor="intel", pci_bus_id="0000:09:00.0",
                                              uuid="x"), source="sysfs",
                              memory_total_bytes=12288 * MIB,
                              shared_memory_total_bytes=32000 * MIB,
                              shared_memory_used_bytes=MIB)
    overfull = DeviceSample(info=DeviceInfo(vendor="apple", pci_bus_id="soc0", uuid="m1"),
                            source="macmon", shared_memory_total_bytes=MIB,
                            shared_memory_used_bytes=2 * MIB)
    found = series([("0", apu), ("1", dgpu), ("2", total_only), ("3", overfull)])
    assert only(found, "DCGM_FI_DEV_FB_USED", gpu="0") == 1415.5
    assert only(found, "DCGM_FI_DEV_FB_FREE", gpu="0") == 34074 - 1415.5
    assert only(found, "DCGM_FI_DEV_FB_USED", gpu="1") == 14569
    assert only(found, "DCGM_FI_DEV_FB_FREE", gpu="1") == 1799
    assert values(found, "DCGM_FI_DEV_FB_FREE", gpu="2") == []  # device memory, unknown use
    assert values(found, "DCGM_FI_DEV_FB_USED", gpu="2") == []
    assert values(found, "DCGM_FI_DEV_FB_FREE", gpu="3") == []  # used > total: no guess
    assert only(found, "DCGM_FI_DEV_FB_USED", gpu="3") == 2


def test_a_read_minus_a_field_of_another_unit_fails_at_import() -> None:
    with pytest.raises(ValueError, match="two units"):
        Field("DCGM_X", "x", "MiB", (Read("memory_total_bytes", minus="power_watts"),))
    with pytest.raises(ValueError, match="no field memory_totl"):
        Field("DCGM_X", "x", "MiB", (Read("memory_used_bytes", unless="memory_totl"),))


def test_a_value_the_source_does_not_expose_is_no_series_never_zero() -> None:
    d = DeviceSample(info=H100, source="nvml", power_watts=70.0)
    assert {n for (n, _) in series([("0", d)])} == {"DCGM_FI_DEV_POWER_USAGE"}
    assert list(dcgm_families([], HOST)) == []


def test_xid_errors_is_the_last_code_and_zero_before_the_first() -> None:
    found = series([("0", DeviceSample(info=H100, source="nvml", xid_last=0)),
                    ("1", DeviceSample(info=H100, source="nvml", xid_errors={13: 2}))])
    assert only(found, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0
    # Counts alone do not say which code came last: no guess.
    assert values(found, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == []


def test_nvlink_and_clock_event_fields_sum_links_and_reasons() -> None:
    d = DeviceSample(
        info=H100, source="nvml",
        nvlink_throughput_bytes_per_second={("0", "tx"): 1024e6, ("0", "rx"): 512e6,
                                            ("1", "tx"): 512e6},
        nvlink_errors={("0", "crc_flit"): 3, ("1", "crc_flit"): 4, ("0", "replay"): 1,
                       ("0", "recovery"): 0, ("1", "crc_data"): 2},
        clock_event_seconds={"sw_power_cap": 1.5, "sw_thermal": 0.25, "hw_thermal": 0.5,
                             "idle": 100.0},
        retired_pages={"single_bit": 1, "double_bit": 0})
    found = series([("0", d)])
    # DCGM: KiB/s over every link and direction, divided by 1000.
    assert only(found, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == 2000
    assert only(found, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") == 7
    assert only(found, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL") == 2
    assert only(found, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL") == 1
    assert only(found, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL") == 0
    assert only(found, "DCGM_FI_DEV_POWER_VIOLATION") == 1.5e9  # ns
    assert only(found, "DCGM_FI_DEV_THERMAL_VIOLATION") == 0.75e9
    assert only(found, "DCGM_FI_DEV_RETIRED_SBE") == 1
    assert only(found, "DCGM_FI_DEV_RETIRED_DBE") == 0


# -- slices and pods ----------------------------------------------------------------------

def mig(gi: str, ci: str, profile: str, used_mib: int) -> DeviceSample:
    return DeviceSample(
        info=DeviceInfo(vendor="nvidia", pci_bus_id="", uuid=f"MIG-{gi}-{ci}",
                        device_key=f"MIG-{gi}-{ci}", parent_key=H100.key,
                        slice_labels={"gpu_instance_id": gi, "compute_instance_id": ci,
                                      "mig_profile": profile}),
        source="nvml", memory_used_bytes=used_mib * MIB)


def test_mig_instance_series_carry_the_parent_identity_and_gpu_instance_labels() -> None:
    parent = DeviceSample(info=H100, source="nvml", memory_used_bytes=100 * MIB)
    found = series([("0", parent), ("0", mig("1", "0", "3g.40gb", 10)),
                    ("0", mig("2", "0", "1g.10gb", 20)), ("0", mig("2", "1", "1g.10gb", 30))])
    used = {dict(ls).get("GPU_I_ID"): (v, dict(ls)) for (n, ls), v in found.items()
            if n == "DCGM_FI_DEV_FB_USED"}
    assert {k: v for k, (v, _) in used.items()} == {None: 100, "1": 10, "2": 20}
    _, labels = used["1"]
    assert labels == {"gpu": "0", "UUID": H100.uuid, "pci_bus_id": "00000000:18:00.0",
                      "device": "nvidia0", "modelName": H100.name, "GPU_I_PROFILE": "3g.40gb",
                      "GPU_I_ID": "1", "Hostname": HOST, "DCGM_FI_DRIVER_VERSION": "550.127.05"}


def test_one_series_per_container_on_a_shared_gpu_and_none_on_an_unallocated_one() -> None:
    a = PodRef(namespace="ml", pod="train-0", container="main")
    b = PodRef(namespace="ml", pod="infer-7", container="server")
    shared = DeviceSample(info=H100, source="nvml", power_watts=300.0, allocations=(
        Allocation(a, "nvidia.com/gpu"), Allocation(b, "nvidia.com/gpu"),
        Allocation(a, "nvidia.com/gpu.shared")))  # the same container twice: one series
    free = DeviceSample(info=DeviceInfo(vendor="nvidia", pci_bus_id="0000:2a:00.0",
                                        uuid="GPU-2", device_node="nvidia1"),
                        source="nvml", power_watts=70.0)
    found = series([("0", shared), ("1", free)])
    power = {(dict(ls)["gpu"], dict(ls).get("pod")): dict(ls) for (n, ls) in found
             if n == "DCGM_FI_DEV_POWER_USAGE"}
    assert set(power) == {("0", "train-0"), ("0", "infer-7"), ("1", None)}
    assert power[("0", "infer-7")]["namespace"] == "ml"
    assert power[("0", "infer-7")]["container"] == "server"
    assert not {"pod", "namespace", "container"} & set(power[("1", None)])
    assert values(found, "DCGM_FI_DEV_POWER_USAGE", pod="train-0") == [300.0]


# -- exposition ---------------------------------------------------------------------------

class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def exposition(d: DeviceSample) -> tuple[str, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(dcgm_families([("0", d)], HOST))))  # type: ignore[arg-type]
    return generate_latest(registry).decode(), om_generate_latest(registry).decode()


def test_counters_keep_the_bare_dcgm_name_in_both_formats() -> None:
    text, om = exposition(DeviceSample(info=H100, source="nvml", energy_joules=1.5,
                                       power_watts=70.0))
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION untyped\n" in text
    assert re.search(r"^DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{.*\} 1500\.0$", text, re.M)
    assert "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n" in text
    assert "_total" not in text
    parsed = {f.name: (f.type, [s.name for s in f.samples])
              for f in text_string_to_metric_families(om)}
    assert parsed["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == (
        "unknown", ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"])
    assert parsed["DCGM_FI_DEV_POWER_USAGE"] == ("gauge", ["DCGM_FI_DEV_POWER_USAGE"])


def test_hostname_is_node_name_else_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    assert hostname() == "gpu-node-7"
    monkeypatch.delenv("NODE_NAME")
    assert hostname() == socket.gethostname()


@pytest.mark.parametrize(("ours", "dcgm"), [("0000:3b:00.0", "00000000:3B:00.0"),
                                             ("0001:c1:00.1", "00000001:C1:00.1"),
                                             ("", ""), ("soc0", "soc0")])
def test_pci_bus_id_in_dcgm_form(ours: str, dcgm: str) -> None:
    assert dcgm_bus_id(ours) == dcgm


# -- the NVIDIA backend fills xid_last ----------------------------------------------------

def test_nvidia_backend_reports_the_newest_xid_and_zero_once_registered() -> None:
    fake = FakeNVML([FakeGPU(index=0, xids=[79, 13, 13]), FakeGPU(index=1),
                     FakeGPU(index=2, not_supported={"nvmlDeviceRegisterEvents"})])
    b = NvidiaBackend(Config(), nvml=fake)
    b.open()
    first: Any = b.sample(slow=False).devices
    assert [d.xid_last for d in first] == [13, 0, None]
    fake.gpus[0].xids.append(79)
    assert b.sample(slow=False).devices[0].xid_last == 79
    assert b.sample(slow=False).devices[0].xid_last == 79  # a last value, kept
