"""Who runs a GPU process and what: the user (``/proc/<pid>/status``'s real uid, as a
name where this system's user database knows it) and the command line
(``/proc/<pid>/cmdline``), bounded and stripped of control characters, read once per
process by the fdinfo and NVIDIA readers through ``ProcFS.owner``. They travel in the
live view (``/api/v1/history``, ``gpu-exporter top``), never as a label."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path

from exporter.core import units
from exporter.core.config import Config
from exporter.core.fs import ProcFS, user_name
from exporter.core.model import ProcessSample
from exporter.pipeline.hub import Hub
from exporter.serve.history import History
from tests.test_collector import Scripted, scrape
from tests.test_fdinfo import FIXTURES, backend, by_pid, only_device


def test_uid_and_command_line_from_this_process_own_files() -> None:
    """The parsers on the kernel's own files (this test's process)."""
    status = Path("/proc/self/status").read_bytes()
    assert units.parse_uid(status) == os.getuid()
    cmdline = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    assert units.command_line(cmdline) == " ".join(
        a for a in cmdline.decode().split("\0") if a)[:units.MAX_COMMAND]
    assert sys.executable.rsplit("/", 1)[-1] in (units.command_line(cmdline) or "")


def test_bad_input_is_none_and_text_is_bounded_and_printable() -> None:
    assert units.parse_uid(b"Name:\tx\nUid:\tabc\t0\n") is None
    assert units.parse_uid(b"Name:\tx\n") is None and units.parse_uid(None) is None
    assert units.command_line(b"") is None and units.command_line(None) is None
    assert units.command_line(b"\0\0") is None  # a zombie's
    evil = b"sh\0-c\0\x1b]0;pwned\x07echo\x1b[2J \xff\0"
    assert units.command_line(evil) == "sh -c ]0;pwnedecho[2J \ufffd"
    long = units.command_line(b"x" * 10_000)
    assert long is not None and len(long) == units.MAX_COMMAND


def test_owner_reads_status_and_cmdline(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    root = pwd.getpwuid(0).pw_name
    (proc / "42" / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n")
    (proc / "42" / "cmdline").write_bytes(b"python3\0train.py\0--lr=0.1\0")
    assert ProcFS(proc).owner(42) == (root, "python3 train.py --lr=0.1")
    unknown = next(uid for uid in range(40_000, 41_000) if not _known(uid))
    (proc / "43").mkdir()
    (proc / "43" / "status").write_text(f"Uid:\t{unknown}\t{unknown}\t{unknown}\t{unknown}\n")
    assert ProcFS(proc).owner(43) == (str(unknown), None)  # no cmdline: a kernel thread's
    assert ProcFS(proc).owner(44) == (None, None)  # gone
    assert user_name(unknown) == str(unknown)


def _known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_the_fdinfo_reader_names_each_process_owner(tmp_path: Path) -> None:
    """The RX 7800 XT machine with gnome-shell's status given its Uid line and a command
    line: its process sample carries both; a process without them carries none."""
    machine = tmp_path / "m"
    shutil.copytree(FIXTURES / "amd-rdna3-rx7800xt", machine, symlinks=True)
    shell = machine / "proc" / "1874"
    shell.joinpath("status").write_text(shell.joinpath("status").read_text()
                                        + "Uid:\t0\t0\t0\t0\n")
    shell.joinpath("cmdline").write_bytes(b"/usr/bin/gnome-shell\0--wayland\0")
    procs = by_pid(only_device(backend(machine).sample(slow=False).devices))
    assert (procs[1874].user, procs[1874].command) == (pwd.getpwuid(0).pw_name,
                                                       "/usr/bin/gnome-shell --wayland")
    assert (procs[5120].user, procs[5120].command) == (None, None)


def test_user_and_command_are_never_labels() -> None:
    """Declared on ProcessSample without a MetricSpec: a command line is unbounded text
    (and may hold what its user typed), a user label would change every per-process
    series' label set; /metrics carries neither, the live view both."""
    backend = Scripted("amd", ["0000:03:00.0"])
    backend.processes = (ProcessSample(pid=41, process="trainer", memory_used_bytes=3e9,
                                       user="alice", command="python3 train.py --token=s3cr3t"),)
    hub = Hub(Config(), [backend])
    hub.collect_once()
    samples = scrape(hub)
    process = [labels for (name, labels) in samples if name == "gpu_process_memory_used_bytes"]
    assert process and all("alice" not in dict(ls).values() for ls in process)
    assert not any("s3cr3t" in value for _, labels in samples for _, value in labels)
    history = History(60.0, 1.0)
    history.add(hub.snapshot, now=100.0)
    row = history.as_json()["processes"]["0"]["rows"][0]
    assert (row["user"], row["command"]) == ("alice", "python3 train.py --token=s3cr3t")
