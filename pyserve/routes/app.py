"""The Starlette app of the custom routes: each declared handler behind pyserve's readiness, body limit, error
mapping and per-route counters.

A handler gets a ``RouteRequest`` (a Starlette ``Request`` whose body is already read, so that a sync handler can
use it too) and returns:

- a Starlette ``Response``: sent as it is;
- a generator or async generator: a stream of Server-Sent Events, one ``data:`` event per item (a ``str`` as it is,
  anything else as JSON); an error in the middle of the stream ends it with a ``data: {"error": ...}`` event, as
  ``generate_stream`` does;
- anything else (a dict, a list, numbers, numpy arrays and scalars): JSON.

``async def`` handlers (and async generators) run on the routes' event loop and call ``await server.ainfer``;
others run in Starlette's worker threads and call ``server.infer``. A pyserve error answers with its status
(``InvalidInputError`` 400, ``ModelNotFoundError`` 404, ``QueueFullError`` 503, ...) and ``{"error": message}``, as
on the KServe port; any other exception answers 500 with its type and message and is logged with its traceback.
"""

from __future__ import annotations

import inspect
import logging
import time
import traceback
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from pyserve.core.api import METRICS_CONTENT_TYPE
from pyserve.errors import (
    ERROR_KIND_HEADER,
    InferenceError,
    InvalidInputError,
    PayloadTooLargeError,
    ServerError,
    error_kind,
)
from pyserve.routes.metrics import RouteMetrics
from pyserve.routes.table import METRICS_PATH, RouteSpec, RouteTable

logger = logging.getLogger(__name__)

_JSON = "application/json"
_EVENT_STREAM = "text/event-stream; charset=utf-8"
# Status of a request whose client went away before its answer (as nginx and the core's front end count it).
_CLIENT_GONE = 499


class RoutesState:
    """What every route's endpoint shares: readiness, limits, counters."""

    def __init__(self, max_body: int, debug_errors: bool = False) -> None:
        # False until Serve.run() has loaded every bound model (the moment /v2/health/ready turns 200), and again
        # from the moment stop() begins: the routes answer 503 meanwhile.
        self.ready = False
        self.max_body = max_body
        self.debug_errors = debug_errors
        self.metrics = RouteMetrics()


class RouteRequest(Request):
    """A Starlette ``Request`` whose body is already read: ``data`` and ``get_json()`` work in sync handlers too,
    and ``await request.body()`` / ``await request.json()`` as in any Starlette handler."""

    def __init__(self, scope: Scope, receive: Receive, body: bytes) -> None:
        super().__init__(scope, receive)
        self._body = body

    @property
    def data(self) -> bytes:
        """The request body (Flask's ``request.data``)."""
        return self._body

    def get_json(self) -> Any:
        """The body parsed as JSON (Flask's ``request.get_json()``); InvalidInputError (400) when it is not JSON."""
        if not self._body:
            raise InvalidInputError("the request body is empty; expected JSON")
        try:
            return orjson.loads(self._body)
        except orjson.JSONDecodeError as exc:
            raise InvalidInputError(f"the request body is not valid JSON: {exc}") from None


def build_app(table: RouteTable, state: RoutesState, serve_metrics: bool = True) -> Starlette:
    """The app serving every route of ``table`` (and those added to it later), plus ``/metrics`` with the
    routes' counters when ``serve_metrics``."""
    routes = [_route(spec, state) for spec in table.routes]
    if serve_metrics:
        routes.append(Route(METRICS_PATH, _metrics_endpoint(state.metrics), methods=["GET"]))
    app = Starlette(
        routes=routes,
        exception_handlers={404: _http_error, 405: _http_error},
    )
    table.on_added = lambda spec: app.router.routes.append(_route(spec, state))
    return app


def _route(spec: RouteSpec, state: RoutesState) -> Route:
    return Route(spec.path, RouteEndpoint(spec, state), methods=list(spec.methods))


