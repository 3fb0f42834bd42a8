"""NVLink, instant power, health counters and field-value batching on a real NVIDIA GPU.

Run on the lent machine: ``python3 -m pytest -v -s tests/hardware/test_nvidia_nvlink_health.py``
(about 10 s; skipped without a GPU, see conftest.py). The backend runs in this process
on the real nvidia-ml-py; every compared number is printed next to what nvidia-smi
says at the same moment, so the output can be quoted in docs/performance.md.

On a single-GPU lease NVLink answers "Not Supported" (a passthrough VM): the NVLink
test then asserts that no NVLink series exist and prints what nvidia-smi shows.
Nothing here changes a GPU setting.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.fields import field_values


def smi_text(*args: str) -> str:
    done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def smi_query(*fields: str) -> list[dict[str, str]]:
    """One row per GPU; a field this nvidia-smi does not know reads "[invalid]"."""
    def query(names: tuple[str, ...]) -> list[dict[str, str]]:
        out = smi_text(f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits")
        return [dict(zip(names, (c.strip() for c in line.split(",")), strict=True))
                for line in out.strip().splitlines() if line.count(",") == len(names) - 1]

    rows = query(fields)
    if rows:
        return rows
    columns = [query((f,)) or None for f in fields]  # an older nvidia-smi: field by field
    count = max((len(c) for c in columns if c), default=0)
    return [{f: (c[i][f] if c else "[invalid]") for f, c in zip(fields, columns, strict=True)}
            for i in range(count)]


def number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported], ...


def per_gpu(text: str, pattern: str) -> dict[int, list[tuple[str, ...]]]:
    """nvidia-smi nvlink output -> GPU index -> matches of ``pattern`` under it."""
    out: dict[int, list[tuple[str, ...]]] = {}
    gpu = -1
    for line in text.splitlines():
        header = re.match(r"GPU (\d+):", line)
        if header:
            gpu = int(header.group(1))
            out[gpu] = []
        m = re.search(pattern, line)
        if m and gpu >= 0:
            out[gpu].append(m.groups())
    return out


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[NvidiaBackend, list[DeviceSample], Any]]:
    import pynvml

    backend = NvidiaBackend(Config())
    backend.open()
    time.sleep(1.0)  # one second of NVLink counters and GPM between open and the first cycle
    cycle = backend.sample(slow=True)
    print(f"\nNVIDIA backend: {len(cycle.devices)} devices, errors {dict(cycle.errors)}")
    yield backend, [d for d in cycle.devices if not d.info.parent_key], pynvml
    backend.close()


@pytest.mark.slow
def test_nvlink_links_and_counters_match_nvidia_smi(devices: Any) -> None:
    backend, gpus, nvml = devices
    status = smi_text("nvlink", "-s")
    print("--- nvidia-smi nvlink -s\n" + status.strip())
    active = per_gpu(status, r"Link (\d+): ([\d.]+) GB/s")
    for index, d in enumerate(gpus):
        ours = {int(link) for (link, _remote), up in d.nvlink_up.items() if up}
        theirs = {int(m[0]) for m in active.get(index, [])}
        print(f"GPU {index}: exporter links up {sorted(ours)} remote "
              f"{sorted({r for _l, r in d.nvlink_up})}; nvidia-smi {sorted(theirs)}")
        assert ours == theirs
        if not theirs:
            # The single-GPU lease: NVLink "Not Supported" -> not one NVLink series.
            assert d.nvlink_up == {} and d.nvlink_throughput_bytes_per_second == {}
            assert d.nvlink_errors == {}
            print(f"GPU {index}: no active NVLink; the exporter exports no NVLink series")
            continue
        assert {link for link, _dir in d.nvlink_throughput_bytes_per_second} == \
            {str(link) for link in theirs}
        # The KiB data counters, read by NVML around nvidia-smi's own read of them.
        handle = backend._gpus[index].dev.handle
        keys = [(fid, link) for link in sorted(theirs)
                for fid in (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                            nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)]
        before = [v.value.ullVal for v in field_values(nvml, handle, keys)]
        counters = smi_text("nvlink", "-gt", "d", "-i", str(index))
        after = [v.value.ullVal for v in field_values(nvml, handle, keys)]
        print("--- nvidia-smi nvlink -gt d\n" + counters.strip())
        smi = {(int(link), kind.lower()): int(kib) for link, kind, kib in
               per_gpu(counters, r"Link (\d+): Data (Tx|Rx): (\d+) KiB").get(index, [])}
        for (fid, link), lo, hi in zip(keys, before, after, strict=True):
            direction = "tx" if fid == nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else "rx"
            if (link, direction) in smi:
                assert lo <= smi[(link, direction)] <= hi, (link, direction, lo, hi)
        print("--- nvidia-smi nvlink -e\n" + smi_text("nvlink", "-e", "-i", str(index)).strip())
        print(f"exporter errors: { {k: v for k, v in d.nvlink_errors.items() if v} }")


@pytest.mark.slow
def test_instant_and_average_power_match_nvidia_smi(devices: Any) -> None:
    """Instant power moves in milliseconds (a GPU settling after another test's load fell
    from 127 W to 80 W between the module's first sample and nvidia-smi): the exporter is
    read right before and right after nvidia-smi, and nvidia-smi must fall in that band."""
    backend, _gpus, _nvml = devices

    def gpus() -> list[DeviceSample]:
        return [d for d in backend.sample(slow=False).devices if not d.info.parent_key]

    before = gpus()
    rows = smi_query("power.draw.average", "power.draw.instant")
    after = gpus()
    for index, (d, e, row) in enumerate(zip(before, after, rows, strict=True)):
        average, instant = number(row["power.draw.average"]), number(row["power.draw.instant"])
        print(f"GPU {index}: power average {d.power_watts} W (nvidia-smi {average}), "
              f"instant {d.power_instant_watts} .. {e.power_instant_watts} W "
              f"(nvidia-smi {instant})")
        if instant is None:
            assert d.power_instant_watts is None
        else:  # both sides readable, nvidia-smi within the exporter's band and a margin
            assert d.power_instant_watts is not None and e.power_instant_watts is not None
            lo = min(d.power_instant_watts, e.power_instant_watts)
            hi = max(d.power_instant_watts, e.power_instant_watts)
            margin = max(25.0, 0.2 * instant)
            assert lo - margin <= instant <= hi + margin
        if average is not None and d.power_watts is not None:
            assert abs(d.power_watts - average) <= max(15.0, 0.1 * average)


@pytest.mark.slow
def test_health_counters_match_nvidia_smi(devices: Any) -> None:
    backend, gpus, nvml = devices
    reasons = {"sw_power_cap": "sw_power_cap", "sw_thermal": "sw_thermal_slowdown",
               "sync_boost": "sync_boost"}
    fields = [f"clocks_event_reasons_counters.{v}" for v in reasons.values()] + [
        "clocks_event_reasons_counters.hw_thermal_slowdown",
        "clocks_event_reasons_counters.hw_power_brake_slowdown",
        "ecc.errors.corrected.volatile.dram", "ecc.errors.uncorrected.volatile.dram",
        "ecc.errors.corrected.volatile.sram", "ecc.errors.uncorrected.volatile.sram",
        "remapped_rows.pending", "mig.mode.current", "retired_pages.single_bit_ecc.count"]
    for index, (d, row) in enumerate(zip(gpus, smi_query(*fields), strict=True)):
        print(f"GPU {index}: nvidia-smi {row}")
        print(f"GPU {index}: exporter clock_event_seconds {dict(d.clock_event_seconds)} "
              f"ras_errors {dict(d.ras_errors)} remap_pending {d.remap_pending} "
              f"retired_pages {dict(d.retired_pages)} info {dict(d.info.info_labels)} "
              f"xid {dict(d.xid_errors)}")
        for ours, theirs in reasons.items():
            us = number(row[f"clocks_event_reasons_counters.{theirs}"])
            if us is not None and ours in d.clock_event_seconds:
                # counters since driver load; they may move between the two reads
                assert abs(d.clock_event_seconds[ours] * 1e6 - us) <= 2e6, ours
        for block in ("dram", "sram"):
            for severity in ("corrected", "uncorrected"):
                smi = number(row[f"ecc.errors.{severity}.volatile.{block}"])
                if smi is not None:
                    assert d.ras_errors.get((block, severity)) == smi, (block, severity)
        mig = row["mig.mode.current"].lower()
        if mig in ("enabled", "disabled"):
            assert d.info.info_labels.get("mig_mode") == mig
        if row["remapped_rows.pending"] in ("Yes", "No"):
            assert d.remap_pending is (row["remapped_rows.pending"] == "Yes")
        if d.xid_errors:  # registered for XID events: the 0 marker is there from the start
            assert d.xid_errors.get(0) == 0
        # The clock-event duration field ids NVIDIA renumbered (251-253 vs 269-271):
        # what each answers here, next to nvidia-smi's hw counters, for the record.
        handle = backend._gpus[index].dev.handle
        values = nvml.nvmlDeviceGetFieldValues(handle, [251, 252, 253, 269, 270, 271])
        print(f"GPU {index}: field ids 251-253, 269-271 -> " + ", ".join(
            f"{v.fieldId}: ret {v.nvmlReturn} type {v.valueType} ull {v.value.ullVal}"
            for v in values))


def test_field_value_batching_timings(devices: Any) -> None:
    """MEASURED.md: batching 3 fast fields was not cheaper than 3 getters on an H100."""
    import importlib

    calls = importlib.import_module("bench.nvml_calls")
    backend, _gpus, nvml = devices
    handle = backend._gpus[0].dev.handle
    rows = calls.batch_rows(nvml, handle, 100)
    rows += calls.cycle_rows(100)
    print(f"{'call':<62} {'median us':>10} {'p90 us':>10} {'CPU us':>9}")
    for name, med, p90, cpu, _outcome in rows:
        print(f"{name:<62} {med:>10.1f} {p90:>10.1f} {cpu:>9.1f}")
        assert med > 0
