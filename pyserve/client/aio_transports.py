"""asyncio transports: HTTP on an aiohttp session, gRPC on a grpc.aio channel (``calls.AsyncTransport``).

They behave as the blocking ones in ``transports`` (same retries, same errors) and are created on first use, on
the loop that uses them: a client belongs to one event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import grpc
import grpc.aio

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
from pyserve.client.model import ServerAddress
from pyserve.errors import ClientClosedError, ClientTimeoutError, ServerUnreachableError

_STREAM_CHUNK = 1 << 16


class AsyncHttpTransport:
    """HTTP/1.1 with a pool of kept-alive connections (aiohttp)."""

    def __init__(self, address: ServerAddress, connect_timeout_s: float, max_connections: int) -> None:
        self.address = address
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def run(self, call: Call[T], timeout_s: float) -> T:
        """Send an HttpCall; its parser reads the answer."""
        if not isinstance(call, HttpCall):
            raise TypeError(f"an HTTP transport cannot send {type(call).__name__}")
        parse: Callable[[int, Mapping[str, str], bytes], T] = call.parse
        connect_s = min(self._connect_timeout_s, timeout_s)
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_s)
        for attempt in (1, 2):
            try:
                async with self._client().request(
                    call.method,
                    self._url(call.path),
                    data=call.body or None,
                    headers=call.headers,
                    timeout=timeout,
                    allow_redirects=False,
                ) as response:
                    body = await response.read()
                    return parse(response.status, response.headers, body)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise ServerUnreachableError(str(self.address), exc.os_error) from None
                # A dead kept-alive connection: nothing was answered, so sending once more runs it at most once.
                if attempt == 1:
                    continue
                raise ServerUnreachableError(str(self.address), f"{call.what}: {exc}") from None
            except aiohttp.ConnectionTimeoutError:
                raise ClientTimeoutError(timeout_message(f"connecting to {self.address}", connect_s)) from None
            except asyncio.TimeoutError:
                raise ClientTimeoutError(timeout_message(call.what, timeout_s)) from None
        raise AssertionError("unreachable")

    async def stream(self, call: StreamCall[T], timeout_s: float) -> AsyncIterator[T]:
        """Send an HttpStreamCall; yield each event's parsed data, each within ``timeout_s``."""
        if not isinstance(call, HttpStreamCall):
            raise TypeError(f"an HTTP transport cannot stream {type(call).__name__}")
        response = await self._open_stream(call, timeout_s)
        complete = False
        try:
            if response.status != 200:
                raise call.parse_error(response.status, await response.read())
            reader = EventReader()
            while True:
                chunk = await self._next_chunk(response, call.what, timeout_s)
                for data in reader.feed(chunk) if chunk else reader.end():
                    yield call.parse_event(data)
                if not chunk:
                    complete = True
                    return
        finally:
            if complete:
                response.release()
            else:
                response.close()  # closing the connection cancels the request on the server

    async def close(self) -> None:
        """Close the session's connections; later calls raise ClientClosedError."""
        self._closed = True
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClientClosedError(f"the client of {self.address} is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections,
                    ssl=self.address.tls.ssl_context() if self.address.tls is not None else False,
                ),
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    def _url(self, path: str) -> str:
        return f"{self.address}{path}"

    async def _open_stream(self, call: HttpStreamCall[Any], timeout_s: float) -> aiohttp.ClientResponse:
        connect_s = min(self._connect_timeout_s, timeout_s)
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_s, sock_read=timeout_s)
        try:
            return await self._client().post(
                self._url(call.path), data=call.body, headers=call.headers, timeout=timeout, allow_redirects=False
            )
        except aiohttp.ClientConnectorError as exc:
            raise ServerUnreachableError(str(self.address), exc.os_error) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise ServerUnreachableError(str(self.address), f"{call.what}: {exc}") from None
        except aiohttp.ConnectionTimeoutError:
            raise ClientTimeoutError(timeout_message(f"connecting to {self.address}", connect_s)) from None
        except asyncio.TimeoutError:
            raise ClientTimeoutError(timeout_message(call.what, timeout_s, "response")) from None

    async def _next_chunk(self, response: aiohttp.ClientResponse, what: str, timeout_s: float) -> bytes:
        try:
            return await asyncio.wait_for(response.content.readany(), timeout_s)
        except asyncio.TimeoutError:
            raise ClientTimeoutError(timeout_message(what, timeout_s, "response")) from None
        except aiohttp.ClientPayloadError as exc:
            raise ServerUnreachableError(str(self.address), f"{what}: {exc}") from None


