"""systemd/: the hardened unit and its environment file."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "gpu-exporter.service"
ENV = ROOT / "systemd" / "gpu-exporter.env"
INSTALLED_BINARY = "/opt/gpu-exporter/bin/gpu-exporter"
ANALYZE = shutil.which("systemd-analyze")

pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def settings(text: str) -> dict[str, list[str]]:
    """Active Key=Value lines of a unit (comments dropped), all values per key in order."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key, []).append(value)
    return found


def installable_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with ExecStart pointed at a binary that exists here (verify checks it)."""
    text = UNIT.read_text() if text is None else text
    assert INSTALLED_BINARY in text
    binary = shutil.which("gpu-exporter") or sys.executable
    path = tmp_path / "gpu-exporter.service"
    path.write_text(text.replace(INSTALLED_BINARY, binary))
    return path


def verify(path: Path) -> str:
    out = subprocess.run(
        [str(ANALYZE), "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=path.parent,
    )
    return f"rc={out.returncode} {out.stdout}{out.stderr}".strip()


def exposure(path: Path) -> float:
    out = subprocess.run(
        [str(ANALYZE), "security", "--offline=yes", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=path.parent,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout + out.stderr)
    assert m, out.stdout + out.stderr
    return float(m.group(1))


def test_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    assert verify(installable_copy(tmp_path)) == "rc=0"


def test_verify_reports_a_bad_setting(tmp_path: Path) -> None:
    """verify exits 0 on bad values but prints them: the check above looks at the output."""
    broken = UNIT.read_text().replace("NoNewPrivileges=yes", "NoNewPrivileges=maybe")
    assert "Failed to parse boolean value, ignoring: maybe" in verify(
        installable_copy(tmp_path, broken)
    )


def test_verify_reports_a_missing_binary(tmp_path: Path) -> None:
    path = tmp_path / "gpu-exporter.service"
    path.write_text(UNIT.read_text().replace(INSTALLED_BINARY, str(tmp_path / "nope")))
    assert "not executable" in verify(path)


def test_unit_is_hardened(tmp_path: Path) -> None:
    unit = settings(UNIT.read_text())
    assert unit["NoNewPrivileges"] == ["yes"]
    assert unit["ProtectSystem"] == ["strict"]
    assert unit["ProtectHome"] == ["yes"]
    assert unit["PrivateTmp"] == ["yes"]
    assert unit["DevicePolicy"] == ["closed"]
    assert unit["DeviceAllow"] == ["char-nvidia* rw", "char-drm rw"]
    assert unit["SupplementaryGroups"] == ["video render"]
    assert unit["Restart"] == ["on-failure"]
    assert set(unit["RestrictAddressFamilies"][0].split()) == {
        "AF_INET",
        "AF_INET6",
        "AF_UNIX",
        "AF_NETLINK",
    }
    # No capability unless the operator opts in.
    assert unit["CapabilityBoundingSet"] == [""]
    assert unit["AmbientCapabilities"] == [""]
    # systemd's own score: 0 (locked down) .. 10 (exposed); "OK" ends below 4.5.
    assert exposure(installable_copy(tmp_path)) <= 2.5


def test_opt_in_ptrace_is_valid_and_grants_only_ptrace(tmp_path: Path) -> None:
    text = UNIT.read_text()
    opted = text.replace(
        "#CapabilityBoundingSet=CAP_SYS_PTRACE", "CapabilityBoundingSet=CAP_SYS_PTRACE"
    )
    opted = opted.replace(
        "#AmbientCapabilities=CAP_SYS_PTRACE", "AmbientCapabilities=CAP_SYS_PTRACE"
    )
    assert opted.count("=CAP_SYS_PTRACE") == 2 and "#CapabilityBoundingSet=CAP" not in opted
    path = installable_copy(tmp_path, opted)
    assert verify(path) == "rc=0"
    unit = settings(opted)
    assert unit["CapabilityBoundingSet"] == ["", "CAP_SYS_PTRACE"]
    assert unit["AmbientCapabilities"] == ["", "CAP_SYS_PTRACE"]


def env_assignments() -> dict[str, str]:
    """KEY=VALUE of the env file, commented examples included (they must be valid too)."""
    found = {}
    for line in ENV.read_text().splitlines():
        m = re.fullmatch(r"#?([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_env_file_is_plain_assignments() -> None:
    for line in ENV.read_text().splitlines():
        line = line.strip()
        assert (
            not line or line.startswith("#") or re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*( \S+)*", line)
        ), line


def cli_flags() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"--([a-z][a-z0-9.-]*[a-z0-9])", out.stdout))


def test_env_file_names_real_flags() -> None:
    """Each GPU_EXPORTER_* variable is the env form of a flag the CLI has."""
    env_names = {"GPU_EXPORTER_" + re.sub(r"[.-]", "_", f).upper() for f in cli_flags()}
    used = {k for k in env_assignments() if k.startswith("GPU_EXPORTER_")}
    assert used, "the env file sets no GPU_EXPORTER_* variable"
    assert used - env_names == set()
    # The one variable that is not a flag is the one ExecStart expands.
    assert set(env_assignments()) - used == {"EXTRA_ARGS"}
    assert settings(UNIT.read_text())["ExecStart"][0].endswith(" $EXTRA_ARGS")


def test_env_file_extra_args_example_uses_real_flags() -> None:
    example = next(line for line in ENV.read_text().splitlines() if line.startswith("#EXTRA_ARGS="))
    flags = cli_flags()
    for arg in re.findall(r"--([a-z][\w.-]*?)(?:=|\s|$)", example):
        assert arg in flags or arg.removeprefix("no-") in flags, arg
