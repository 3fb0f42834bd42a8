"""The real daemon on the B580 machine with the Level Zero stub loader on LD_LIBRARY_PATH.

The stub is compiled as ``libze_loader.so.1`` into a directory the dynamic linker is
pointed at, so the daemon finds it exactly as it would find the real loader. Proves:
- with ``--collector.level-zero`` the machine reports engine utilisation, memory used,
  memory bandwidth (first counter reading at open) and per-process memory from
  ``level_zero``, merged with the sysfs and fdinfo views
  of the same card into one series per metric (golden + values re-read from the data);
- without the flag, the loader being present changes nothing: the output is the
  machine's existing golden, byte for byte.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import FIXTURES, machine_args, parse_samples, promtool_check, running, values_of
from tests.fakes.ze_build import build_stub
from tests.test_golden import GOLDEN, ONE_CYCLE, normalize
from tests.test_level_zero import DATA, table

pytestmark = pytest.mark.slow

B580 = FIXTURES / "intel-xe-b580"
L0_GOLDEN = GOLDEN / "intel-xe-b580+level_zero.prom"


@pytest.fixture(scope="module")
def stub_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    lib = build_stub(tmp_path_factory.mktemp("ze"))
    return {"LD_LIBRARY_PATH": str(lib.parent), "ZE_STUB_DATA": str(DATA)}


@pytest.fixture(scope="module")
def with_l0(stub_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("daemon")
    with running([*machine_args(B580), *ONE_CYCLE, "--collector.level-zero"], tmp,
                 env=stub_env) as daemon:
        yield daemon.get().text


@pytest.mark.golden
def test_golden_with_level_zero(with_l0: str) -> None:
    got = normalize(with_l0)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        L0_GOLDEN.write_text(got)
    assert got == L0_GOLDEN.read_text()


def test_promtool_lints_it(with_l0: str) -> None:
    done = promtool_check(with_l0)
    assert done.returncode == 0, done.stdout + done.stderr


def test_one_series_per_metric_per_gpu(with_l0: str) -> None:
    seen = Counter((name, frozenset((k, v) for k, v in labels if k != "source"))
                   for name, labels in parse_samples(with_l0))
    assert [key for key, n in seen.items() if n > 1] == []
    infos = [ls for n, ls in parse_samples(with_l0) if n == "gpu_info"]
    assert len(infos) == 1 and dict(infos[0])["name"] == table()["device"][0][5]


def test_level_zero_values_against_the_stub_data(with_l0: str) -> None:
    rows = table()
    (memory,) = rows["memory"]
    size, free = int(memory[2]), int(memory[3])
    assert values_of(with_l0, "gpu_memory_used_bytes", source="level_zero") == [size - free]
    assert values_of(with_l0, "gpu_memory_total_bytes", source="level_zero") == [size]
    for pid, mem, shared, _engines in rows["process"]:
        assert values_of(with_l0, "gpu_process_memory_used_bytes", pid=pid,
                         source="level_zero") == [int(mem)]
        assert values_of(with_l0, "gpu_process_shared_memory_used_bytes", pid=pid,
                         source="level_zero") == [int(shared)]
    # One reading at open, one in the cycle: the counters' steps over their timestamps'.
    read_step, write_step, ts_step_us = int(memory[6]), int(memory[7]), int(memory[9])
    assert values_of(with_l0, "gpu_memory_bandwidth_bytes_per_second", direction="read",
                     source="level_zero") == [read_step / (ts_step_us / 1e6)]
    assert values_of(with_l0, "gpu_memory_bandwidth_bytes_per_second", direction="write",
                     source="level_zero") == [write_step / (ts_step_us / 1e6)]
    compute = [r for r in rows["engine"] if r[0] == "4"]
    assert values_of(with_l0, "gpu_engine_busy_seconds_total", engine="compute",
                     source="level_zero") == [sum(int(r[1]) for r in compute) / 1e6]
    # Sysfs still fills what Sysman does not say (fans, power limit, PCIe link).
    assert values_of(with_l0, "gpu_power_limit_watts", source="sysfs") == [190.0]
    temps = {t: float(c) for t, c in rows["temp"]}
    assert values_of(with_l0, "gpu_temperature_celsius", sensor="gpu",
                     source="level_zero") == [temps["1"]]
    assert values_of(with_l0, "gpu_temperature_celsius", sensor="vram",
                     source="level_zero") == [temps["2"]]


def test_engine_utilisation_from_activity_deltas(stub_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    """Two cycles or more: ratios from the stub's per-read steps, whatever the timing."""
    args = [*machine_args(B580), "--collector.level-zero", "--collector.interval", "0.2s"]
    with running(args, tmp_path, env=stub_env) as daemon:
        text = ""
        for _ in range(50):
            text = daemon.get().text
            if values_of(text, "gpu_engine_utilization_ratio", source="level_zero"):
                break
            time.sleep(0.1)
    steps = {r[0]: int(r[3]) / int(r[4]) for r in table()["engine"]}
    assert values_of(text, "gpu_engine_utilization_ratio", engine="compute",
                     source="level_zero") == [pytest.approx(steps["4"])]
    assert values_of(text, "gpu_engine_utilization_ratio", engine="render",
                     source="level_zero") == [pytest.approx(steps["5"])]
    assert values_of(text, "gpu_utilization_ratio", source="level_zero") == [
        pytest.approx(steps["0"])]


def test_without_the_flag_the_loader_changes_nothing(stub_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    with running([*machine_args(B580), *ONE_CYCLE], tmp_path, env=stub_env) as daemon:
        got = normalize(daemon.get().text)
    assert got == (GOLDEN / "intel-xe-b580.prom").read_text()
