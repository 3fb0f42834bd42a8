"""The landing page ``/``: every GPU with its current values, charts and top processes.

Server-rendered HTML that is complete without JavaScript: the GPU table, the charts as
inline SVG drawn here from the ring buffer (exporter.history), the top processes with
their pods, the health table and the backends. ``/static/app.js`` (exporter.landing_static)
then keeps the values, charts and process tables current from ``/api/v1/history``.
Nothing external: no fonts, scripts or CDNs, and the page's Content-Security-Policy allows
only its own origin (no inline script or style).
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from typing import Any

from exporter import __version__, health
from exporter.history import SERIES, History, Series, memory_ratio, temperature, top_processes
from exporter.model import DeviceSample
from exporter.state import Snapshot

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
WIDTH, HEIGHT = 300.0, 60.0  # the charts' viewBox; app.js draws in the same one
GIB = float(1 << 30)
MIN_SPAN = 30.0  # seconds: the narrowest x axis of a chart (app.js: the same)


def _e(value: object) -> str:
    return html.escape(str(value))


def _fmt(value: float | None, unit: str, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f} {unit}"


def chart_path(times: Sequence[float], values: Sequence[float | None], now: float,
               window: float, high: float | None) -> tuple[str, int]:
    """An SVG path (a gap where a value is unknown) and the number of points drawn.

    The x axis spans the samples there are, at least MIN_SPAN seconds and at most
    ``window``, so a page opened a minute after start shows a line, not a dot at the
    right edge. ``high``: the top of the scale; None: a quarter above the largest value,
    so a constant line is drawn below the top edge.
    """
    span = min(window, max(MIN_SPAN, now - times[0])) if times else window
    top = high or 1.25 * max((v for v in values if v is not None), default=0.0) or 1.0
    parts, points, pen = [], 0, "M"
    for t, v in zip(times, values, strict=True):
        if v is None:
            pen = "M"
            continue
        x = max(0.0, WIDTH - (now - t) / span * WIDTH)
        y = HEIGHT - min(max(v / top, 0.0), 1.0) * HEIGHT
        parts.append(f"{pen}{x:.1f},{y:.1f}")
        pen, points = "L", points + 1
    return " ".join(parts), points


def _chart(gpu: str, s: Series, column: Mapping[str, Any], now: float, window: float) -> str:
    d, points = chart_path(column["t"], column[s.key], now, window, s.high)
    last = next((v for v in reversed(column[s.key]) if v is not None), None)
    return (f"<figure><figcaption>{_e(s.title)} <span data-gpu=\"{_e(gpu)}\" "
            f"data-last=\"{s.key}\">{_fmt(last, s.unit)}</span></figcaption>"
            f"<svg class=\"chart\" viewBox=\"0 0 {WIDTH:g} {HEIGHT:g}\" "
            f"preserveAspectRatio=\"none\" role=\"img\" data-gpu=\"{_e(gpu)}\" "
            f"data-key=\"{s.key}\" data-max=\"{'' if s.high is None else f'{s.high:g}'}\" "
            f"data-points=\"{points}\"><title>{_e(s.title)} ({_e(s.unit)}), gpu {_e(gpu)}"
            f"</title><path d=\"{d}\" fill=\"none\" stroke=\"currentColor\" "
            "stroke-width=\"1.5\" vector-effect=\"non-scaling-stroke\"/></svg></figure>")


def _gpu_row(gpu: str, d: DeviceSample, verdict: str) -> str:
    mem = memory_ratio(d)
    used = "–" if d.memory_used_bytes is None else (
        f"{d.memory_used_bytes / GIB:.1f} / {(d.memory_total_bytes or 0) / GIB:.1f} GiB"
        + ("" if mem is None else f" ({100 * mem:.0f} %)"))
    util = None if d.utilization_ratio is None else 100 * d.utilization_ratio
    cells = (gpu, d.info.name or d.info.uuid, d.info.vendor,
             "up" if d.up else "down", _fmt(util, "%"), used, _fmt(d.power_watts, "W"),
             _fmt(temperature(d), "°C"), verdict)
    return "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"


def _processes(gpu: str, d: DeviceSample) -> str:
    """The top processes (exporter.history.top_processes) in a ``div.processes`` that
    app.js refills from ``/api/v1/history``'s ``processes``."""
    top, more = top_processes(d)
    rows = "".join(
        "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in (
            p["pid"], p["process"], _fmt(None if p["memory_bytes"] is None
                                         else p["memory_bytes"] / GIB, "GiB", 2),
            p["pod"], p["container"])) + "</tr>"
        for p in top)
    inner = ("<p class=\"none\">No processes reported.</p>" if not top else
             "<table><thead><tr><th>pid</th><th>process</th><th>memory</th><th>pod</th>"
             f"<th>container</th></tr></thead><tbody>{rows}</tbody></table>"
             + (f"<p class=\"none\">and {more} more</p>" if more > 0 else ""))
    return f"<div class=\"processes\" data-gpu=\"{_e(gpu)}\">{inner}</div>"


