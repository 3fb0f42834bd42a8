"""The real daemon on the MI300X machine with the fake ``amdsmi`` package on its path.

Proves issue 10's rule for AMD: amdsmi and amdgpu sysfs see the same GPU
(0000:05:00.0) and the output still has exactly one series per metric per device,
the library's value where it has one and sysfs's where it has not; the GPU's two
partitions are devices of their own (the parent's ``gpu`` plus ``partition_id``) with
their own VRAM and processes from amdsmi; XGMI link throughput comes from amdsmi's
accumulators. Key values are re-read from the fake's JSON, not through the exporter.

XGMI rates are accumulator deltas over the time the backend measures between two reads
(amdsmi_get_link_metrics carries no timestamp; the first read is at open), so the golden
keeps their series and labels with the value 0, and the values are checked on their own.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import FIXTURES, machine_args, parse_samples, promtool_check, running, values_of
from tests.test_amdsmi import amdsmi_env
from tests.test_golden import GOLDEN, ONE_CYCLE, normalize

pytestmark = pytest.mark.golden  # UPDATE_GOLDEN=1 python -m pytest -m golden

MI300X = FIXTURES / "amd-mi300x"
AMDSMI_GOLDEN = GOLDEN / "amd-mi300x+amdsmi.prom"
DATA = json.loads((MI300X / "amdsmi.json").read_text())
XGMI = "gpu_xgmi_throughput_bytes_per_second"
XGMI_LINK_TYPE = 2  # amdsmi's AMDSMI_LINK_TYPE_XGMI; the fake's link to itself is type 3
STARTED: dict[str, float] = {}  # monotonic time the daemon of with_amdsmi was started


def normalize_rates(text: str) -> str:
    """test_golden.normalize, and the XGMI rates' values (timing-dependent) set to 0."""
    return re.sub(rf"^({XGMI}{{[^}}]*}}) \S+$", r"\1 0", normalize(text), flags=re.M)


@pytest.fixture(scope="module")
def with_amdsmi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("daemon")
    STARTED["with_amdsmi"] = time.monotonic()
    with running([*machine_args(MI300X), *ONE_CYCLE], tmp,
                 env=amdsmi_env(MI300X / "amdsmi.json")) as daemon:
        text = daemon.get().text
        STARTED["scraped"] = time.monotonic()
        yield text


@pytest.mark.slow
def test_golden_with_amdsmi(with_amdsmi: str) -> None:
    got = normalize_rates(with_amdsmi)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        AMDSMI_GOLDEN.write_text(got)
    assert got == AMDSMI_GOLDEN.read_text()


@pytest.mark.slow
def test_promtool_lints_it(with_amdsmi: str) -> None:
    done = promtool_check(with_amdsmi)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_one_series_per_metric_per_device(with_amdsmi: str) -> None:
    seen = Counter((name, frozenset((k, v) for k, v in labels if k != "source"))
                   for name, labels in parse_samples(with_amdsmi))
    assert [key for key, n in seen.items() if n > 1] == []
    infos = [dict(ls) for n, ls in parse_samples(with_amdsmi) if n == "gpu_info"]
    # one GPU and its two partitions, every one named by amdsmi
    assert sorted(i.get("partition_id", "gpu") for i in infos) == ["0", "1", "gpu"]
    assert {i["source"] for i in infos} == {"amdsmi"}
    [gpu] = [i for i in infos if "partition_id" not in i]
    gpu_data = DATA["gpus"][0]
    assert gpu["partition"] == (f"{gpu_data['compute_partition']}/"
                                f"{gpu_data['memory_partition']}")


@pytest.mark.slow
def test_partitions_vram_and_processes_from_amdsmi(with_amdsmi: str) -> None:
    for process in DATA["gpus"][0]["processes"]:
        pid = str(process["pid"])
        got = values_of(with_amdsmi, "gpu_process_memory_used_bytes", pid=pid,
                        source="amdsmi")
        assert got == [float(process["vram_mem"])], pid
    # sysfs still fills what amdsmi leaves on the whole GPU (GTT, from mem_info_gtt_*)
    gtt = int((MI300X / "sys/class/drm/card1/device/mem_info_gtt_used").read_text())
    assert values_of(with_amdsmi, "gpu_shared_memory_used_bytes", source="sysfs") == [gtt]


def xgmi_rates(text: str) -> dict[tuple[str, str], float]:
    return {(dict(ls)["link"], dict(ls)["direction"]): v
            for (n, ls), v in parse_samples(text).items()
            if n == XGMI and ("source", "amdsmi") in ls}


def check_xgmi(rates: dict[tuple[str, str], float], within_seconds: float) -> None:
    """Each XGMI link of the fake (its index in amdsmi's list) has an rx and a tx rate: the
    fake's per-read step (KB; write moves by half of it) over a time the backend measured,
    which is no longer than ``within_seconds`` (the daemon's whole life so far)."""
    gpu = DATA["gpus"][0]
    links = [str(i) for i, link in enumerate(gpu["links"])
             if link["link_type"] == XGMI_LINK_TYPE]
    assert sorted(rates) == sorted((link, d) for link in links for d in ("rx", "tx"))
    step_bytes = gpu["link_step_kb"] * 1000
    for link in links:
        rx, tx = rates[(link, "rx")], rates[(link, "tx")]
        assert tx == rx / 2  # same interval, half the bytes
        assert step_bytes / within_seconds <= rx <= 1e14


@pytest.mark.slow
def test_first_collection_reports_xgmi_rates(with_amdsmi: str) -> None:
    """The first read at open makes the first (and, here, only) collection report them."""
    check_xgmi(xgmi_rates(with_amdsmi), STARTED["scraped"] - STARTED["with_amdsmi"])
    assert f"{XGMI}{{" in normalize_rates(with_amdsmi)  # the golden keeps the series


@pytest.mark.slow
def test_xgmi_throughput_from_amdsmi_accumulators(tmp_path: Path) -> None:
    args = [*machine_args(MI300X), "--collector.interval", "200ms",
            "--collector.slow-interval", "200ms"]
    started = time.monotonic()
    with running(args, tmp_path, env=amdsmi_env(MI300X / "amdsmi.json")) as d:
        d.get()
        time.sleep(0.5)  # past the first collection: rates between two cycles
        rates = xgmi_rates(d.get().text)
    check_xgmi(rates, time.monotonic() - started)
