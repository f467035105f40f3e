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
from functools import partial

from pyserve.config import ModelSpec, ServeConfig, WorkerKind
from pyserve.core.batches import BatchesInFlight, Send
from pyserve.core.bls_broker import BlsBroker
from pyserve.core.ensemble_executor import load_ensemble
from pyserve.core.inference import REMOTE_KIND, Instance, ModelEntry
from pyserve.core.metrics_collector import CoreMetrics
from pyserve.core.registry import Registry
from pyserve.core.remote_peers import is_remote
from pyserve.core.request_flow import deliver, fail, reject
from pyserve.core.response_orderer import ResponseOrderer
from pyserve.core.scheduler import ModelScheduler
from pyserve.core.sequence_batcher import SequenceScheduler
from pyserve.core.supervisor import STOP_TIMEOUT_S, Supervisor, WorkerProcess, describe_exit
from pyserve.errors import (
    ConfigError,
    InferenceError,
    ModelAlreadyBoundError,
    ModelNotReadyError,
    PyServeError,
    WorkerDiedError,
)
from pyserve.transport.payload import error_path
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

# How long a replaced or unloaded model version may take to answer what it accepted, and how often it is looked at.
RETIRE_TIMEOUT_S = 60.0
_RETIRE_POLL_S = 0.05

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
        self.draining = False  # the server is shutting down: not ready, whatever the models say
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
        # A model version whose process instances are starting -> what to call once they all said hello.
        self._loading: dict[ModelEntry, Callable[[str | None], None]] = {}
        self._payloads = 0
        # A remote peer's control identity -> the model versions it loaded (unloaded when it disconnects).
        self._remote_models: dict[bytes, set[tuple[str, int]]] = {}
        self.handlers: dict[str, Handler] = {
            MessageKind.HELLO: self._on_hello,
            MessageKind.BYE: self._on_bye,
            MessageKind.LOAD: self._on_load,
            MessageKind.LOAD_ENSEMBLE: self._on_load_ensemble,
            MessageKind.UNLOAD: self._on_unload,
            MessageKind.SERVING: self.on_serving,
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
            spin_us=config.worker_spin_us,
            cancel_address=self._batches.cancel_address,
        )

    def close(self, grace_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every instance process (killed after ``grace_s``); remove the functions shipped to them."""
        if self._supervisor is not None:
            self._supervisor.close(grace_s)
        if self._work_dir:
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def is_ready(self) -> bool:
        """Server readiness: the models bound before start are loaded, and every model has a live instance."""
        return self.serving and not self.draining and all(entry.ready for entry in self.registry.entries())

    # models -------------------------------------------------------------------------------------------------------

    def _on_load(self, identity: bytes, header: Header) -> None:
        load = Load(header)

        def answer(error: str | None) -> None:
            reply = (
                ControlReply.build_ok(load.request_id)
                if error is None
                else ControlReply.build_error(load.request_id, error)
            )
            self._send(identity, reply, None)

        try:
            spec = load.spec
        except PyServeError as exc:
            answer(str(exc))
            return
        if is_remote(identity):
            # A remote peer's models go when it does (remote_gone).
            def answer_remote(error: str | None) -> None:
                if error is None:
                    self._remote_models.setdefault(identity, set()).add((spec.name, spec.version))
                answer(error)

            self.load_model(spec, load.payload, answer_remote)
            return
        self.load_model(spec, load.payload, answer)

    def load_model(
        self, spec: ModelSpec, payload: bytes | None, done: Callable[[str | None], None], *, replace: bool = False
    ) -> ModelEntry | None:
        """Serve a model version: register it with a scheduler and, for process instances, start their processes.

        ``done(None)`` is called once it serves (for process instances: once all of them said hello), or
        ``done(reason)`` when it cannot. With ``replace`` (the repository's loads), the version joins the registry
        only once ready, so requests never meet it without instances: a version already served keeps serving until
        then, and drains once the new one has taken its place (``retire``).
        """
        processes = spec.config.worker is WorkerKind.PROCESS
        try:
            if processes and payload is None:
                raise ConfigError(f"model '{spec.name}' has process instances, but its load carries no functions")
            entry = ModelEntry(spec)
            entry.scheduler = self._make_scheduler(entry)
            old = self._served(spec.name, spec.version)
            if old is not None and not (replace and processes):
                raise ModelAlreadyBoundError(f"model '{spec.name}' version {spec.version} is already bound")
        except PyServeError as exc:
            done(str(exc))
            return None
        if not processes:
            self.registry.add(entry)
            done(None)
            return entry
        assert payload is not None
        if not replace:
            self.registry.add(entry)  # listed (not ready) while its instances start
        self._start_processes(entry, payload, done)
        return entry

    def _served(self, name: str, version: int) -> ModelEntry | None:
        return next((e for e in self.registry.versions(name) if e.version == version), None)

    def _make_scheduler(self, entry: ModelEntry) -> ModelScheduler | SequenceScheduler:
        assert self._loop is not None
        sequences = entry.spec.config.sequence_batcher
        if sequences is not None:
            ordered = ResponseOrderer(deliver) if sequences.preserve_ordering else None
            return SequenceScheduler(entry, self._batches.dispatch, self._loop.call_later, orderer=ordered)
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
        if is_remote(identity):
            # A peer detaches what it attached, nothing else: the server's own models and other peers' are not its.
            loaded = self._remote_models.get(identity, set())
            if (message.name, message.version) not in loaded:
                refusal = (
                    f"a remote peer may unload only the models it attached: model '{message.name}' version "
                    f"{message.version} is not one of them"
                )
                self._send(identity, ControlReply.build_error(message.request_id, refusal), None)
                return
            loaded.discard((message.name, message.version))
        reply = ControlReply.build_ok(message.request_id)
        if message.drain_s:
            # A graceful detach (RemoteServe.stop): no new requests; what was accepted finishes on the instances,
            # which the peer keeps running until this reply.
            entry = self.registry.remove(message.name, message.version)
            if entry is not None:
                done = partial(self._send, identity, reply, None)
                self.retire(entry, "it was unloaded", done, timeout_s=message.drain_s)
                return
        self.unload(message.name, message.version, "it was unloaded")
        self._send(identity, reply, None)

    def unload(self, name: str, version: int, why: str) -> None:
        """Stop serving a model version at once: its queued requests fail, its instances are told to stop."""
        entry = self.registry.remove(name, version)
        if entry is not None:
            self._stop_entry(entry, why)

    def _stop_entry(self, entry: ModelEntry, why: str) -> None:
        if entry.scheduler is not None:
            for request in entry.scheduler.drain():
                fail(request, ModelNotReadyError(f"model '{entry.name}' is not available: {why}"))
        for instance in list(entry.instances):
            self._send(instance.identity, Stop.build(), None)
            self._remove_instance(instance.identity, ModelNotReadyError(f"model '{entry.name}': {why}"))
        if self._supervisor is not None:
            self._supervisor.remove_entry(entry)
        for key in [key for key in self._loading if key is entry]:
            self._loading.pop(key)(f"model '{entry.name}' was unloaded while loading")

    def abort_load(self, name: str, version: int, why: str) -> None:
        """Give up a load whose process instances are still starting: they stop, and the load fails with ``why``."""
        for entry in [e for e in self._loading if e.name == name and e.version == version]:
            done = self._loading.pop(entry)
            if self._served(name, version) is entry:
                self.registry.remove(name, version)
            self._stop_entry(entry, why)
            done(why)

    def retire(
        self, entry: ModelEntry, why: str, done: Callable[[], None] | None = None, timeout_s: float = RETIRE_TIMEOUT_S
    ) -> None:
        """Stop serving a model version once what it already accepted is answered.

        The entry is no longer in the registry (new requests go elsewhere or are refused); its queue and the batches
        on its instances finish, then its instances stop. After ``timeout_s`` what is left fails.
        """
        assert self._loop is not None
        deadline = self._loop.time() + timeout_s

        def check() -> None:
            assert self._loop is not None
            scheduler = entry.scheduler
            queued = scheduler.queued_count() if scheduler is not None else 0
            busy = any(instance.busy for instance in entry.instances)
            if (queued or busy) and self._loop.time() < deadline and not self._is_stopping():
                self._loop.call_later(_RETIRE_POLL_S, check)
                return
            self._stop_entry(entry, why)
            if done is not None:
                done()

        check()

    def on_serving(self, identity: bytes, header: Header) -> None:
        """Serve loaded what was bound before start: from now on readiness is the models' own."""
        self.serving = True
        self._send(identity, ControlReply.build_ok(Serving(header).request_id), None)

    # instances ----------------------------------------------------------------------------------------------------

    def _on_hello(self, identity: bytes, header: Header) -> None:
        hello = Hello(header)
        remote = is_remote(identity)
        # A process instance joins the model version its process was started for (during a reload, two versions
        # of the same name and number exist); a thread instance the one registered. A remote peer's pid means
        # nothing here, and its kind is "remote" whatever it says (inline tensors, no local segments to remove).
        worker = self._supervisor.find(hello.pid) if self._supervisor is not None and hello.pid and not remote else None
        if worker is not None and worker.entry is not None:
            entry = worker.entry
        else:
            try:
                entry = self.registry.get(hello.model, hello.version)
            except InferenceError as exc:
                self._send(identity, Refused.build(str(exc)), None)
                return
        kind = REMOTE_KIND if remote else hello.instance_kind
        instance = Instance(
            identity,
            hello.instance_index,
            kind,
            hello.pid,
            host=hello.host,
            node=hello.node,
            device=hello.device,
            runs_as=hello.instance_kind,
        )
        entry.instances.append(instance)
        self._metrics.model_ready(entry)
        self._connected[identity] = (instance, entry, hello.shm_prefix)
        # Remote instances do not hear the publisher, a socket on this host: they have their session's cancel
        # socket on the remote port (pyserve.core.remote_peers).
        self._send(identity, Welcome.build("" if remote else self._batches.cancel_address), None)
        assert entry.scheduler is not None
        entry.scheduler.add_instance(instance)
        if worker is not None:
            worker.ready = True
            self._maybe_finish_load(entry)

    def _on_bye(self, identity: bytes, header: Header) -> None:
        known = self._connected.get(identity)
        if known is not None:
            self._remove_instance(
                identity, WorkerDiedError(f"instance {known[0].index} of model '{known[1].name}' left")
            )

    def on_hung(self, instance: Instance, why: str) -> None:
        """An instance ran a batch past its execution timeout (its requests have failed): a process instance is
        killed and restarted; a thread cannot be stopped, so a thread (or remote) instance serves again once its
        function returns."""
        worker = self._supervisor.find(instance.pid) if self._supervisor is not None and instance.pid else None
        if instance.kind == "process" and worker is not None and worker.process is not None:
            logger.error("%s: killing its process (pid %d); it is restarted", why, instance.pid)
            worker.process.kill()
            return
        logger.error(
            "%s: a %s instance cannot be stopped; it serves again when its function returns", why, instance.kind
        )

    def remote_gone(self, identity: bytes) -> None:
        """A remote peer's connection closed: its instance (if it was one) and the models it loaded are gone."""
        known = self._connected.get(identity)
        if known is not None:
            instance, entry, _ = known
            self._remove_instance(
                identity,
                WorkerDiedError(f"instance {instance.index} of model '{entry.name}' lost its remote connection"),
            )
        for name, version in sorted(self._remote_models.pop(identity, ())):
            logger.warning("model '%s' version %d: its remote server disconnected; unloading it", name, version)
            self.unload(name, version, "its remote server disconnected")
        self._bls.instance_gone(identity)

    def _remove_instance(self, identity: bytes, error: InferenceError) -> None:
        known = self._connected.pop(identity, None)
        if known is None:
            return
        self._bls.instance_gone(identity)
        instance, entry, shm_prefix = known
        if instance in entry.instances:
            entry.instances.remove(instance)
        if entry.scheduler is not None:
            entry.scheduler.remove_instance(instance, error)
        self._reader.forget(shm_prefix)
        if instance.kind == "process":
            remove_segments(shm_prefix)
        self._batches.fail_on(instance, error)

    # instance processes -------------------------------------------------------------------------------------------

    def _start_processes(self, entry: ModelEntry, payload: bytes, done: Callable[[str | None], None]) -> None:
        assert self._supervisor is not None
        self._payloads += 1
        path = os.path.join(self._work_dir, f"{entry.name}-{entry.version}-{self._payloads}.pkl")
        with open(path, "wb") as handle:
            handle.write(payload)
        self._loading[entry] = done
        config = entry.spec.config
        self._supervisor.add(entry, config.instances, config.devices, path)

    def _maybe_finish_load(self, entry: ModelEntry) -> None:
        if entry in self._loading and len(entry.instances) >= entry.spec.config.instances:
            done = self._loading.pop(entry)
            old = self._served(entry.name, entry.version)
            if old is not entry:
                # A reload: the new version takes the old one's place, which drains.
                if old is not None:
                    self.registry.remove(entry.name, entry.version)
                    self.retire(old, "a new copy of it was loaded")
                self.registry.add(entry)
            done(None)

    def processes(self, entry: ModelEntry) -> list[WorkerProcess]:
        """The supervised processes of a model version's process instances (none for thread or remote ones)."""
        if self._supervisor is None:
            return []
        return [worker for worker in self._supervisor.workers if worker.entry is entry]

    def _on_process_exit(self, worker: WorkerProcess, status: int) -> None:
        how = describe_exit(status)
        worked = False
        for identity, (instance, _, _) in list(self._connected.items()):
            if instance.kind == "process" and instance.pid == worker.last_pid:
                worked = worked or instance.batches_done > 0
                self._remove_instance(
                    identity,
                    WorkerDiedError(
                        f"instance {instance.index} of model '{worker.model}' (pid {instance.pid}) died: {how}"
                    ),
                )
        loading = worker.entry
        if loading is not None and loading in self._loading and not worker.ready:
            # The model never became ready: fail the load with the reason, stop the other instances.
            done = self._loading.pop(loading)
            if self._served(loading.name, loading.version) is loading:
                self.registry.remove(loading.name, loading.version)
            self._stop_entry(loading, "its instance failed to start")
            done(
                f"instance {worker.index} of model '{worker.model}' exited before it was ready ({how}): "
                f"{_start_error(worker)}"
            )
            return
        if self._is_stopping():
            return
        assert self._supervisor is not None
        delay = self._supervisor.schedule_restart(worker, worked)
        logger.error(
            "instance %d of model '%s' died (%s); restarting in %.1f s", worker.index, worker.model, how, delay
        )


def _start_error(worker: WorkerProcess) -> str:
    """Why an instance process could not start: the last line of the error it wrote (the full text is in the log)."""
    try:
        with open(error_path(worker.payload_path, worker.index)) as handle:
            text = handle.read().strip()
    except OSError:
        return "its error output is above"
    return text.splitlines()[-1] if text else "its error output is above"