class AsyncGrpcTransport:
    """gRPC on one grpc.aio channel."""

    def __init__(self, address: ServerAddress) -> None:
        self.address = address
        self._channel: grpc.aio.Channel | None = None
        self._methods: dict[str, Callable[..., Any]] = {}
        self._closed = False

    async def run(self, call: Call[T], timeout_s: float) -> T:
        """Send a GrpcCall; its parser reads the answer."""
        if not isinstance(call, GrpcCall):
            raise TypeError(f"a gRPC transport cannot send {type(call).__name__}")
        grpc_call: GrpcCall[T] = call
        method = self._method(call.method, stream=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for attempt in (1, 2):
            try:
                data = await method(call.request, timeout=max(deadline - loop.time(), 0.0), metadata=call.metadata)
                return grpc_call.parse(data)
            except grpc.aio.AioRpcError as exc:
                error = rpc_error(exc, call.what, timeout_s, self.address, call.repository)
                if isinstance(error, ServerUnreachableError) and attempt == 1 and await self._reconnected(deadline):
                    continue
                return answer_or_raise(grpc_call, error)
        raise AssertionError("unreachable")

    async def stream(self, call: StreamCall[T], timeout_s: float) -> AsyncIterator[T]:
        """Send a GrpcStreamCall; yield each response, each within ``timeout_s``."""
        if not isinstance(call, GrpcStreamCall):
            raise TypeError(f"a gRPC transport cannot stream {type(call).__name__}")
        method = self._method(call.method, stream=True)
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            responses = method(iter((call.request,)), metadata=call.metadata)
            try:
                started = False
                while True:
                    try:
                        message = await asyncio.wait_for(responses.read(), timeout_s)
                    except asyncio.TimeoutError:
                        raise ClientTimeoutError(timeout_message(call.what, timeout_s, "response")) from None
                    except grpc.aio.AioRpcError as exc:
                        error = rpc_error(exc, call.what, timeout_s, self.address)
                        unreachable = isinstance(error, ServerUnreachableError) and attempt == 1 and not started
                        if unreachable and await self._reconnected(loop.time() + RECONNECT_GRACE_S):
                            break  # nothing came back: send it once more

                        raise error from None
                    if message is grpc.aio.EOF:
                        return
                    started = True
                    outputs, final = call.parse(message)
                    if outputs is not None:
                        yield outputs
                    if final:
                        return
            finally:
                responses.cancel()

    async def close(self) -> None:
        """Close the channel (cancelling its calls); later calls raise ClientClosedError."""
        self._closed = True
        if self._channel is not None:
            await self._channel.close()

    async def _reconnected(self, deadline: float) -> bool:
        """Whether the channel connects again before ``deadline`` (at most RECONNECT_GRACE_S from now)."""
        if self._channel is None:
            return False
        wait = min(deadline - asyncio.get_running_loop().time(), RECONNECT_GRACE_S)
        try:
            await asyncio.wait_for(self._channel.channel_ready(), max(wait, 0.0))
        except asyncio.TimeoutError:
            return False
        return True

    def _method(self, name: str, stream: bool) -> Callable[..., Any]:
        if self._closed:
            raise ClientClosedError(f"the client of {self.address} is closed")
        method = self._methods.get(name)
        if method is None:
            if self._channel is None:
                self._channel = grpc_channel(self.address, aio=True)
            method = self._channel.stream_stream(name) if stream else self._channel.unary_unary(name)
            self._methods[name] = method
        return method
