"""BLS (business logic scripting): call other models from inside an infer function.

::

    def pipeline(requests):
        out = []
        for request in requests:
            ids = pyserve.infer("tokenize", {"text": request["text"]})["ids"]
            out.append({"label": pyserve.infer("classify", {"ids": ids})["label"]})
        return out

The call goes from the instance to the core over the instance's own socket and is scheduled (and batched) like any
other request of the target model; its outputs come back as numpy arrays. ``ainfer`` is the same call for ``async
def`` functions, ``infer_stream`` / ``ainfer_stream`` iterate the responses of a decoupled (streaming) model.

Errors are raised in the caller as the ``PyServeError`` subclass the target answered with (``InvalidInputError``,
``ModelExecutionError``, ...). A call gets at most what is left of the deadline of the request being served (its
``timeout`` parameter, or a deadline the core set), or ``timeout_s`` if shorter, then raises
``RequestTimeoutError``. A call that could never run because the only instances able to serve it are waiting on it
(a model calling itself with one instance, two models calling each other) fails at once with ``DeadlockError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import numpy as np

from pyserve.worker.bls_channel import BlsCall, BlsChannel, current_channel

__all__ = ["ainfer", "ainfer_stream", "infer", "infer_stream"]


def infer(
    model: str,
    inputs: Mapping[str, Any],
    *,
    version: int | None = None,
    outputs: list[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
    request_id: str = "",
) -> dict[str, np.ndarray]:
    """Run ``model`` on ``inputs`` (name -> array, batch dimension included when the model batches) and return its
    outputs (all, or the ``outputs`` named). Only inside an infer function, in the thread running it."""
    channel = current_channel("pyserve.infer()")
    call = _start(channel, model, inputs, version, outputs, parameters, timeout_s, request_id, stream=False)
    try:
        channel.wait(call)
        return single_response(channel, call)
    finally:
        channel.abandon(call)


async def ainfer(
    model: str,
    inputs: Mapping[str, Any],
    *,
    version: int | None = None,
    outputs: list[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
    request_id: str = "",
) -> dict[str, np.ndarray]:
    """``infer`` for ``async def`` infer functions: other coroutines of the function run while it waits."""
    channel = current_channel("pyserve.ainfer()")
    call = _start(channel, model, inputs, version, outputs, parameters, timeout_s, request_id, stream=False)
    try:
        await channel.wait_async(call)
        return single_response(channel, call)
    finally:
        channel.abandon(call)


def infer_stream(
    model: str,
    inputs: Mapping[str, Any],
    *,
    version: int | None = None,
    outputs: list[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
    request_id: str = "",
) -> Iterator[dict[str, np.ndarray]]:
    """Call a decoupled (streaming) model and iterate its responses as they come. The request is sent at once;
    closing the iterator early (or leaving the function) withdraws it."""
    channel = current_channel("pyserve.infer_stream()")
    call = _start(channel, model, inputs, version, outputs, parameters, timeout_s, request_id, stream=True)
    return Responses(channel, call)


def ainfer_stream(
    model: str,
    inputs: Mapping[str, Any],
    *,
    version: int | None = None,
    outputs: list[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
    request_id: str = "",
) -> AsyncIterator[dict[str, np.ndarray]]:
    """``infer_stream`` for ``async def`` functions: ``async for response in pyserve.ainfer_stream(...)``."""
    channel = current_channel("pyserve.ainfer_stream()")
    call = _start(channel, model, inputs, version, outputs, parameters, timeout_s, request_id, stream=True)
    return AsyncResponses(channel, call)


def _start(
    channel: BlsChannel,
    model: str,
    inputs: Mapping[str, Any],
    version: int | None,
    outputs: list[str] | None,
    parameters: Mapping[str, Any] | None,
    timeout_s: float | None,
    request_id: str,
    *,
    stream: bool,
) -> BlsCall:
    return channel.start(
        model,
        inputs,
        version=version,
        outputs=outputs,
        parameters=parameters,
        timeout_s=timeout_s,
        request_id=request_id,
        stream=stream,
    )


def single_response(channel: BlsChannel, call: BlsCall) -> dict[str, np.ndarray]:
    """The one response of a call that is not streamed (raises its error)."""
    result = channel.take(call)
    if result is None:  # the core always answers a call with outputs or an error
        raise AssertionError(f"BLS call to model '{call.model}' ended without a response")
    return result


class Responses(Iterator[dict[str, np.ndarray]]):
    """The responses of a streaming BLS call."""

    def __init__(self, channel: BlsChannel, call: BlsCall) -> None:
        self._channel = channel
        self._call = call

    def __next__(self) -> dict[str, np.ndarray]:
        self._channel.wait(self._call)
        result = self._channel.take(self._call)
        if result is None:
            raise StopIteration
        return result

    def close(self) -> None:
        """Stop iterating: withdraw the call if it is still running."""
        self._channel.abandon(self._call)


class AsyncResponses(AsyncIterator[dict[str, np.ndarray]]):
    """The responses of a streaming BLS call, for ``async for``."""

    def __init__(self, channel: BlsChannel, call: BlsCall) -> None:
        self._channel = channel
        self._call = call

    async def __anext__(self) -> dict[str, np.ndarray]:
        await self._channel.wait_async(self._call)
        result = self._channel.take(self._call)
        if result is None:
            raise StopAsyncIteration
        return result

    async def aclose(self) -> None:
        """Stop iterating: withdraw the call if it is still running."""
        self._channel.abandon(self._call)
