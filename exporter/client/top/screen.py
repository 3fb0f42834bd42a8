"""``gpu-exporter top``'s screen: the layout that fits the terminal (panels where they
fit with room for the processes, else a row per GPU and the selected one's panel, else
rows only, scrolled to the selected GPU), the process table that always keeps room and
scrolls, the backends pane, the help, the header with the connection's state and the
keys' line: exactly the terminal's lines, each cut to its width."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rich.text import Text

from exporter import __version__
from exporter.client.terminal import Screen
from exporter.client.top.model import KEYS_HELP, Model, View
from exporter.client.top.panels import (
    ABSENT,
    STATE_STYLE,
    assemble,
    compact_row,
    fit_title,
    panel,
    panel_height,
    wrap,
)
from exporter.serve.view import Device, Process, Processes, State, mark, size

MIN_PROCESS_ROWS = 3  # the process table keeps at least this many rows on any screen


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


def key_lines(keys_help: Sequence[tuple[str, str]], width: int) -> list[Text]:
    """The help overlay's key table (this view's and the fleet view's), then a blank line."""
    out = [Text(" Keys", style="bold")]
    for keys, what in keys_help:  # a long one goes on under itself, never cut
        out += wrap([(f" {keys:<16}", "bold cyan"), what], width, indent=17)
    out.append(Text(""))
    return out


def help_lines(width: int) -> list[Text]:
    out = key_lines(KEYS_HELP, width)
    # A symbol stays with its word: the legend breaks between entries only.
    out += wrap([(word, "dim") for word in (
        " States: ● up", "◌ stale (no collection within --stale-after)", "✖ down;",
        "verdicts: ✔ healthy", "▲ degraded", "✖ failed")], width, indent=1, sep="  ")
    return out


def header_lines(model: Model, view: View, source: str, width: int) -> list[Text]:
    """The title line, and a red line when the daemon is not answering as it should, a
    yellow one when a backend is stale."""
    when = "never" if model.updated is None else clock(model.updated)
    live = (("✖ not updating", "bold red") if model.error else
            ("● live", "green") if model.recorded else ("… waiting", "yellow"))
    # Narrower, the title drops the refresh interval, then the version and the word
    # "updated" and "http://", then the time; only then does it go on to a second line.
    sort = ("sort: " + view.sort, "bold")
    out = fit_title((
        [assemble((f" gpu-exporter top {__version__} ", "bold reverse"), " ", live), source,
         f"updated {when}, every {model.interval:g} s", sort],
        [assemble((f" gpu-exporter top {__version__} ", "bold reverse"), " ", live), source,
         f"updated {when}", sort],
        [assemble((" gpu-exporter top ", "bold reverse"), " ", live),
         source.removeprefix("http://"), when, sort],
        [assemble((" gpu-exporter top ", "bold reverse"), " ", live),
         source.removeprefix("http://"), sort]),
        width)
    if model.error:
        since = "since " + clock(model.received) if model.received is not None else "yet"
        out += wrap([(f" ✖ Not updating {since}: {model.error}"
                      + (" (values below are stale)" if model.recorded else ""),
                      "bold red")], width, max_lines=2)
    stale = [b for b in model.backends if b.state is State.STALE]
    if stale:
        out += wrap([(" ◌ stale: " + "; ".join(f"{b.backend} ({b.reason})" for b in stale),
                      "bold yellow")], width, max_lines=2)
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
