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

Here: the poller and the view; the terminal and the loop are exporter.client.terminal's
(shared with the fleet view, exporter.client.fleet.command), the model and the keys
exporter.client.top.model's, the screen exporter.client.top.screen's, its panels and rows
exporter.client.top.panels'. Drawn with ``rich`` (the ``top`` extra), imported by these
only: the daemon never loads them.
"""
from __future__ import annotations

import json
import time

from exporter.client.fetch import ReplyTooLarge, fetch_snapshot, json_values, redact_url
from exporter.client.terminal import HangUp as HangUp
from exporter.client.terminal import Screen, Wakeup, run
from exporter.client.terminal import _keys as _keys
from exporter.client.top.model import Model as Model
from exporter.client.top.model import View as View
from exporter.client.top.model import describe as describe
from exporter.client.top.model import key as key
from exporter.client.top.screen import frame as frame
from exporter.core.units import printable
from exporter.serve.untrusted import number

MAX_REPLY = 16 << 20  # bytes of one /api/v1/history reply: 8 GPUs' full history is ~0.3 MiB
# JSON values of one reply, counted before it is decoded: 64 GPUs' full history is about
# 500,000; a million one-key objects would be ~100 MB.
MAX_VALUES = 1_000_000


def deadline(interval: float) -> float:
    """How long one reply may take as a whole before the header says "not updating"."""
    return min(15.0, max(3.0, 3 * interval))


def _poller(source: str, ca_file: str | None, insecure: bool, model: Model,
            wakeup: Wakeup) -> None:
    """Polls /api/v1/history every interval (the daemon's, from its replies); each reply
    or failure goes to the drawing loop."""
    interval = 1.0
    while not wakeup.stopped:
        started = time.monotonic()
        since = model.since
        endpoint = "/api/v1/history" + (f"?since={since!r}" if since else "")
        try:
            body = fetch_snapshot(source, timeout=deadline(interval), ca_file=ca_file,
                                  insecure=insecure, endpoint=endpoint, max_bytes=MAX_REPLY)
            if (values := json_values(body)) > MAX_VALUES:
                raise ReplyTooLarge(f"reply of about {values:,} JSON values, over the "
                                    f"{MAX_VALUES:,} top reads")
            reply = json.loads(body)
            del body
            wakeup.post("reply", reply)
            got = number(reply.get("interval")) if isinstance(reply, dict) else None
            interval = got if got is not None and 0.1 <= got <= 3600 else 1.0
            wait = interval
        except (OSError, ValueError) as e:
            wakeup.post("error", e)
            wait = 2.0
        except Exception as e:  # noqa: BLE001 - a reply must never end the dashboard
            wakeup.post("error", e)
            wait = 2.0
        wakeup.wait(max(0.2, wait - (time.monotonic() - started)))


class Daemon:
    """The one-daemon view: the model of its replies, what the operator looks at."""

    def __init__(self, source: str) -> None:
        self.model, self.view, self.source = Model(), View(), source

    def frame(self, width: int, height: int) -> Screen:
        return frame(self.model, self.view, self.source, width, height)

    def key(self, k: str) -> bool:
        return key(self.view, self.model, k)

    def take(self, kind: str, payload: object) -> None:
        if kind == "reply":
            self.model.merge(payload)
        elif isinstance(payload, BaseException):
            self.model.fail(payload)


def main(source: str, ca_file: str | None = None, insecure: bool = False) -> int:
    """Run the dashboard until q or Ctrl-C (0), or a hang-up or SIGTERM (129, 143); the
    terminal is restored whatever happens."""
    app = Daemon(printable(redact_url(source), 200))
    return run(app, lambda wakeup: _poller(source, ca_file, insecure, app.model, wakeup))
