"""Starting with and without OTLP: nothing of OpenTelemetry is imported without
--otlp.endpoint, a missing extra is one clear error, --otlp.only binds no port.

The import boundary is faked the only way a subprocess allows: a ``sitecustomize``
module, written here into a directory put first on the daemon's PYTHONPATH, which
Python imports at start. One hides the ``opentelemetry`` package (as on a machine
without the extra); another writes ``sys.modules`` to a file when the daemon exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemon import FIXTURES, REPO, SHIM, daemon_env, machine_args, running

pytestmark = pytest.mark.slow
MACHINE = FIXTURES / "amd-rdna3-rx7800xt"

HIDE_OPENTELEMETRY = '''
import sys

class HideOpenTelemetry:
    """As if the otlp extra were not installed."""
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HideOpenTelemetry())
'''
DUMP_MODULES = '''
import atexit, os, sys
atexit.register(lambda: open(os.environ["MODULES_OUT"], "w").write("\\n".join(sys.modules)))
'''


def _site(tmp_path: Path, code: str) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(SHIM), str(REPO)])}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter", *args], cwd=REPO,
                          env=daemon_env(None, env), capture_output=True, text=True, timeout=60)


def test_without_the_extra_otlp_endpoint_is_one_clear_error(tmp_path: Path) -> None:
    done = _cli(*machine_args(MACHINE), "--otlp.endpoint", "http://127.0.0.1:4318",
                env=_site(tmp_path, HIDE_OPENTELEMETRY))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--otlp.endpoint needs the otlp extra" in lines[0]
    assert "pip install '.[otlp]' in the gpu-exporter checkout" in lines[0]


def test_without_the_flag_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    out = tmp_path / "modules.txt"
    env = {**_site(tmp_path, DUMP_MODULES), "MODULES_OUT": str(out)}
    with running(machine_args(MACHINE), tmp_path, env=env) as daemon:
        assert daemon.get().status_code == 200
        assert daemon.get("/snapshot").status_code == 200
    modules = out.read_text().split("\n")
    assert "exporter.output.render" in modules  # the dump is of the daemon that served
    assert [m for m in modules if m.startswith(("opentelemetry", "exporter.output.otlp"))] == []


@pytest.mark.parametrize(("args", "needle"), [
    (["--otlp.only"], "--otlp.only: needs --otlp.endpoint"),
    (["--otlp.endpoint", "collector:4318"], "must be an http:// or https:// URL"),
    (["--otlp.endpoint", "http://127.0.0.1:4318", "--otlp.headers", "novalue"],
     "not name=value pairs"),
    (["--otlp.endpoint", "http://127.0.0.1:4318", "--otlp.interval", "0"],
     "must be greater than zero"),
])
def test_bad_otlp_flags_exit_2_with_one_line(args: list[str], needle: str) -> None:
    done = _cli(*args)
    assert done.returncode == 2 and needle in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _listening_inodes() -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6", "unix"):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if table == "unix":  # a listening unix socket: flags __SO_ACCEPTCON, state 01
                if fields[3] == "00010000":
                    inodes.add(fields[6])
            elif fields[3] == "0A":  # TCP_LISTEN
                inodes.add(fields[9])
    return inodes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net")
def test_otlp_only_pushes_and_binds_no_port(tmp_path: Path) -> None:
    from tests.test_otlp import points, receiving  # skips without the otlp extra

    with receiving() as receiver:
        log = (tmp_path / "daemon.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", *machine_args(MACHINE), "--otlp.only",
             "--otlp.endpoint", receiver.url, "--otlp.interval", "200ms", "--log.format",
             "json"], cwd=REPO, env=daemon_env(None), stdout=log, stderr=subprocess.STDOUT)
        try:
            receiver.wait(2)
            proc.send_signal(signal.SIGHUP)  # ignored, as by the server
            receiver.wait(len(receiver.requests) + 1)
            assert proc.poll() is None
            sockets = set()
            for fd in Path(f"/proc/{proc.pid}/fd").iterdir():
                target = os.readlink(fd) if fd.is_symlink() else ""
                if target.startswith("socket:["):
                    sockets.add(target[len("socket:["):-1])
            listening = sockets & _listening_inodes()
        finally:
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log.close()
    assert listening == set()
    assert proc.returncode == 0, (tmp_path / "daemon.log").read_text()
    assert "hw.gpu.utilization" in points(receiver.requests[-1])
