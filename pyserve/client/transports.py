"""Blocking transports: HTTP with a pool of kept-alive connections, gRPC on a grpcio channel (``calls.Transport``).

Both are safe to share between threads and connect on first use. A kept-alive connection the server closed (it
restarted, or dropped an idle connection) is replaced before it is used; a call that meets a closed connection
anyway is sent once more when nothing of it can have run twice: any idempotent call, and an infer the server
closed the connection on before answering anything.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import grpc

from pyserve.client.calls import (
    Call,
    GrpcCall,
    GrpcStreamCall,
    HttpCall,
    HttpStreamCall,
    StreamCall,
    T,
    timeout_message,
)
from pyserve.client.grpc_codec import RECONNECT_GRACE_S, answer_or_raise, grpc_channel, rpc_error
from pyserve.client.http_codec import EventReader
from pyserve.client.http_connection import ConnectionDropped, HttpConnection
from pyserve.client.model import ServerAddress
from pyserve.errors import ClientClosedError, ClientTimeoutError, ServerUnreachableError

R = TypeVar("R")
_STREAM_CHUNK = 1 << 16


class HttpTransport:
    """HTTP/1.1 with a pool of kept-alive connections (``http_connection``)."""

    def __init__(self, address: ServerAddress, connect_timeout_s: float, max_connections: int) -> None:
        self.address = address
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_connections
        self._idle: collections.deque[HttpConnection] = collections.deque()
        self._closed = False

    def run(self, call: Call[T], timeout_s: float) -> T:
        """Send an HttpCall; its parser reads the answer."""
        if not isinstance(call, HttpCall):
            raise TypeError(f"an HTTP transport cannot send {type(call).__name__}")
        parse: Callable[[int, Mapping[str, str], bytes], T] = call.parse
        for attempt in (1, 2):
            connection = self._send(call.what, call.method, call.path, call.body, call.headers, timeout_s)
            try:
                status, headers, body = connection.read_response(timeout_s)
            except TimeoutError:
                connection.close()
                raise ClientTimeoutError(timeout_message(call.what, timeout_s)) from None
            except OSError as exc:
                connection.close()
                # A kept-alive connection the server closed: the request never ran, or ran without answering.
                if attempt == 1 and (call.idempotent or isinstance(exc, ConnectionDropped)):
                    continue
                raise ServerUnreachableError(str(self.address), f"{call.what}: {exc}") from None
            self._release(connection)
            return parse(status, headers, body)
        raise AssertionError("unreachable")

    def stream(self, call: StreamCall[T], timeout_s: float) -> Iterator[T]:
        """Send an HttpStreamCall; yield each event's parsed data, each within ``timeout_s``."""
        if not isinstance(call, HttpStreamCall):
            raise TypeError(f"an HTTP transport cannot stream {type(call).__name__}")
        connection = self._send(call.what, "POST", call.path, call.body, call.headers, timeout_s)
        complete = False
        try:
            status, _, chunks = self._read(lambda: connection.read_stream(timeout_s), call.what, timeout_s)
            if status != 200:
                raise call.parse_error(status, b"".join(self._read(lambda: list(chunks), call.what, timeout_s)))
            reader = EventReader()
            while True:
                chunk = self._read(lambda: next(chunks, b""), call.what, timeout_s)
                for data in reader.feed(chunk) if chunk else reader.end():
                    yield call.parse_event(data)
                if not chunk:
                    complete = True
                    self._release(connection)
                    return
        finally:
            if not complete:
                connection.close()  # closing the connection cancels the request on the server

    def close(self) -> None:
        """Close the idle connections; later calls raise ClientClosedError."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    def _send(
        self, what: str, method: str, path: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> HttpConnection:
        """A connection with the request written (a kept-alive one where one is idle, else a new one)."""
        if self._closed:
            raise ClientClosedError(f"the client of {self.address} is closed")
        for attempt in (1, 2):
            connection = self._idle_connection() if attempt == 1 else None
            if connection is None:
                connection = self._connect(timeout_s)
            try:
                connection.send(method, path, body, headers, timeout_s)
                return connection
            except TimeoutError:
                connection.close()
                raise ClientTimeoutError(timeout_message(what, timeout_s)) from None
            except OSError as exc:
                connection.close()  # the server closed it while idle: nothing was received, send it anew
                if attempt == 2:
                    raise ServerUnreachableError(str(self.address), f"{what}: {exc}") from None
        raise AssertionError("unreachable")

    def _connect(self, timeout_s: float) -> HttpConnection:
        connect_s = min(self._connect_timeout_s, timeout_s)
        try:
            tls = self.address.tls.ssl_context() if self.address.tls is not None else None
            return HttpConnection(self.address.host, self.address.port, connect_s, tls)
        except TimeoutError:
            raise ClientTimeoutError(
                timeout_message(f"connecting to {self.address}", connect_s, "connection")
            ) from None
        except OSError as exc:
            raise ServerUnreachableError(str(self.address), exc) from None

    def _idle_connection(self) -> HttpConnection | None:
        """A kept-alive connection still open; one the server closed meanwhile goes."""
        while True:
            try:
                connection = self._idle.pop()
            except IndexError:
                return None
            if not connection.is_dropped():
                return connection
            connection.close()

    def _release(self, connection: HttpConnection) -> None:
        if not connection.keep_alive or self._closed or len(self._idle) >= self._max_idle:
            connection.close()
        else:
            self._idle.append(connection)

    def _read(self, read: Callable[[], R], what: str, timeout_s: float) -> R:
        try:
            return read()
        except TimeoutError:
            raise ClientTimeoutError(timeout_message(what, timeout_s, "response")) from None
        except OSError as exc:
            raise ServerUnreachableError(str(self.address), f"{what}: {exc}") from None


class GrpcTransport:
    """gRPC on one grpcio channel (HTTP/2: every call of every thread on one connection)."""

    def __init__(self, address: ServerAddress) -> None:
        self.address = address
        self._channel: grpc.Channel | None = None
        self._methods: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def run(self, call: Call[T], timeout_s: float) -> T:
        """Send a GrpcCall; its parser reads the answer."""
        if not isinstance(call, GrpcCall):
            raise TypeError(f"a gRPC transport cannot send {type(call).__name__}")
        grpc_call: GrpcCall[T] = call
        method = self._method(call.method, stream=False)
        deadline = time.monotonic() + timeout_s
        for attempt in (1, 2):
            try:
                data = method(call.request, timeout=max(deadline - time.monotonic(), 0.0), metadata=call.metadata)
                return grpc_call.parse(data)
            except grpc.RpcError as exc:
                error = rpc_error(exc, call.what, timeout_s, self.address, call.repository)
                if isinstance(error, ServerUnreachableError) and attempt == 1 and self._reconnected(deadline):
                    continue
                return answer_or_raise(grpc_call, error)
        raise AssertionError("unreachable")

    def stream(self, call: StreamCall[T], timeout_s: float) -> Iterator[T]:
        """Send a GrpcStreamCall; yield each response, each within ``timeout_s``. A thread reads the stream, as
        grpcio's blocking iterator has no timeout of its own."""
        if not isinstance(call, GrpcStreamCall):
            raise TypeError(f"a gRPC transport cannot stream {type(call).__name__}")
        method = self._method(call.method, stream=True)
        for attempt in (1, 2):
            responses = method(iter((call.request,)), metadata=call.metadata)
            received: queue.SimpleQueue[Any] = queue.SimpleQueue()
            threading.Thread(
                target=_read_stream, args=(responses, received), name="pyserve-client-stream", daemon=True
            ).start()
            started = False
            try:
                while True:
                    try:
                        item = received.get(timeout=timeout_s)
                    except queue.Empty:
                        raise ClientTimeoutError(timeout_message(call.what, timeout_s, "response")) from None
                    if isinstance(item, grpc.RpcError):
                        error = rpc_error(item, call.what, timeout_s, self.address)
                        unreachable = isinstance(error, ServerUnreachableError) and attempt == 1 and not started
                        if unreachable and self._reconnected(time.monotonic() + RECONNECT_GRACE_S):
                            break  # nothing came back: send it once more

                        raise error
                    if item is None:
                        return
                    started = True
                    outputs, final = call.parse(item)
                    if outputs is not None:
                        yield outputs
                    if final:
                        return
            finally:
                responses.cancel()

    def close(self) -> None:
        """Close the channel (cancelling its calls); later calls raise ClientClosedError."""
        with self._lock:
            self._closed = True
            if self._channel is not None:
                self._channel.close()

    def _reconnected(self, deadline: float) -> bool:
        """Whether the channel connects again before ``deadline`` (at most RECONNECT_GRACE_S from now)."""
        channel = self._channel
        if channel is None:
            return False
        wait = min(deadline - time.monotonic(), RECONNECT_GRACE_S)
        try:
            grpc.channel_ready_future(channel).result(timeout=max(wait, 0.0))
        except grpc.FutureTimeoutError:
            return False
        return True

    def _method(self, name: str, stream: bool) -> Callable[..., Any]:
        with self._lock:
            if self._closed:
                raise ClientClosedError(f"the client of {self.address} is closed")
            method = self._methods.get(name)
            if method is None:
                if self._channel is None:
                    self._channel = grpc_channel(self.address)
                # No serializers: calls carry bytes both ways, the codec builds and reads them.
                method = self._channel.stream_stream(name) if stream else self._channel.unary_unary(name)
                self._methods[name] = method
            return method


def _read_stream(responses: Iterator[bytes], received: queue.SimpleQueue[Any]) -> None:
    try:
        for message in responses:
            received.put(message)
        received.put(None)
    except grpc.RpcError as exc:
        received.put(exc)
