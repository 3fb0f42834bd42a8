"""The landing page ``/``: every GPU with its current values, charts and top processes.

Server-rendered HTML that is complete without JavaScript: the GPU table, the health
reasons, the charts as inline SVG drawn here from the ring buffer (exporter.serve.history), the
top processes with their pods and the backends. ``/static/app.js``
(exporter.serve.landing_static) then keeps every one of them current from ``/api/v1/history``:
the tables are rebuilt from its ``devices``, ``backends`` and ``processes``, whose table
text (``cells``) is written by exporter.serve.tables for both, so a refreshed cell reads as a
reloaded page would. Nothing external: no fonts, scripts or CDNs, and the page's
Content-Security-Policy allows only its own origin (no inline script or style).
"""

from __future__ import annotations

import bisect
import html
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from exporter import __version__
from exporter.core.labels import HealthStatus
from exporter.pipeline.state import Snapshot
from exporter.serve.history import SERIES, History, Series
from exporter.serve.tables import TOP_PROCESSES, current, otlp_view, top_processes
from exporter.serve.view import (
    MARKS,
    NO_DATA,
    Backend,
    Device,
    GpuHistory,
    Otlp,
    OtlpState,
    Processes,
    State,
    mark,
    size,
)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
WIDTH, HEIGHT = 300.0, 60.0  # the charts' viewBox; app.js draws in the same one
GPU_COLUMNS = (("gpu", "gpu"), ("name", "name"), ("vendor", "vendor"), ("state", "state"),
               ("utilization", "utilisation"), ("memory", "memory"), ("power", "power / limit"),
               ("temperature", "hottest sensor"), ("health", "health"))
BACKEND_COLUMNS = (("backend", "backend"), ("state", "state"), ("reason", "reason"),
                   ("devices", "devices"))
__all__ = ["BACKEND_COLUMNS", "CSP", "GPU_COLUMNS", "MARKS", "page"]


def _e(value: object) -> str:
    return html.escape(str(value))


def chart_path(times: Sequence[float], values: Sequence[float | None], now: float,
               window: float, high: float | None) -> tuple[str, int]:
    """An SVG path (a gap where a value is unknown) and the number of points drawn.

    The x axis is the whole window, ``now - window`` at the left edge and ``now`` at the
    right, as the axis labels say. ``high``: the top of the scale; None: a quarter above
    the largest value, so a constant line is drawn below the top edge. One point per
    pixel column of the viewBox, the largest value of the samples there (a peak is never
    averaged away), so a 15 minute window of 1 s samples draws 300 points, not 900
    (app.js: the same).
    """
    return path_of(runs(times, now, window), values, high)


class Axis:
    """A GPU's time axis, shared by its charts: (pixel column, first, end) of each run of
    samples that fall in the same pixel column (``now - window`` is column 0, ``now``
    column WIDTH), with each run's slice and path prefix made once."""

    __slots__ = ("columns", "slices", "prefixes")

    def __init__(self, columns: list[tuple[int, int, int]]) -> None:
        self.columns = columns
        self.slices = [slice(a, b) for _, a, b in columns]
        self.prefixes = [_PREFIX[x] for x, _, _ in columns]


_PREFIX = [f"L{x}," for x in range(int(WIDTH) + 1)]
_Y = [str(y) for y in range(int(HEIGHT) + 1)]


def runs(times: Sequence[float], now: float, window: float) -> Axis:
    """The runs of ``times`` per pixel column, found by bisecting the sorted times at
    each column's edge: computed once for a GPU's charts, which share their times."""
    out: list[tuple[int, int, int]] = []
    first, n, start = 0, len(times), now - window
    for column in range(1, int(WIDTH) + 1):
        if first == n:
            return Axis(out)
        end = bisect.bisect_left(times, start + column * window / WIDTH, first)
        if end > first:
            out.append((column - 1, first, end))
            first = end
    if first < n:
        out.append((int(WIDTH), first, n))
    return Axis(out)


