"""``Serve``: bind Python functions as models and run the core serving process for them.

Serve only wires the pieces and manages their lifetime: it spawns the core process (``python -m pyserve.core``),
which reports readiness on a pipe; loads each bound model into it over a ZeroMQ control socket; and starts the
model's instances as threads that connect to the core themselves (``pyserve.thread_instances``).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import reprlib
import secrets
import signal
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

import numpy as np

from pyserve.config import ModelConfig, ModelSpec, ServeConfig, Tensor, WorkerKind, as_tensors
from pyserve.core.supervisor import describe_exit
from pyserve.core_process import ControlChannel, CoreProcess
from pyserve.ensemble import EnsembleSpec, Step, check_models, spec_lookup
from pyserve.errors import ConfigError, ModelAlreadyBoundError, PyServeError, ServerError
from pyserve.inprocess import LocalCaller
from pyserve.ray_instances import RayInstances
from pyserve.routes.server import ServedRoutes
from pyserve.thread_instances import CoreLink, ThreadInstances
from pyserve.transport.payload import build_payload
from pyserve.transport.protocol import Load, LoadEnsemble, OpenRemote, Serving, Unload
from pyserve.transport.shm import remove_segments

logger = logging.getLogger(__name__)

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


@dataclasses.dataclass(eq=False)
class _BoundModel:
    spec: ModelSpec
    functions: list[Callable[..., Any]]
    payload: bytes | None = None
    loaded: bool = False


@dataclasses.dataclass(frozen=True)
class Binding:
    """A model bound to a ``Serve``: its spec and its callables, one per instance (the same one repeated when one
    callable was bound)."""

    spec: ModelSpec
    functions: tuple[Callable[..., Any], ...]


class Serve:
    """A pyserve server: ``with Serve() as s: s.bind(...); s.serve()`` (or ``s.run()`` to return at once)."""

    def __init__(self, config: ServeConfig | None = None, *, model_repository: str | os.PathLike[str] | None = None):
        """``model_repository`` (or ``ServeConfig.model_repository``) serves a Triton-layout model repository beside
        the bound models; its other settings (control mode, ...) are ServeConfig fields (docs/repository.md)."""
        config = config if config is not None else ServeConfig.from_env()
        if model_repository is not None:
            config = dataclasses.replace(config, model_repository=os.fspath(model_repository))
        self.config = config
        self._models: dict[tuple[str, int], _BoundModel] = {}
        self._ensembles: dict[tuple[str, int], EnsembleSpec] = {}
        self._loaded_ensembles: set[tuple[str, int]] = set()
        self._core: CoreProcess | None = None
        self._stop_event = threading.Event()  # the instances' loops end when it is set
        self._stop_requested = threading.Event()  # stop() was called: the core's exit is no failure then
        self._stop_lock = threading.Lock()  # stop() may come from the core watcher, serve() and the user at once
        self._session = f"pyserve-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._threads = ThreadInstances(self._stop_event, self._session)
        self._ray = RayInstances(self._session)
        self._remote_token = ""  # the token of a remote port opened for Ray instances
        self._announced = False
        self._local: LocalCaller | None = None
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self._routes = ServedRoutes(config)

    # public API -----------------------------------------------------------------------------------------------

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
        model_version: int = 1,
        strict: bool = False,
    ) -> None:
        """Serve ``infer_func`` as ``model_name``. A list of callables makes one thread instance each.

        Before ``run()`` the model is recorded; on a running server it is loaded at once.
        """
        spec, functions = bound_model(model_name, infer_func, inputs, outputs, config, model_version, strict)
        payload = build_payload(spec, functions) if spec.config.worker is WorkerKind.PROCESS else None
        self._add_model(spec, functions, payload)

    def _add_model(self, spec: ModelSpec, functions: list[Callable[..., Any]], payload: bytes | None) -> None:
        model_name, model_version = spec.name, spec.version
        key = (model_name, model_version)
        if key in self._models:
            raise ModelAlreadyBoundError(f"model '{model_name}' version {model_version} is already bound")
        if any(name == model_name for name, _ in self._ensembles):
            raise ModelAlreadyBoundError(f"an ensemble named '{model_name}' is already bound")
        bound = _BoundModel(spec, functions, payload)
        self._models[key] = bound
        if self._core is not None:
            try:
                self._load(bound)
            except BaseException:
                self._models.pop(key, None)
                raise

    def bindings(self) -> list[Binding]:
        """The models bound with ``bind`` / ``bind_model``, in the order they were bound (not ensembles, nor the
        models of a repository)."""
        return [Binding(bound.spec, tuple(bound.functions)) for bound in self._models.values()]

    def bind_model(
        self,
        model_name: str,
        model_file: str | os.PathLike[str],
        *,
        inputs: Sequence[Tensor] | None = None,
        outputs: Sequence[Tensor] | None = None,
        config: ModelConfig | None = None,
        backend: str | None = None,
        model_version: int = 1,
        reshape: dict[str, tuple[int, ...]] | None = None,
        op_libraries: Sequence[str] = (),
    ) -> None:
        """Serve a model file (``.onnx``, TorchScript ``.pt``, TensorRT ``.plan``, or a ``model.py``) as
        ``model_name``, in process instances placed by ``config.devices``, without a repository.

        ``backend`` defaults from the file's suffix. Tensors left out are read from the file where its format says
        them (ONNX, TensorRT); without ``config``, a file whose tensors all have a variable first dimension batches
        (``max_batch_size`` 4, dynamic batching on, as Triton's auto-complete does).
        """
        from pyserve.backends import BackendModel, backend_for_file
        from pyserve.repository.autocomplete import complete_binding

        path = Path(model_file).resolve()
        if not path.is_file():
            raise ConfigError(f"model '{model_name}': model file '{model_file}' does not exist")
        name = backend or backend_for_file(path)
        inputs, outputs, config = complete_binding(model_name, name, path, inputs, outputs, config)
        spec = _spec(model_name, model_version, inputs, outputs, config)
        from pyserve.backends import backend as backend_module
        from pyserve.core.model_documents import model_config_json

        model = BackendModel(
            spec=spec,
            model_file=path,
            version_dir=path.parent,
            model_dir=path.parent,
            reshape=dict(reshape or {}),
            op_libraries=tuple(op_libraries),
            config_json=model_config_json(spec),
        )
        target = backend_module(name).create(model)
        self._add_model(spec, [target], build_payload(spec, [target]))

    # in-process calls -----------------------------------------------------------------------------------------------

    def infer(
        self,
        model_name: str,
        inputs: Mapping[str, Any],
        *,
        model_version: int | None = None,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        """Call a model of this running server from its own process, without HTTP or gRPC.

        ``inputs`` maps names to arrays (with the batch dimension when the model batches); returns the outputs (all,
        or ``outputs``) as numpy arrays. The call is scheduled and batched with the network requests, counts in the
        statistics, and raises the same errors (``InvalidInputError``, ``ModelNotFoundError``, ...). Any thread may
        call it (each gets a socket of its own); inside an infer function use ``pyserve.infer`` (BLS) instead.
        """
        return self._local_calls().infer(model_name, inputs, **_call_options(locals()))

    async def ainfer(
        self,
        model_name: str,
        inputs: Mapping[str, Any],
        *,
        model_version: int | None = None,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        """``infer`` for asyncio code: awaits the outputs on the running event loop."""
        return await self._local_calls().ainfer(model_name, inputs, **_call_options(locals()))

    def infer_stream(
        self,
        model_name: str,
        inputs: Mapping[str, Any],
        *,
        model_version: int | None = None,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> Iterator[dict[str, np.ndarray]]:
        """Call a decoupled (streaming) model and iterate its responses as they come; closing the iterator early
        withdraws the request."""
        return self._local_calls().infer_stream(model_name, inputs, **_call_options(locals()))

    def ainfer_stream(
        self,
        model_name: str,
        inputs: Mapping[str, Any],
        *,
        model_version: int | None = None,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """``infer_stream`` for ``async for``."""
        return self._local_calls().ainfer_stream(model_name, inputs, **_call_options(locals()))

    # front doors for existing applications (docs/routes.md) ------------------------------------------------------

    def route(self, path: str, methods: Sequence[str] = ("GET",)) -> Callable[[_Handler], _Handler]:
        """Decorator: serve ``handler(request)`` at ``path`` on ``ServeConfig.routes_port``, for clients that send
        their own JSON (a Flask ``/predict``) rather than KServe v2.

        The handler gets a Starlette ``Request`` (``request.get_json()`` works in sync handlers too) and returns a
        dict or list (JSON), a Starlette ``Response``, or a generator (Server-Sent Events); inside it, call models
        with ``server.infer`` (sync handlers, run in worker threads) or ``await server.ainfer`` (``async def``).
        Routes run in this process, served by uvicorn once the server runs; ``pip install 'pyserve[routes]'``.
        """

        def declare(handler: _Handler) -> _Handler:
            self._routes.declare(path, methods, handler)
            return handler

        return declare

    def asgi_app(self) -> Any:
        """A Starlette app with the KServe v2 routes, infer through ``ainfer``, to mount into an existing ASGI app
        (``app.mount("/kserve", server.asgi_app())``) run under its own uvicorn (docs/routes.md)."""
        from pyserve.routes.kserve_app import kserve_app

        return kserve_app(self)

    @property
    def routes_port(self) -> int:
        """The port the custom routes are served on (0 while none is served)."""
        return self._routes.port

    @property
    def routes_url(self) -> str:
        """Base URL of the custom routes, e.g. ``http://127.0.0.1:8003`` ("" while none is served)."""
        return f"{self._scheme('routes')}://{self.config.host}:{self._routes.port}" if self._routes.port else ""

    def _local_calls(self) -> LocalCaller:
        if self._local is None or not self.is_running:
            raise ServerError("Serve.infer() needs a running server: call run() (or use `with Serve() as s:`) first")
        return self._local

    def run(self) -> Serve:
        """Start the core process and load every bound model; returns once all are ready."""
        if self._core is None:
            self._stop_event.clear()
            self._stop_requested.clear()
            self._start_core()
            atexit.register(self.stop)
            self._routes.listen()  # answering 503 until the models below are loaded
        self._load_all([bound for bound in self._models.values() if not bound.loaded])
        for key, ensemble in list(self._ensembles.items()):
            if key not in self._loaded_ensembles:
                self._load_ensemble(ensemble)
        # The core answers once the models of its repository loaded at start are loaded (or failed) too; with
        # exit_on_error, a failed one fails the start.
        reply = self._core_process().request(Serving.build, self.config.model_load_timeout_s)
        if reply.error is not None:
            self.stop()
            self._stop_requested.clear()  # this start failed: no stop() from elsewhere to be quiet about (serve())
            raise ServerError(reply.error)
        self._routes.ready()
        if not self._announced and (self._models or self._ensembles or self.config.model_repository):
            # Once per start, with models to call: the Quickstart starts the core (`with Serve()`) before it binds,
            # and announces when serve() runs this again.
            self._announced = True
            _announce(f"pyserve serving {self._endpoints()}")
        return self

    def bind_ensemble(
        self,
        model_name: str,
        steps: Sequence[Step],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        max_batch_size: int = 0,
        model_version: int = 1,
    ) -> None:
        """Serve a pipeline of bound models as ``model_name``: ``steps`` form a DAG whose edges are named tensors.

        ``inputs`` and ``outputs`` declare the ensemble's own tensors, as for ``bind``. The graph and its models
        (bind them first) are checked at once; a mistake raises ConfigError naming the step and tensor.
        """
        ensemble = EnsembleSpec(
            name=model_name,
            version=model_version,
            inputs=as_tensors(inputs, "inputs"),
            outputs=as_tensors(outputs, "outputs"),
            steps=tuple(steps),
            max_batch_size=max_batch_size,
        )
        key = (model_name, model_version)
        if key in self._ensembles or any(name == model_name for name, _ in self._models):
            raise ModelAlreadyBoundError(f"a model named '{model_name}' (version {model_version}) is already bound")
        known = [bound.spec for bound in self._models.values()] + [e.model_spec() for e in self._ensembles.values()]
        check_models(ensemble, spec_lookup(known))
        self._ensembles[key] = ensemble
        if self._core is not None:
            try:
                self._load_ensemble(ensemble)
            except BaseException:
                self._ensembles.pop(key, None)
                raise

    def serve(self) -> None:
        """Run and block until Ctrl+C, SIGTERM or the core process exits; then stop."""
        try:
            self.run()
        except PyServeError:
            if self._stop_requested.is_set():
                return  # stop() from another thread while this one was still starting: nothing to serve
            raise
        handled = (signal.SIGINT, signal.SIGTERM)
        in_main = threading.current_thread() is threading.main_thread()
        previous = {signum: signal.getsignal(signum) for signum in handled} if in_main else {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt

        # Installed explicitly: a process started in the background inherits SIGINT ignored.
        for signum in previous:
            signal.signal(signum, on_signal)
        try:
            core = self._core_process()
            core.wait_for_exit()
            self._core_exited(core)
        except KeyboardInterrupt:
            pass
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.stop()

    def stop(self) -> None:
        """Stop the core process and every instance; remove sockets and shared memory. Idempotent.

        Graceful: the core takes no new requests and lets those in flight finish, for at most
        ``ServeConfig.exit_timeout_s``."""
        with self._stop_lock:
            self._stop()

    def _stop(self) -> None:
        core = self._core
        if core is None:
            return
        self._stop_requested.set()
        # The routes first: they answer 503 from now on, and what they have in flight finishes while the core runs.
        self._routes.stop()
        # The core drains first (ServeConfig.exit_timeout_s): thread and Ray instances serve what is in flight.
        core.stop()
        self._stop_event.set()
        if self._local is not None:
            self._local.close()
            self._local = None
        self._ray.stop()
        self._threads.wake()
        self._threads.join()
        for bound in self._models.values():
            bound.loaded = False
        self._loaded_ensembles.clear()
        remove_segments(self._session)
        self._core = None
        atexit.unregister(self.stop)

    @property
    def is_running(self) -> bool:
        """Whether the core process is up."""
        return self._core is not None and self._core.returncode is None

    @property
    def url(self) -> str:
        """Base URL of the HTTP front end, e.g. ``http://127.0.0.1:8000`` (``https://`` when it serves TLS)."""
        return f"{self._scheme('http')}://{self.config.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        """Address of the gRPC front end, e.g. ``127.0.0.1:8001``."""
        return f"{self.config.host}:{self.grpc_port}"

    @property
    def grpc_url(self) -> str:
        """The gRPC front end as pyserve's clients take it: ``grpc://127.0.0.1:8001`` (``grpcs://`` with TLS)."""
        return f"grpc{'s' if self.config.uses_tls('grpc') else ''}://{self.grpc_address}"

    @property
    def remote_address(self) -> str:
        """Where ``RemoteServe`` attaches (``tcp://host:port``) when ``ServeConfig.remote_port`` is set; else ""."""
        return self._core.remote_address if self._core is not None else ""

    @property
    def metrics_url(self) -> str:
        """URL of the Prometheus metrics page, e.g. ``http://127.0.0.1:8002/metrics``."""
        return f"{self._scheme('metrics')}://{self.config.host}:{self.metrics_port}/metrics"

    def _scheme(self, endpoint: str) -> str:
        return "https" if self.config.uses_tls(endpoint) else "http"

    def _endpoints(self) -> str:
        config = self.config
        served = [
            f"{name} on {where}"
            for name, where, on in (
                ("HTTP", self.url, config.allow_http),
                ("gRPC", self.grpc_address, config.allow_grpc),
                ("metrics", self.metrics_url, config.allow_metrics),
            )
            if on
        ]
        if self._routes.port:
            served.append(f"routes on {self.routes_url}")
        return ", ".join(served)

    def __enter__(self) -> Serve:
        try:
            return self.run()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # internals ------------------------------------------------------------------------------------------------

    def _start_core(self) -> None:
        core = CoreProcess(self.config, self._session)
        core.start()
        self._core = core
        # Someone must notice a core that dies on its own (killed, out of memory), whether or not serve() blocks.
        threading.Thread(target=self._watch_core, args=(core,), name="pyserve-core-watch", daemon=True).start()
        self.http_port, self.grpc_port, self.metrics_port = core.http_port, core.grpc_port, core.metrics_port
        config = self.config
        self._local = LocalCaller(
            core.router_address, f"{self._session}-local", config.shm_threshold_bytes, config.shm_pool_bytes
        )
        self._announced = False

    def _watch_core(self, core: CoreProcess) -> None:
        core.wait_for_exit()
        self._core_exited(core)

    def _core_exited(self, core: CoreProcess) -> None:
        """The core process ended: unless stop() ended it, say so (once) and stop, so that the instances, sockets
        and shared memory go too."""
        with self._stop_lock:
            if self._core is not core:
                return  # stopped already (and perhaps started again)
            if not self._stop_requested.is_set():
                logger.error(
                    "the core process (pid %d) exited unexpectedly (%s): stopping the server",
                    core.pid,
                    describe_exit(core.returncode if core.returncode is not None else 0),
                )
            self._stop()

    def _remote_port(self, core: CoreProcess) -> tuple[str, str]:
        """The core's remote port and its token, opened now (any free port, a fresh token) if it is closed: Ray
        instances reach the core there."""
        if not core.remote_address:
            token = self.config.remote_token or secrets.token_urlsafe(32)
            reply = core.request(partial(OpenRemote.build, token))
            if reply.error is not None:
                raise ServerError(reply.error)
            core.remote_address = reply.value
            self._remote_token = token
        return core.remote_address, self._remote_token or self.config.remote_token

    def _core_process(self) -> CoreProcess:
        if self._core is None:
            raise ServerError("the server is not running: call run() (or use `with Serve() as s:`) first")
        return self._core

    def _load_all(self, pending: list[_BoundModel]) -> None:
        """Load models bound before start, ``model_load_thread_count`` at a time (each over a control channel of
        its own), Ray ones after, one by one; raises the first failure once every load has ended."""
        side_by_side = [bound for bound in pending if bound.spec.config.worker is not WorkerKind.RAY]
        on_ray = [bound for bound in pending if bound.spec.config.worker is WorkerKind.RAY]
        workers = min(self.config.model_load_thread_count, len(side_by_side))
        if workers <= 1:
            for bound in pending:
                self._load(bound)
            return
        core = self._core_process()

        def load(bound: _BoundModel) -> None:
            with core.channel() as channel:
                self._load(bound, channel)

        pool = ThreadPoolExecutor(workers, thread_name_prefix="pyserve-load")
        try:
            futures = [pool.submit(load, bound) for bound in side_by_side]
            errors = [error for error in (future.exception() for future in futures) if error is not None]
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # Ctrl+C: stop() closes the channels of those under way
            raise
        pool.shutdown()
        if errors:
            raise errors[0]
        for bound in on_ray:
            self._load(bound)

    def _load(self, bound: _BoundModel, control: ControlChannel | None = None) -> None:
        spec = bound.spec
        # A load beside others has a channel of its own; else the core's own channel.
        requester = control if control is not None else self._core_process()
        if bound.payload is not None:
            # Process instances: the core spawns and supervises them; it answers once all are connected.
            payload = bound.payload
            reply = requester.request(lambda rid: Load.build(spec, rid, payload), self.config.model_load_timeout_s)
            if reply.error is not None:
                raise ServerError(reply.error)
            bound.loaded = True
            return
        core = self._core_process()
        reply = requester.request(lambda request_id: Load.build(spec, request_id))
        if reply.error is not None:
            raise ConfigError(reply.error)
        if spec.config.worker is WorkerKind.RAY:
            try:
                address, token = self._remote_port(core)
                self._ray.start(spec, bound.functions, address, token, self.config)
            except BaseException:
                core.request(partial(Unload.build, spec.name, spec.version))
                raise
            bound.loaded = True
            return
        self._threads.start(spec, bound.functions, CoreLink.local(self._core_process()), self.config)
        bound.loaded = True

    def _load_ensemble(self, ensemble: EnsembleSpec) -> None:
        # The core checks the ensemble again, against the models it serves, before serving it.
        reply = self._core_process().request(lambda request_id: LoadEnsemble.build(ensemble.to_wire(), request_id))
        if reply.error is not None:
            raise ConfigError(reply.error)
        self._loaded_ensembles.add((ensemble.name, ensemble.version))


def _announce(line: str) -> None:
    """Say where a server serves: through logging, or on stderr when the application configured no logging.

    A library leaves output to the application, so this is an INFO record (``pyserve serve`` shows it). But a script
    that configured no logging at all, like the Quickstart, would never learn its addresses, and logging's own
    last-resort handler drops INFO; so then the one line goes to stderr, as werkzeug does for Flask's "Running on".
    """
    if logger.hasHandlers():
        logger.info("%s", line)
    else:
        sys.stderr.write(line + "\n")


def _call_options(arguments: dict[str, Any]) -> dict[str, Any]:
    """The options of a Serve.infer-like call (its ``locals()``), as ``LocalCaller`` takes them."""
    outputs = arguments["outputs"]
    return {
        "version": arguments["model_version"],
        "outputs": list(outputs) if outputs is not None else None,
        "parameters": arguments["parameters"],
        "timeout_s": arguments["timeout_s"],
        "request_id": arguments["request_id"],
    }


def bound_model(
    model_name: str,
    infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig | None,
    model_version: int,
    strict: bool,
) -> tuple[ModelSpec, list[Callable[..., Any]]]:
    """The spec and the per-instance callables of ``bind``'s arguments (``Serve.bind``, ``RemoteServe.bind``): one
    callable for ``config.instances`` instances, or a list of callables, one instance each."""
    config = config if config is not None else ModelConfig()
    spec = _spec(model_name, model_version, inputs, outputs, config, strict)
    if callable(infer_func):
        return spec, [infer_func] * config.instances
    functions = _callables(model_name, infer_func)
    if config.instances not in (1, len(functions)):
        raise ConfigError(
            f"model '{model_name}': {len(functions)} callables given but ModelConfig.instances is {config.instances}"
        )
    return dataclasses.replace(spec, config=dataclasses.replace(config, instances=len(functions))), functions


def _spec(
    name: str,
    version: int,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
    strict: bool = False,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        version=version,
        inputs=as_tensors(inputs, "inputs"),
        outputs=as_tensors(outputs, "outputs"),
        config=config,
        strict=strict,
    )


def _callables(model_name: str, infer_func: object) -> list[Callable[..., Any]]:
    """The callables of ``bind(model_name, [f, g, ...])``; anything else is a ConfigError naming what was given."""
    if not isinstance(infer_func, Sequence) or isinstance(infer_func, (str, bytes)):
        raise ConfigError(
            f"model '{model_name}': infer_func must be a callable (a function, or a class to instantiate per "
            f"instance) or a list of callables; {type(infer_func).__name__} {reprlib.repr(infer_func)} is not callable"
        )
    functions = list(infer_func)
    if not functions:
        raise ConfigError(f"model '{model_name}': infer_func is an empty list; give at least one callable")
    for index, function in enumerate(functions):
        if not callable(function):
            raise ConfigError(
                f"model '{model_name}': infer_func[{index}] is {type(function).__name__} {reprlib.repr(function)}, "
                "which is not callable"
            )
    return functions
