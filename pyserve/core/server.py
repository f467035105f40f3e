"""The core process's server: its sockets and lifetime, and the router of messages from workers to their owners.

``CoreServer`` builds the core's parts and hands each message that arrives on the worker socket to the one that
owns its kind:

- ``res``: a batch's result -> ``BatchesInFlight`` (``pyserve.core.batches``)
- ``bls``, ``bls_cancel``, ``bls_free``: a model calling another -> ``BlsBroker`` (``pyserve.core.bls_broker``)
- ``load``, ``load_ensemble``, ``unload``, ``serving``, ``hello``, ``bye`` -> ``WorkerControl``
  (``pyserve.core.worker_control``)
- ``shutdown``: stop the core.

Requests come in through ``api`` (``pyserve.core.api.CoreApi``), which the process's entry point
(``pyserve.core.__main__``) gives to the front ends; they flow through ``RequestFlow`` (``pyserve.core.request_flow``).
``CoreServer`` knows nothing of the front ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from typing import Any

import zmq

from pyserve.config import ServeConfig
from pyserve.core.api import CoreApi
from pyserve.core.batches import BatchesInFlight
from pyserve.core.bls_broker import BlsBroker
from pyserve.core.cache import ResponseCache
from pyserve.core.inference import InferenceRequest, Instance, ModelEntry
from pyserve.core.logs import log_settings
from pyserve.core.metrics_collector import CoreMetrics
from pyserve.core.registry import Registry
from pyserve.core.remote_peers import RemotePeers, is_remote
from pyserve.core.repository_control import RepositoryControl
from pyserve.core.request_flow import RequestFlow, fail
from pyserve.core.shm_regions import SharedMemoryRegistry
from pyserve.core.stage_times import stage_times
from pyserve.core.status import CoreStatus
from pyserve.core.supervisor import STOP_TIMEOUT_S, open_pidfd
from pyserve.core.tracing import Tracing
from pyserve.core.worker_control import WorkerControl
from pyserve.errors import ModelNotReadyError, PyServeError, ServerError
from pyserve.transport.messages import pack_header, unpack_header
from pyserve.transport.protocol import (
    BatchResult,
    ControlReply,
    Header,
    MessageKind,
    OpenRemote,
    Serving,
    Shutdown,
    kind_of,
)
from pyserve.transport.shm import ShmPool, ShmReader, remove_segments

logger = logging.getLogger(__name__)

# The core watches its parent through a pidfd rather than PR_SET_PDEATHSIG, which fires when the spawning *thread*
# exits; where there are no pidfds it looks at its parent pid this often.
_PARENT_CHECK_S = 0.5

_DRAIN_POLL_S = 0.02

# The messages the BLS broker owns.
_BLS_KINDS = frozenset({MessageKind.BLS_REQUEST, MessageKind.BLS_CANCEL, MessageKind.BLS_FREE})


class CoreServer:
    """The core: registry, schedulers, batches, workers and observability on one asyncio loop.

    ``start()`` binds the worker socket, ``wait_stopped()`` runs until ``stop()`` or the parent process is gone,
    ``close()`` fails what is in flight and releases every socket, process and shared-memory segment.
    """

    def __init__(self, config: ServeConfig, router_address: str, shm_prefix: str, parent_pid: int) -> None:
        self.config = config
        self.router_address = router_address
        self.shm_prefix = shm_prefix
        self.parent_pid = parent_pid
        self.parent_gone = False
        self.registry = Registry()
        self._socket: zmq.Socket[Any] | None = None
        # After a batch is sent, the loop polls the worker socket for up to reply_spin_us instead of sleeping
        # until ZeroMQ's eventfd wakes it: the reply of a short batch is picked up one thread wake-up sooner.
        self._spin_ns = config.reply_spin_us * 1000
        self._spin_until_ns = 0
        self._spinning = False
        self._stopping: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool = ShmPool(f"{shm_prefix}-core", config.shm_pool_bytes)
        self._reader = ShmReader()
        # Observability (docs/monitoring.md): metrics read the counters when scraped; the cache, tracing and
        # per-request logs hook submit() only for the requests that use them.
        self.cache = ResponseCache(config.response_cache_bytes) if config.response_cache_bytes else None
        self.tracing = Tracing(config)
        self.logs = log_settings(config.log_level, config.log_format)
        # The debug switch: None (off) unless PYSERVE_STAGE_TIMES names a file (pyserve.core.stage_times).
        self.stage_times = stage_times(config.stage_times)
        self.metrics = CoreMetrics(
            self.registry,
            self.cache,
            summaries=config.metrics_summaries,
            histograms=config.metrics_histograms,
        )
        # The connected instances: identity -> (instance, model version, shm prefix of its output pool).
        connected: dict[bytes, tuple[Instance, ModelEntry, str]] = {}
        self.batches = BatchesInFlight(
            self._pool, self._reader, config.shm_threshold_bytes, self.tracing, connected, self._send, self.stage_times
        )
        self.requests = RequestFlow(self.tracing, self.logs, self.cache, self.batches.cancel_running)
        self.bls = BlsBroker(
            self.registry,
            connected,
            self.batches.pending,
            self._reader,
            send=self._send,
            submit=self.requests.submit,
            cancel=self.requests.cancel,
            ensembles=self.requests.ensembles,
        )
        self.workers = WorkerControl(
            config,
            shm_prefix,
            self.registry,
            connected,
            self.batches,
            self.bls,
            self.metrics,
            self._reader,
            send=self._send,
            is_stopping=self._is_stopping,
        )
        self.batches.on_hung = self.workers.on_hung
        self.repository = RepositoryControl(config, self.registry, self.workers)
        # Clients' shared-memory regions: mapped while registered, never unlinked (the clients own them).
        self.shared_memory = SharedMemoryRegistry(shm_prefix)
        self.api = CoreApi(
            submit=self.requests.submit,
            cancel=self.requests.cancel,
            is_ready=self._is_ready,
            models=self.registry,
            tracing=self.tracing,
            logs=self.logs,
            metrics_page=self.metrics.render,
            stage_times=self.stage_times,
            repository=self.repository,
            shared_memory=self.shared_memory,
            status=CoreStatus(self.workers),
        )
        # Bound once: the router runs for every message.
        # Remote peers (RemoteServe) on a tcp socket of their own, when ServeConfig.remote_port is set.
        self._remote: RemotePeers | None = None
        self.remote_address = ""
        self._on_result = self.batches.on_result
        self._on_bls = self.bls.on_message
        self._control = dict(self.workers.handlers)
        self._control[MessageKind.SERVING] = self._on_serving
        self._control[MessageKind.OPEN_REMOTE] = self._on_open_remote

    # lifecycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the worker socket (and the cancel publisher beside it); be ready to start instance processes."""
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
        self.batches.start_cancel_publisher(self.router_address, self._loop)
        self.workers.start(self.router_address, self._loop)
        if self.config.remote_port >= 0:
            self._start_remote(self._loop, self.config.remote_token)
        self.repository.start()

    def _on_open_remote(self, identity: bytes, header: Header) -> None:
        message = OpenRemote(header)
        if self._remote is None:
            try:
                assert self._loop is not None
                self._start_remote(self._loop, message.token)
            except PyServeError as exc:
                self._send(identity, ControlReply.build_error(message.request_id, str(exc)))
                return
        self._send(identity, ControlReply.build_ok(message.request_id, self.remote_address))

    def _start_remote(self, loop: asyncio.AbstractEventLoop, token: str) -> None:
        config = self.config
        host = config.remote_host or config.host
        port = str(config.remote_port if config.remote_port > 0 else "*")  # ZeroMQ's word for any free port
        address = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        remote = RemotePeers(address, token, self._on_message, self.workers.remote_gone, config.remote_peer_timeout_s)
        try:
            bound = remote.start(loop)
        except (zmq.ZMQError, PyServeError) as exc:
            remote.close()
            raise ServerError(f"could not open the remote port {address}: {exc}") from None
        self._remote = remote
        self.remote_address = self.api.remote_address = config.remote_advertise or bound

    def _on_serving(self, identity: bytes, header: Header) -> None:
        # Serve loaded what it bound before start; the answer waits for the repository's models loaded at start.
        async def answer() -> None:
            await self.repository.started()
            error = self.repository.start_error() if self.config.exit_on_error else None
            if error is not None:  # exit_on_error: Serve fails its start with this and stops the core
                logger.error("%s", error)
                self._send(identity, ControlReply.build_error(Serving(header).request_id, error), None)
                return
            self.workers.on_serving(identity, header)

        assert self._loop is not None
        task = self._loop.create_task(answer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
            if parent_fd is not None or not self.parent_pid:
                await self._stopping.wait()
            while not self._stopping.is_set():  # no pidfd here: look at the parent now and then
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
        # Its thread instances died with it: nothing in flight there can finish, so there is nothing to drain.
        self.parent_gone = True
        if self._stopping is not None and not self._stopping.is_set():
            logger.warning("parent process %d is gone; stopping", self.parent_pid)
            self.stop()

    def stop(self) -> None:
        """Ask the loop to stop serving (idempotent)."""
        if self._stopping is not None:
            self._stopping.set()

    async def close(self, grace_s: float = STOP_TIMEOUT_S) -> None:
        """Fail what is in flight; release sockets, instance processes (killed if they have not exited ``grace_s``
        after SIGTERM) and shared memory. Close the front ends first, so that nothing new arrives meanwhile."""
        for entry in self.registry.entries():
            if entry.scheduler is not None:
                for request in entry.scheduler.drain():
                    fail(request, ModelNotReadyError("the server is shutting down"))
        self.batches.fail_all(ModelNotReadyError("the server is shutting down"))
        self.repository.close()
        self.workers.close(grace_s)
        self.batches.close()
        if self._remote is not None:
            self._remote.close()
            self._remote = None
        if self._socket is not None and self._loop is not None:
            self._loop.remove_reader(self._socket.fileno())
            self._socket.close(linger=0)
            self._socket = None
        self._reader.close()
        self._pool.close()
        self.shared_memory.close()
        self.metrics.close()
        self.tracing.close()
        if self.stage_times is not None:
            self.stage_times.close()
        remove_segments(self.shm_prefix)
        _remove_ipc_endpoint(self.router_address)

    # draining (graceful shutdown) ----------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Take no new requests (front ends get ModelNotReadyError: 503 / UNAVAILABLE) and report not ready; what
        was accepted goes on, BLS calls and ensemble steps included."""
        self.workers.draining = True
        self.bls.draining = True

        def refuse(request: InferenceRequest) -> None:
            raise ModelNotReadyError("the server is shutting down: it takes no new requests")

        self.api.submit = refuse

    def in_flight(self) -> int:
        """Requests accepted and not yet answered: queued at a model, in a running batch, or ensembles under way."""
        queued = sum(entry.scheduler.queued_count() for entry in self.registry.entries() if entry.scheduler is not None)
        running = sum(len(pending.requests) for pending in self.batches.pending.values())
        return queued + running + len(self.requests.ensembles)

    async def drain(self, timeout_s: float) -> int:
        """Wait until nothing is in flight, at most ``timeout_s``; returns how many requests were left."""
        assert self._loop is not None
        deadline = self._loop.time() + timeout_s
        while (left := self.in_flight()) and self._loop.time() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        return left

    def _is_ready(self) -> bool:
        """Server readiness: the instances' (``WorkerControl.is_ready``) and, with ``strict_readiness``, no
        repository model unavailable (tritonserver's --strict-readiness)."""
        return self.workers.is_ready() and (not self.config.strict_readiness or self.repository.all_available())

    def _is_stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    # worker socket --------------------------------------------------------------------------------------------

    def _drain(self) -> None:
        # ZeroMQ's FD is edge-triggered: read until EVENTS says nothing is left.
        socket = self._socket
        if socket is None:
            return
        received = False
        while int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            received = True
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            identity = frames[0].bytes
            try:
                header = unpack_header(frames[1].buffer)
                self._on_message(identity, header, frames[2:])
            except Exception:
                logger.exception("error handling a message from a worker")
        if (
            not received
            and not self._spinning
            and self.batches.pending
            and self._spin_ns
            and time.monotonic_ns() < self._spin_until_ns
        ):
            # A ready callback makes the loop's next epoll return at once: HTTP and gRPC are still served while
            # the loop spins, and it sleeps again once the reply came or the spin budget is spent.
            self._spinning = True
            assert self._loop is not None
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        self._spinning = False
        self._drain()

    def _send(self, identity: bytes, header: Header, frames: list[Any] | None = None, spin: bool = True) -> None:
        assert self._loop is not None
        # Without a remote port (the usual case) no identity is remote: one attribute test on the hot path.
        if self._remote is not None and is_remote(identity):
            self._remote.send(identity, [pack_header(header), *(frames or ())])
            return
        if self._socket is None:
            return  # closed: the core is stopping
        try:
            self._socket.send_multipart([identity, pack_header(header), *(frames or ())], copy=False)
        except zmq.ZMQError as exc:
            logger.warning("could not send to worker %r: %s", identity, exc)
        # Sending can consume the edge that announced pending input: look again soon.
        if self._spin_ns and spin:
            self._spin_until_ns = time.monotonic_ns() + self._spin_ns
        self._loop.call_soon(self._drain)

    def _on_message(self, identity: bytes, header: Header, frames: list[Any]) -> None:
        kind = kind_of(header)
        if kind == MessageKind.RESULT:
            self._on_result(BatchResult(header), frames)
        elif kind in _BLS_KINDS:
            self._on_bls(identity, header, frames)
        elif kind == MessageKind.SHUTDOWN:
            self._send(identity, ControlReply.build_ok(Shutdown(header).request_id))
            self.stop()
        else:
            handler = self._control.get(kind)
            if handler is None:
                logger.warning("unknown message %r from worker", kind)
            else:
                handler(identity, header)


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
