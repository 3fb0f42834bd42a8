"""``gpu-exporter top``'s state: what the daemon said (``Model``, decoded through
exporter.serve.view: a malformed reply is "no data", never an exception), how the
connection is (a failed poll in the operator's words, ``describe``), what the operator
looks at (``View``) and what each key does (``key``)."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass, field

from exporter.client.fetch import HTTPStatus, ReplyTimeout, ReplyTooLarge
from exporter.core.units import printable
from exporter.serve.view import Backend, Device, HistoryView, Processes

SORTS = ("memory", "utilisation", "pid", "user", "command")
LAYOUTS = ("auto", "compact", "panels")
KEYS_HELP = (
    ("← → Tab n p", "select the previous / next GPU"),
    ("0-9", "select that GPU"),
    ("↑ ↓ j k", "scroll the processes a line"),
    ("PgUp PgDn space", "page the processes"),
    ("Home End g G", "first / last process"),
    ("s S", "sort processes by the next / previous key: memory, utilisation, pid, user, "
            "command"),
    ("r", "reverse the order"),
    ("b", "backends and their state instead of the processes"),
    ("l", "layout: auto, one row per GPU, a panel per GPU"),
    ("? h", "this help (any key closes it)"),
    ("q Ctrl-C", "quit"),
)


@dataclass
class Model:
    """The latest reply's devices, backends and processes, each GPU's utilisation samples
    (the sparkline), and the connection's state."""

    devices: tuple[Device, ...] = ()
    backends: tuple[Backend, ...] = ()
    raw_processes: dict[str, object] = field(default_factory=dict)  # decoded when shown
    decoded: dict[str, Processes] = field(default_factory=dict)
    util: dict[str, list[float | None]] = field(default_factory=dict)
    since: float = 0.0  # the newest sample time held (the next poll's ?since=)
    interval: float = 1.0
    recorded: bool = False  # the daemon has recorded a first sample (devices known)
    replied: bool = False  # a good reply came at all
    updated: float | None = None  # the server's clock at the last good reply
    received: float | None = None  # this machine's clock then
    error: str = ""  # why the last poll failed; empty while replies come
    keep: int = 240  # utilisation samples kept per GPU

    def merge(self, reply: object) -> None:
        """A decoded reply (any JSON value): what can be read of it."""
        if not isinstance(reply, dict) or "devices" not in reply:
            self.error = "bad reply: no devices in it (no data)"
            return
        v = HistoryView.from_json(reply, processes=False)
        self.replied = True
        self.error = ""
        self.received = time.time()
        self.updated = v.now or self.received
        self.interval = v.interval if v.interval > 0 else 1.0
        if v.devices is None:  # nothing recorded yet: still waiting
            return
        self.recorded = True
        self.devices = v.devices
        self.backends = v.backends or ()
        raw = reply.get("processes")
        self.raw_processes = dict(list(raw.items())[:64]) if isinstance(raw, dict) else {}
        self.decoded = {}
        for g in v.gpus:
            samples = self.util.setdefault(g.gpu, [])
            samples.extend(g.values.get("utilization") or [])
            del samples[:-self.keep]
            if g.t:
                self.since = max(self.since, g.t[-1])
        known = {d.gpu for d in self.devices}
        for gpu in [g for g in self.util if g not in known]:
            del self.util[gpu]

    def fail(self, error: BaseException) -> None:
        self.error = describe(error)

    def processes(self, gpu: str) -> Processes:
        """A GPU's process table, decoded when first shown (one GPU's, not all)."""
        table = self.decoded.get(gpu)
        if table is None:
            table = self.decoded[gpu] = Processes.from_json(self.raw_processes.get(gpu))
        return table


def describe(error: BaseException) -> str:
    """A failed poll in the operator's words, one line, printable."""
    if isinstance(error, HTTPStatus):
        if error.status == 401:
            return ("unauthorized (401): the daemon refused the user and password of --from "
                    "(https://user:password@host:port)")
        if error.status == 403:
            return "forbidden (403)"
        text = str(error)
    elif isinstance(error, ssl.SSLError):
        text = f"TLS error: {getattr(error, 'reason', None) or error}"
        if isinstance(error, ssl.SSLCertVerificationError):
            text = (f"TLS error: {getattr(error, 'verify_message', None) or error} "
                    "(--tls.ca-file names the daemon's CA)")
    elif isinstance(error, (ReplyTimeout, ReplyTooLarge)):
        text = str(error)
    elif isinstance(error, ConnectionRefusedError):
        text = "connection refused (is the daemon running there?)"
    elif isinstance(error, ValueError):
        text = "bad reply: not JSON"
    else:
        text = str(error) or type(error).__name__
    return printable(text, 300)


@dataclass
class View:
    selected: int = 0  # index into Model.devices
    sort: str = "memory"
    reverse: bool = False
    offset: int = 0  # first process row shown
    page: int = 10  # process rows on the screen, from the last frame
    gpu_offset: int = 0  # first GPU row shown in the compact list
    help: bool = False
    backends: bool = False
    layout: str = "auto"


NEXT = {"\t", "n", "\x1b[C", "\x1bOC"}
PREVIOUS = {"p", "\x1b[D", "\x1bOD", "\x1b[Z"}
DOWN = {"j", "\x1b[B", "\x1bOB"}
UP = {"k", "\x1b[A", "\x1bOA"}
PAGE_DOWN = {"\x1b[6~", " ", "\x06"}
PAGE_UP = {"\x1b[5~", "\x02"}
HOME = {"g", "\x1b[H", "\x1bOH", "\x1b[1~", "\x1b[7~"}
END = {"G", "\x1b[F", "\x1bOF", "\x1b[4~", "\x1b[8~"}
QUIT = {"q", "Q", "\x03", "\x04"}


def key(view: View, model: Model, k: str) -> bool:
    """Apply a key; False to quit."""
    n = max(1, len(model.devices))
    if view.help:  # any key closes the help; q still quits
        view.help = False
        return k not in QUIT
    if k in QUIT:
        return False
    if k in NEXT:
        view.selected, view.offset = (view.selected + 1) % n, 0
    elif k in PREVIOUS:
        view.selected, view.offset = (view.selected - 1) % n, 0
    elif k.isdigit():
        for i, d in enumerate(model.devices):
            if d.gpu == k:
                view.selected, view.offset = i, 0
    elif k in DOWN:
        view.offset += 1
    elif k in UP:
        view.offset = max(0, view.offset - 1)
    elif k in PAGE_DOWN:
        view.offset += view.page
    elif k in PAGE_UP:
        view.offset = max(0, view.offset - view.page)
    elif k in HOME:
        view.offset = 0
    elif k in END:
        view.offset = 1 << 30  # kept in range when drawn
    elif k in ("s", "S"):
        step = 1 if k == "s" else -1
        view.sort = SORTS[(SORTS.index(view.sort) + step) % len(SORTS)]
        view.offset = 0
    elif k == "r":
        view.reverse = not view.reverse
    elif k == "b":
        view.backends = not view.backends
    elif k == "l":
        view.layout = LAYOUTS[(LAYOUTS.index(view.layout) + 1) % len(LAYOUTS)]
    elif k in ("?", "h"):
        view.help = True
    return True
