"""``gpu-exporter top``: a terminal program run in tmux against a fixture daemon (the
screen read back with ``capture-pane``), its frames rendered in-process from a history
reply, and the daemon never importing its terminal library."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest

from bench.imports import nvidia_only_args, nvidia_only_env, probe
from exporter.collect.hub import Hub
from exporter.core.config import Config
from exporter.core.model import ProcessSample
from exporter.serve.history import History
from tests.daemon import FIXTURES, REPO, daemon_env, machine_args, running
from tests.fakes.fake_nvml import FakeGPU
from tests.test_collector import Scripted
from tests.test_landing import AMD_CARD
from tests.test_server import _self_signed

pytest.importorskip("rich", reason="the top extra (rich) is not installed")

from rich.console import Console  # noqa: E402

from exporter.client import top  # noqa: E402

MIXED = FIXTURES / "mixed"
TMUX = shutil.which("tmux")
needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install "
                                "tmux): top is not tried in a terminal")


class Tmux:
    """One tmux server of its own (``-L``), one session running ``command`` in a shell
    that prints the exit status and the terminal's modes once it ends."""

    def __init__(self, name: str, command: str, width: int, height: int) -> None:
        assert TMUX is not None
        self.base = [TMUX, "-L", name, "-f", "/dev/null"]
        # the shell outlives a Ctrl-C (a handler, unlike an ignored signal, is not
        # inherited: the command gets the signal as a user's terminal gives it)
        shell = (f"trap : INT; {command}; echo EXIT=$?; stty -a | tr ' ;' '\\n\\n' | "
                 "grep -x -e -icanon -e icanon -e -echo -e echo | tr '\\n' ' '; echo END; "
                 "sleep 60")
        self.tmux("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height),
                  "env", "-u", "COLUMNS", "-u", "LINES", f"PYTHONPATH={REPO}",
                  "TERM=xterm-256color", "sh", "-c", shell)

    def tmux(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, check=True,
                              timeout=20).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def wait(self, needle: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in (screen := self.screen()):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{needle!r} not on the screen:\n{self.screen()}")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=20)


@contextmanager
def tmux(name: str, command: str, width: int = 160, height: int = 60) -> Iterator[Tmux]:
    t = Tmux(name, command, width, height)
    try:
        yield t
    finally:
        t.close()


def top_command(*args: str) -> str:
    return " ".join([sys.executable, "-m", "exporter.app.cli", "top", *args])


@needs_tmux
def test_top_in_tmux_over_https_with_basic_auth(tmp_path: Path) -> None:
    """The dashboard of the mixed fixture (AMD, NVIDIA, Intel) over https with the CA
    and basic auth: names, values and bars as the fixture says, absent values as n/a,
    a process; a value that changes on the fixture changes on the screen; keys select
    a GPU and sort; a narrower terminal stacks the panels; q exits 0 and the terminal
    is back in canonical mode with echo."""
    cert, key = _self_signed(tmp_path)
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"basic_auth_users:\n  prom: '{hashed}'\n")
    sysfs = tmp_path / "sys"
    shutil.copytree(MIXED / "sys", sysfs, symlinks=True)
    args = machine_args(MIXED)
    args[args.index("--path.sysfs") + 1] = str(sysfs)
    hwmon = next((sysfs / AMD_CARD / "hwmon").iterdir())
    card = json.loads((MIXED / "nvml.json").read_text())["gpus"][0]
    with running([*args, "--collector.interval", "0.5s", "--web.config.file", str(web)],
                 tmp_path, nvml_json=MIXED / "nvml.json", ready=False) as d:
        url = d.base_url.replace("http://", "https://prom:pw@").replace("127.0.0.1",
                                                                         "localhost")
        with tmux(f"gxtop-{tmp_path.name}", top_command(
                "--from", url, "--tls.ca-file", str(cert))) as t:
            screen = t.wait("Intel Arc B580")
            screen = t.wait("top processes by memory")
            # every GPU, its vendor and state; the password never shown
            for name in ("AMD 0x747e · amd · ● up", "NVIDIA GeForce RTX 4080 · nvidia · ● up",
                         "Intel Arc B580 · intel · ● up"):
                assert name in screen
            assert "prom:***@" in screen and ":pw@" not in screen
            # The NVIDIA card (nvml.json, the fake's defaults): memory, power, limit,
            # temperatures, fan, PCIe link
            used, total = card["processes"][0]["used_memory_bytes"], card["memory_total_bytes"]
            free = total - FakeGPU.memory_reserved_bytes - used  # NVML v2: reserved apart
            assert f"{used / 2**30:.1f} / {total / 2**30:.1f} GiB, " \
                   f"{free / 2**30:.1f} GiB free" in screen
            assert f"{FakeGPU.power_mw / 1000:.0f} W / {card['power_limit_mw'] // 1000} W" \
                in screen
            assert f"{FakeGPU.temperature_memory} °C memory [cool]" in screen
            assert f"Fan {card['fans'][0]} %" in screen
            assert (f"gen {card['pcie_generation']}/{card['pcie_max_generation']} "
                    f"x{card['pcie_width']}/{card['pcie_max_width']}") in screen
            # bars: the memory bar of the NVIDIA card filled to 13 % (7 of its cells)
            assert re.search(r"Memory \[█+░+\]", screen)
            # the AMD card has no encoder reading: n/a, not 0 %
            amd = screen.split("AMD 0x747e")[1].split("╰")[0]
            assert re.search(r"Enc +\[·+n/a·+\] +n/a", amd)
            # the first GPU's processes: gnome-shell's fdinfo clients (proc/1874)
            assert re.search(r"│ +1874 │ gnome-shell", screen)
            # a change on the fixture reaches the screen: AMD junction over its critical
            (hwmon / "temp2_input").write_text("112000\n")
            screen = t.wait("112 °C junction [critical] critical 110 °C")
            assert "▲ degraded" in screen and "junction 112 °C at or above its critical" \
                in screen
            # keys: the next GPU (NVIDIA: pid 3310 with 2 GiB), then sort by utilisation
            t.keys("Right")
            screen = t.wait("GPU 1: top processes by memory")
            assert re.search(r"│ +3310 │ blender +│ +2\.00 GiB │ +40 %", screen)
            t.keys("s")
            t.wait("GPU 1: top processes by utilisation")
            t.keys("2")
            t.wait("GPU 2: top processes by utilisation")
            # two columns of panels at 160 columns; one at 100
            assert re.search(r"╭─  GPU 0 .*╭─  GPU 1 ", screen)
            t.tmux("resize-window", "-t", "top", "-x", "100", "-y", "80")
            deadline = time.monotonic() + 10
            while re.search(r"╭─  GPU 0 .*╭─  GPU 1 ", t.screen()):
                assert time.monotonic() < deadline, t.screen()
                time.sleep(0.2)
            screen = t.screen()
            assert all(len(line) <= 100 for line in screen.splitlines())
            assert len(re.findall(r"^╭─  GPU \d ", screen, re.M)) == 3
            t.keys("q")
            screen = t.wait("END")
    assert "EXIT=0\nicanon echo END" in screen  # canonical mode and echo: as it was
    assert "Intel Arc B580" not in screen  # the alternate screen is gone


