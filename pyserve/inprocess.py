"""Calls to a running ``Serve`` from its own process, without HTTP or gRPC: ``Serve.infer`` and its variants.

A call goes over a channel (``pyserve.worker.bls_channel``): a ZeroMQ socket to the core with a shared-memory pool
for large inputs, speaking the BLS messages an instance uses to call other models; the core schedules the call like
any request (batching, priorities, statistics, errors), and the outputs come back as numpy arrays.

Blocking calls borrow a channel from a pool for the length of the call (a stream: until it ends or is closed), so a
threaded web server that starts a thread per connection or per request (Flask's) reuses a few sockets rather than
opening one per thread it ever ran. ``async`` calls use one channel per event loop thread, watched by that loop.

A channel's socket is used by one thread at a time (ZeroMQ sockets are not thread-safe), so ``close`` (the server
stops) closes only the channels nobody holds; a borrowed one is told why and closed by its borrower when the call
ends, an async one by its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import numpy as np
import zmq

from pyserve.bls import AsyncResponses, Responses, single_response
from pyserve.errors import ModelNotReadyError
from pyserve.transport.shm import ShmPool, ShmReader
from pyserve.worker.bls_channel import BlsCall, BlsChannel

_STOPPED = "the server stopped: Serve.infer() needs a running Serve (run() or serve())"


class LocalCaller:
    """The in-process calls of one ``Serve`` start: a channel per calling thread, closed together by ``close``."""

    def __init__(self, router_address: str, shm_prefix: str, shm_threshold: int, shm_pool_bytes: int) -> None:
        self._router = router_address
        self._prefix = shm_prefix
        self._threshold = shm_threshold
        self._pool_bytes = shm_pool_bytes
        self._local = threading.local()
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._idle: list[BlsChannel] = []  # the pool of blocking calls' channels
        self._borrowed: set[BlsChannel] = set()
        self._async: dict[BlsChannel, asyncio.AbstractEventLoop | None] = {}  # each thread's async channel, its loop
        self._closed = False

    def channel(self) -> BlsChannel:
        """This thread's channel to the core for async calls (made on first use, on the running loop)."""
        channel: BlsChannel | None = getattr(self._local, "channel", None)
        if channel is None:
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:  # ainfer_stream() made outside a coroutine, to be iterated on a loop later
                loop = None
            with self._lock:
                channel = self._open()
                self._async[channel] = loop
            self._local.channel = channel
        return channel

    def borrow(self) -> BlsChannel:
        """A channel for one blocking call (from the pool, or a new one); give it back with ``give_back``."""
        with self._lock:
            channel = self._idle.pop() if self._idle else self._open()
            self._borrowed.add(channel)
        channel.adopt()
        return channel

    def give_back(self, channel: BlsChannel) -> None:
        """A borrowed channel's call is over: it serves the next one (or, the server stopped, is closed)."""
        with self._lock:
            self._borrowed.discard(channel)
            if not self._closed:
                self._idle.append(channel)
                return
        channel.close()

    def _open(self) -> BlsChannel:
        """A new channel (the lock held)."""
        if self._closed:
            raise ModelNotReadyError(_STOPPED)
        socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.connect(self._router)
        pool = ShmPool(f"{self._prefix}-local{next(self._numbers)}", self._pool_bytes)
        return BlsChannel(socket, pool, ShmReader(), self._threshold)

    def close(self) -> None:
        """The server is stopping: close the channels nobody holds now; calls under way fail with a clear error
        (``ModelNotReadyError``) and their channels are closed by the threads that hold them."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            borrowed = list(self._borrowed)
            async_channels, self._async = self._async, {}
        for channel in borrowed:
            channel.stop_reason = _STOPPED  # its call fails within one poll interval, and give_back closes it
        for channel in idle:
            channel.close()
        for channel, loop in async_channels.items():
            channel.stop_reason = _STOPPED
            _close_on(channel.loop or loop, channel)

    # calls ----------------------------------------------------------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, np.ndarray]:
        """One call; blocks until its outputs (or its error) arrive."""
        channel = self.borrow()
        try:
            call = self._start(channel, model, inputs, options, stream=False)
            try:
                channel.wait(call)
                return single_response(channel, call)
            finally:
                channel.abandon(call)
        finally:
            self.give_back(channel)

    async def ainfer(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, np.ndarray]:
        """One call, awaited on the running event loop."""
        channel = self.channel()
        call = self._start(channel, model, inputs, options, stream=False)
        try:
            await channel.wait_async(call)
            return single_response(channel, call)
        finally:
            channel.abandon(call)

    def infer_stream(self, model: str, inputs: Mapping[str, Any], **options: Any) -> Iterator[dict[str, np.ndarray]]:
        """The responses of a decoupled model, as they come."""
        channel = self.borrow()
        try:
            call = self._start(channel, model, inputs, options, stream=True)
        except BaseException:
            self.give_back(channel)
            raise
        return _BorrowedResponses(channel, call, self.give_back)

    def ainfer_stream(
        self, model: str, inputs: Mapping[str, Any], **options: Any
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """``infer_stream`` for ``async for``."""
        channel = self.channel()
        return AsyncResponses(channel, self._start(channel, model, inputs, options, stream=True))

    @staticmethod
    def _start(
        channel: BlsChannel, model: str, inputs: Mapping[str, Any], options: dict[str, Any], *, stream: bool
    ) -> BlsCall:
        return channel.start(
            model,
            inputs,
            version=options.get("version"),
            outputs=options.get("outputs"),
            parameters=options.get("parameters"),
            timeout_s=options.get("timeout_s"),
            request_id=options.get("request_id", ""),
            stream=stream,
        )


def _close_on(loop: asyncio.AbstractEventLoop | None, channel: BlsChannel) -> None:
    """Close an async channel on the event loop that uses it; at once when it has none (or a closed one), since
    then no coroutine can be using it."""
    if loop is not None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(channel.close)
            return
    channel.close()


class _BorrowedResponses(Responses):
    """A stream over a borrowed channel: the channel goes back to the pool once the stream ends or is closed."""

    def __init__(self, channel: BlsChannel, call: BlsCall, give_back: Callable[[BlsChannel], None]) -> None:
        super().__init__(channel, call)
        self._borrowed: BlsChannel | None = channel
        self._give_back = give_back

    def __next__(self) -> dict[str, np.ndarray]:
        if self._borrowed is None:
            raise StopIteration
        self._borrowed.adopt()  # the iterating thread need not be the one that started the stream
        try:
            return super().__next__()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop iterating: withdraw the call if it is still running, and give the channel back."""
        channel, self._borrowed = self._borrowed, None
        if channel is not None:
            super().close()
            self._give_back(channel)

    def __del__(self) -> None:
        # Dropped without being closed: withdraw the call, unless the server (and its sockets) is already gone.
        with contextlib.suppress(Exception):
            self.close()
