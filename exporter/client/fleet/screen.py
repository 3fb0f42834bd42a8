"""``gpu-exporter top --prometheus``'s screen: the header with Prometheus' state (a load
in progress as "loading 7/12 queries", the queries that failed, an answer cut at the
series cap), the node list (a row per node, most waste first, scrolled to the selected
one) or the node drilled into (the one-daemon view's GPU rows or panels and process
table, exporter.client.top.screen), and the keys' line: exactly the terminal's lines, each
cut to its width."""

from __future__ import annotations

from rich.text import Text

from exporter import __version__
from exporter.client.fleet.model import HEALTH, KEYS_HELP, FleetModel, FleetView, NodeState
from exporter.client.fleet.nodes import NodeSummary, Waste
from exporter.client.terminal import Screen
from exporter.client.top.panels import (
    ABSENT,
    HEALTH_STYLE,
    SYMBOL,
    assemble,
    fit_title,
    wrap,
)
from exporter.client.top.screen import clock, gpus_and_processes, key_lines
from exporter.core.labels import HealthStatus

LIST_FOOTER = ((("↑↓", "node"), ("PgUp/PgDn", "page"), ("Enter", "GPUs and processes"),
                ("?", "help"), ("q", "quit")),
               (("↑↓", "node"), ("Enter", "open"), ("?", "help"), ("q", "quit")))
NODE_FOOTER = ((("Esc", "back"), ("←→", "GPU"), ("↑↓ PgUp/PgDn", "processes"), ("s", "sort"),
                ("r", "reverse"), ("l", "layout"), ("?", "help"), ("q", "quit")),
               (("Esc", "back"), ("←→", "GPU"), ("↑↓", "procs"), ("s", "sort"),
                ("l", "layout"), ("?", "help"), ("q", "quit")))


WASTE_MIN = 16  # cells the waste column keeps before node names are cut


def waste_text(w: Waste) -> str:
    """A node's waste in few words: idle allocated GPUs and their power, idle processes
    and the memory they hold, waste alerts firing; "-" for none."""
    parts = []
    if w.idle_gpus:
        parts.append(f"{w.idle_gpus} GPU{'s' if w.idle_gpus > 1 else ''} "
                     f"{w.idle_watts:.0f} W")
    if w.idle_processes:
        parts.append(f"{w.idle_processes} proc{'s' if w.idle_processes > 1 else ''} "
                     f"{w.idle_memory_bytes / (1 << 30):.1f} GiB")
    if w.alerts:
        parts.append(f"{w.alerts} alert{'s' if w.alerts > 1 else ''}")
    return ", ".join(parts) or "-"


def _memory(n: NodeSummary) -> str:
    used, total = n.memory_used_bytes, n.memory_total_bytes
    if used is None:
        return ABSENT
    gib = float(1 << 30)
    return f"{used / gib:.1f}/" + (f"{total / gib:.0f}G" if total else "?G")


def node_row(n: NodeSummary, selected: bool, name_w: int, width: int) -> Text:
    """One node: selection, its exporter's state, name, GPUs, mean utilisation, memory,
    power, the worst verdict, the waste."""
    state = ("✖", "bold red") if n.up is False else ("●", "green") if n.up else ("?", "dim")
    gpus = ABSENT if n.gpus is None else str(n.gpus)
    util = ABSENT if n.utilization is None else f"{100 * n.utilization:.0f}%"
    power = ABSENT if n.power_watts is None else f"{n.power_watts:.0f} W"
    status = HEALTH.get(n.health) if n.health is not None else None
    health = str(status) if status else ABSENT
    if n.lost_gpus:  # gpu_up 0: the exporter lost them
        status, health = HealthStatus.FAILED, f"{n.lost_gpus} lost"
    # No GPU, no verdict to give: "-", not the "?" of a node nobody scraped.
    verdict = ((SYMBOL.get(status, "?") + f" {health:<8}", HEALTH_STYLE.get(status, "dim"))
               if status else ("-".ljust(10), "dim") if n.gpus == 0 else ("? " + f"{health:<8}",
                                                                       "dim"))
    name = Text(n.node or ABSENT)
    name.truncate(name_w, overflow="ellipsis", pad=True)
    waste = waste_text(n.waste)
    line = assemble(("▶" if selected else " ", "bold cyan"), state, " ",
                    (name.plain, "bold reverse" if selected else ""),
                    f" {gpus:>4} {util:>4} {_memory(n):>11} {power:>7} ", verdict, " ",
                    (waste, "bold yellow" if n.waste.any else "dim"))
    line.truncate(width, overflow="ellipsis")
    return line


