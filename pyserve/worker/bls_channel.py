"""The worker side of BLS: calls from inside an infer function, over the instance's own socket.

While its function runs, an instance receives no batches (the core sends one batch at a time to an idle instance),
so the thread running the function may use the instance's DEALER socket itself: it sends ``bls`` requests and
reads the replies, handling what else arrives meanwhile (``free`` for its pool) and keeping any other message for
the instance loop. A sync call waits by polling the socket; an ``async`` one registers the socket with the
function's event loop (same thread) and awaits a future. Both go through ``BlsChannel.start`` and
``BlsChannel.take``: the request and response handling exists once.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from pyserve.dtypes import datatype_of
from pyserve.errors import (
    CancelledError,
    ConfigError,
    InferenceError,
    InvalidInputError,
    ModelNotReadyError,
    RequestTimeoutError,
)
from pyserve.request import CancelFlag
from pyserve.transport.messages import FrameWriter, array_from_buffer, pack_header, read_buffer, unpack_header
from pyserve.transport.protocol import (
    BlsCancel,
    BlsFree,
    BlsRequest,
    BlsResponse,
    FreeSlots,
    MessageKind,
    TensorDescriptor,
    kind_of,
)
from pyserve.transport.shm import ShmPool, ShmReader

_POLL_MS = 50  # how often a waiting call looks at cancellation, stop and its own timeout

Outputs = dict[str, np.ndarray]


@dataclass(eq=False)
class BlsCall:
    """One call in flight: its responses as they arrive (an error ends it)."""

    call_id: int
    model: str
    stream: bool
    deadline: float  # time.monotonic() by which the caller stops waiting; 0: none of its own
    slots: list[str]  # the caller's pool slots holding the request's inputs, freed once it is answered
    responses: deque[Outputs | InferenceError] = field(default_factory=deque)
    final: bool = False
    waiter: asyncio.Future[None] | None = None


class BlsChannel:
    """The BLS calls of one instance. Only the thread running the instance's function may use it."""

    def __init__(self, socket: zmq.Socket[Any], pool: ShmPool, reader: ShmReader, shm_threshold: int) -> None:
        self._socket = socket
        self._pool = pool
        self._reader = reader
        self._threshold = shm_threshold
        self._ids = itertools.count(1)
        self._calls: dict[int, BlsCall] = {}
        self._thread = threading.get_ident()
        self._flags: list[CancelFlag] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._should_stop: Callable[[], bool] = lambda: False
        self.deferred: deque[list[Any]] = deque()  # messages for the instance loop, read while a call waited
        self.stopping = False
        # Set by the in-process caller when its server stops (pyserve.inprocess): a waiting call fails with it, and
        # once the channel is closed every use does, instead of touching a closed socket.
        self.stop_reason = ""
        self.closed = False

    # the instance loop's side -----------------------------------------------------------------------------------

    def enter(self, flags: list[CancelFlag], should_stop: Callable[[], bool]) -> contextvars.Token[Any]:
        """The function is about to run a batch whose requests have these cancel flags."""
        self._thread = threading.get_ident()
        self._flags = flags
        self._should_stop = should_stop
        return _CHANNEL.set(self)

    def leave(self, token: contextvars.Token[Any]) -> None:
        """The function returned: withdraw the calls it left unfinished, stop watching the socket."""
        _CHANNEL.reset(token)
        for call in list(self._calls.values()):
            self.abandon(call)
        if self._loop is not None:
            if not self._loop.is_closed():
                self._loop.remove_reader(self._socket.fileno())
            self._loop = None
        self._flags = []

    def adopt(self) -> None:
        """The calling thread takes the channel over (an in-process caller's pooled channel moves between threads;
        the lock that hands it over orders the socket's use)."""
        self._thread = threading.get_ident()

    def on_late_response(self, response: BlsResponse, frames: list[Any]) -> None:
        """A ``bls_res`` the instance loop read: a late reply to a call already given up (its slots are freed)."""
        self._on_response(response, frames)

    # calls ------------------------------------------------------------------------------------------------------

    def start(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: int | None,
        outputs: list[str] | None,
        parameters: Mapping[str, Any] | None,
        timeout_s: float | None,
        request_id: str,
        stream: bool,
    ) -> BlsCall:
        """Send a call to the core."""
        self._check_open()
        if threading.get_ident() != self._thread:
            raise RuntimeError("pyserve BLS calls must be made from the thread running the infer function")
        if not isinstance(model, str) or not model:
            raise InvalidInputError(f"BLS call: model must be a model name, got {model!r}")
        writer = FrameWriter(self._pool, self._threshold)
        descriptors: list[TensorDescriptor] = []
        try:
            for name, value in inputs.items():
                array = value if isinstance(value, np.ndarray) else np.asarray(value)
                try:
                    datatype = datatype_of(array.dtype)
                except ConfigError as exc:
                    raise InvalidInputError(f"BLS call to model '{model}': input '{name}': {exc}") from None
                descriptors.append([name, datatype, list(array.shape), writer.add_array(array)])
        except BaseException:
            for slot in writer.slots:
                self._pool.release(slot)
            raise
        call_id = next(self._ids)
        header = BlsRequest.build(
            call_id,
            model,
            version,
            descriptors,
            dict(parameters or {}),
            list(outputs or ()),
            request_id,
            stream,
            int(timeout_s * 1e6) if timeout_s else 0,
        )
        deadline = time.monotonic() + timeout_s if timeout_s else 0.0
        call = BlsCall(call_id, model, stream, deadline, writer.slots)
        self._calls[call_id] = call
        self._socket.send_multipart([pack_header(header), *writer.frames], copy=False)
        if self._loop is not None:
            if self._loop.is_closed():
                self._loop = None  # the loop an async call ran on is gone (Serve.ainfer under asyncio.run)
            else:
                # Sending can consume the edge that announced pending input: look again soon.
                self._loop.call_soon(self._drain)
        return call

    def take(self, call: BlsCall) -> Outputs | None:
        """The next response of a call, or None once it has no more. Raises the call's error."""
        if not call.responses:
            return None
        item = call.responses.popleft()
        if isinstance(item, InferenceError):
            raise item
        return item

    def wait(self, call: BlsCall) -> None:
        """Block until the call has a response or has ended."""
        self._check_open()
        while not call.responses and not call.final:
            self._check(call)
            if self._socket.poll(self._poll_ms(call), zmq.POLLIN):
                self._drain()

    async def wait_async(self, call: BlsCall) -> None:
        """Wait on the running event loop until the call has a response or has ended."""
        loop = asyncio.get_running_loop()
        self._check_open()
        if self._loop is not loop:
            loop.add_reader(self._socket.fileno(), self._drain)
            self._loop = loop
        self._drain()
        while not call.responses and not call.final:
            self._check(call)
            call.waiter = loop.create_future()
            try:
                await asyncio.wait([call.waiter], timeout=self._poll_ms(call) / 1000)
            finally:
                call.waiter = None
            self._drain()

    def abandon(self, call: BlsCall) -> None:
        """The caller no longer waits for this call: withdraw it (its later replies are dropped)."""
        if self._calls.pop(call.call_id, None) is not None and not call.final and not self.closed:
            self._socket.send(pack_header(BlsCancel.build(call.call_id)))
        call.final = True
        if not self.closed:
            self._free_inputs(call)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop watching the socket (async calls), if any."""
        return self._loop

    def close(self) -> None:
        """Close the socket, the pool and the reader (by the thread that uses the channel); later use raises."""
        if self.closed:
            return
        self.closed = True
        self.stopping = True
        if self._loop is not None:
            if not self._loop.is_closed():
                self._loop.remove_reader(self._socket.fileno())
            self._loop = None
        for call in self._calls.values():
            if call.waiter is not None and not call.waiter.done():
                call.waiter.set_result(None)  # the waiting coroutine wakes and fails with stop_reason
        self._socket.close(linger=0)
        self._reader.close()
        self._pool.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ModelNotReadyError(self.stop_reason or "the channel to the core is closed")

    # internals --------------------------------------------------------------------------------------------------

    def _poll_ms(self, call: BlsCall) -> int:
        if not call.deadline:
            return _POLL_MS
        return max(0, min(_POLL_MS, int((call.deadline - time.monotonic()) * 1000) + 1))

    def _check(self, call: BlsCall) -> None:
        """Give up a call whose caller is cancelled, whose instance is stopping or whose timeout has passed."""
        error: InferenceError | None = None
        if self.closed or self.stop_reason:
            error = ModelNotReadyError(f"call to model '{call.model}': {self.stop_reason or 'the channel is closed'}")
        elif self._flags and all(flag.is_set() for flag in self._flags):
            error = CancelledError(f"BLS call to model '{call.model}': the request that made it was cancelled")
        elif self.stopping or self._should_stop():
            error = ModelNotReadyError(f"BLS call to model '{call.model}': the instance is stopping")
        elif call.deadline and time.monotonic() >= call.deadline:
            error = RequestTimeoutError(f"BLS call to model '{call.model}' did not finish within its timeout")
        if error is not None:
            self.abandon(call)
            raise error

    def _drain(self) -> None:
        socket = self._socket
        while not self.closed and int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            header = unpack_header(frames[0].buffer)
            kind = kind_of(header)
            if kind == MessageKind.BLS_RESPONSE:
                self._on_response(BlsResponse(header), frames[1:])
            elif kind == MessageKind.FREE:
                for name in FreeSlots(header).slots:
                    self._pool.release(name)
            else:
                if kind == MessageKind.STOP:
                    self.stopping = True
                self.deferred.append(frames)

    def _on_response(self, response: BlsResponse, frames: list[Any]) -> None:
        call = self._calls.get(response.call_id)
        lease = response.lease
        try:
            if call is None:
                return  # given up: nothing to read
            error = response.error
            if error is not None:
                call.responses.append(error)
                call.final = True
            else:
                outputs: Outputs = {}
                try:
                    for name, datatype, shape, loc in response.outputs:
                        array = array_from_buffer(read_buffer(loc, frames, self._reader), datatype, shape, name)
                        # Inline frames belong to this message; shared-memory slots go back to their owner below.
                        outputs[name] = array if isinstance(loc, int) or datatype == "BYTES" else array.copy()
                except (OSError, ValueError, InferenceError) as exc:  # e.g. the slot's owner died meanwhile
                    error = InferenceError(f"BLS call to model '{call.model}': could not read its response: {exc}")
                    call.responses.append(error)
                    call.final = True
                    if not response.final:
                        self._socket.send(pack_header(BlsCancel.build(call.call_id)))
                else:
                    call.final = response.final
                    if outputs or not (call.stream and call.final):
                        call.responses.append(outputs)
            if call.final:
                self._calls.pop(call.call_id, None)
                self._free_inputs(call)
            if call.waiter is not None and not call.waiter.done():
                call.waiter.set_result(None)
        finally:
            if lease is not None:
                self._socket.send(pack_header(BlsFree.build(lease)))

    def _free_inputs(self, call: BlsCall) -> None:
        slots, call.slots = call.slots, []
        for slot in slots:
            self._pool.release(slot)


_CHANNEL: contextvars.ContextVar[BlsChannel] = contextvars.ContextVar("pyserve_bls_channel")


def current_channel(api: str) -> BlsChannel:
    """The channel of the infer function running in this thread (or task). Raises RuntimeError outside one."""
    try:
        return _CHANNEL.get()
    except LookupError:
        raise RuntimeError(
            f"{api} is only available inside a pyserve infer function, in the thread that runs it"
        ) from None
