"""Key values of the NVIDIA goldens (NVLink machine, MIG machine) against their fixture files.

The goldens (tests/golden/nvidia-h100x2.prom, nvidia-h100-mig.prom) are compared
byte for byte by test_golden.py; here the real daemon's /metrics is checked against
what the fixture's ``nvml.json`` and ``proc/`` say, read with plain json and file
reads, so a golden regenerated with a wrong value cannot pass.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon import FIXTURES, Samples, machine_args, parse_samples, running
from tests.test_golden import ONE_CYCLE

pytestmark = pytest.mark.slow

MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


def config(machine: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / machine / "nvml.json").read_text())
    return loaded


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Samples, float]]]:
    """machine -> (parsed /metrics, wall clock before the daemon started)."""
    tmp = tmp_path_factory.mktemp("nvidia-golden")
    out = {}
    for machine in ("nvidia-h100x2", "nvidia-h100-mig"):
        started = time.time()
        root = FIXTURES / machine
        with running([*machine_args(root), *ONE_CYCLE], tmp, nvml_json=root / "nvml.json") as d:
            out[machine] = (parse_samples(d.get().text), started)
    yield out


def values_of(samples: Samples, name: str, **labels: str) -> list[float]:
    want = set(labels.items())
    return [v for (n, ls), v in samples.items() if n == name and want <= ls]


def one(samples: Samples, name: str, **labels: str) -> float:
    found = values_of(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_nvlink_series_follow_the_fixture(scrapes: dict[str, tuple[Samples, float]]) -> None:
    text, _ = scrapes["nvidia-h100x2"]
    gpus = config("nvidia-h100x2")["gpus"]
    for index, gpu in enumerate(gpus):
        active = [n for n, link in enumerate(gpu["nvlinks"]) if link["state"] == 1]
        up = values_of(text, "gpu_nvlink_up", gpu=str(index))
        assert len(up) == len(active) and set(up) == {1.0}
        for n in active:
            link = gpu["nvlinks"][n]
            assert one(text, "gpu_nvlink_up", gpu=str(index), link=str(n),
                       remote=link["remote"]) == 1.0
            for direction in ("tx", "rx"):
                # KiB counters moved by their step once, one NVML second apart
                assert one(text, "gpu_nvlink_throughput_bytes_per_second", gpu=str(index),
                           link=str(n), direction=direction) == \
                    link.get(f"{direction}_step_kib", 0) * 1024
            for kind in ("crc_flit", "crc_data", "replay", "recovery"):
                assert one(text, "gpu_nvlink_errors_total", gpu=str(index), link=str(n),
                           type=kind) == link.get("errors", {}).get(kind, 0)
        for n, link in enumerate(gpu["nvlinks"]):
            if link["state"] != 1:
                assert not values_of(text, "gpu_nvlink_up", gpu=str(index), link=str(n))


def test_health_series_follow_the_fixture(scrapes: dict[str, tuple[Samples, float]]) -> None:
    text, started = scrapes["nvidia-h100x2"]
    policies = {"power": "sw_power_cap", "thermal": "sw_thermal", "sync_boost": "sync_boost"}
    for index, gpu in enumerate(config("nvidia-h100x2")["gpus"]):
        g = str(index)
        assert one(text, "gpu_power_instant_watts", gpu=g) == gpu["power_instant_mw"] / 1000
        for policy, ns in gpu["violation_ns"].items():
            assert one(text, "gpu_clock_event_seconds_total", gpu=g,
                       reason=policies[policy]) == pytest.approx(ns / 1e9)
        for block, (corrected, uncorrected) in gpu["ecc_locations"].items():
            assert one(text, "gpu_ras_errors_total", gpu=g, block=block,
                       severity="corrected") == corrected
            assert one(text, "gpu_ras_errors_total", gpu=g, block=block,
                       severity="uncorrected") == uncorrected
        pending = gpu.get("remapped_rows", [0, 0, 0, 0])[2]
        assert one(text, "gpu_memory_remap_pending", gpu=g) == float(bool(pending))
        # XID: the code-0 marker at 0 for every registered GPU, each code's count.
        assert one(text, "gpu_xid_errors_total", gpu=g, xid="0") == 0.0
        xids = gpu.get("xids", [])
        for code in set(xids):
            assert one(text, "gpu_xid_errors_total", gpu=g, xid=str(code)) == xids.count(code)
        stamps = values_of(text, "gpu_xid_last_timestamp_seconds", gpu=g)
        if xids:
            assert len(stamps) == 1 and started <= stamps[0] <= time.time()
        else:
            assert stamps == []
        info = [ls for (n, ls), _ in text.items() if n == "gpu_info" and ("gpu", g) in ls]
        assert len(info) == 1 and ("mig_mode", "disabled") in info[0]


def test_mig_instances_follow_the_fixture(scrapes: dict[str, tuple[Samples, float]]) -> None:
    text, _ = scrapes["nvidia-h100-mig"]
    gpu = config("nvidia-h100-mig")["gpus"][0]
    samples = text
    infos = [dict(ls) for (n, ls), _ in samples.items() if n == "gpu_info"]
    parent = [i for i in infos if "gpu_instance_id" not in i]
    assert len(parent) == 1 and parent[0]["mig_mode"] == "enabled"
    slices = {i["gpu_instance_id"]: i for i in infos if "gpu_instance_id" in i}
    assert set(slices) == {str(m["gpu_instance_id"]) for m in gpu["mig_devices"]}
    for mig in gpu["mig_devices"]:
        info = slices[str(mig["gpu_instance_id"])]
        assert info["gpu"] == parent[0]["gpu"] == "0"  # the parent's index
        assert info["uuid"].startswith("MIG-") and info["uuid"] != parent[0]["uuid"]
        assert info["mig_profile"] == mig["profile"] and info["compute_instance_id"] == "0"
        assert info["pci_bus_id"] == parent[0]["pci_bus_id"]
        labels = {"uuid": info["uuid"], "gpu_instance_id": str(mig["gpu_instance_id"])}
        assert one(text, "gpu_memory_total_bytes", **labels) == mig["memory_total_bytes"]
        assert one(text, "gpu_memory_used_bytes", **labels) == mig["memory_used_bytes"]
        assert one(text, "gpu_sm_active_ratio", **labels) == pytest.approx(
            mig["gpm"]["sm_util"] / 100)
        pids = {p["pid"] for p in mig.get("processes", [])}
        got = {int(v_labels["pid"]) for v_labels in (
            dict(ls) for (n, ls), _ in samples.items()
            if n == "gpu_process_memory_used_bytes" and ("uuid", info["uuid"]) in ls)}
        assert got == pids
        for p in mig.get("processes", []):
            pid = str(p["pid"])
            assert one(text, "gpu_process_memory_used_bytes", pid=pid) == p["used_memory_bytes"]
            statm = (FIXTURES / "nvidia-h100-mig" / "proc" / pid / "statm").read_text()
            assert one(text, "gpu_process_host_memory_bytes", pid=pid) == \
                int(statm.split()[1]) * PAGE
            comm = (FIXTURES / "nvidia-h100-mig" / "proc" / pid / "comm").read_text().strip()
            assert values_of(text, "gpu_process_memory_used_bytes", pid=pid, process=comm)
    # The parent keeps its own device-level series, and no process twice.
    assert one(text, "gpu_power_watts", uuid=parent[0]["uuid"]) == gpu["power_mw"] / 1000
    assert one(text, "gpu_memory_used_bytes", uuid=parent[0]["uuid"]) == gpu["memory_used_bytes"]
    assert not values_of(text, "gpu_process_memory_used_bytes", uuid=parent[0]["uuid"])
    assert not values_of(text, "gpu_nvlink_up")  # NVLink queries are refused in MIG mode
