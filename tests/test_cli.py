"""The command line as an operator meets it: bad input is one line, the snapshot command,
the configuration file's nested form, the environment, the web config (issues 8 and 14).

What exits before the daemon starts (bad flags, variables, files; ``--help``) runs
``main(argv, environ)`` in this process (``cli``); what needs a daemon, a fake NVML or a
fresh process runs ``python -m exporter.app.cli`` (``run_cli``) and is marked slow."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import bcrypt
import httpx
import pytest

from exporter.app.cli import main
from exporter.pipeline.registry import TABLE
from tests.daemon import FIXTURES, REPO, daemon_env, machine_args, running
from tests.daemon import values_of as get
from tests.test_server import _self_signed, no_gpu_args, run_cli


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, env: Mapping[str, str] | None = None) -> Result:
    """``main(argv, environ)`` in this process, for what exits before any daemon starts:
    one that would start (a case that belongs to ``run_cli``) fails the test."""
    out, err = io.StringIO(), io.StringIO()
    never = mock.patch("exporter.app.daemon.Daemon",
                       side_effect=AssertionError("started a daemon: use run_cli"))
    with redirect_stdout(out), redirect_stderr(err), never:
        try:
            code = main(list(args), dict(env or {}))
        except SystemExit as e:  # argparse: --help, --version, a malformed flag
            code = e.code if isinstance(e.code, int) else 2
    return Result(code, out.getvalue(), err.getvalue())


def one_line_error(result: subprocess.CompletedProcess[str] | Result, needle: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


@pytest.mark.parametrize("value", ["inf", "1e9999", "nan", "1e-9", "2h"])
def test_collection_intervals_are_bounded(value: str) -> None:
    """8.9: `inf` killed the threads while serving frozen values; 1e-9 burnt 112 % CPU."""
    one_line_error(cli("--collector.interval", value), "--collector.interval: must be")


def test_the_range_is_named_in_the_error() -> None:
    result = cli("--collector.interval", "1e-9")
    assert "between 100ms and 1h" in result.stderr


@pytest.mark.parametrize(("web", "needle"), [
    ("tls_server_config:\n  cert_file: tls.crt\n  key_file: garbage.key\n", "tls_server_config"),
    ("tls_server_config:\n  cert_file: garbage.key\n  key_file: tls.key\n", "tls_server_config"),
    ("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
     "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: garbage.key\n",
     "tls_server_config"),
    ("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
     "  min_version: TLS13\n  max_version: TLS12\n", "min_version TLS13 is above max_version"),
    ("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
     "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n", "cipher_suites: unknown"),
    ("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
     "  client_allowed_sans: [a]\n", "client_allowed_sans needs client_auth_type"),
])
def test_a_bad_certificate_key_ca_or_tls_setting_is_one_line(tmp_path: Path, web: str,
                                                              needle: str) -> None:
    """Startup with a bad certificate, key or CA printed a 20-35 line traceback."""
    _self_signed(tmp_path)
    (tmp_path / "garbage.key").write_text("-----BEGIN PRIVATE KEY-----\nnope\n")
    (tmp_path / "web.yml").write_text(web)
    one_line_error(cli("--web.config.file", str(tmp_path / "web.yml")), needle)


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yml"
    config.write_bytes(b"collector:\n  interval: \xff\xfe2s\n")
    one_line_error(cli("--config.file", str(config)), ": not UTF-8 text (invalid start byte")


@pytest.mark.slow
def test_every_key_of_the_exporter_toolkit_format_is_accepted(tmp_path: Path) -> None:
    """14: cipher_suites, curve_preferences, prefer_server_cipher_suites,
    client_allowed_sans and http2 made the exporter exit 2."""
    cert, key = _self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n"
        f"  cert_file: {cert.name}\n  key_file: {key.name}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {cert.name}\n"
        "  client_allowed_sans: [localhost]\n"
        "  min_version: TLS12\n  max_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n"
        "  prefer_server_cipher_suites: true\n"
        "  curve_preferences: [CurveP256, X25519]\n"
        "http_server_config:\n  http2: true\n  headers: {X-Frame-Options: deny}\n"
        "rate_limit:\n  interval: 1s\n  burst: 1\n")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path,
                 ready=False) as d:
        deadline = time.monotonic() + 20
        while "listening" not in d.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        log = d.log()
        assert d.proc.poll() is None, log
        assert log.count("HTTP/2 is not supported") == 1
        assert "curve_preferences" not in log  # honoured (OpenSSL's group list): no warning


@pytest.mark.slow
def test_rate_limit_answers_429_but_never_to_the_probes(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("rate_limit:\n  interval: 10s\n  burst: 2\n")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path) as d:
        codes = [d.get("/metrics").status_code for _ in range(4)]
        assert codes[:2] == [200, 200] and codes[2:] == [429, 429]
        assert all(d.get("/-/ready").status_code == 200 for _ in range(5))


@pytest.mark.slow
def test_snapshot_may_come_after_the_flags() -> None:
    """14: `--config.file x snapshot` was rejected."""
    machine = FIXTURES / "mixed"
    result = run_cli(*machine_args(machine), "snapshot", env=daemon_env(machine / "nvml.json"))
    assert result.returncode == 0, result.stderr
    snap = json.loads(result.stdout)
    assert sorted(d["gpu"] for d in snap["devices"]) == ["0", "1", "2"]


@pytest.mark.slow
def test_snapshot_from_the_running_daemon(tmp_path: Path) -> None:
    """14: inside a pod, `snapshot` read the container's /sys; --from asks the daemon."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    machine = FIXTURES / "mixed"
    with running([*machine_args(machine), "--web.config.file", str(web)], tmp_path,
                 nvml_json=machine / "nvml.json") as d:
        authed = d.base_url.replace("http://", "http://prom:pw@")
        # A fresh process without the fixture flags would see this machine's empty /sys:
        result = run_cli("snapshot", "--from", authed, *no_gpu_args(tmp_path))
        assert result.returncode == 0, result.stderr
        snap = json.loads(result.stdout)
        assert {b["backend"]: b["up"] for b in snap["backends"]}["amd"] is True
        assert len(snap["devices"]) == 3
        refused = run_cli("snapshot", "--from", d.base_url)
        assert refused.returncode == 2 and "401" in refused.stderr
    assert cli("--from", "http://x").returncode == 2  # only with snapshot


