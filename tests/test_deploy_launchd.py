"""deploy/launchd: the plist that runs the exporter as a launchd daemon on a Mac."""

from __future__ import annotations

import plistlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.app.flags import load_config
from exporter.core.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PLIST = ROOT / "deploy" / "launchd" / "gpu-exporter.plist"
UNIT = ROOT / "systemd" / "gpu-exporter.service"


def job() -> dict[str, object]:
    with PLIST.open("rb") as f:
        data = plistlib.load(f)
    assert isinstance(data, dict)
    return data


def test_it_is_a_launchd_daemon_that_is_kept_alive() -> None:
    j = job()
    assert j["Label"] == PLIST.stem  # launchd's convention: <Label>.plist
    assert j["RunAtLoad"] is True and j["KeepAlive"] is True
    assert isinstance(j["ThrottleInterval"], int) and j["ThrottleInterval"] >= 1
    # launchd kills the rest of the job's process group when it exits: macmon with it.
    assert j.get("AbandonProcessGroup", False) is False
    assert j["UserName"] not in ("root", "") and "GroupName" not in j


def test_the_program_is_where_the_systemd_unit_installs_it() -> None:
    program, *args = job()["ProgramArguments"]  # type: ignore[misc]
    (exec_start,) = re.findall(r"^ExecStart=(\S+)", UNIT.read_text(), re.M)
    assert program == exec_start == "/opt/gpu-exporter/bin/gpu-exporter"
    assert Path(program).is_absolute() and "Program" not in job()


def test_logs_go_to_one_absolute_file() -> None:
    j = job()
    assert j["StandardOutPath"] == j["StandardErrorPath"] == "/var/log/gpu-exporter.log"
    assert "chown nobody /var/log/gpu-exporter.log" in PLIST.read_text()  # install steps


def test_its_flags_and_environment_are_ones_the_exporter_accepts() -> None:
    j = job()
    env = j["EnvironmentVariables"]
    assert isinstance(env, dict)
    config = load_config(j["ProgramArguments"][1:], env)  # type: ignore[index]
    assert config.log_format == "json" and config.macmon_path == "macmon"
    with pytest.raises(ConfigError):  # the check is real: a typo would be refused
        load_config([], {**env, "GPU_EXPORTER_LOG_FROMAT": "json"})


def test_macmon_is_on_the_jobs_path_where_homebrew_and_macports_put_it() -> None:
    path = job()["EnvironmentVariables"]["PATH"].split(":")  # type: ignore[index]
    assert {"/opt/homebrew/bin", "/usr/local/bin", "/opt/local/bin"} <= set(path)
    assert path[-4:] == ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]  # launchd's default kept


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("plutil") is None, reason="plutil: macOS only")
def test_plutil_lints_it() -> None:
    done = subprocess.run(["plutil", "-lint", str(PLIST)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
