"""Start the real daemon as a subprocess on a free port, and scrape it over HTTP.

Used by the end-to-end and golden tests. NVIDIA is faked at the ``pynvml`` module
boundary: ``tests/fakes/pynvml_shim`` goes first on PYTHONPATH and reads the JSON
named by FAKE_NVML_JSON; every other code path is the one a user runs.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SHIM = REPO / "tests" / "fakes" / "pynvml_shim"
# sitecustomize: perf_event_open answered by tests/fakes/fake_perf.py when FAKE_PERF_JSON is set
PERF_SHIM = REPO / "tests" / "fakes" / "perf_shim"
EMPTY_PROC = FIXTURES / "empty-proc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fixture_ids(machine: Path) -> list[str]:
    """The fixture machine's own amdgpu.ids (present or not), named so that no table or
    pci.ids of the machine running the tests is read: AMD names stay the same anywhere."""
    return ["--path.amdgpu-ids", str(machine / "usr/share/libdrm/amdgpu.ids")]


def machine_args(machine: Path) -> list[str]:
    """Flags that point the daemon at a fixture machine's trees."""
    proc = machine / "proc" if (machine / "proc").is_dir() else EMPTY_PROC
    return ["--path.sysfs", str(machine / "sys"), "--path.procfs", str(proc),
            *fixture_ids(machine)]


def _fake_perf(args: Sequence[str]) -> dict[str, str]:
    """FAKE_PERF_JSON for a fixture machine with a ``perf.json`` beside its ``sys/``: its
    PMU tree must never reach the real kernel's perf_event_open (another PMU's type)."""
    args = list(args)
    if "--path.sysfs" not in args[:-1]:
        return {}
    perf = Path(args[args.index("--path.sysfs") + 1]).parent / "perf.json"
    return {"FAKE_PERF_JSON": str(perf)} if perf.exists() else {}


def daemon_env(nvml_json: Path | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(PERF_SHIM), str(REPO)])
    env["PYTHONUNBUFFERED"] = "1"
    if nvml_json is not None:
        env["FAKE_NVML_JSON"] = str(nvml_json)
        perf = nvml_json.parent / "perf.json"  # a machine's fake PMU counters, as in running()
        if perf.exists():
            env["FAKE_PERF_JSON"] = str(perf)
    else:  # a fake NVML that finds no driver, like a machine without NVIDIA GPUs
        env["FAKE_NVML_JSON"] = str(FIXTURES / "no-nvidia.json")
    env.update(extra or {})
    return env


class Daemon:
    def __init__(self, proc: subprocess.Popen[bytes], base_url: str, log_path: Path) -> None:
        self.proc = proc
        self.base_url = base_url
        self.log_path = log_path

    def get(self, path: str = "/metrics", **kwargs: object) -> httpx.Response:
        return httpx.get(self.base_url + path, timeout=10, **kwargs)  # type: ignore[arg-type]

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.log()}")
            try:
                if self.get("/-/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready after {timeout}s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def records(self, event: str) -> list[dict[str, Any]]:
        """The log's JSON records (``--log.format json``) whose event is ``event``; lines
        that are not JSON objects (a traceback, faulthandler's dump) are passed over."""
        out = []
        for line in self.log().splitlines():
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == event:
                out.append(record)
        return out


@contextmanager
def running(args: Sequence[str], tmp_path: Path, nvml_json: Path | None = None,
            env: Mapping[str, str] | None = None, ready: bool = True,
            open_files: int | None = None, module: str = "exporter.app.cli",
            cwd: Path = REPO) -> Iterator[Daemon]:
    """The daemon on a free port; ``open_files`` caps its RLIMIT_NOFILE (soft and hard).

    It runs as ``python -m <module>``: ``tests.fakes.as_macos`` runs it as on a Mac. In
    ``cwd`` (first on its sys.path: the package it imports, unless PYTHONPATH has one).
    """
    port = free_port()
    log_path = tmp_path / f"daemon-{port}.log"
    env = {**_fake_perf(args), **(env or {})}
    cmd = [sys.executable, "-m", module, "--web.listen-address", f"127.0.0.1:{port}",
           "--log.format", "json", *args]
    def as_a_service(open_files: int | None = open_files) -> None:
        # What systemd or the kubelet gives a service: SIGHUP at its default action,
        # whatever this test run has (under nohup it ignores SIGHUP, and an ignored
        # signal stays ignored across exec).
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=daemon_env(nvml_json, env), stdout=log,
                                stderr=subprocess.STDOUT, preexec_fn=as_a_service)
    daemon = Daemon(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        if ready:
            daemon.wait_ready()
        yield daemon
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def parse_samples(text: str) -> Samples:
    """Exposition text -> {(sample name, labels): value}, through prometheus-client's parser."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def values_of(text: str, name: str, **labels: str) -> list[float]:
    """Every value of ``name`` whose labels include ``labels``."""
    return [v for (n, ls), v in parse_samples(text).items()
            if n == name and set(labels.items()) <= set(ls)]


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` on an exposition. Skips the test where promtool is not
    installed, and fails it under CI, where .ci/run installs Debian's prometheus."""
    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing: .ci/run installs Debian's prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True)
