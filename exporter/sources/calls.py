"""The one guarded vendor-library call: where a library's error becomes a value, a skip,
a lost device or a failed backend.

NVML, amdsmi and Level Zero each answer a failed call with a code of their own; each
has a small classifier (``backends/nvidia/calls.py``, ``backends/amd/amdsmi_calls.py``,
``backends/intel/ze_calls.py``) that sorts its codes into a ``Verdict``. What a verdict
does is decided here, once, for all three:

- ``SKIP`` (not supported, no such function): the call answers "not exposed" and that
  (function, arguments) pair is never asked again on this handle, so a card that lacks
  a field costs nothing and logs nothing per cycle;
- ``PERMISSION``: the same, and counted once as ``permission`` with one log line
  (permissions do not change while the daemon runs);
- ``LOST``: raises ``DeviceLost``, so the device stops being read this cycle (up=0);
- ``DEAD`` (library uninitialised, driver unloaded): raises ``BackendFailed``, so the
  collector closes the backend and opens it again with back-off;
- ``ERROR`` (anything else): "not exposed" this cycle and one ``<library>_error`` count.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog

from exporter.core.labels import ErrorReason
from exporter.sources.base import BackendFailed

log = structlog.get_logger(__name__)


class DeviceLost(Exception):
    """This GPU (or partition) fell off the bus or needs a reset: stop reading it this cycle."""


class Verdict(enum.Enum):
    SKIP = "skip"
    PERMISSION = "permission"
    LOST = "lost"
    DEAD = "dead"
    ERROR = "error"


CallKey = tuple[str, Any]  # (function name, what else identifies the call: args, handle)


class Guard:
    """The outcome handling and the memory of what one handle lacks, shared by the
    per-library callers.

    ``library`` names the error reason (``nvml`` -> ``nvml_error``) and the log event
    (``nvml_permission_denied``); ``label`` is how a message names the library;
    ``where`` goes into the permission log line (which GPU).
    """

    def __init__(self, library: str, label: str, classify: Callable[[int | None], Verdict],
                 **where: Any) -> None:
        self.library = library
        self.error = ErrorReason(f"{library}_error")  # a library of no ErrorReason: at start
        self.label = label
        self.classify = classify
        self.where = where
        self.unsupported: set[CallKey] = set()

    def resolve(self, key: CallKey, func: Any) -> Any:
        """The function to call, or None when the call is known absent or the library has
        no such function (an older binding; remembered): the answer is "not exposed"."""
        if key in self.unsupported:
            return None
        if func is None:
            self.unsupported.add(key)
        return func

    def settle(self, errors: Counter[ErrorReason], key: CallKey, code: int | None,
               detail: object) -> None:
        """Act on one failed call's code (see the module docstring); returns None or raises."""
        verdict = self.classify(code)
        if verdict is Verdict.SKIP:
            self.unsupported.add(key)
        elif verdict is Verdict.PERMISSION:
            self.unsupported.add(key)
            errors[ErrorReason.PERMISSION] += 1
            log.info(f"{self.library}_permission_denied", call=key[0], **self.where)
        elif verdict is Verdict.LOST:
            raise DeviceLost(f"{key[0]}: {detail}")
        elif verdict is Verdict.DEAD:
            raise BackendFailed(f"{self.label} went bad during {key[0]}: {detail}")
        else:
            errors[self.error] += 1

    def check(self, code: int) -> None:
        """Raise for a per-value return code (NVML field values, GPM) that says the GPU or
        the library is gone; other codes are the caller's to judge."""
        verdict = self.classify(code)
        if verdict is Verdict.LOST:
            raise DeviceLost(f"return code {code}")
        if verdict is Verdict.DEAD:
            raise BackendFailed(f"{self.label} went bad: return code {code}")