@pytest.mark.slow
def test_snapshot_from_a_tls_daemon_over_tcp_and_a_unix_socket(tmp_path: Path) -> None:
    import tempfile

    cert, key = _self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    with tempfile.TemporaryDirectory(prefix="gx") as short:  # a unix path is <= 107 bytes
        sock = f"{short}/x.sock"
        with running([*no_gpu_args(tmp_path), "--web.config.file", str(web),
                      "--web.listen-address", f"unix:{sock}"], tmp_path, ready=False) as d:
            https = d.base_url.replace("http://", "https://")
            deadline = time.monotonic() + 20
            while run_cli("snapshot", "--from", https, "--tls.insecure-skip-verify"
                          ).returncode != 0:
                assert time.monotonic() < deadline, d.log()
                time.sleep(0.1)
            for source in (https, f"unix:{sock}"):
                ok = run_cli("snapshot", "--from", source, "--tls.ca-file", str(cert))
                assert ok.returncode == 0, ok.stderr
                assert {b["backend"] for b in json.loads(ok.stdout)["backends"]} >= {"amd"}
            one_line_error(run_cli("snapshot", "--from", https), "CERTIFICATE_VERIFY_FAILED")
            insecure = run_cli("snapshot", "--from", f"unix:{sock}",
                               "--tls.insecure-skip-verify")
            assert insecure.returncode == 0, insecure.stderr
    one_line_error(cli("snapshot", "--tls.ca-file", str(cert)), "only with snapshot --from")


@pytest.mark.slow
def test_nested_config_where_a_key_is_a_switch_and_a_prefix(tmp_path: Path) -> None:
    """14: `collector: {processes: {interval: 3s}}` failed with 'not a boolean'."""
    config = tmp_path / "config.yml"
    config.write_text("collector:\n  processes:\n    interval: 3s\n    budget: 100ms\n"
                      "  interval: 2s\n")
    result = run_cli("snapshot", "--config.file", str(config), *no_gpu_args(tmp_path))
    assert result.returncode == 0, result.stderr
    from exporter.app.flags import load_config

    cfg = load_config(["--config.file", str(config)], {})
    assert (cfg.processes_interval, cfg.processes_budget, cfg.interval) == (3.0, 0.1, 2.0)
    config.write_text("collector:\n  processes: false\n")
    assert load_config(["--config.file", str(config)], {}).collector_enabled(
        "fdinfo") is False


