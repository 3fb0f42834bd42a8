"""Secrets (a password, a bearer token) as a type that never prints itself.

``str``, ``repr`` and every ``format`` of a ``Secret`` give ``<secret>``: a secret that
reaches an error message, a log line, a dataclass's ``repr`` or the screen shows that
word, not its value. ``reveal()`` is the one way to the value, called where it goes on
the wire. ``header_value`` is what every HTTP header built from a secret goes through:
a CR, LF or other control character would split the header (http.client refuses it with
a ValueError that quotes the value), so it is refused here with an error that does not.
"""

from __future__ import annotations

from typing import Any

REDACTED = "<secret>"


class SecretError(ValueError):
    """A secret that cannot be used; the message never holds the secret."""


class Secret:
    """A string that prints as ``<secret>``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __str__(self) -> str:
        return REDACTED

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __format__(self, spec: str) -> str:
        return format(REDACTED, spec)

    def __copy__(self) -> Secret:
        return self  # immutable

    def __deepcopy__(self, memo: Any) -> Secret:
        return self

    def __reduce__(self) -> Any:  # a pickled secret would be readable: refused
        raise TypeError("a Secret is not pickled")


def control_character(text: str) -> str | None:
    """The name of the first control character in ``text`` (CR, LF, ...), else None."""
    for c in text:
        if c == "\r":
            return "a carriage return (CR)"
        if c == "\n":
            return "a line feed (LF)"
        if ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F:
            return f"a control character (U+{ord(c):04X})"
    return None


def header_value(what: str, *parts: str | Secret) -> str:
    """The parts joined with spaces, for an HTTP header; SecretError (naming ``what`` and
    the character, never the value) when any part holds a control character."""
    out = []
    for part in parts:
        value = part.reveal() if isinstance(part, Secret) else part
        bad = control_character(value)
        if bad is not None:
            raise SecretError(f"{what} contains {bad}: not allowed in an HTTP header")
        out.append(value)
    return " ".join(out)
