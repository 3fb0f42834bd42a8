"""structlog set-up: key-value events, JSON when not on a terminal.

Every module logs through ``structlog.get_logger(__name__)`` with bound context
(``backend=``, ``gpu=``). Log lines are for state changes only (backend up/down,
GPU lost/back), never one per collection cycle.
"""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def configure(level: str = "info", fmt: str = "auto") -> None:
    """``fmt``: ``json``, ``console``, or ``auto`` (console on a terminal, else JSON)."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # uvicorn and other stdlib loggers: only warnings and up, to stderr.
    logging.basicConfig(level=max(_LEVELS[level], logging.WARNING), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
