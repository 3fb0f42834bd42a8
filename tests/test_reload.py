"""Live reload against the real daemon: SIGHUP, a changed web config file, a bad file.

The daemon runs as a subprocess; its files are changed on disk, the signal is sent,
and the answers to real requests (and its one log line) say what it now serves.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bcrypt
import httpx
from prometheus_client.parser import text_string_to_metric_families

from exporter.render.selfmetrics import RELOAD_OK, RELOAD_TIME
from tests.daemon import FIXTURES, Daemon, machine_args, parse_samples, running, values_of
from tests.test_server import _self_signed, no_gpu_args

OK_GAUGE = "gpu_exporter_config_last_reload_successful"
TIME_GAUGE = "gpu_exporter_config_last_reload_success_timestamp_seconds"


def _users(path: Path, password: bytes) -> None:
    hashed = bcrypt.hashpw(password, bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    _touch(path)


def _touch(path: Path) -> None:
    """A new mtime, also on file systems with a coarse clock."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def _log_lines(d: Daemon, event: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in d.log().splitlines()
            if line.startswith("{") and f'"{event}"' in line]


def _wait(check: Callable[[], bool], what: str, d: Daemon, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except httpx.TransportError:  # not listening yet
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen: {d.log()}")
        time.sleep(0.05)


def _reloads(d: Daemon, event: str, n: int) -> dict[str, Any]:
    _wait(lambda: len(_log_lines(d, event)) >= n, event, d)
    return _log_lines(d, event)[n - 1]


def test_sighup_reloads_passwords_and_live_settings(tmp_path: Path) -> None:
    web, conf = tmp_path / "web.yml", tmp_path / "config.yml"
    _users(web, b"old-secret")
    conf.write_text("log.level: info\nmax-processes-per-gpu: 64\ncollector.interval: 1s\n")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web),
                  "--config.file", str(conf)], tmp_path, ready=False) as d:
        _wait(lambda: d.get(auth=("prometheus", "old-secret")).status_code == 200, "start", d)
        text = d.get(auth=("prometheus", "old-secret")).text
        assert values_of(text, OK_GAUGE) == [1]
        served = {f.name: (f.documentation, f.type) for f in text_string_to_metric_families(text)}
        for spec in (RELOAD_OK, RELOAD_TIME):  # as declared with the other self-metrics
            assert served[spec.name] == (spec.help, "gauge")
        started = values_of(text, TIME_GAUGE)[0]
        assert abs(started - time.time()) < 60

        _users(web, b"new-secret")
        conf.write_text("log.level: debug\nmax-processes-per-gpu: 8\ncollector.interval: 2s\n"
                        "collector.gpm: false\n")
        d.proc.send_signal(signal.SIGHUP)
        line = _reloads(d, "configuration reloaded", 1)
        assert line["trigger"] == "SIGHUP"
        assert set(line["changed"]) == {"basic_auth_users", "log.level",
                                        "max-processes-per-gpu"}
        # Named as written, not applied.
        assert line["needs_restart"] == ["collector.interval", "collector.gpm"]

        assert d.get(auth=("prometheus", "new-secret")).status_code == 200
        # The old password was remembered as verified: it must be forgotten.
        assert d.get(auth=("prometheus", "old-secret")).status_code == 401
        # The gauges are rendered with the next collection (a second here).
        _wait(lambda: values_of(d.get(auth=("prometheus", "new-secret")).text,
                                TIME_GAUGE)[0] > started, "the new reload time", d)
        assert values_of(d.get(auth=("prometheus", "new-secret")).text, OK_GAUGE) == [1]
        assert d.proc.poll() is None


def test_an_invalid_file_keeps_the_old_settings(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    _users(web, b"old-secret")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path,
                 ready=False) as d:
        _wait(lambda: d.get(auth=("prometheus", "old-secret")).status_code == 200, "start", d)
        web.write_text("basic_auth_users:\n  prometheus: not-a-bcrypt-hash\n")
        d.proc.send_signal(signal.SIGHUP)
        line = _reloads(d, "configuration reload failed: old settings kept", 1)
        assert "not a bcrypt hash" in line["error"]
        assert d.get(auth=("prometheus", "old-secret")).status_code == 200  # still the old
        _wait(lambda: values_of(d.get(auth=("prometheus", "old-secret")).text,
                                OK_GAUGE) == [0], "successful 0", d)
        assert d.proc.poll() is None

        _users(web, b"fixed")  # a good file again: successful again
        d.proc.send_signal(signal.SIGHUP)
        _reloads(d, "configuration reloaded", 1)
        _wait(lambda: values_of(d.get(auth=("prometheus", "fixed")).text, OK_GAUGE) == [1],
              "successful 1", d)


def test_a_changed_web_config_is_seen_when_a_connection_arrives(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    _users(web, b"old-secret")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path,
                 ready=False) as d:
        _wait(lambda: d.get(auth=("prometheus", "old-secret")).status_code == 200, "start", d)
        time.sleep(1.1)  # past the one look a second
        _users(web, b"new-secret")  # no signal
        _wait(lambda: d.get(auth=("prometheus", "new-secret")).status_code == 200,
              "the new password", d)
        assert _reloads(d, "configuration reloaded", 1)["trigger"] == "web config changed"
        assert d.get(auth=("prometheus", "old-secret")).status_code == 401


def test_sighup_serves_a_renewed_certificate(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    cert, key = _self_signed(first)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")

    def fetch(ca: Path) -> int:
        url = d.base_url.replace("http://", "https://") + "/-/healthy"
        context = ssl.create_default_context(cafile=str(ca))
        try:
            return httpx.get(url, timeout=5, verify=context).status_code
        except httpx.TransportError:
            return 0

    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path,
                 ready=False) as d:
        _wait(lambda: fetch(cert) == 200, "start", d)
        old = tmp_path / "old.crt"
        old.write_bytes(cert.read_bytes())
        new_cert, new_key = _self_signed(second)
        cert.write_bytes(new_cert.read_bytes())  # renewed in place, as cert-manager does
        key.write_bytes(new_key.read_bytes())
        d.proc.send_signal(signal.SIGHUP)
        assert "tls certificate" in _reloads(d, "configuration reloaded", 1)["changed"]
        assert fetch(new_cert) == 200
        assert fetch(old) == 0  # the old certificate is no longer served


def test_sighup_applies_a_new_process_cap(tmp_path: Path) -> None:
    machine = FIXTURES / "nvidia-h100x2"
    conf = tmp_path / "config.yml"
    conf.write_text("max-processes-per-gpu: 64\n")

    def pids(text: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for (name, labels), _ in parse_samples(text).items():
            found = dict(labels)
            if name == "gpu_process_memory_used_bytes":
                out.setdefault(found["gpu"], set()).add(found["pid"])
        return out

    with running([*machine_args(machine), "--config.file", str(conf)], tmp_path,
                 nvml_json=machine / "nvml.json") as d:
        before = pids(d.get().text)
        assert max(len(p) for p in before.values()) > 1  # a GPU with several processes
        conf.write_text("max-processes-per-gpu: 1\n")
        d.proc.send_signal(signal.SIGHUP)
        assert _reloads(d, "configuration reloaded", 1)["changed"] == ["max-processes-per-gpu"]
        _wait(lambda: max(len(p) for p in pids(d.get().text).values()) == 1, "the cap", d)
        assert values_of(d.get().text, "gpu_exporter_processes_truncated_total")[0] > 0
