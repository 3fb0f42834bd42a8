"""Golden /metrics in dcgm-exporter names (``--metric-names dcgm``, ``dcgm4.9`` and their
``both`` modes), from the real daemon on the NVIDIA and mixed fixture machines, linted by
promtool, key values re-read.

``tests/golden/dcgm/<machine>.prom`` is the dcgm mode, ``tests/golden/dcgm4.9/`` the dcgm4.9
one; ``both`` (``both-dcgm4.9``) must be exactly the gpu mode's golden (tests/test_golden.py)
plus the dcgm (dcgm4.9) one. ``Hostname`` comes from ``NODE_NAME``, as in
dcgm-exporter, set here so the golden does not depend on the machine running the tests.

Regenerate after an intended change: ``UPDATE_GOLDEN=1 python -m pytest tests/test_dcgm_golden.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.daemon import (
    FIXTURES,
    REPO,
    machine_args,
    parse_samples,
    promtool_check,
    running,
    values_of,
)
from tests.fakes.fake_nvml import FakeGPU, FakeNVML
from tests.test_golden import GOLDEN, ONE_CYCLE, normalize

MACHINES = ["mixed", "nvidia-h100-lost", "nvidia-h100x2"]
GENERATIONS = {"dcgm": "both", "dcgm4.9": "both-dcgm4.9"}  # each with its both mode
MODES = (*GENERATIONS, *GENERATIONS.values())
NODE = "golden-node"
MIB = 1 << 20
# What promtool's lint says about dcgm-exporter's own names, which a drop-in must keep:
# the camelCase label modelName, and "counter" inside DCGM_FI_DEV_PCIE_REPLAY_COUNTER.
DCGM_NAMING = ("label names should be written in 'snake_case' not 'camelCase'",
               "metric name should not include type 'counter'")

pytestmark = [pytest.mark.slow, pytest.mark.golden]  # UPDATE_GOLDEN=1 pytest -m golden


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], str]]:
    """(machine, mode) -> /metrics; all daemons start together to keep the suite quick."""
    tmp = tmp_path_factory.mktemp("dcgm-golden")
    with ExitStack() as es:
        daemons = {}
        for machine in MACHINES:
            root = FIXTURES / machine
            for mode in MODES:
                daemons[machine, mode] = es.enter_context(running(
                    [*machine_args(root), *ONE_CYCLE, "--metric-names", mode], tmp,
                    nvml_json=root / "nvml.json", env={"NODE_NAME": NODE}, ready=False))
        for d in daemons.values():
            d.wait_ready(timeout=60)
        yield {key: d.get().text for key, d in daemons.items()}


@pytest.mark.parametrize("gen", GENERATIONS)
@pytest.mark.parametrize("machine", MACHINES)
def test_dcgm_golden(machine: str, gen: str, scrapes: dict[tuple[str, str], str]) -> None:
    got = normalize(scrapes[machine, gen])
    path = GOLDEN / gen / f"{machine}.prom"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no golden for {machine}: run with UPDATE_GOLDEN=1"
    assert got == path.read_text(), f"/metrics of {machine} differs from {path}"


@pytest.mark.parametrize("gen", GENERATIONS)
@pytest.mark.parametrize("machine", MACHINES)
def test_both_is_our_names_plus_dcgm_names(machine: str, gen: str,
                                           scrapes: dict[tuple[str, str], str]) -> None:
    both = parse_samples(normalize(scrapes[machine, GENERATIONS[gen]]))
    gpu = parse_samples((GOLDEN / f"{machine}.prom").read_text())
    dcgm = parse_samples(normalize(scrapes[machine, gen]))
    assert both == {**gpu, **dcgm}


@pytest.mark.parametrize("gen", GENERATIONS)
@pytest.mark.parametrize("machine", MACHINES)
def test_dcgm_mode_keeps_process_and_exporter_families_and_drops_the_other_gpu_ones(
        machine: str, gen: str, scrapes: dict[tuple[str, str], str]) -> None:
    names = {n for n, _ in parse_samples(scrapes[machine, gen])}
    ours = {n for n in names if n.startswith("gpu_")}
    assert ours and all(n.startswith(("gpu_process_", "gpu_exporter_", "gpu_health_"))
                        for n in ours), ours
    assert {"gpu_exporter_up", "gpu_process_memory_used_bytes"} <= ours
    gpu_mode = {n for n, _ in parse_samples((GOLDEN / f"{machine}.prom").read_text())}
    assert {n for n in gpu_mode
            if n.startswith(("gpu_process_", "gpu_exporter_", "gpu_health_"))} <= names
    assert any(n.startswith("DCGM_FI_") for n in names)


@pytest.mark.parametrize(("machine", "mode"), [(m, mode) for m in MACHINES for mode in MODES])
def test_promtool_lints_all_but_dcgm_exporters_own_names(
        machine: str, mode: str, scrapes: dict[tuple[str, str], str]) -> None:
    result = promtool_check(scrapes[machine, mode])
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    other = [p for p in problems
             if not (p.startswith(("DCGM_FI_", "DCGM_EXP_")) and p.endswith(DCGM_NAMING))]
    assert other == [], other
    assert result.returncode in (0, 3)  # 3: lint problems only, and only those above


def test_a_label_whose_value_is_unknown_is_left_out() -> None:
    """docs/dcgm-compat.md: no DCGM series carries an empty label; the mixed machine's AMD
    and Intel cards, whose tree holds no kernel release, have no DCGM_FI_DRIVER_VERSION,
    and its NVIDIA GPU has NVML's."""
    text = (GOLDEN / "dcgm" / "mixed.prom").read_text()
    dcgm = [line for line in text.splitlines() if line.startswith("DCGM_")]
    assert dcgm and not [line for line in dcgm if '=""' in line]
    assert not (FIXTURES / "mixed" / "proc" / "sys" / "kernel" / "osrelease").exists()
    temps = [line for line in dcgm if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert {('device="nvidia0"' in t, "DCGM_FI_DRIVER_VERSION=" in t) for t in temps} == {
        (True, True), (False, False)}


def test_every_dcgm_family_in_the_goldens_is_documented() -> None:
    doc = (REPO / "docs" / "dcgm-compat.md").read_text()
    emitted = {n for gen in GENERATIONS for golden in (GOLDEN / gen).glob("*.prom")
               for n, _ in parse_samples(golden.read_text()) if n.startswith("DCGM_")}
    assert emitted and {n for n in emitted if f"`{n}`" not in doc} == set()


# -- key values against the fixture files, read independently ---------------------------

def value(text: str, name: str, **labels: str) -> float:
    found = values_of(text, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0]


@pytest.mark.parametrize("machine", MACHINES)
def test_nvidia_values_match_the_fake_nvml_config(machine: str,
                                                  scrapes: dict[tuple[str, str], str]) -> None:
    """dcgm units from nvml.json (FakeGPU's defaults for what it leaves out)."""
    text = scrapes[machine, "dcgm"]
    config = json.loads((FIXTURES / machine / "nvml.json").read_text())
    lost = set(config.get("faults", {}).get("lost_gpus", []))
    for index, spec in enumerate(config["gpus"]):
        gpu = FakeGPU(index=index, **{k: v for k, v in spec.items() if k in FAKE_FIELDS})
        if index in lost:  # dcgm-exporter shows nothing for a GPU it cannot read; nor do we
            assert not values_of(text, "DCGM_FI_DEV_POWER_USAGE", UUID=gpu.uuid)
            continue
        sel = {"UUID": gpu.uuid, "Hostname": NODE, "device": f"nvidia{gpu.minor}",
               "pci_bus_id": gpu.pci_bus_id, "modelName": gpu.name,
               "DCGM_FI_DRIVER_VERSION": config.get("driver_version", FakeNVML([]).driver_version)}
        used = sum(p.get("used_memory_bytes") or 0 for p in spec.get("processes", []))
        assert value(text, "DCGM_FI_DEV_FB_USED", **sel) == used / MIB
        assert value(text, "DCGM_FI_DEV_FB_FREE", **sel) == (
            gpu.memory_total_bytes - gpu.memory_reserved_bytes - used) / MIB
        assert value(text, "DCGM_FI_DEV_FB_RESERVED", **sel) == gpu.memory_reserved_bytes / MIB
        assert value(text, "DCGM_FI_DEV_POWER_USAGE", **sel) == gpu.power_mw / 1000
        assert value(text, "DCGM_FI_DEV_GPU_UTIL", **sel) == gpu.utilization_gpu
        assert value(text, "DCGM_FI_DEV_MEM_COPY_UTIL", **sel) == gpu.utilization_memory
        assert value(text, "DCGM_FI_DEV_GPU_TEMP", **sel) == gpu.temperature_gpu
        assert value(text, "DCGM_FI_DEV_SM_CLOCK", **sel) == gpu.clocks_mhz["sm"]
        assert value(text, "DCGM_FI_DEV_MEM_CLOCK", **sel) == gpu.clocks_mhz["memory"]
        assert value(text, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", **sel) == gpu.pcie_replays
        assert value(text, "DCGM_FI_PROF_PCIE_TX_BYTES", **sel) == gpu.pcie_tx_kbps * 1024
        assert value(text, "DCGM_FI_DEV_XID_ERRORS", **sel) == (gpu.xids[-1] if gpu.xids else 0)
        if "nvmlDeviceGetTotalEnergyConsumption" not in config.get("faults", {}).get(
                "not_supported", {}).get(str(index), []):
            assert value(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **sel) == gpu.energy_mj
        if gpu.architecture >= 9:  # GPM: Hopper and later
            assert value(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", **sel) == pytest.approx(
                gpu.gpm["any_tensor_util"] / 100)


@pytest.mark.parametrize("machine", MACHINES)
def test_nvidia_values_in_the_4_9_names_and_units_match_the_fake_nvml_config(
        machine: str, scrapes: dict[tuple[str, str], str]) -> None:
    """dcgm4.9's base units (Hz, J, ratio, bytes) from nvml.json, and its label names."""
    text = scrapes[machine, "dcgm4.9"]
    config = json.loads((FIXTURES / machine / "nvml.json").read_text())
    lost = set(config.get("faults", {}).get("lost_gpus", []))
    for index, spec in enumerate(config["gpus"]):
        gpu = FakeGPU(index=index, **{k: v for k, v in spec.items() if k in FAKE_FIELDS})
        if index in lost:
            assert not values_of(text, "DCGM_FI_DEV_BOARD_POWER_WATTS", UUID=gpu.uuid)
            continue
        sel = {"UUID": gpu.uuid, "hostname": NODE, "device": f"nvidia{gpu.minor}",
               "DCGM_FI_SYSTEM_DRIVER_VERSION": config.get(
                   "driver_version", FakeNVML([]).driver_version)}
        used = sum(p.get("used_memory_bytes") or 0 for p in spec.get("processes", []))
        assert value(text, "DCGM_FI_DEV_FB_USED_BYTES", **sel) == used
        assert value(text, "DCGM_FI_DEV_FB_RESERVED_BYTES", **sel) == gpu.memory_reserved_bytes
        assert value(text, "DCGM_FI_DEV_BOARD_POWER_WATTS", **sel) == gpu.power_mw / 1000
        assert value(text, "DCGM_FI_DEV_GPU_UTIL_RATIO", **sel) == gpu.utilization_gpu / 100
        assert value(text, "DCGM_FI_DEV_GPU_TEMP_CELSIUS", **sel) == gpu.temperature_gpu
        assert value(text, "DCGM_FI_DEV_SM_CLOCK_HERTZ", **sel) == gpu.clocks_mhz["sm"] * 1e6
        assert value(text, "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", **sel) == (
            gpu.pcie_tx_kbps * 1024)
        assert value(text, "DCGM_FI_DEV_XID_ERROR", **sel) == (gpu.xids[-1] if gpu.xids else 0)
        if "nvmlDeviceGetTotalEnergyConsumption" not in config.get("faults", {}).get(
                "not_supported", {}).get(str(index), []):
            assert value(text, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", **sel) == pytest.approx(
                gpu.energy_mj / 1000, rel=1e-11)
    assert "Hostname=" not in text and "DCGM_FI_DRIVER_VERSION=" not in text


FAKE_FIELDS = set(FakeGPU.__dataclass_fields__) - {"index", "processes"}


def hwmon(machine: str, card: str) -> Path:
    (path,) = (FIXTURES / machine / "sys" / "class" / "drm" / card / "device" / "hwmon").iterdir()
    return path


def labelled(path: Path, kind: str, label: str) -> int:
    """The ``<kind>N_input`` whose ``<kind>N_label`` is ``label``."""
    for f in path.glob(f"{kind}*_label"):
        if f.read_text().strip() == label:
            return int((path / f.name.replace("_label", "_input")).read_text())
    raise AssertionError(f"no {kind} labelled {label} in {path}")


def test_amd_and_intel_values_on_the_mixed_machine_match_their_sysfs_files(
        scrapes: dict[tuple[str, str], str]) -> None:
    text = scrapes["mixed", "dcgm"]
    amd, intel = hwmon("mixed", "card1"), hwmon("mixed", "card2")
    busy = int((amd.parent.parent / "gpu_busy_percent").read_text())
    assert value(text, "DCGM_FI_DEV_GPU_UTIL", device="card1") == busy
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", device="card1") == labelled(
        amd, "temp", "edge") / 1000
    assert value(text, "DCGM_FI_DEV_MEMORY_TEMP", device="card1") == labelled(
        amd, "temp", "mem") / 1000
    assert value(text, "DCGM_FI_DEV_SM_CLOCK", device="card1") == labelled(
        amd, "freq", "sclk") / 1e6
    assert value(text, "DCGM_FI_DEV_POWER_USAGE", device="card1") == int(
        (amd / "power1_average").read_text()) / 1e6
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", device="card2") == labelled(
        intel, "temp", "pkg") / 1000
    assert value(text, "DCGM_FI_DEV_MEMORY_TEMP", device="card2") == labelled(
        intel, "temp", "vram") / 1000
    assert value(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", device="card2") == labelled(
        intel, "energy", "card") / 1000  # µJ -> mJ
    # One dashboard over the fleet: every vendor under the same names.
    gpus = {dict(ls).get("device") for n, ls in parse_samples(text) if n == "DCGM_FI_DEV_GPU_TEMP"}
    assert gpus == {"nvidia0", "card1", "card2"}
