"""Custom routes without a server: the declarations a table accepts, and the Starlette app driven as ASGI."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from pyserve.errors import (
    ConfigError,
    InvalidInputError,
    ModelNotFoundError,
    QueueFullError,
    ServerError,
)
from pyserve.routes.table import RouteTable

pytest.importorskip("starlette", reason="custom routes need Starlette: pip install 'pyserve[routes]'")

from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse

from pyserve.routes.app import RouteRequest, RoutesState, build_app


class Answer:
    """What an ASGI app sent back."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        start = messages[0]
        self.status: int = start["status"]
        self.headers = {name.decode(): value.decode() for name, value in start["headers"]}
        self.body = b"".join(message.get("body", b"") for message in messages[1:])

    def json(self) -> Any:
        return orjson.loads(self.body)


def call(app: Any, method: str, path: str, body: bytes = b"", chunks: list[bytes] | None = None) -> Answer:
    """One request through the ASGI app, its body in one message (or in ``chunks``, no Content-Length)."""
    parts = chunks if chunks is not None else [body]
    incoming = [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1} for i, part in enumerate(parts)]
    headers = [(b"host", b"test")]
    if chunks is None:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "server": ("test", 80),
        "client": ("client", 1234),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return Answer(sent)


def app_with(
    *routes: tuple[str, list[str], Any], ready: bool = True, max_body: int = 1 << 20
) -> tuple[Any, RoutesState]:
    table = RouteTable()
    for path, methods, handler in routes:
        table.add(path, methods, handler)
    state = RoutesState(max_body)
    state.ready = ready
    return build_app(table, state), state


# declarations -----------------------------------------------------------------------------------------------------


def test_a_table_checks_each_declaration() -> None:
    table = RouteTable()
    table.add("/predict", ["post"], lambda request: {})
    table.add("/predict", ["GET"], lambda request: {})  # another method of the same path
    table.add("/items/{item_id:int}", ("GET",), lambda request: {})
    assert [(r.path, r.methods) for r in table.routes] == [
        ("/predict", ("POST",)),
        ("/predict", ("GET",)),
        ("/items/{item_id:int}", ("GET",)),
    ]
    with pytest.raises(ConfigError, match="POST is already served"):
        table.add("/predict", ["POST"], lambda request: {})
    with pytest.raises(ConfigError, match="starting with '/'"):
        table.add("predict", ["POST"], lambda request: {})
    with pytest.raises(ConfigError, match="unknown method"):
        table.add("/x", ["FETCH"], lambda request: {})
    with pytest.raises(ConfigError, match="callable"):
        table.add("/x", ["GET"], "not a function")
    with pytest.raises(ConfigError, match="its own metrics"):
        table.add("/metrics", ["GET"], lambda request: {})
    with pytest.raises(ConfigError, match="path parameter"):
        table.add("/items/{item id}", ["GET"], lambda request: {})


# answers ----------------------------------------------------------------------------------------------------------


def test_sync_and_async_handlers_answer_json() -> None:
    def sync_handler(request: RouteRequest) -> dict[str, Any]:
        document = request.get_json()
        return {"sum": np.float32(sum(document["x"])), "rows": np.arange(2), "bytes": len(request.data)}

    async def async_handler(request: RouteRequest) -> list[Any]:
        return [await request.json(), request.path_params["name"]]

    app, _ = app_with(("/sum", ["POST"], sync_handler), ("/echo/{name}", ["POST"], async_handler))
    answer = call(app, "POST", "/sum", b'{"x": [1, 2, 3.5]}')
    assert (answer.status, answer.headers["content-type"]) == (200, "application/json")
    assert answer.json() == {"sum": 6.5, "rows": [0, 1], "bytes": 18}
    assert call(app, "POST", "/echo/abc", b'{"a": 1}').json() == [{"a": 1}, "abc"]


def test_a_response_is_sent_as_it_is() -> None:
    app, _ = app_with(("/text", ["GET"], lambda request: PlainTextResponse("ok", status_code=201)))
    answer = call(app, "GET", "/text")
    assert (answer.status, answer.body) == (201, b"ok")


def test_generators_stream_server_sent_events() -> None:
    async def count(request: RouteRequest) -> AsyncIterator[Any]:
        for index in range(3):
            yield {"i": index}
        yield "two\nlines"

    def fail_midway(request: RouteRequest) -> Iterator[Any]:
        yield {"i": 0}
        raise ValueError("gave up")

    app, _ = app_with(("/count", ["GET"], count), ("/fail", ["GET"], fail_midway))
    answer = call(app, "GET", "/count")
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.body == b'data: {"i":0}\n\ndata: {"i":1}\n\ndata: {"i":2}\n\ndata: two\ndata: lines\n\n'
    answer = call(app, "GET", "/fail")
    assert answer.status == 200
    assert answer.body == b'data: {"i":0}\n\ndata: {"error":"route /fail raised ValueError: gave up"}\n\n'


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InvalidInputError("input 'x': bad"), 400),
        (ModelNotFoundError("unknown model 'm'"), 404),
        (QueueFullError("queue of model 'm' is full"), 503),
        (ServerError("the server is not running"), 503),
    ],
)
def test_pyserve_errors_answer_their_status(error: Exception, status: int) -> None:
    def handler(request: RouteRequest) -> Any:
        raise error

    answer = call(app_with(("/x", ["GET"], handler))[0], "GET", "/x")
    assert (answer.status, answer.json()) == (status, {"error": str(error)})
    if status != 503 or not isinstance(error, ServerError):
        assert answer.headers["pyserve-error-kind"] == type(error).__name__


