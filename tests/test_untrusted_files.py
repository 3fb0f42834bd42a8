"""exporter.core.untrusted_file, the one reader of files a user or another process can
place, and the proof that it is the only way in: no other module of the package opens
a path for reading except the kernel-file readers, each named below with its reason."""

from __future__ import annotations

import ast
import errno
import os
import threading
import time
from pathlib import Path

import pytest

from exporter.core import untrusted_file
from exporter.core.untrusted_file import UnreadableFile

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"
SMALL = untrusted_file.Kind("test file", 1024)
OURS = untrusted_file.Kind("state file", 1024, follow=False)
SECRET_TEXT = "hunter2-do-not-print"


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1024)
    assert untrusted_file.read(path, SMALL) == b"x" * 1024
    assert untrusted_file.read_text(path, SMALL) == "x" * 1024


@pytest.mark.parametrize("make, reason", [
    (lambda p: os.mkfifo(p), "a FIFO; a regular file is needed"),
    (lambda p: p.mkdir(), "a directory; a regular file is needed"),
    (lambda p: p.write_bytes(b"y" * 1025), "larger than the 1 KiB a test file may hold"),
    (lambda p: None, "No such file or directory"),
], ids=["fifo", "directory", "too large", "missing"])
def test_what_is_refused_is_said_with_the_file_and_the_rule(tmp_path: Path, make: object,
                                                            reason: str) -> None:
    path = tmp_path / "f"
    make(path)  # type: ignore[operator]
    started = time.monotonic()
    with pytest.raises(UnreadableFile) as e:
        untrusted_file.read(path, SMALL)
    assert time.monotonic() - started < 1  # a FIFO with no writer: refused, not waited on
    assert str(e.value) == f"{path}: {reason}"
    assert isinstance(e.value, OSError)


def test_a_device_is_refused_before_a_byte_is_read() -> None:
    """``--prometheus.http-config /dev/zero`` was read without a cap (1.7 GB in 1.3 s)."""
    started = time.monotonic()
    with pytest.raises(UnreadableFile, match="/dev/zero: a device; a regular file"):
        untrusted_file.read("/dev/zero", untrusted_file.CONFIG)
    assert time.monotonic() - started < 0.5


