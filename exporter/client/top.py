"""``gpu-exporter top``: a full-screen terminal dashboard of a running daemon.

It reads the daemon's ``/api/v1/history`` (the live page's data, exporter.serve.view's
``HistoryView``: each GPU's current values, state and health, each backend's state,
every GPU's processes and recent samples) once per collection interval of the daemon,
over the connection ``snapshot --from`` makes (exporter.client.fetch: http, https with a
CA or without verification, a unix socket, basic auth), and never touches a driver.

What it shows fits the terminal, from 80x24 up, for 1 to 16 GPUs and more: a panel per
GPU where there is room (utilisation bars, memory or an APU's shared memory, power
against its limit, the hottest sensor with its heat, fan, clocks, PCIe, a utilisation
sparkline, the health verdict with its reasons), else one row per GPU (nvtop and
nvitop's compact view) with the selected GPU's panel where that fits; below, the
selected GPU's processes, a table that always keeps room and scrolls (user, pid,
command line, GPU memory, shared memory, engine use, pod); the keys at the bottom.
A value the GPU does not report reads "n/a", never 0.

The daemon is not trusted: its reply is decoded through ``HistoryView.from_json`` (a
missing or malformed key is "no data", every string stripped of control and escape
characters before it is drawn), bounded in size and in time (exporter.client.fetch).
The states it draws are the daemon's words (up, down, stale per GPU and backend) and
the connection's own: "unauthorized (401)", "TLS error", "not updating since ..." once
a reply does not come whole within its deadline.

The terminal is given back as it was on every way out: ``q``, Ctrl-C, SIGTERM, and a
hang-up (SIGHUP, or the terminal's EOF/EIO when tmux, a window or an SSH session goes
away), after which it exits at once rather than run on, orphaned. Idle, it sleeps until
a key, a reply or a signal: it never polls the terminal.

Here: the terminal, the poller and the loop; the model and the keys are
exporter.client.topmodel's, the screen exporter.client.topscreen's, its panels and rows
exporter.client.toppanels'. Drawn with ``rich`` (the ``top`` extra), imported by these
only: the daemon never loads them.
"""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from rich.console import Console
from rich.live import Live

from exporter.client.fetch import fetch_snapshot, redact_url
from exporter.client.topmodel import Model as Model
from exporter.client.topmodel import View as View
from exporter.client.topmodel import _keys as _keys
from exporter.client.topmodel import describe as describe
from exporter.client.topmodel import key as key
from exporter.client.topscreen import frame as frame
from exporter.core.units import printable
from exporter.serve.untrusted import number

MAX_REPLY = 16 << 20  # bytes of one /api/v1/history reply: 8 GPUs' full history is ~0.3 MiB


class HangUp(Exception):
    """The terminal went away (SIGHUP, EOF or EIO on it), or SIGTERM came."""


def deadline(interval: float) -> float:
    """How long one reply may take as a whole before the header says "not updating"."""
    return min(15.0, max(3.0, 3 * interval))


def _poller(source: str, ca_file: str | None, insecure: bool, model: Model,
            replies: queue.Queue[tuple[str, object]], stop: threading.Event,
            wake: int) -> None:
    """Polls /api/v1/history every interval (the daemon's, from its replies), in a
    thread, so that keys answer while a reply is on its way; each reply or failure
    wakes the drawing loop through ``wake``."""
    interval = 1.0
    while not stop.is_set():
        started = time.monotonic()
        since = model.since
        endpoint = "/api/v1/history" + (f"?since={since!r}" if since else "")
        try:
            reply = json.loads(fetch_snapshot(source, timeout=deadline(interval),
                                              ca_file=ca_file, insecure=insecure,
                                              endpoint=endpoint, max_bytes=MAX_REPLY))
            replies.put(("reply", reply))
            got = number(reply.get("interval")) if isinstance(reply, dict) else None
            interval = got if got is not None and 0.1 <= got <= 3600 else 1.0
            wait = interval
        except (OSError, ValueError) as e:
            replies.put(("error", e))
            wait = 2.0
        except Exception as e:  # noqa: BLE001 - a reply must never end the dashboard
            replies.put(("error", e))
            wait = 2.0
        try:
            os.write(wake, b".")
        except OSError:
            pass
        stop.wait(max(0.2, wait - (time.monotonic() - started)))