def test_other_exceptions_answer_500_and_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(request: RouteRequest) -> Any:
        raise KeyError("features")

    def not_json(request: RouteRequest) -> Any:
        return {"when": object()}

    app, _ = app_with(("/x", ["POST"], handler), ("/y", ["GET"], not_json))
    with caplog.at_level(logging.ERROR, logger="pyserve.routes.app"):
        answer = call(app, "POST", "/x", b"{}")
    assert (answer.status, answer.json()) == (500, {"error": "route /x raised KeyError: 'features'"})
    assert "route /x (test_other_exceptions_answer_500_and_are_logged.<locals>.handler) raised KeyError" in caplog.text
    answer = call(app, "GET", "/y")
    assert answer.status == 500 and "which is not JSON" in answer.json()["error"]


def test_http_exceptions_and_bad_json_answer_their_status() -> None:
    def handler(request: RouteRequest) -> Any:
        if request.method == "GET":
            raise HTTPException(418, "short and stout")
        return request.get_json()

    app, _ = app_with(("/x", ["GET", "POST"], handler))
    assert (call(app, "GET", "/x").status, call(app, "GET", "/x").json()) == (418, {"error": "short and stout"})
    answer = call(app, "POST", "/x", b"{nope")
    assert answer.status == 400 and answer.json()["error"].startswith("the request body is not valid JSON")
    assert call(app, "POST", "/x").json() == {"error": "the request body is empty; expected JSON"}


def test_unknown_paths_and_methods_answer_in_pyserves_error_shape() -> None:
    app, _ = app_with(("/x", ["POST"], lambda request: {}))
    assert (call(app, "GET", "/nowhere").status, call(app, "GET", "/nowhere").json()) == (
        404,
        {"error": "not found: /nowhere"},
    )
    answer = call(app, "GET", "/x")
    assert (answer.status, answer.json(), answer.headers["allow"]) == (405, {"error": "method GET not allowed"}, "POST")


def test_routes_answer_503_until_the_server_is_ready() -> None:
    app, state = app_with(("/x", ["GET"], lambda request: {"ok": True}), ready=False)
    answer = call(app, "GET", "/x")
    assert answer.status == 503 and "not ready" in answer.json()["error"]
    state.ready = True
    assert call(app, "GET", "/x").json() == {"ok": True}


def test_bodies_over_the_limit_answer_413() -> None:
    app, _ = app_with(("/x", ["POST"], lambda request: len(request.data)), max_body=10)
    assert call(app, "POST", "/x", b"0123456789").json() == 10
    answer = call(app, "POST", "/x", b"0123456789a")
    assert answer.status == 413 and "exceeds the limit of 10 bytes" in answer.json()["error"]
    answer = call(app, "POST", "/x", chunks=[b"012345", b"6789a"])  # chunked: no Content-Length to go by
    assert answer.status == 413


def test_a_route_added_later_is_served() -> None:
    table = RouteTable()
    state = RoutesState(1 << 20)
    state.ready = True
    app = build_app(table, state)
    assert call(app, "GET", "/late").status == 404
    table.add("/late", ["GET"], lambda request: "here")
    assert call(app, "GET", "/late").json() == "here"


def test_the_metrics_page_counts_requests_by_route_and_status() -> None:
    def handler(request: RouteRequest) -> Any:
        if request.path_params["n"] == "0":
            raise InvalidInputError("zero")
        return {}

    app, state = app_with(("/items/{n}", ["GET"], handler))
    for n in ("1", "2", "0"):
        call(app, "GET", f"/items/{n}")
    assert state.metrics.count("/items/{n}", "GET", 200) == 2
    page = call(app, "GET", "/metrics")
    assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = page.body.decode()
    assert 'pyserve_route_requests{code="200",method="GET",route="/items/{n}"} 2' in text
    assert 'pyserve_route_requests{code="400",method="GET",route="/items/{n}"} 1' in text
    assert 'pyserve_route_request_duration_ms_count{method="GET",route="/items/{n}"} 3' in text
    assert 'pyserve_route_requests_in_flight{method="GET",route="/items/{n}"} 0' in text
