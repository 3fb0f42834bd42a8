"""What the process does before its heavy imports: hold SIGHUP.

A SIGHUP's default action ends the process, and the daemon's own handler
(exporter.app.reload) is installed only once it has imported everything and built its
backends, a few hundred milliseconds after start. systemd's ``ExecReload`` right after a
restart fell in that window and left the service stopped. ``hold_sighup()`` runs first
(``gpu-exporter``, ``python -m exporter``, ``python -m exporter.app.cli``) and only counts
the signals; ``Daemon.run`` takes the count once its reloader is in place and asks for one
reload if any arrived. Standard library only: this module must stay cheap to import.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_held: list[int] = []


def _count(signum: int, frame: FrameType | None) -> None:
    _held.append(signum)


def hold_sighup() -> None:
    """Count SIGHUPs until the daemon's handler takes over (no-op off POSIX, off the main
    thread, or where a handler other than the default is already set)."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        signal.signal(signal.SIGHUP, _count)


def take_held() -> int:
    """How many SIGHUPs came while held (and forget them)."""
    count = len(_held)
    del _held[:count]
    return count
