"""The log output of a pyserve process (the core's and a process worker's): one stderr handler, its format, its levels.

``configure_logging`` installs one stderr handler on the root logger (the core's and a process worker's entry points
call it; nothing is configured on import). Its format is ``default`` (``time level logger: message``), ``ISO8601``
(the same with ISO 8601 UTC times) or ``json`` (one object per line: ``time``, ``level``, ``logger``, ``message``,
``pid`` and, on request logs, ``request_id``, ``model`` and ``version``). Which records pass is up to the handler's
``LogLevels``: Triton's independent switches, which the core changes at run time (``pyserve.core.logs``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

LOG_FORMATS = ("default", "ISO8601", "json")
_DEFAULT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes of a LogRecord that are not "extra" fields.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the record's extra fields (request_id, model...)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class _IsoFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _iso_time(record.created)


def _iso_time(created: float) -> str:
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{whole}.{int(created % 1 * 1_000_000):06d}Z"


def make_formatter(log_format: str) -> logging.Formatter:
    """The formatter of a log format name."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "ISO8601":
        return _IsoFormatter(_DEFAULT_FORMAT)
    return logging.Formatter(_DEFAULT_FORMAT)


class LogLevels(logging.Filter):
    """Triton's log switches, as a handler's filter: errors, warnings and info each on or off, debug messages while
    the verbose level is above 0. ``level`` (a logging level name) switches on that level and the ones above it."""

    def __init__(self, level: str = "WARNING") -> None:
        super().__init__()
        rank = logging.getLevelName(level.upper())
        rank = rank if isinstance(rank, int) else logging.WARNING
        self.log_error = rank <= logging.ERROR
        self.log_warning = rank <= logging.WARNING
        self.log_info = rank <= logging.INFO
        self.log_verbose_level = 1 if rank <= logging.DEBUG else 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether the record's level is switched on."""
        if record.levelno >= logging.ERROR:
            return self.log_error
        if record.levelno >= logging.WARNING:
            return self.log_warning
        if record.levelno >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0

    def root_level(self) -> int:
        """The root logger's level: the lowest switched on, so disabled debug calls stay cheap."""
        if self.log_verbose_level:
            return logging.DEBUG
        if self.log_info:
            return logging.INFO
        if self.log_warning:
            return logging.WARNING
        if self.log_error:
            return logging.ERROR
        return logging.CRITICAL + 1


@dataclass(frozen=True, slots=True)
class LogOutput:
    """What ``configure_logging`` installed: the stderr handler and its level switches (the format is the caller's
    ``log_format``; ``pyserve.core.logs.LogSettings`` keeps the current one)."""

    handler: logging.Handler
    levels: LogLevels


_installed: LogOutput | None = None


def configure_logging(level: str = "WARNING", log_format: str = "default") -> LogOutput:
    """Install pyserve's stderr handler on the root logger (process entry points only); returns what it installed."""
    global _installed
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(log_format))
    levels = LogLevels(level)
    handler.addFilter(levels)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(levels.root_level())
    _installed = LogOutput(handler, levels)
    # Process workers the core spawns read these (ServeConfig's own environment names).
    os.environ["PYSERVE_LOG_LEVEL"] = level
    os.environ["PYSERVE_LOG_FORMAT"] = log_format
    return _installed


def installed_log_output() -> LogOutput | None:
    """What ``configure_logging`` installed in this process, if it was called."""
    return _installed