def list_lines(model: FleetModel, view: FleetView, width: int, rows: int) -> list[Text]:
    """The node list: a header and at most ``rows - 1`` nodes, scrolled so that the
    selected one is shown; a note of how many are not."""
    n = len(model.nodes)
    fixed = 3 + 5 + 5 + 12 + 8 + 11 + 1  # up to the waste column
    longest = max((len(x.node) for x in model.nodes), default=4)
    name_w = max(8, min(longest, 40, width - fixed - WASTE_MIN))
    head = (f"   {'NODE':<{name_w}} {'GPUS':>4} {'UTIL':>4} {'MEMORY':>11} {'POWER':>7} "
            f"{'HEALTH':<10} WASTE")
    header = Text(head, style="bold reverse")
    header.truncate(width, pad=True)
    room = max(1, rows - 1)
    shown = min(n, room)
    if n > room:
        shown = max(1, room - 1)  # a line says how many are not shown
    view.page = max(1, shown)
    view.selected = max(0, min(view.selected, n - 1))
    if view.selected < view.offset:
        view.offset = view.selected
    elif view.selected >= view.offset + shown:
        view.offset = view.selected - shown + 1
    view.offset = max(0, min(view.offset, n - shown))
    out = [header]
    for i in range(view.offset, view.offset + shown):
        out.append(node_row(model.nodes[i], i == view.selected, name_w, width))
    if n > shown:
        note = Text(f"   ↕ nodes {view.offset + 1}-{view.offset + shown} of {n} "
                    "(↑↓ PgUp/PgDn)", style="dim")
        note.truncate(width)
        out.append(note)
    return out


def header_lines(model: FleetModel, view: FleetView, width: int) -> list[Text]:
    """The title (with a load's progress: "loading 7/12 queries"), and a line each for
    failed queries and a cut answer."""
    node = view.node
    updated = node.model.updated if node is not None else model.updated
    when = "never" if updated is None else clock(updated)
    loaded = node.loaded if node is not None else model.loaded
    stale = node.stale if node is not None else model.stale
    errors = node.errors if node is not None else model.errors
    failed = bool(errors) and ((node.stale or not node.model.devices) if node is not None
                               else model.failed)
    load = model.load
    progress = load.progress if load is not None and (load.node is None) == (
        node is None) else None
    live = (("✖ not updating" if stale else "✖ no answer", "bold red") if failed else
            (f"⟳ loading {progress.done}/{progress.total} queries", "bold yellow")
            if progress is not None else
            ("● live", "green") if loaded else ("… loading", "yellow"))
    where = (f"node {node.shown}" if node else
             f"{len(model.nodes)} node{'s' if len(model.nodes) != 1 else ''}, "
             f"{model.gpus} GPU{'s' if model.gpus != 1 else ''}")
    # Narrower, the title drops the refresh interval, then the version and the word
    # "updated" and "http://", then the time; only then does it go on to a second line.
    name = assemble((f" gpu-exporter top {__version__} ", "bold reverse"), " ", live)
    out = fit_title((
        [name, model.source, (where, "bold"), f"updated {when}, every {model.refresh:g} s"],
        [name, model.source, (where, "bold"), f"updated {when}"],
        [assemble((" gpu-exporter top ", "bold reverse"), " ", live),
         model.source.removeprefix("http://"), (where, "bold"), when],
        [assemble((" gpu-exporter top ", "bold reverse"), " ", live),
         model.source.removeprefix("http://"), (where, "bold")]), width)
    if errors:
        if failed:
            line = (" ✖ No answer from Prometheus"
                    + (f" (values below are from {when})" if stale else "")
                    + f": {errors[0]}", "bold red")
        else:
            line = (f" ▲ {len(errors)} quer{'ies' if len(errors) > 1 else 'y'} failed "
                    f"(no data where they would show): {errors[0]}", "bold yellow")
        out += wrap([line], width, max_lines=2)
    truncated = node.truncated if node else model.truncated
    if truncated:
        out += wrap([(f" ▲ an answer was cut at {model.max_series} series "
                      "(--prometheus.max-series): totals are partial; narrow it with "
                      "--prometheus.selector", "bold yellow")], width, max_lines=2)
    return out


