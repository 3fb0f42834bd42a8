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
"""

from __future__ import annotations

import faulthandler
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog

log = structlog.get_logger("exporter.app.lastrun")

RUN_FILE = "run.json"
CRASH_FILE = "crash.txt"
WINDOW_S = 3600.0
KEEP_STARTS = 64
MAX_READ = 64 * 1024  # of either file: a state file is never trusted to be small


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


def _read(path: Path) -> str:
    try:
        with path.open("rb") as f:
            return f.read(MAX_READ).decode("utf-8", "replace")
    except OSError:
        return ""


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
            crash = crash_summary(_read(self.dir / CRASH_FILE))
            starts = [t for t in old.get("starts", []) if isinstance(t, (int, float))
                      and now - WINDOW_S <= t <= now][-(KEEP_STARTS - 1):] + [now]
            self._record = {"pid": os.getpid(), "started": now, "clean": False,
                            "starts": starts}
            self._write()
            self._crash = (self.dir / CRASH_FILE).open("wb")  # truncated: this run's only
            faulthandler.enable(file=self._crash, all_threads=True)
        except OSError as e:
            log.warning("state directory unusable: the next start cannot say how this run "
                        "ended", path=str(self.dir), error=str(e))
            return None
        started = old.get("started")
        previous = Previous(
            clean=bool(old.get("clean", True)) and not crash,
            pid=old.get("pid") if isinstance(old.get("pid"), int) else None,
            ran_seconds=round(now - started, 1) if isinstance(started, (int, float))
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

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(_read(self.dir / RUN_FILE) or "{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self) -> None:
        tmp = self.dir / (RUN_FILE + ".tmp")
        tmp.write_text(json.dumps(self._record))
        os.replace(tmp, self.dir / RUN_FILE)
