"""One ``macmon pipe`` child process: started, read line by line on threads, killed, reaped.

Owns the process and its pipes, nothing about what the lines mean. A reader thread
decodes every stdout line as it comes and keeps only the newest JSON object (and a
count of lines that were not one); another drains stderr, keeping its last lines for
the log, so a chatty child can never block on a full pipe. ``newest()`` hands
the newest line to the backend without waiting.

The child dies with the exporter:
- It leads a process group (and session) of its own, and every stop signals the
  whole group: ``--macmon.path`` may name a wrapper script that runs macmon without
  ``exec``, and killing only the wrapper left macmon running, holding the pipe, its
  two reader threads and their fds (7 macmon left after the exporter exited). The
  group is signalled only before its leader is reaped, so its id cannot belong to
  another process by then.
- ``stop()`` (the backend's ``close()``) terminates the group and reaps the child.
- Linux: ``PR_SET_PDEATHSIG`` = SIGKILL is set between fork and exec, so the child is
  killed the moment the exporter dies, even by SIGKILL. The kernel sends the signal
  when the *thread* that forked it ends: every child is started from the backend's
  collector thread, which lives as long as the exporter. (A wrapper's own children
  do not inherit it: they go as on macOS, below.)
- macOS has no parent-death signal. There the child dies at its next line (within
  one interval): its stdout's reader is gone, so the write fails with EPIPE, and
  macmon (Rust: SIGPIPE ignored, ``println!`` panics on a failed write) exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from exporter.sources.apple.parse import decode_line

MAX_LINE = 256 * 1024  # a macmon line is a few KiB; longer is garbage, and memory stays bounded
STDERR_KEEP = 5  # last stderr lines kept for the log
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class Line:
    seq: int  # 1, 2, ... per child
    doc: dict[str, object]
    received: float  # time.monotonic()


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that asks Linux to SIGKILL the child when its parent thread dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


class Child:
    """A running ``macmon pipe``; ``OSError`` from the constructor if it cannot start."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = tuple(argv)
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._newest: Line | None = None
        self._garbage = 0
        self._stderr: deque[str] = deque(maxlen=STDERR_KEEP)
        self._eof = threading.Event()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, close_fds=True, preexec_fn=_die_with_parent(),
            start_new_session=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._read_stdout, args=(self.proc.stdout,),
                             name="macmon-stdout", daemon=True),
            threading.Thread(target=self._read_stderr, args=(self.proc.stderr,),
                             name="macmon-stderr", daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def exited(self) -> bool:
        """Its stdout is closed: the child exited (or closed it, which is as bad)."""
        return self._eof.is_set()

    def wait_eof(self, timeout: float) -> bool:
        return self._eof.wait(timeout)

    def newest(self) -> Line | None:
        with self._lock:
            return self._newest

    def take_garbage(self) -> int:
        """How many lines since the last call were not JSON objects."""
        with self._lock:
            garbage, self._garbage = self._garbage, 0
            return garbage

    def stderr_tail(self) -> str:
        with self._lock:
            return " | ".join(self._stderr)

    def stop(self, grace: float) -> bool:
        """Terminate its process group (SIGKILL when ``grace`` is 0) and reap the child.
        False: not reaped yet."""
        if self.proc.returncode is None:  # not reaped: the group id is still ours
            if grace > 0:
                self._signal_group(signal.SIGTERM)
                self._eof.wait(grace)  # every member closed the pipe: all exited
            # Whatever is left (a wrapper's macmon that ignored SIGTERM, or one whose
            # wrapper already exited) goes now; the leader is at most a zombie here.
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(max(grace, 0.2))
        return self.reap()

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


    def reap(self) -> bool:
        """Collect the exit status; close the pipes once both readers are done."""
        if self.proc.poll() is None:
            return False
        for t in self._threads:
            t.join(0.5)
        if not any(t.is_alive() for t in self._threads):
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        return True

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    # -- reader threads ------------------------------------------------------------------
    def _read_stdout(self, stream: IO[bytes]) -> None:
        try:
            while line := stream.readline(MAX_LINE):
                if not line.endswith(b"\n") and len(line) >= MAX_LINE:
                    while line and not line.endswith(b"\n"):  # skip the rest of it
                        line = stream.readline(MAX_LINE)
                    doc = None
                elif not line.strip():
                    continue
                else:
                    doc = decode_line(line)
                received = time.monotonic()
                with self._lock:
                    if doc is None:
                        self._garbage += 1
                    else:
                        seq = self._newest.seq + 1 if self._newest else 1
                        self._newest = Line(seq, doc, received)
        except (OSError, ValueError):  # the pipe went away under us
            pass
        finally:
            self._eof.set()

    def _read_stderr(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            while line := stream.readline(4096):
                text = line.decode("utf-8", "replace").strip()
                text = "".join(ch for ch in text if ch.isprintable())[:200]
                if text:
                    with self._lock:
                        self._stderr.append(text)
