"""Logging of the core (and process workers): Triton's log settings, changeable at run time, and JSON lines.

``configure_logging`` installs one stderr handler on the root logger of a pyserve process (the core's and a
process worker's entry points call it; nothing is configured on import). Its format is ``default``
(``time level logger: message``), ``ISO8601`` (the same with ISO 8601 UTC times) or ``json`` (one object per line:
``time``, ``level``, ``logger``, ``message``, ``pid`` and, on request logs, ``request_id``, ``model`` and
``version``).

``LogSettings`` is Triton's log settings document (``GET/POST /v2/logging``, gRPC ``LogSettings``): ``log_info``,
``log_warning``, ``log_error`` switch those levels on and off independently, ``log_verbose_level`` > 0 turns on
debug messages, including one line per finished request (``pyserve.requests``). At the default level
(``ServeConfig.log_level`` WARNING) nothing is logged per request. Changes apply to the core process at once.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyserve.errors import InvalidInputError

if TYPE_CHECKING:
    from pyserve.core.inference import InferenceRequest, InferenceResponse
    from pyserve.errors import InferenceError

LOG_FORMATS = ("default", "ISO8601", "json")
_DEFAULT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes of a LogRecord that are not "extra" fields.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
request_logger = logging.getLogger("pyserve.requests")


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


class LogSettings:
    """Triton's log settings over the root logger and the handler pyserve installed (if any)."""

    def __init__(self, level: str = "WARNING", log_format: str = "default", handler: logging.Handler | None = None):
        self.handler = handler
        self.log_format = log_format
        rank = logging.getLevelName(level.upper())
        rank = rank if isinstance(rank, int) else logging.WARNING
        self.log_error = rank <= logging.ERROR
        self.log_warning = rank <= logging.WARNING
        self.log_info = rank <= logging.INFO
        self.log_verbose_level = 1 if rank <= logging.DEBUG else 0
        self.log_requests = False
        if handler is not None:
            handler.addFilter(self._allows)
        self._apply()

    def to_json(self) -> dict[str, Any]:
        """The settings document."""
        return {
            "log_file": "",
            "log_info": self.log_info,
            "log_warning": self.log_warning,
            "log_error": self.log_error,
            "log_verbose_level": self.log_verbose_level,
            "log_format": self.log_format,
        }

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a settings request (all or nothing); returns the settings now in force."""
        new = self.to_json()
        for key, value in changes.items():
            if key not in new:
                raise InvalidInputError(f"unknown log setting '{key}'; expected one of {', '.join(new)}")
            if key in ("log_info", "log_warning", "log_error"):
                if not isinstance(value, bool):
                    raise InvalidInputError(f"{key} must be a boolean, got {value!r}")
            elif key == "log_verbose_level":
                if type(value) is not int or value < 0:
                    raise InvalidInputError(f"log_verbose_level must be an integer >= 0, got {value!r}")
            elif key == "log_format":
                if value not in LOG_FORMATS:
                    raise InvalidInputError(f"log_format must be one of {', '.join(LOG_FORMATS)}, got {value!r}")
            elif value != new[key]:
                raise InvalidInputError("log_file cannot be changed: pyserve logs to standard error")
            new[key] = value
        self.log_info, self.log_warning, self.log_error = new["log_info"], new["log_warning"], new["log_error"]
        self.log_verbose_level = new["log_verbose_level"]
        if new["log_format"] != self.log_format:
            self.log_format = new["log_format"]
            if self.handler is not None:
                self.handler.setFormatter(make_formatter(self.log_format))
        self._apply()
        return self.to_json()

    def _apply(self) -> None:
        # The root level is the lowest level switched on, so disabled debug calls stay cheap.
        if self.log_verbose_level:
            level = logging.DEBUG
        elif self.log_info:
            level = logging.INFO
        elif self.log_warning:
            level = logging.WARNING
        elif self.log_error:
            level = logging.ERROR
        else:
            level = logging.CRITICAL + 1
        if self.handler is not None:
            logging.getLogger().setLevel(level)
        self.log_requests = request_logger.isEnabledFor(logging.DEBUG) if self.handler is not None else False

    def _allows(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return self.log_error
        if record.levelno >= logging.WARNING:
            return self.log_warning
        if record.levelno >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0

    # per-request logs (verbose only) ---------------------------------------------------------------------------

    def watch(self, request: InferenceRequest) -> None:
        """Log the request when its final response goes out."""
        started = time.monotonic_ns()
        on_response = request.on_response

        def log_then_send(infer: InferenceRequest, response: InferenceResponse) -> None:
            if response.final:
                self.finished(infer, response.error, started)
            on_response(infer, response)

        request.on_response = log_then_send

    def finished(self, request: InferenceRequest, error: InferenceError | None, started_ns: int) -> None:
        """One line for a finished (or refused) request."""
        entry = request.model
        outcome = "OK" if error is None else f"{type(error).__name__}: {str(error).splitlines()[0]}"
        request_logger.debug(
            "request %r to model '%s' version %d: %s in %.3f ms",
            request.id,
            entry.name,
            entry.version,
            outcome,
            (time.monotonic_ns() - started_ns) / 1e6,
            extra={"request_id": request.id, "model": entry.name, "version": entry.version},
        )


_configured: LogSettings | None = None


def configure_logging(level: str = "WARNING", log_format: str = "default") -> LogSettings:
    """Install pyserve's stderr handler on the root logger (process entry points only) and return its settings."""
    global _configured
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    _configured = LogSettings(level, log_format, handler)
    # Process workers the core spawns read these (ServeConfig's own environment names).
    os.environ["PYSERVE_LOG_LEVEL"] = level
    os.environ["PYSERVE_LOG_FORMAT"] = log_format
    return _configured


def log_settings(level: str = "WARNING", log_format: str = "default") -> LogSettings:
    """The settings configure_logging installed, else settings that leave the process's logging alone."""
    return _configured if _configured is not None else LogSettings(level, log_format)