@needs_tmux
def test_top_over_a_unix_socket_and_ctrl_c(tmp_path: Path) -> None:
    """Over the daemon's unix socket; when the daemon goes away the header says so and
    the last values stay; Ctrl-C exits 0 with the terminal as it was."""
    with tempfile.TemporaryDirectory(prefix="gx") as short:  # a unix path is <= 107 bytes
        sock = f"{short}/x.sock"
        with running([*machine_args(MIXED), "--collector.interval", "0.5s",
                      "--web.listen-address", f"unix:{sock}"], tmp_path,
                     nvml_json=MIXED / "nvml.json") as d:
            assert d.proc.poll() is None
            with tmux(f"gxtopc-{tmp_path.name}", top_command("--from", f"unix:{sock}")) as t:
                t.wait("NVIDIA GeForce RTX 4080")
                d.proc.terminate()  # the daemon gone: said in the header, values kept
                screen = t.wait("Not updating: ")
                assert "(values below are stale)" in screen
                assert "NVIDIA GeForce RTX 4080" in screen
                t.keys("C-c")
                screen = t.wait("END")
    assert "EXIT=0\nicanon echo END" in screen
    assert "Traceback" not in screen


def test_top_without_a_terminal_or_a_daemon_fails_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "exporter.app.cli", "top", "--from",
                             "http://127.0.0.1:9"], capture_output=True, text=True,
                            cwd=REPO, env=daemon_env(None), stdin=subprocess.DEVNULL,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "gpu-exporter: error: top needs a terminal"


