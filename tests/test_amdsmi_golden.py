"""The real daemon on the MI300X machine with the fake ``amdsmi`` package on its path.

Proves issue 10's rule for AMD: amdsmi and amdgpu sysfs see the same GPU
(0000:05:00.0) and the output still has exactly one series per metric per device,
the library's value where it has one and sysfs's where it has not; the GPU's two
partitions are devices of their own (the parent's ``gpu`` plus ``partition_id``) with
their own VRAM and processes from amdsmi; XGMI link throughput comes from amdsmi's
accumulators. Key values are re-read from the fake's JSON, not through the exporter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import FIXTURES, machine_args, parse_samples, running, values_of
from tests.test_amdsmi import amdsmi_env
from tests.test_golden import GOLDEN, ONE_CYCLE, normalize

MI300X = FIXTURES / "amd-mi300x"
AMDSMI_GOLDEN = GOLDEN / "amd-mi300x+amdsmi.prom"
DATA = json.loads((MI300X / "amdsmi.json").read_text())


@pytest.fixture(scope="module")
def with_amdsmi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("daemon")
    with running([*machine_args(MI300X), *ONE_CYCLE], tmp,
                 env=amdsmi_env(MI300X / "amdsmi.json")) as daemon:
        yield daemon.get().text


def test_golden_with_amdsmi(with_amdsmi: str) -> None:
    got = normalize(with_amdsmi)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        AMDSMI_GOLDEN.write_text(got)
    assert got == AMDSMI_GOLDEN.read_text()


def test_promtool_lints_it(with_amdsmi: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    done = subprocess.run([promtool, "check", "metrics"], input=with_amdsmi,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


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


def test_partitions_vram_and_processes_from_amdsmi(with_amdsmi: str) -> None:
    for process in DATA["gpus"][0]["processes"]:
        pid = str(process["pid"])
        got = values_of(with_amdsmi, "gpu_process_memory_used_bytes", pid=pid,
                        source="amdsmi")
        assert got == [float(process["vram_mem"])], pid
    # sysfs still fills what amdsmi leaves on the whole GPU (GTT, from mem_info_gtt_*)
    gtt = int((MI300X / "sys/class/drm/card1/device/mem_info_gtt_used").read_text())
    assert values_of(with_amdsmi, "gpu_shared_memory_used_bytes", source="sysfs") == [gtt]


def test_xgmi_throughput_from_amdsmi_accumulators(tmp_path: Path) -> None:
    args = [*machine_args(MI300X), "--collector.interval", "200ms",
            "--collector.slow-interval", "200ms"]
    with running(args, tmp_path, env=amdsmi_env(MI300X / "amdsmi.json")) as d:
        deadline = time.monotonic() + 10
        rates: list[float] = []
        while not rates and time.monotonic() < deadline:
            rates = values_of(d.get().text, "gpu_xgmi_throughput_bytes_per_second",
                              source="amdsmi", direction="tx")
            time.sleep(0.2)
    # the fake's XGMI links (amdsmi's link_type 2 is XGMI; the link to itself is none)
    links = [link for link in DATA["gpus"][0]["links"] if link["link_type"] == 2]
    assert 0 < len(rates) <= len(links) and all(r > 0 for r in rates)