def path_of(axis: Axis, values: Sequence[float | None], high: float | None) -> tuple[str, int]:
    """chart_path over ``runs``: a point per pixel column, the largest of its values; a
    gap (the pen lifted) at an unknown value."""
    scale_y = HEIGHT / scale_top(values, high)
    if None not in values:  # the usual case: no gap, the peaks and the ys in C loops
        top = HEIGHT / scale_y
        known = cast("list[float]", values)
        peaks: Iterator[float] = map(max, map(known.__getitem__, axis.slices))
        ys = [_Y[0 if p >= top else int(HEIGHT) if p <= 0 else int(HEIGHT + 0.5 - p * scale_y)]
              for p in peaks]
        parts = list(map(str.__add__, axis.prefixes, ys))
        if parts:
            parts[0] = "M" + parts[0][1:]
        return " ".join(parts), len(parts)
    parts = []
    pen = "M"
    for x, first, end in axis.columns:
        chunk = values[first:end]
        if None not in chunk:  # the usual case: one max() in C
            best: float = max(chunk)  # type: ignore[type-var,assignment]
            parts.append(f"{pen}{x},{_y(best, scale_y)}")
            pen = "L"
            continue
        peak: float | None = None
        for v in chunk:
            if v is None:
                if peak is not None:
                    parts.append(f"{pen}{x},{_y(peak, scale_y)}")
                pen, peak = "M", None
            elif peak is None or v > peak:
                peak = v
        if peak is not None:
            parts.append(f"{pen}{x},{_y(peak, scale_y)}")
            pen = "L"
    return " ".join(parts), len(parts)


def _y(value: float, scale_y: float) -> int:
    """The y of a value, in whole viewBox units (a pixel of the 60 px chart)."""
    return int(HEIGHT + 0.5 - min(max(value * scale_y, 0.0), HEIGHT))


def scale_top(values: Sequence[float | None], high: float | None) -> float:
    return high or 1.25 * max((v for v in values if v is not None), default=0.0) or 1.0


def _minutes(seconds: float) -> str:
    return f"-{seconds / 60:g} min" if seconds >= 120 else f"-{seconds:g} s"


def _sensor(gpu: str, s: Series, device: Device | None) -> str:
    """The temperature chart's sensor, named (the hottest one now)."""
    if s.key != "temperature":
        return ""
    sensor = device.temperature.sensor if device and device.temperature else ""
    return f" <span class=\"sensor\" data-gpu=\"{_e(gpu)}\" data-sensor=\"\">{_e(sensor)}</span>"


def _chart(gpu: str, s: Series, column: GpuHistory, device: Device | None, xs: Axis,
           window: float) -> str:
    """One chart; its caption gives the newest value only while the GPU is up (a lost
    GPU's last reading is not its current one: "no data"); the scale's top is the
    series' fixed one, else the GPU's own (kept after it is lost), else autoscaled."""
    live = device is not None and device.state is State.UP
    high = s.high or column.scale.get(s.key)
    values = column.values[s.key]
    d, points = path_of(xs, values, high)
    last = next((v for v in reversed(values) if v is not None), None) if live else None
    top = scale_top(values, high)
    grid = "".join(f"<line x1=\"0\" x2=\"{WIDTH:g}\" y1=\"{HEIGHT * f:g}\" "
                   f"y2=\"{HEIGHT * f:g}\" class=\"grid\"/>" for f in (0.25, 0.5, 0.75))
    return (f"<figure class=\"chart\"><figcaption>{_e(s.title)} <span data-gpu=\"{_e(gpu)}\" "
            f"data-last=\"{s.key}\">{NO_DATA if last is None else f'{last:.0f} {s.unit}'}"
            f"</span>{_sensor(gpu, s, device)}</figcaption><div class=\"plot\">"
            f"<span class=\"ytop\" data-gpu=\"{_e(gpu)}\" data-top=\"{s.key}\">{top:.0f} "
            f"{_e(s.unit)}</span><span class=\"ybottom\">0</span>"
            f"<svg class=\"chart\" viewBox=\"0 0 {WIDTH:g} {HEIGHT:g}\" "
            f"preserveAspectRatio=\"none\" role=\"img\" data-gpu=\"{_e(gpu)}\" "
            f"data-key=\"{s.key}\" data-max=\"{'' if high is None else f'{high:g}'}\" "
            f"data-points=\"{points}\"><title>{_e(s.title)} ({_e(s.unit)}), gpu {_e(gpu)}"
            f"</title>{grid}<path d=\"{d}\" fill=\"none\" stroke=\"currentColor\" "
            "stroke-width=\"1.5\" vector-effect=\"non-scaling-stroke\"/></svg>"
            f"<span class=\"nodata\" data-gpu=\"{_e(gpu)}\" data-nodata=\"{s.key}\""
            f"{'' if points == 0 else ' hidden'}>{NO_DATA}</span>"
            f"<span class=\"xleft\">{_minutes(window)}</span><span class=\"xmid\">"
            f"{_minutes(window / 2)}</span><span class=\"xright\">now</span></div></figure>")