def test_top_without_the_extra_says_how_to_get_it() -> None:
    """Without rich (made unimportable here), one line naming the extra, exit 2."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['rich'] = None; "
         "from exporter.app.cli import main; sys.exit(main(['top']))"],
        capture_output=True, text=True, cwd=REPO, env=daemon_env(None), timeout=60)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("gpu-exporter: error: top needs the top extra: "
                                    "pip install 'gpu-exporter[top]'")


def _reply(backend: Scripted, now: float = 100.0) -> dict[str, object]:
    history = History(60.0, 1.0)
    hub = Hub(Config(), [backend])
    for i in range(3):
        history.add(hub.collect_once(), now=now - 2 + i)
    return json.loads(json.dumps(history.as_json(now=now)))  # as it comes over the wire


def _text(model: top.Model, view: top.View, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, height=60)
    console.print(top.frame(model, view, "http://x", width))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_frame_shows_absent_values_as_absent_and_processes_with_pods() -> None:
    """The Scripted backend reports power (10 W) and an encoder engine only: the rest is
    n/a (a bar of dots), never a 0 % bar; a process's pod and container are shown."""
    backend = Scripted("amd", ["0000:03:00.0"])
    backend.engines = {"encoder": 0.25}
    backend.processes = (
        ProcessSample(pid=41, process="trainer", memory_used_bytes=float(3 << 30),
                      pod="train-0", namespace="ml", container="main"),
        ProcessSample(pid=7, process="eval", memory_used_bytes=float(1 << 30)))
    model = top.Model()
    model.merge(_reply(backend))
    text = _text(model, top.View())
    assert re.search(r"GPU +\[·+n/a·+\] +n/a", text)
    assert re.search(r"Enc +\[█{5}░{15}\] +25 %", text)  # 25 % of 20 cells
    assert re.search(r"Memory +\[·+n/a·+\] n/a", text)
    assert "Power" in text and "10 W" in text and "Temp   n/a" in text
    assert "Fan n/a" in text and "SM n/a" in text
    lines = [line for line in text.splitlines() if "trainer" in line or " eval " in line]
    assert "ml/train-0" in lines[0] and "main" in lines[0] and "3.00 GiB" in lines[0]
    view = top.View()
    assert top.key(view, model, "s") and view.sort == "utilisation"
    assert top.key(view, model, "s") and top.key(view, model, "s") and view.sort == "name"
    text = _text(model, view)
    assert text.index(" eval ") < text.index("trainer")  # by name
    assert not top.key(view, model, "q")


def test_frame_of_eight_gpus_and_no_gpu() -> None:
    backend = Scripted("amd", [f"0000:{i + 1:02x}:00.0" for i in range(8)])
    model = top.Model()
    model.merge(_reply(backend))
    text = _text(model, top.View(), width=200)
    assert len(re.findall(r"╭─  GPU \d ", text)) == 8
    assert re.search(r"╭─  GPU 0 .*╭─  GPU 1 ", text)  # two columns at 200
    edges = [line for line in text.splitlines() if line.startswith(("╭─  GPU", "╰─"))]
    assert len(edges) == 8 and {len(line) for line in edges} == {200}  # two boxes of 100
    empty = top.Model()
    empty.merge(_reply(Scripted("amd", [])))
    assert "No GPU found" in _text(empty, top.View())
    assert "Waiting for the daemon" in _text(top.Model(), top.View())
    assert top._keys("a\x1b[Cq") == ["a", "\x1b[C", "q"]


def test_the_daemon_never_imports_rich() -> None:
    """The terminal library is the top extra's, for ``top`` only: the running daemon
    (the live page and /api/v1/history included in its code) never loads it."""
    got = probe(["--collector.interval", "0.5s", *nvidia_only_args()], nvidia_only_env())
    modules: list[str] = got["modules"]  # type: ignore[assignment]
    assert "exporter.serve.history" in modules  # the page's own code: on its first request
    # (``rich`` itself is listed: the None that keeps structlog from importing it)
    assert [m for m in modules if m.startswith("rich.")] == []
    assert "exporter.client.top" not in modules