class RouteEndpoint:
    """One route as an ASGI app: gate, read the body, call the handler, turn its result into a response, count."""

    def __init__(self, spec: RouteSpec, state: RoutesState) -> None:
        self.spec = spec
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state, route, method = self.state, self.spec.path, scope["method"]
        started = time.perf_counter()
        status = _CLIENT_GONE
        state.metrics.started(route, method)

        async def counted_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            response: Response | None
            if not state.ready:
                response = error_response(503, "the server is not ready: its models are loading, or it is stopping")
            else:
                response = await self._answer(scope, receive)
            if response is not None:
                await response(scope, receive, counted_send)
        finally:
            state.metrics.finished(route, method, status, (time.perf_counter() - started) * 1000)

    async def _answer(self, scope: Scope, receive: Receive) -> Response | None:
        spec = self.spec
        try:
            body = await read_body(scope, receive, self.state.max_body)
            request = RouteRequest(scope, receive, body)
            if spec.is_async:
                result = spec.handler(request)
            else:
                result = await run_in_threadpool(spec.handler, request)
            if inspect.isawaitable(result):
                result = await result
            return self._response(result)
        except ClientDisconnect:
            return None
        except Exception as exc:
            return self._failure(exc)

    def _response(self, result: Any) -> Response:
        if isinstance(result, Response):
            return result
        if inspect.isasyncgen(result) or inspect.isgenerator(result):
            return StreamingResponse(self._events(result), media_type=_EVENT_STREAM)
        try:
            content = orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError as exc:
            raise TypeError(f"the handler returned {type(result).__name__}, which is not JSON: {exc}") from None
        return Response(content, media_type=_JSON)

    async def _events(self, results: Any) -> AsyncIterator[bytes]:
        """A generator's items as Server-Sent Events; an error ends the stream with an error event."""
        items: AsyncIterator[Any] = results if inspect.isasyncgen(results) else iterate_in_threadpool(results)
        try:
            async for item in items:
                yield _event(item)
        except Exception as exc:
            yield _event({"error": self._message(exc)})
        finally:
            # Closing withdraws a streaming model's request that the generator was still reading (a client gone).
            if inspect.isasyncgen(results):
                await results.aclose()
            else:
                results.close()

    def _failure(self, exc: Exception) -> Response:
        """The answer to a handler's exception: pyserve's errors with their status, the others 500 (logged)."""
        if isinstance(exc, HTTPException):
            return error_response(exc.status_code, str(exc.detail), exc.headers)
        if isinstance(exc, InferenceError):
            return error_response(exc.http_status, str(exc), {ERROR_KIND_HEADER: error_kind(exc)})
        if isinstance(exc, ServerError):
            return error_response(503, str(exc))
        return error_response(500, self._message(exc))

    def _message(self, exc: Exception) -> str:
        if isinstance(exc, InferenceError):
            return str(exc)
        spec = self.spec
        logger.error("route %s (%s) raised %s: %s", spec.path, spec.name, type(exc).__name__, exc, exc_info=exc)
        text = str(exc)
        message = f"route {spec.path} raised {type(exc).__name__}" + (f": {text}" if text else "")
        if self.state.debug_errors:
            message += "\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return message


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, refused (PayloadTooLargeError, 413) as soon as it passes ``limit`` bytes."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise InvalidInputError(f"Content-Length must be an integer, got {value!r}") from None
            if declared > limit:
                raise PayloadTooLargeError(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def error_response(status: int, message: str, headers: Any = None) -> Response:
    """Triton's error shape, ``{"error": message}``, as every pyserve front end answers; a 503 says when to try
    again (``Retry-After: 1``, as the KServe port: docs/security.md)."""
    if status == 503:
        headers = {**(headers or {}), "retry-after": "1"}
    return Response(orjson.dumps({"error": message}), status_code=status, headers=headers, media_type=_JSON)


def _event(item: Any) -> bytes:
    data = item.encode() if isinstance(item, str) else orjson.dumps(item, option=orjson.OPT_SERIALIZE_NUMPY)
    # A line break would end the event's data early: each line becomes a data line of the same event.
    return b"".join(b"data: " + line + b"\n" for line in data.split(b"\n")) + b"\n"


async def _http_error(request: Request, exc: Exception) -> Response:
    """404 and 405 in pyserve's error shape."""
    assert isinstance(exc, HTTPException)
    message = f"not found: {request.url.path}" if exc.status_code == 404 else f"method {request.method} not allowed"
    return error_response(exc.status_code, message, exc.headers)


def _metrics_endpoint(metrics: RouteMetrics) -> Any:
    async def page(request: Request) -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE.decode())

    return page
