"""How the previous run ended: a restart loop made visible in the log of the next start.

A crash inside a vendor library (a SIGSEGV in the NVIDIA driver's user-space library, a
SIGABRT from a C assertion) ends the process before any Python code can log it; systemd
and Kubernetes restart it, and without this a node can cycle through crashes with nothing
in the exporter's own log. With a state directory (``--path.state``, or systemd's
``$STATE_DIRECTORY`` from ``StateDirectory=``) the daemon keeps two small files there:

- ``run.json``: this run's pid and start time, whether it stopped cleanly, and the start
  times of the last hour (at most ``KEEP_STARTS``);
- ``crash.txt``: Python's ``faulthandler`` output, written by the fatal signal handler of
  a crashing run: the signal and the stack of every thread.

At the next start one warning line says that the previous run ended without a clean stop,
with its pid, how long it ran, the signal and innermost frame from ``crash.txt`` and how
many starts the last hour saw. Nothing here ever stops the daemon: an unusable state
directory is one warning line and the run goes on without it.

The directory is untrusted input like any other file the daemon reads: a state file is
opened without following a symlink and without blocking (a FIFO or device is not read),
only a regular file is read, at most ``MAX_READ`` bytes of it, and a record of any other
shape is discarded with one warning. Nothing is ever written through an existing name:
each file is written to a fresh temporary file (``O_EXCL``, a random name) and renamed
over the old name, which replaces a planted symlink or FIFO instead of following it.
"""

from __future__ import annotations

import errno
import faulthandler
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog

from exporter.core import untrusted_file

log = structlog.get_logger("exporter.app.lastrun")

RUN_FILE = "run.json"
CRASH_FILE = "crash.txt"
WINDOW_S = 3600.0
KEEP_STARTS = 64
MAX_READ = 64 * 1024  # of either file: a state file is never trusted to be small
# Opened without following a symlink (ELOOP) and without waiting for a FIFO's writer.
RUN_KIND = untrusted_file.Kind("state file", MAX_READ, follow=False)
# faulthandler writes every thread's stack: its first MAX_READ bytes are kept of a longer one
CRASH_KIND = untrusted_file.Kind("state file", 1 << 20, follow=False)


@dataclass(frozen=True)
class Previous:
    """What the state directory said about the run before this one."""

    clean: bool
    pid: int | None
    ran_seconds: float | None
    crash: str  # the signal line and the innermost frame, "" when none was written
    starts_last_hour: int  # this start included


def state_dir(flag: str | None, environ: Any) -> str | None:
    """``--path.state``, else the first of systemd's ``$STATE_DIRECTORY``, else None."""
    if flag:
        return flag
    systemd = str(environ.get("STATE_DIRECTORY", "")).split(":")[0].strip()
    return systemd or None


def read_state_file(path: Path, kind: untrusted_file.Kind = RUN_KIND) -> tuple[bytes, str]:
    """(the file's bytes, why it was not read): a missing file is (b"", ""); a symlink,
    FIFO, socket, device, directory or a file over ``kind``'s size is (b"", the reason).
    Read by exporter.core.untrusted_file, links not followed."""
    try:
        return untrusted_file.read(path, kind), ""
    except untrusted_file.UnreadableFile as e:
        return b"", "" if e.errno == errno.ENOENT else e.reason


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def parse_record(raw: bytes) -> tuple[dict[str, Any], str]:
    """(run.json's fields, why it was discarded): anything that is not an object of the
    fields ``_write`` writes, each of its type, is ({}, the reason). Never raises."""
    if not raw:
        return {}, ""
    if len(raw) > MAX_READ:
        return {}, f"larger than {MAX_READ} bytes"
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):  # RecursionError: [[[...]]] deeper than the stack
        return {}, "not JSON"
    if not isinstance(data, dict):
        return {}, "not a JSON object"
    checks: dict[str, Callable[[Any], bool]] = {
        "pid": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
        "started": _number, "clean": lambda v: isinstance(v, bool),
        "starts": lambda v: isinstance(v, list) and all(_number(t) for t in v)}
    wrong = sorted(key for key, ok in checks.items() if key in data and not ok(data[key]))
    if wrong:
        return {}, "unexpected " + ", ".join(wrong)
    return {key: data[key] for key in checks if key in data}, ""


