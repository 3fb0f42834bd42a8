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

Drawn with ``rich`` (the ``top`` extra), imported here only: the daemon never loads it.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import ssl
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.segment import Segment
from rich.text import Span, Text

from exporter import __version__
from exporter.client.fetch import (
    HTTPStatus,
    ReplyTimeout,
    ReplyTooLarge,
    fetch_snapshot,
    redact_url,
)
from exporter.core.labels import HealthStatus
from exporter.core.units import printable
from exporter.serve.view import (
    Backend,
    Device,
    Heat,
    HistoryView,
    Process,
    Processes,
    State,
    mark,
    number,
    size,
)

MAX_REPLY = 16 << 20  # bytes of one /api/v1/history reply: 8 GPUs' full history is ~0.3 MiB
SPARKS = "▁▂▃▄▅▆▇█"
SORTS = ("memory", "utilisation", "pid", "user", "command")
LAYOUTS = ("auto", "compact", "panels")
HEAT_STYLE: dict[str, str] = {Heat.COOL: "green", Heat.WARM: "yellow",
                              Heat.HOT: "bold dark_orange", Heat.CRITICAL: "bold white on red"}
HEALTH_STYLE = {HealthStatus.HEALTHY: "green", HealthStatus.DEGRADED: "bold yellow",
                HealthStatus.FAILED: "bold white on red"}
STATE_STYLE = {State.UP: "green", State.DOWN: "bold red", State.STALE: "bold yellow"}
SYMBOL = {State.UP: "●", State.DOWN: "✖", State.STALE: "◌", HealthStatus.HEALTHY: "✔",
          HealthStatus.DEGRADED: "▲", HealthStatus.FAILED: "✖"}
ABSENT = "n/a"
BAR = 20  # cells of a panel's bar at most
MIN_PROCESS_ROWS = 3  # the process table keeps at least this many rows on any screen
GIB = float(1 << 30)
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


# -- the model: what the daemon said, and how the connection is --------------------------------

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


# -- drawing -------------------------------------------------------------------------------------

Part = str | tuple[str, str] | Text


def assemble(*parts: Part) -> Text:
    """``Text.assemble`` for this screen's parts (a string, a (string, style) pair, a
    Text): the spans are laid out here in one pass instead of a Text.append each, a
    third of a frame's cost."""
    plain: list[str] = []
    spans: list[Span] = []
    at = 0
    for part in parts:
        if isinstance(part, str):
            plain.append(part)
            at += len(part)
        elif isinstance(part, tuple):
            chunk, style = part
            plain.append(chunk)
            if style and chunk:
                spans.append(Span(at, at + len(chunk), style))
            at += len(chunk)
        else:
            chunk = part.plain
            plain.append(chunk)
            if part.style and chunk:
                spans.append(Span(at, at + len(chunk), part.style))
            spans.extend(Span(at + a, at + b, style) for a, b, style in part.spans)
            at += len(chunk)
    return Text("".join(plain), spans=spans)


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

def bar(ratio: float | None, width: int = BAR, style: str | None = None) -> Text:
    """``[█████░░░░░]``; absent: n/a over a dim bar, never an empty (0 %) one."""
    if ratio is None:
        return Text("[" + ABSENT.center(width, "·") + "]", style="dim")
    ratio = min(max(ratio, 0.0), 1.0)
    filled = round(ratio * width)
    if style is None:
        style = "green" if ratio < 0.6 else "yellow" if ratio < 0.85 else "red"
    return assemble("[", ("█" * filled, style), ("░" * (width - filled), "dim"), "]")


def spark(values: Sequence[float | None], width: int) -> Text:
    """The last ``width`` utilisation samples (percent), one block each; a gap where
    the value is unknown."""
    return Text("".join(" " if v is None else SPARKS[min(7, max(0, int(v / 100 * 8)))]
                        for v in list(values)[-width:]), style="cyan")


def _pct(ratio: float | None) -> str:
    return ABSENT if ratio is None else f"{100 * ratio:3.0f} %"


