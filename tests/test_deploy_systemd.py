"""systemd/: the hardened unit and its environment file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "gpu-exporter.service"
ENV = ROOT / "systemd" / "gpu-exporter.env"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
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
        # --man=no: verify would look up man: pages of the unit (it names none)
        [str(ANALYZE), "verify", "--man=no", str(path)],
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


@pytest.mark.slow
def test_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    assert verify(installable_copy(tmp_path)) == "rc=0"


@pytest.mark.slow
def test_verify_reports_a_bad_setting(tmp_path: Path) -> None:
    """verify exits 0 on bad values but prints them: the check above looks at the output."""
    broken = UNIT.read_text().replace("NoNewPrivileges=yes", "NoNewPrivileges=maybe")
    assert "Failed to parse boolean value, ignoring: maybe" in verify(
        installable_copy(tmp_path, broken)
    )


@pytest.mark.slow
def test_verify_reports_a_missing_binary(tmp_path: Path) -> None:
    path = tmp_path / "gpu-exporter.service"
    path.write_text(UNIT.read_text().replace(INSTALLED_BINARY, str(tmp_path / "nope")))
    assert "not executable" in verify(path)


@pytest.mark.slow
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


@pytest.mark.slow
def test_opt_in_ptrace_is_valid_and_grants_only_ptrace(tmp_path: Path) -> None:
    text = UNIT.read_text()
    opted = text.replace(
        "#CapabilityBoundingSet=CAP_SYS_PTRACE", "CapabilityBoundingSet=CAP_SYS_PTRACE"
    )
    opted = opted.replace(
        "#AmbientCapabilities=CAP_SYS_PTRACE", "AmbientCapabilities=CAP_SYS_PTRACE"
    )
    assert opted.count("=CAP_SYS_PTRACE") == 2
    assert "#CapabilityBoundingSet=CAP_SYS_PTRACE" not in opted
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


def cli_flags(*command: str) -> set[str]:
    """The flags ``gpu-exporter [command] --help`` lists (``top`` has a parser of its own)."""
    out = subprocess.run(
        [sys.executable, "-m", "exporter.app.cli", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    # A switch shows as --[no-]name: name is a flag, and so is no-name.
    switches = set(re.findall(r"--\[no-\]([a-z][a-z0-9.-]*[a-z0-9])", out.stdout))
    plain = set(re.findall(r"--([a-z][a-z0-9.-]*[a-z0-9])", out.stdout))
    return plain | switches | {f"no-{name}" for name in switches}


@pytest.mark.slow
def test_env_file_names_real_flags() -> None:
    """Each GPU_EXPORTER_* variable is the env form of a flag the CLI has."""
    env_names = {"GPU_EXPORTER_" + re.sub(r"[.-]", "_", f).upper() for f in cli_flags()}
    used = {k for k in env_assignments() if k.startswith("GPU_EXPORTER_")}
    assert used, "the env file sets no GPU_EXPORTER_* variable"
    assert used - env_names == set()
    # The variables that are not flags: the one ExecStart expands, and glibc's.
    assert set(env_assignments()) - used == {"EXTRA_ARGS", "MALLOC_ARENA_MAX"}
    assert settings(UNIT.read_text())["ExecStart"][0].endswith(" $EXTRA_ARGS")


@pytest.mark.slow
def test_env_file_extra_args_example_uses_real_flags() -> None:
    example = next(line for line in ENV.read_text().splitlines() if line.startswith("#EXTRA_ARGS="))
    flags = cli_flags()
    for arg in re.findall(r"--([a-z][\w.-]*?)(?:=|\s|$)", example):
        assert arg in flags or arg.removeprefix("no-") in flags, arg


@pytest.mark.slow
def test_unit_bounds_malloc_arenas_and_raises_the_fd_limit(tmp_path: Path) -> None:
    unit = settings(UNIT.read_text())
    assert unit["Environment"] == ["MALLOC_ARENA_MAX=2"]
    assert env_assignments()["MALLOC_ARENA_MAX"] == "2"
    # Many idle or slow scrape connections: 1024 fds is too few (issue 8).
    assert unit["LimitNOFILE"] == ["65536"]
    assert verify(installable_copy(tmp_path)) == "rc=0"


def hidden_by(unit: dict[str, list[str]]) -> list[str]:
    """Directories the unit's sandbox makes unreachable (or replaces with an empty one)."""
    hidden = []
    if unit.get("ProtectHome", ["no"])[-1] in ("yes", "read-only", "tmpfs"):
        hidden += ["/home", "/root", "/run/user"]
    if unit.get("PrivateTmp", ["no"])[-1] == "yes":
        hidden += ["/tmp", "/var/tmp"]
    return hidden


