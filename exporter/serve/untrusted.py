"""Reading JSON from the other end, which may be anything: each reader returns the value
it asks for, or its "no data" (None, an empty string or mapping), and never raises;
every string comes back printable (units.printable) and bounded. exporter.serve.view
decodes the live view with these."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from exporter.core.labels import Vocabulary
from exporter.core.units import printable

MAX_TEXT = 512  # characters of any one string read back (a health reason is the longest)

E = TypeVar("E", bound=Vocabulary)


def text(value: Any, limit: int = MAX_TEXT) -> str:
    """A string from the other end: printable characters only, at most ``limit``."""
    return printable(value, limit) if isinstance(value, str) else ""


def number(value: Any) -> float | None:
    """A finite number, else None (a bool is not a number)."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int:
        return float(value)
    return None


def count(value: Any) -> int | None:
    """A whole number >= 0, else None."""
    return value if type(value) is int and value >= 0 else None


def word(kind: type[E], value: Any) -> E | None:
    """A member of the closed vocabulary ``kind``, else None."""
    try:
        return kind(value) if isinstance(value, str) else None
    except ValueError:
        return None


def obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def numbers(value: Any) -> dict[str, float]:
    out = {}
    for k, v in obj(value).items():
        n = number(v)
        if n is not None and isinstance(k, str):
            out[text(k, 64)] = n
    return out


def name_of(value: Any) -> str | None:
    return None if value is None else str(value)




T = TypeVar("T")


def each(read: Callable[[Any], T | None], value: Any, limit: int) -> tuple[T, ...]:
    return tuple(x for x in (read(v) for v in items(value)[:limit]) if x is not None)
