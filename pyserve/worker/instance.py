"""One model instance: a DEALER socket to the core, and a loop that runs the user's function on each batch.

The same loop serves thread instances (in the user's process) and process instances (spawned): it only needs
the core's address, the model spec and the callable.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import platform
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zmq

from pyserve.config import ModelSpec
from pyserve.errors import InferenceError, ModelExecutionError, OutputMismatchError
from pyserve.request import (
    CancelFlag,
    ModelContext,
    Request,
    RequestBatch,
    reset_current_model,
    set_current_model,
)
from pyserve.telemetry.spans import start_compute
from pyserve.transport.curve import secure_client
from pyserve.transport.messages import FrameWriter, array_from_buffer, pack_header, read_buffer, unpack_header
from pyserve.transport.protocol import (
    MERGED,
    BatchResult,
    BlsResponse,
    FreeSlots,
    Hello,
    InferBatch,
    InputBlock,
    MessageKind,
    Refused,
    RequestEntry,
    Welcome,
    kind_of,
)
from pyserve.transport.shm import ShmPool, ShmReader
from pyserve.worker.bls_channel import BlsChannel
from pyserve.worker.cancel import CancelListener, acquire_listener, release_listener, wait_synced
from pyserve.worker.outputs import OutputEncoder
from pyserve.worker.sequence_state import SequenceStates

logger = logging.getLogger(__name__)


class InstanceRunner:
    """Runs one instance of one model until ``stop`` is set or the core says stop."""

    def __init__(
        self,
        address: str,
        spec: ModelSpec,
        infer_func: Callable[..., Any],
        instance: int,
        shm_prefix: str,
        shm_threshold: int,
        shm_limit: int,
        device: str = "cpu",
        kind: str = "thread",
        parent_pid: int = 0,
        debug_errors: bool = False,
        stage_times: bool = False,
        cancel_address: str = "",
        spin_us: int = 0,
        remote_token: str = "",
        routing_id: bytes = b"",
        node: str = "",
    ) -> None:
        self.address = address
        self._node = node  # the cluster node it runs on (a Ray node id), told to the core in its hello
        # An instance of a remote peer (RemoteServe): its socket is a CURVE client keyed by this token, named by
        # its session (pyserve.core.remote_peers).
        self._remote_token = remote_token
        self._routing_id = routing_id
        # The core's cancel publisher: the instance subscribes (and waits for the confirmation) before its hello,
        # so once the core counts it as connected no cancel of its batches can be lost.
        self._cancel_address = cancel_address
        # After a batch, a process instance polls for the next one this long before sleeping (ServeConfig).
        self._spin_ns = spin_us * 1000 if kind == "process" else 0
        self.spec = spec
        self.infer_func = infer_func
        self.instance = instance
        self.kind = kind
        self.context = ModelContext(
            name=spec.name,
            version=spec.version,
            inputs=spec.inputs,
            outputs=spec.outputs,
            config=spec.config,
            instance=instance,
            device=device,
        )
        self._shm_prefix = f"{shm_prefix}-{uuid.uuid4().hex[:8]}"
        self._shm_threshold = shm_threshold
        self._shm_limit = shm_limit
        self._output_encoder = OutputEncoder(spec)
        # A stateful model's sequences: control inputs and the state kept for each (pyserve.worker.sequence_state).
        self._sequences = SequenceStates(spec) if spec.config.sequence_batcher is not None else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parent_pid = parent_pid
        # ServeConfig.debug_errors: error messages of failed batches carry the traceback.
        self._debug_errors = debug_errors
        # ServeConfig.stage_times: results carry when the batch passed each stage here (pyserve.core.stage_times).
        self._stage_times = stage_times
        self._cancel: CancelListener | None = None
        self._bls: BlsChannel | None = None
        self._stopping: Callable[[], bool] = lambda: False

    def run(self, stop: threading.Event, on_ready: Callable[[str | None], None], wake_fds: Sequence[int]) -> None:
        """Connect, register with the core, then serve batches. ``on_ready(error)`` is called once.

        The loop returns when the core says stop or one of ``wake_fds`` becomes readable: their owner makes one
        readable when it sets ``stop`` (or dies: the read end of a pipe whose write end it holds). An idle
        instance sleeps on them and its socket without waking up.
        """
        socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        if self._remote_token:
            secure_client(socket, self._remote_token)
        if self._routing_id:
            socket.setsockopt(zmq.ROUTING_ID, self._routing_id)
        pool = ShmPool(self._shm_prefix, self._shm_limit)
        reader = ShmReader()
        # BLS calls made by the function use this socket while it runs; what else they read waits in bls.deferred.
        bls = self._bls = BlsChannel(socket, pool, reader, self._shm_threshold)
        self._stopping = lambda: stop.is_set() or bool(self._parent_pid and os.getppid() != self._parent_pid)
        ready_sent = False
        try:
            # setup(device) sees its model's context (pyserve.current_model(): name, instance index, device).
            token = set_current_model(self.context)
            try:
                self.infer_func = instantiate(self.infer_func, self.context.device)
            finally:
                reset_current_model(token)
            if self._remote_token and self._routing_id:
                # A remote instance hears its cancellations on its session's socket on the core's remote port.
                session = self._routing_id.partition(b"/")[0].decode()
                self._cancel = acquire_listener(self.address, self._remote_token, session)
            elif self._cancel_address:
                self._cancel = acquire_listener(self._cancel_address)
            if self._cancel is not None and not wait_synced(self._cancel, list(wake_fds)):
                return  # stopped (or the core died) while the subscription was being confirmed
            socket.connect(self.address)
            hello = Hello.build(
                self.spec.name,
                self.spec.version,
                self.instance,
                self.kind,
                os.getpid(),
                self._shm_prefix,
                host=platform.node(),
                node=self._node,
                device=self.context.device,
            )
            socket.send(pack_header(hello))
            stage_times = self._stage_times
            poller = zmq.Poller()
            poller.register(socket, zmq.POLLIN)
            for fd in wake_fds:
                poller.register(fd, zmq.POLLIN)
            while not stop.is_set():
                if bls.deferred:
                    frames = bls.deferred.popleft()
                else:
                    # Under load the next batch is already queued: take it without a poll() first.
                    try:
                        frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        if self._spin_ns and _spun_for_input(socket, self._spin_ns):
                            continue
                        if any(ready is not socket for ready, _ in poller.poll()):
                            return  # a wake fd is readable: stop
                        continue
                received = time.monotonic_ns() if stage_times else 0
                header = unpack_header(frames[0].buffer)
                kind = kind_of(header)
                if kind == MessageKind.INFER:
                    self._execute(socket, InferBatch(header), frames[1:], pool, reader, received)
                elif kind == MessageKind.BLS_RESPONSE:
                    bls.on_late_response(BlsResponse(header), frames[1:])
                elif kind == MessageKind.FREE:
                    for name in FreeSlots(header).slots:
                        pool.release(name)
                elif kind == MessageKind.WELCOME:
                    cancel_address = Welcome(header).cancel_address
                    if cancel_address and self._cancel is None:
                        # Only an instance started without the address (a worker run by hand) subscribes this late.
                        self._cancel = acquire_listener(cancel_address)
                        if not wait_synced(self._cancel, list(wake_fds)):
                            return  # stopped (or the core died) while the subscription was being confirmed
                    ready_sent = True
                    on_ready(None)
                elif kind == MessageKind.REFUSED:
                    ready_sent = True
                    on_ready(Refused(header).message)
                    return
                elif kind == MessageKind.STOP:
                    return
        except zmq.ZMQError as exc:
            if not stop.is_set():
                logger.error("instance %d of model '%s' lost its connection: %s", self.instance, self.spec.name, exc)
        except Exception as exc:  # setup() or the factory failed: report it to whoever waits for readiness
            if ready_sent:
                raise
            ready_sent = True
            on_ready("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        finally:
            if not ready_sent:
                on_ready("the instance stopped before the core accepted it")
            _teardown(self.infer_func, self.spec.name)
            if self._cancel is not None:
                release_listener(self._cancel.key)
                self._cancel = None
            if self._loop is not None:
                self._loop.close()
            socket.close(linger=0)
            reader.close()
            pool.close()

    # one batch --------------------------------------------------------------------------------------------------

    def _execute(
        self,
        socket: zmq.Socket[Any],
        message: InferBatch,
        frames: list[Any],
        pool: ShmPool,
        reader: ShmReader,
        received: int = 0,
    ) -> None:
        # received: when the batch arrived (time.monotonic_ns()), with ServeConfig.stage_times on; else 0.
        batch_id = message.batch_id
        started = time.monotonic_ns()
        requests = message.requests
        flags = [CancelFlag() for _ in requests]
        try:
            batch = self._decode(requests, message.blocks, frames, reader, flags)
            if self._sequences is not None:
                self._sequences.prepare(batch, message.sequences, message.released_sequences)
        except Exception as exc:  # a malformed batch is the core's bug; report it, keep serving
            logger.error(
                "instance %d of model '%s' version %d could not decode a batch",
                self.instance,
                self.spec.name,
                self.spec.version,
                exc_info=exc,
                extra=self._log_fields(),
            )
            self._send_error(socket, batch_id, InferenceError(f"could not decode batch: {exc}"))
            return
        decoded = time.monotonic_ns()
        if self._cancel is not None:
            self._cancel.register(batch_id, flags)
        token = set_current_model(self.context)
        assert self._bls is not None
        bls_token = self._bls.enter(flags, self._stopping)
        # Traced requests: compute spans under their request spans, current while the function runs.
        trace = message.trace
        spans = None
        if trace is not None:
            spans = start_compute(
                trace.file, trace.parents, self.spec.name, self.spec.version, self.instance, len(batch)
            )
        try:
            result = self.infer_func(batch)
            if inspect.isgenerator(result):
                self._stream(socket, batch_id, batch, result, pool, started, decoded)
                return
            if inspect.isasyncgen(result):
                self._stream(socket, batch_id, batch, self._iterate_async(result), pool, started, decoded)
                return
            if inspect.isawaitable(result):
                result = self._event_loop().run_until_complete(_await(result))
            computed = time.monotonic_ns()
            if self._sequences is not None:
                result = self._sequences.collect(batch, result)
            writer = FrameWriter(pool, self._shm_threshold)
            outputs = self._output_encoder.encode(batch, result, writer)
        except Exception as exc:
            if spans is not None:
                spans.fail(exc)
            self._send_error(socket, batch_id, self._as_inference_error(exc, len(batch)))
            return
        finally:
            if spans is not None:
                spans.end()
            self._bls.leave(bls_token)
            reset_current_model(token)
            if self._cancel is not None:
                self._cancel.unregister(batch_id)
            if self._sequences is not None:
                self._sequences.finish(batch)
        encoded = time.monotonic_ns()
        timings = [decoded - started, computed - decoded, encoded - computed]
        stamps = [received, decoded, computed, time.monotonic_ns()] if received else None
        reply = BatchResult.build_final(batch_id, outputs, writer.slots, timings, stamps)
        socket.send_multipart([pack_header(reply), *writer.frames], copy=False)

    def _stream(
        self,
        socket: zmq.Socket[Any],
        batch_id: int,
        batch: RequestBatch,
        responses: Any,
        pool: ShmPool,
        started: int,
        decoded: int,
    ) -> None:
        # Decoupled model: every yielded list is one round of responses; a final empty message closes the batch.
        # Each message carries "rt", the time the model took for it (Triton's response_stats).
        last = decoded
        try:
            for result in responses:
                produced = time.monotonic_ns()
                if all(request.is_cancelled for request in batch):
                    # Every client of this batch went away: stop the generator, no work for nobody.
                    responses.close()
                    break
                if isinstance(result, (list, tuple)) and len(result) == len(batch):
                    result = [None if r.is_cancelled else out for r, out in zip(batch, result, strict=True)]
                if self._sequences is not None:
                    result = self._sequences.collect(batch, result)
                writer = FrameWriter(pool, self._shm_threshold)
                outputs = self._output_encoder.encode(batch, result, writer, allow_none=True)
                timings = [produced - last, time.monotonic_ns() - produced]
                reply = BatchResult.build_response(batch_id, outputs, writer.slots, timings)
                socket.send_multipart([pack_header(reply), *writer.frames], copy=False)
                last = time.monotonic_ns()
        except Exception as exc:
            error = self._as_inference_error(exc, len(batch))
            self._send_error(socket, batch_id, error, [time.monotonic_ns() - last])
            return
        done = time.monotonic_ns()
        reply = BatchResult.build_end(batch_id, [decoded - started, done - decoded, 0], [done - last])
        socket.send(pack_header(reply))

    def _iterate_async(self, agen: Any) -> Any:
        loop = self._event_loop()
        try:
            while True:
                try:
                    item = loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            # Closing this wrapper (client gone) must close the user's async generator too.
            loop.run_until_complete(agen.aclose())

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def _send_error(
        self, socket: zmq.Socket[Any], batch_id: int, error: InferenceError, timings: list[int] | None = None
    ) -> None:
        socket.send(pack_header(BatchResult.build_error(batch_id, error, timings)))

    def _as_inference_error(self, exc: Exception, requests: int) -> InferenceError:
        """The error that answers every request of a failed batch; logs the failure (once per batch).

        An exception from the function is logged with its traceback; the client gets its type and message, and the
        traceback only with ServeConfig.debug_errors (it shows the server's paths and code). An InferenceError the
        function raised on purpose (or a BLS call raised in it) answers as it is, unlogged: it is an answer, not a
        crash.
        """
        name, version, instance = self.spec.name, self.spec.version, self.instance
        if isinstance(exc, OutputMismatchError):
            logger.error(
                "instance %d of model '%s' version %d failed a batch of %d requests: %s",
                instance,
                name,
                version,
                requests,
                exc,
                extra=self._log_fields(),
            )
            return exc
        if isinstance(exc, InferenceError):
            return exc
        logger.error(
            "instance %d of model '%s' version %d raised %s: %s (batch of %d requests)",
            instance,
            name,
            version,
            type(exc).__name__,
            exc,
            requests,
            exc_info=exc,
            extra=self._log_fields(),
        )
        text = str(exc)
        message = f"model '{name}' raised {type(exc).__name__}" + (f": {text}" if text else "")
        if self._debug_errors:
            message += "\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return ModelExecutionError(message)

    def _log_fields(self) -> dict[str, Any]:
        # Extra fields of this instance's log records (the JSON log format shows them).
        return {"model": self.spec.name, "version": self.spec.version, "instance": self.instance}

    def _decode(
        self,
        requests: list[RequestEntry],
        blocks: list[InputBlock],
        frames: list[Any],
        reader: ShmReader,
        flags: list[CancelFlag],
    ) -> RequestBatch:
        data: list[dict[str, np.ndarray]] = [{} for _ in requests]
        merged: dict[str, np.ndarray] = {}
        for name, datatype, shape, loc, target in blocks:
            array = array_from_buffer(read_buffer(loc, frames, reader), datatype, shape, name)
            if target == MERGED:
                # One block holding every request's rows in order: requests get views of it.
                merged[name] = array
                start = 0
                for index, (_, _, _, rows) in enumerate(requests):
                    data[index][name] = array[start : start + rows]
                    start += rows
            else:
                data[target][name] = array
        batch = RequestBatch(
            Request(data[i], params, tuple(outputs), req_id, flags[i])
            for i, (req_id, params, outputs, _) in enumerate(requests)
        )
        if merged and len(merged) == len(data[0]):
            batch.merged = merged
        return batch


def instantiate(target: Any, device: str) -> Callable[..., Any]:
    """The callable an instance runs: a class is instantiated here (in the instance's thread or process), and an
    object with ``setup(device)`` is set up, so heavy models load where they will run. Its ``teardown()``, if any,
    is called when the instance stops."""
    if isinstance(target, type):
        target = target()
    setup = getattr(target, "setup", None)
    if callable(setup):
        setup(device)
    if not callable(target):
        raise TypeError(f"the bound object {target!r} is not callable: define __call__(self, requests)")
    return target  # type: ignore[no-any-return]


def _spun_for_input(socket: zmq.Socket[Any], spin_ns: int) -> bool:
    """Poll ``socket`` without sleeping for up to ``spin_ns``; whether input arrived meanwhile."""
    end = time.monotonic_ns() + spin_ns
    while time.monotonic_ns() < end:
        if socket.poll(0):
            return True
    return False


def _teardown(target: Any, model: str) -> None:
    """Call the bound object's ``teardown()``, if it has one, as its instance stops (Triton's ``finalize``)."""
    teardown = getattr(target, "teardown", None)
    if not callable(teardown) or isinstance(target, type):
        return
    try:
        teardown()
    except Exception:
        logger.exception("teardown() of an instance of model '%s' raised", model)


async def _await(awaitable: Any) -> Any:
    return await awaitable
