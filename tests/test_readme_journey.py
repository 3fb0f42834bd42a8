"""The README's two commands, in order, on a fresh copy of the checkout, as a new user runs
them: the first (install and start) is started and, while its daemon runs, the test
command's install steps (``bash .ci/run --install-only``: everything the test command
does before the tests) replace its files. The daemon keeps serving /metrics and asks to
be restarted on its page, never a 500; after it is stopped, the installed
``gpu-exporter --version`` and ``snapshot`` work, and the machine's podman images and
containers are what they were (the tests build theirs in a storage of their own).

What the test command changes on the machine is listed twice, in .ci/run and in the
README: the Debian packages of both lists are the ones .ci/run installs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from test_install import NOT_FOUND, fresh_checkout

from exporter.serve.installed import RESTART
from tests.daemon import REPO, free_port

README = (REPO / "README.md").read_text()
CI_RUN = (REPO / ".ci" / "run").read_text()


def two_commands() -> list[str]:
    """The sh blocks of the README's "Two commands" section, in order."""
    section = README.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_the_readme_and_ci_run_list_the_packages_the_test_command_installs() -> None:
    installed = {p for group in re.findall(r"need_apt\+=\(([^)]*)\)", CI_RUN)
                 for p in group.split()}
    assert {"prometheus", "chromium", "podman", "mmdebstrap"} <= installed
    section = README.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    listed = README_LIST.search(section)
    assert listed, "the README lists what the test command changes"
    assert set(re.findall(r"`([\w.-]+)`", listed.group(1))) - {"apt-get"} == installed
    comment = re.search(r"^# - Debian packages(.*?)^# - ", CI_RUN, re.S | re.M)
    assert comment
    named = {w.rstrip(".") for w in re.findall(r"[\w.-]+", comment.group(1))}
    assert installed <= named
    assert two_commands()[1] == "bash .ci/run"
    assert "--dry-run" in README and '== --dry-run ]]' in CI_RUN


README_LIST = re.compile(r"^- Debian packages(.*?)^- ", re.S | re.M)


def run(args: list[str], cwd: Path, env: dict[str, str],
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout)
    text = out.stdout + out.stderr
    if out.returncode != 0 and any(s in text for s in NOT_FOUND):
        pytest.skip(f"no package index reachable: {text[-300:]}")
    assert out.returncode == 0, f"{args}: {text[-3000:]}"
    return out


def podman_state() -> tuple[list[str], list[str]] | None:
    """The machine's default podman storage: its images (id and names) and containers."""
    if shutil.which("podman") is None:
        return None
    images = subprocess.run(["podman", "images", "-a", "--no-trunc", "--format",
                             "{{.ID}} {{.Repository}}:{{.Tag}}"], capture_output=True,
                            text=True, timeout=120)
    containers = subprocess.run(["podman", "ps", "-a", "--no-trunc", "--format", "{{.ID}}"],
                                capture_output=True, text=True, timeout=120)
    if images.returncode or containers.returncode:
        return None  # podman cannot run here (a container): nothing to compare
    return sorted(images.stdout.splitlines()), sorted(containers.stdout.splitlines())


def wait_until_serving(proc: subprocess.Popen[str], url: str, log: Path) -> None:
    deadline = time.monotonic() + 600  # the first command installs first
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            if any(s in text for s in NOT_FOUND):
                pytest.skip(f"no package index reachable: {text[-300:]}")
            raise AssertionError(f"the README's first command exited: {text[-3000:]}")
        try:
            if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError("the README's first command did not serve within 600 s")


@pytest.mark.slow
@pytest.mark.network
def test_the_readme_commands_in_order_leave_a_working_install_and_podman_as_it_was(
        tmp_path: Path) -> None:
    dry = subprocess.run(["bash", ".ci/run", "--dry-run"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    if "nothing (all present)" not in dry.stdout:
        pytest.skip(f"the test command would install Debian packages first: {dry.stdout}")
    podman_before = podman_state()
    clone = fresh_checkout(tmp_path / "clone")
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GPU_EXPORTER_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The first command as written, on a free port instead of 9445 (the flag's variable).
    first, test_command = two_commands()
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen(
            ["bash", "-c", first], cwd=clone, stdout=out, stderr=subprocess.STDOUT, text=True,
            env={**env, "GPU_EXPORTER_WEB_LISTEN_ADDRESS": f"127.0.0.1:{port}"},
            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(daemon, url, log)
        assert httpx.get(url + "/snapshot", timeout=10).status_code == 200
        # The test command's install steps, with the daemon still running from .venv.
        run([*test_command.split(), "--install-only"], clone, env)
        page = httpx.get(url + "/", timeout=10)
        assert (page.status_code, page.text) == (503, RESTART)
        assert httpx.get(url + "/metrics", timeout=10).status_code == 200
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(30)
    assert "Traceback" not in log.read_text(errors="replace")
    # The installed command still works, as the README's next steps run it.
    gpu_exporter = clone / ".venv" / "bin" / "gpu-exporter"
    version = run([str(gpu_exporter), "--version"], tmp_path, env).stdout
    assert version.startswith("gpu-exporter ")
    snapshot = json.loads(run([str(gpu_exporter), "snapshot"], tmp_path, env).stdout)
    assert snapshot["backends"]
    assert podman_state() == podman_before
