"""HTTP/REST front end: KServe v2 with Triton's extensions, on httptools + the core's asyncio loop.

No framework sits on the infer path: one asyncio.Protocol per connection parses with httptools, routes on the
path segments, decodes with ``kserve``, submits to the core and writes the response from the core's callback.
Requests on one connection are answered in order (HTTP/1.1 pipelining is queued, not interleaved).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httptools
import orjson

from pyserve.config import ServeConfig
from pyserve.core.infer_call import InferCall, build_request
from pyserve.core.inference import InferenceRequest, InferenceResponse, ModelEntry
from pyserve.errors import (
    InferenceError,
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    PayloadTooLargeError,
    UnsupportedError,
)
from pyserve.frontends.common import EXTENSIONS, SERVER_NAME, SERVER_VERSION
from pyserve.frontends.kserve import (
    decode_generate_request,
    decode_request,
    encode_generate_response,
    encode_response,
)

if TYPE_CHECKING:
    from pyserve.core.server import CoreServer

logger = logging.getLogger(__name__)

_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    499: "Client Closed Request",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}
_JSON = b"application/json"
_BINARY = b"application/octet-stream"
_EVENT_STREAM = b"text/event-stream; charset=utf-8"
# After an error that ends a connection early (a body over the limit, malformed HTTP), how long what the client
# still sends is read and dropped before the socket closes: closing with unread data makes the kernel reset the
# connection, and a client still sending its body could then lose the error response.
_LINGER_S = 2.0
# A body this large is dropped as soon as its response is written, not kept by a keep-alive connection until its
# next request. Smaller ones are left alone: freeing 1 MiB bodies early let glibc hand the memory back and fault
# it in again, costing ~25 % of 1 MiB throughput at 16 connections.
_LARGE_BODY_BYTES = 16 << 20


class HttpRequest:
    """One parsed HTTP request."""

    __slots__ = ("body", "headers", "keep_alive", "method", "path", "too_large")

    def __init__(self) -> None:
        self.method = b""
        self.path = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: bytearray | bytes = b""
        self.keep_alive = True
        self.too_large = False


class HttpProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, app: HttpApp) -> None:
        self.app = app
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.current = HttpRequest()
        self.url = b""
        self.backlog: deque[HttpRequest] = deque()
        self.in_flight: InferenceRequest | None = None
        self.busy = False
        self.closed = False
        self.linger: asyncio.TimerHandle | None = None

    # asyncio callbacks ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        if self.in_flight is not None:
            self.app.core.cancel(self.in_flight)
            self.in_flight = None
        self.backlog.clear()
        # The parser refers back to this protocol: the cycle lives until a garbage collection, the body need not.
        self.current.body = b""

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # answered and closing: what the client still sends is dropped
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._send_error_and_close(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._send_error_and_close(400, f"malformed HTTP request: {exc}")

    # httptools callbacks -------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = HttpRequest()
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        request = self.current
        request.method = self.parser.get_method()
        query = self.url.find(b"?")
        request.path = self.url if query < 0 else self.url[:query]
        length = request.headers.get(b"content-length")
        expects_continue = request.headers.get(b"expect", b"").lower() == b"100-continue"
        if length is not None and length.isdigit() and int(length) > self.app.max_body:
            # Refuse now rather than after receiving (and dropping) the whole body; a client that waits for
            # 100 Continue holds the body back and hears 413 instead.
            request.too_large = True
            self._send_error_and_close(413, f"request body exceeds the limit of {self.app.max_body} bytes")
        elif expects_continue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        request = self.current
        if request.too_large:
            return
        if not request.body:
            request.body = body
        else:
            if isinstance(request.body, bytes):
                request.body = bytearray(request.body)
            request.body += body
        # Chunked bodies carry no Content-Length: the limit is enforced here, on the first chunk too.
        if len(request.body) > self.app.max_body:
            request.too_large = True
            request.body = b""

    def on_message_complete(self) -> None:
        if self.closed:
            return  # refused while the headers were read (the parser goes on to the end of the chunk)
        request = self.current
        request.keep_alive = self.parser.should_keep_alive()
        if self.busy:
            self.backlog.append(request)
        else:
            self.busy = True
            self.app.handle(self, request)

    # responses -----------------------------------------------------------------------------------------------

    def respond(
        self,
        request: HttpRequest,
        status: int,
        body: bytes | list[Any] = b"",
        content_type: bytes = _JSON,
        extra_headers: bytes = b"",
    ) -> None:
        """Write one response, then start the next pipelined request."""
        self.in_flight = None
        transport = self.transport
        if self.closed or transport is None:
            return
        length = sum(memoryview(part).nbytes for part in body) if isinstance(body, list) else len(body)
        head = b"HTTP/1.1 %d %s\r\ncontent-length: %d\r\n" % (status, _REASONS.get(status, "").encode(), length)
        if length or content_type is not _JSON:
            head += b"content-type: " + content_type + b"\r\n"
        if not request.keep_alive:
            head += b"connection: close\r\n"
        head += extra_headers + b"\r\n"
        if isinstance(body, list):
            transport.write(b"".join([head, *body]))
        else:
            transport.write(head + body if body else head)
        self._finish(request, transport)

    def start_stream(self, request: HttpRequest, status: int, content_type: bytes) -> None:
        """Send the head of a chunked response (Server-Sent Events); chunks follow with write_chunk()."""
        transport = self.transport
        if self.closed or transport is None:
            return
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\n" % (
            status,
            _REASONS.get(status, "").encode(),
            content_type,
        )
        if not request.keep_alive:
            head += b"connection: close\r\n"
        transport.write(head + b"\r\n")

    def write_chunk(self, data: bytes) -> None:
        """One chunk of a streamed response."""
        if data and not self.closed and self.transport is not None:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self, request: HttpRequest) -> None:
        """Close a streamed response, then start the next pipelined request."""
        self.in_flight = None
        transport = self.transport
        if self.closed or transport is None:
            return
        transport.write(b"0\r\n\r\n")
        self._finish(request, transport)

    def _finish(self, request: HttpRequest, transport: asyncio.Transport) -> None:
        if len(request.body) >= _LARGE_BODY_BYTES:
            request.body = b""
        if not request.keep_alive:
            transport.close()
            self.closed = True
            return
        if self.backlog:
            self.app.handle(self, self.backlog.popleft())
        else:
            self.busy = False

    def respond_error(self, request: HttpRequest, status: int, message: str) -> None:
        """Triton's error shape: ``{"error": "..."}``."""
        self.respond(request, status, orjson.dumps({"error": message}))

    def _send_error_and_close(self, status: int, message: str) -> None:
        """Answer an error that ends the connection: half-close at once, close fully once the client has closed
        its side or after _LINGER_S, reading and dropping what it still sends meanwhile."""
        transport = self.transport
        if transport is not None and not self.closed:
            body = orjson.dumps({"error": message})
            transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                % (status, _REASONS.get(status, "").encode(), len(body))
                + body
            )
            if transport.can_write_eof():
                transport.write_eof()
                self.linger = asyncio.get_running_loop().call_later(_LINGER_S, transport.close)
            else:
                transport.close()
        self.closed = True


