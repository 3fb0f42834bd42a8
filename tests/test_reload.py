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
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.output.render.selfmetrics import RELOAD_OK, RELOAD_TIME
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _families(text: str) -> set[str]:
    return {name for name, _ in parse_samples(text)}


@pytest.mark.slow
def test_sighup_swaps_the_metric_selection(tmp_path: Path) -> None:
    """A changed exclude takes the family off /metrics at the next scrape (the Python
    process collector's too: the filtered collectors are rebuilt); an invalid regex
    afterwards keeps the exclusion being served, with the reload gauge at 0."""
    machine = FIXTURES / "nvidia-h100x2"
    conf = tmp_path / "config.yml"
    conf.write_text("log.level: info\n")
    with running([*machine_args(machine), "--config.file", str(conf)], tmp_path,
                 nvml_json=machine / "nvml.json") as d:
        before = _families(d.get().text)
        assert {"gpu_power_watts", "gpu_temperature_celsius",
                "process_cpu_seconds_total"} <= before

        conf.write_text("collector.metrics.exclude: 'gpu_power_watts|process_cpu_.*'\n")
        d.proc.send_signal(signal.SIGHUP)
        line = _reloads(d, "configuration reloaded", 1)
        assert line["changed"] == ["collector.metrics.exclude"] and not line["needs_restart"]
        after = _families(d.get().text)  # the very next scrape, no new collection needed
        assert "gpu_power_watts" not in after and "process_cpu_seconds_total" not in after
        assert {"gpu_temperature_celsius", "process_resident_memory_bytes"} <= after
        assert "gpu_power_watts" not in _families(
            d.get(headers={"Accept": "application/openmetrics-text"}).text)

        conf.write_text("collector.metrics.exclude: 'gpu_power_(watts'\n")  # unbalanced
        d.proc.send_signal(signal.SIGHUP)
        failed = _reloads(d, "configuration reload failed: old settings kept", 1)
        assert "collector.metrics.exclude" in failed["error"]
        _wait(lambda: values_of(d.get().text, OK_GAUGE) == [0], "successful 0", d)
        kept = _families(d.get().text)
        assert "gpu_power_watts" not in kept and "gpu_temperature_celsius" in kept
        assert d.proc.poll() is None


@pytest.mark.slow
def test_sighup_reads_the_dcgm_counters_file_again(tmp_path: Path) -> None:
    """The same --dcgm.counters name with new content: SIGHUP serves the new field list;
    a file that is gone keeps the old list."""
    machine = FIXTURES / "nvidia-h100x2"
    counters = tmp_path / "counters.csv"
    counters.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n")
    with running([*machine_args(machine), "--metric-names", "dcgm",
                  "--dcgm.counters", str(counters)], tmp_path,
                 nvml_json=machine / "nvml.json") as d:
        dcgm = {n for n in _families(d.get().text) if n.startswith("DCGM_FI_")}
        assert dcgm == {"DCGM_FI_DEV_GPU_TEMP"}

        counters.write_text("DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n")
        d.proc.send_signal(signal.SIGHUP)
        assert _reloads(d, "configuration reloaded", 1)["changed"] == ["dcgm.counters"]
        dcgm = {n for n in _families(d.get().text) if n.startswith("DCGM_FI_")}
        assert dcgm == {"DCGM_FI_DEV_POWER_USAGE"}

        counters.unlink()
        d.proc.send_signal(signal.SIGHUP)
        assert "counters.csv" in _reloads(
            d, "configuration reload failed: old settings kept", 1)["error"]
        dcgm = {n for n in _families(d.get().text) if n.startswith("DCGM_FI_")}
        assert dcgm == {"DCGM_FI_DEV_POWER_USAGE"}


def test_a_new_selection_drops_the_rendered_bodies() -> None:
    """Renderer.select: bodies already rendered for the current snapshot (every format)
    are not served again; the same snapshot is rendered anew under the new selection."""
    from exporter.core.config import Config
    from exporter.output.render import Renderer
    from exporter.output.render.selection import Selection
    from exporter.pipeline.hub import Hub
    from tests.test_collector import Scripted

    snapshot = Hub(Config(), [Scripted("amd", ["0000:03:00.0"])]).collect_once()
    renderer = Renderer()
    renderer.render_now(snapshot)
    for variant in ("text", "openmetrics+gzip"):
        renderer.body(variant)  # rendered and kept
    assert "gpu_power_watts" in _families(renderer.body("text")[0].decode())

    renderer.select(Selection(exclude="gpu_power_watts|python_.*"))
    body, served = renderer.body("text")
    assert served is snapshot
    names = _families(body.decode())
    assert "gpu_power_watts" not in names and "python_info" not in names
    assert "gpu_up" in names and "process_cpu_seconds_total" in names
    renderer.stop()