def _charts(gpu: str, column: GpuHistory, device: Device | None, now: float,
            window: float) -> str:
    xs = runs(column.t, now, window)  # one time axis for the GPU's charts
    return "".join(_chart(gpu, s, column, device, xs, window) for s in SERIES)


def _row(cells: Sequence[tuple[str, str, str]], attrs: str = "") -> str:
    """A table row: (column label, text, class) per cell; the label names the cell in
    the narrow layout, where each row is a card."""
    return (f"<tr{attrs}>" + "".join(
        f"<td data-label=\"{_e(label)}\"{_class(cls)}>{_e(text)}</td>"
        for label, text, cls in cells) + "</tr>")


def _class(cls: str) -> str:
    return f" class=\"{cls}\"" if cls else ""


def gpu_row(dev: Device) -> str:
    heat = dev.temperature.heat if dev.temperature else None
    status = dev.health.status
    classes = {"state": f"state-{dev.state or 'none'}",
               "temperature": f"heat-{heat}" if heat else "",
               "health": f"health-{status}" if status else ""}
    cells = dev.cells
    text = {"gpu": dev.gpu, "name": dev.name, "vendor": dev.vendor,
            "state": mark(dev.state), "health": mark(status), "utilization": cells.utilization,
            "memory": cells.memory, "power": cells.power, "temperature": cells.temperature}
    return _row([(label, text[key], classes.get(key, "")) for key, label in GPU_COLUMNS],
                f" data-gpu=\"{_e(dev.gpu)}\" class=\"state-{dev.state or 'none'}\"")


def _health(devices: Sequence[Device]) -> str:
    """The reasons of every GPU that is not healthy (the verdicts are the GPUs table's)."""
    items = "".join(
        f"<li class=\"health-{_e(d.health.status)}\">GPU {_e(d.gpu)} "
        f"({_e(d.name)}): {_e(mark(d.health.status))}: "
        + _e("; ".join(f"{r.check}: {r.reason}" for r in d.health.reasons))
        + "</li>" for d in devices
        if d.health.status is not None and d.health.status is not HealthStatus.HEALTHY)
    return (f"<ul>{items}</ul>" if items else
            "<p class=\"none\">No health problem on any GPU.</p>" if devices else "")


def processes_table(top: Processes, limit: int = TOP_PROCESSES) -> str:
    """The top ``limit`` processes (exporter.serve.tables.top_processes) of one GPU;
    pod and container columns only where a process has one (app.js: the same rule)."""
    rows = top.rows[:limit]
    if not rows:
        return "<p class=\"none\">No processes reported.</p>"
    pods = any(p.pod or p.container for p in rows)
    head = ["pid", "process", "memory"] + (["pod", "container"] if pods else [])
    body = "".join(_row([(h, str(c), "") for h, c in zip(head, (
        p.pid, p.process, size(p.memory_bytes), p.pod, p.container), strict=False)])
        for p in rows)
    more = len(top.rows) - len(rows) + top.more
    return ("<table class=\"procs\"><thead><tr>" + "".join(f"<th>{h}</th>" for h in head)
            + f"</tr></thead><tbody>{body}</tbody></table>"
            + (f"<p class=\"none\">and {more} more</p>" if more > 0 else ""))