def test_an_unknown_environment_variable_is_an_error_as_in_the_file() -> None:
    """14: GPU_EXPORTER_COLLECTOR_INTERVL was silently ignored."""
    one_line_error(cli(env={"GPU_EXPORTER_COLLECTOR_INTERVL": "2s"}),
                   "GPU_EXPORTER_COLLECTOR_INTERVL: unknown variable")


def test_a_no_collector_variable_says_the_form_that_works() -> None:
    """--no-collector.x is a flag form; its variable spelling must point at the value form."""
    one_line_error(cli(env={"GPU_EXPORTER_NO_COLLECTOR_NVIDIA": "1"}),
                   "GPU_EXPORTER_NO_COLLECTOR_NVIDIA: unknown variable: "
                   "use GPU_EXPORTER_COLLECTOR_NVIDIA=false")
    result = cli(env={"GPU_EXPORTER_NO_SUCH_THING": "1"})  # no hint where none fits
    one_line_error(result, "GPU_EXPORTER_NO_SUCH_THING: unknown variable (every")


@pytest.mark.slow
def test_a_collector_forced_on_without_its_library_fails_at_start(tmp_path: Path) -> None:
    """14: --collector.nvidia where NVML is absent acted as auto."""
    result = run_cli("--collector.nvidia", *no_gpu_args(tmp_path))
    one_line_error(result, "--collector.nvidia is on but unavailable: NVML could not start")
    result = run_cli("--collector.amd", *no_gpu_args(tmp_path))
    one_line_error(result, "--collector.amd is on but unavailable: no amdgpu card")


@pytest.mark.slow
def test_gpm_forced_on_where_it_cannot_run_exits_2_with_the_reason(tmp_path: Path) -> None:
    """17: --collector.gpm without NVML exited 0 (the README promises 2, as for nvidia)."""
    result = run_cli("--collector.gpm", "snapshot", *no_gpu_args(tmp_path))
    one_line_error(result, "--collector.gpm is on but unavailable: NVML could not start")
    # NVML answers, but no GPU of this machine (a T4, an A100) supports GPM:
    machine = FIXTURES / "mixed"
    result = run_cli("--collector.gpm", "snapshot", "--log.level", "warning",
                     *machine_args(machine), env=daemon_env(machine / "nvml.json"))
    one_line_error(result, "--collector.gpm is on but unavailable: GPU 0: GPU does not "
                           "support GPM")
    result = run_cli("--collector.gpm", "--no-collector.nvidia", *no_gpu_args(tmp_path))
    one_line_error(result, "--collector.gpm is on but --no-collector.nvidia switches off")
    # Where GPM works (H100), forcing it on is fine:
    machine = FIXTURES / "nvidia-h100x2"
    result = run_cli("--collector.gpm", "snapshot", *machine_args(machine),
                     env=daemon_env(machine / "nvml.json"))
    assert result.returncode == 0, result.stderr
    [gpu0, _] = json.loads(result.stdout)["devices"]
    assert gpu0["profiling_ratio"]


@pytest.mark.slow
@pytest.mark.parametrize("key", [row.key for row in TABLE])
def test_every_collector_forced_on_where_it_cannot_run_exits_2(tmp_path: Path, key: str) -> None:
    """A machine with nothing: no NVML, no card, no amdsmi, no Level Zero loader, no
    macmon, no kubelet. Every switch of the backend table, forced on, says why not."""
    env = daemon_env(None, {"PATH": str(tmp_path), "LD_LIBRARY_PATH": str(tmp_path),
                            "GPU_EXPORTER_KUBERNETES_POD_RESOURCES_SOCKET":
                                str(tmp_path / "kubelet.sock")})
    result = run_cli(f"--collector.{key}", "snapshot", "--log.level", "error",
                     *no_gpu_args(tmp_path), env=env)
    one_line_error(result, f"--collector.{key} is on but unavailable: ")


