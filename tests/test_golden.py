"""One golden /metrics per fixture machine, from the real daemon over HTTP, linted by promtool.

Every ``tests/fixtures/<machine>/`` with a ``sys/`` tree is a machine: the daemon runs
with ``--path.sysfs``/``--path.procfs`` pointing at it (and the fake NVML reading its
``nvml.json``, or finding no driver), collects once (intervals of an hour), and its
/metrics is compared with ``tests/golden/<machine>.prom``. Values that change from run
to run (timings, the Python process's own metrics) are left out of the comparison.

A golden alone proves nothing: the second half of this file checks key values of the
scrape against the fixture files themselves, read here independently of the exporter.

Regenerate after an intended change: ``UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
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

pytestmark = pytest.mark.golden  # UPDATE_GOLDEN=1 python -m pytest -m golden

GOLDEN = REPO / "tests" / "golden"
MACHINES = sorted(p.name for p in FIXTURES.iterdir() if (p / "sys").is_dir())
ONE_CYCLE = ["--collector.interval", "1h", "--collector.slow-interval", "1h",
             "--collector.processes.interval", "1h"]
DROPPED = ("process_", "python_")  # the Python process's own metrics
# The exporter's timings: the series stay in the golden (their names and labels are part
# of the contract) with the value replaced by 0, since it differs on every run.
ZEROED = ("gpu_exporter_collection_duration_seconds",
          "gpu_exporter_last_collection_timestamp_seconds", "gpu_exporter_build_info",
          "gpu_exporter_backend_cpu_seconds_total",
          "gpu_xid_last_timestamp_seconds",  # the wall clock when the XID was drained
          # A GPU without an energy counter: its power over the milliseconds between the
          # daemon's first snapshots (docs/energy.md), all of it idle.
          "gpu_estimated_energy_joules_total", "gpu_idle_energy_joules_total",
          # Only with flags (tests/test_golden_flags.py): the wall clock of the config
          # load, and how many OTLP pushes fit in the daemon's life so far.
          "gpu_exporter_config_last_reload_success_timestamp_seconds",
          "gpu_exporter_otlp_exports_total")


def normalize(text: str) -> str:
    keep = []
    for line in text.splitlines():
        name = line.split(" ")[2] if line.startswith("# ") else line
        if name.startswith(DROPPED):
            continue
        if name.startswith(ZEROED) and not line.startswith("#"):
            series = line.rsplit(" ", 1)[0]
            series = re.sub(r'python_version="[^"]*"', 'python_version=""', series)
            line = f"{series} 0"
        keep.append(line)
    return "\n".join(keep) + "\n"


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Every machine's /metrics; the daemons start together to keep the suite quick."""
    tmp = tmp_path_factory.mktemp("golden")
    out: dict[str, str] = {}
    with _all_running(tmp, MACHINES) as daemons:
        for name, daemon in daemons.items():
            out[name] = daemon.get().text
    yield out


def _all_running(tmp: Path, names: list[str],  # type: ignore[no-untyped-def]
                 flags: list[str] = ONE_CYCLE):
    from contextlib import ExitStack, contextmanager

    @contextmanager
    def stack():  # type: ignore[no-untyped-def]
        with ExitStack() as es:
            daemons = {}
            for name in names:
                machine = FIXTURES / name
                nvml = machine / "nvml.json"
                daemons[name] = es.enter_context(running(
                    [*machine_args(machine), *flags], tmp,
                    nvml_json=nvml if nvml.exists() else None, ready=False))
            for d in daemons.values():
                d.wait_ready(timeout=60)
            yield daemons

    return stack()


@pytest.mark.slow
@pytest.mark.parametrize("machine", MACHINES)
def test_golden(machine: str, scrapes: dict[str, str]) -> None:
    got = normalize(scrapes[machine])
    path = GOLDEN / f"{machine}.prom"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no golden for {machine}: run with UPDATE_GOLDEN=1"
    assert got == path.read_text(), f"/metrics of {machine} differs from {path}"


@pytest.mark.slow
@pytest.mark.parametrize("machine", MACHINES)
def test_promtool_lints(machine: str, scrapes: dict[str, str]) -> None:
    result = promtool_check(scrapes[machine])
    assert result.returncode == 0, result.stdout + result.stderr


# -- key values against the fixture files, read independently ---------------------------

def value(text: str, name: str, **labels: str) -> float:
    found = values_of(text, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0]


