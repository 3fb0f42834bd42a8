"""``gpu-exporter top``'s drawing pieces: a GPU as a panel (bars, memory or an APU's
shared memory, power, temperature, clocks, PCIe, a sparkline, the verdict) or as one
compact row, and the helpers every line goes through (``assemble``; ``Screen`` is the
terminal's), and the layout of text that must stay whole on a narrow terminal (``wrap``,
``fit_title``).
Drawn with rich (the ``top`` extra)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Span, Text

from exporter.core.labels import HealthStatus
from exporter.serve.view import Device, Heat, State, mark

SPARKS = "▁▂▃▄▅▆▇█"
HEAT_STYLE: dict[str, str] = {Heat.COOL: "green", Heat.WARM: "yellow",
                              Heat.HOT: "bold dark_orange", Heat.CRITICAL: "bold white on red"}
HEALTH_STYLE = {HealthStatus.HEALTHY: "green", HealthStatus.DEGRADED: "bold yellow",
                HealthStatus.FAILED: "bold white on red"}
STATE_STYLE = {State.UP: "green", State.DOWN: "bold red", State.STALE: "bold yellow"}
SYMBOL = {State.UP: "●", State.DOWN: "✖", State.STALE: "◌", HealthStatus.HEALTHY: "✔",
          HealthStatus.DEGRADED: "▲", HealthStatus.FAILED: "✖"}
ABSENT = "n/a"
BAR = 20  # cells of a panel's bar at most
GIB = float(1 << 30)

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


def wrap(parts: Sequence[Part], width: int, indent: int = 3, sep: str = "",
         max_lines: int = 0) -> list[Text]:
    """``parts`` laid out on as many lines as they need, each at most ``width`` cells:
    a line breaks between words (or, with ``sep``, between parts, which keep their
    words together), never inside one; a continuation line starts ``indent`` cells in.
    Only a single unit wider than a whole line is cut, with an ellipsis; so is the last of
    ``max_lines`` (0: no limit) where more would follow."""
    units: list[Part] = []  # what never breaks
    for part in parts:
        if sep:
            units.append(part)
        else:  # a unit per word, with the spaces before it
            words, style = ((part, "") if isinstance(part, str) else part
                            if isinstance(part, tuple) else (part.plain, str(part.style or "")))
            units += [(word, style) for word in _words(words)]
    lines: list[list[Part]] = [[]]
    used = 0
    for unit in units:
        plain = unit if isinstance(unit, str) else unit[0] if isinstance(
            unit, tuple) else unit.plain
        lead = sep if sep and lines[-1] else ""
        if used and used + len(lead) + len(plain.rstrip()) > width:
            lines.append([" " * indent])
            used, lead = indent, ""
            if not sep:  # the spaces that separated it from the word before
                stripped = plain.lstrip()
                unit = (stripped, unit[1]) if isinstance(unit, tuple) else stripped
                plain = stripped
        if lead:
            lines[-1].append(lead)
        lines[-1].append(unit)
        used += len(lead) + len(plain)
    out = []
    for line in lines:
        text = assemble(*line)
        text.rstrip()
        text.truncate(width, overflow="ellipsis")
        out.append(text)
    if max_lines and len(out) > max_lines:
        out = out[:max_lines]
        out[-1].truncate(width - 1)
        out[-1].append("…")
    return out


def fit_title(forms: Sequence[Sequence[Part]], width: int) -> list[Text]:
    """A title line given in ``forms``, longest first (each a list of parts joined by
    " · "): the first that fits one line; where none does, the last wrapped between its
    parts."""
    for form in forms:
        (line, *more) = wrap(form, width, indent=1, sep=" · ")
        if not more:
            return [line]
    return wrap(forms[-1], width, indent=1, sep=" · ")


def _words(text: str) -> list[str]:
    """``text`` cut before each word, every space kept with the word after it."""
    out: list[str] = []
    start = 0
    for i in range(1, len(text)):
        if text[i] != " " and text[i - 1] == " ":
            out.append(text[start:i])
            start = i
    out.append(text[start:])
    return [w for w in out if w]


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
