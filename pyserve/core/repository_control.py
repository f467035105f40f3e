"""Model control over a Triton-layout model repository: load, unload, reload and the repository index.

``RepositoryControl`` reads a model with ``pyserve.repository.read_model`` (config, versions, hooks, auto-complete:
in a thread, off the core's loop), builds each version's backend object and has ``WorkerControl`` start its
process instances. The control modes are tritonserver's:

- ``none``: every model in the repository is loaded at start; the load and unload requests are refused.
- ``explicit``: the models named by ``load_model`` (``*``: all) are loaded at start; the rest through the load and
  unload requests (HTTP ``/v2/repository/models/{m}/load|unload``, gRPC ``RepositoryModelLoad|Unload``).
- ``poll``: every model is loaded at start, and the repository is looked at every ``repository_poll_secs``: a model
  whose files changed is reloaded, a new one loaded, a removed one unloaded.

A reload starts the new copy beside the old one, which keeps serving until the new one is ready and then answers
what it already accepted before it stops (``WorkerControl.retire``): no request fails because of a reload. A model
that cannot be loaded is UNAVAILABLE with the reason, in the index and the log; the others serve on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyserve.config import ServeConfig
from pyserve.core.ensemble_executor import EnsembleEntry, load_ensemble
from pyserve.core.registry import Registry
from pyserve.core.worker_control import WorkerControl
from pyserve.errors import ConfigError, ModelLoadError, ModelNotFoundError, PyServeError, ServerError, UnsupportedError
from pyserve.transport.payload import build_payload

logger = logging.getLogger(__name__)

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
UNLOADED = "unloaded"  # the reason of a model an unload request made UNAVAILABLE (Triton's word)


@dataclasses.dataclass(eq=False)
class _ModelState:
    """What the repository knows of one model: its state, why, and what it loaded."""

    name: str
    state: str = ""
    reason: str = ""
    fingerprint: str = ""
    definition: Any = None  # the last ModelDefinition loaded (pyserve.repository.ModelDefinition)
    temp_dir: Path | None = None  # files sent with the load request, written here
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class RepositoryControl:
    """Loads, unloads and reloads the models of a repository; answers the repository index.

    Without a repository (``ServeConfig.model_repository`` empty) it only answers the index, with the bound models.
    """

    def __init__(self, config: ServeConfig, registry: Registry, workers: WorkerControl) -> None:
        self._config = config
        self._registry = registry
        self._workers = workers
        self.path = Path(config.model_repository).resolve() if config.model_repository else None
        self.mode = config.model_control_mode
        self._states: dict[str, _ModelState] = {}
        self._hooks = _import_hooks(config.repository_hooks)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started: asyncio.Future[None] | None = None
        self._start_failures: list[str] = []  # the errors of the models that failed to load at start
        if self.path is not None and not self.path.is_dir():
            raise ServerError(f"model repository '{config.model_repository}' is not a directory")

    # lifetime -----------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Load the models the control mode loads at start (in the background; ``started`` waits for it)."""
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        if self.path is None:
            self._started.set_result(None)
            return
        self._spawn(self._load_at_start())

    async def started(self) -> None:
        """Wait until the models loaded at start are loaded (or failed to load)."""
        if self._started is not None:
            await asyncio.shield(self._started)

    def start_error(self) -> str | None:
        """Why the start fails under ``exit_on_error``: the models loaded at start that could not be; else None."""
        if not self._start_failures:
            return None
        failures = "; ".join(self._start_failures)
        return f"not every model of the repository loaded at start (exit_on_error): {failures}"

    def all_available(self) -> bool:
        """No model of the repository is UNAVAILABLE, unless an unload request made it so (strict readiness)."""
        return not any(state.state == UNAVAILABLE and state.reason != UNLOADED for state in self._states.values())

    def close(self) -> None:
        """Stop polling and loading; remove the files written for load requests."""
        for task in list(self._tasks):
            task.cancel()
        for state in self._states.values():
            if state.temp_dir is not None:
                shutil.rmtree(state.temp_dir, ignore_errors=True)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load_at_start(self) -> None:
        assert self.path is not None and self._started is not None
        try:
            names = await asyncio.to_thread(self._list)
            if self.mode == "explicit":
                wanted = list(self._config.load_model)
                names = names if "*" in wanted else wanted
            self._start_failures = await self._load_all(names)
        finally:
            self._started.set_result(None)
        if self.mode == "poll":
            self._spawn(self._poll())

    async def _load_all(self, names: Sequence[str]) -> list[str]:
        """Load models, plain ones first: an ensemble is checked against the models it composes. Returns
        the error of each that failed."""
        failures: list[str] = []
        ensembles = await asyncio.to_thread(self._ensembles_among, names)
        plain = [name for name in names if name not in ensembles]
        slots = asyncio.Semaphore(self._config.model_load_thread_count)  # tritonserver's --model-load-thread-count

        async def load(name: str) -> None:
            async with slots:
                await self.load(name)

        for group in (plain, ensembles):
            results = await asyncio.gather(*(load(name) for name in group), return_exceptions=True)
            for name, result in zip(group, results, strict=True):
                if isinstance(result, BaseException) and not isinstance(result, PyServeError):
                    logger.error("loading model '%s' failed unexpectedly", name, exc_info=result)
                if isinstance(result, BaseException):
                    failures.append(str(result) or f"failed to load '{name}': {type(result).__name__}")
        return failures

    def _ensembles_among(self, names: Sequence[str]) -> list[str]:
        # From the configs alone: reading the models in full (hooks, checksums, auto-complete) is load()'s job.
        from pyserve.repository import declares_ensemble

        assert self.path is not None
        return [name for name in names if declares_ensemble(self.path / name)]

    async def _poll(self) -> None:
        path = self.path
        assert path is not None
        while True:
            await asyncio.sleep(self._config.repository_poll_secs)
            try:
                names = await asyncio.to_thread(self._list)
                prints = await asyncio.to_thread(_fingerprints, path, names)
            except OSError as exc:
                logger.error("cannot read the model repository %s: %s", self.path, exc)
                continue
            changed = [n for n in names if n not in self._states or self._states[n].fingerprint != prints[n]]
            gone = [n for n, s in self._states.items() if n not in names and s.state == READY]
            if changed:
                logger.info("model repository: loading %s", ", ".join(changed))
                await self._load_all(changed)
            for name in gone:
                with contextlib.suppress(PyServeError):
                    await self.unload(name)

    def _list(self) -> list[str]:
        from pyserve.repository import list_models

        assert self.path is not None
        return list_models(self.path)

    # load / unload --------------------------------------------------------------------------------------------------

    def check_control(self, action: str) -> None:
        """Refuse a load or unload request where the control mode does not take them."""
        if self.path is None:
            raise UnsupportedError(
                f"cannot {action} models: this server has no model repository (start it with --model-repository, "
                "or Serve(model_repository=...)); bound models are loaded and unloaded by the process that bound them"
            )
        if self.mode != "explicit":
            raise UnsupportedError(
                f"explicit model {action} is not allowed in model control mode '{self.mode}' "
                "(start the server with --model-control-mode explicit)"
            )

    async def request_load(self, name: str, config: str | None, files: Mapping[str, bytes]) -> None:
        """A load request (explicit mode): load or reload ``name``; ModelLoadError says why it failed."""
        served = self._registry.versions(name)
        if name not in self._states and served and all(e.ready for e in served) and config is None and not files:
            return  # a bound model, loaded already: nothing to do (as Triton answers for a loaded model)
        self.check_control("load")
        if files and config is None:
            raise ModelLoadError(f"failed to load '{name}': files sent with a load request need a 'config' too")
        await self.load(name, config, dict(files) or None)

    async def request_unload(self, name: str, unload_dependents: bool = False) -> None:
        """An unload request (explicit mode)."""
        self.check_control("unload")
        if unload_dependents:
            for entry in self._registry.entries():
                if isinstance(entry, EnsembleEntry) and any(step.model == name for step in entry.ensemble.steps):
                    await self.unload(entry.name)
        await self.unload(name)

    async def load(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) one model and every version its policy selects; raises ModelLoadError."""
        state = self._states.setdefault(name, _ModelState(name))
        async with state.lock:
            if self._is_bound_elsewhere(name, state):
                raise ModelLoadError(f"failed to load '{name}': a model of that name is bound with Serve.bind()")
            previous, previous_reason = state.state, state.reason
            state.state, state.reason = LOADING, ""
            try:
                definition = await self._read(name, config, files)
                if definition.ensemble is not None:
                    await self._load_ensemble(definition)
                else:
                    await self._load_versions(definition)
            except ModelNotFoundError as exc:
                # Not in the repository: no state to keep (nor to hold strict readiness back), as before the request.
                state.state, state.reason = previous, previous_reason
                logger.error("%s", exc)
                raise ModelLoadError(str(exc)) from None  # 400, as tritonserver answers
            except PyServeError as exc:
                state.state = READY if previous == READY and self._registry.versions(name) else UNAVAILABLE
                state.reason = str(exc)
                logger.error("failed to load model '%s': %s", name, exc)
                raise ModelLoadError(f"failed to load '{name}': {exc}") from None
            except Exception as exc:
                state.state, state.reason = UNAVAILABLE, f"{type(exc).__name__}: {exc}"
                logger.exception("failed to load model '%s'", name)
                raise ModelLoadError(f"failed to load '{name}': {state.reason}") from None
            for warning in definition.warnings:
                logger.warning("%s", warning)
            old_temp = state.temp_dir
            state.definition = definition
            state.temp_dir = definition.model_dir if files else None
            if old_temp is not None and old_temp != state.temp_dir:
                shutil.rmtree(old_temp, ignore_errors=True)
            state.state, state.reason = READY, ""
            logger.info("loaded model '%s' (versions %s)", name, ", ".join(map(str, definition.specs)) or "1")

    async def _read(self, name: str, config: str | None, files: dict[str, bytes] | None) -> Any:
        from pyserve.repository import fingerprint, read_model

        assert self.path is not None
        model_dir = self.path / name
        if not files and not model_dir.is_dir():
            raise ModelNotFoundError(f"failed to load '{name}': no model directory '{name}' in {self.path}")
        state = self._states.setdefault(name, _ModelState(name))
        if model_dir.is_dir():
            state.fingerprint = await asyncio.to_thread(fingerprint, model_dir)
        return await asyncio.to_thread(
            read_model,
            model_dir,
            strict=self._config.strict_model_config,
            config_override=config,
            files=files,
            hooks=self._hooks,
        )

    async def _load_versions(self, definition: Any) -> None:
        from pyserve.backends import backend

        implementation = backend(definition.backend)
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[str | None]] = []
        for version, spec in definition.specs.items():
            target = implementation.create(definition.backend_model(version, self.path))
            payload = await asyncio.to_thread(build_payload, spec, [target])
            waiting: asyncio.Future[str | None] = loop.create_future()
            waits.append(waiting)
            entry = self._workers.load_model(spec, payload, _resolver(waiting), replace=True)
            if entry is not None:
                entry.config_document = dict(definition.config_json)
        try:
            errors = await asyncio.wait_for(asyncio.gather(*waits), self._config.model_load_timeout_s)
        except asyncio.TimeoutError:
            for version in definition.specs:
                self._workers.abort_load(definition.name, version, "it did not start in time")
            raise ModelLoadError(f"its instances did not start within {self._config.model_load_timeout_s} s") from None
        failed = [e for e in errors if e]
        if failed:
            raise ModelLoadError(failed[0])
        # Versions the policy no longer selects stop serving once they answered what they accepted.
        for entry in self._registry.versions(definition.name):
            if entry.version not in definition.specs:
                self._registry.remove(entry.name, entry.version)
                self._workers.retire(entry, "its version is no longer in the repository's version policy")

    async def _load_ensemble(self, definition: Any) -> None:
        ensemble = definition.ensemble
        # Triton loads what an ensemble composes with it.
        for step in ensemble.steps:
            if not self._registry.versions(step.model) and self.path is not None and (self.path / step.model).is_dir():
                await self.load(step.model)
        for entry in self._registry.versions(definition.name):
            if isinstance(entry, EnsembleEntry):
                self._registry.remove(entry.name, entry.version)
        try:
            load_ensemble(ensemble.to_wire(), self._registry)
        except ConfigError as exc:
            raise ModelLoadError(str(exc)) from None

    async def unload(self, name: str) -> None:
        """Stop serving every version of a repository model, after answering what they accepted."""
        state = self._states.get(name)
        if state is None:
            if self._registry.versions(name):
                raise ModelLoadError(
                    f"failed to unload '{name}': it is bound with Serve.bind(), not loaded from the repository"
                )
            raise ModelNotFoundError(f"failed to unload '{name}': no model of that name is loaded")
        async with state.lock:
            entries = self._registry.versions(name)
            state.state = UNLOADING
            loop = asyncio.get_running_loop()
            waits: list[asyncio.Future[None]] = []
            for entry in entries:
                self._registry.remove(entry.name, entry.version)
                if isinstance(entry, EnsembleEntry):
                    continue
                finished: asyncio.Future[None] = loop.create_future()
                waits.append(finished)
                self._workers.retire(entry, "it was unloaded", _setter(finished))
            await asyncio.gather(*waits)
            state.state, state.reason = UNAVAILABLE, UNLOADED
            if state.temp_dir is not None:
                shutil.rmtree(state.temp_dir, ignore_errors=True)
                state.temp_dir = None
            logger.info("unloaded model '%s'", name)

    def _is_bound_elsewhere(self, name: str, state: _ModelState) -> bool:
        return state.definition is None and state.state != LOADING and bool(self._registry.versions(name))

    # index ----------------------------------------------------------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every model version served, and the repository's other models with their
        state and reason (a model never loaded has only its name)."""
        rows: dict[str, list[dict[str, Any]]] = {}
        for entry in self._registry.entries():
            rows.setdefault(entry.name, []).append(entry.index_entry())
        for name, state in self._states.items():
            if state.state and not (state.state == READY and name in rows):
                rows.setdefault(name, []).insert(0, {"name": name, "state": state.state, "reason": state.reason})
        if self.path is not None and not ready_only:
            with contextlib.suppress(OSError):
                for name in self._list():
                    rows.setdefault(name, [{"name": name}])
        listed = [row for name in sorted(rows) for row in rows[name]]
        return [row for row in listed if row.get("state") == READY] if ready_only else listed


def _fingerprints(path: Path, names: list[str]) -> dict[str, str]:
    from pyserve.repository import fingerprint

    return {name: fingerprint(path / name) for name in names}


def _resolver(future: asyncio.Future[str | None]) -> Callable[[str | None], None]:
    def done(error: str | None) -> None:
        if not future.done():
            future.set_result(error)

    return done


def _setter(future: asyncio.Future[None]) -> Callable[[], None]:
    def done() -> None:
        if not future.done():
            future.set_result(None)

    return done


def _import_hooks(paths: Sequence[str]) -> list[Callable[..., Any]]:
    """The load hooks named ``module:function`` (``ServeConfig.repository_hooks``)."""
    hooks = []
    for path in paths:
        module_name, _, attribute = path.partition(":")
        try:
            hooks.append(getattr(importlib.import_module(module_name), attribute))
        except (ImportError, AttributeError, ValueError) as exc:
            raise ServerError(f"cannot import the repository hook '{path}' (module:function): {exc}") from None
    return hooks