def page(snapshot: Snapshot, history: History, telemetry_path: str,
         otlp: Mapping[str, Any] | None = None, now: float | None = None) -> str:
    """The whole page for the current snapshot and history."""
    now = time.time() if now is None else now
    verdicts = {gpu: health.STATUS_NAMES[v.status] for gpu, _, v in snapshot.health}
    gpus = [(gpu, d) for gpu, d in snapshot.devices if not d.info.parent_key]
    columns = {c["gpu"]: c for c in history.as_json()["gpus"]}
    rows = "".join(_gpu_row(gpu, d, verdicts.get(gpu, "")) for gpu, d in gpus)
    empty: dict[str, Any] = {"t": [], **{s.key: [] for s in SERIES}}
    cards = "".join(
        f"<section class=\"gpu\" id=\"gpu-{_e(gpu)}\"><h3>GPU {_e(gpu)}: "
        f"{_e(d.info.name or d.info.uuid)}</h3><div class=\"charts\">"
        + "".join(_chart(gpu, s, columns.get(gpu, empty), now, history.window)
                  for s in SERIES)
        + f"</div><h4>Top processes</h4>{_processes(gpu, d)}</section>"
        for gpu, d in gpus)
    backends = "".join(
        f"<tr><td>{_e(s.name)}</td><td>{'up' if s.up and not s.stale else 'down'}</td>"
        f"<td>{_e('stale' if s.stale else s.reason)}</td>"
        f"<td>{len(s.last.devices) if s.last else 0}</td></tr>" for s in snapshot.backends)
    if otlp is not None:
        backends += (f"<tr><td>otlp push</td><td>{'failing' if otlp['last_error'] else 'ok'}"
                     f"</td><td>{_e(otlp['last_error'] or otlp['endpoint'])}</td><td></td></tr>")
    minutes = history.window / 60
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<title>gpu-exporter</title><link rel=\"stylesheet\" href=\"/static/app.css\">"
        f"<script src=\"/static/app.js\" defer></script></head>"
        f"<body data-window=\"{history.window:g}\" data-interval=\"{history.interval:g}\">"
        f"<h1>gpu-exporter {_e(__version__)}</h1>"
        f"<p><a href=\"{_e(telemetry_path)}\">Metrics</a> · <a href=\"/snapshot\">Snapshot "
        "(JSON)</a> · <a href=\"/api/v1/history\">History (JSON)</a> · "
        "<a href=\"/-/healthy\">Health</a> · <a href=\"/-/ready\">Readiness</a></p>"
        "<h2>GPUs</h2><table class=\"gpus\"><tr><th>gpu</th><th>name</th><th>vendor</th>"
        "<th>state</th><th>utilisation</th><th>memory</th><th>power</th>"
        f"<th>temperature</th><th>health</th></tr>{rows}</table>"
        f"<p class=\"none\">Charts: the last {minutes:g} minutes, one sample per "
        f"{history.interval:g} s. <span id=\"live\"></span></p>{cards}"
        f"{health.table_html(snapshot.health)}"
        "<h2>Backends</h2><table><tr><th>backend</th><th>state</th><th>reason</th>"
        f"<th>devices</th></tr>{backends}</table></body></html>")