def is_under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d + "/") for d in dirs)


def documented_venv_interpreter(text: str) -> str:
    m = re.search(r"^[#\s]*(?:sudo )?(/\S*python3\S*) -m venv /opt/gpu-exporter", text, re.M)
    assert m, "no '<python> -m venv /opt/gpu-exporter' install line"
    return m.group(1)


@pytest.mark.slow
def test_unit_paths_are_reachable_inside_its_sandbox(tmp_path: Path) -> None:
    """ExecStart, and the interpreter its venv links to, must not lie under what
    ProtectHome= and PrivateTmp= hide: a venv made by a python under /root or /home
    fails with status 203/EXEC."""
    unit = settings(UNIT.read_text())
    hidden = hidden_by(unit)
    assert {"/home", "/root", "/tmp"} <= set(hidden)
    binary = unit["ExecStart"][0].split()[0]
    assert binary == INSTALLED_BINARY and not is_under(binary, hidden)
    interpreters = {documented_venv_interpreter(t) for t in (UNIT.read_text(),
                                                             DEPLOY_DOC.read_text())}
    assert interpreters == {"/usr/bin/python3"}
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system python3 here to make a venv with")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    assert not is_under(os.path.realpath(venv / "bin" / "python"), hidden)
    # The check catches the trap: this test's own interpreter, where it lives in a home.
    mine = os.path.realpath(sys.executable)
    if is_under(mine, hidden):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v2")],
                       check=True, timeout=120)
        assert is_under(os.path.realpath(tmp_path / "v2" / "bin" / "python"), hidden)


INSTALL_PREFIX = "/opt/gpu-exporter"  # the venv docs/deploy.md makes


def test_documentation_points_at_the_installed_docs() -> None:
    """Documentation= names file: URLs in the venv, each a doc of this repository."""
    urls = [u for line in settings(UNIT.read_text())["Documentation"] for u in line.split()]
    assert urls and all(u.startswith(f"file://{INSTALL_PREFIX}/share/doc/gpu-exporter/")
                        for u in urls), urls
    for url in urls:
        in_repo = url.removeprefix(f"file://{INSTALL_PREFIX}/share/doc/gpu-exporter/")
        assert (ROOT / in_repo).is_file(), url


@pytest.mark.slow
@pytest.mark.network
def test_pip_install_creates_the_documentation_files(tmp_path: Path) -> None:
    """The documented install (pip install of the checkout into the venv) really puts
    the files that Documentation= names under the venv's prefix."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("docs", "exporter"):  # not tests/: its fixture trees hold symlink cycles
        shutil.copytree(ROOT / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    # A throw-away venv as the prefix, filled by this pip (--python): `pip install --prefix`
    # into the test's own environment would first uninstall the copy installed there.
    prefix = tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True,
                   timeout=120)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install",
         "-q", "--no-deps", str(src)], capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    if done.returncode != 0 and any(s in out for s in (
            "Could not fetch", "NewConnectionError", "Temporary failure in name resolution",
            "Network is unreachable", "No matching distribution found")):
        pytest.skip(f"no package index reachable (build requirements): {out[-300:]}")
    assert done.returncode == 0, out
    urls = [u for line in settings(UNIT.read_text())["Documentation"] for u in line.split()]
    for url in urls:
        installed = Path(url.removeprefix("file://").replace(INSTALL_PREFIX, str(prefix), 1))
        assert installed.read_bytes() == (ROOT / installed.relative_to(
            prefix / "share/doc/gpu-exporter")).read_bytes(), url
