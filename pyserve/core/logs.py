"""Triton's log settings of the core, changeable at run time, and its per-request logs.

The log output itself (one stderr handler on the root logger, its format: ``default``, ``ISO8601`` or ``json``) is
installed by the core's entry point with ``pyserve.telemetry.logging_setup.configure_logging``, as a process
worker's is. ``LogSettings`` is Triton's log settings document over it (``GET/POST /v2/logging``, gRPC
``LogSettings``): ``log_info``, ``log_warning``, ``log_error`` switch those levels on and off independently,
``log_verbose_level`` > 0 turns on debug messages, including one line per finished request (``pyserve.requests``).
At the default level (``ServeConfig.log_level`` WARNING) nothing is logged per request. Changes apply to the core
process at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyserve.errors import InvalidInputError
from pyserve.telemetry.logging_setup import LOG_FORMATS, LogLevels, installed_log_output, make_formatter

if TYPE_CHECKING:
    from pyserve.core.inference import InferenceRequest, InferenceResponse
    from pyserve.errors import InferenceError

request_logger = logging.getLogger("pyserve.requests")


class LogSettings:
    """Triton's log settings over level switches and, when pyserve installed its log output, that handler.

    Without a handler (the process's logging is the user's) the settings answer but change no logging.
    """

    def __init__(self, levels: LogLevels, log_format: str = "default", handler: logging.Handler | None = None):
        self.levels = levels
        self.log_format = log_format
        self.handler = handler
        self.log_requests = False
        self._apply()

    def to_json(self) -> dict[str, Any]:
        """The settings document."""
        levels = self.levels
        return {
            "log_file": "",
            "log_info": levels.log_info,
            "log_warning": levels.log_warning,
            "log_error": levels.log_error,
            "log_verbose_level": levels.log_verbose_level,
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
        levels = self.levels
        levels.log_info, levels.log_warning, levels.log_error = new["log_info"], new["log_warning"], new["log_error"]
        levels.log_verbose_level = new["log_verbose_level"]
        if new["log_format"] != self.log_format:
            self.log_format = new["log_format"]
            if self.handler is not None:
                self.handler.setFormatter(make_formatter(self.log_format))
        self._apply()
        return self.to_json()

    def _apply(self) -> None:
        if self.handler is not None:
            logging.getLogger().setLevel(self.levels.root_level())
        self.log_requests = request_logger.isEnabledFor(logging.DEBUG) if self.handler is not None else False

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


_settings: LogSettings | None = None


def log_settings(level: str = "WARNING", log_format: str = "default") -> LogSettings:
    """The settings over the log output configure_logging installed, else settings that leave logging alone."""
    global _settings
    output = installed_log_output()
    if output is None:
        return LogSettings(LogLevels(level), log_format)
    if _settings is None or _settings.handler is not output.handler:
        _settings = LogSettings(output.levels, log_format, output.handler)
    return _settings
