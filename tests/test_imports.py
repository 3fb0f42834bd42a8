"""What the running daemon imports on an NVIDIA-only machine (no AMD/Intel card, no kubelet).

Every module costs resident memory for the daemon's whole life, and the H100 target is
RSS at most nvitop-exporter's: nothing may be imported that the running configuration
does not use. The daemon runs as a user runs it (``exporter.cli.main`` on the main
thread, uvicorn serving), on the nvidia-h100x2 fixture with the fake NVML; a watcher
thread scrapes ``/metrics`` after the first collection, waits for more cycles, writes
``sorted(sys.modules)`` to a file and stops the daemon with SIGTERM.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.daemon import FIXTURES, REPO, daemon_env, free_port, machine_args

MACHINE = FIXTURES / "nvidia-h100x2"

# Runs cli.main exactly as ``python -m exporter.cli``; the watcher only reads and signals.
PROBE = """
import http.client, os, signal, sys, threading, time
port, out = int(sys.argv[1]), sys.argv[2]
def watch():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/-/ready")
            if conn.getresponse().status == 200:
                conn.close()
                break
        except OSError:
            pass
        time.sleep(0.05)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    conn.getresponse().read()
    time.sleep(2.5)  # more fast cycles, and the first backend retries
    with open(out, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=watch, daemon=True).start()
from exporter.cli import main
sys.argv = ["gpu-exporter", *sys.argv[3:]]
sys.exit(main())
"""

# Prefixes of modules the NVIDIA-only path must not import (each only where its feature
# is configured or its hardware present).
HEAVY = (
    "yaml",  # --config.file / --web.config.file
    "bcrypt",  # basic auth in the web config
    "grpc", "google.protobuf", "exporter.kubernetes",  # the kubelet socket
    "opentelemetry", "exporter.otlp",  # --otlp.endpoint
    "pyudev",  # udev hotplug, on a real /sys only
    "cryptography",
    "amdsmi", "exporter.backends.amd.amdsmi",  # the amdsmi package
    "exporter.backends.intel.level_zero", "exporter.backends.apple",
    "exporter.slurm",
    "starlette.middleware.cors", "starlette.middleware.gzip", "starlette.staticfiles",
    "starlette.templating", "jinja2",
    "uvloop", "httptools", "websockets", "wsproto", "watchfiles",
)


def heavy_in(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.fixture(scope="module")
def daemon_modules(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("imports") / "modules.txt"
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(port), str(out),
         "--web.listen-address", f"127.0.0.1:{port}", "--log.format", "json",
         "--collector.interval", "0.5s", *machine_args(MACHINE)],
        cwd=REPO, env=daemon_env(MACHINE / "nvml.json"), capture_output=True, text=True,
        timeout=60)
    assert out.exists(), f"daemon exited {proc.returncode}: {proc.stdout[-3000:]}"
    return out.read_text().split()


def test_the_probe_sees_a_daemon_that_collected(daemon_modules: list[str]) -> None:
    # The list is the one of a daemon that served: the NVIDIA backend, render, uvicorn.
    for m in ("exporter.backends.nvidia.backend", "exporter.render", "uvicorn", "pynvml"):
        assert m in daemon_modules


def test_nvidia_only_daemon_imports_nothing_heavy(daemon_modules: list[str]) -> None:
    assert heavy_in(daemon_modules) == []


def test_heavy_list_catches_an_eager_import() -> None:
    # The check itself: an eager import of any of these would be reported.
    for m in ("grpc._channel", "yaml", "bcrypt", "pyudev.core", "opentelemetry.sdk"):
        assert heavy_in(["exporter.cli", m]) == [m]