def test_a_symlink_is_followed_only_where_the_file_is_not_ours(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("{}")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert untrusted_file.read(link, SMALL) == b"{}"
    with pytest.raises(UnreadableFile, match="a symbolic link .not followed"):
        untrusted_file.read(link, OURS)


def test_the_error_never_holds_the_contents(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET_TEXT.encode() * 100 + b"\xff")
    for kind in (SMALL, untrusted_file.Kind("s", 1 << 20)):
        with pytest.raises(UnreadableFile) as e:
            untrusted_file.read_text(path, kind)
        assert SECRET_TEXT not in str(e.value) and SECRET_TEXT not in repr(e.value)
    assert "not UTF-8 text" in str(e.value)


def test_a_file_that_grows_while_read_is_refused(tmp_path: Path) -> None:
    """The size is checked at open and again on every chunk read."""
    path = tmp_path / "growing"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        real_fstat = os.fstat
        stat_result = real_fstat(fd)

        def grow(n: int) -> os.stat_result:
            path.write_bytes(b"z" * 4096)  # after the size was looked at
            return stat_result

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(untrusted_file.os, "fstat", grow)
            with pytest.raises(UnreadableFile) as e:
                untrusted_file.read(path, SMALL)
        assert e.value.errno == errno.EFBIG
    finally:
        os.close(fd)


def test_a_read_past_its_deadline_is_refused(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "slow"
    path.write_bytes(b"a" * (1 << 20))
    real_read = os.read

    def slow_read(fd: int, n: int) -> bytes:
        time.sleep(0.02)
        return real_read(fd, n)

    monkeypatch.setattr(untrusted_file.os, "read", slow_read)
    with pytest.raises(UnreadableFile, match="not read within 0.05 s"):
        untrusted_file.read(path, untrusted_file.Kind("slow file", 2 << 20, seconds=0.05))


def test_check_refuses_a_fifo_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "ca.crt"
    os.mkfifo(fifo)
    done = threading.Event()

    def call() -> None:
        try:
            untrusted_file.check(fifo, untrusted_file.PEM)
        except UnreadableFile:
            done.set()

    threading.Thread(target=call, daemon=True).start()
    assert done.wait(2)


def test_an_otlp_ca_file_that_is_a_fifo_is_one_line_at_start(tmp_path: Path) -> None:
    from tests.test_cli import cli, one_line_error

    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    one_line_error(cli("--otlp.endpoint", "https://127.0.0.1:4318", "--otlp.ca-file",
                       str(fifo), "--path.sysfs", str(tmp_path), "--path.procfs",
                       str(tmp_path)), f"--otlp.ca-file: {fifo}: a FIFO")


# ------------------------------------------------------------ the only way in

# Modules that read by path and why they may: the kernel's own files (sysfs, procfs,
# /dev), which exporter.core.fs reads, and writes of our own.
KERNEL_READERS = {
    "core/fs.py": "sysfs and procfs attributes (the kernel's files)",
    "core/untrusted_file.py": "the one reader itself",
    "app/healthcheck.py": "/proc/1/cmdline (the kernel's)",
    "sources/fdinfo/scan.py": "/proc/<pid>/fd and fdinfo (the kernel's)",
    "sources/kernel/perf.py": "perf_event_open, not a file",
}
ENCODINGS = {"utf-8", "utf8", "ascii", "latin-1"}


def _openers(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that open a file by its name for reading: ``open()``, ``os.open``/``io.open``
    (not with O_WRONLY or O_CREAT: a file we write), and pathlib's ``read_text`` /
    ``read_bytes`` (no argument but an encoding; SysFS/ProcFS's take the path's parts)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            found.append((node.lineno, "open"))
        elif not isinstance(func, ast.Attribute):
            continue
        elif func.attr == "open" and isinstance(func.value, ast.Name) and \
                func.value.id in ("os", "io") and not _writes(node):
            found.append((node.lineno, f"{func.value.id}.open"))
        elif func.attr in ("read_text", "read_bytes") and all(
                isinstance(a, ast.Constant) and a.value in ENCODINGS for a in node.args) \
                and "resources.files(" not in ast.unparse(func.value):  # package data: ours
            found.append((node.lineno, f"Path.{func.attr}"))
    return found


def _writes(node: ast.Call) -> bool:
    """An os.open whose flags name O_WRONLY or O_CREAT (a file we write, not read), or of
    os.devnull."""
    flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
    return "O_WRONLY" in flags or "O_CREAT" in flags or "devnull" in ast.unparse(node.args[0])


def test_no_module_opens_an_untrusted_path_itself() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in KERNEL_READERS or "/proto/" in rel:
            continue
        for line, call in _openers(ast.parse(path.read_text(), rel)):
            offenders.append(f"exporter/{rel}:{line}: {call}")
    # Package data read through importlib.resources is ours, shipped in the wheel.
    offenders = [o for o in offenders if not o.startswith("exporter/serve/landing_static.py")]
    assert offenders == [], "read through exporter.core.untrusted_file instead:\n" + \
        "\n".join(offenders)


def test_the_scan_finds_what_it_is_meant_to() -> None:
    tree = ast.parse("open(p)\nos.open(p, os.O_RDONLY)\nPath(p).read_text()\n"
                     "path.read_bytes()\nos.open(p, os.O_WRONLY | os.O_CREAT)\n"
                     "resources.files(__package__).joinpath('x.yml').read_text('utf-8')\n"
                     "proc.read_bytes(pid, 'stat')\n")
    assert sorted(c for _, c in _openers(tree)) == ["Path.read_bytes", "Path.read_text",
                                                   "open", "os.open"]