@contextmanager
def _signals(wake: int) -> Iterator[None]:
    """SIGHUP and SIGTERM end the loop (HangUp); SIGWINCH wakes it to redraw."""
    def hang_up(signum: int, frame: FrameType | None) -> None:
        raise HangUp(signal.Signals(signum).name)

    def resized(signum: int, frame: FrameType | None) -> None:
        try:
            os.write(wake, b"w")
        except OSError:
            pass

    old = {s: signal.signal(s, h) for s, h in ((signal.SIGHUP, hang_up),
                                               (signal.SIGTERM, hang_up),
                                               (signal.SIGWINCH, resized))}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _silence() -> None:
    """After a hang-up: stdout and stderr to /dev/null, so that nothing written on the
    way out (rich leaving the alternate screen, an interpreter flush) fails on the
    terminal that is gone."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    except OSError:
        pass


def main(source: str, ca_file: str | None = None, insecure: bool = False) -> int:
    """Run the dashboard until q or Ctrl-C (0), or a hang-up or SIGTERM (129, 143); the
    terminal is restored whatever happens."""
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        print("gpu-exporter: error: top needs a terminal", file=sys.stderr)
        return 2
    shown = printable(redact_url(source), 200)
    model, view = Model(), View()
    replies: queue.Queue[tuple[str, object]] = queue.Queue()
    stop = threading.Event()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    thread = threading.Thread(target=_poller, name="top-poller", daemon=True,
                              args=(source, ca_file, insecure, model, replies, stop, wake_w))
    console = Console()
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    code = 0
    try:
        with _signals(wake_w):
            tty.setcbreak(fd)  # keys one at a time, no echo; Ctrl-C still interrupts
            thread.start()
            with Live(console=console, screen=True, auto_refresh=False) as live:
                code = _loop(live, console, fd, wake_r, model, view, shown, replies)
    except KeyboardInterrupt:
        code = 0
    except HangUp as e:
        code = 143 if str(e) == "SIGTERM" else 129
    except OSError:  # the terminal went while rich wrote to it
        code = 129
    finally:
        stop.set()
        if code == 129:
            _silence()
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        except (OSError, termios.error):
            pass  # no terminal left to restore
        for end in (wake_r, wake_w):
            os.close(end)
    return code


def _loop(live: Live, console: Console, fd: int, wake: int, model: Model, view: View,
          source: str, replies: queue.Queue[tuple[str, object]]) -> int:
    """Draw, then sleep until a key, a reply or a signal; never a timed poll."""
    def draw() -> None:
        size = console.size
        live.update(frame(model, view, source, size.width, size.height), refresh=True)

    draw()
    while True:
        ready = select.select([fd, wake], [], [])[0]
        dirty = False
        if fd in ready:
            try:
                data = os.read(fd, 1024)
            except OSError:  # EIO: the terminal is gone
                raise HangUp("EIO") from None
            if not data:  # EOF: the terminal is gone
                raise HangUp("EOF")
            for k in _keys(data.decode(errors="replace")):
                if not key(view, model, k):
                    return 0
            dirty = True
        if wake in ready:
            try:
                while os.read(wake, 512):
                    pass
            except BlockingIOError:
                pass
            dirty = True  # a reply, a failure or a resize
        while not replies.empty():
            kind, reply = replies.get_nowait()
            if kind == "reply":
                model.merge(reply)
            elif isinstance(reply, BaseException):
                model.fail(reply)
        if dirty:
            draw()