def backend_rows(backends: Sequence[Backend], otlp: Otlp | None) -> str:
    rows = [_row([("backend", b.backend, ""), ("state", mark(b.state),
                   f"state-{b.state or 'none'}"), ("reason", b.reason, ""),
                  ("devices", str(b.devices), "")]) for b in backends]
    if otlp is not None:
        rows.append(_row([("backend", "otlp push", ""), ("state", mark(otlp.state),
                          f"state-{State.UP if otlp.state is OtlpState.OK else State.DOWN}"),
                          ("reason", otlp.detail, ""), ("devices", "", "")]))
    return "".join(rows)


def page(snapshot: Snapshot, history: History, telemetry_path: str,
         otlp: Mapping[str, Any] | None = None, now: float | None = None) -> str:
    """The whole page for the current snapshot and history."""
    now = history.now() if now is None else now  # the history's clock: its labels'
    devices, backends = current(snapshot)
    columns = {c.gpu: c for c in history.columns()}
    by_gpu = {d.gpu: d for d in devices}
    rows = "".join(gpu_row(d) for d in devices)
    processes = {gpu: top_processes(d, TOP_PROCESSES) for gpu, d in snapshot.devices
                 if not d.info.parent_key}
    empty = GpuHistory("", "", [], {s.key: [] for s in SERIES})
    cards = "".join(
        f"<section class=\"gpu\" id=\"gpu-{_e(gpu)}\"><h3>GPU {_e(gpu)}: {_e(d.name)}</h3>"
        "<div class=\"charts\">"
        + _charts(gpu, columns.get(gpu, empty), d, now, history.window)
        + f"</div><h4>Top processes</h4><div class=\"processes\" data-gpu=\"{_e(gpu)}\">"
        + processes_table(processes.get(gpu, Processes())) + "</div></section>"
        for gpu, d in by_gpu.items())
    span = (f"{history.window / 60:g} minutes" if history.window >= 120
            else f"{history.window:g} seconds")
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<title>gpu-exporter</title><link rel=\"stylesheet\" href=\"/static/app.css\">"
        f"<script src=\"/static/app.js\" defer></script></head>"
        f"<body data-window=\"{history.window:g}\" data-interval=\"{history.interval:g}\" "
        f"data-rendered=\"{now:.3f}\">"
        f"<h1>gpu-exporter {_e(__version__)}</h1>"
        f"<nav><a href=\"{_e(telemetry_path)}\">Prometheus metrics</a> · "
        "<a href=\"/snapshot\">Snapshot (JSON)</a> · "
        "<a href=\"/api/v1/history\">History (JSON)</a> · "
        "<a href=\"/-/healthy\">Exporter liveness (not GPU health)</a> · "
        "<a href=\"/-/ready\">Exporter readiness</a></nav>"
        f"<p id=\"status\">As of {_e(time.strftime('%H:%M:%S', time.localtime(now)))} "
        "(server time). <span id=\"live\"></span></p>"
        "<h2>GPUs</h2>"
        f"<p id=\"no-gpu\" class=\"empty\"{' hidden' if devices else ''}>"
        "No GPU found: see the backends below.</p>"
        f"<table class=\"gpus cards\"{'' if devices else ' hidden'}><thead><tr>"
        + "".join(f"<th>{_e(label)}</th>" for _, label in GPU_COLUMNS)
        + f"</tr></thead><tbody id=\"gpu-rows\">{rows}</tbody></table>"
        f"<h2>GPU health</h2><div id=\"health\">{_health(devices)}</div>"
        f"<h2>Charts</h2><p class=\"none\">The last {span}, one sample per "
        f"{history.interval:g} s; temperature is the hottest sensor's.</p>"
        f"<p id=\"new-gpu\" class=\"none\" hidden></p>{cards}"
        "<h2>Backends</h2><table class=\"backends cards\"><thead><tr>"
        + "".join(f"<th>{_e(label)}</th>" for _, label in BACKEND_COLUMNS)
        + "</tr></thead><tbody id=\"backend-rows\">"
        + backend_rows(backends, otlp_view(otlp)) + "</tbody></table></body></html>")
