"""The live view's words, defined once: the states (``State``), the heat of a
temperature (``Heat``), the OTLP push's state (``OtlpState``) and the health verdict
(exporter.core.labels' ``HealthStatus``), with the marks the page and ``gpu-exporter
top`` write them with, and the one way both write a size in bytes."""

from __future__ import annotations

from exporter.core.labels import HealthStatus, Vocabulary

NO_DATA = "no data"


class State(Vocabulary):
    """A GPU's or a backend's state: ``up``; ``down`` (the exporter saw it go, or the
    backend failed); ``stale`` (its backend has not completed a collection within
    ``--stale-after``: its values are not known to be current)."""

    UP = "up"
    DOWN = "down"
    STALE = "stale"


class Heat(Vocabulary):
    """The hottest sensor against its critical limit: below 60 %, 85 %, 100 %, at or
    above it (with no known limit: below 50 °C, 75 °C, above)."""

    COOL = "cool"
    WARM = "warm"
    HOT = "hot"
    CRITICAL = "critical"


class OtlpState(Vocabulary):
    OK = "ok"
    FAILING = "failing"


# What a state or verdict reads as, with a symbol, so that it is readable without colour.
MARKS: dict[str, str] = {
    State.UP: "● up", State.DOWN: "✖ down", State.STALE: "◌ stale",
    HealthStatus.HEALTHY: "✔ healthy", HealthStatus.DEGRADED: "▲ degraded",
    HealthStatus.FAILED: "✖ failed", OtlpState.OK: "● ok", OtlpState.FAILING: "✖ failing"}


def mark(word: str | None) -> str:
    """A state or verdict as the page and ``top`` write it; no word: "no data"."""
    return MARKS.get(word or "", word or NO_DATA)


def size(n: float | None) -> str:
    """Bytes in the unit that reads best: ``2.0 MiB``, ``512 MiB``, ``3.00 GiB`` (never
    ``0.00 GiB`` for two megabytes); None: "no data". static/app.js's ``size``: the same."""
    if n is None:
        return NO_DATA
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


# -- the view ---------------------------------------------------------------------------------