def _mhz(hz: float | None) -> str:
    return ABSENT if hz is None else f"{hz / 1e6:.0f} MHz"


def _rate(bps: float | None) -> str:
    if bps is None:
        return ABSENT
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def _int(value: float | None) -> str:
    return ABSENT if value is None else f"{value:.0f}"


def _line(label: str, *parts: Text | str) -> Text:
    return assemble((f"{label:<7}", "bold"), *parts)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def memory_of(dev: Device) -> tuple[float | None, float | None, float | None, str]:
    """(used, total, free, what): device memory, or where the GPU has none (an APU) the
    system memory it maps (shared), which is its memory."""
    if dev.memory_used_bytes is not None or dev.memory_total_bytes:
        return dev.memory_used_bytes, dev.memory_total_bytes, dev.memory_free_bytes, ""
    if dev.shared_memory_used_bytes is not None:
        used, total = dev.shared_memory_used_bytes, dev.shared_memory_total_bytes
        free = None if total is None else max(0.0, total - used)
        return used, total, free, "shared"
    return None, None, None, ""


def panel(dev: Device, util: Sequence[float | None], selected: bool, width: int,
          dim: bool = False) -> list[Text]:
    """One GPU's panel, ``width`` columns wide, as its screen lines."""
    inner = max(20, width - 4)
    bar_w = max(6, min(BAR, (inner - 30) // 2))
    long_w = max(10, min(2 * bar_w + 16, inner - 9 - 34))  # room for "2.0 / 16.0 GiB, ..."
    lines: list[Text] = []
    lines.append(assemble(
        _line("GPU", bar(dev.utilization, bar_w), f" {_pct(dev.utilization):>5}  "),
        ("MemCtl ", "bold"), bar(dev.memory_utilization, bar_w),
        f" {_pct(dev.memory_utilization):>5}"))
    lines.append(assemble(
        _line("Enc", bar(dev.encoder, bar_w), f" {_pct(dev.encoder):>5}  "),
        ("Dec    ", "bold"), bar(dev.decoder, bar_w), f" {_pct(dev.decoder):>5}"))
    used, total, free, what = memory_of(dev)
    ratio = min(1.0, used / total) if used is not None and total else None
    lines.append(_line("Memory", bar(ratio, long_w), " " + (
        ABSENT if used is None else f"{_gib(used)} / "
        + (f"{_gib(total)} GiB" if total else "? GiB")
        + ("" if free is None else f", {_gib(free)} GiB free")
        + (f" ({what})" if what else ""))))
    if not what and dev.shared_memory_used_bytes is not None:  # a discrete GPU's GTT
        shared, limit = dev.shared_memory_used_bytes, dev.shared_memory_total_bytes
        lines.append(_line("Shared", bar(shared / limit if limit else None, long_w, "blue"),
                           f" {_gib(shared)} / " + (f"{_gib(limit)} GiB" if limit
                                                     else "? GiB") + " system memory"))
    power, limit_w = dev.power_watts, dev.power_limit_watts
    lines.append(_line("Power", bar(power / limit_w if power is not None and limit_w else None,
                                    long_w, "magenta"),
                       " " + (ABSENT if power is None else f"{power:.0f} W")
                       + ("" if limit_w is None else f" / {limit_w:.0f} W")))
    temp = dev.temperature
    if temp is None:
        temp_text = Text(ABSENT, style="dim")
    else:
        heat = str(temp.heat or "")
        temp_text = assemble(
            (f"{temp.celsius:.0f} °C", HEAT_STYLE.get(heat, "")), f" {temp.sensor} ",
            (f"[{heat or ABSENT}]", HEAT_STYLE.get(heat, "")),
            "" if temp.critical is None else f" critical {temp.critical:.0f} °C")
    lines.append(assemble(_line("Temp", temp_text), ("   Fan ", "bold"),
                               ABSENT if dev.fan is None else f"{100 * dev.fan:.0f} %"))
    clocks = dev.clocks
    lines.append(_line("Clocks", f"graphics {_mhz(clocks.graphics)} · "
                       f"memory {_mhz(clocks.memory)} · SM {_mhz(clocks.sm)}"))
    pcie = dev.pcie
    gen = ABSENT if pcie.generation is None else f"gen {_int(pcie.generation)}" + (
        "" if pcie.max_generation is None else f"/{_int(pcie.max_generation)}")
    lanes = ABSENT if pcie.width is None else f"x{_int(pcie.width)}" + (
        "" if pcie.max_width is None else f"/{_int(pcie.max_width)}")
    lines.append(_line("PCIe", f"{gen} {lanes} · tx {_rate(pcie.tx)} · rx {_rate(pcie.rx)}"))
    lines.append(_line("Util", spark(util, inner - 7) if util else Text(ABSENT, "dim")))
    status = dev.health.status
    style = HEALTH_STYLE.get(status, "dim") if status else "dim"
    health = assemble(("Health ", "bold"), (mark(status), style))
    lines.append(health)
    for r in dev.health.reasons[:4]:
        lines.append(Text(f"  {r.check}: {r.reason}", style))
    title = assemble((f" GPU {dev.gpu} ", "bold reverse" if selected else "bold"),
                          f" {dev.name or ABSENT} · {dev.vendor or ABSENT} · ",
                          (mark(dev.state), STATE_STYLE.get(dev.state, "dim")
                           if dev.state else "dim"), " ")
    border = "bold cyan" if selected else "grey50"
    out = boxed(lines, title, width, border)
    if dim:
        for line in out:
            line.stylize("dim")
    return out


def boxed(lines: Sequence[Text], title: Text, width: int, border: str) -> list[Text]:
    """``lines`` in a rounded box ``width`` cells wide, ``title`` in its top edge: one
    Text per screen line (drawn here rather than by rich's Panel, a third of the cost)."""
    inner = width - 4
    title = title.copy()
    title.truncate(max(0, width - 5))
    top = assemble(("╭─ ", border), title,
                        ("─" * max(0, width - 4 - title.cell_len) + "╮", border))
    out = [top]
    for line in lines:
        line.truncate(inner, overflow="ellipsis", pad=True)
        out.append(assemble(("│ ", border), line, (" │", border)))
    out.append(Text("╰" + "─" * (width - 2) + "╯", style=border))
    return out


def panel_height(dev: Device) -> int:
    shared = 1 if dev.shared_memory_used_bytes is not None and (
        dev.memory_used_bytes is not None or dev.memory_total_bytes) else 0
    return 11 + shared + min(4, len(dev.health.reasons))


def compact_row(dev: Device, selected: bool, width: int, dim: bool = False) -> Text:
    """One GPU in one line: selection, label, state, name, utilisation and memory bars,
    power against its limit, the hottest temperature, the verdict (nvtop and nvitop's
    compact device rows)."""
    bar_w = max(4, min(20, (width - 68) // 3))
    used, total, _, what = memory_of(dev)
    ratio = min(1.0, used / total) if used is not None and total else None
    memory = ABSENT if used is None else (
        f"{_gib(used)}/{_gib(total) if total else '?'}G" + ("sh" if what else ""))
    power = ABSENT if dev.power_watts is None else (
        f"{dev.power_watts:.0f}" + ("" if dev.power_limit_watts is None
                                    else f"/{dev.power_limit_watts:.0f}") + "W")
    temp = dev.temperature
    heat = str(temp.heat or "") if temp else ""
    state_style = STATE_STYLE.get(dev.state, "dim") if dev.state else "dim"
    status = dev.health.status
    busy = ABSENT if dev.utilization is None else f"{100 * dev.utilization:.0f}%"
    tail = assemble(
        " GPU", bar(dev.utilization, bar_w), f"{busy:>4}",
        " MEM", bar(ratio, bar_w), f" {memory:>10}", f" {power:>8}",
        (f" {'n/a' if temp is None else f'{temp.celsius:.0f}°C':>4}", HEAT_STYLE.get(heat, "")),
        " ", (SYMBOL.get(status, "?") if status else "?",
              HEALTH_STYLE.get(status, "dim") if status else "dim"))
    head = assemble(("▶" if selected else " ", "bold cyan"),
                         (f"{dev.gpu:>2} ", "bold reverse" if selected else "bold"),
                         (SYMBOL.get(dev.state, "?") if dev.state else "?", state_style), " ")
    name_w = max(4, width - head.cell_len - tail.cell_len)
    name = Text(dev.name or ABSENT)
    name.truncate(name_w, overflow="ellipsis", pad=True)
    line = assemble(head, name, tail)
    line.truncate(width)
    if dim:
        line.stylize("dim")
    return line


SORT_KEYS: dict[str, Callable[[Process], tuple[object, ...]]] = {
    "memory": lambda p: (-(p.memory_bytes or 0.0), p.pid),
    "utilisation": lambda p: (-(p.utilization or 0.0), p.pid),
    "pid": lambda p: (p.pid,),
    "user": lambda p: (p.user, p.pid),
    "command": lambda p: ((p.command or p.process).lower(), p.pid),
}


def engine_of(p: Process) -> str:
    """The busiest engine and its share: ``gfx 40%``; ``n/a`` where none is reported."""
    if not p.engines:
        return ABSENT if p.utilization is None else f"{100 * p.utilization:.0f}%"
    name, share = max(p.engines.items(), key=lambda kv: kv[1])
    return f"{name[:8]} {100 * share:.0f}%"


def pod_of(p: Process) -> str:
    return p.pod + (f" ({p.container})" if p.container and p.pod else "")


def process_lines(procs: Processes | None, view: View, dev: Device, width: int,
                  rows: int, dim: bool = False) -> list[Text]:
    """The selected GPU's processes in ``view.sort`` order as a title, a header and at
    most ``rows`` rows from ``view.offset`` (kept in range here), ``width`` wide; the
    command line takes what the other columns leave."""
    procs = procs or Processes()
    listed = sorted(procs.rows, key=SORT_KEYS[view.sort], reverse=view.reverse)
    total = len(listed)
    view.page = max(1, rows)
    view.offset = max(0, min(view.offset, total - rows))
    shown = listed[view.offset:view.offset + rows]
    shared = any(p.shared_memory_bytes is not None for p in listed)
    pods = any(p.pod for p in listed)
    columns: list[tuple[str, int, bool]] = [("PID", 7, True), ("USER", 9, False),
                                            ("GPU MEM", 9, True)]
    if shared:
        columns.append(("SHARED", 9, True))
    columns.append(("ENGINE", 12, False))
    if pods:
        pod_w = min(40, max(9, max(len(pod_of(p)) for p in listed)))
        columns.append(("POD", pod_w, False))
    fixed = sum(w + 1 for _, w, _ in columns)
    columns.append(("COMMAND", max(8, width - fixed), False))
    arrow = "▲" if view.reverse else "▼"
    more = procs.more
    span = (f"{view.offset + 1}-{view.offset + len(shown)} of {total}" if total
            else "none")
    title = assemble(
        (f" GPU {dev.gpu} processes", "bold"), f" · {span}",
        f" (+{more} not listed)" if more else "",
        " · sorted by ", (f"{view.sort} {arrow}", "bold"),
        "  ↑↓ PgUp/PgDn" if total > rows else "")
    header = Text(" ".join(
        (h.rjust(w) if right else h.ljust(w))[:w] for h, w, right in columns),
        style="bold reverse")
    header.truncate(width, pad=True)
    out = [title, header]
    for p in shown:
        cells = [str(p.pid), p.user or ABSENT,
                 ABSENT if p.memory_bytes is None else size(p.memory_bytes)]
        if shared:
            cells.append(ABSENT if p.shared_memory_bytes is None
                         else size(p.shared_memory_bytes))
        cells.append(engine_of(p))
        if pods:
            cells.append(pod_of(p))
        cells.append(p.command or p.process or ABSENT)
        out.append(Text(" ".join(
            (c.rjust(w) if right else c.ljust(w))[:w]
            for (_, w, right), c in zip(columns, cells, strict=True))))
    if not listed:
        out.append(Text(" no processes reported", style="dim"))
    for line in out:
        line.truncate(width)
        if dim:
            line.stylize("dim")
    return out


def backend_lines(model: Model, width: int, rows: int) -> list[Text]:
    """Every backend with its state and the reason it is not up."""
    out = [Text(" Backends", style="bold"),
           Text(f"{'BACKEND':<10} {'STATE':<9} {'GPUS':>4} REASON".ljust(width)[:width],
                style="bold reverse")]
    for b in model.backends[:max(0, rows)]:
        line = assemble(f"{b.backend[:10]:<10} ",
                             (f"{mark(b.state):<9}", STATE_STYLE.get(b.state, "dim")
                              if b.state else "dim"), f" {b.devices:>4} {b.reason}")
        line.truncate(width)
        out.append(line)
    if not model.backends:
        out.append(Text(" no backend reported yet", style="dim"))
    return out


def help_lines(width: int) -> list[Text]:
    out = [Text(" Keys", style="bold")]
    for keys, what in KEYS_HELP:
        line = assemble((f" {keys:<16}", "bold cyan"), what)
        line.truncate(width)
        out.append(line)
    out.append(Text(""))
    out.append(Text(" States: ● up  ◌ stale (no collection within --stale-after)  ✖ down; "
                    "verdicts: ✔ healthy  ▲ degraded  ✖ failed", style="dim"))
    return out


def header_lines(model: Model, view: View, source: str, width: int) -> list[Text]:
    """The title line, and a red line when the daemon is not answering as it should, a
    yellow one when a backend is stale."""
    when = "never" if model.updated is None else clock(model.updated)
    live = (("✖ not updating", "bold red") if model.error else
            ("● live", "green") if model.recorded else ("… waiting", "yellow"))
    title = assemble((f" gpu-exporter top {__version__} ", "bold reverse"), " ",
                          live, f" · {source} · updated {when}, every {model.interval:g} s · ",
                          ("sort: " + view.sort, "bold"))
    title.truncate(width)
    out = [title]
    if model.error:
        since = "since " + clock(model.received) if model.received is not None else "yet"
        line = Text(f" ✖ Not updating {since}: {model.error}"
                    + (" (values below are stale)" if model.recorded else ""),
                    style="bold red")
        line.truncate(width)
        out.append(line)
    stale = [b for b in model.backends if b.state is State.STALE]
    if stale:
        line = Text(" ◌ stale: " + "; ".join(f"{b.backend} ({b.reason})" for b in stale),
                    style="bold yellow")
        line.truncate(width)
        out.append(line)
    return out


FOOTER = ((("←→", "GPU"), ("↑↓ PgUp/PgDn", "processes"), ("s", "sort"), ("r", "reverse"),
           ("b", "backends"), ("l", "layout"), ("?", "help"), ("q", "quit")),
          (("←→", "GPU"), ("↑↓ PgUp/Dn", "procs"), ("s", "sort"), ("r", "rev"),
           ("b", "backends"), ("l", "layout"), ("?", "help"), ("q", "quit")),
          (("←→", "GPU"), ("↑↓", "procs"), ("s", "sort"), ("?", "help"), ("q", "quit")))


def clock(t: float) -> str:
    """A Unix time as this machine's HH:MM:SS; n/a where it is no time at all."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, ValueError, OSError):
        return ABSENT


def footer(view: View, width: int) -> Text:
    """The keys, as many as fit: help and quit always."""
    if view.help:
        keys = " any key: close the help"
    else:
        keys = next((text for text in (" " + "  ".join(f"{k} {what}" for k, what in form)
                                       for form in FOOTER) if len(text) <= width),
                    " ? help  q quit")
    line = Text(keys, style="reverse")
    line.truncate(width, pad=True)
    return line


def frame(model: Model, view: View, source: str, width: int, height: int = 50) -> Screen:
    """One screen, exactly ``height`` lines of at most ``width`` cells: the header, the
    GPUs (panels where they fit with room for the processes, else a row each and the
    selected one's panel where that fits, else rows only, scrolled to the selected
    GPU), the selected GPU's processes (or the backends), the keys."""
    width, height = max(20, width), max(6, height)
    top = header_lines(model, view, source, width)
    body_h = height - len(top) - 1
    body: list[Text]
    stale_data = bool(model.error) and model.recorded
    if view.help:
        body = help_lines(width)
    elif not model.devices:
        if model.error and not model.recorded:
            message = f" No data: {model.error}"
        elif model.recorded:
            message = " No GPU found: `gpu-exporter snapshot --from` shows each backend's reason."
        else:
            message = " Waiting for the daemon's first collection..."
        body = [Text(""), Text(message, style="bold")]
        if model.recorded:
            body += backend_lines(model, width, body_h - 3)
    else:
        body = gpus_and_processes(model, view, width, body_h, stale_data)
    body = body[:body_h] + [Text("")] * max(0, body_h - len(body))
    lines = [*top, *body, footer(view, width)]
    for line in lines:
        line.truncate(width)
    return Screen(lines)


def gpus_and_processes(model: Model, view: View, width: int, height: int,
                       dim: bool) -> list[Text]:
    devices = model.devices
    n = len(devices)
    view.selected %= n
    dev = devices[view.selected]
    procs = model.processes(dev.gpu)
    wanted = len(procs.rows) or 1
    # the lower pane: the processes (title, header, rows) or the backends
    lower_min = 2 + min(wanted, MIN_PROCESS_ROWS)
    lower_want = 2 + min(wanted, 8)
    columns = max(1, min(n, width // 80))
    panel_w = width // columns
    heights = [panel_height(d) for d in devices]
    panels_h = sum(max(heights[i:i + columns]) for i in range(0, n, columns))
    upper: list[Text]
    if view.layout != "compact" and (
            panels_h + lower_want <= height or
            (view.layout == "panels" and panels_h + lower_min <= height)):
        upper = []
        for i in range(0, n, columns):
            side = [panel(d, model.util.get(d.gpu, []), i + k == view.selected, panel_w, dim)
                    for k, d in enumerate(devices[i:i + columns])]
            for row in range(max(len(p) for p in side)):
                upper.append(assemble(*(p[row] if row < len(p) else " " * panel_w
                                             for p in side)))
    else:
        detail = panel(dev, model.util.get(dev.gpu, []), True, min(width, 120), dim)
        with_detail = n + len(detail) + lower_min <= height and view.layout != "compact"
        room = height - lower_min - (len(detail) if with_detail else 0)
        shown = max(1, min(n, room))
        if n > shown:  # scroll the GPU list so that the selected one is in it
            visible = max(1, shown - 1)  # and a line that says how many are not
            if view.selected < view.gpu_offset:
                view.gpu_offset = view.selected
            elif view.selected >= view.gpu_offset + visible:
                view.gpu_offset = view.selected - visible + 1
            view.gpu_offset = max(0, min(view.gpu_offset, n - visible))
            rows = [compact_row(d, i == view.selected, width, dim)
                    for i, d in enumerate(devices[view.gpu_offset:view.gpu_offset + visible],
                                          start=view.gpu_offset)]
            hidden = n - len(rows)
            note = Text(f"   ↕ {hidden} more GPU{'s' if hidden > 1 else ''} "
                        f"(←/→ to move): GPU {view.gpu_offset}-"
                        f"{view.gpu_offset + len(rows) - 1} of {n} shown", style="dim")
            note.truncate(width)
            upper = [*rows, note]
        else:
            view.gpu_offset = 0
            upper = [compact_row(d, i == view.selected, width, dim)
                     for i, d in enumerate(devices)]
        if with_detail:
            upper += detail
    rows_left = height - len(upper) - 2
    if view.backends:
        lower = backend_lines(model, width, rows_left)
    else:
        lower = process_lines(procs, view, dev, width, rows_left, dim)
    return upper + lower


# -- keys ----------------------------------------------------------------------------------------

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


# -- running -------------------------------------------------------------------------------------

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

