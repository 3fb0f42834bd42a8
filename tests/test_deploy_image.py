"""The container image: the Dockerfile's structure (read as the builder reads it), and its
HEALTHCHECK (exporter/app/healthcheck.py) run against the real daemon the way the image runs
it, with the listen address set on the command line, in the environment or in a file.

The last test reads the image that tests/image_build.py builds once per run with podman
(tests/image/build-image.sh, as root) and runs by chroot as its USER."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import bcrypt
import pytest
import tomllib
import yaml
from test_server import _self_signed

from exporter.app.healthcheck import exporter_args
from tests.daemon import EMPTY_PROC, REPO, daemon_env, free_port, running
from tests.image_build import FIXTURE, BuiltImage

ROOT = Path(__file__).resolve().parent.parent
CHART_VALUES = ROOT / "helm" / "gpu-exporter" / "values.yaml"


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n\s*", " ", text)  # join continuation lines
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, each starting with its FROM."""
    out: list[list[tuple[str, str]]] = []
    for ins, rest in dockerfile():
        if ins == "FROM":
            out.append([])
        if out:
            out[-1].append((ins, rest))
    return out


def test_every_stage_declares_the_args_it_uses() -> None:
    """An ARG before the first FROM is visible to FROM lines only: a stage that expands it
    elsewhere (the runtime's base-name label) must declare it again, or it expands empty."""
    steps = dockerfile()
    first_from = next(i for i, (ins, _) in enumerate(steps) if ins == "FROM")
    global_args = {rest.split("=")[0]: rest for ins, rest in steps[:first_from] if ins == "ARG"}
    assert "=" in global_args["PYTHON_VERSION"], "the global ARG needs a default"
    for stage in stages():
        known: set[str] = set()
        for ins, rest in stage[1:]:
            if ins == "ARG":
                known.add(rest.split("=")[0])
            elif ins == "ENV":
                known |= set(re.findall(r"(\w+)=", rest))
            for name in re.findall(r"\$\{?(\w+)", rest):
                assert name in known or name == "PATH", f"{ins} {rest}: ${name} not declared"
        for name in re.findall(r"\$\{?(\w+)", stage[0][1]):
            assert name in global_args, f"FROM {stage[0][1]}: ${name}"


