"""OpenTelemetry tracing (the optional ``tracing`` extra) with Triton's trace settings: the core's side.

A traced request gets an ``InferRequest`` span (its parent is the client's W3C ``traceparent`` when one came with
the request), a ``queue`` child span from submit until its batch is dispatched, and a ``compute`` child span made
by the worker that runs it: the core puts the request span's context in the batch header and the worker, thread or
process, starts its span under it (``pyserve.telemetry.spans``, which also builds the exporters), so one trace
crosses the processes. While the infer function runs, that span is the current one, so spans the function starts
nest under it.

Which requests are traced follows Triton's settings, server-wide or per model (``/v2/trace/setting``,
``/v2/models/{m}/trace/setting``, gRPC ``TraceSetting``): ``trace_level`` OFF or TIMESTAMPS, ``trace_rate`` (one
request in N), ``trace_count`` (how many more traces; -1 for no limit). Without OpenTelemetry installed the
settings still answer, with tracing OFF, and turning it on is refused with a message naming the extra.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyserve.errors import InferenceError, InvalidInputError, UnsupportedError
from pyserve.telemetry.spans import make_tracer_provider, parent_context, traceparent_of
from pyserve.transport.protocol import TraceContext

if TYPE_CHECKING:
    from pyserve.config import ServeConfig
    from pyserve.core.inference import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

TRACE_LEVELS = ("OFF", "TIMESTAMPS")
SETTING_NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
_INSTALL_HINT = "tracing needs OpenTelemetry: pip install 'pyserve[tracing]'"


def opentelemetry_available() -> bool:
    """Whether the OpenTelemetry SDK can be imported."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


# settings ------------------------------------------------------------------------------------------------------


class TraceSettings:
    """Triton's trace settings: server-wide values and per-model overrides."""

    def __init__(self, config: ServeConfig, available: bool) -> None:
        self.available = available
        self.defaults: dict[str, Any] = {
            "trace_level": [config.trace_level if available else "OFF"],
            "trace_rate": config.trace_rate,
            "trace_count": -1,
            "log_frequency": 0,
            "trace_file": config.trace_file,
            "trace_mode": "opentelemetry",
        }
        self.server = dict(self.defaults)
        self.models: dict[str, dict[str, Any]] = {}

    def effective(self, model: str | None) -> dict[str, Any]:
        """The settings that apply to a model (its overrides over the server's), or the server's."""
        values = dict(self.server)
        if model is not None:
            values.update(self.models.get(model, {}))
        return values

    def to_json(self, model: str | None) -> dict[str, Any]:
        """The settings document: trace_level a list, the others strings, as Triton answers."""
        values = self.effective(model)
        return {key: list(value) if key == "trace_level" else str(value) for key, value in values.items()}

    def update(self, model: str | None, changes: Mapping[str, Any]) -> None:
        """Apply a settings request; a None value clears a model's override (or resets a server setting)."""
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in SETTING_NAMES:
                raise InvalidInputError(f"unknown trace setting '{key}'; expected one of {', '.join(SETTING_NAMES)}")
            parsed[key] = None if value is None else self._parse(key, value)
        target = self.server if model is None else self.models.setdefault(model, {})
        for key, value in parsed.items():
            if value is None:
                if model is None:
                    target[key] = self.defaults[key]
                else:
                    target.pop(key, None)
            else:
                target[key] = value
        if model is not None and not target:
            del self.models[model]

    def _parse(self, key: str, value: Any) -> Any:
        if key == "trace_level":
            levels = [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
            if not levels or not all(isinstance(level, str) for level in levels):
                raise InvalidInputError(f"trace_level must be a list of levels, got {value!r}")
            levels = [level.upper() for level in levels]
            for level in levels:
                if level not in (*TRACE_LEVELS, "TENSORS"):
                    raise InvalidInputError(f"unknown trace_level '{level}'; expected OFF or TIMESTAMPS")
                if level == "TENSORS":
                    raise UnsupportedError("trace_level TENSORS is not supported: tensors are not traced")
            if "OFF" in levels and len(levels) > 1:
                raise InvalidInputError(f"trace_level OFF cannot be combined with other levels, got {levels}")
            if levels != ["OFF"] and not self.available:
                raise UnsupportedError(_INSTALL_HINT)
            return levels
        if key in ("trace_file", "trace_mode"):
            current = self.server[key]
            if str(value) != str(current):
                how = "ServeConfig.trace_file" if key == "trace_file" else "OTEL_TRACES_EXPORTER"
                raise InvalidInputError(f"{key} cannot be changed at run time (it is {current!r}); set {how}")
            return current
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise InvalidInputError(f"{key} must be an integer, got {value!r}") from None
        lowest = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}[key]
        if number < lowest:
            raise InvalidInputError(f"{key} must be >= {lowest}, got {number}")
        return number


# the core's side ---------------------------------------------------------------------------------------------


