"""structlog set-up: key-value events, JSON when not on a terminal, for every logger.

Every module logs through ``structlog.get_logger(__name__)`` with bound context
(``backend=``, ``gpu=``). Log lines are for state changes only (backend up/down,
GPU lost/back), never one per collection cycle.

Lines from the standard library's loggers (uvicorn, asyncio) go through the same
renderer, so ``--log.format json`` stays JSON, and a line that repeats (any client
can make uvicorn warn about a malformed request or an ``Upgrade`` header) is written
at most once a minute with the count of those held back (``Every``).
"""

from __future__ import annotations

import logging
import sys
import time

import structlog

from exporter.core.config import LogFormat, LogLevel

_LEVELS: dict[str, int] = {LogLevel.DEBUG: logging.DEBUG, LogLevel.INFO: logging.INFO,
                           LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR}
REPEAT_INTERVAL = 60.0  # seconds between two lines of the same kind
SUPPRESSED = "suppressed_since_last"  # the key that carries the count held back


class Every:
    """At most one line per key per ``interval`` seconds, counting the ones held back.

    ``allow(key)`` returns None to hold a line back, else how many were held back
    since the last one written (0 for the first). The keys are few (one per log
    call site or error kind), so the table stays small.
    """

    def __init__(self, interval: float = REPEAT_INTERVAL) -> None:
        self.interval = interval
        self._last: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def allow(self, key: object) -> int | None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


class RepeatFilter(logging.Filter):
    """A stdlib log filter: one line per logger and message template per interval."""

    def __init__(self, interval: float = REPEAT_INTERVAL) -> None:
        super().__init__()
        self.every = Every(interval)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self.every.allow((record.name, record.levelno, str(record.msg)))
        if held is None:
            return False
        if held:
            setattr(record, SUPPRESSED, held)
        return True


_level = [logging.INFO]  # the level now: set_level() changes it on a reload


def _by_level(logger: object, method: str, event: structlog.types.EventDict
              ) -> structlog.types.EventDict:
    """Drops what is below the current level. A processor, not the bound logger's own
    filter: loggers are cached on first use, and a reload must reach them too."""
    if _LEVELS.get(method, logging.ERROR) < _level[0]:
        raise structlog.DropEvent
    return event


def debug_enabled() -> bool:
    """Whether debug lines are written: callers skip building them otherwise."""
    return _level[0] <= logging.DEBUG


def set_level(level: str) -> None:
    """``--log.level`` changed live (SIGHUP): structlog's and the standard library's."""
    _level[0] = _LEVELS[level]
    logging.getLogger().setLevel(max(_LEVELS[level], logging.WARNING))


def configure(level: str = LogLevel.INFO, fmt: str = LogFormat.AUTO) -> None:
    """``fmt``: ``json``, ``console``, or ``auto`` (console on a terminal, else JSON)."""
    if fmt == LogFormat.AUTO:
        fmt = LogFormat.CONSOLE if sys.stderr.isatty() else LogFormat.JSON
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == LogFormat.JSON
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[_by_level, *shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # uvicorn, asyncio and other stdlib loggers: warnings and up, through the same
    # renderer (the logger's name as ``logger``, a held-back count when there is one).
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name,
                           structlog.stdlib.ExtraAdder(allow=[SUPPRESSED])],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer]))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers = [handler]
    set_level(level)
