"""Calls to a running ``Serve`` from its own process, without HTTP or gRPC: ``Serve.infer`` and its variants.

Each calling thread gets a ZeroMQ socket of its own to the core, with a shared-memory pool for large inputs, and
speaks the BLS messages an instance uses to call other models (``pyserve.worker.bls_channel``): the core schedules
the call like any request (batching, priorities, statistics, errors), and the outputs come back as numpy arrays.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import numpy as np
import zmq

from pyserve.bls import AsyncResponses, Responses, single_response
from pyserve.transport.shm import ShmPool, ShmReader
from pyserve.worker.bls_channel import BlsCall, BlsChannel


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
        self._opened: list[tuple[zmq.Socket[Any], ShmPool, ShmReader]] = []
        self._closed = False

    def channel(self) -> BlsChannel:
        """This thread's channel to the core (made on first use)."""
        channel: BlsChannel | None = getattr(self._local, "channel", None)
        if channel is not None:
            return channel
        with self._lock:
            if self._closed:
                raise RuntimeError("the server is stopped: Serve.infer() needs a running Serve (run() or serve())")
            socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.setsockopt(zmq.RCVHWM, 0)
            socket.connect(self._router)
            pool = ShmPool(f"{self._prefix}-local{next(self._numbers)}", self._pool_bytes)
            reader = ShmReader()
            self._opened.append((socket, pool, reader))
        channel = BlsChannel(socket, pool, reader, self._threshold)
        self._local.channel = channel
        return channel

    def close(self) -> None:
        """Close every thread's socket and pool (the server is stopping)."""
        with self._lock:
            self._closed = True
            opened, self._opened = self._opened, []
        for socket, pool, reader in opened:
            socket.close(linger=0)
            reader.close()
            pool.close()

    # calls ----------------------------------------------------------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, np.ndarray]:
        """One call; blocks until its outputs (or its error) arrive."""
        channel = self.channel()
        call = self._start(channel, model, inputs, options, stream=False)
        try:
            channel.wait(call)
            return single_response(channel, call)
        finally:
            channel.abandon(call)

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
        channel = self.channel()
        return Responses(channel, self._start(channel, model, inputs, options, stream=True))

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