def test_dockerfile_is_multistage_non_root_with_entrypoint_and_healthcheck() -> None:
    steps = dockerfile()
    froms = [rest for ins, rest in steps if ins == "FROM"]
    assert len(froms) >= 2 and all("slim" in f for f in froms)
    final = stages()[-1]
    users = [rest for ins, rest in final if ins == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    uid = int(users[-1].split(":")[0])
    values = yaml.safe_load(CHART_VALUES.read_text())
    assert uid == values["podSecurityContext"]["runAsGroup"] == 10001
    entry = json.loads(next(rest for ins, rest in final if ins == "ENTRYPOINT"))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry == ["gpu-exporter"] and "gpu-exporter" in scripts
    assert [rest for ins, rest in final if ins == "EXPOSE"] == [str(values["containerPort"])]
    health = next(rest for ins, rest in final if ins == "HEALTHCHECK")
    assert json.loads(health.split(" CMD ", 1)[1]) == ["python", "-m", "exporter.app.healthcheck"]
    env = " ".join(rest for ins, rest in final if ins == "ENV")
    for setting in ("NVIDIA_DRIVER_CAPABILITIES=utility", "NVIDIA_VISIBLE_DEVICES=all",
                    "MALLOC_ARENA_MAX=2"):
        assert setting in env
    labels = " ".join(rest for ins, rest in final if ins == "LABEL")
    for key in ("title", "description", "version", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels
    # The runtime dependencies and every extra that needs no library of the host: not amd
    # (ROCm's libamd_smi.so), not the test tools.
    installs = " ".join(rest for ins, rest in steps if ins == "RUN" and "pip install" in rest)
    (extras,) = re.findall(r"pip install '\.\[([\w,]+)\]'", installs)
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert sorted(extras.split(",")) == sorted(set(optional) - {"amd", "test"})


def test_dockerignore_lets_in_what_the_build_copies() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for ins, rest in dockerfile():
        if ins == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                assert src.rstrip("/") in allowed, src


# ---------------------------------------------------------------- HEALTHCHECK


def cmdline(*words: str) -> bytes:
    return b"".join(w.encode() + b"\0" for w in words)


def test_exporter_args_are_found_in_every_way_the_image_starts() -> None:
    flags = ["--web.listen-address", ":9000", "--log.level=debug"]
    script = "/opt/gpu-exporter/bin/gpu-exporter"
    assert exporter_args(cmdline("/opt/gpu-exporter/bin/python", script, *flags)) == flags
    assert exporter_args(cmdline("/sbin/docker-init", "--", "gpu-exporter", *flags)) == flags
    assert exporter_args(cmdline("python", "-m", "exporter", *flags)) == flags
    assert exporter_args(cmdline("python", script, "snapshot", *flags)) == flags
    assert exporter_args(cmdline("/bin/sh", "-c", "sleep 1")) == []
    assert exporter_args(b"") == []


def healthcheck(tmp_path: Path, words: list[str], env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    """python -m exporter.app.healthcheck as the image runs it, with pid 1's cmdline faked."""
    path = tmp_path / "cmdline"
    path.write_bytes(cmdline("/opt/gpu-exporter/bin/python", "/opt/gpu-exporter/bin/gpu-exporter",
                             *words))
    clean = {k: v for k, v in daemon_env(None).items() if not k.startswith("GPU_EXPORTER_")}
    return subprocess.run([sys.executable, "-m", "exporter.app.healthcheck", str(path)],
                          env={**clean, **(env or {})}, cwd=REPO, capture_output=True,
                          text=True, timeout=30)


def no_gpu(tmp_path: Path) -> list[str]:
    empty = tmp_path / "empty-sys"
    empty.mkdir(exist_ok=True)
    return ["--path.sysfs", str(empty), "--path.procfs", str(EMPTY_PROC)]


@pytest.mark.slow
def test_healthcheck_follows_the_address_wherever_it_was_set(tmp_path: Path) -> None:
    dead = f":{free_port()}"
    with running(no_gpu(tmp_path), tmp_path) as d:
        address = d.base_url.removeprefix("http://")
        # Command line; it wins over an environment that points elsewhere.
        assert healthcheck(tmp_path, ["--web.listen-address", address]).returncode == 0
        assert healthcheck(tmp_path, [f"--web.listen-address={address}"],
                           {"GPU_EXPORTER_WEB_LISTEN_ADDRESS": dead}).returncode == 0
        # Environment only (the image's ENTRYPOINT with no flags).
        assert healthcheck(tmp_path, [], {"GPU_EXPORTER_WEB_LISTEN_ADDRESS": address}
                           ).returncode == 0
        # A --config.file named on the command line.
        config = tmp_path / "config.yml"
        config.write_text(f"web:\n  listen-address: '{address}'\n")
        assert healthcheck(tmp_path, ["--config.file", str(config)]).returncode == 0
    # Nothing listens: unhealthy, with the reason.
    gone = healthcheck(tmp_path, ["--web.listen-address", address])
    assert gone.returncode == 1 and address in gone.stderr
    # The default :9445 is not where this daemon was: the check must not pass by accident.
    assert healthcheck(tmp_path, ["--web.listen-address", dead]).returncode == 1


@pytest.mark.slow
def test_healthcheck_passes_behind_basic_auth_and_speaks_https_with_tls(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n"
                   f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    port = free_port()
    args = [*no_gpu(tmp_path), "--web.config.file", str(web)]
    proc = subprocess.Popen([sys.executable, "-m", "exporter.app.cli", "--web.listen-address",
                             f"127.0.0.1:{port}", *args], cwd=REPO, env=daemon_env(None),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        words = ["--web.listen-address", f"127.0.0.1:{port}", *args]
        deadline = time.monotonic() + 20
        while (result := healthcheck(tmp_path, words)).returncode and time.monotonic() < deadline:
            assert proc.poll() is None, "the daemon exited"
            time.sleep(0.1)
        assert result.returncode == 0, result.stderr
        # The same daemon through plain HTTP is not healthy: the check followed the TLS.
        plain = healthcheck(tmp_path, ["--web.listen-address", f"127.0.0.1:{port}"])
        assert plain.returncode == 1
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_healthcheck_reports_a_bad_configuration(tmp_path: Path) -> None:
    result = healthcheck(tmp_path, ["--web.listen-address", "nonsense"])
    assert result.returncode == 1 and "web.listen-address" in result.stderr


@pytest.mark.slow
def test_healthcheck_without_a_readable_cmdline_uses_the_environment(tmp_path: Path) -> None:
    with running(no_gpu(tmp_path), tmp_path) as d:
        address = d.base_url.removeprefix("http://")
        clean = {k: v for k, v in daemon_env(None).items() if not k.startswith("GPU_EXPORTER_")}
        result = subprocess.run(
            [sys.executable, "-m", "exporter.app.healthcheck", str(tmp_path / "no-such-cmdline")],
            env={**clean, "GPU_EXPORTER_WEB_LISTEN_ADDRESS": address}, cwd=REPO,
            capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- the image itself


def snapshot_devices(text: str) -> dict[str, list[dict[str, object]]]:
    """backend -> its devices, from `gpu-exporter snapshot` JSON, without timestamps."""
    data = json.loads(text)
    return {b["backend"]: [{k: v for k, v in d.items() if "timestamp" not in k}
                           for d in b.get("devices", [])] for b in data["backends"]}


@pytest.mark.slow
def test_image_builds_runs_as_its_user_and_reads_a_fixture(built_image: BuiltImage) -> None:
    """tests/image/build-image.sh: podman build of the Dockerfile (about 60 s, in a podman
    storage of the test run's own), then the image run by chroot as its
    USER: --version, a snapshot of a fixture sysfs, and its HEALTHCHECK command."""
    machine = FIXTURE
    lines = built_image.output.splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("image ")):]
    assert lines[0].startswith(f"image {built_image.tag}: user 10001:10001, "
                               "entrypoint gpu-exporter")
    assert 'healthcheck: ["CMD","python","-m","exporter.app.healthcheck"]' in lines
    assert "base: docker.io/library/python:3.11-slim-bookworm" in lines
    assert "gpu-exporter 0.1.0 (python 3.11.2)" in lines
    assert lines[-1] == "healthcheck passed"
    start = lines.index("{")
    end = len(lines) - 1 - lines[::-1].index("}")
    in_image = snapshot_devices("\n".join(lines[start:end + 1]))
    # The same fixture read by this checkout on the host: the image runs the same code. Both
    # read this machine's /proc (the image's --path.procfs): the AMD driver version of a card
    # without a module version is the kernel release read there.
    host = subprocess.run([sys.executable, "-m", "exporter.app.cli", "snapshot", "--path.sysfs",
                           str(machine / "sys"), "--path.procfs", "/proc",
                           "--log.level", "warning"],
                          cwd=REPO, env=daemon_env(None), capture_output=True, text=True,
                          timeout=60)
    assert in_image["amd"] == snapshot_devices(host.stdout)["amd"]
    assert in_image["amd"][0]["info"]["pci_bus_id"] == "0000:03:00.0"  # type: ignore[index]