def _fifo(path: Path) -> None:
    """A FIFO where the file was: open() of it without O_NONBLOCK waits for a writer."""
    path.unlink()
    os.mkfifo(path)


@pytest.mark.slow
def test_a_fifo_at_the_web_config_path_fails_the_reload_and_later_sighups_work(
        tmp_path: Path) -> None:
    """A FIFO at the web-config path blocked the reload thread forever: later SIGHUPs did
    nothing (the old password kept working after a rotation) and the gauge stayed 1."""
    web = tmp_path / "web.yml"
    _users(web, b"old-secret")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path,
                 ready=False) as d:
        _wait(lambda: d.get(auth=("prometheus", "old-secret")).status_code == 200, "start", d)
        _fifo(web)
        d.proc.send_signal(signal.SIGHUP)
        line = _reloads(d, "configuration reload failed: old settings kept", 1)
        assert line["error"] == f"web.config.file: cannot read {web}: a FIFO; a regular file " \
                                "is needed"
        _wait(lambda: values_of(d.get(auth=("prometheus", "old-secret")).text,
                                OK_GAUGE) == [0], "successful 0", d)

        web.unlink()  # the rotation: a regular file again, a new password
        _users(web, b"new-secret")
        d.proc.send_signal(signal.SIGHUP)
        _reloads(d, "configuration reloaded", 1)
        _wait(lambda: d.get(auth=("prometheus", "new-secret")).status_code == 200,
              "the new password", d)
        assert d.get(auth=("prometheus", "old-secret")).status_code == 401
        _wait(lambda: values_of(d.get(auth=("prometheus", "new-secret")).text,
                                OK_GAUGE) == [1], "successful 1", d)


@pytest.mark.slow
def test_a_fifo_at_the_config_file_or_counters_path_fails_the_reload(tmp_path: Path) -> None:
    conf, counters = tmp_path / "config.yml", tmp_path / "counters.csv"
    conf.write_text("log.level: info\n")
    counters.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, temperature\n")
    machine = FIXTURES / "nvidia-h100x2"
    with running([*machine_args(machine), "--config.file", str(conf), "--metric-names", "dcgm",
                  "--dcgm.counters", str(counters)], tmp_path,
                 nvml_json=machine / "nvml.json") as d:
        for n, (path, key) in enumerate([(conf, "config.file"), (counters, None)], 1):
            _fifo(path)
            d.proc.send_signal(signal.SIGHUP)
            line = _reloads(d, "configuration reload failed: old settings kept", n)
            expected = f"cannot read {path}: a FIFO; a regular file is needed" if key else \
                "a FIFO; a regular file is needed"
            assert expected in line["error"], line
            _wait(lambda: values_of(d.get().text, OK_GAUGE) == [0], "successful 0", d)
            path.unlink()
            path.write_text("log.level: debug\n" if key else
                            "DCGM_FI_DEV_POWER_USAGE, gauge, power\n")
            d.proc.send_signal(signal.SIGHUP)
            _reloads(d, "configuration reloaded", n)
            _wait(lambda: values_of(d.get().text, OK_GAUGE) == [1], "successful 1", d)
        text = d.get().text  # the counters file read again after the FIFO: power, not temp
        assert values_of(text, "DCGM_FI_DEV_POWER_USAGE") and \
            not values_of(text, "DCGM_FI_DEV_GPU_TEMP")


@pytest.mark.slow
def test_a_fifo_given_at_start_is_one_line(tmp_path: Path) -> None:
    """In a subprocess with a time limit: before, open() waited for a writer forever."""
    import subprocess
    import sys

    from tests.daemon import REPO, daemon_env

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    empty = ["--path.sysfs", str(tmp_path), "--path.procfs", str(tmp_path)]
    for argv, needle in (
            (["--config.file", str(fifo)], f"config.file: cannot read {fifo}: a FIFO"),
            (["--web.config.file", str(fifo)], f"web.config.file: cannot read {fifo}: a FIFO"),
            (["--metric-names", "dcgm", "--dcgm.counters", str(fifo), "snapshot"],
             f"--dcgm.counters: {fifo}: a FIFO; a regular file is needed")):
        result = subprocess.run([sys.executable, "-m", "exporter.app.cli", *argv, *empty],
                                cwd=REPO, env=daemon_env(None), capture_output=True, text=True,
                                timeout=20)
        err = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(err) == 1 and needle in err[0], err