def crash_summary(text: str) -> str:
    """faulthandler output -> "Fatal Python error: Segmentation fault; File ..., line N in
    read" (the innermost frame of the thread that crashed), or ""."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    fatal = next((line for line in lines if line.startswith("Fatal Python error")), "")
    if not fatal:
        return ""
    current = next((i for i, line in enumerate(lines)
                    if line.startswith("Current thread")), None)
    frame = ""
    if current is not None:
        frame = next((line for line in lines[current + 1:] if line.startswith("File ")), "")
    return f"{fatal}; {frame}" if frame else fatal


def _fresh(directory: Path, name: str) -> tuple[IO[bytes], Path]:
    """A new file of a random name beside ``name`` (O_CREAT | O_EXCL, mode 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    return os.fdopen(fd, "wb"), Path(tmp)


def _put(directory: Path, name: str) -> IO[bytes]:
    """A fresh file renamed over ``name``: whatever was there (a symlink, a FIFO) is
    replaced, never opened. The caller writes to and closes the returned file."""
    f, tmp = _fresh(directory, name)
    try:
        os.replace(tmp, directory / name)
    except OSError:
        f.close()
        tmp.unlink(missing_ok=True)
        raise
    return f


class RunRecord:
    """This run's entry in the state directory; ``stop()`` marks it clean."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self._crash: IO[bytes] | None = None
        self._record: dict[str, Any] = {}

    def start(self, now: float | None = None) -> Previous | None:
        """Read what the last run left, record this one, arm the crash file. None (and one
        warning) when the directory cannot be used."""
        now = time.time() if now is None else now
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            old = self._load()
            crash = crash_summary(self._read(CRASH_FILE).decode("utf-8", "replace"))
            starts = [t for t in old.get("starts", [])
                      if now - WINDOW_S <= t <= now][-(KEEP_STARTS - 1):] + [now]
            self._record = {"pid": os.getpid(), "started": now, "clean": False,
                            "starts": starts}
            self._write()
            self._crash = _put(self.dir, CRASH_FILE)  # empty: this run's only
            faulthandler.enable(file=self._crash, all_threads=True)
        except OSError as e:
            log.warning("state directory unusable: the next start cannot say how this run "
                        "ended", path=str(self.dir), error=str(e))
            return None
        started = old.get("started")
        previous = Previous(
            clean=bool(old.get("clean", True)) and not crash, pid=old.get("pid"),
            ran_seconds=round(now - started, 1) if started is not None
            and started <= now else None,
            crash=crash, starts_last_hour=len(starts))
        if old and not previous.clean:
            log.warning("previous run ended without a clean stop", pid=previous.pid,
                        ran_seconds=previous.ran_seconds, crash=previous.crash or None,
                        starts_last_hour=previous.starts_last_hour)
        return previous

    def stop(self) -> None:
        """A clean stop: the next start says nothing."""
        if not self._record:
            return
        self._record["clean"] = True
        try:
            self._write()
        except OSError:
            pass
        if self._crash is not None:
            faulthandler.disable()
            self._crash.close()
            self._crash = None

    def _read(self, name: str) -> bytes:
        """A state file's bytes, or b"" and one warning when it is not a regular file."""
        raw, why = read_state_file(self.dir / name,
                                   CRASH_KIND if name == CRASH_FILE else RUN_KIND)
        if why:
            log.warning("state file ignored", path=str(self.dir / name), reason=why)
        return raw[:MAX_READ] if name == CRASH_FILE else raw

    def _load(self) -> dict[str, Any]:
        record, why = parse_record(self._read(RUN_FILE))
        if why:
            log.warning("state file ignored", path=str(self.dir / RUN_FILE), reason=why)
        return record

    def _write(self) -> None:
        f, tmp = _fresh(self.dir, RUN_FILE)
        try:
            with f:
                f.write(json.dumps(self._record).encode())
            os.replace(tmp, self.dir / RUN_FILE)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