def card_dir(machine: str, driver: str) -> Path:
    drm = FIXTURES / machine / "sys" / "class" / "drm"
    for card in sorted(drm.iterdir()):
        dev = card / "device"
        if card.name.startswith("card") and "-" not in card.name and \
                (dev / "driver").resolve().name == driver:
            return dev
    raise AssertionError(f"no {driver} card in {machine}")


def hwmon_file(dev: Path, name: str) -> str:
    (hwmon,) = (dev / "hwmon").iterdir()
    return (hwmon / name).read_text().strip()


AMD = [m for m in MACHINES if m.startswith("amd-")]


@pytest.mark.slow
@pytest.mark.parametrize("machine", AMD)
def test_amd_values_match_the_sysfs_files(machine: str, scrapes: dict[str, str]) -> None:
    text, dev = scrapes[machine], card_dir(machine, "amdgpu")
    busy = int((dev / "gpu_busy_percent").read_text())
    assert value(text, "gpu_utilization_ratio", vendor="amd") == pytest.approx(busy / 100)
    if machine.startswith("amd-mi300x"):  # MI300 has no edge sensor: hwmon temp2 is the junction
        junction_mdeg = int(hwmon_file(dev, "temp2_input"))
        assert value(text, "gpu_temperature_celsius", sensor="junction") == junction_mdeg / 1000
    else:
        edge_mdeg = int(hwmon_file(dev, "temp1_input"))
        assert value(text, "gpu_temperature_celsius", sensor="edge") == edge_mdeg / 1000
    if (dev / "mem_info_vram_used").exists() and machine != "amd-apu-phoenix":
        vram_used = int((dev / "mem_info_vram_used").read_text())
        assert value(text, "gpu_memory_used_bytes", vendor="amd") == vram_used
    if (dev / "mem_info_gtt_used").exists():
        gtt_used = int((dev / "mem_info_gtt_used").read_text())
        assert value(text, "gpu_shared_memory_used_bytes", vendor="amd") >= gtt_used
    for label in (next((dev / "hwmon").iterdir())).glob("in*_label"):  # mV per rail
        millivolts = int((label.parent / label.name.replace("label", "input")).read_text())
        assert value(text, "gpu_voltage_volts", vendor="amd",
                     rail=label.read_text().strip()) == millivolts / 1000


HWMON_SENSOR = {"edge": "edge", "junction": "junction", "mem": "memory"}


@pytest.mark.slow
@pytest.mark.parametrize("machine", AMD)
def test_amd_thresholds_carry_the_sensor_they_belong_to(machine: str,
                                                        scrapes: dict[str, str]) -> None:
    """Each hwmon tempN_crit / tempN_emergency is served with the sensor of its tempN_label,
    and no threshold without one (an RX 7800 XT: edge 100, junction 110, memory 108 °C)."""
    text, dev = scrapes[machine], card_dir(machine, "amdgpu")
    expected: dict[tuple[str, str], float] = {}
    for label in (next((dev / "hwmon").iterdir())).glob("temp*_label"):
        sensor = HWMON_SENSOR[label.read_text().strip()]
        for suffix, threshold in (("crit", "critical"), ("emergency", "shutdown")):
            path = label.parent / label.name.replace("label", suffix)
            if path.exists():
                expected[(sensor, threshold)] = int(path.read_text()) / 1000
    served = {(labels["sensor"], labels["threshold"]): v for name, labels, v in
              _samples(text) if name == "gpu_temperature_threshold_celsius"
              and labels.get("source") == "sysfs"}
    assert served == expected
    if machine == "amd-rdna3-rx7800xt":
        assert {s: served[(s, "critical")] for s in ("edge", "junction", "memory")} == {
            "edge": 100.0, "junction": 110.0, "memory": 108.0}


