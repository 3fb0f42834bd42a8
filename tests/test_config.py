"""Flags, environment and config file: precedence, names, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.app.flags import env_name, load_config
from exporter.core.config import ConfigError, parse_duration, parse_listen_address


def test_defaults() -> None:
    c = load_config([], {})
    assert c.listen_addresses == (":9445",)
    assert (c.interval, c.slow_interval, c.stale_after_seconds) == (1.0, 10.0, 3.0)
    assert (c.sysfs, c.procfs, c.max_processes_per_gpu) == ("/sys", "/proc", 64)
    assert c.collector_enabled("nvidia") is None


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    f = tmp_path / "c.yml"
    f.write_text("collector:\n  interval: 4s\n  slow-interval: 40s\n  amd: false\n"
                 "path.sysfs: /file/sys\nmax-processes-per-gpu: 7\n")
    env = {"GPU_EXPORTER_COLLECTOR_INTERVAL": "3s", "GPU_EXPORTER_PATH_SYSFS": "/env/sys"}
    c = load_config(["--config.file", str(f), "--collector.interval", "2s"], env)
    assert c.interval == 2.0  # flag
    assert c.sysfs == "/env/sys"  # env beats file
    assert c.slow_interval == 40.0  # file beats default
    assert c.max_processes_per_gpu == 7
    assert c.collector_enabled("amd") is False
    assert c.procfs == "/proc"  # default


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.yml"
    f.write_text("web.listen-address: ['127.0.0.1:1', 'unix:/run/x.sock']\n")
    c = load_config([], {"GPU_EXPORTER_CONFIG_FILE": str(f)})
    assert c.listen_addresses == ("127.0.0.1:1", "unix:/run/x.sock")


def test_repeated_listen_address_and_env_list() -> None:
    c = load_config(["--web.listen-address", ":1", "--web.listen-address", "[::1]:2"], {})
    assert c.listen_addresses == (":1", "[::1]:2")
    c = load_config([], {"GPU_EXPORTER_WEB_LISTEN_ADDRESS": "127.0.0.1:5, :6"})
    assert c.listen_addresses == ("127.0.0.1:5", ":6")


def test_collector_switches() -> None:
    c = load_config(["--no-collector.nvidia", "--collector.gpm"],
                    {"GPU_EXPORTER_COLLECTOR_PROCESSES": "false"})
    assert c.collector_enabled("nvidia") is False
    assert c.collector_enabled("gpm") is True
    assert c.collector_enabled("processes") is False


def test_processes_is_the_old_name_of_the_fdinfo_switch(tmp_path: Path) -> None:
    """One name for the fdinfo collector; every old spelling still switches it."""
    env = {"GPU_EXPORTER_COLLECTOR_PROCESSES": "false"}
    assert load_config([], env).collectors["fdinfo"] is False
    assert load_config(["--no-collector.processes"], {}).collectors["fdinfo"] is False
    f = tmp_path / "c.yml"
    f.write_text("collector:\n  processes: false\n")
    assert load_config(["--config.file", str(f)], {}).collectors["fdinfo"] is False
    # The new name wins over the old one from the same place, and a flag over both.
    assert load_config([], {**env, "GPU_EXPORTER_COLLECTOR_FDINFO": "true"}
                       ).collectors["fdinfo"] is True
    assert load_config(["--collector.processes"], {"GPU_EXPORTER_COLLECTOR_FDINFO": "false"}
                       ).collectors["fdinfo"] is True


def test_env_names() -> None:
    assert env_name("web.listen-address") == "GPU_EXPORTER_WEB_LISTEN_ADDRESS"
    assert env_name("collector.processes.interval") == "GPU_EXPORTER_COLLECTOR_PROCESSES_INTERVAL"


@pytest.mark.parametrize(("text", "seconds"), [
    ("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("2h", 7200.0), ("2.5", 2.5), (3, 3.0)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration("k", text) == seconds


@pytest.mark.parametrize("bad", ["", "1x", "s", "1s2", "-1s", "0", True])
def test_bad_durations_name_the_key(bad: object) -> None:
    with pytest.raises(ConfigError, match="^collector.interval: "):
        parse_duration("collector.interval", bad)


@pytest.mark.parametrize("bad", ["9445", "host:", "::1:80", "[::1:80", "h:70000", "unix:"])
def test_bad_addresses(bad: str) -> None:
    with pytest.raises(ConfigError, match="^web.listen-address: "):
        parse_listen_address("web.listen-address", bad)


def test_unknown_file_key_and_bad_file_value_name_the_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yml"
    f.write_text("log:\n  levle: info\n")
    with pytest.raises(ConfigError, match="log.levle: unknown key"):
        load_config(["--config.file", str(f)], {})
    f.write_text("collector.interval: never\n")
    with pytest.raises(ConfigError, match=r"c.yml: collector.interval: not a duration"):
        load_config(["--config.file", str(f)], {})
    f.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(["--config.file", str(f)], {})
