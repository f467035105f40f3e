"""OpenTelemetry plumbing the core and the workers share, and the spans a worker makes (the ``tracing`` extra).

``make_tracer_provider`` builds pyserve's own TracerProvider: spans go to the exporters named by
``OTEL_TRACES_EXPORTER`` (``otlp`` by default; ``console``, ``none``, or any installed exporter entry point), each
configured by its own ``OTEL_EXPORTER_*`` variables, and, with ``ServeConfig.trace_file``, to that file as JSON
lines (one span per line, core and workers appending alike). With a trace file and no ``OTEL_TRACES_EXPORTER``, the
file is the only destination.

A batch header whose requests are traced carries their span contexts (W3C ``traceparent`` values); the worker that
runs it, thread or process, starts a ``compute`` span under each (``start_compute``), so one trace crosses the
processes. Which requests are traced, and their request and queue spans, are the core's (``pyserve.core.tracing``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)


# exporters and providers ----------------------------------------------------------------------------------------


class JsonLinesExporter:
    """A span exporter that appends each span as one JSON line to a file (shared by processes: O_APPEND)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        try:
            with self._lock:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, lines.encode())
                finally:
                    os.close(fd)
        except OSError as exc:
            logger.warning("could not write spans to %s: %s", self.path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing is held open."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Spans are written as they end."""
        return True


def _environment_exporters(trace_file: str) -> list[Any]:
    names = os.environ.get("OTEL_TRACES_EXPORTER")
    if names is None:
        names = "" if trace_file else "otlp"
    exporters: list[Any] = []
    from importlib.metadata import entry_points

    for name in (n.strip() for n in names.split(",")):
        if not name or name == "none":
            continue
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found and name == "otlp":
            # The HTTP exporter registers itself as otlp_proto_http; "otlp" alone means gRPC's.
            found = list(entry_points(group="opentelemetry_traces_exporter", name="otlp_proto_http"))
        if not found:
            logger.warning(
                "OTEL_TRACES_EXPORTER names %r but no such exporter is installed (pip install 'pyserve[tracing]' "
                "brings the OTLP one); spans will not be exported there",
                name,
            )
            continue
        try:
            exporters.append(found[0].load()())
        except Exception:
            logger.exception("could not create the %r span exporter", name)
    return exporters


def make_tracer_provider(trace_file: str) -> Any:
    """A TracerProvider of pyserve's own (the process-wide one is left to the user), exporting as configured."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "pyserve"}
    provider = TracerProvider(resource=Resource.create(attributes))
    if trace_file:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(trace_file)))  # type: ignore[arg-type]
    for exporter in _environment_exporters(trace_file):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


# W3C trace context -----------------------------------------------------------------------------------------------


def traceparent_of(span: Any) -> str:
    """The W3C traceparent header value naming ``span`` as the parent."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parent_context(traceparent: str) -> Any:
    """The OpenTelemetry context whose parent is the span a traceparent names (None for an empty one)."""
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


# the worker's compute spans --------------------------------------------------------------------------------------

_worker_providers: dict[str, Any] = {}
_worker_lock = threading.Lock()


def _worker_tracer(trace_file: str) -> Any:
    with _worker_lock:
        provider = _worker_providers.get(trace_file)
        if provider is None:
            provider = _worker_providers[trace_file] = make_tracer_provider(trace_file)
        return provider.get_tracer("pyserve.worker")


class ComputeSpans:
    """In a worker: a ``compute`` span under each traced request of a batch, the first one current meanwhile."""

    def __init__(
        self, trace_file: str, parents: Sequence[str | None], model: str, version: int, instance: int, requests: int
    ) -> None:
        from opentelemetry import context
        from opentelemetry import trace as trace_api

        tracer = _worker_tracer(trace_file)
        attributes = {
            "triton.model_name": model,
            "triton.model_version": str(version),
            "pyserve.instance": instance,
            "pyserve.batch_requests": requests,
            "process.pid": os.getpid(),
        }
        self.spans = [
            tracer.start_span("compute", context=parent_context(parent), attributes=attributes)
            for parent in parents
            if parent
        ]
        self._token = context.attach(trace_api.set_span_in_context(self.spans[0])) if self.spans else None

    def fail(self, error: BaseException) -> None:
        """The batch failed: mark every span."""
        from opentelemetry.trace import Status, StatusCode

        for span in self.spans:
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))

    def end(self) -> None:
        """End the spans and restore the previous current context."""
        from opentelemetry import context

        if self._token is not None:
            context.detach(self._token)
            self._token = None
        for span in self.spans:
            span.end()


def start_compute(
    trace_file: str, parents: Sequence[str | None], model: str, version: int, instance: int, requests: int
) -> ComputeSpans | None:
    """The compute spans of a batch whose header carries trace context: under each of ``parents`` (a request's
    ``traceparent``, None for one not traced), exported to ``trace_file`` too if set. None if tracing cannot start
    here."""
    try:
        return ComputeSpans(trace_file, parents, model, version, instance, requests)
    except Exception:  # tracing must never fail a batch
        logger.exception("could not start compute spans for model '%s'", model)
        return None
