"""The core serving process: owns the ROUTER socket to workers, the registry, schedulers and the front ends."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from pyserve.config import ModelSpec, ServeConfig, WorkerKind
from pyserve.core.bls import BlsBroker
from pyserve.core.cache import ResponseCache
from pyserve.core.ensemble import EnsembleEntry, EnsembleExecutor, load_ensemble
from pyserve.core.inference import BufferLease, InferenceRequest, InferenceResponse, Instance, ModelEntry, OutputTensor
from pyserve.core.logs import log_settings
from pyserve.core.metrics import CoreMetrics
from pyserve.core.registry import Registry
from pyserve.core.scheduler import ModelScheduler, ResponseOrderer
from pyserve.core.stats import BACKEND, CANCELED, OTHER, REJECTED
from pyserve.core.supervisor import Supervisor, WorkerProcess, describe_exit, open_pidfd
from pyserve.core.tracing import Tracing
from pyserve.errors import (
    CancelledError,
    InferenceError,
    ModelNotReadyError,
    PyServeError,
    QueueFullError,
    ServerError,
    WorkerDiedError,
    error_from_kind,
)
from pyserve.transport.messages import FrameWriter, pack_header, read_buffer, unpack_header
from pyserve.transport.shm import ShmPool, ShmReader, remove_segments

if TYPE_CHECKING:
    from pyserve.frontends.grpc import GrpcFrontend

logger = logging.getLogger(__name__)

# The core watches its parent through a pidfd rather than PR_SET_PDEATHSIG, which fires when the spawning *thread*
# exits; where there are no pidfds it looks at its parent pid this often.
_PARENT_CHECK_S = 0.5
_T = TypeVar("_T")


@dataclass(slots=True, eq=False)
class PendingBatch:
    """A batch sent to an instance, until its final response."""

    requests: list[InferenceRequest]
    instance: Instance
    entry: ModelEntry
    slots: list[str]
    rows: int
    dispatched_ns: int


class CoreServer:
    """Wires the registry, schedulers, worker socket and front ends on one asyncio loop."""

    def __init__(self, config: ServeConfig, router_address: str, shm_prefix: str, parent_pid: int) -> None:
        self.config = config
        self.router_address = router_address
        self.shm_prefix = shm_prefix
        self.parent_pid = parent_pid
        self.registry = Registry()
        self.serving = False
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self._socket: zmq.Socket[Any] | None = None
        self._pool = ShmPool(f"{shm_prefix}-core", config.shm_pool_bytes)
        self._reader = ShmReader()
        self._pending: dict[int, PendingBatch] = {}
        self._instances: dict[bytes, tuple[Instance, ModelEntry, str]] = {}
        self._next_batch_id = 0
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http_server: asyncio.base_events.Server | None = None
        self._grpc_server: GrpcFrontend | None = None
        self._cancel_socket: zmq.Socket[Any] | None = None
        self.cancel_address = ""
        self._supervisor: Supervisor | None = None
        self._work_dir = tempfile.mkdtemp(prefix="pyserve-core-")
        # (model, version) -> (control identity, request id) of a load waiting for its process instances.
        self._loading: dict[tuple[str, int], tuple[bytes, int]] = {}
        # Observability (docs/monitoring.md): metrics read the counters when scraped; the cache, tracing and
        # per-request logs hook submit() only for the requests that use them.
        self.metrics = CoreMetrics(self)
        self.cache = ResponseCache(config.response_cache_bytes) if config.response_cache_bytes else None
        self.tracing = Tracing(config)
        self.logs = log_settings(config.log_level, config.log_format)
        self._metrics_server: asyncio.base_events.Server | None = None
        self.ensembles = EnsembleExecutor(self.submit, self.cancel, self._respond)
        self.bls = BlsBroker(
            self.registry,
            self._instances,
            self._pending,
            self._reader,
            send=self._send,
            submit=self.submit,
            cancel=self.cancel,
            ensembles=self.ensembles,
        )

    # lifecycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the worker socket and the front ends."""
        from pyserve.frontends.grpc import start_grpc_server
        from pyserve.frontends.http import start_http_server

        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        socket.bind(self.router_address)
        self.router_address = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._socket = socket
        self._loop.add_reader(socket.fileno(), self._drain)
        self._start_cancel_publisher()
        self._supervisor = Supervisor(
            self.router_address,
            self.shm_prefix,
            self.config.shm_threshold_bytes,
            self.config.shm_pool_bytes,
            self._on_process_exit,
            debug_errors=self.config.debug_errors,
            loop=self._loop,
        )
        from pyserve.frontends.metrics import start_metrics_server

        config = self.config
        self._http_server, self.http_port = await _listen("HTTP", config, "http_port", start_http_server(self, config))
        self._grpc_server, self.grpc_port = await _listen("gRPC", config, "grpc_port", start_grpc_server(self, config))
        self._metrics_server, self.metrics_port = await _listen(
            "metrics", config, "metrics_port", start_metrics_server(self, config)
        )

    async def wait_stopped(self) -> None:
        """Run until stop() or the parent process goes away (watched through a pidfd: no wake-ups while idle)."""
        assert self._stopping is not None and self._loop is not None
        parent_fd = None
        if self.parent_pid:
            try:
                parent_fd = open_pidfd(self.parent_pid)
            except ProcessLookupError:
                self._parent_gone()
        if parent_fd is not None:
            self._loop.add_reader(parent_fd, self._parent_gone)
        try:
            # The parent may have died before its pidfd was opened (and its pid been reused): look once more.
            if self.parent_pid and os.getppid() != self.parent_pid:
                self._parent_gone()
            while not self._stopping.is_set():
                if parent_fd is not None or not self.parent_pid:
                    await self._stopping.wait()
                    break
                try:
                    await asyncio.wait_for(self._stopping.wait(), _PARENT_CHECK_S)
                except asyncio.TimeoutError:
                    if os.getppid() != self.parent_pid:
                        self._parent_gone()
        finally:
            if parent_fd is not None:
                self._loop.remove_reader(parent_fd)
                os.close(parent_fd)

    def _parent_gone(self) -> None:
        if self._stopping is not None and not self._stopping.is_set():
            logger.warning("parent process %d is gone; stopping", self.parent_pid)
            self.stop()

    def stop(self) -> None:
        """Ask the loop to stop serving (idempotent)."""
        if self._stopping is not None:
            self._stopping.set()

    async def close(self) -> None:
        """Stop front ends, fail what is in flight, release sockets and shared memory."""
        if self._http_server is not None:
            self._http_server.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self._grpc_server is not None:
            await self._grpc_server.stop()
        for entry in self.registry.entries():
            if entry.scheduler is not None:
                for request in entry.scheduler.drain():
                    self._fail(request, ModelNotReadyError("the server is shutting down"))
        for pending in list(self._pending.values()):
            for request in pending.requests:
                self._fail(request, ModelNotReadyError("the server is shutting down"))
        self._pending.clear()
        if self._supervisor is not None:
            self._supervisor.close()
        if self._cancel_socket is not None:
            self._cancel_socket.close(linger=0)
        shutil.rmtree(self._work_dir, ignore_errors=True)
        if self._socket is not None and self._loop is not None:
            self._loop.remove_reader(self._socket.fileno())
            self._socket.close(linger=0)
        self._reader.close()
        self._pool.close()
        self.metrics.close()
        self.tracing.close()
        remove_segments(self.shm_prefix)
        _remove_ipc_endpoint(self.router_address)

    # requests from front ends ---------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Server readiness: the models bound before start are loaded, and every model has a live instance."""
        return self.serving and all(entry.ready for entry in self.registry.entries())

    def submit(self, request: InferenceRequest) -> None:
        """Queue a validated request on its model's scheduler (an ensemble's goes to the ensemble executor)."""
        entry = request.model
        if self.tracing.active:
            self.tracing.begin(request)
        if self.logs.log_requests:
            self.logs.watch(request)
        try:
            if isinstance(entry, EnsembleEntry):
                self.ensembles.submit(request)
                return
            if not entry.ready or entry.scheduler is None:
                raise ModelNotReadyError(f"model '{entry.name}' version {entry.version} is not ready")
            # A cache hit is answered here and never reaches a worker.
            if entry.response_cache and self.cache is not None and self.cache.answer(request, self._respond):
                return
            entry.scheduler.submit(request)
        except InferenceError as exc:
            if isinstance(exc, QueueFullError):
                entry.stats.record_failure(REJECTED, 0)
            self._ended_unanswered(request, exc)
            raise

    def cancel(self, request: InferenceRequest) -> None:
        """The client went away: a queued request is dropped; a running one gets its cancel flag set."""
        if request.cancelled or request.done:
            return
        request.cancelled = True
        request.done = True
        self._ended_unanswered(request, CancelledError("the request was cancelled"))
        if isinstance(request.model, EnsembleEntry):
            self.ensembles.cancel(request)
            return
        scheduler = request.model.scheduler
        if scheduler is not None:
            if scheduler.cancel(request):
                request.model.stats.record_failure(CANCELED, time.monotonic_ns() - request.arrival_ns)
                return
            if scheduler.orderer is not None:
                scheduler.orderer.forget(request)
        if request.batch_id in self._pending and self._cancel_socket is not None:
            self._cancel_socket.send(pack_header({"b": request.batch_id, "i": [request.batch_index]}))

    # process instances ----------------------------------------------------------------------------------------

    def _start_cancel_publisher(self) -> None:
        socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.PUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        if self.router_address.startswith("ipc://"):
            socket.bind(self.router_address.rsplit("/", 1)[0] + "/cancel.sock")
        else:
            socket.bind(self.router_address.rsplit(":", 1)[0] + ":*")
        self.cancel_address = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._cancel_socket = socket

    def _start_processes(self, identity: bytes, rid: int, entry: ModelEntry, payload: bytes) -> None:
        assert self._supervisor is not None
        path = os.path.join(self._work_dir, f"{entry.name}-{entry.version}.pkl")
        with open(path, "wb") as handle:
            handle.write(payload)
        self._loading[(entry.name, entry.version)] = (identity, rid)
        config = entry.spec.config
        self._supervisor.add(entry.name, entry.version, config.instances, config.devices, path)

    def _on_process_exit(self, worker: WorkerProcess, status: int) -> None:
        how = describe_exit(status)
        for identity, (instance, entry, _) in list(self._instances.items()):
            if instance.kind == "process" and instance.pid == worker.last_pid:
                self._remove_instance(
                    identity,
                    WorkerDiedError(
                        f"instance {instance.index} of model '{entry.name}' (pid {instance.pid}) died: {how}"
                    ),
                )
        key = (worker.model, worker.version)
        loading = self._loading.get(key)
        if loading is not None and not worker.ready:
            # The model never became ready: fail the bind() with the reason, stop the other instances.
            del self._loading[key]
            self._unload(worker.model, worker.version, "its instance failed to start")
            message = (
                f"instance {worker.index} of model '{worker.model}' exited before it was ready ({how}); "
                "its error output is above"
            )
            self._send(loading[0], {"t": "error", "rid": loading[1], "message": message})
            return
        if self._stopping is not None and self._stopping.is_set():
            return
        assert self._supervisor is not None
        delay = self._supervisor.schedule_restart(worker)
        logger.error(
            "instance %d of model '%s' died (%s); restarting in %.1f s", worker.index, worker.model, how, delay
        )

    # worker socket --------------------------------------------------------------------------------------------

    def _drain(self) -> None:
        # ZeroMQ's FD is edge-triggered: read until EVENTS says nothing is left.
        socket = self._socket
        if socket is None:
            return
        while int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            identity = frames[0].bytes
            try:
                header = unpack_header(frames[1].buffer)
                self._on_message(identity, header, frames[2:])
            except Exception:
                logger.exception("error handling a message from a worker")

    def _send(self, identity: bytes, header: dict[str, Any], frames: list[Any] | None = None) -> None:
        assert self._socket is not None and self._loop is not None
        try:
            self._socket.send_multipart([identity, pack_header(header), *(frames or ())], copy=False)
        except zmq.ZMQError as exc:
            logger.warning("could not send to worker %r: %s", identity, exc)
        # Sending can consume the edge that announced pending input: look again soon.
        self._loop.call_soon(self._drain)

    def _on_message(self, identity: bytes, header: dict[str, Any], frames: list[Any]) -> None:
        kind = header["t"]
        if kind == "res":
            self._on_result(header, frames)
        elif kind in ("bls", "bls_cancel", "bls_free"):
            self.bls.on_message(identity, header, frames)
        elif kind == "load_ensemble":
            self._on_load_ensemble(identity, header)
        elif kind == "hello":
            self._on_hello(identity, header)
        elif kind == "load":
            self._on_load(identity, header)
        elif kind == "unload":
            self._on_unload(identity, header)
        elif kind == "bye":
            self._on_bye(identity)
        elif kind == "serving":
            # Serve loaded what was bound before start: from now on readiness is the models' own.
            self.serving = True
            self._send(identity, {"t": "ok", "rid": header.get("rid")})
        elif kind == "shutdown":
            self._send(identity, {"t": "ok", "rid": header.get("rid")})
            self.stop()
        else:
            logger.warning("unknown message %r from worker", kind)

    def _on_load(self, identity: bytes, header: dict[str, Any]) -> None:
        try:
            spec = ModelSpec.from_wire(header["spec"])
            entry = ModelEntry(spec)
            self.registry.add(entry)
            assert self._loop is not None
            entry.scheduler = self._make_scheduler(entry)
        except PyServeError as exc:
            self._send(identity, {"t": "error", "rid": header["rid"], "message": str(exc)})
            return
        if spec.config.worker is WorkerKind.PROCESS:
            self._start_processes(identity, header["rid"], entry, header["payload"])
            return
        self._send(identity, {"t": "ok", "rid": header["rid"]})

    def _on_load_ensemble(self, identity: bytes, header: dict[str, Any]) -> None:
        try:
            load_ensemble(header["spec"], self.registry)
        except PyServeError as exc:
            self._send(identity, {"t": "error", "rid": header["rid"], "message": str(exc)})
            return
        self._send(identity, {"t": "ok", "rid": header["rid"]})

    def _make_scheduler(self, entry: ModelEntry) -> ModelScheduler:
        assert self._loop is not None
        batcher = entry.spec.config.batcher
        orderer = None
        if entry.spec.config.dynamic_batching and batcher is not None and batcher.preserve_ordering:
            orderer = ResponseOrderer(self._deliver)
        return ModelScheduler(entry, self._dispatch, self._loop.call_later, reject=self._reject, orderer=orderer)

    def _on_unload(self, identity: bytes, header: dict[str, Any]) -> None:
        self._unload(header["name"], header["version"], "it was unloaded")
        self._send(identity, {"t": "ok", "rid": header["rid"]})

    def _unload(self, name: str, version: int, why: str) -> None:
        entry = self.registry.remove(name, version)
        if entry is None:
            return
        if entry.scheduler is not None:
            for request in entry.scheduler.drain():
                self._fail(request, ModelNotReadyError(f"model '{entry.name}' is not available: {why}"))
        for instance in list(entry.instances):
            self._send(instance.identity, {"t": "stop"})
            self._remove_instance(instance.identity, ModelNotReadyError(f"model '{entry.name}': {why}"))
        if self._supervisor is not None:
            self._supervisor.remove_model(name, version)

    def _on_hello(self, identity: bytes, header: dict[str, Any]) -> None:
        try:
            entry = self.registry.get(header["model"], header["version"])
        except InferenceError as exc:
            self._send(identity, {"t": "refused", "message": str(exc)})
            return
        instance = Instance(identity, header["instance"], header["kind"], header["pid"])
        entry.instances.append(instance)
        self.metrics.model_ready(entry)
        self._instances[identity] = (instance, entry, header["shm_prefix"])
        self._send(identity, {"t": "welcome", "cancel": self.cancel_address})
        assert entry.scheduler is not None
        entry.scheduler.add_instance(instance)
        if instance.kind == "process" and self._supervisor is not None:
            worker = self._supervisor.find(instance.pid)
            if worker is not None:
                worker.ready = True
            self._maybe_finish_load(entry)

    def _maybe_finish_load(self, entry: ModelEntry) -> None:
        key = (entry.name, entry.version)
        loading = self._loading.get(key)
        if loading is not None and len(entry.instances) >= entry.spec.config.instances:
            del self._loading[key]
            self._send(loading[0], {"t": "ok", "rid": loading[1]})

    def _on_bye(self, identity: bytes) -> None:
        known = self._instances.get(identity)
        if known is not None:
            self._remove_instance(
                identity, WorkerDiedError(f"instance {known[0].index} of model '{known[1].name}' left")
            )

    def _remove_instance(self, identity: bytes, error: InferenceError) -> None:
        known = self._instances.pop(identity, None)
        if known is None:
            return
        self.bls.instance_gone(identity)
        instance, entry, shm_prefix = known
        if instance in entry.instances:
            entry.instances.remove(instance)
        if entry.scheduler is not None:
            entry.scheduler.remove_instance(instance)
        self._reader.forget(shm_prefix)
        if instance.kind == "process":
            remove_segments(shm_prefix)
        for batch_id, pending in list(self._pending.items()):
            if pending.instance is instance:
                del self._pending[batch_id]
                for name in pending.slots:
                    self._pool.release(name)
                entry.stats.record_failed_execution()
                now = time.monotonic_ns()
                for request in pending.requests:
                    entry.stats.record_failure(CANCELED if request.cancelled else OTHER, now - request.arrival_ns)
                    self._fail(request, error)

    # batches --------------------------------------------------------------------------------------------------

    def _dispatch(self, batch: list[InferenceRequest], instance: Instance) -> None:
        entry = batch[0].model
        now = time.monotonic_ns()
        self._next_batch_id += 1
        batch_id = self._next_batch_id
        writer = FrameWriter(self._pool, self.config.shm_threshold_bytes)
        blocks: list[Any] = []
        head = batch[0]
        if entry.batching:
            rows = 0
            for request in batch:
                rows += request.rows
            for name, tensor in head.inputs.items():
                parts = [request.inputs[name].buffer() for request in batch]
                nbytes = sum(memoryview(part).nbytes for part in parts)
                loc = writer.add_parts(parts, nbytes)
                blocks.append([name, tensor.datatype, [rows, *tensor.shape[1:]], loc, -1])
        else:
            rows = 1
            for name, tensor in head.inputs.items():
                loc = writer.add(tensor.buffer(), tensor.nbytes)
                blocks.append([name, tensor.datatype, tensor.shape, loc, 0])
        header = {
            "t": "infer",
            "b": batch_id,
            "r": [[r.id, r.parameters, r.requested_outputs, r.rows] for r in batch],
            "x": blocks,
        }
        for index, request in enumerate(batch):
            request.batch_id = batch_id
            request.batch_index = index
        self._pending[batch_id] = PendingBatch(batch, instance, entry, writer.slots, rows, now)
        instance.batch_id = batch_id
        if self.tracing.active:
            self.tracing.on_dispatch(batch, header)
        self._send(instance.identity, header, writer.frames)

    def _on_result(self, header: dict[str, Any], frames: list[Any]) -> None:
        batch_id = header["b"]
        final = header["final"]
        pending = self._pending.pop(batch_id, None) if final else self._pending.get(batch_id)
        if pending is None:
            return
        entry = pending.entry
        stats = entry.stats
        now = time.monotonic_ns()
        if final:
            for name in pending.slots:
                self._pool.release(name)
            # Hand the instance its next batch before answering this one: the worker computes while we encode.
            scheduler = entry.scheduler
            if scheduler is not None and pending.instance.identity in self._instances:
                scheduler.instance_done(pending.instance)
        error = header.get("err")
        if error is not None:
            exc = error_from_kind(error[0], error[1])
            stats.record_failed_execution()
            decoupled = entry.spec.config.decoupled
            for request in pending.requests:
                stats.record_failure(CANCELED if request.cancelled else BACKEND, now - request.arrival_ns)
                if decoupled:
                    stats.record_response(request, "fail", header.get("rt"), now)
                self._respond(request, InferenceResponse([], exc))
        else:
            per_request = header["o"]
            # Outputs in the worker's slots stay valid until every holder of the response lets go of them.
            slots = header["s"]
            lease = BufferLease(partial(self._free_slots, pending.instance.identity, slots)) if slots else None
            decoupled = entry.spec.config.decoupled
            if per_request is not None:
                reader = self._reader
                for request, descriptors in zip(pending.requests, per_request, strict=True):
                    if descriptors is None:
                        continue
                    if decoupled:
                        stats.record_response(request, "success", header.get("rt"), now)
                    outputs = [
                        OutputTensor(name, datatype, shape, read_buffer(loc, frames, reader), _shm_location(loc))
                        for name, datatype, shape, loc in descriptors
                    ]
                    self._respond(request, InferenceResponse(outputs, final=final, lease=lease))
            elif final:
                for request in pending.requests:
                    if decoupled and not request.cancelled:
                        stats.record_response(request, "empty", header.get("rt"), now)
                    self._respond(request, InferenceResponse([], final=True))
            if final:
                timings = header["tm"]
                stats.record_execution(pending.rows, len(pending.requests), timings[0], timings[1], timings[2])
                stats.record_successes(pending.requests, pending.dispatched_ns, now, timings)
            if lease is not None:
                lease.drop()

    def _free_slots(self, identity: bytes, slots: list[str]) -> None:
        if identity in self._instances:
            self._send(identity, {"t": "free", "slots": slots})

    def _respond(self, request: InferenceRequest, response: InferenceResponse) -> None:
        if request.done:
            return
        if response.final:
            request.done = True
        if request.cancelled and response.error is None:
            response = InferenceResponse([], CancelledError("the request was cancelled"))
        scheduler = request.model.scheduler
        if scheduler is not None and scheduler.orderer is not None:
            scheduler.orderer.deliver(request, response)
        else:
            self._deliver(request, response)

    def _deliver(self, request: InferenceRequest, response: InferenceResponse) -> None:
        try:
            request.on_response(request, response)
        except Exception:
            logger.exception("response callback of request %r failed", request.id)

    def _fail(self, request: InferenceRequest, error: InferenceError) -> None:
        self._respond(request, InferenceResponse([], error))

    def _reject(self, request: InferenceRequest, error: InferenceError) -> None:
        # The scheduler refused a queued request (timeout): it counts as a failure of the model.
        request.model.stats.record_failure(REJECTED, time.monotonic_ns() - request.arrival_ns)
        self._fail(request, error)

    def _ended_unanswered(self, request: InferenceRequest, error: InferenceError) -> None:
        # A request refused by submit() or cancelled gets no response through its callback: close its trace and
        # request log here.
        if request.trace is not None:
            self.tracing.end(request, error)
        if self.logs.log_requests:
            self.logs.finished(request, error, request.arrival_ns or time.monotonic_ns())


