"""What the running daemon imports on an NVIDIA-only machine (no AMD/Intel card, no kubelet).

Every module costs resident memory for the daemon's whole life, and the H100 target is
RSS at most nvitop-exporter's: nothing may be imported that the running configuration
does not use. bench/imports.py runs the daemon as a user runs it (``exporter.app.cli.main``
on the main thread, uvicorn serving, every collector at its default), on the
nvidia-h100x2 fixture with the fake NVML; a watcher thread in the daemon waits for
``/-/ready``, scrapes ``/metrics``, lets a few cycles run, records ``sorted(sys.modules)``
and stops it with SIGTERM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.imports import nvidia_only_args, nvidia_only_env, probe

# Prefixes of modules the NVIDIA-only path must not import (each only where its feature
# is configured or its hardware present).
HEAVY = (
    "yaml",  # --config.file / --web.config.file
    "bcrypt",  # basic auth in the web config
    "grpc", "google.protobuf", "exporter.attribution.kubernetes",  # the kubelet socket
    "opentelemetry", "exporter.output.otlp",  # --otlp.endpoint
    "pyudev",  # udev hotplug, on a real /sys only
    "cryptography",
    "amdsmi", "exporter.sources.amd.amdsmi",  # the amdsmi package
    "exporter.sources.intel.level_zero", "exporter.sources.apple",
    "exporter.attribution.slurm",
    # the amdgpu sysfs reader and parsers: imported with the first amdgpu card
    "exporter.sources.amd.card", "exporter.sources.amd.ids",
    "exporter.sources.amd.rates",
    "exporter.sources.kernel.amdgpu", "exporter.sources.kernel.amdgpu_gpu_metrics",
    "exporter.sources.kernel.amdgpu_gpu_metrics_layouts",
    # with the first i915/xe card
    "exporter.sources.kernel.perf", "exporter.sources.kernel.i915_xe_pmu",
    "starlette.middleware.cors", "starlette.middleware.gzip", "starlette.staticfiles",
    "starlette.templating", "jinja2",
    "uvloop", "httptools", "websockets", "wsproto", "watchfiles",
    # the live page, its script and style, the /snapshot JSON: on their first request
    "exporter.serve.landing", "exporter.serve.landing_static", "exporter.serve.snapshot",
    "difflib",  # the "did you mean" of a mistyped flag
)


def heavy_in(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.fixture(scope="module")
def daemon_modules() -> list[str]:
    got = probe(["--collector.interval", "0.5s", *nvidia_only_args()], nvidia_only_env())
    assert got["status"] == 200  # it served /metrics before the list was taken
    modules: list[str] = got["modules"]  # type: ignore[assignment]
    return modules


@pytest.mark.slow
def test_the_probe_sees_a_daemon_that_collected(daemon_modules: list[str]) -> None:
    # The list is the one of a daemon that served: the NVIDIA backend, render, uvicorn.
    for m in ("exporter.sources.nvidia.backend", "exporter.output.render", "uvicorn",
              "pynvml"):
        assert m in daemon_modules


@pytest.mark.slow
def test_nvidia_only_daemon_imports_nothing_heavy(daemon_modules: list[str]) -> None:
    assert heavy_in(daemon_modules) == []


def test_heavy_list_catches_an_eager_import() -> None:
    # The check itself: an eager import of any of these would be reported.
    for m in ("grpc._channel", "yaml", "bcrypt", "pyudev.core", "opentelemetry.sdk"):
        assert heavy_in(["exporter.app.cli", m]) == [m]



def test_the_page_imports_its_code_on_its_first_request() -> None:
    import httpx

    from exporter.core.config import Config
    from exporter.output.render import Renderer
    from exporter.pipeline.hub import Hub
    from exporter.serve.server import build_app
    from tests.test_server_hardening import in_process_server

    hub = Hub(Config(), [])
    renderer = Renderer()
    renderer.render_now(hub.collect_once())
    try:
        with in_process_server(build_app(Config(), hub, renderer)) as port:
            page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
            script = httpx.get(f"http://127.0.0.1:{port}/static/app.js", timeout=5)
            snapshot = httpx.get(f"http://127.0.0.1:{port}/snapshot", timeout=5)
    finally:
        renderer.stop()
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert "script-src" in page.headers["content-security-policy"]
    assert script.status_code == 200 and script.headers["content-type"].startswith(
        "text/javascript")
    assert snapshot.status_code == 200 and snapshot.json()["generation"] >= 1


@pytest.mark.slow
def test_a_config_file_imports_yaml_and_nothing_else_heavy(tmp_path: Path) -> None:
    # Each optional feature pays for its own imports only: a config file brings PyYAML,
    # not gRPC, bcrypt or OpenTelemetry.
    config = tmp_path / "config.yml"
    config.write_text("collector.interval: 0.5s\n")
    got = probe(["--config.file", str(config), *nvidia_only_args()], nvidia_only_env())
    assert got["status"] == 200
    modules: list[str] = got["modules"]  # type: ignore[assignment]
    assert "yaml" in modules
    assert [m for m in heavy_in(modules) if m != "yaml" and not m.startswith("yaml.")] == []
