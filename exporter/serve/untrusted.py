"""Reading what the other end sends, which may be anything: JSON values and a request's
query parameters. Each reader returns the value it asks for, or its "no data" (None, an
empty string or mapping), and never raises; every string comes back printable
(units.printable) and bounded. exporter.serve.view decodes the live view with these, the
server its query parameters."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from exporter.core.labels import Vocabulary
from exporter.core.units import printable

MAX_TEXT = 512  # characters of any one string read back (a health reason is the longest)
MAX_PARAM = 64  # characters of a numeric query parameter: a number needs far fewer
_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits: "²" is a digit to str.isdigit, not to int

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


def param_count(raw: str | None, default: int, high: int) -> int | None:
    """A query parameter that is a whole number from 0 to ``high`` in ASCII digits;
    ``default`` when absent; None (the client's mistake: a 400) otherwise."""
    if raw is None:
        return default
    if not _COUNT.fullmatch(raw):
        return None
    value = int(raw)
    return value if value <= high else None


def param_number(raw: str | None, default: float) -> float | None:
    """A query parameter that is a finite number (``since``: a unix time); ``default``
    when absent; None otherwise (NaN, infinite, too long, not a number)."""
    if raw is None:
        return default
    if len(raw) > MAX_PARAM:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