def _shm_location(loc: Any) -> list[Any] | None:
    # A location is a frame index, or [segment, nbytes] for bytes in a worker's shared-memory slot.
    return None if isinstance(loc, int) else loc  # type: ignore[no-any-return]


async def _listen(listener: str, config: ServeConfig, port_field: str, start: Awaitable[_T]) -> _T:
    """Await a front end's start; a port it cannot bind raises ServerError naming the listener, address and cause."""
    try:
        return await start
    except OSError as exc:
        port = getattr(config, port_field)
        code, reason = _bind_failure(config.host, port, exc)
        message = f"cannot listen for {listener} on {config.host}:{port}: {reason}"
        if code == errno.EADDRINUSE:
            option = port_field.replace("_", "-")
            message += (
                f"; another process holds the port: stop it or choose another (--{option}, ServeConfig.{port_field})"
            )
        raise ServerError(message) from exc


def _bind_failure(host: str, port: int, exc: OSError) -> tuple[int | None, str]:
    """The errno and the operating system's words for why host:port could not be bound: 'Address already in use'."""
    if exc.errno is None:
        # gRPC says only "Failed to bind to address"; binding the address ourselves gets the system's reason.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            socket.create_server((host, port), family=family).close()
        except OSError as probe:
            exc = probe
    if exc.errno is None or isinstance(exc, socket.gaierror):
        return None, str(exc)
    return exc.errno, os.strerror(exc.errno)


def _remove_ipc_endpoint(address: str) -> None:
    # Serve made a private directory for the sockets; when the parent was killed nobody else removes it.
    if not address.startswith("ipc://"):
        return
    path = address[len("ipc://") :]
    with contextlib.suppress(OSError):
        os.unlink(path)
    directory = os.path.dirname(path)
    if os.path.basename(directory).startswith("pyserve-"):
        shutil.rmtree(directory, ignore_errors=True)


async def serve_core(
    config: ServeConfig, router_address: str, shm_prefix: str, parent_pid: int, ready_fd: int | None
) -> None:
    """Run the core until stopped; reports its ports on ``ready_fd`` once it accepts connections."""
    import orjson

    core = CoreServer(config, router_address, shm_prefix, parent_pid)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, core.stop)
    if parent_pid and os.getppid() != parent_pid:
        return
    try:
        await core.start()
        if ready_fd is not None:
            ready = {
                "http_port": core.http_port,
                "grpc_port": core.grpc_port,
                "metrics_port": core.metrics_port,
                "router": core.router_address,
            }
            os.write(ready_fd, orjson.dumps(ready) + b"\n")
            os.close(ready_fd)
        await core.wait_stopped()
    finally:
        await core.close()