@pytest.mark.slow
def test_kubernetes_forced_on_without_its_socket_names_what_to_set(tmp_path: Path) -> None:
    """The chart forced --collector.kubernetes on: on a kubelet with another root directory
    the pod exited 2, restarted for ever, with a line that named neither setting."""
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    result = run_cli("--collector.kubernetes", f"--kubernetes.pod-resources-socket={socket}",
                     "snapshot", "--log.level", "error", *no_gpu_args(tmp_path))
    one_line_error(result, f"--collector.kubernetes is on but unavailable: kubelet "
                           f"pod-resources socket {socket} not found")
    for setting in ("--kubernetes.pod-resources-socket", "kubernetes.kubeletRootDir",
                    "kubernetes.enabled=auto"):
        assert setting in result.stderr, setting
    # Auto (no switch), the same socket named: no exit, the backend down with its reason.
    result = run_cli(f"--kubernetes.pod-resources-socket={socket}", "snapshot",
                     "--log.level", "error", *no_gpu_args(tmp_path))
    assert result.returncode == 0, result.stderr
    (kube,) = [b for b in json.loads(result.stdout)["backends"] if b["backend"] == "kubernetes"]
    assert kube["up"] is False and "not found" in kube["reason"]


def test_help_shows_each_switch_once_in_its_on_off_form() -> None:
    out = cli("--help").stdout
    assert "--[no-]collector.nvidia" in out and "--[no-]collector.gpm" in out
    assert "--[no-]collector.fdinfo, --[no-]collector.processes" in out
    assert "--no-collector.nvidia" not in out  # one line per switch, not two


@pytest.mark.slow
def test_no_collector_fdinfo_stops_the_proc_scan_only(tmp_path: Path) -> None:
    """--no-collector.fdinfo (old name --no-collector.processes) stops the /proc fdinfo
    scan: AMD and Intel GPUs lose their per-process series, NVIDIA's (from NVML) stay."""
    machine = FIXTURES / "mixed"

    def processes(*flags: str) -> dict[str, int]:
        result = run_cli("snapshot", *machine_args(machine), *flags,
                         env=daemon_env(machine / "nvml.json"))
        assert result.returncode == 0, result.stderr
        snap = json.loads(result.stdout)
        return {d["info"]["vendor"]: len(d.get("processes") or ()) for d in snap["devices"]}

    on = processes()  # this machine's Intel GPU runs no process
    assert on["nvidia"] > 0 and on["amd"] > 0
    for flag in ("--no-collector.fdinfo", "--no-collector.processes"):
        assert processes(flag) == {"nvidia": on["nvidia"], "amd": 0, "intel": 0}


