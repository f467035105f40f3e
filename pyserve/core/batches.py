"""Batches in flight: a scheduler's batch sent to an instance, until the instance's final result for it.

``dispatch`` lays a batch's inputs out for the worker (each input's rows end to end, in a shared-memory slot or a
ZeroMQ frame; see ``FrameWriter``) and sends it as one ``infer`` message. ``on_result`` reads a ``res`` message:
the outputs of each request, which stay in the worker's slots until every holder of the response lets go of them
(then the worker hears ``free``), or the batch's error. A final result frees the batch's input slots, hands the
instance its next batch before the answers are encoded, and records the batch's statistics.

A request of a running batch that is cancelled is told to the instance through the cancel publisher
(``cancel_running``); a batch on an instance that goes away fails with the instance's error (``fail_on``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import zmq

from pyserve.core.inference import BufferLease, InferenceRequest, InferenceResponse, Instance, ModelEntry, OutputTensor
from pyserve.core.remote_peers import remote_cancel_identity
from pyserve.core.request_flow import fail, respond
from pyserve.core.stage_times import StageTimes
from pyserve.core.stats import BACKEND, CANCELED, OTHER
from pyserve.core.tracing import Tracing
from pyserve.errors import InferenceError, RequestTimeoutError
from pyserve.transport.messages import FrameWriter, Loc, pack_header, read_buffer
from pyserve.transport.protocol import MERGED, BatchResult, CancelNotice, FreeSlots, Header, InferBatch
from pyserve.transport.shm import LARGE_SLOT_BYTES, ShmPool, ShmReader


class Send(Protocol):
    """How the core sends to a worker (``CoreServer._send``); ``spin=False``: no polling for a reply afterwards."""

    def __call__(self, identity: bytes, header: Header, frames: list[Any] | None = None, spin: bool = True) -> None:
        """Send ``header`` and ``frames`` to the worker ``identity``."""
        ...


@dataclass(slots=True, eq=False)
class PendingBatch:
    """A batch sent to an instance, until its final response."""

    requests: list[InferenceRequest]
    instance: Instance
    entry: ModelEntry
    slots: list[str]
    rows: int
    dispatched_ns: int
    # ModelConfig.execution_timeout_s: the timer that fails the batch when its instance takes too long.
    timer: asyncio.TimerHandle | None = None
    timed_out: bool = False


class BatchesInFlight:
    """Sends batches to instances and answers their requests from the results.

    ``pool`` holds the inputs laid out for workers (from ``shm_threshold_bytes``); ``reader`` maps the workers'
    output slots; ``connected`` is the core's map of connected instances (identity -> (instance, model version,
    shm prefix)): results and frees are only for instances still in it. ``send(identity, header, frames)`` sends
    a message to an instance. ``stage_times`` stamps the batch's requests when it is sent and answered (None: off).
    """

    def __init__(
        self,
        pool: ShmPool,
        reader: ShmReader,
        shm_threshold_bytes: int,
        tracing: Tracing,
        connected: Mapping[bytes, tuple[Instance, ModelEntry, str]],
        send: Send,
        stage_times: StageTimes | None = None,
    ) -> None:
        self.pending: dict[int, PendingBatch] = {}
        self._pool = pool
        self._reader = reader
        self._threshold = shm_threshold_bytes
        self._tracing = tracing
        self._connected = connected
        self._send = send
        self._stage_times = stage_times
        self._next_batch_id = 0
        self._cancel_socket: zmq.Socket[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cancel_address = ""
        # What to do with an instance whose batch ran past its execution timeout (WorkerControl.on_hung).
        self.on_hung: Callable[[Instance, str], None] = lambda instance, why: None

    # cancel publisher ---------------------------------------------------------------------------------------------

    def start_cancel_publisher(self, router_address: str, loop: asyncio.AbstractEventLoop) -> None:
        """Bind the socket that tells instances which requests of their batch were cancelled, next to the worker
        socket (its address is ``cancel_address``: instances get it when they start, and in their ``welcome``).

        It is an XPUB socket: each new subscription is answered with a sync message, which tells the subscriber
        that it is connected and will hear every cancel from now on (a plain PUB drops what it publishes before a
        subscription arrives, so a request cancelled just after its instance started could go unnoticed).
        """
        socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.XPUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription is seen, not only a topic's first
        if router_address.startswith("ipc://"):
            socket.bind(router_address.rsplit("/", 1)[0] + "/cancel.sock")
        else:
            socket.bind(router_address.rsplit(":", 1)[0] + ":*")
        self.cancel_address = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._cancel_socket = socket
        self._loop = loop
        loop.add_reader(socket.fileno(), self._on_subscriptions)

    def _on_subscriptions(self) -> None:
        socket = self._cancel_socket
        if socket is None:
            return
        # Edge-triggered like every ZeroMQ FD: read until EVENTS says nothing is left.
        while int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            event = socket.recv(zmq.NOBLOCK)
            if event[:1] == b"\x01":
                socket.send(pack_header(CancelNotice.build_sync()))

    def cancel_running(self, request: InferenceRequest) -> None:
        """A cancelled request that is in a running batch: tell its instance (it sees the request's cancel flag).

        A remote instance (``RemoteServe``, a Ray actor) does not hear the publisher, a socket on this host: its
        session's cancel socket (``<session>/cancel`` on the remote port) is told instead."""
        pending = self.pending.get(request.batch_id)
        if pending is None:
            return
        notice = CancelNotice.build(request.batch_id, [request.batch_index])
        if pending.instance.remote:
            self._send(remote_cancel_identity(pending.instance.identity), notice, None)
        elif self._cancel_socket is not None:
            self._cancel_socket.send(pack_header(notice))

    # batches ------------------------------------------------------------------------------------------------------

    def dispatch(self, batch: list[InferenceRequest], instance: Instance) -> None:
        """Send a batch to an idle instance (what a model's scheduler calls)."""
        entry = batch[0].model
        now = time.monotonic_ns()
        self._next_batch_id += 1
        batch_id = self._next_batch_id
        # A remote instance shares no memory with the core: everything goes in the frames.
        remote = instance.remote
        writer = FrameWriter(None if remote else self._pool, self._threshold)
        blocks: list[Any] = []
        head = batch[0]
        single = len(batch) == 1 and not remote
        if entry.batching:
            rows = 0
            for request in batch:
                rows += request.rows
            for name, tensor in head.inputs.items():
                if single and tensor.location is not None and tensor.nbytes >= LARGE_SLOT_BYTES:
                    loc = _in_client_segment(tensor.location, tensor.nbytes)
                else:
                    parts = [request.inputs[name].buffer() for request in batch]
                    nbytes = sum(memoryview(part).nbytes for part in parts)
                    loc = writer.add_parts(parts, nbytes)
                blocks.append([name, tensor.datatype, [rows, *tensor.shape[1:]], loc, MERGED])
        else:
            rows = 1
            for name, tensor in head.inputs.items():
                if tensor.location is not None and tensor.nbytes >= LARGE_SLOT_BYTES and not remote:
                    loc = _in_client_segment(tensor.location, tensor.nbytes)
                else:
                    loc = writer.add(tensor.buffer(), tensor.nbytes)
                blocks.append([name, tensor.datatype, tensor.shape, loc, 0])
        trace = self._tracing.on_dispatch(batch) if self._tracing.active else None
        requests = [[r.id, r.parameters, r.requested_outputs, r.rows] for r in batch]
        if head.sequence is None:
            header = InferBatch.build(batch_id, requests, blocks, trace)
        else:  # a stateful model's (pyserve.core.sequence_batcher)
            released, instance.released_sequences = instance.released_sequences, []
            sequences: list[Any] = [request.sequence for request in batch]
            header = InferBatch.build(batch_id, requests, blocks, trace, sequences, released)
        for index, request in enumerate(batch):
            request.batch_id = batch_id
            request.batch_index = index
        pending = self.pending[batch_id] = PendingBatch(batch, instance, entry, writer.slots, rows, now)
        timeout_s = entry.spec.config.execution_timeout_s
        if timeout_s is not None and self._loop is not None and not entry.spec.config.decoupled:
            pending.timer = self._loop.call_later(timeout_s, self._on_execution_timeout, batch_id, timeout_s)
        instance.batch_id = batch_id
        if self._stage_times is not None:
            self._stage_times.sent(batch)
        self._send(instance.identity, header, writer.frames, all(request.reply_spin for request in batch))

    def on_result(self, result: BatchResult, frames: list[Any]) -> None:
        """A ``res`` message: outputs (or the error) of a batch, final or one of a decoupled model's responses."""
        batch_id = result.batch_id
        final = result.final
        pending = self.pending.pop(batch_id, None) if final else self.pending.get(batch_id)
        if pending is None:
            return
        entry = pending.entry
        stats = entry.stats
        now = time.monotonic_ns()
        if final and pending.timer is not None:
            pending.timer.cancel()
        if pending.timed_out:
            # Its requests were failed at the timeout: the late result only frees the instance.
            if final:
                for name in pending.slots:
                    self._pool.release(name)
                if entry.scheduler is not None and pending.instance.identity in self._connected:
                    entry.scheduler.instance_done(pending.instance)
                if result.slots:
                    self._free_slots(pending.instance.identity, result.slots)
            return
        if final:
            pending.instance.batches_done += 1
            if self._stage_times is not None:
                self._stage_times.received(pending.requests, result.stage_times, now)
            for name in pending.slots:
                self._pool.release(name)
            # Hand the instance its next batch before answering this one: the worker computes while we encode.
            scheduler = entry.scheduler
            if scheduler is not None and pending.instance.identity in self._connected:
                scheduler.instance_done(pending.instance)
        error = result.error
        if error is not None:
            stats.record_failed_execution()
            decoupled = entry.spec.config.decoupled
            response_timings = result.response_timings
            for request in pending.requests:
                stats.record_failure(CANCELED if request.cancelled else BACKEND, now - request.arrival_ns)
                if decoupled:
                    stats.record_response(request, "fail", response_timings, now)
                respond(request, InferenceResponse([], error))
        else:
            per_request = result.outputs
            # Outputs in the worker's slots stay valid until every holder of the response lets go of them.
            slots = result.slots
            lease = BufferLease(partial(self._free_slots, pending.instance.identity, slots)) if slots else None
            decoupled = entry.spec.config.decoupled
            response_timings = result.response_timings if decoupled else None
            if per_request is not None:
                reader = self._reader
                for request, descriptors in zip(pending.requests, per_request, strict=True):
                    if descriptors is None:
                        continue
                    if decoupled:
                        stats.record_response(request, "success", response_timings, now)
                    outputs = [
                        OutputTensor(name, datatype, shape, read_buffer(loc, frames, reader), _shm_location(loc))
                        for name, datatype, shape, loc in descriptors
                    ]
                    respond(request, InferenceResponse(outputs, final=final, lease=lease))
            elif final:
                for request in pending.requests:
                    if decoupled and not request.cancelled:
                        stats.record_response(request, "empty", response_timings, now)
                    respond(request, InferenceResponse([], final=True))
            if final:
                timings = result.timings
                succeeded = stats.record_successes(pending.requests, pending.dispatched_ns, now, timings)
                stats.record_execution(pending.rows, succeeded, timings[0], timings[1], timings[2])
            if lease is not None:
                lease.drop()

    def _on_execution_timeout(self, batch_id: int, timeout_s: float) -> None:
        pending = self.pending.get(batch_id)
        if pending is None or pending.timed_out:
            return
        pending.timed_out = True
        pending.timer = None
        instance = pending.instance
        model = pending.entry.name
        error = RequestTimeoutError(
            f"model '{model}': instance {instance.index} did not finish the batch within its execution timeout "
            f"({timeout_s:g} s, ModelConfig.execution_timeout_s)"
        )
        stats = pending.entry.stats
        stats.record_failed_execution()
        now = time.monotonic_ns()
        for request in pending.requests:
            stats.record_failure(OTHER, now - request.arrival_ns)
            fail(request, error)
        self.on_hung(instance, f"{error}")

    def _free_slots(self, identity: bytes, slots: list[str]) -> None:
        if identity in self._connected:
            self._send(identity, FreeSlots.build(slots), None)

    # instances gone, shutdown -------------------------------------------------------------------------------------

    def fail_on(self, instance: Instance, error: InferenceError) -> None:
        """The instance went away: fail the requests of its batches (a failed execution of its model)."""
        for batch_id, pending in list(self.pending.items()):
            if pending.instance is instance:
                del self.pending[batch_id]
                if pending.timer is not None:
                    pending.timer.cancel()
                for name in pending.slots:
                    self._pool.release(name)
                stats = pending.entry.stats
                stats.record_failed_execution()
                now = time.monotonic_ns()
                for request in pending.requests:
                    stats.record_failure(CANCELED if request.cancelled else OTHER, now - request.arrival_ns)
                    fail(request, error)

    def fail_all(self, error: InferenceError) -> None:
        """Fail every request in flight (the server is shutting down)."""
        for pending in list(self.pending.values()):
            if pending.timer is not None:
                pending.timer.cancel()
            for request in pending.requests:
                fail(request, error)
        self.pending.clear()

    def close(self) -> None:
        """Close the cancel publisher."""
        if self._cancel_socket is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._cancel_socket.fileno())
            self._cancel_socket.close(linger=0)
            self._cancel_socket = None


def _in_client_segment(location: tuple[str, int], nbytes: int) -> Loc:
    # A large input in a client's shared-memory segment (Triton's shared-memory extension) goes to the instance as its
    # place, which the instance maps itself, instead of being copied into the pool: the instance maps a large slot
    # anew for each batch anyway (docs/shared-memory.md, "Copies"). Below that size a copy into a slot the instance
    # keeps mapped is cheaper than a fresh mapping.
    segment, offset = location
    return [segment, nbytes, offset]


def _shm_location(loc: Any) -> list[Any] | None:
    # A location is a frame index, or [segment, nbytes] for bytes in a worker's shared-memory slot.
    return None if isinstance(loc, int) else loc  # type: ignore[no-any-return]
