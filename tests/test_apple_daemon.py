"""The real daemon with the fake macmon: on Linux (forced on) and as on a Mac.

``gpu-exporter --collector.apple --macmon.path tests/fakes/fake_macmon.py`` serves the
Apple series with the values of the recorded line (read here from the JSON), survives
the child being killed and counts it, and takes the child with it when it is killed.
``tests.fakes.as_macos`` runs the same daemon with ``sys.platform == "darwin"`` and no
pyudev: the Apple golden comes from there, with macmon found on PATH.

Regenerate the golden after an intended change:
``UPDATE_GOLDEN=1 python -m pytest tests/test_apple_daemon.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon import REPO, Daemon, daemon_env, promtool_check, running, values_of
from tests.test_golden import GOLDEN, normalize

pytestmark = pytest.mark.slow

FAKE = REPO / "tests" / "fakes" / "fake_macmon.py"
LINES = REPO / "tests" / "fixtures" / "macmon"
RECORDED = "v0.7-m1max-soc.jsonl"
FAST = ["--collector.interval", "200ms", "--collector.slow-interval", "1h"]


def no_gpu(tmp_path: Path) -> list[str]:
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    return ["--path.sysfs", str(empty), "--path.procfs", str(empty)]


def fake_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"FAKE_MACMON_LINES": str(LINES / RECORDED),
            "FAKE_MACMON_LOG": str(tmp_path / "macmon-runs.log"), **extra}


def child_pids(tmp_path: Path) -> list[int]:
    log = tmp_path / "macmon-runs.log"
    return [int(line.split()[0]) for line in log.read_text().splitlines()] if log.exists() else []


def running_process(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for init, not for us)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def scrape_value(d: Daemon, name: str, **labels: str) -> float | None:
    found = values_of(d.get().text, name, **labels)
    return found[0] if len(found) == 1 else None


def test_serves_apple_series_on_linux_and_survives_the_child_being_killed(
        tmp_path: Path) -> None:
    doc = json.loads((LINES / RECORDED).read_text())
    args = [*no_gpu(tmp_path), *FAST, "--collector.apple", "--macmon.path", str(FAKE)]
    with running(args, tmp_path, env=fake_env(tmp_path)) as d:
        text = d.get().text
        apple = {"vendor": "apple", "uuid": "soc0", "gpu": "0"}
        (info,) = [ls for n, ls in _samples(text) if n == "gpu_info"]
        assert info["name"] == doc["soc"]["chip_name"] == "Apple M1 Max"
        assert info["pci_bus_id"] == "" and info["source"] == "macmon"
        freq_mhz, ratio = doc["gpu_usage"]
        expected = {
            ("gpu_up", ()): 1,
            ("gpu_utilization_ratio", ()): ratio,
            ("gpu_clock_hertz", (("clock", "graphics"),)): freq_mhz * 1_000_000,
            ("gpu_clock_max_hertz", (("clock", "graphics"),)): doc["soc"]["gpu_freqs"][-1] * 1e6,
            ("gpu_power_watts", ()): doc["gpu_power"],
            ("gpu_temperature_celsius", (("sensor", "gpu"),)): doc["temp"]["gpu_temp_avg"],
            ("gpu_shared_memory_total_bytes", ()): doc["memory"]["ram_total"],
            ("gpu_shared_memory_used_bytes", ()): doc["memory"]["ram_usage"],
        }
        for (name, extra), want in expected.items():
            assert values_of(text, name, **apple, **dict(extra)) == [want], name
        assert values_of(text, "gpu_exporter_backend_up", backend="apple") == [1]

        # The forced-on check at start opened (and closed) the backend once: one child
        # before the one that serves. Neither is a restart.
        probe, first = child_pids(tmp_path)
        assert not running_process(probe)
        assert values_of(text, "gpu_exporter_child_restarts_total", backend="apple") == [0]
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: scrape_value(d, "gpu_exporter_collection_errors_total",
                                      backend="apple", reason="child_exited") == 1)
        wait_for(lambda: len(child_pids(tmp_path)) == 3)
        wait_for(lambda: scrape_value(d, "gpu_up", vendor="apple") == 1)
        text = d.get().text
        assert values_of(text, "gpu_power_watts", vendor="apple") == [doc["gpu_power"]]
        assert values_of(text, "gpu_exporter_backend_up", backend="apple") == [1]
        assert values_of(text, "gpu_exporter_child_restarts_total", backend="apple") == [1]
        assert not running_process(first)
        replacement = child_pids(tmp_path)[-1]
    assert not running_process(replacement)  # SIGTERM: the exporter's close() stopped it


def test_sigkill_of_the_exporter_takes_the_child_with_it(tmp_path: Path) -> None:
    """Linux: PR_SET_PDEATHSIG. The child here prints one line and then nothing, so no
    failed write (EPIPE, what ends it on macOS) could end it: only the signal can."""
    args = [*no_gpu(tmp_path), "--collector.interval", "1s", "--collector.apple",
            "--macmon.path", str(FAKE)]
    env = fake_env(tmp_path, FAKE_MACMON_MODE="hang", FAKE_MACMON_AFTER="1")
    with running(args, tmp_path, env=env) as d:
        child = child_pids(tmp_path)[-1]  # the first one was the forced-on check's
        assert running_process(child)
        d.proc.kill()  # no close(), no cleanup in the exporter
        d.proc.wait()
        try:
            wait_for(lambda: not running_process(child), timeout=2.0)
        finally:  # if it failed, do not leave a silent orphan behind
            if running_process(child):
                os.kill(child, signal.SIGKILL)


def _samples(text: str) -> list[tuple[str, dict[str, str]]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels)) for f in text_string_to_metric_families(text)
            for s in f.samples]


# -- as on a Mac ------------------------------------------------------------------------

def macmon_on_path(tmp_path: Path) -> dict[str, str]:
    """A ``macmon`` found on PATH, as Homebrew installs it: no --macmon.path, no flag."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    link = bin_dir / "macmon"
    if not link.exists():
        link.symlink_to(FAKE)
    return fake_env(tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.golden
def test_apple_machine_golden(tmp_path: Path) -> None:
    with running([*no_gpu(tmp_path), *FAST], tmp_path, env=macmon_on_path(tmp_path),
                 module="tests.fakes.as_macos") as d:
        scraped = d.get().text
        got = normalize(scraped)
    lint = promtool_check(scraped)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    path = GOLDEN / "apple-m1max.prom"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(got)
    assert got == path.read_text(), f"/metrics of the Apple machine differs from {path}"
    doc = json.loads((LINES / RECORDED).read_text())
    assert values_of(got, "gpu_power_watts", vendor="apple") == [doc["gpu_power"]]
    for backend in ("amd", "intel", "fdinfo", "nvidia"):
        assert values_of(got, "gpu_exporter_backend_up", backend=backend) == [0]


def test_the_whole_package_imports_and_runs_a_snapshot_as_on_a_mac(tmp_path: Path) -> None:
    imports = ("import sys, tests.fakes.as_macos\n"
               "assert sys.platform == 'darwin'\n"
               "import importlib, pkgutil, exporter\n"
               "names = [m.name for m in pkgutil.walk_packages(exporter.__path__, 'exporter.')\n"
               "         if m.name != 'exporter.__main__']  # that one runs the daemon\n"
               "for name in names: importlib.import_module(name)\n"
               "assert 'exporter.sources.amd.backend' in names\n"
               "assert 'exporter.sources.discovery' in names\n"
               "print(len(names))")
    env = daemon_env(None, macmon_on_path(tmp_path))
    done = subprocess.run([sys.executable, "-c", imports], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 30

    done = subprocess.run([sys.executable, "-m", "tests.fakes.as_macos", "snapshot",
                           "--log.format", "json", *FAST], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    backends = {b["backend"]: b for b in json.loads(done.stdout)["backends"]}
    for name in ("amd", "intel", "fdinfo"):
        assert backends[name]["reason"] == "not on Linux (this is darwin)"
        assert not backends[name]["up"]
    (device,) = backends["apple"]["devices"]
    assert backends["apple"]["up"] and device["info"]["name"] == "Apple M1 Max"
    assert "pyudev" not in done.stderr


def test_apple_is_off_on_linux_unless_forced_and_off_on_a_mac_when_switched_off(
        tmp_path: Path) -> None:
    from exporter.core.config import Config
    from exporter.pipeline.registry import COLLECTORS, build_backends

    assert sys.platform.startswith("linux")
    names = [b.name for b in build_backends(Config(collectors={**COLLECTORS, "nvidia": False}))]
    assert "apple" not in names and {"amd", "intel", "fdinfo"} <= set(names)
    forced = build_backends(Config(collectors={**COLLECTORS, "nvidia": False, "apple": True}))
    assert [b.name for b in forced][-1] == "apple"

    env = daemon_env(None, macmon_on_path(tmp_path))
    done = subprocess.run([sys.executable, "-m", "tests.fakes.as_macos", "snapshot",
                           "--no-collector.apple", "--no-collector.amd", *FAST],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names = [b["backend"] for b in json.loads(done.stdout)["backends"]]
    assert names == ["nvidia", "intel", "fdinfo", "pmu"]


MACOS = {"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix",
         "platform_machine": "arm64"}


@pytest.mark.network
def test_the_package_installs_on_macos_by_its_metadata(tmp_path: Path) -> None:
    """pip resolves the package for macOS 14 arm64 from wheels only, and pyudev stays out.

    pip evaluates ``sys_platform`` markers for the machine it runs on, not for
    ``--platform`` (pypa/pip#6117), so what a Mac installs is worked out here from the
    resolved metadata: the requirements reachable from gpu-exporter with every marker
    evaluated for macOS.
    """
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    report = tmp_path / "report.json"
    # Metadata is built in pip's isolated build environment, with the setuptools the
    # project asks for (a venv's own setuptools may be older and lack bdist_wheel).
    isolation: list[str] = []
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         *isolation, "--platform", "macosx_14_0_arm64", "--python-version", version,
         "--only-binary=:all:", "--target", str(tmp_path / "target"),
         "--report", str(report), str(REPO)],
        capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    if done.returncode != 0 and any(s in out for s in (
            "Could not fetch", "NewConnectionError", "Temporary failure in name resolution",
            "Network is unreachable", "No matching distribution found")):
        pytest.skip(f"no package index reachable: {out[-300:]}")
    assert done.returncode == 0, out
    resolved = {canonicalize_name(item["metadata"]["name"]): item
                for item in json.loads(report.read_text())["install"]}
    macos = {**default_environment(), **MACOS, "extra": ""}
    on_a_mac, todo = set(), ["gpu-exporter"]
    while todo:
        name = todo.pop()
        if name in on_a_mac:
            continue
        on_a_mac.add(name)
        for spec in resolved[name]["metadata"].get("requires_dist", []):
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate(macos):
                todo.append(canonicalize_name(req.name))
    assert "pyudev" not in on_a_mac and "pyudev" in resolved  # only by the Linux marker
    assert {"prometheus-client", "starlette", "uvicorn", "structlog", "pyyaml",
            "bcrypt", "nvidia-ml-py"} <= on_a_mac
    for name in on_a_mac - {"gpu-exporter"}:  # each a wheel a Mac can install
        url = resolved[name]["download_info"]["url"]
        assert url.endswith(("-none-any.whl", "universal2.whl", "arm64.whl")), url
