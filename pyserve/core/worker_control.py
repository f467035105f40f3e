"""Worker control: what ``Serve`` and the instances say about models and instances, and the instance processes.

From ``Serve``'s control socket: ``load`` (a model version: registered with its scheduler; for process instances,
their processes are started and the answer waits until all of them said hello), ``load_ensemble``, ``unload``
(queued requests fail, instances are told to stop) and ``serving`` (what was bound before start is loaded: from
now on readiness is the models' own). From each instance: ``hello`` (it serves a model version, and has
subscribed to the cancel publisher: it is ``welcome``d and joins its model's scheduler, idle) and ``bye``. An instance
that leaves or whose process dies takes its batches with it: their requests fail with ``WorkerDiedError``. A
process that dies is restarted after a backoff (``Supervisor``), unless its model never became ready: then the
load fails with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Callable

from pyserve.config import ServeConfig, WorkerKind
from pyserve.core.batches import BatchesInFlight, Send
from pyserve.core.bls_broker import BlsBroker
from pyserve.core.ensemble_executor import load_ensemble
from pyserve.core.inference import Instance, ModelEntry
from pyserve.core.metrics_collector import CoreMetrics
from pyserve.core.registry import Registry
from pyserve.core.request_flow import deliver, fail, reject
from pyserve.core.response_orderer import ResponseOrderer
from pyserve.core.scheduler import ModelScheduler
from pyserve.core.supervisor import Supervisor, WorkerProcess, describe_exit
from pyserve.errors import ConfigError, InferenceError, ModelNotReadyError, PyServeError, WorkerDiedError
from pyserve.transport.protocol import (
    ControlReply,
    Header,
    Hello,
    Load,
    LoadEnsemble,
    MessageKind,
    Refused,
    Serving,
    Stop,
    Unload,
    Welcome,
)
from pyserve.transport.shm import ShmReader, remove_segments

logger = logging.getLogger(__name__)

Handler = Callable[[bytes, Header], None]


class WorkerControl:
    """Loads and unloads models, admits and removes instances, and supervises instance processes.

    ``connected`` is the core's map of connected instances (identity -> (instance, model version, shm prefix)),
    kept here and read by the batches and the BLS broker. ``is_stopping()`` says the core is shutting down (a dead
    process is then not restarted).
    """

    def __init__(
        self,
        config: ServeConfig,
        shm_prefix: str,
        registry: Registry,
        connected: dict[bytes, tuple[Instance, ModelEntry, str]],
        batches: BatchesInFlight,
        bls: BlsBroker,
        metrics: CoreMetrics,
        reader: ShmReader,
        *,
        send: Send,
        is_stopping: Callable[[], bool],
    ) -> None:
        self.registry = registry
        self.serving = False
        self._config = config
        self._shm_prefix = shm_prefix
        self._connected = connected
        self._batches = batches
        self._bls = bls
        self._metrics = metrics
        self._reader = reader
        self._send = send
        self._is_stopping = is_stopping
        self._loop: asyncio.AbstractEventLoop | None = None
        self._supervisor: Supervisor | None = None
        self._work_dir = ""
        # (model, version) -> (control identity, request id) of a load waiting for its process instances.
        self._loading: dict[tuple[str, int], tuple[bytes, int]] = {}
        self.handlers: dict[str, Handler] = {
            MessageKind.HELLO: self._on_hello,
            MessageKind.BYE: self._on_bye,
            MessageKind.LOAD: self._on_load,
            MessageKind.LOAD_ENSEMBLE: self._on_load_ensemble,
            MessageKind.UNLOAD: self._on_unload,
            MessageKind.SERVING: self._on_serving,
        }

    def start(self, router_address: str, loop: asyncio.AbstractEventLoop) -> None:
        """Be ready to start instance processes that connect to ``router_address``."""
        self._loop = loop
        self._work_dir = tempfile.mkdtemp(prefix="pyserve-core-")
        config = self._config
        self._supervisor = Supervisor(
            router_address,
            self._shm_prefix,
            config.shm_threshold_bytes,
            config.shm_pool_bytes,
            self._on_process_exit,
            loop,
            debug_errors=config.debug_errors,
            stage_times=bool(config.stage_times),
            cancel_address=self._batches.cancel_address,
        )

    def close(self) -> None:
        """Stop every instance process; remove the functions shipped to them."""
        if self._supervisor is not None:
            self._supervisor.close()
        if self._work_dir:
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def is_ready(self) -> bool:
        """Server readiness: the models bound before start are loaded, and every model has a live instance."""
        return self.serving and all(entry.ready for entry in self.registry.entries())

    # models -------------------------------------------------------------------------------------------------------

    def _on_load(self, identity: bytes, header: Header) -> None:
        load = Load(header)
        payload = load.payload
        try:
            spec = load.spec
            processes = spec.config.worker is WorkerKind.PROCESS
            if processes and payload is None:
                raise ConfigError(f"model '{spec.name}' has process instances, but its load carries no functions")
            entry = ModelEntry(spec)
            self.registry.add(entry)
            entry.scheduler = self._make_scheduler(entry)
        except PyServeError as exc:
            self._send(identity, ControlReply.build_error(load.request_id, str(exc)), None)
            return
        if processes:
            assert payload is not None
            self._start_processes(identity, load.request_id, entry, payload)
            return
        self._send(identity, ControlReply.build_ok(load.request_id), None)

    def _make_scheduler(self, entry: ModelEntry) -> ModelScheduler:
        assert self._loop is not None
        batcher = entry.spec.config.batcher
        orderer = None
        if entry.spec.config.dynamic_batching and batcher is not None and batcher.preserve_ordering:
            orderer = ResponseOrderer(deliver)
        return ModelScheduler(entry, self._batches.dispatch, self._loop.call_later, reject=reject, orderer=orderer)

    def _on_load_ensemble(self, identity: bytes, header: Header) -> None:
        message = LoadEnsemble(header)
        try:
            load_ensemble(message.ensemble, self.registry)
        except PyServeError as exc:
            self._send(identity, ControlReply.build_error(message.request_id, str(exc)), None)
            return
        self._send(identity, ControlReply.build_ok(message.request_id), None)

    def _on_unload(self, identity: bytes, header: Header) -> None:
        message = Unload(header)
        self._unload(message.name, message.version, "it was unloaded")
        self._send(identity, ControlReply.build_ok(message.request_id), None)

    def _unload(self, name: str, version: int, why: str) -> None:
        entry = self.registry.remove(name, version)
        if entry is None:
            return
        if entry.scheduler is not None:
            for request in entry.scheduler.drain():
                fail(request, ModelNotReadyError(f"model '{entry.name}' is not available: {why}"))
        for instance in list(entry.instances):
            self._send(instance.identity, Stop.build(), None)
            self._remove_instance(instance.identity, ModelNotReadyError(f"model '{entry.name}': {why}"))
        if self._supervisor is not None:
            self._supervisor.remove_model(name, version)

    def _on_serving(self, identity: bytes, header: Header) -> None:
        # Serve loaded what was bound before start: from now on readiness is the models' own.
        self.serving = True
        self._send(identity, ControlReply.build_ok(Serving(header).request_id), None)

    # instances ----------------------------------------------------------------------------------------------------

    def _on_hello(self, identity: bytes, header: Header) -> None:
        hello = Hello(header)
        try:
            entry = self.registry.get(hello.model, hello.version)
        except InferenceError as exc:
            self._send(identity, Refused.build(str(exc)), None)
            return
        instance = Instance(identity, hello.instance_index, hello.instance_kind, hello.pid)
        entry.instances.append(instance)
        self._metrics.model_ready(entry)
        self._connected[identity] = (instance, entry, hello.shm_prefix)
        self._send(identity, Welcome.build(self._batches.cancel_address), None)
        assert entry.scheduler is not None
        entry.scheduler.add_instance(instance)
        if instance.kind == "process" and self._supervisor is not None:
            worker = self._supervisor.find(instance.pid)
            if worker is not None:
                worker.ready = True
            self._maybe_finish_load(entry)

    def _on_bye(self, identity: bytes, header: Header) -> None:
        known = self._connected.get(identity)
        if known is not None:
            self._remove_instance(
                identity, WorkerDiedError(f"instance {known[0].index} of model '{known[1].name}' left")
            )

    def _remove_instance(self, identity: bytes, error: InferenceError) -> None:
        known = self._connected.pop(identity, None)
        if known is None:
            return
        self._bls.instance_gone(identity)
        instance, entry, shm_prefix = known
        if instance in entry.instances:
            entry.instances.remove(instance)
        if entry.scheduler is not None:
            entry.scheduler.remove_instance(instance)
        self._reader.forget(shm_prefix)
        if instance.kind == "process":
            remove_segments(shm_prefix)
        self._batches.fail_on(instance, error)

    # instance processes -------------------------------------------------------------------------------------------

    def _start_processes(self, identity: bytes, rid: int, entry: ModelEntry, payload: bytes) -> None:
        assert self._supervisor is not None
        path = os.path.join(self._work_dir, f"{entry.name}-{entry.version}.pkl")
        with open(path, "wb") as handle:
            handle.write(payload)
        self._loading[(entry.name, entry.version)] = (identity, rid)
        config = entry.spec.config
        self._supervisor.add(entry.name, entry.version, config.instances, config.devices, path)

    def _maybe_finish_load(self, entry: ModelEntry) -> None:
        key = (entry.name, entry.version)
        loading = self._loading.get(key)
        if loading is not None and len(entry.instances) >= entry.spec.config.instances:
            del self._loading[key]
            self._send(loading[0], ControlReply.build_ok(loading[1]), None)

    def _on_process_exit(self, worker: WorkerProcess, status: int) -> None:
        how = describe_exit(status)
        for identity, (instance, entry, _) in list(self._connected.items()):
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
            self._send(loading[0], ControlReply.build_error(loading[1], message), None)
            return
        if self._is_stopping():
            return
        assert self._supervisor is not None
        delay = self._supervisor.schedule_restart(worker)
        logger.error(
            "instance %d of model '%s' died (%s); restarting in %.1f s", worker.index, worker.model, how, delay
        )