@pytest.mark.slow
def test_python_dash_m_exporter() -> None:
    """14: `python -m exporter` failed (no __main__)."""
    result = subprocess.run([sys.executable, "-m", "exporter", "--version"], cwd=REPO,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.startswith("gpu-exporter ")


@pytest.mark.slow
def test_address_in_use_names_the_address(tmp_path: Path) -> None:
    """14: 'Address already in use' did not say which address."""
    with running(no_gpu_args(tmp_path), tmp_path) as d:
        address = d.base_url.removeprefix("http://")
        result = run_cli("--web.listen-address", address, *no_gpu_args(tmp_path))
        assert result.returncode == 1
        assert f"cannot listen on {address}: Address already in use" in result.stderr


@pytest.mark.slow
def test_the_exporter_s_own_cpu_time_is_visible(tmp_path: Path) -> None:
    """13: gpu_exporter_backend_cpu_seconds_total for each collector thread, the renderer
    and the server; a counter that never goes back."""
    machine = FIXTURES / "mixed"
    with running([*machine_args(machine), "--collector.interval", "200ms"], tmp_path,
                  nvml_json=machine / "nvml.json") as d:
        first = d.get().text
        time.sleep(1.0)
        second = d.get().text
    for backend in ("nvidia", "amd", "intel", "fdinfo", "renderer", "server"):
        [a] = get(first, "gpu_exporter_backend_cpu_seconds_total", backend=backend)
        [b] = get(second, "gpu_exporter_backend_cpu_seconds_total", backend=backend)
        assert 0 <= a <= b, backend
    [nvidia] = get(second, "gpu_exporter_backend_cpu_seconds_total", backend="nvidia")
    assert nvidia > 0


@pytest.mark.slow
def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    with running(no_gpu_args(tmp_path), tmp_path) as d:
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(10) == 0
        assert httpx is not None and "Traceback" not in d.log()


@pytest.mark.slow
def test_the_daemon_stops_everything_it_started_discovery_included(tmp_path: Path) -> None:
    """17: nothing stopped DrmDiscovery's udev listener. The Daemon builds the backends,
    the Hub and the shared discovery, and stops them all."""
    from exporter.app.daemon import Daemon
    from exporter.app.flags import load_config

    config = load_config(["--no-collector.nvidia", "--path.procfs", str(tmp_path)], {})
    daemon = Daemon(config)  # the real /sys: the discovery listens for udev events
    assert [b.name for b in daemon.backends][:3] == ["amd", "intel", "fdinfo"]
    daemon.hub.collect_once()  # each opens: the shared discovery starts listening
    discovery = daemon.shared.discovery
    if not discovery.watching:
        pytest.skip("no udev events in this namespace: nothing listens, nothing to stop")
    daemon.stop(timeout=1)
    assert not discovery.watching
    daemon.stop(timeout=0)  # twice is harmless (the server's shutdown and the Daemon's)


# -- the operator's everyday mistakes -------------------------------------------------------

def test_a_misspelt_flag_is_named_with_the_flag_meant(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """A misspelt flag said `argument snapshot: invalid choice: ':9500'`: its value had
    been taken for the command."""
    from exporter.app.cli import main

    assert main(["--web.listen-adress", ":9500"], {}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpu-exporter: error: unrecognized argument --web.listen-adress "
                   "(did you mean --web.listen-address?)"]
    assert main(["--web.listen-adress=:9500", "snapshot"], {}) == 2
    assert "unrecognized argument --web.listen-adress (did you mean --web.listen-address?)" \
        in capsys.readouterr().err
    assert main(["--collector.nvidai"], {}) == 2  # a switch too, with its own hint
    assert "(did you mean --collector.nvidia?)" in capsys.readouterr().err
    assert main(["--zzzzzz"], {}) == 2  # nothing near: no hint
    assert capsys.readouterr().err.strip() == \
        "gpu-exporter: error: unrecognized argument --zzzzzz"


@pytest.mark.parametrize("argv", [["--web.l", ":9500"], ["--web.listen", ":9500"],
                                  ["snapshot", "--path.sys", "/sys"], ["--no-collector.nv"]])
def test_an_abbreviated_flag_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    """`--web.l :9500` listened on :9500: abbreviations change meaning as flags are added."""
    from exporter.app.cli import main
    from exporter.app.flags import build_parser

    assert main(argv, {}) == 2
    assert f"unrecognized argument {next(a for a in argv if a.startswith('--'))}" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the parser itself takes no prefix either
        build_parser().parse_args(argv)


def test_a_value_that_starts_with_a_dash_after_a_flag_is_still_parsed() -> None:
    from exporter.app.flags import load_config

    config = load_config(["--collector.interval=2s", "--web.listen-address", ":9500"], {})
    assert (config.interval, config.listen_addresses) == (2.0, (":9500",))


@pytest.mark.parametrize("key", ["path.sysfs", "path.procfs"])
def test_a_path_that_does_not_exist_is_refused_at_start(
        key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A forgotten container mount started silently and looked like a machine without GPUs."""
    from exporter.app.cli import main
    from exporter.app.flags import env_name

    missing = tmp_path / "host" / key.split(".")[1]
    assert main([f"--{key}", str(missing)], {}) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpu-exporter: error: --{key}: {missing} does not exist (in a container: is the "
        f"host's /{key.split('.')[1].removesuffix('fs')} mounted there?)"]
    assert main(["snapshot"], {env_name(key): str(missing)}) == 2  # the environment too
    assert f"--{key}: {missing} does not exist" in capsys.readouterr().err
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert main([f"--{key}", str(a_file)], {}) == 2
    assert f"--{key}: {a_file} is not a directory" in capsys.readouterr().err


@pytest.mark.slow
def test_a_path_that_does_not_exist_exits_before_binding(tmp_path: Path) -> None:
    result = run_cli("--path.procfs", str(tmp_path / "nope"), "--path.sysfs", str(tmp_path))
    one_line_error(result, f"--path.procfs: {tmp_path / 'nope'} does not exist")


@pytest.mark.slow
def test_snapshot_gives_gpu_as_a_string_everywhere() -> None:
    """`gpu` was a number under backends[].devices and a string under devices[]."""
    machine = FIXTURES / "mixed"
    result = run_cli(*machine_args(machine), "--no-collector.pmu", "snapshot",
                     env=daemon_env(machine / "nvml.json"))
    assert result.returncode == 0, result.stderr
    snap = json.loads(result.stdout)
    merged = {d["pci_bus_id"] if "pci_bus_id" in d else d["info"]["pci_bus_id"]: d["gpu"]
              for d in snap["devices"]}
    per_backend = [(b["backend"], d) for b in snap["backends"] for d in b.get("devices", ())]
    assert per_backend, snap["backends"]
    for name, d in per_backend:
        assert isinstance(d["gpu"], str), (name, d["gpu"])
        assert d["gpu"] == merged[d["info"]["pci_bus_id"]], name
    assert sorted(set(merged.values())) == ["0", "1", "2"]


@pytest.mark.slow
def test_snapshot_does_not_repeat_the_backend_down_lines(tmp_path: Path) -> None:
    result = run_cli("snapshot", *no_gpu_args(tmp_path))
    assert result.returncode == 0, result.stderr
    down = [b for b in json.loads(result.stdout)["backends"] if not b["up"]]
    assert len(down) >= 4 and all(b["reason"] for b in down)  # the reasons are in the JSON...
    assert "backend down" not in result.stderr  # ...and not said again on stderr


@pytest.mark.slow
def test_a_unix_socket_in_use_is_named_with_a_colon() -> None:
    import socket
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ge-") as tmp:  # a short path: 108 bytes max
        path = f"{tmp}/s.sock"
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(path)
        other.listen(1)
        try:
            result = run_cli("--web.listen-address", f"unix:{path}", "--path.sysfs", tmp,
                             "--path.procfs", tmp)
        finally:
            other.close()
    assert result.returncode == 1
    assert f"cannot listen on unix:{path}: in use by another process" in result.stderr


def _caught(pid: int) -> int:
    """The signals ``pid`` has a handler for (SigCgt of /proc/<pid>/status), as a mask."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("SigCgt:")), 16)


@pytest.mark.slow
@pytest.mark.parametrize("module", ["exporter.app.cli", "exporter"])
def test_a_sighup_right_after_start_is_held_then_reloads(module: str, tmp_path: Path) -> None:
    """A SIGHUP in the first ~0.3 s killed the daemon (exit 129): systemd's ExecReload
    right after a restart left it stopped. The handler must be in place long before the
    daemon listens (it was set only after binding); the SIGHUP is sent the moment it is."""
    import socket

    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc")
    sighup = 1 << (signal.SIGHUP - 1)
    with running(no_gpu_args(tmp_path), tmp_path, ready=False, module=module) as d:
        t0 = time.monotonic()
        while not _caught(d.proc.pid) & sighup:
            assert d.proc.poll() is None and time.monotonic() - t0 < 60, d.log()
            time.sleep(0.0005)
        host, port = d.base_url.removeprefix("http://").split(":")
        with socket.socket() as probe:  # not listening yet: start-up has barely begun
            assert probe.connect_ex((host, int(port))) != 0, "the handler came after binding"
        d.proc.send_signal(signal.SIGHUP)
        d.wait_ready()
        assert d.proc.poll() is None
        assert d.get().status_code == 200
        t2 = time.monotonic()
        while "configuration reloaded" not in d.log():  # the held SIGHUP, done once ready
            assert time.monotonic() - t2 < 10, d.log()
            time.sleep(0.05)
        [line] = [json.loads(x) for x in d.log().splitlines() if "configuration reloaded" in x]
        assert line["trigger"] == "SIGHUP"
        d.proc.send_signal(signal.SIGHUP)  # and later ones as before
        t3 = time.monotonic()
        while d.log().count("configuration reloaded") < 2:
            assert time.monotonic() - t3 < 10, d.log()
            time.sleep(0.05)
