"""``gpu-exporter top``: a terminal program run in tmux against a fixture daemon (the
screen read back with ``capture-pane``), its frames rendered in-process from a history
reply, and the daemon never importing its terminal library."""

from __future__ import annotations

import copy
import io
import json
import os
import pty
import re
import resource
import select
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from bench.imports import nvidia_only_args, nvidia_only_env, probe
from exporter import __version__
from exporter.client.fetch import HTTPStatus, ReplyTimeout, ReplyTooLarge, fetch_snapshot
from exporter.core.config import Config
from exporter.core.labels import HealthStatus
from exporter.core.model import ProcessSample
from exporter.pipeline.hub import Hub
from exporter.serve import view
from exporter.serve.history import History
from tests import hostile
from tests.daemon import FIXTURES, REPO, daemon_env, machine_args, running
from tests.fakes.fake_nvml import FakeGPU
from tests.test_collector import Scripted
from tests.test_landing import AMD_CARD, hanging_nvidia
from tests.test_server import _self_signed

pytest.importorskip("rich", reason="the top extra (rich) is not installed")

from rich.console import Console  # noqa: E402

from exporter.client.top import command as top  # noqa: E402
from exporter.client.top.model import KEYS_HELP  # noqa: E402
from exporter.client.top.screen import clock  # noqa: E402

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


def top_command(*args: str, pidfile: Path | None = None) -> str:
    """top in the pane; with ``pidfile``, its pid written there first (a shell that
    execs it)."""
    command = " ".join([sys.executable, "-m", "exporter.app.cli", "top", *args])
    if pidfile is None:
        return command
    return f"sh -c 'echo $$ > {pidfile}; exec {command}'"


