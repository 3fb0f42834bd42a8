"""The terminal of ``gpu-exporter top``, for both of its views (one daemon,
exporter.client.top.command;
the fleet from Prometheus, exporter.client.fleet.command): the terminal set up and given back,
the signals, the poller thread and the drawing loop.

A view is an ``App``: it draws a frame for the terminal's size, takes a key, and takes
what its poller posts. The poller runs in a thread, so that keys answer while a reply is
on its way; it posts each reply (``Wakeup.post``), which wakes the loop through a pipe,
and waits for its next turn (``Wakeup.wait``), cut short when the view asks for data now
(``Wakeup.kick``) or when the loop ends.

The terminal is given back as it was on every way out: ``q``, Ctrl-C, SIGTERM, and a
hang-up (SIGHUP, or the terminal's EOF/EIO when tmux, a window or an SSH session goes
away), after which it exits at once rather than run on, orphaned. Idle, the loop sleeps
until a key, a reply or a signal: it never polls the terminal.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Protocol

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.segment import Segment
from rich.text import Text


class Screen:
    """A frame's lines, each rendered as it is (rich's Text wraps and splits a joined
    text first: most of a refresh's cost)."""

    def __init__(self, lines: Sequence[Text]) -> None:
        self.lines = lines

    @property
    def plain(self) -> str:
        return "\n".join(line.plain for line in self.lines)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        newline = Segment.line()
        for line in self.lines:
            yield from line.render(console)
            yield newline


def _keys(data: str) -> list[str]:
    """Split what the terminal sent into keys: an escape sequence (CSI ``ESC [`` up to
    its final byte, SS3 ``ESC O`` and one more) is one key."""
    out, i = [], 0
    while i < len(data):
        if data[i] == "\x1b" and data[i + 1:i + 2] == "[":
            j = i + 2
            while j < len(data) and not "\x40" <= data[j] <= "\x7e":
                j += 1
            out.append(data[i:j + 1])
            i = j + 1
        elif data[i] == "\x1b" and data[i + 1:i + 2] == "O" and i + 2 < len(data):
            out.append(data[i:i + 3])
            i += 3
        else:
            out.append(data[i])
            i += 1
    return out


class HangUp(Exception):
    """The terminal went away (SIGHUP, EOF or EIO on it), or SIGTERM came."""


class App(Protocol):
    """A view of ``top``."""

    def frame(self, width: int, height: int) -> Screen:
        """One screen: exactly ``height`` lines of at most ``width`` cells."""
        ...

    def key(self, k: str) -> bool:
        """Apply a key (one escape sequence is one key); False to quit."""
        ...

    def take(self, kind: str, payload: object) -> None:
        """What the poller posted."""
        ...


class Wakeup:
    """Between the poller thread and the drawing loop: the poller posts its news and
    waits for its turn; the view kicks it for data now; the loop's end stops it."""

    def __init__(self) -> None:
        self.replies: queue.Queue[tuple[str, object]] = queue.Queue()
        self._cond = threading.Condition()
        self._kicked = False
        self._stopped = False
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def post(self, kind: str, payload: object) -> None:
        """Hand ``payload`` to the view (``App.take``) and wake the loop to draw."""
        self.replies.put((kind, payload))
        self.ring()

    def ring(self) -> None:
        """Wake the loop (a reply, a resize)."""
        try:
            os.write(self.write_fd, b".")
        except OSError:
            pass

    def wait(self, seconds: float) -> None:
        """The poller's sleep: ``seconds``, or until a kick or the end."""
        with self._cond:
            if not self._kicked and not self._stopped:
                self._cond.wait(max(0.0, seconds))
            self._kicked = False

    def kick(self) -> None:
        with self._cond:
            self._kicked = True
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for end in (self.read_fd, self.write_fd):
            try:
                os.close(end)
            except OSError:
                pass


@contextmanager
def _signals(wakeup: Wakeup) -> Iterator[None]:
    """SIGHUP and SIGTERM end the loop (HangUp); SIGWINCH wakes it to redraw."""
    def hang_up(signum: int, frame: FrameType | None) -> None:
        raise HangUp(signal.Signals(signum).name)

    def resized(signum: int, frame: FrameType | None) -> None:
        wakeup.ring()

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


def run(app: App, poll: Callable[[Wakeup], None], wakeup: Wakeup | None = None,
        name: str = "top-poller") -> int:
    """Run ``app`` fed by ``poll`` (run in a thread with the Wakeup) until q or Ctrl-C
    (0), or a hang-up or SIGTERM (129, 143); the terminal is restored whatever
    happens. 2 without a terminal."""
    wakeup = wakeup or Wakeup()
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        wakeup.close()
        print("gpu-exporter: error: top needs a terminal", file=sys.stderr)
        return 2
    thread = threading.Thread(target=poll, name=name, daemon=True, args=(wakeup,))
    console = Console()
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    code = 0
    try:
        with _signals(wakeup):
            tty.setcbreak(fd)  # keys one at a time, no echo; Ctrl-C still interrupts
            thread.start()
            with Live(console=console, screen=True, auto_refresh=False) as live:
                code = _loop(live, console, fd, wakeup, app)
    except KeyboardInterrupt:
        code = 0
    except HangUp as e:
        code = 143 if str(e) == "SIGTERM" else 129
    except OSError:  # the terminal went while rich wrote to it
        code = 129
    finally:
        wakeup.stop()
        if code == 129:
            _silence()
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        except (OSError, termios.error):
            pass  # no terminal left to restore
        wakeup.close()
    return code


def _loop(live: Live, console: Console, fd: int, wakeup: Wakeup, app: App) -> int:
    """Draw, then sleep until a key, a reply or a signal; never a timed poll."""
    def draw() -> None:
        size = console.size
        live.update(app.frame(size.width, size.height), refresh=True)

    draw()
    while True:
        ready = select.select([fd, wakeup.read_fd], [], [])[0]
        dirty = False
        if fd in ready:
            try:
                data = os.read(fd, 1024)
            except OSError:  # EIO: the terminal is gone
                raise HangUp("EIO") from None
            if not data:  # EOF: the terminal is gone
                raise HangUp("EOF")
            for k in _keys(data.decode(errors="replace")):
                if not app.key(k):
                    return 0
            dirty = True
        if wakeup.read_fd in ready:
            wakeup.drain()
            dirty = True  # a reply, a failure or a resize
        while not wakeup.replies.empty():
            kind, payload = wakeup.replies.get_nowait()
            app.take(kind, payload)
        if dirty:
            draw()

