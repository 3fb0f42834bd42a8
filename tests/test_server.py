"""End to end: the real daemon as a subprocess, scraped over HTTP (and HTTPS)."""

from __future__ import annotations

import gzip
import json
import ssl
import subprocess
import sys
import time
from pathlib import Path

import bcrypt
import httpx
import pytest

from bench.flood import self_signed as _self_signed
from tests.daemon import FIXTURES, REPO, daemon_env, machine_args, running
from tests.daemon import values_of as get

pytestmark = pytest.mark.slow

NO_GPU = ["--path.sysfs", "{empty}", "--path.procfs", "{empty}"]


def no_gpu_args(tmp_path: Path) -> list[str]:
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    return [a.format(empty=empty) for a in NO_GPU]


def test_starts_and_serves_on_a_machine_without_any_gpu(tmp_path: Path) -> None:
    with running([*no_gpu_args(tmp_path), "--collector.interval", "200ms"], tmp_path) as d:
        r = d.get()
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        for backend in ("nvidia", "amd", "intel"):
            assert get(r.text, "gpu_exporter_backend_up", backend=backend) == [0]
        assert get(r.text, "gpu_exporter_up") == [1]
        assert not get(r.text, "gpu_up")
        assert get(r.text, "process_resident_memory_bytes")  # client's collectors stay on
        time.sleep(1.5)  # several retry rounds: the reason is still logged only once
        downs = [json.loads(line) for line in d.log().splitlines()
                 if '"backend down"' in line and '"nvidia"' in line]
        assert len(downs) == 1, d.log()
        assert "driver" in downs[0]["reason"].lower() or "nvml" in downs[0]["reason"].lower()


def test_content_negotiation_openmetrics_and_gzip(tmp_path: Path) -> None:
    machine = FIXTURES / "amd-rdna3-rx7800xt"
    with running(machine_args(machine), tmp_path) as d:
        om = d.get(headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")
        zipped = httpx.get(d.base_url + "/metrics", headers={"Accept-Encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip"
        assert "gpu_temperature_celsius" in zipped.text  # httpx decompressed it
        with httpx.Client() as client, client.stream(
                "GET", d.base_url + "/metrics", headers={"Accept-Encoding": "gzip"}) as raw:
            body = b"".join(raw.iter_raw())
        assert gzip.decompress(body).startswith(b"# HELP")
        plain = d.get(headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers
        assert httpx.post(d.base_url + "/metrics").status_code == 405
        assert httpx.head(d.base_url + "/metrics").status_code == 200


def test_landing_page_and_snapshot_show_backends_and_reasons(tmp_path: Path) -> None:
    machine = FIXTURES / "amd-rdna3-rx7800xt"
    with running(machine_args(machine), tmp_path) as d:
        page = d.get("/").text
        assert "gpu-exporter 0.1.0" in page and "/metrics" in page and "amd" in page
        snap = d.get("/snapshot").json()
        states = {b["backend"]: b for b in snap["backends"]}
        assert states["amd"]["up"] is True
        assert states["amd"]["devices"][0]["info"]["pci_bus_id"] == "0000:03:00.0"
        assert states["nvidia"]["up"] is False and states["nvidia"]["reason"]
        assert states["intel"]["reason"].startswith("no i915/xe card")


def test_hung_backend_is_withdrawn_and_the_rest_keeps_being_served(tmp_path: Path) -> None:
    machine = FIXTURES / "amd-rdna3-rx7800xt"
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": [{"pci_bus_id": "00000000:41:00.0"}], "faults": {
        "hang": {"function": "nvmlDeviceGetPowerUsage", "after_seconds": 1.5}}}))
    args = [*machine_args(machine), "--collector.interval", "200ms", "--stale-after", "800ms"]
    with running(args, tmp_path, nvml_json=nvml) as d:
        first = d.get().text
        assert get(first, "gpu_power_watts", vendor="nvidia")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            text = d.get().text
            assert time.monotonic() - t0 < 1.0  # a hung NVML call never blocks a scrape
            if get(text, "gpu_exporter_backend_up", backend="nvidia") == [0]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("nvidia backend never went stale")
        assert not get(text, "gpu_power_watts", vendor="nvidia")  # withdrawn
        assert get(text, "gpu_up", vendor="nvidia") == [0]  # but the GPU is not forgotten
        assert get(text, "gpu_power_watts", vendor="amd") == [32.0]  # the rest goes on
        assert get(text, "gpu_exporter_last_collection_timestamp_seconds", backend="amd")[0] > \
            get(text, "gpu_exporter_last_collection_timestamp_seconds", backend="nvidia")[0]
        assert "backend stale" in d.log()