class HttpApp:
    """Routes requests to the core; shared by every connection."""

    def __init__(self, core: CoreServer, config: ServeConfig) -> None:
        self.core = core
        self.max_body = config.max_request_bytes

    def handle(self, conn: HttpProtocol, request: HttpRequest) -> None:
        """Answer one request (infer answers later, from the core's callback)."""
        try:
            if request.too_large:
                raise PayloadTooLargeError(f"request body exceeds the limit of {self.max_body} bytes")
            self._route(conn, request)
        except InferenceError as exc:
            status = (
                400 if isinstance(exc, ModelNotFoundError) and request.path.endswith(b"/stats") else exc.http_status
            )
            conn.respond_error(request, status, str(exc))
        except Exception as exc:
            logger.exception("unexpected error handling %r", request.path)
            conn.respond_error(request, 500, f"internal server error: {exc}")

    def _route(self, conn: HttpProtocol, request: HttpRequest) -> None:
        parts = request.path.decode("latin-1").strip("/").split("/")
        method = request.method
        if not parts or parts[0] != "v2":
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")
            return
        rest = parts[1:]
        if not rest:
            self._json(
                conn, request, method, {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}
            )
            return
        if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            if method != b"GET":
                conn.respond_error(request, 405, "use GET")
                return
            ok = rest[1] == "live" or self.core.is_ready()
            conn.respond(request, 200 if ok else 400)
            return
        if rest[0] == "models":
            self._route_models(conn, request, method, rest[1:])
            return
        if rest == ["logging"]:
            logs = self.core.logs
            self._settings(conn, request, method, logs.to_json, logs.update)
            return
        if rest == ["trace", "setting"]:
            tracing = self.core.tracing
            self._settings(conn, request, method, tracing.to_json, lambda changes: tracing.update(None, changes))
            return
        if rest == ["repository", "index"] and method == b"POST":
            index = [e.index_entry() for e in self.core.registry.entries()]
            conn.respond(request, 200, orjson.dumps(index))
            return
        conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")

    def _route_models(self, conn: HttpProtocol, request: HttpRequest, method: bytes, rest: list[str]) -> None:
        registry = self.core.registry
        if rest == ["stats"] or not rest:
            if not rest:
                conn.respond_error(request, 404, "not found: /v2/models")
                return
            stats = [e.stats.to_json(e.name, e.version) for e in registry.entries()]
            self._json(conn, request, method, {"model_stats": stats})
            return
        name = unquote(rest[0])
        version: str | None = None
        tail = rest[1:]
        if len(tail) >= 2 and tail[0] == "versions":
            version = unquote(tail[1])
            tail = tail[2:]
        if tail == ["trace", "setting"] and version is None:
            registry.get(name)  # unknown model: 404
            tracing = self.core.tracing
            self._settings(
                conn, request, method, lambda: tracing.to_json(name), lambda changes: tracing.update(name, changes)
            )
            return
        if len(tail) > 1:
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")
            return
        action = tail[0] if tail else ""
        if action == "infer":
            if method != b"POST":
                conn.respond_error(request, 405, "use POST for infer")
                return
            self._infer(conn, request, registry.get(name, version))
            return
        if action == "stats":
            if version is None:
                entries = registry.versions(name)
                if not entries:
                    raise ModelNotFoundError(f"requested model '{name}' is not found")
            else:
                entries = [registry.get(name, version)]
            self._json(conn, request, method, {"model_stats": [e.stats.to_json(e.name, e.version) for e in entries]})
            return
        entry = registry.get(name, version)
        if action == "":
            self._json(conn, request, method, entry.metadata([e.version for e in registry.versions(name)]))
        elif action == "config":
            self._json(conn, request, method, entry.config_json())
        elif action == "ready":
            conn.respond(request, 200 if entry.ready else 400)
        elif action in ("generate", "generate_stream"):
            if method != b"POST":
                conn.respond_error(request, 405, f"use POST for {action}")
                return
            self._generate(conn, request, entry, streaming=action == "generate_stream")
        else:
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")

    def _settings(
        self,
        conn: HttpProtocol,
        request: HttpRequest,
        method: bytes,
        read: Callable[[], dict[str, Any]],
        update: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        """Triton's settings endpoints (logging, trace): GET reads them; POST applies a JSON object of changes and
        answers the settings now in force."""
        if method == b"GET":
            conn.respond(request, 200, orjson.dumps(read()))
            return
        if method != b"POST":
            conn.respond_error(request, 405, "use GET or POST")
            return
        try:
            changes = orjson.loads(self._body(request) or b"{}")
        except orjson.JSONDecodeError as exc:
            raise InvalidInputError(f"failed to parse the settings JSON: {exc}") from None
        if not isinstance(changes, dict):
            raise InvalidInputError("the settings JSON must be an object")
        conn.respond(request, 200, orjson.dumps(update(changes)))

    def _json(self, conn: HttpProtocol, request: HttpRequest, method: bytes, doc: Any) -> None:
        if method != b"GET":
            conn.respond_error(request, 405, "use GET")
            return
        conn.respond(request, 200, orjson.dumps(doc))

    # infer ---------------------------------------------------------------------------------------------------

    def _infer(self, conn: HttpProtocol, request: HttpRequest, entry: ModelEntry) -> None:
        if entry.spec.config.decoupled:
            raise UnsupportedError(
                f"model '{entry.name}' is decoupled (streaming): use gRPC ModelStreamInfer or /generate_stream"
            )
        headers = request.headers
        body = self._body(request)
        header_length: int | None = None
        raw_length = headers.get(b"inference-header-content-length")
        if raw_length is not None:
            try:
                header_length = int(raw_length)
            except ValueError:
                raise InvalidInputError(
                    f"Inference-Header-Content-Length must be an integer, got {raw_length!r}"
                ) from None
        call = decode_request(body, header_length, entry)
        accept = headers.get(b"accept-encoding", b"").lower()
        compress = b"gzip" if b"gzip" in accept else b"deflate" if b"deflate" in accept else b""

        def on_response(infer: InferenceRequest, response: InferenceResponse) -> None:
            self._write_response(conn, request, entry, call, response, compress)

        infer = build_request(entry, call, on_response)
        if self.core.tracing.active:
            infer.traceparent = headers.get(b"traceparent", b"").decode("latin-1")
        conn.in_flight = infer
        self.core.submit(infer)

    def _body(self, request: HttpRequest) -> Any:
        encoding = request.headers.get(b"content-encoding")
        if encoding:
            return _decompress(request.body, encoding.lower(), self.max_body)
        return request.body

    # generate ------------------------------------------------------------------------------------------------

    def _generate(self, conn: HttpProtocol, request: HttpRequest, entry: ModelEntry, streaming: bool) -> None:
        """Triton's generate extension: ``/generate`` answers one JSON object, ``/generate_stream`` one Server-Sent
        Event per response. Once a stream has started, a later error arrives as an ``{"error": ...}`` event."""
        call = decode_generate_request(self._body(request), entry)
        # A decoupled model ends with a flag-only response; it carries nothing to send.
        decoupled = entry.spec.config.decoupled
        collected: list[bytes] = []
        started = finished = False

        def on_response(infer: InferenceRequest, response: InferenceResponse) -> None:
            nonlocal started, finished
            if finished:
                return
            finished = response.final
            error = response.error
            if error is not None:
                event = orjson.dumps({"error": str(error)})
            elif response.final and decoupled and not response.outputs:
                event = b""
            else:
                event = encode_generate_response(entry, call, response.outputs, response.parameters or None)
            if not streaming:
                if error is not None:
                    finished = True
                    conn.respond_error(request, error.http_status, str(error))
                    return
                if event:
                    collected.append(event)
                if response.final:
                    if len(collected) == 1:
                        conn.respond(request, 200, collected[0])
                    else:
                        conn.respond_error(
                            request,
                            ModelExecutionError.http_status,
                            f"generate expects model '{entry.name}' to produce exactly 1 response, got "
                            f"{len(collected)}; use generate_stream for a model that streams responses",
                        )
                return
            if not started:
                started = True
                conn.start_stream(request, 200 if error is None else error.http_status, _EVENT_STREAM)
            if event:
                conn.write_chunk(b"data: " + event + b"\n\n")
            if response.final:
                conn.end_stream(request)

        infer = build_request(entry, call, on_response)
        if self.core.tracing.active:
            infer.traceparent = request.headers.get(b"traceparent", b"").decode("latin-1")
        conn.in_flight = infer
        self.core.submit(infer)

    # responses -----------------------------------------------------------------------------------------------

    def _write_response(
        self,
        conn: HttpProtocol,
        request: HttpRequest,
        entry: ModelEntry,
        call: InferCall,
        response: InferenceResponse,
        compress: bytes,
    ) -> None:
        if response.error is not None:
            conn.respond_error(request, response.error.http_status, str(response.error))
            return
        header, parts = encode_response(entry, call, response.outputs, response.parameters or None)
        extra = b""
        if parts:
            extra = b"inference-header-content-length: %d\r\n" % len(header)
            content_type = _BINARY
        else:
            content_type = _JSON
        body: bytes | list[Any] = [header, *parts] if parts else header
        if compress:
            joined = b"".join(body) if isinstance(body, list) else body
            body = gzip.compress(joined, 1) if compress == b"gzip" else zlib.compress(joined, 1)
            extra += b"content-encoding: " + compress + b"\r\n"
        conn.respond(request, 200, body, content_type, extra)


def _decompress(body: bytes | bytearray, encoding: bytes, limit: int) -> bytes:
    try:
        if encoding == b"gzip":
            decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == b"deflate":
            decompressor = zlib.decompressobj()
        elif encoding == b"identity":
            return bytes(body)
        else:
            raise UnsupportedError(f"unsupported Content-Encoding {encoding.decode('latin-1')!r}; use gzip or deflate")
        out = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInputError(f"could not decompress the {encoding.decode('latin-1')} request body: {exc}") from None
    if len(out) > limit:
        raise PayloadTooLargeError(f"decompressed request body exceeds the limit of {limit} bytes")
    return out


async def listen(app: HttpApp, host: str, port: int, backlog: int) -> tuple[asyncio.base_events.Server, int]:
    """Serve ``app`` over HTTP on host:port (0 picks a free port); returns the server and the bound port."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: HttpProtocol(app), host=host, port=port, reuse_address=True, backlog=backlog
    )
    return server, server.sockets[0].getsockname()[1]


async def start_http_server(core: CoreServer, config: ServeConfig) -> tuple[asyncio.base_events.Server, int]:
    """Listen on config.host:http_port; returns the server and the bound port."""
    return await listen(HttpApp(core, config), config.host, config.http_port, backlog=1024)
