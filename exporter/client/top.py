"""``gpu-exporter top``: a full-screen terminal dashboard of a running daemon.

It reads the daemon's ``/api/v1/history`` (the live page's data: each GPU's current
values, health, top processes and recent samples) at the daemon's collection interval,
over the same connection ``snapshot --from`` makes (http, https with a CA or without
verification, a unix socket, basic auth: exporter.serve.snapshot.fetch_snapshot), and never
touches a driver. One panel per GPU, every vendor alike: utilisation bars (GPU, memory
controller, encoder, decoder), memory used/free, power against its limit, the hottest
temperature sensor with its state (cool, warm, hot, critical), fan, clocks, PCIe link and
throughput, a utilisation sparkline and the health verdict with its reasons; below, the
selected GPU's top processes with their pods. A value the GPU does not report reads
"n/a", never 0.

Drawn with ``rich`` (the ``top`` extra), imported here only: the daemon never loads it.
Keys: ←/→ (or Tab, n/p, a digit) select a GPU, ``s`` changes the process order, ``q`` or
Ctrl-C quits and gives the terminal back as it was.
"""

from __future__ import annotations

import json
import os
import queue
import select
import sys
import termios
import threading
import time
import tty
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from exporter import __version__
from exporter.client.fetch import fetch_snapshot, redact_url

GIB = float(1 << 30)
SPARKS = "▁▂▃▄▅▆▇█"
SORTS = ("memory", "utilisation", "pid", "name")
HEAT_STYLE = {"cool": "green", "warm": "yellow", "hot": "bold dark_orange",
              "critical": "bold white on red"}
HEALTH = {"healthy": ("✔ healthy", "green"), "degraded": ("▲ degraded", "bold yellow"),
          "failed": ("✖ failed", "bold white on red")}
STATE = {"up": ("● up", "green"), "down": ("✖ down", "bold red"),
         "stale": ("◌ stale", "bold yellow")}
ABSENT = "n/a"
BAR = 20  # cells of a bar


@dataclass
class Model:
    """What the dashboard shows: the latest reply's devices and processes, each GPU's
    utilisation samples (for the sparkline), and whether the last poll failed."""

    devices: list[dict[str, Any]] = field(default_factory=list)
    processes: dict[str, Any] = field(default_factory=dict)
    util: dict[str, list[float | None]] = field(default_factory=dict)
    since: float = 0.0
    interval: float = 1.0
    updated: float | None = None  # the server's clock at the last good reply
    error: str = ""
    keep: int = 240  # utilisation samples kept per GPU

    def merge(self, reply: Mapping[str, Any]) -> None:
        if reply.get("devices") is None:  # nothing recorded yet: still waiting
            return
        self.devices = list(reply["devices"])
        self.processes = dict(reply.get("processes") or {})
        self.interval = float(reply.get("interval") or 1.0)
        self.updated = float(reply.get("now") or time.time())
        self.error = ""
        for g in reply.get("gpus") or []:
            samples = self.util.setdefault(str(g["gpu"]), [])
            samples.extend(g.get("utilization") or [])
            del samples[:-self.keep]
            if g["t"]:
                self.since = max(self.since, float(g["t"][-1]))
        known = {d["gpu"] for d in self.devices}
        for gpu in [g for g in self.util if g not in known]:
            del self.util[gpu]


@dataclass
class View:
    selected: int = 0  # index into Model.devices
    sort: str = "memory"


def bar(ratio: float | None, width: int = BAR, style: str | None = None) -> Text:
    """``[█████░░░░░]``; absent: n/a over a dim bar, never an empty (0 %) one."""
    if ratio is None:
        return Text("[" + ABSENT.center(width, "·") + "]", style="dim")
    ratio = min(max(ratio, 0.0), 1.0)
    filled = round(ratio * width)
    if style is None:
        style = "green" if ratio < 0.6 else "yellow" if ratio < 0.85 else "red"
    return Text.assemble("[", ("█" * filled, style), ("░" * (width - filled), "dim"), "]")


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
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= size:
            return f"{bps / size:.1f} {unit}"
    return f"{bps:.0f} B/s"