def help_lines(model: FleetModel, width: int) -> list[Text]:
    out = key_lines(KEYS_HELP, width)
    # Each legend goes on under its own indent; a symbol stays with its words.
    for legend in (
            ["GPUS: GPUs on the node;", "UTIL: their mean utilisation;",
             "MEMORY: used/total;", "POWER: their draw;",
             "HEALTH: the worst verdict (n lost: gpu_up 0; - no GPU)"],
            ["WASTE: allocated GPUs idle over 5 min (utilisation under "
             f"{100 * model.idle_threshold:g} %) and their power; processes holding memory "
             "with no engine time and that memory; waste alerts firing. Most waste first."],
            ["● exporter scraped (up)", "✖ exporter down", "? not scraped"]):
        if len(legend) == 1:
            out += wrap([(" " + legend[0], "dim")], width, indent=3)
        else:
            out += wrap([(" " + legend[0], "dim"), *((w, "dim") for w in legend[1:])], width,
                        indent=3, sep="  " if legend[0].startswith("●") else " ")
    return out


def footer(view: FleetView, width: int) -> Text:
    if view.help:
        keys = " any key: close the help"
    else:
        forms = NODE_FOOTER if view.node is not None else LIST_FOOTER
        keys = next((text for text in (" " + "  ".join(f"{k} {what}" for k, what in form)
                                       for form in forms) if len(text) <= width),
                    " Esc back  ? help  q quit" if view.node is not None else " ? help  q quit")
    line = Text(keys, style="reverse")
    line.truncate(width, pad=True)
    return line


def node_lines(node: NodeState, width: int, height: int) -> list[Text]:
    if not node.model.devices:
        message = (" Loading the node's GPUs and processes..." if not node.loaded else
                   " No GPU of this node in Prometheus' answers.")
        return [Text(""), Text(message, style="bold")]
    return gpus_and_processes(node.model, node.view, width, height, node.stale)


def frame(model: FleetModel, view: FleetView, width: int, height: int = 50) -> Screen:
    """One screen, exactly ``height`` lines of at most ``width`` cells."""
    width, height = max(20, width), max(6, height)
    top = header_lines(model, view, width)
    body_h = height - len(top) - 1
    body: list[Text]
    if view.help:
        body = help_lines(model, width)
    elif view.node is not None:
        body = node_lines(view.node, width, body_h)
    elif not model.nodes:
        if model.failed:
            message = " No data: Prometheus gave no answer (the line above says why)."
        elif model.loaded:
            message = (" No node: Prometheus holds no GPU series of gpu-exporter (is it "
                       "scraped? --metric-names dcgm for dcgm-exporter's names)")
        elif model.load is not None and model.load.node is None:
            p = model.load.progress
            message = f" Loading the node list from Prometheus: {p.done}/{p.total} queries..."
        else:
            message = " Loading the node list from Prometheus..."
        body = [Text(""), Text(message, style="bold")]
    else:
        body = list_lines(model, view, width, body_h)
        if model.stale:
            for line in body:
                line.stylize("dim")
    body = body[:body_h] + [Text("")] * max(0, body_h - len(body))
    lines = [*top, *body, footer(view, width)]
    for line in lines:
        line.truncate(width)
    return Screen(lines)