@pytest.mark.slow
@pytest.mark.parametrize("machine", [m for m in MACHINES if m.startswith(("amd-", "intel-"))])
def test_gpu_info_labels_come_from_the_drivers_files(machine: str,
                                                     scrapes: dict[str, str]) -> None:
    """``architecture``: the KFD topology node of the card's PCI address (gfx_target_version
    110003 -> gfx1103, 90402 -> gfx942); ``driver_version``: the kernel release (in-tree
    amdgpu, i915 and xe have no /sys/module/<driver>/version). Each is filled exactly where
    the machine holds the file, and left empty where it does not."""
    root = FIXTURES / machine
    infos = [labels for name, labels, _ in _samples(scrapes[machine])
             if name == "gpu_info" and labels["source"] == "sysfs"]
    assert infos
    release = root / "proc" / "sys" / "kernel" / "osrelease"
    for labels in infos:
        assert labels["driver_version"] == (release.read_text().strip()
                                            if release.exists() else "")
    expected = {}
    for props in (root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes").glob(
            "*/properties"):
        p = dict(line.split() for line in props.read_text().splitlines())
        version, location = int(p["gfx_target_version"]), int(p["location_id"])
        if version:
            bus = f"{int(p['domain']):04x}:{location >> 8:02x}:{(location >> 3) & 31:02x}." \
                  f"{location & 7}"
            expected[bus] = f"gfx{version // 10000}{version // 100 % 100:x}{version % 100:x}"
    if machine.startswith("amd-"):  # Intel's comes from its PCI id table (vendors-intel.md)
        for labels in infos:
            assert labels["architecture"] == expected.get(labels["pci_bus_id"], "")
    if machine == "amd-apu-phoenix":
        assert [i["architecture"] for i in infos] == ["gfx1103"]
    if machine == "intel-xe-b580":
        assert [i["driver_version"] for i in infos] == ["6.16.7"]


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        match = re.match(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$', line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            out.append((match.group(1), labels, float(match.group(3))))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("machine", [m for m in MACHINES if m.startswith(("amd-", "intel-"))])
def test_health_checks_are_served_only_where_a_rule_can_fire(machine: str,
                                                              scrapes: dict[str, str]) -> None:
    """No AMD or Intel GPU read from sysfs alone has a rule of the pcie check (XID 79 and
    pcie_bif RAS counts are NVML's and amdsmi's); a GPU has a thermal check only with a
    temperature threshold or a thermal throttle reason of its own."""
    samples = _samples(scrapes[machine])
    checks = {labels["check"] for name, labels, _ in samples
              if name == "gpu_health_check_status"}
    amdsmi = any(labels.get("source") == "amdsmi" for _, labels, _ in samples)
    if not amdsmi:
        assert "pcie" not in checks
    thresholds = any(name == "gpu_temperature_threshold_celsius" for name, _, _ in samples)
    thermal_reasons = any(name == "gpu_clock_throttle_active"
                          and labels["reason"] in ("hw_thermal", "sw_thermal")
                          for name, labels, _ in samples)
    assert ("thermal" in checks) == (thresholds or thermal_reasons)
    if machine == "amd-apu-phoenix":  # an APU: no hwmon thresholds, no throttle status
        assert checks == {"driver"}


@pytest.mark.slow
def test_apu_carve_out_is_not_reported_as_device_memory(scrapes: dict[str, str]) -> None:
    text = scrapes["amd-apu-phoenix"]
    assert not any(n == "gpu_memory_total_bytes" for n, _ in parse_samples(text))
    assert any(n == "gpu_shared_memory_total_bytes" for n, _ in parse_samples(text))


@pytest.mark.slow
def test_intel_b580_values_match_the_sysfs_files(scrapes: dict[str, str]) -> None:
    text, dev = scrapes["intel-xe-b580"], card_dir("intel-xe-b580", "xe")
    act = int((dev / "tile0" / "gt0" / "freq0" / "act_freq").read_text())
    assert value(text, "gpu_clock_hertz", clock="graphics") == act * 1e6
    pkg = [f for f in (next((dev / "hwmon").iterdir())).glob("temp*_label")
           if f.read_text().strip() == "pkg"]
    mdeg = int((pkg[0].parent / pkg[0].name.replace("label", "input")).read_text())
    assert value(text, "gpu_temperature_celsius", sensor="package") == mdeg / 1000


@pytest.mark.slow
@pytest.mark.parametrize("machine", [m for m in MACHINES
                                     if (FIXTURES / m / "nvml.json").exists()])
def test_nvidia_values_match_the_fake_nvml_config(machine: str,
                                                  scrapes: dict[str, str]) -> None:
    text = scrapes[machine]
    config = json.loads((FIXTURES / machine / "nvml.json").read_text())
    for spec in config.get("gpus", []):
        if "uuid" not in spec or "power_mw" not in spec:
            continue
        lost = spec.get("uuid") in {config["gpus"][i].get("uuid")
                                    for i in config.get("faults", {}).get("lost_gpus", [])}
        up = value(text, "gpu_up", uuid=spec["uuid"])
        assert up == (0 if lost else 1)
        if not lost:
            assert value(text, "gpu_power_watts", uuid=spec["uuid"]) == spec["power_mw"] / 1000
            for proc in spec.get("processes", []):
                assert value(text, "gpu_process_memory_used_bytes", uuid=spec["uuid"],
                             pid=str(proc["pid"])) == proc["used_memory_bytes"]


@pytest.mark.slow
def test_fdinfo_process_memory_matches_the_fdinfo_files(scrapes: dict[str, str]) -> None:
    """The rx7800xt machine's processes: drm-resident-vram summed per distinct client."""
    proc = FIXTURES / "amd-rdna3-rx7800xt" / "proc"
    per_pid: dict[str, dict[str, int]] = {}
    seen: set[str] = set()
    for pid_dir in sorted(proc.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        if not pid_dir.name.isdigit():
            continue
        for info in sorted((pid_dir / "fdinfo").iterdir()):
            if not info.is_file():
                continue
            fields = dict(line.split(":", 1) for line in info.read_text().splitlines()
                          if ":" in line)
            fields = {k.strip(): v.strip() for k, v in fields.items()}
            client = fields.get("drm-client-id")
            if client is None or client in seen:
                continue
            seen.add(client)
            raw = fields.get("drm-resident-vram") or fields.get("drm-memory-vram")
            if raw is None:
                continue
            number, _, unit = raw.partition(" ")
            size = int(number) * {"": 1, "KiB": 1024, "MiB": 1 << 20}[unit]
            per_pid.setdefault(pid_dir.name, {"vram": 0})["vram"] += size
    assert per_pid, "fixture has no amdgpu clients"
    text = scrapes["amd-rdna3-rx7800xt"]
    for pid, mem in per_pid.items():
        assert value(text, "gpu_process_memory_used_bytes", pid=pid,
                     source="fdinfo") == mem["vram"]


@pytest.mark.slow
def test_mixed_machine_numbers_gpus_by_pci_bus_id(scrapes: dict[str, str]) -> None:
    infos = {dict(ls)["pci_bus_id"]: dict(ls) for n, ls in parse_samples(scrapes["mixed"])
             if n == "gpu_info"}
    ordered = sorted(infos)
    assert [infos[b]["gpu"] for b in ordered] == [str(i) for i in range(len(ordered))]
    assert {infos[b]["vendor"] for b in ordered} == {"amd", "nvidia", "intel"}


@pytest.mark.slow
def test_turing_t4_retires_pages_and_has_no_gpm(scrapes: dict[str, str]) -> None:
    """nvidia-t4 (telegraf_tesla-t4.xml): a GPU before Ampere reports retired pages (0 is a
    series), no remapped rows (N/A) and no GPM; the rest read back from its nvml.json."""
    text = scrapes["nvidia-t4"]
    (gpu,) = json.loads((FIXTURES / "nvidia-t4" / "nvml.json").read_text())["gpus"]
    uuid = gpu["uuid"]
    for cause, pages in gpu["retired_pages"].items():
        assert value(text, "gpu_memory_retired_pages", uuid=uuid, cause=cause) == pages
    samples = parse_samples(text)
    assert not [n for n, ls in samples if ("source", "nvml_gpm") in ls]  # GPM: Hopper on
    families = {n for n, _ in samples}
    assert not families & {"gpu_sm_active_ratio", "gpu_tensor_active_ratio",
                           "gpu_memory_remapped_rows", "gpu_memory_remap_pending",
                           "gpu_memory_remap_failed"}
    h100 = parse_samples(scrapes["nvidia-h100x2"])  # the same checks can fail
    assert [n for n, ls in h100 if ("source", "nvml_gpm") in ls]
    assert "gpu_memory_remap_pending" in {n for n, _ in h100}
    (info,) = [ls for n, ls in parse_samples(text) if n == "gpu_info"]
    assert dict(info)["architecture"] == "turing" and dict(info)["name"] == gpu["name"]
    assert dict(info)["serial"] == gpu["serial"]
    mib = 1 << 20
    assert value(text, "gpu_memory_total_bytes", uuid=uuid) == gpu["memory_total_bytes"]
    assert value(text, "gpu_memory_used_bytes", uuid=uuid) == gpu["memory_used_bytes"]
    assert gpu["memory_used_bytes"] == 1032 * mib  # fb_memory_usage/used in the capture
    assert value(text, "gpu_temperature_celsius", uuid=uuid, sensor="gpu") == \
        gpu["temperature_gpu"]
    assert not values_of(text, "gpu_temperature_celsius", uuid=uuid, sensor="memory")
    assert value(text, "gpu_pcie_link_width", uuid=uuid) == gpu["pcie_width"]
    assert value(text, "gpu_clock_hertz", uuid=uuid, clock="memory") == \
        gpu["clocks_mhz"]["memory"] * 1e6
    for (corrected, uncorrected), block in ((gpu["ecc_locations"][b], b)
                                            for b in gpu["ecc_locations"]):
        assert value(text, "gpu_ras_errors_total", uuid=uuid, block=block,
                     severity="corrected") == corrected
        assert value(text, "gpu_ras_errors_total", uuid=uuid, block=block,
                     severity="uncorrected") == uncorrected


# i915 busy events in the fixture tree: "<class><instance>-busy" -> the engine label.
I915_LABELS = {"rcs": "render", "bcs": "copy", "vcs": "video", "vecs": "video_enhance",
               "ccs": "compute"}


@pytest.mark.slow
@pytest.mark.parametrize("machine", ["intel-i915-cometlake", "intel-i915-arc-a380"])
def test_i915_pmu_utilisation_matches_the_fake_counters(machine: str,
                                                        scrapes: dict[str, str]) -> None:
    """One cycle after the baseline: each class's busy-ns step over the enabled-time step,
    averaged over its instances, from the event files and perf.json read here."""
    (pmu_dir,) = (FIXTURES / machine / "sys" / "bus" / "event_source" / "devices").iterdir()
    (pmu,) = json.loads((FIXTURES / machine / "perf.json").read_text())["pmus"].values()
    shares: dict[str, list[float]] = {}
    for event in sorted((pmu_dir / "events").glob("*-busy")):
        name = event.name.removesuffix("-busy").rstrip("0123456789")
        config = event.read_text().strip().removeprefix("config=")
        shares.setdefault(I915_LABELS[name], []).append(
            pmu["counters"][config][1] / pmu["time_step_ns"])
    text = scrapes[machine]
    for label, values in shares.items():
        assert value(text, "gpu_engine_utilization_ratio", engine=label,
                     source="pmu") == pytest.approx(sum(values) / len(values))
    assert value(text, "gpu_utilization_ratio", vendor="intel", source="pmu") == \
        pytest.approx(max(sum(v) / len(v) for v in shares.values()))


@pytest.mark.slow
def test_xe_pmu_utilisation_matches_the_fake_ticks(scrapes: dict[str, str]) -> None:
    """B580: active / total ticks per engine (config bits 20-27 = class, per xe_pmu.c)."""
    (pmu,) = json.loads((FIXTURES / "intel-xe-b580" / "perf.json").read_text())["pmus"].values()
    classes = {0: "render", 1: "copy", 2: "video", 3: "video_enhance", 4: "compute"}
    shares: dict[str, list[float]] = {}
    for config, (_, step) in pmu["counters"].items():
        number = int(config, 16)
        if number & 0xFFF == 2:  # engine-active-ticks; its total is the same config + 1
            total = pmu["counters"][f"0x{number + 1:x}"][1]
            shares.setdefault(classes[number >> 20 & 0xFF], []).append(step / total)
    text = scrapes["intel-xe-b580"]
    for label, values in shares.items():
        assert value(text, "gpu_engine_utilization_ratio", engine=label,
                     source="pmu") == pytest.approx(sum(values) / len(values))


@pytest.mark.slow
def test_mps_clients_are_served_with_their_memory_and_context(scrapes: dict[str, str]) -> None:
    text = scrapes["nvidia-h100-mps"]
    config = json.loads((FIXTURES / "nvidia-h100-mps" / "nvml.json").read_text())
    procs = config["gpus"][0]["processes"]
    assert sum(bool(p.get("mps")) for p in procs) == 2
    for proc in procs:
        pid = str(proc["pid"])
        assert value(text, "gpu_process_memory_used_bytes", pid=pid) == proc["used_memory_bytes"]
        context = "mps_client" if proc.get("mps") else "compute"
        assert value(text, "gpu_process_context_info", pid=pid) == 1
        assert value(text, "gpu_process_context_info", pid=pid, context=context) == 1


@pytest.mark.slow
def test_each_counted_xid_is_named_by_the_catalogue(scrapes: dict[str, str]) -> None:
    config = json.loads((FIXTURES / "nvidia-h100x2" / "nvml.json").read_text())
    assert sorted(set(config["gpus"][0]["xids"])) == [13, 79]
    info = {(dict(ls)["xid"], dict(ls)["meaning"]): v
            for (n, ls), v in parse_samples(scrapes["nvidia-h100x2"]).items()
            if n == "gpu_xid_info"}
    # NVIDIA's catalogue: 79 "GPU has fallen off the bus", 13 "Graphics Engine Exception"
    assert info == {("79", "GPU has fallen off the bus"): 1.0,
                    ("13", "graphics engine exception"): 1.0}