def _line(label: str, *parts: Text | str) -> Text:
    return Text.assemble((f"{label:<7}", "bold"), *parts)


def panel(dev: Mapping[str, Any], util: Sequence[float | None], selected: bool,
          width: int) -> list[Text]:
    """One GPU's panel, ``width`` columns wide, as its screen lines."""
    inner = max(20, width - 4)
    bar_w = max(6, min(BAR, (inner - 30) // 2))
    long_w = max(10, min(2 * bar_w + 16, inner - 9 - 34))  # room for "2.0 / 16.0 GiB, ..."
    lines: list[Text] = []
    lines.append(Text.assemble(
        _line("GPU", bar(dev["utilization"], bar_w), f" {_pct(dev['utilization']):>5}  "),
        ("MemCtl ", "bold"), bar(dev["memory_utilization"], bar_w),
        f" {_pct(dev['memory_utilization']):>5}"))
    lines.append(Text.assemble(
        _line("Enc", bar(dev["encoder"], bar_w), f" {_pct(dev['encoder']):>5}  "),
        ("Dec    ", "bold"), bar(dev["decoder"], bar_w), f" {_pct(dev['decoder']):>5}"))
    used, total, free = (dev["memory_used_bytes"], dev["memory_total_bytes"],
                         dev["memory_free_bytes"])
    mem_ratio = used / total if used is not None and total else None
    lines.append(_line("Memory", bar(mem_ratio, long_w), " " + (
        ABSENT if used is None else f"{used / GIB:.1f} / "
        + (f"{total / GIB:.1f} GiB" if total else "? GiB")
        + ("" if free is None else f", {free / GIB:.1f} GiB free"))))
    power, limit = dev["power_watts"], dev["power_limit_watts"]
    lines.append(_line("Power", bar(power / limit if power is not None and limit else None,
                                    long_w, "magenta"),
                       " " + (ABSENT if power is None else f"{power:.0f} W")
                       + ("" if limit is None else f" / {limit:.0f} W")))
    temp = dev["temperature"]
    fan = dev["fan"]
    if temp is None:
        temp_text = Text(ABSENT, style="dim")
    else:
        heat = temp["heat"]
        temp_text = Text.assemble(
            (f"{temp['celsius']:.0f} °C", HEAT_STYLE.get(heat, "")), f" {temp['sensor']} ",
            (f"[{heat}]", HEAT_STYLE.get(heat, "")),
            "" if temp["critical"] is None else f" critical {temp['critical']:.0f} °C")
    lines.append(Text.assemble(_line("Temp", temp_text), ("   Fan ", "bold"),
                               ABSENT if fan is None else f"{100 * fan:.0f} %"))
    clocks = dev["clocks"]
    lines.append(_line("Clocks", f"graphics {_mhz(clocks['graphics'])} · "
                       f"memory {_mhz(clocks['memory'])} · SM {_mhz(clocks['sm'])}"))
    pcie = dev["pcie"]
    gen = ABSENT if pcie["generation"] is None else f"gen {pcie['generation']}" + (
        "" if pcie["max_generation"] is None else f"/{pcie['max_generation']}")
    lanes = ABSENT if pcie["width"] is None else f"x{pcie['width']}" + (
        "" if pcie["max_width"] is None else f"/{pcie['max_width']}")
    lines.append(_line("PCIe", f"{gen} {lanes} · tx {_rate(pcie['tx'])} · "
                       f"rx {_rate(pcie['rx'])}"))
    lines.append(_line("Util", spark(util, inner - 7) if util else Text(ABSENT, "dim")))
    status = dev["health"]["status"]
    word, style = HEALTH.get(status, (status or ABSENT, "dim"))
    health = Text.assemble(("Health ", "bold"), (word, style))
    for r in dev["health"]["reasons"]:
        health.append(f"\n  {r['check']}: {r['reason']}", style)
    lines.append(health)
    state, state_style = STATE.get(dev["state"], (dev["state"], ""))
    title = Text.assemble((f" GPU {dev['gpu']} ", "bold reverse" if selected else "bold"),
                          f" {dev['name']} · {dev['vendor']} · ", (state, state_style), " ")
    return boxed(lines, title, width, "bold cyan" if selected else "grey50")


def boxed(lines: Sequence[Text], title: Text, width: int, border: str) -> list[Text]:
    """``lines`` in a rounded box ``width`` cells wide, ``title`` in its top edge: one
    Text per screen line (drawn here rather than by rich's Panel, a third of the cost)."""
    inner = width - 4
    title = title.copy()
    title.truncate(max(0, width - 5))
    top = Text.assemble(("╭─ ", border), title,
                        ("─" * max(0, width - 4 - title.cell_len) + "╮", border))
    out = [top]
    for line in lines:
        for part in line.split("\n"):
            part.truncate(inner, overflow="ellipsis", pad=True)
            out.append(Text.assemble(("│ ", border), part, (" │", border)))
    out.append(Text("╰" + "─" * (width - 2) + "╯", style=border))
    return out


PROCESS_COLUMNS = (("pid", True), ("process", False), ("memory", True), ("util", True),
                   ("pod", False), ("container", False))  # (header, right-aligned)


def processes(top: Mapping[str, Any] | None, sort: str, gpu: str, width: int) -> Text:
    """The selected GPU's top processes (the daemon's five by memory) in ``sort`` order,
    as a table of text lines at most ``width`` wide (the process name gives way)."""
    rows = list((top or {}).get("rows") or [])
    key = {"memory": lambda p: -(p["memory_bytes"] or 0),
           "utilisation": lambda p: -(p.get("utilization") or 0),
           "pid": lambda p: p["pid"], "name": lambda p: p["process"]}[sort]
    rows.sort(key=key)
    more = (top or {}).get("more") or 0
    cells = [[str(p["pid"]), p["process"],
              ABSENT if p["memory_bytes"] is None else f"{p['memory_bytes'] / GIB:.2f} GiB",
              _pct(p.get("utilization")).strip(), p["pod"] or "-", p["container"] or "-"]
             for p in rows] or [["", "no processes reported", "", "", "", ""]]
    widths = [max(len(h), *(len(c[i]) for c in cells))
              for i, (h, _) in enumerate(PROCESS_COLUMNS)]
    spare = width - (sum(widths) + 3 * len(widths) + 1)
    if spare < 0:  # too narrow: the process name is cut first
        widths[1] = max(4, widths[1] + spare)

    def line(values: Sequence[str], style: str = "") -> Text:
        out = Text("│", style="grey50")
        for (_, right), w, v in zip(PROCESS_COLUMNS, widths, values, strict=True):
            v = v[:w]
            out.append(" " + (v.rjust(w) if right else v.ljust(w)) + " ", style)
            out.append("│", "grey50")
        return out

    rule = "─" * (sum(widths) + 3 * len(widths) - 1)
    lines = [Text(f"GPU {gpu}: top processes by {sort}" + (f" ({more} more)" if more else ""),
                  style="bold"),
             Text(f"┌{rule}┐", style="grey50"),
             line([h for h, _ in PROCESS_COLUMNS], "bold"),
             Text(f"├{rule}┤", style="grey50"),
             *(line(c) for c in cells),
             Text(f"└{rule}┘", style="grey50")]
    out = Text("\n").join(lines)
    out.no_wrap, out.overflow = True, "crop"
    return out


def frame(model: Model, view: View, source: str, width: int) -> RenderableType:
    """One screen: the header, a panel per GPU (two columns where the terminal is wide
    enough), the selected GPU's processes and the keys."""
    when = "never" if model.updated is None else time.strftime(
        "%H:%M:%S", time.localtime(model.updated))
    header = Text.assemble((f" gpu-exporter top {__version__} ", "bold reverse"),
                           f"  {source}  updated {when}, every {model.interval:g} s  ",
                           (f"sort: {view.sort}", "bold"))
    if model.error:
        header.append(f"\n Not updating: {model.error} (values below are stale)", "bold red")
    if not model.devices:
        body: RenderableType = Text(
            "\n No GPU found: `gpu-exporter snapshot --from` shows each backend's reason."
            if model.updated is not None else "\n Waiting for the daemon...", style="bold")
        return Group(header, body)
    view.selected %= len(model.devices)
    columns = 2 if width >= 150 and len(model.devices) > 1 else 1
    panel_w = width // columns
    panels = [panel(d, model.util.get(d["gpu"], []), i == view.selected, panel_w)
              for i, d in enumerate(model.devices)]
    rows: list[Text] = []
    for i in range(0, len(panels), columns):
        side = panels[i:i + columns]
        for n in range(max(len(p) for p in side)):
            rows.append(Text.assemble(*(p[n] if n < len(p) else " " * panel_w for p in side)))
    grid = Text("\n").join(rows)
    grid.no_wrap, grid.overflow = True, "crop"
    dev = model.devices[view.selected]
    keys = Text(" ←/→ Tab or 0-9: select GPU   s: sort processes   q: quit", style="dim")
    return Group(header, grid, processes(model.processes.get(dev["gpu"]), view.sort,
                                         dev["gpu"], width), keys)


def key(view: View, model: Model, k: str) -> bool:
    """Apply a key; False to quit."""
    n = max(1, len(model.devices))
    if k in ("q", "Q", "\x03", "\x04"):
        return False
    if k in ("\t", "n", "\x1b[C", "j", "\x1b[B"):
        view.selected = (view.selected + 1) % n
    elif k in ("p", "\x1b[D", "\x1b[Z", "k", "\x1b[A"):
        view.selected = (view.selected - 1) % n
    elif k.isdigit():
        for i, d in enumerate(model.devices):
            if d["gpu"] == k:
                view.selected = i
    elif k == "s":
        view.sort = SORTS[(SORTS.index(view.sort) + 1) % len(SORTS)]
    return True


def _keys(data: str) -> list[str]:
    """Split what the terminal sent into keys (an arrow is three bytes)."""
    out, i = [], 0
    while i < len(data):
        if data[i] == "\x1b" and data[i + 1:i + 2] == "[" and i + 2 < len(data):
            out.append(data[i:i + 3])
            i += 3
        else:
            out.append(data[i])
            i += 1
    return out


def _poller(source: str, ca_file: str | None, insecure: bool, model: Model,
            replies: queue.Queue[tuple[str, Any]], stop: threading.Event) -> None:
    """Polls /api/v1/history every interval (the daemon's, from its replies), in a
    thread, so that keys answer while a reply is on its way."""
    while not stop.is_set():
        started = time.monotonic()
        endpoint = "/api/v1/history" + (f"?since={model.since!r}" if model.since else "")
        try:
            reply = json.loads(fetch_snapshot(source, timeout=5.0, ca_file=ca_file,
                                              insecure=insecure, endpoint=endpoint))
            replies.put(("reply", reply))
            interval = float(reply.get("interval") or 1.0)
        except (OSError, ValueError) as e:
            replies.put(("error", str(e)))
            interval = 2.0
        stop.wait(max(0.2, interval - (time.monotonic() - started)))


def main(source: str, ca_file: str | None = None, insecure: bool = False) -> int:
    """Run the dashboard until q or Ctrl-C; the terminal is restored whatever happens."""
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        print("gpu-exporter: error: top needs a terminal", file=sys.stderr)
        return 2
    shown = redact_url(source)
    model, view = Model(), View()
    replies: queue.Queue[tuple[str, Any]] = queue.Queue()
    stop = threading.Event()
    thread = threading.Thread(target=_poller, name="top-poller", daemon=True,
                              args=(source, ca_file, insecure, model, replies, stop))
    console = Console()
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)  # keys one at a time, no echo; Ctrl-C still interrupts
        thread.start()
        with Live(console=console, screen=True, auto_refresh=False) as live:
            size = console.size
            live.update(frame(model, view, shown, size.width), refresh=True)
            running = True
            while running:
                dirty = False
                if select.select([fd], [], [], 0.1)[0]:
                    for k in _keys(os.read(fd, 64).decode(errors="replace")):
                        running = key(view, model, k) and running
                    dirty = True
                while not replies.empty():
                    kind, reply = replies.get_nowait()
                    if kind == "reply":
                        model.merge(reply)
                    else:
                        model.error = reply
                    dirty = True
                if console.size != size:
                    size, dirty = console.size, True
                if dirty and running:
                    live.update(frame(model, view, shown, size.width), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    return 0
