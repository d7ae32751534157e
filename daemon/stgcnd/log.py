"""Structured logging for every part of stgcnd.

One JSON object per line (ISO-8601 UTC timestamps, a stable `event` name) when the stream is
not a terminal, e.g. under systemd where journald collects stdout; a readable console format on
a terminal. Request-scoped fields (camera, model, request id) are bound with
`structlog.contextvars.bind_contextvars` and appear on every line logged inside that scope.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any, Literal, TextIO

import structlog

LogFormat = Literal["auto", "json", "console"]

# What configure_logging last set up, so that a child process (a cancellable engine build)
# logs the same way to the same stream, and fatal errors know whether the log is JSON.
_current: dict[str, Any] = {"level": "info", "fmt": "console", "stream": "stderr"}

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}


def parse_level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    try:
        return _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(_LEVELS)}") from None


def configure_logging(level: str | int = "info", fmt: LogFormat = "auto",
                      stream: TextIO | str | None = None) -> None:
    """Configure structlog once per process. Safe to call again (e.g. on reload).

    `stream`: a file, or "stdout"/"stderr" (the process's own, e.g. in a child process)."""
    if isinstance(stream, str):
        stream = sys.stdout if stream == "stdout" else sys.stderr
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if getattr(stream, "isatty", lambda: False)() else "json"
    _current.update(level=level, fmt=fmt,
                    stream="stdout" if stream is sys.stdout or stream is sys.__stdout__
                    else "stderr")
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    if fmt == "json":
        renderer: Any = structlog.processors.JSONRenderer(sort_keys=False)
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(processors=[*shared, renderer],
                        wrapper_class=structlog.make_filtering_bound_logger(parse_level(level)),
                        logger_factory=structlog.WriteLoggerFactory(file=stream),
                        cache_logger_on_first_use=False)
    warnings.showwarning = _log_warning


def logging_config() -> dict[str, Any]:
    """Arguments for configure_logging() that reproduce this process's logging (picklable)."""
    return dict(_current)


def debug_enabled() -> bool:
    """Whether debug events are logged: hot paths test this once instead of building an event
    that the level filter then drops (a structlog proxy call costs microseconds even then)."""
    return parse_level(_current["level"]) <= logging.DEBUG


def log_is_json() -> bool:
    return _current["fmt"] == "json"


def _log_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    # Python warnings (ours or a library's) become log events instead of raw stderr lines.
    structlog.get_logger().warning("python_warning", category=category.__name__,
                                   message=str(message), location=f"{filename}:{lineno}")


def get_logger(name: str | None = None, **initial: Any) -> Any:
    """A structlog logger; `name` becomes the `module` field."""
    if name:
        initial = {"module": name, **initial}
    # A lazy proxy: modules create loggers at import time, before configure_logging() runs.
    return structlog.get_logger(**initial)
