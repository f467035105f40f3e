"""Sending one pre-encoded request and waiting for its answer, over HTTP or gRPC, as cheaply as Python allows.

Every request a benchmark sends is encoded once, before the load starts, by pyserve's client codecs (binary tensor
data over HTTP, raw contents over gRPC), so a send costs only its I/O. HTTP runs on a connection of this module's
own (an asyncio protocol writing the whole request in one write and parsing the answer with httptools, the
server's own parser): aiohttp costs ~190 µs of CPU per call where this costs a fraction of it, and CPU the load
generator spends is CPU a server on the same machine does not get. gRPC runs on pyserve's grpc.aio transport with
the response left unparsed. An answer counts as a success when the server says so (HTTP 200, gRPC OK); anything
else is an error, named by the pyserve error class the answer maps to and the server's message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol, cast

import httptools

from pyserve.client.aio_transports import AsyncGrpcTransport
from pyserve.client.calls import GrpcCall
from pyserve.client.grpc_codec import GrpcCodec
from pyserve.client.http_codec import HttpCodec, error_of
from pyserve.client.model import InferRequest, ServerAddress
from pyserve.errors import PyServeError, ServerUnreachableError

# How a failure to reach the server is counted (a closed-loop sender pauses after one rather than spinning).
UNREACHABLE = ServerUnreachableError.__name__
# Where an error message is cut: a server's messages may carry request-specific text.
_MESSAGE_LIMIT = 200


class Sender(Protocol):
    """Sends request ``index`` of the pre-encoded ones; None when it succeeded, else what went wrong."""

    async def send(self, index: int) -> str | None:
        """Send one request and wait for its answer."""

    async def close(self) -> None:
        """Close every connection."""


def error_text(error: BaseException) -> str:
    """How an error is counted: its class and message, cut to a few hundred characters."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


def make_sender(
    address: ServerAddress, requests: Sequence[InferRequest], headers: Mapping[str, str], timeout_s: float
) -> Sender:
    """The sender for ``address``'s protocol, with ``requests`` encoded."""
    if address.scheme == "http":
        return HttpSender(address, requests, headers, timeout_s)
    return GrpcSender(address, requests, headers, timeout_s)


class HttpSender:
    """HTTP/1.1 over kept-alive connections: a request takes an idle connection or opens one, so there are as many
    connections as requests in flight."""

    def __init__(
        self, address: ServerAddress, requests: Sequence[InferRequest], headers: Mapping[str, str], timeout_s: float
    ) -> None:
        self._address = address
        self._timeout_s = timeout_s
        codec = HttpCodec(headers)
        host = f"Host: {address.authority}\r\n"
        self._payloads: list[bytes] = []
        for request in requests:
            call = codec.infer(request)
            lines = [f"{call.method} {call.path} HTTP/1.1\r\n", host, f"Content-Length: {len(call.body)}\r\n"]
            lines += [f"{name}: {value}\r\n" for name, value in call.headers.items()]
            self._payloads.append(("".join(lines) + "\r\n").encode("latin-1") + call.body)
        self._idle: list[_HttpConnection] = []
        self._open: set[_HttpConnection] = set()

    async def send(self, index: int) -> str | None:
        """Send request ``index`` and wait for the answer."""
        connection = None
        while self._idle and connection is None:
            connection = self._idle.pop()
            if not connection.is_open:  # the server closed it while it was idle
                self._drop(connection)
                connection = None
        if connection is None:
            try:
                connection = await self._connect()
            except OSError as exc:
                return f"{UNREACHABLE}: cannot connect to {self._address}: {exc.strerror or exc}"
        try:
            status, headers, body = await connection.request(self._payloads[index], self._timeout_s)
        except ConnectionError as exc:
            self._drop(connection)
            return f"{UNREACHABLE}: {exc}"
        except TimeoutError as exc:
            self._drop(connection)
            return f"ClientTimeoutError: {exc}"
        except BaseException:
            self._drop(connection)  # cancelled mid-request: the connection's next answer would be this one's
            raise
        if connection.reusable:
            self._idle.append(connection)
        else:
            self._drop(connection)
        if status == 200:
            return None
        return error_text(error_of(status, headers, body))

    def _drop(self, connection: _HttpConnection) -> None:
        connection.close()
        self._open.discard(connection)

    async def _connect(self) -> _HttpConnection:
        loop = asyncio.get_running_loop()
        tls = self._address.tls
        opening = loop.create_connection(
            _HttpConnection,
            self._address.host,
            self._address.port,
            ssl=tls.ssl_context() if tls is not None else None,
            server_hostname=self._address.host if tls is not None else None,
        )
        try:
            _, connection = await asyncio.wait_for(opening, self._timeout_s)
        except asyncio.TimeoutError:
            raise OSError(f"no connection within {self._timeout_s:g} s") from None
        self._open.add(connection)
        return connection

    async def close(self) -> None:
        """Close every connection."""
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()


class _HttpConnection(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time; the answer is parsed as it arrives."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[tuple[int, dict[str, str], bytes]] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"the server sent an answer that is not HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(ConnectionResetError("the server closed the connection before answering"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if not self._parser.should_keep_alive():
            self.reusable = False
        status = self._parser.get_status_code()
        headers, body = self._headers, b"".join(self._body)
        self._headers, self._body = {}, []
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((status, headers, body))

    async def request(self, payload: bytes, timeout_s: float) -> tuple[int, dict[str, str], bytes]:
        """Write ``payload`` (a whole request) and wait for the answer's status, headers and body."""
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[tuple[int, dict[str, str], bytes]] = loop.create_future()
        self._waiter = waiter
        self._transport.write(payload)
        timer = loop.call_later(timeout_s, self._time_out, waiter, timeout_s)
        try:
            return await waiter
        finally:
            timer.cancel()

    @property
    def is_open(self) -> bool:
        """Whether the connection can carry a request."""
        return self.reusable and self._transport is not None and not self._transport.is_closing()

    def _time_out(self, waiter: asyncio.Future[tuple[int, dict[str, str], bytes]], timeout_s: float) -> None:
        if not waiter.done():
            self.reusable = False
            waiter.set_exception(TimeoutError(f"no answer within {timeout_s:g} s"))

    def _fail(self, error: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def close(self) -> None:
        """Close the connection."""
        self.reusable = False
        if self._transport is not None:
            self._transport.close()


class GrpcSender:
    """gRPC ``ModelInfer`` on one grpc.aio channel (HTTP/2 carries every request in flight)."""

    def __init__(
        self, address: ServerAddress, requests: Sequence[InferRequest], headers: Mapping[str, str], timeout_s: float
    ) -> None:
        codec = GrpcCodec(headers)
        self._calls: list[GrpcCall[None]] = []
        for request in requests:
            call = codec.infer(request)
            self._calls.append(GrpcCall(call.what, False, False, call.method, call.request, _unread, call.metadata))
        self._transport = AsyncGrpcTransport(address)
        self._timeout_s = timeout_s

    async def send(self, index: int) -> str | None:
        """Send request ``index`` and wait for the answer."""
        try:
            await self._transport.run(self._calls[index], self._timeout_s)
        except PyServeError as exc:
            return error_text(exc)
        return None

    async def close(self) -> None:
        """Close the channel."""
        await self._transport.close()


def _unread(data: bytes) -> None:
    return None