class _RequestTrace:
    """The open spans of one traced request."""

    __slots__ = ("queue", "request")

    def __init__(self, request: Any, queue: Any) -> None:
        self.request = request
        self.queue = queue


class Tracing:
    """Decides which requests are traced and keeps their spans (the core's side)."""

    def __init__(self, config: ServeConfig) -> None:
        self.settings = TraceSettings(config, opentelemetry_available())
        if config.trace_level != "OFF" and not self.settings.available:
            logger.warning("trace_level %s asked for, but %s", config.trace_level, _INSTALL_HINT)
        self.trace_file = config.trace_file
        self.active = False  # any scope has tracing on: the only thing the hot path looks at
        self._provider: Any = None
        self._tracer: Any = None
        self._counters: dict[str | None, itertools.count[int]] = {}
        self._refresh()

    def to_json(self, model: str | None = None) -> dict[str, Any]:
        """The settings of a model (or the server)."""
        return self.settings.to_json(model)

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change settings; returns the settings that now apply."""
        self.settings.update(model, changes)
        self._counters.clear()
        self._refresh()
        return self.settings.to_json(model)

    def close(self) -> None:
        """Flush and stop the exporters."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None

    def _refresh(self) -> None:
        scopes = [self.settings.server, *self.settings.models.values()]
        self.active = any(scope.get("trace_level", ["OFF"]) != ["OFF"] for scope in scopes)
        if self.active and self._provider is None:
            self._provider = make_tracer_provider(self.trace_file)
            self._tracer = self._provider.get_tracer("pyserve")

    def _sampled(self, model: str, traceparent: str) -> bool:
        overrides = self.settings.models.get(model)
        scope = model if overrides is not None else None
        settings = self.settings.effective(scope)
        if settings["trace_level"] == ["OFF"] or settings["trace_count"] == 0:
            return False
        # A parent that is sampled (a client's, or an ensemble request's own span) is followed, like OpenTelemetry's
        # parent-based sampling; other requests are traced one in trace_rate.
        if not _parent_sampled(traceparent):
            counter = self._counters.get(scope)
            if counter is None:
                counter = self._counters[scope] = itertools.count()
            if next(counter) % settings["trace_rate"]:
                return False
        if settings["trace_count"] > 0:
            # Count down where the limit was set: the model's own trace_count, else the server's.
            owner = overrides if overrides is not None and "trace_count" in overrides else self.settings.server
            owner["trace_count"] = settings["trace_count"] - 1
        return True

    def begin(self, request: InferenceRequest) -> None:
        """Maybe trace a submitted request: start its spans and end them with its final response."""
        entry = request.model
        if not self._sampled(entry.name, request.traceparent) or self._tracer is None:
            return
        span = self._tracer.start_span(
            "InferRequest",
            context=parent_context(request.traceparent),
            kind=_server_kind(),
            attributes={
                "triton.model_name": entry.name,
                "triton.model_version": str(entry.version),
                "pyserve.request_id": request.id,
            },
        )
        from opentelemetry import trace

        # An ensemble has no queue of its own (no scheduler): its steps' spans are its children.
        queue = (
            self._tracer.start_span("queue", context=trace.set_span_in_context(span))
            if entry.scheduler is not None
            else None
        )
        request.trace = _RequestTrace(span, queue)
        on_response = request.on_response

        def end_then_send(infer: InferenceRequest, response: InferenceResponse) -> None:
            if response.final:
                self.end(infer, response.error)
            on_response(infer, response)

        request.on_response = end_then_send

    def end(self, request: InferenceRequest, error: InferenceError | None) -> None:
        """End a traced request's spans (its final response, or its refusal)."""
        state = request.trace
        if state is None:
            return
        request.trace = None
        if state.queue is not None:
            state.queue.end()
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            state.request.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        state.request.end()

    def on_dispatch(self, batch: list[InferenceRequest]) -> TraceContext | None:
        """End the queue spans of a batch's traced requests; the context to hand the worker, None if none is
        traced."""
        contexts: list[str | None] = []
        traced = False
        for request in batch:
            state = request.trace
            if state is None:
                contexts.append(None)
                continue
            traced = True
            if state.queue is not None:
                state.queue.end()
                state.queue = None
            contexts.append(traceparent_of(state.request))
        return TraceContext(self.trace_file, contexts) if traced else None


def child_traceparent(request: InferenceRequest) -> str:
    """The traceparent to give a request made on behalf of ``request`` (an ensemble step): its own span when it is
    traced, so the child's spans join its trace, else whatever parent it had."""
    state = request.trace
    return traceparent_of(state.request) if state is not None else request.traceparent


def _parent_sampled(traceparent: str) -> bool:
    # version-traceid-parentid-flags; bit 0 of the flags is "sampled".
    parts = traceparent.split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[3]) < 2:
        return False
    try:
        return bool(int(parts[3][:2], 16) & 1)
    except ValueError:
        return False


def _server_kind() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.SERVER
