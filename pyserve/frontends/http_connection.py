"""HTTP/1.1 connections on the core's asyncio loop: httptools parsing, pipelining, responses and streams.

One ``HttpProtocol`` per connection parses requests with httptools and hands each complete one to its app
(``RequestHandler``: the KServe routes of ``pyserve.frontends.http``, or the metrics page). Requests on one
connection are answered in order (HTTP/1.1 pipelining is queued, not interleaved). What the app answers goes out
through ``respond`` (or ``start_stream`` / ``write_chunk`` / ``end_stream`` for Server-Sent Events). No framework
sits on this path.

Hostile clients are bounded here (docs/security.md): a request's head (request line and headers) may hold at most
``MAX_HEAD_BYTES`` (431 past it) and, with a header timeout (``ServeConfig.http_header_timeout_s``), must arrive
within that many seconds of the connection opening or of the request's first byte, and a half-sent body may pause at
most that long (408, then the connection closes). A connection idle between requests is not timed: keep-alive pools
hold such connections on purpose.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any, Protocol

import httptools
import orjson

from pyserve.core.api import StageRecorder
from pyserve.core.inference import InferenceRequest
from pyserve.errors import ERROR_KIND_HEADER

_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    431: "Request Header Fields Too Large",
    499: "Client Closed Request",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}
# The default content type; compared by identity in respond(), so pass this object, not an equal literal.
JSON = b"application/json"
# After an error that ends a connection early (a body over the limit, malformed HTTP), how long what the client
# still sends is read and dropped before the socket closes: closing with unread data makes the kernel reset the
# connection, and a client still sending its body could then lose the error response.
_LINGER_S = 2.0
# A body this large is dropped as soon as its response is written, not kept by a keep-alive connection until its
# next request. Smaller ones are left alone: freeing 1 MiB bodies early let glibc hand the memory back and fault
# it in again, costing ~25 % of 1 MiB throughput at 16 connections.
_LARGE_BODY_BYTES = 16 << 20
# The most bytes a request's head (request line and headers) may take. httptools keeps a header it is still reading
# by concatenating its pieces, so an endless header would cost memory and quadratic time without this bound.
MAX_HEAD_BYTES = 64 * 1024
# Sent with every 503. Whole seconds are all Retry-After can say, and 1 is the least that is not "at once": a full
# queue drains within batches (milliseconds), a model comes back or a draining server goes away (a load balancer
# then sends the retry elsewhere) on a scale of seconds, and a longer hint would idle clients past that.
_RETRY_AFTER = b"retry-after: 1\r\n"


class RequestHandler(Protocol):
    """What a connection asks of its app."""

    @property
    def max_body(self) -> int:
        """The largest request body accepted, in bytes (413 past it)."""
        ...

    def handle(self, conn: HttpProtocol, request: HttpRequest) -> None:
        """Answer one complete request, now or later, with ``conn.respond`` (or a stream)."""
        ...

    def cancel(self, request: InferenceRequest) -> None:
        """The connection closed while ``request`` (handed to ``conn.in_flight``) was being answered."""
        ...


class HttpRequest:
    """One parsed HTTP request."""

    __slots__ = ("body", "headers", "keep_alive", "method", "path", "stamps", "too_large")

    def __init__(self) -> None:
        self.method = b""
        self.path = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: bytearray | bytes = b""
        self.keep_alive = True
        self.too_large = False
        # With the stage-times switch on: when the request passed each stage (pyserve.core.stage_times).
        self.stamps: list[int] | None = None


class HttpProtocol(asyncio.Protocol):
    """One client connection; ``stage_times`` stamps its requests' first and last stages (None: off);
    ``header_timeout_s`` bounds how long a request's head may take to arrive and a half-sent body may pause (0: off)."""

    def __init__(
        self, app: RequestHandler, stage_times: StageRecorder | None = None, header_timeout_s: float = 0.0
    ) -> None:
        self.app = app
        self.stage_times = stage_times
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.current = HttpRequest()
        self.url = b""
        self.backlog: deque[HttpRequest] = deque()
        self.in_flight: InferenceRequest | None = None
        self.busy = False
        self.closed = False
        self.linger: asyncio.TimerHandle | None = None
        # Reading a request: begun at its first byte, in_head until its headers are complete (head_bytes of them so
        # far), receiving until its body is too. A new connection is receiving its first request from the start.
        self.begun = False
        self.in_head = True
        self.head_bytes = 0
        self.head_size = 0  # bytes of the current head's target and headers, as the parser hands them over
        self.receiving = True
        self.header_timeout_s = header_timeout_s if header_timeout_s > 0 else 0.0
        self.head_started = 0.0  # loop time the current head began (the connection's opening for the first)
        self.last_data = 0.0  # loop time of the last bytes received
        self.timer: asyncio.TimerHandle | None = None

    # asyncio callbacks ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.header_timeout_s:
            loop = asyncio.get_running_loop()
            self.head_started = self.last_data = loop.time()
            self.timer = loop.call_at(self.head_started + self.header_timeout_s, self._check_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.in_flight is not None:
            self.app.cancel(self.in_flight)
            self.in_flight = None
        self.backlog.clear()
        # The parser refers back to this protocol: the cycle lives until a garbage collection, the body need not.
        self.current.body = b""

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # answered and closing: what the client still sends is dropped
        if self.in_head:
            # Reset when a head completes during the feed: a count left over after it is all this head's own.
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._send_error_and_close(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._send_error_and_close(400, f"malformed HTTP request: {exc}")
        if self.closed:
            return
        if self.in_head and self.head_bytes > MAX_HEAD_BYTES:
            self._refuse_head()
            return
        if self.header_timeout_s:
            if self.receiving:
                loop = asyncio.get_running_loop()
                self.last_data = loop.time()
                if self.head_started < 0:
                    self.head_started = self.last_data
                if self.timer is None:
                    self.timer = loop.call_at(self.last_data + self.header_timeout_s, self._check_timeout)
            elif self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def _refuse_head(self) -> None:
        self._send_error_and_close(431, f"the request line and headers exceed the limit of {MAX_HEAD_BYTES} bytes")

    def _check_timeout(self) -> None:
        """The header timeout's timer: close a connection whose request head is late or whose body stalled."""
        self.timer = None
        if self.closed or not self.receiving:
            return
        loop = asyncio.get_running_loop()
        timeout = self.header_timeout_s
        due = self.head_started + timeout if self.in_head else self.last_data + timeout
        if loop.time() < due:
            self.timer = loop.call_at(due, self._check_timeout)
        elif not self.begun:
            # Nothing of a request was sent: there is nobody to answer, only a connection to close.
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        elif self.in_head:
            self._send_error_and_close(408, f"the request's headers did not arrive within {timeout:g} s")
        else:
            self._send_error_and_close(408, f"the request body stalled: nothing received for {timeout:g} s")

    # httptools callbacks -------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = HttpRequest()
        self.url = b""
        self.head_size = 0
        self.begun = True
        if not self.receiving:
            self.receiving = True
            self.head_started = -1.0  # now: data_received reads the clock if the head is still coming after it

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.lower()] = value
        self.head_size += len(name) + len(value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_bytes = 0
        if self.head_size + len(self.url) > MAX_HEAD_BYTES:
            # A head that came in one read was not counted by data_received.
            self._refuse_head()
            return
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
        if request.too_large or self.closed:
            return
        if not request.body:
            request.body = body
        else:
            if isinstance(request.body, bytes):
                request.body = bytearray(request.body)
            request.body += body
        # Chunked bodies carry no Content-Length: the limit is enforced here, on the first chunk too. The connection
        # ends at once, rather than reading an endless body to its end.
        if len(request.body) > self.app.max_body:
            request.too_large = True
            request.body = b""
            self._send_error_and_close(413, f"request body exceeds the limit of {self.app.max_body} bytes")

    def on_message_complete(self) -> None:
        self.begun = False
        self.in_head = True
        self.head_bytes = 0
        self.receiving = False
        if self.closed:
            return  # refused while the headers were read (the parser goes on to the end of the chunk)
        request = self.current
        request.keep_alive = self.parser.should_keep_alive()
        if self.stage_times is not None:
            request.stamps = self.stage_times.start()
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
        content_type: bytes = JSON,
        extra_headers: bytes = b"",
    ) -> None:
        """Write one response, then start the next pipelined request."""
        self.in_flight = None
        transport = self.transport
        if self.closed or transport is None:
            return
        length = sum(memoryview(part).nbytes for part in body) if isinstance(body, list) else len(body)
        head = b"HTTP/1.1 %d %s\r\ncontent-length: %d\r\n" % (status, _REASONS.get(status, "").encode(), length)
        if length or content_type is not JSON:
            head += b"content-type: " + content_type + b"\r\n"
        if not request.keep_alive:
            head += b"connection: close\r\n"
        head += extra_headers + b"\r\n"
        if isinstance(body, list):
            transport.write(b"".join([head, *body]))
        else:
            transport.write(head + body if body else head)
        if request.stamps is not None and self.stage_times is not None:
            self.stage_times.written(request.stamps)
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

    def respond_error(self, request: HttpRequest, status: int, message: str, kind: str | None = None) -> None:
        """Triton's error shape: ``{"error": "..."}``; ``kind`` (error_kind()) goes in a header for pyserve's client.
        A 503 (a full queue, a model not ready, a server shutting down) says when to try again: ``Retry-After``."""
        extra = b"" if kind is None else b"%s: %s\r\n" % (ERROR_KIND_HEADER.encode(), kind.encode())
        if status == 503:
            extra += _RETRY_AFTER
        self.respond(request, status, orjson.dumps({"error": message}), extra_headers=extra)

    def _send_error_and_close(self, status: int, message: str) -> None:
        """Answer an error that ends the connection: half-close at once, close fully once the client has closed
        its side or after _LINGER_S, reading and dropping what it still sends meanwhile."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
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


async def listen(
    app: RequestHandler,
    host: str,
    port: int,
    backlog: int,
    stage_times: StageRecorder | None = None,
    header_timeout_s: float = 0.0,
    tls: ssl.SSLContext | None = None,
) -> tuple[asyncio.base_events.Server, int]:
    """Serve ``app`` over HTTP on host:port (0 picks a free port); returns the server and the bound port.
    ``stage_times``: the stage-times recorder, for the infer routes (None: off); ``header_timeout_s``: see
    ``HttpProtocol`` (0: off); ``tls``: serve HTTPS with this context (None: plain HTTP)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: HttpProtocol(app, stage_times, header_timeout_s),
        host=host,
        port=port,
        reuse_address=True,
        backlog=backlog,
        ssl=tls,
        # The protocol (and its header timeout) starts once the handshake is done: bound the handshake alike.
        ssl_handshake_timeout=(header_timeout_s or None) if tls is not None else None,
    )
    return server, server.sockets[0].getsockname()[1]