def test_basic_auth(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path) as d:
        assert d.get().status_code == 401
        assert d.get(auth=("prometheus", "wrong")).status_code == 401
        assert d.get(auth=("nobody", "s3cret")).status_code == 401
        ok = d.get(auth=("prometheus", "s3cret"))
        assert ok.status_code == 200 and "gpu_exporter_up" in ok.text
        assert d.get("/snapshot").status_code == 401
        assert d.get("/-/healthy").status_code == 200  # probes need no password


def test_tls(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path,
                 ready=False) as d:
        https = d.base_url.replace("http://", "https://")
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(https + "/metrics", timeout=5,
                              verify=ssl.create_default_context(cafile=str(cert)))
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert r.status_code == 200 and "gpu_exporter_build_info" in r.text
        with pytest.raises(httpx.TransportError):
            httpx.get(d.base_url + "/metrics", timeout=5)  # plain HTTP is refused


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter.app.cli", *args], cwd=REPO,
                          env=env or daemon_env(None), capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize(("args", "needle"), [
    (["--collector.interval", "soon"], "--collector.interval: not a duration: 'soon'"),
    (["--collector.interval", "0s"], "--collector.interval: must be greater than zero"),
    (["--web.listen-address", "localhost"], "--web.listen-address: not host:port"),
    (["--web.listen-address", ":99999"], "--web.listen-address: bad port"),
    (["--max-processes-per-gpu", "0"], "--max-processes-per-gpu: must be at least 1"),
    (["--log.level", "loud"], "--log.level: must be one of"),
    (["--web.config.file", "/nonexistent.yml"], "web.config.file: cannot read"),
])
def test_bad_flags_exit_2_with_one_clear_line(args: list[str], needle: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_key_in_config_file_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "config.yml"
    config.write_text("collector:\n  interval: 2s\n  intervall: 3s\n")
    result = run_cli("--config.file", str(config))
    assert result.returncode == 2
    assert "collector.intervall: unknown key" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_value_from_the_environment_names_the_variable() -> None:
    env = daemon_env(None, {"GPU_EXPORTER_COLLECTOR_SLOW_INTERVAL": "fast"})
    result = run_cli(env=env)
    assert result.returncode == 2
    assert "GPU_EXPORTER_COLLECTOR_SLOW_INTERVAL: not a duration" in result.stderr


def test_version_help_and_snapshot(tmp_path: Path) -> None:
    assert run_cli("--version").stdout.startswith("gpu-exporter 0.1.0")
    help_text = run_cli("--help").stdout
    for flag in ("--web.listen-address", "--path.sysfs", "--collector.interval",
                 "--web.config.file", "--config.file", "snapshot"):
        assert flag in help_text
    machine = FIXTURES / "mixed"
    result = run_cli("snapshot", *machine_args(machine),
                     env=daemon_env(machine / "nvml.json"))
    assert result.returncode == 0, result.stderr
    snap = json.loads(result.stdout)
    states = {b["backend"]: b for b in snap["backends"]}
    assert all(states[b]["up"] for b in ("nvidia", "amd", "intel", "fdinfo"))
    gpus = sorted(d["gpu"] for s in states.values() for d in s.get("devices", [])
                  if d.get("primary", True))
    assert gpus == ["0", "1", "2"]  # a string, as under devices[]


def test_no_gpu_snapshot_explains_why_each_backend_is_off(tmp_path: Path) -> None:
    result = run_cli("snapshot", *no_gpu_args(tmp_path))
    assert result.returncode == 0, result.stderr
    states = {b["backend"]: b for b in json.loads(result.stdout)["backends"]}
    assert states["amd"]["up"] is False and "amdgpu" in states["amd"]["reason"]
    assert states["nvidia"]["up"] is False and states["nvidia"]["reason"]


def test_unix_socket_and_second_listen_address(tmp_path: Path) -> None:
    sock = tmp_path / "gpu-exporter.sock"
    args = [*no_gpu_args(tmp_path), "--web.listen-address", f"unix:{sock}"]
    with running(args, tmp_path) as d:  # listens on its TCP port and on the socket
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport) as client:
            r = client.get("http://localhost/metrics")
        assert r.status_code == 200 and "gpu_exporter_up 1.0" in r.text
        assert d.get().status_code == 200


def test_address_in_use_is_one_clear_line(tmp_path: Path) -> None:
    with running(no_gpu_args(tmp_path), tmp_path) as d:
        port = d.base_url.rsplit(":", 1)[1]
        result = run_cli("--web.listen-address", f"127.0.0.1:{port}", *no_gpu_args(tmp_path))
        assert result.returncode == 1
        assert "cannot listen" in result.stderr and "Traceback" not in result.stderr