def pid_of(pidfile: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pidfile.exists() and (text := pidfile.read_text().strip()):
            return int(text)
        time.sleep(0.05)
    raise AssertionError("top never started")


def gone(pid: int) -> bool:
    """The process has ended (a zombie that nobody reaped yet counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def write_process(proc: Path, pid: int, comm: str, uid: int, argv: list[str]) -> None:
    """A process as /proc shows it: comm, status (with its Uid line), cmdline (NUL
    separated), stat (start time in field 22) and statm."""
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(comm + "\n")
    (d / "status").write_text(f"Name:\t{comm}\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\n"
                              f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nVmRSS:\t    1024 kB\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194304 0 0 0 0 0 0 0 0 "
                            "20 0 1 0 12345 0 0\n")
    (d / "statm").write_text("256 128 64 1 0 64 0\n")


def eight_gpus(tmp_path: Path) -> list[str]:
    """A fake NVML with 8 GPUs of 2 processes each, and a procfs that names them (root's
    trainers with their command lines): the daemon's flags."""
    proc = tmp_path / "proc8"
    gpus = []
    for i in range(8):
        procs = []
        for k in range(2):
            pid = 4000 + 10 * i + k
            write_process(proc, pid, f"trainer{i}{k}", 0,
                          ["python3", "train.py", f"--rank={i}", f"--shard={k}"])
            procs.append({"pid": pid, "used_memory_bytes": (k + 1) << 30, "sm_util": 10 * k})
        gpus.append({"pci_bus_id": f"00000000:{0x10 + i:02x}:00.0", "processes": procs})
    (tmp_path / "nvml8.json").write_text(json.dumps({"gpus": gpus}))
    (tmp_path / "sys8").mkdir(exist_ok=True)
    return ["--path.sysfs", str(tmp_path / "sys8"), "--path.procfs", str(proc),
            "--collector.interval", "0.5s", "--collector.processes.interval", "0.5s"]


@pytest.mark.slow
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
            screen = t.wait("GPU 0 processes")
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
            # the first GPU's processes: gnome-shell's fdinfo clients (proc/1874: 16384 +
            # 412672 KiB of VRAM, fdinfo 14 and 15)
            assert re.search(r"^ +1874 .* 419 MiB .*gnome-shell", screen, re.M)
            # a change on the fixture reaches the screen: AMD junction over its critical
            (hwmon / "temp2_input").write_text("112000\n")
            screen = t.wait("112 °C junction [critical] critical 110 °C")
            assert "▲ degraded" in screen and "junction 112 °C at or above its critical" \
                in screen
            # keys: the next GPU (NVIDIA: pid 3310 with 2 GiB), then sort by utilisation
            t.keys("Right")
            screen = t.wait("GPU 1 processes")
            assert re.search(r"^ +3310 .* 2\.00 GiB +sm 40% .*blender", screen, re.M)
            t.keys("s")
            t.wait("sorted by utilisation")
            t.keys("2")
            t.wait("GPU 2 processes")
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


@pytest.mark.slow
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
                screen = t.wait("Not updating since ")
                assert "(values below are stale)" in screen
                assert "NVIDIA GeForce RTX 4080" in screen
                t.keys("C-c")
                screen = t.wait("END")
    assert "EXIT=0\nicanon echo END" in screen
    assert "Traceback" not in screen


@pytest.mark.slow
@needs_tmux
def test_top_exits_when_its_terminal_hangs_up(tmp_path: Path) -> None:
    """The tmux session killed (SIGHUP to the pane, its terminal gone): top exits within
    seconds instead of running on orphaned; a SIGHUP alone (the terminal still there)
    ends it too, with the terminal given back in canonical mode with echo, exit 129."""
    with running([*machine_args(MIXED), "--collector.interval", "0.5s"], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        pidfile = tmp_path / "top.pid"
        t = Tmux(f"gxtoph-{tmp_path.name}", top_command("--from", d.base_url,
                                                        pidfile=pidfile), 100, 40)
        try:
            t.wait("NVIDIA GeForce RTX")
            pid = pid_of(pidfile)
            before = cpu_seconds(pid)
            time.sleep(2.0)  # idle: it sleeps until a reply or a key
            assert cpu_seconds(pid) - before < 0.6
            t.tmux("kill-session", "-t", "top")
            deadline = time.monotonic() + 3
            while not gone(pid):
                assert time.monotonic() < deadline, "top runs on after its terminal went"
                time.sleep(0.05)
        finally:
            t.close()
        pidfile.unlink()
        with tmux(f"gxtoph2-{tmp_path.name}", top_command("--from", d.base_url,
                                                          pidfile=pidfile), 100, 40) as t:
            t.wait("NVIDIA GeForce RTX")
            os.kill(pid_of(pidfile), signal.SIGHUP)
            screen = t.wait("END")
    assert "EXIT=129\nicanon echo END" in screen


@pytest.mark.slow
def test_top_exits_on_eof_or_eio_of_its_terminal_without_a_sighup(tmp_path: Path) -> None:
    """In a pty whose hang-up signal never arrives (SIGHUP blocked before top starts),
    closing the terminal's other end leaves top reading EOF or EIO: it exits at once,
    where it used to spin on the empty read forever."""
    with hostile.serving(hostile.reply({"devices": None, "interval": 1.0})) as server:
        pid, master = pty.fork()
        if pid == 0:  # the child: SIGHUP blocked across exec, so only EOF/EIO can end it
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
            env = {**daemon_env(None), "TERM": "xterm-256color", "COLUMNS": "80",
                   "LINES": "24"}
            os.execve(sys.executable, [sys.executable, "-m", "exporter.app.cli", "top",
                                       "--from", server.url], env)
        done = (0, 0)
        try:
            seen = b""
            deadline = time.monotonic() + 20
            while b"first collection" not in seen:
                assert time.monotonic() < deadline, seen[-2000:]
                if select.select([master], [], [], 0.5)[0]:
                    seen += os.read(master, 65536)
            os.close(master)
            deadline = time.monotonic() + 3
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
                assert time.monotonic() < deadline, "top runs on after its terminal went"
                time.sleep(0.05)
        finally:
            if done[0] == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(done[1]) == 129


@pytest.mark.slow
@needs_tmux
def test_top_fits_80x24_with_3_and_8_gpus(tmp_path: Path) -> None:
    """At 80x24 every GPU has its row, the selected GPU's processes are listed (user,
    pid, memory in its unit, engine, command line) and the keys' line is the last; the
    processes page and scroll; selecting the last GPU shows its processes."""
    proc = tmp_path / "proc"
    shutil.copytree(MIXED / "proc", proc, symlinks=True)
    write_process(proc, 3310, "blender", 0, ["blender", "-b", "scene.blend", "-a"])
    args = machine_args(MIXED)
    args[args.index("--path.procfs") + 1] = str(proc)
    with running([*args, "--collector.interval", "0.5s"], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        with tmux(f"gxtop3-{tmp_path.name}", top_command("--from", d.base_url), 80, 24) as t:
            screen = t.wait("GPU 0 processes")
            lines = screen.splitlines()
            assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
            assert lines[-1].startswith(" ←→ GPU") and "q quit" in lines[-1]
            assert re.search(r"^▶ 0 ● AMD 0x747e +GPU\[", screen, re.M)
            assert re.search(r"^  1 ● NVIDIA GeForce RTX 4080 GPU\[", screen, re.M)
            assert re.search(r"^  2 ● Intel Arc B580 +GPU\[", screen, re.M)
            assert re.search(r"^ +1874 .* 419 MiB .*gnome-shell", screen, re.M)
            t.keys("Right")
            screen = t.wait("GPU 1 processes")
            assert re.search(r"^ +3310 root +2\.00 GiB +sm 40% +blender -b scene\.blend -a",
                             screen, re.M)
            assert t.screen().splitlines()[-1].startswith(" ←→ GPU")
    with running(eight_gpus(tmp_path), tmp_path, nvml_json=tmp_path / "nvml8.json") as d:
        with tmux(f"gxtop8-{tmp_path.name}", top_command("--from", d.base_url), 80, 24) as t:
            screen = t.wait("GPU 0 processes · 1-2 of 2")
            lines = screen.splitlines()
            assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
            assert lines[-1].startswith(" ←→ GPU")
            assert len(re.findall(r"^[▶ ] ?\d ● NVIDIA H100", screen, re.M)) == 8
            assert re.search(r"^ +4001 root +2\.00 GiB +sm 10% +python3 train\.py --rank=0 "
                             r"--shard=1", screen, re.M)
            for _ in range(7):
                t.keys("Right")
            screen = t.wait("GPU 7 processes")
            assert "4071" in screen and "--rank=7 --shard=1" in screen
            assert t.screen().splitlines()[-1].startswith(" ←→ GPU")
            t.keys("?")
            screen = t.wait("Keys")
            assert_help_whole(screen, KEYS_HELP, TOP_LEGENDS)


@pytest.mark.slow
@needs_tmux
def test_top_says_unauthorized_and_tls_error(tmp_path: Path) -> None:
    """A wrong password reads "unauthorized (401)", not a wait that never ends; a
    certificate top cannot verify reads "TLS error"."""
    cert, key = _self_signed(tmp_path)
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"basic_auth_users:\n  prom: '{hashed}'\n")
    with running([*machine_args(MIXED), "--web.config.file", str(web)], tmp_path,
                 nvml_json=MIXED / "nvml.json", ready=False) as d:
        url = d.base_url.replace("127.0.0.1", "localhost")
        wrong = url.replace("http://", "https://prom:nope@")
        with tmux(f"gxtop401-{tmp_path.name}", top_command(
                "--from", wrong, "--tls.ca-file", str(cert)), 100, 30) as t:
            screen = t.wait("unauthorized (401)")
            assert "Waiting" not in screen and ":nope@" not in screen
        with tmux(f"gxtoptls-{tmp_path.name}", top_command(
                "--from", url.replace("http://", "https://prom:pw@")), 100, 30) as t:
            screen = t.wait("TLS error")
            assert "certificate verify failed" in screen or "self-signed" in screen


@pytest.mark.slow
@needs_tmux
def test_top_shows_a_stale_backend_and_its_gpu(tmp_path: Path) -> None:
    """NVML hangs after 1.5 s (the fake's fault): past --stale-after the daemon says the
    nvidia backend and its GPU are stale, and so does top, in the GPU's title and in a
    line of the header with the reason."""
    with hanging_nvidia(tmp_path) as d:
        with tmux(f"gxtops-{tmp_path.name}", top_command("--from", d.base_url), 120, 50) as t:
            screen = t.wait("◌ stale: nvidia (no completed collection within --stale-after)")
            assert re.search(r"NVIDIA H100 80GB HBM3 · nvidia · ◌ stale", screen), screen
            assert re.search(r"· amd · ● up", screen)


HOSTILE = "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[31mred\u202e"


def _poisoned(reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` with escape sequences (a window title, a clipboard write, a clear
    screen, a colour, a bidi override) in every string a client draws."""
    for dev in reply["devices"]:
        dev["name"] += HOSTILE
        dev["vendor"] += HOSTILE
        dev["health"] = {"status": "degraded", "reasons": [
            {"check": "xid" + HOSTILE, "status": "degraded", "reason": "bad" + HOSTILE}]}
    for table in reply["processes"].values():
        for row in table["rows"]:
            for k in ("process", "pod", "container", "user", "command"):
                row[k] = f"{k}{HOSTILE}"
    for b in reply["backends"]:
        b["state"], b["reason"] = "stale", "gone" + HOSTILE
    return reply


@needs_tmux
@pytest.mark.slow  # takes seconds
def test_top_against_a_server_that_lies(tmp_path: Path) -> None:
    """A hostile server: escape sequences in every string reach neither the pane's
    title nor its clipboard nor its screen (shown stripped); a reply without its keys
    shows n/a, never a traceback; a 300 MiB reply is refused with top staying small; a
    reply trickled a byte every 2 s ends in "not updating" within its deadline."""
    backend = Scripted("amd", ["0000:03:00.0"])
    backend.processes = (ProcessSample(pid=41, process="trainer", memory_used_bytes=3e9,
                                       pod="train-0", namespace="ml", container="main",
                                       user="alice", command="python3 train.py"),)
    poisoned = _poisoned(_reply(backend))
    pidfile = tmp_path / "top.pid"
    with hostile.serving(hostile.reply(poisoned)) as server:
        with tmux(f"gxtopx-{tmp_path.name}", top_command("--from", server.url), 120, 30) as t:
            t.tmux("set-option", "-g", "set-clipboard", "on")
            screen = t.wait("]0;pwned]52;c;cHduZWQ=[2J[31mred")
            assert "gpu-exporter top" in screen  # not cleared
            assert "pwned" not in t.tmux("display-message", "-p", "-t", "top", "#{pane_title}")
            assert t.tmux("list-buffers") == ""  # no clipboard write
            assert "◌ stale: amd (gone]0;pwned" in screen
            assert "Traceback" not in screen
    missing = {"devices": [{"gpu": "0"}, {"name": 5}, "x"], "processes": {"0": {"rows": [
        {"pid": 7}, {"pid": "x"}, None]}, "1": []}, "gpus": {"t": 1}, "backends": [{}],
        "interval": "soon", "now": None}
    with hostile.serving(hostile.reply(missing)) as server:
        with tmux(f"gxtopm-{tmp_path.name}", top_command("--from", server.url), 120, 30) as t:
            screen = t.wait("GPU 0 processes")
            assert "GPU 0  n/a · n/a · no data" in screen and "Health no data" in screen
            assert re.search(r"GPU +\[·+n/a·+\] +n/a", screen)
            assert re.search(r"^ +7 n/a +n/a +n/a +n/a", screen, re.M)
            assert "Traceback" not in screen
    with hostile.serving(hostile.endless(300 << 20)) as server:
        with tmux(f"gxtopb-{tmp_path.name}", top_command("--from", server.url,
                                                         pidfile=pidfile), 120, 30) as t:
            screen = t.wait("over the 16 MiB accepted")
            assert peak_rss_mib(pid_of(pidfile)) < 200
    with hostile.serving(hostile.trickle({"devices": None}, every=2.0)) as server:
        with tmux(f"gxtopt-{tmp_path.name}", top_command("--from", server.url), 120, 30) as t:
            screen = t.wait("no complete reply within 3 s", timeout=15)
            assert "Not updating" in screen

@pytest.mark.slow
def test_top_without_a_terminal_or_a_daemon_fails_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "exporter.app.cli", "top", "--from",
                             "http://127.0.0.1:9"], capture_output=True, text=True,
                            cwd=REPO, env=daemon_env(None), stdin=subprocess.DEVNULL,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "gpu-exporter: error: top needs a terminal"


@pytest.mark.slow
def test_top_without_the_extra_says_how_to_get_it() -> None:
    """Without rich (made unimportable here), one line naming the extra, exit 2."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['rich'] = None; "
         "from exporter.app.cli import main; sys.exit(main(['top']))"],
        capture_output=True, text=True, cwd=REPO, env=daemon_env(None), timeout=60)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("gpu-exporter: error: top needs the top extra: "
                                    "pip install '.[top]' in the gpu-exporter checkout")


def _reply(backend: Scripted, now: float = 100.0) -> dict[str, Any]:
    history = History(60.0, 1.0)
    hub = Hub(Config(), [backend])
    for i in range(3):
        history.add(hub.collect_once(), now=now - 2 + i)
    return json.loads(json.dumps(history.as_json(now=now)))  # as it comes over the wire


def _text(model: top.Model, view: top.View, width: int = 120, height: int = 60) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, height=height)
    console.print(top.frame(model, view, "http://x", width, height))
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
    lines = [line for line in text.splitlines() if "trainer" in line or " eval" in line]
    assert "ml/train-0 (main)" in lines[0] and "3.00 GiB" in lines[0]
    view = top.View()
    assert top.key(view, model, "s") and view.sort == "utilisation"
    assert top.key(view, model, "s") and top.key(view, model, "s") and view.sort == "user"
    assert top.key(view, model, "s") and view.sort == "command"
    text = _text(model, view)
    assert text.index(" eval") < text.index("trainer")  # by command (the name here)
    assert top.key(view, model, "r")
    text = _text(model, view)
    assert text.index(" eval") > text.index("trainer") and "sorted by command ▲" in text
    assert not top.key(view, model, "q")


def test_frame_of_eight_gpus_and_no_gpu() -> None:
    backend = Scripted("amd", [f"0000:{i + 1:02x}:00.0" for i in range(8)])
    model = top.Model()
    model.merge(_reply(backend))
    text = _text(model, top.View(), width=200, height=70)
    assert len(re.findall(r"╭─  GPU \d ", text)) == 8
    assert re.search(r"╭─  GPU 0 .*╭─  GPU 1 ", text)  # two columns at 200
    edges = [line for line in text.splitlines() if line.startswith(("╭─  GPU", "╰─"))]
    assert len(edges) == 8 and {len(line) for line in edges} == {200}  # two boxes of 100
    empty = top.Model()
    empty.merge(_reply(Scripted("amd", [])))
    assert "No GPU found" in _text(empty, top.View())
    assert "Waiting for the daemon's first collection" in _text(top.Model(), top.View())
    assert top._keys("a\x1b[Cq\x1b[6~\x1bOA") == ["a", "\x1b[C", "q", "\x1b[6~", "\x1bOA"]


@pytest.mark.parametrize(("gpus", "width", "height"), [
    (1, 80, 24), (3, 80, 24), (8, 80, 24), (16, 80, 24), (8, 160, 45), (16, 240, 60),
    (8, 100, 12)])
def test_every_layout_fits_and_keeps_the_processes_and_the_keys(gpus: int, width: int,
                                                               height: int) -> None:
    """From 80x24 to wide screens, 1 to 16 GPUs: exactly the screen's lines, none wider,
    the keys' line last, the selected GPU's process table with its rows; selecting the
    last GPU keeps it on the screen (the GPU list scrolls) and shows its processes."""
    backend = Scripted("amd", [f"0000:{i + 1:02x}:00.0" for i in range(gpus)])
    backend.processes = tuple(ProcessSample(pid=100 + p, process=f"p{p}",
                                            memory_used_bytes=float((p + 1) << 20))
                              for p in range(40))
    model = top.Model()
    model.merge(_reply(backend))
    view = top.View()
    for selected in (0, gpus - 1):
        view.selected = selected
        lines = top.frame(model, view, "http://x", width, height).plain.splitlines()
        assert len(lines) == height and all(len(line) <= width for line in lines)
        assert lines[-1].startswith(" ←→ GPU")
        title = next(i for i, line in enumerate(lines) if f"GPU {selected} processes" in line)
        rows = [line for line in lines[title + 2:-1] if re.match(r" +1\d\d ", line)]
        assert len(rows) >= min(3, height - 9), lines
        assert re.search(rf"(▶ ?{selected} |GPU {selected} +pci)", "\n".join(lines))


def whole(phrase: str, screen: str) -> bool:
    """Whether ``phrase`` is on ``screen`` with every word whole, wherever its lines break
    (the lines joined, each one's indent and trailing blanks dropped)."""
    return " ".join(phrase.split()) in " ".join(screen.split())


def assert_help_whole(screen: str, keys_help: Sequence[tuple[str, str]],
                      legends: Sequence[str], width: int = 80, height: int = 24) -> None:
    """Every line of a help overlay whole on a ``width`` x ``height`` screen: each key
    with its words, each legend; no line wider than the screen."""
    lines = screen.splitlines()
    assert len(lines) <= height and all(len(line) <= width for line in lines), screen
    for keys, what in keys_help:
        assert whole(f"{keys} {what}", screen), (keys, what, screen)
    for legend in legends:
        assert whole(legend, screen), (legend, screen)


TOP_LEGENDS = ("States: ● up ◌ stale (no collection within --stale-after) ✖ down; "
               "verdicts: ✔ healthy ▲ degraded ✖ failed",)


@pytest.mark.parametrize("width", [80, 100, 160])
def test_the_help_and_the_header_are_whole_at_80_columns_and_wider(width: int) -> None:
    """At 80x24 the header was cut mid-word ("updated 07:58:45, eve") and the help lost
    "pid, user, command" and the verdicts: help is where a new user learns the keys."""
    backend = Scripted("amd", [f"0000:{i + 1:02x}:00.0" for i in range(3)])
    model = top.Model()
    model.merge(_reply(backend))
    view = top.View()
    view.help = True
    screen = top.frame(model, view, "http://127.0.0.1:9445", width, 24).plain
    assert_help_whole(screen, KEYS_HELP, TOP_LEGENDS, width)
    view.help = False
    for source in ("http://127.0.0.1:9445", "https://gpu-node-17.example.com:9445",
                   "unix:/run/gpu-exporter/gpu-exporter.sock"):
        lines = top.frame(model, view, source, width, 24).plain.splitlines()
        header = lines[0].strip() if "sort: memory" in lines[0] else " ".join(
            line.strip() for line in lines[:2])
        # what it says, with every word whole: a short form of the full title at most
        assert header.startswith("gpu-exporter top") and header.endswith("sort: memory")
        assert source.removeprefix("http://") in header, header
        words = {w.rstrip(",") for w in (
            f"gpu-exporter top {__version__} ● live · {source} · updated "
            f"{clock(model.updated or 0)}, every 1 s · sort: memory").split()}
        assert {w.rstrip(",") for w in header.split()} <= words | {source.removeprefix(
            "http://")}, header
        assert all(len(line) <= width for line in lines)


def test_processes_scroll_page_and_keep_in_range() -> None:
    backend = Scripted("amd", ["0000:03:00.0"])
    backend.processes = tuple(ProcessSample(pid=100 + p, process=f"p{p}",
                                            memory_used_bytes=float((40 - p) << 20))
                              for p in range(40))
    model = top.Model()
    model.merge(_reply(backend))
    view = top.View()

    def first_pid() -> int:
        lines = top.frame(model, view, "http://x", 80, 24).plain.splitlines()
        return int(next(line for line in lines if re.match(r" +1\d\d ", line)).split()[0])

    assert first_pid() == 100 and view.page >= 3
    top.key(view, model, "\x1b[B")
    assert first_pid() == 101
    top.key(view, model, "\x1b[6~")
    assert first_pid() == 101 + view.page
    top.key(view, model, "G")
    assert first_pid() == 140 - view.page  # the last page, not past it
    top.key(view, model, "g")
    assert first_pid() == 100
    top.key(view, model, "\x1b[A")  # not above the first
    assert first_pid() == 100


def test_process_rows_as_operators_read_them_and_an_apus_memory() -> None:
    """User, pid, memory in its unit (a 2 MiB process is "2.0 MiB", not "0.00 GiB"),
    system memory where any process has some, the busiest engine, pod and container,
    the command line cut to the screen; an APU (no VRAM) shows its shared memory as its
    memory, in its panel and its row."""
    apu = view.Device(gpu="0", name="AMD Radeon 780M", vendor="amd", state=view.State.UP,
                      shared_memory_used_bytes=float(3 << 30),
                      shared_memory_total_bytes=float(16 << 30),
                      health=view.Health(HealthStatus.HEALTHY))
    rows = (view.Process(pid=4242, process="python3", memory_bytes=float(2 << 20),
                         user="alice", command="python3 " + "x" * 300,
                         shared_memory_bytes=float(512 << 20), engines={"gfx": 0.4},
                         pod="ml/train-0", container="main"),)
    reply = view.HistoryView(now=100.0, interval=1.0, window=60.0, capacity=60,
                             series=(), devices=(apu,), backends=(),
                             processes={"0": view.Processes(rows)}).to_json()
    model = top.Model()
    model.merge(json.loads(json.dumps(reply)))
    text = _text(model, top.View(), width=120, height=40)
    row = next(line for line in text.splitlines() if "4242" in line)
    assert re.search(r" 4242 alice +2\.0 MiB +512 MiB gfx 40% +ml/train-0 \(main\) +python3 x+$",
                     row), row
    assert len(row) <= 120
    assert "Memory [" in text and "3.0 / 16.0 GiB, 13.0 GiB free (shared)" in text
    model.merge(json.loads(json.dumps(reply)))
    view_ = top.View(layout="compact")
    compact = _text(model, view_, width=120, height=40)
    assert re.search(r"MEM\[█+░+\] +3\.0/16\.0Gsh", compact)


@pytest.mark.slow
def test_an_apus_shared_memory_through_a_real_daemon(tmp_path: Path) -> None:
    """The Phoenix APU (amd-apu-phoenix) has no memory of its own: the daemon serves its
    shared memory, and top shows that as its memory, used and total as served, where it
    read n/a."""
    with running([*machine_args(FIXTURES / "amd-apu-phoenix"), "--collector.interval",
                  "0.5s"], tmp_path) as d:
        deadline = time.monotonic() + 20
        while not (reply := json.loads(fetch_snapshot(d.base_url,
                                                      endpoint="/api/v1/history")))["devices"]:
            assert time.monotonic() < deadline, "nothing recorded"
            time.sleep(0.2)
    (dev,) = reply["devices"]
    assert dev["memory_total_bytes"] is None and dev["shared_memory_used_bytes"] > 0
    model = top.Model()
    model.merge(reply)
    text = _text(model, top.View(), width=120, height=40)
    used, total = dev["shared_memory_used_bytes"], dev["shared_memory_total_bytes"]
    assert ("Memory [█" in text or "Memory [░" in text) and (
        f"{used / 2**30:.1f} / {total / 2**30:.1f} GiB, "
        f"{(total - used) / 2**30:.1f} GiB free (shared)") in text


@pytest.mark.slow
def test_a_malformed_reply_is_no_data_never_an_exception() -> None:
    """Every key of a real reply taken away in turn, and every value replaced by one of
    the wrong type: the model takes what it can and the frame draws, at 80x24 and wide."""
    backend = Scripted("amd", ["0000:03:00.0"])
    backend.processes = (ProcessSample(pid=41, process="trainer", memory_used_bytes=3e9),)
    good = _reply(backend)

    def paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        if isinstance(value, dict):
            for k, v in value.items():
                yield (*at, k)
                yield from paths(v, (*at, k))
        elif isinstance(value, list):
            for i, v in enumerate(value[:2]):
                yield (*at, i)
                yield from paths(v, (*at, i))

    def variants() -> Iterator[Any]:
        yield from (None, [], "x", 1, {"devices": "x"}, {"devices": [None, 1, "x", []]})
        for path in paths(good):
            for replacement in (DROP, None, "x", -1, 1e308, [], {}, True):
                bad = copy.deepcopy(good)
                parent = bad
                for k in path[:-1]:
                    parent = parent[k]
                if replacement is DROP:
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = replacement
                yield bad

    count = 0
    for bad in variants():
        model = top.Model()
        model.merge(bad)
        for width, height in ((80, 24), (200, 60)):
            top.frame(model, top.View(), "http://x", width, height)
        count += 1
    assert count > 500


DROP = object()


def test_no_escape_sequence_from_the_server_reaches_the_terminal() -> None:
    """Escape sequences in a GPU's name and vendor, a health reason, a backend's
    reason, a process's name, user, command line, pod and container: what top writes
    to a colour terminal holds no escape sequence but its own colours (SGR), and the
    text of each string, stripped."""
    backend = Scripted("amd", ["0000:03:00.0"])
    backend.processes = (ProcessSample(pid=41, process="trainer", memory_used_bytes=3e9,
                                       pod="train-0", namespace="ml", container="main",
                                       user="alice", command="python3 train.py"),)
    model = top.Model()
    model.merge(_poisoned(_reply(backend)))
    for view_ in (top.View(), top.View(backends=True), top.View(layout="compact")):
        console = Console(file=io.StringIO(), width=400, height=40, color_system="truecolor",
                          force_terminal=True)
        console.print(top.frame(model, view_, "http://x", 400, 40))
        out = console.file.getvalue()  # type: ignore[attr-defined]
        sequences = set(re.findall(r"\x1b[^\[]|\x1b\[[0-9;]*[^0-9;]", out))
        assert sequences and all(re.fullmatch(r"\x1b\[[0-9;]*m", s) for s in sequences), \
            sequences
        assert "\x07" not in out and "\u202e" not in out
        assert "]0;pwned]52;c;cHduZWQ=[2J[31mred" in out
    plain = top.frame(model, top.View(), "http://x", 400, 40).plain
    # each string stripped, then cut to its column (the name gives way to the command)
    for shown in ("user]0;pw", "command]0;pwned]52;c;", "pod]0;pwned]52;c;", "xid]0;pwned]",
                  "bad]0;pwned]52;", "pci-0000:03:00.0]0;pwned]", "amd]0;pwned]"):
        assert shown in plain, shown


def test_the_poll_failures_in_the_operators_words() -> None:
    assert top.describe(HTTPStatus(401, "Unauthorized")).startswith("unauthorized (401)")
    assert top.describe(ssl.SSLCertVerificationError(1, "x")).startswith("TLS error")
    assert top.describe(ReplyTimeout("no complete reply within 3 s")) == \
        "no complete reply within 3 s"
    assert top.describe(ValueError("Expecting value")) == "bad reply: not JSON"
    assert top.describe(OSError("x\x1b]0;t\x07y")) == "x]0;ty"
    model = top.Model()
    model.fail(HTTPStatus(401, "Unauthorized"))
    text = _text(model, top.View(), 100, 24)
    assert "No data: unauthorized (401)" in text and "Waiting" not in text


@pytest.mark.slow  # takes seconds
def test_fetch_bounds_a_reply_in_time_and_size(tmp_path: Path) -> None:
    """A reply trickled a byte every 0.4 s (never idle as long as the deadline) ends at
    the deadline, headers or body; one of 300 MiB is refused from its Content-Length,
    or without one once 16 MiB have come, never read whole; a status says which."""
    for behaviour in (hostile.trickle({"a": 1}, every=0.4),
                      hostile.trickle({"a": 1}, every=0.4, headers_too=True)):
        with hostile.serving(behaviour) as server:
            started = time.monotonic()
            with pytest.raises(ReplyTimeout, match="no complete reply within 1.5 s"):
                fetch_snapshot(server.url, timeout=1.5)
            assert time.monotonic() - started < 3
    for with_length in (True, False):
        with hostile.serving(hostile.endless(300 << 20, with_length)) as server:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            with pytest.raises(ReplyTooLarge, match="16 MiB"):
                fetch_snapshot(server.url, max_bytes=16 << 20)
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            assert grown < 100 * 1024  # KiB: not the 300 MiB
    with hostile.serving(hostile.reply({}, "401 Unauthorized")) as server:
        with pytest.raises(HTTPStatus) as e:
            fetch_snapshot(server.url)
    assert e.value.status == 401


@pytest.mark.slow
def test_snapshot_from_a_server_that_lies_fails_in_one_line() -> None:
    """``snapshot --from`` reads through the same bounds: a 300 MiB reply or a trickle
    is one line and exit 2, in seconds."""
    for behaviour, said in ((hostile.endless(300 << 20), "over the 64 MiB accepted"),
                            (hostile.trickle({"a": 1}, every=20.0), "no complete reply")):
        with hostile.serving(behaviour) as server:
            started = time.monotonic()
            result = subprocess.run([sys.executable, "-m", "exporter.app.cli", "snapshot",
                                     "--from", server.url], capture_output=True, text=True,
                                    cwd=REPO, env=daemon_env(None), timeout=60)
            assert time.monotonic() - started < 30
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert said in result.stderr and result.stdout == ""


@pytest.mark.slow
def test_top_help_lists_top_options_only() -> None:
    result = subprocess.run([sys.executable, "-m", "exporter.app.cli", "top", "--help"],
                            capture_output=True, text=True, cwd=REPO, env=daemon_env(None),
                            timeout=60)
    assert result.returncode == 0
    assert result.stdout.startswith("usage: gpu-exporter top [--from URL | --prometheus URL]")
    flags = set(re.findall(r"^  (?:-\w, )?(--[a-z.-]+)", result.stdout, re.M))
    assert flags == {"--help", "--version", "--from", "--tls.ca-file",
                     "--tls.insecure-skip-verify", "--prometheus", "--prometheus.http-config",
                     "--prometheus.bearer-token-file", "--tls.cert-file", "--tls.key-file",
                     "--tls.server-name", "--metric-names", "--prometheus.selector",
                     "--prometheus.node-label", "--prometheus.refresh-interval",
                     "--prometheus.timeout", "--prometheus.max-series"}, flags
    assert "--web.listen-address" not in result.stdout and "PgUp" in result.stdout
    wrong = subprocess.run([sys.executable, "-m", "exporter.app.cli", "top",
                            "--web.listen-address", ":1"], capture_output=True, text=True,
                           cwd=REPO, env=daemon_env(None), timeout=60)
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == ("gpu-exporter: error: unrecognized argument "
                                    "--web.listen-address")



@pytest.mark.slow
def test_the_daemon_never_imports_rich() -> None:
    """The terminal library is the top extra's, for ``top`` only: the running daemon
    (the live page and /api/v1/history included in its code) never loads it."""
    got = probe(["--collector.interval", "0.5s", *nvidia_only_args()], nvidia_only_env())
    modules: list[str] = got["modules"]  # type: ignore[assignment]
    assert "exporter.serve.history" in modules  # the page's own code: on its first request
    # (``rich`` itself is listed: the None that keeps structlog from importing it)
    assert [m for m in modules if m.startswith("rich.")] == []
    assert "exporter.client.top.command" not in modules
