"""structlog, configured once per process: JSON lines for services and pipes, console
rendering on a terminal. Request text is never logged unless a caller opts in.

The library's logs go to stderr: structlog left unconfigured prints to stdout, which
carries answers only. An application that configures structlog itself keeps its own."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """fmt: "json", "console", or "auto" (console when `stream` is a terminal)."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    renderer = (structlog.dev.ConsoleRenderer() if fmt == "console"
                else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def default_to_stderr() -> None:
    """Configure stderr logging (info) unless the application configured structlog."""
    if not structlog.is_configured():
        configure(stream=sys.stderr)
