"""The Python backend: a ``model.py`` in pyserve's form, or a Triton Python-backend model served unchanged.

pyserve's form defines ``infer_func`` (a function or class, decorated as for ``Serve.bind``) and may declare
module-level ``inputs`` and ``outputs`` (lists of ``Tensor``) and ``config`` (a ``ModelConfig``) for a repository
without config.pbtxt, which ``describe`` reads. Triton's form defines ``class TritonPythonModel`` (``initialize``,
``execute``, ``finalize``, optionally ``auto_complete_config``) and imports ``triton_python_backend_utils``, which
is pyserve's own (``pyserve.backends.triton_python_backend_utils``).

Either is imported in ``setup(device)``, in the instance's process, and for auto-complete by ``describe`` in a
short-lived child process of its own (``python -m pyserve.backends.python --describe``), never in the core.
``execute`` gets the batch's requests as ``pb_utils.InferenceRequest`` objects and returns one ``InferenceResponse``
each; a decoupled model's response senders may send from any thread, and the instance streams what they send, one
round of responses at a time, until every request's sender has sent the final flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import inspect
import json
import logging
import os
import subprocess
import sys
import threading
import traceback
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pyserve.backends import triton_python_backend_utils as pb_utils
from pyserve.backends.base import BackendModel, Signature
from pyserve.config import DynamicBatcher, ModelConfig, ModelSpec, Tensor, _batcher_from_wire, _batcher_to_wire
from pyserve.dtypes import config_type
from pyserve.errors import (
    CancelledError,
    ConfigError,
    InferenceError,
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelNotReadyError,
    OutputMismatchError,
    UnsupportedError,
)
from pyserve.request import RequestBatch, current_model
from pyserve.worker.instance import instantiate

NAME = "python"
PLATFORMS: tuple[str, ...] = ()
DEFAULT_MODEL_FILENAME = "model.py"

PB_UTILS_MODULE = "triton_python_backend_utils"
DESCRIBE_TIMEOUT_S = 30.0  # how long describe() waits for the child that imports a model.py
_WAIT_S = 0.1  # how often a batch waiting on response senders looks whether its clients went away

logger = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]
Round = list[Outputs | None]

# The pyserve error that answers a request whose response carries a TritonError of this code (same message).
_ERROR_OF_CODE: dict[int, type[InferenceError]] = {
    pb_utils.TritonError.INTERNAL: ModelExecutionError,
    pb_utils.TritonError.NOT_FOUND: ModelNotFoundError,
    pb_utils.TritonError.INVALID_ARG: InvalidInputError,
    pb_utils.TritonError.UNAVAILABLE: ModelNotReadyError,
    pb_utils.TritonError.UNSUPPORTED: UnsupportedError,
    pb_utils.TritonError.CANCELLED: CancelledError,
}


def create(model: BackendModel) -> PythonModel:
    """The instance object of ``model.model_file``; nothing is imported before ``setup``."""
    return PythonModel(model)


def autocomplete(model_file: Path) -> Signature | None:
    """None: a model.py declares its tensors in code, which only ``describe`` runs."""
    return None


def describe(
    model_file: Path, config_json: Mapping[str, Any] | None = None, *, timeout_s: float = DESCRIBE_TIMEOUT_S
) -> tuple[list[Tensor], list[Tensor], ModelConfig | None] | None:
    """What a model.py declares of itself, for auto-complete; imports the file in a short-lived child process.

    pyserve's form: its module-level ``inputs``, ``outputs`` and ``config``. Triton's form: the configuration its
    ``TritonPythonModel.auto_complete_config`` makes of ``config_json`` (what config.pbtxt says, in Triton's JSON
    form). None when the file declares nothing. The user's code never runs in the calling process (for a repository,
    the core): the child imports it with this process's ``sys.path`` and the file's directory, as an instance does.
    Raises ConfigError with the child's one-line reason when the file cannot be imported or described, or when the
    child has not answered within ``timeout_s`` seconds (it is killed then).
    """
    request = {"config_json": None if config_json is None else dict(config_json), "sys_path": list(sys.path)}
    command = [sys.executable, "-m", "pyserve.backends.python", "--describe", str(model_file)]
    try:
        child = subprocess.run(
            command, input=json.dumps(request), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"model file '{model_file}': describing it passed the timeout of {timeout_s:g} s (importing it, or its "
            "auto_complete_config, did not finish)"
        ) from None
    if child.stderr:
        logger.debug("describing %s, its process wrote:\n%s", model_file, child.stderr.rstrip())
    try:
        answer = json.loads(child.stdout)
    except ValueError:
        last = child.stderr.strip().splitlines()[-1:] or ["(nothing on stderr)"]
        raise ConfigError(
            f"model file '{model_file}': the process describing it exited with code {child.returncode} before "
            f"answering: {last[0]}"
        ) from None
    if "error" in answer:
        logger.debug("describing %s failed:\n%s", model_file, answer["traceback"].rstrip())
        raise ConfigError(answer["error"])
    return _described_from_wire(answer["described"])


def _describe_here(
    model_file: Path, config_json: Mapping[str, Any] | None
) -> tuple[list[Tensor], list[Tensor], ModelConfig | None] | None:
    """``describe``'s work, done in its child process: import the file and read what it declares."""
    try:
        module = load_module(model_file)
    except BaseException as exc:  # a model calling sys.exit() at import fails the same way
        raise ConfigError(f"model file '{model_file}' could not be imported: {type(exc).__name__}: {exc}") from exc
    triton_class = getattr(module, "TritonPythonModel", None)
    if triton_class is not None:
        complete = getattr(triton_class, "auto_complete_config", None)
        if complete is None:
            return None
        given = pb_utils.ModelConfig(config_json or {})
        try:
            completed = complete(given)
        except Exception as exc:
            raise ConfigError(
                f"model file '{model_file}': auto_complete_config failed: {type(exc).__name__}: {exc}"
            ) from exc
        return declared_by(completed.as_dict() if completed is not None else given.as_dict())
    inputs = getattr(module, "inputs", None)
    outputs = getattr(module, "outputs", None)
    config = getattr(module, "config", None)
    if inputs is None and outputs is None and config is None:
        return None
    for kind, tensors in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(tensors, (list, tuple, type(None))) or not all(isinstance(t, Tensor) for t in tensors or ()):
            raise ConfigError(f"model file '{model_file}': '{kind}' must be a list of pyserve.Tensor, got {tensors!r}")
    if config is not None and not isinstance(config, ModelConfig):
        raise ConfigError(f"model file '{model_file}': 'config' must be a pyserve.ModelConfig, got {config!r}")
    return list(inputs or ()), list(outputs or ()), config


def _described_to_wire(described: tuple[list[Tensor], list[Tensor], ModelConfig | None] | None) -> Any:
    """What ``_describe_here`` found, as JSON for the parent (tensors as ``ModelSpec.to_wire`` writes them)."""
    if described is None:
        return None
    inputs, outputs, config = described
    config_doc = None
    if config is not None:
        batcher = None if config.batcher is None else _batcher_to_wire(config.batcher)
        config_doc = {**dataclasses.asdict(config), "batcher": batcher}
    return {
        "inputs": [[t.name, t.datatype, list(t.shape), t.optional] for t in inputs],
        "outputs": [[t.name, t.datatype, list(t.shape), t.optional] for t in outputs],
        "config": config_doc,
    }


def _described_from_wire(doc: Any) -> tuple[list[Tensor], list[Tensor], ModelConfig | None] | None:
    if doc is None:
        return None
    config_doc = doc["config"]
    config = None
    if config_doc is not None:
        batcher = config_doc["batcher"]
        config = ModelConfig(**{**config_doc, "batcher": None if batcher is None else _batcher_from_wire(batcher)})
    inputs = [Tensor(n, d, tuple(s), o) for n, d, s, o in doc["inputs"]]
    outputs = [Tensor(n, d, tuple(s), o) for n, d, s, o in doc["outputs"]]
    return inputs, outputs, config


def _describe_main(model_file: str) -> None:
    """The child of ``describe``: reads the request on stdin, writes its answer as JSON on stdout, and exits."""
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # what the model prints goes to stderr, not into the answer
    request = json.load(sys.stdin)
    sys.path.extend(path for path in request["sys_path"] if path not in sys.path)
    try:
        answer = {"described": _described_to_wire(_describe_here(Path(model_file), request["config_json"]))}
    except BaseException as exc:
        reason = str(exc) if isinstance(exc, ConfigError) else f"model file '{model_file}': {type(exc).__name__}: {exc}"
        answer = {"error": " ".join(reason.split()), "traceback": traceback.format_exc()}
    with open(answer_fd, "w") as out:
        json.dump(answer, out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads or atexit hooks the model started do not keep the answer waiting


def load_module(model_file: Path) -> ModuleType:
    """Import a model.py from its path as Triton does: ``triton_python_backend_utils`` is pyserve's, and the
    file's directory is on ``sys.path`` for the file's own imports. Each call imports it anew, under its own name."""
    sys.modules[PB_UTILS_MODULE] = pb_utils
    directory = str(Path(model_file).resolve().parent)
    if directory not in sys.path:
        sys.path.append(directory)
    name = f"_pyserve_model_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"model file '{model_file}' cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class PythonModel:
    """The instance object of one model.py: picklable as created, it imports the file in ``setup(device)``."""

    def __init__(self, model: BackendModel) -> None:
        self.model = model
        self._run: Callable[[RequestBatch], Any] | None = None
        self._triton: _TritonModel | None = None

    def setup(self, device: str) -> None:
        """Import model.py and make its model here; a Triton model's ``initialize(args)`` runs now."""
        module = load_module(self.model.model_file)
        triton_class = getattr(module, "TritonPythonModel", None)
        if triton_class is not None:
            self._triton = _TritonModel(triton_class, self.model, device)
            self._run = self._triton
        elif hasattr(module, "infer_func"):
            self._run = instantiate(module.infer_func, device)
        else:
            raise ConfigError(
                f"model file '{self.model.model_file}' defines neither 'infer_func' nor 'class TritonPythonModel'"
            )

    def __call__(self, requests: RequestBatch) -> Any:
        if self._run is None:
            raise RuntimeError(f"model '{self.model.spec.name}': setup(device) has not run")
        return self._run(requests)

    def teardown(self) -> None:
        """Called as the instance stops: the Triton model's ``finalize()`` (once), or the pyserve-form object's own
        ``teardown()``."""
        triton, self._triton = self._triton, None
        run, self._run = self._run, None
        if triton is not None:
            triton.finalize()
        elif run is not None and not isinstance(run, type):
            inner = getattr(run, "teardown", None)
            if callable(inner):
                inner()


class _TritonModel:
    """A ``TritonPythonModel`` and how its ``execute`` answers a batch (returned responses or sent ones)."""

    def __init__(self, model_class: type[Any], model: BackendModel, device: str) -> None:
        self._name = model.spec.name
        self._model = model_class()
        execute = getattr(self._model, "execute", None)
        if not callable(execute):
            raise ConfigError(f"model file '{model.model_file}': TritonPythonModel has no execute(self, requests)")
        self._execute = execute
        self._decoupled = model.spec.config.decoupled
        self._async = inspect.iscoroutinefunction(execute)
        initialize = getattr(self._model, "initialize", None)
        if initialize is not None:
            initialize(initialize_args(model, device))

    def __call__(self, batch: RequestBatch) -> Any:
        if self._decoupled:
            return self._stream_async(batch) if self._async else self._stream(batch)
        return self._answer_async(batch) if self._async else self._answer(batch)

    def finalize(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        if finalize is not None:
            finalize()

    def _answer(self, batch: RequestBatch) -> list[Outputs]:
        streams = _Streams(batch)
        result = self._execute(streams.requests)
        if result is None and streams.senders_taken:
            return self._single(batch, list(streams.rounds()))
        return self._outputs(result, len(batch))

    async def _answer_async(self, batch: RequestBatch) -> list[Outputs]:
        streams = _Streams(batch)
        result = await self._execute(streams.requests)
        if result is None and streams.senders_taken:
            return self._single(batch, [answers async for answers in streams.rounds_async()])
        return self._outputs(result, len(batch))

    def _stream(self, batch: RequestBatch) -> Iterator[Round]:
        streams = _Streams(batch)
        self._execute(streams.requests)
        yield from streams.rounds()

    async def _stream_async(self, batch: RequestBatch) -> AsyncIterator[Round]:
        streams = _Streams(batch)
        await self._execute(streams.requests)
        async for answers in streams.rounds_async():
            yield answers

    def _outputs(self, result: Any, count: int) -> list[Outputs]:
        if not isinstance(result, (list, tuple)) or len(result) != count:
            got = f"a list of {len(result)}" if isinstance(result, (list, tuple)) else type(result).__name__
            raise OutputMismatchError(
                f"model '{self._name}': execute() must return a list of one InferenceResponse per request "
                f"({count} requests), got {got}"
            )
        return [_outputs_of(self._name, response) for response in result]

    def _single(self, batch: RequestBatch, rounds: list[Round]) -> list[Outputs]:
        # A model that is not decoupled but answers through its response senders: one response per request.
        answers: Round = [None] * len(batch)
        for answered in rounds:
            for index, outputs in enumerate(answered):
                if outputs is not None and answers[index] is not None:
                    raise OutputMismatchError(
                        f"model '{self._name}' sent request {index} more than one response; only a decoupled "
                        "model may (model_transaction_policy { decoupled: true })"
                    )
                answers[index] = outputs if outputs is not None else answers[index]
        result: list[Outputs] = []
        for index, outputs in enumerate(answers):
            if outputs is None:
                if batch[index].is_cancelled:
                    raise CancelledError(f"model '{self._name}': the request was cancelled")
                raise OutputMismatchError(f"model '{self._name}' sent request {index} its final flag but no response")
            result.append(outputs)
        return result


class _Streams:
    """What the response senders of one batch's requests send, from any thread, taken out in rounds."""

    def __init__(self, batch: RequestBatch) -> None:
        self._batch = batch
        self._pending: list[deque[pb_utils.InferenceResponse]] = [deque() for _ in batch]
        self._final = [False] * len(batch)
        self._changed = threading.Condition()
        self._wake: Callable[[], object] | None = None
        self.senders_taken = False
        self.requests = [
            pb_utils.InferenceRequest.received(request, self._sender_maker(index))
            for index, request in enumerate(batch)
        ]

    def _sender_maker(self, index: int) -> Callable[[], pb_utils.InferenceResponseSender]:
        request = self._batch[index]

        def make() -> pb_utils.InferenceResponseSender:
            self.senders_taken = True
            return pb_utils.InferenceResponseSender(
                lambda response, flags: self._push(index, response, flags), lambda: request.is_cancelled
            )

        return make

    def _push(self, index: int, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        with self._changed:
            if response is not None:
                self._pending[index].append(response)
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._final[index] = True
            self._changed.notify_all()
            wake = self._wake
        if wake is not None:
            with contextlib.suppress(RuntimeError):  # the event loop waiting for it is already closed
                wake()

    def _take(self) -> list[pb_utils.InferenceResponse | None] | None:
        """One waiting response per request (None for a request without one), or None when none waits."""
        with self._changed:
            if not any(self._pending):
                return None
            return [queue.popleft() if queue else None for queue in self._pending]

    def _ended(self) -> bool:
        """Every request has had its final flag (or its client went away) and no response waits."""
        with self._changed:
            if any(self._pending):
                return False
            return all(final or request.is_cancelled for final, request in zip(self._final, self._batch, strict=True))

    def _polled(self) -> Iterator[Round | None]:
        """Each round of responses as it is taken, or None when none waits yet (the caller then waits for a send
        before the next one), until every request has ended: what ``rounds`` and ``rounds_async`` share."""
        name = current_model().name
        while True:
            taken = self._take()
            if taken is not None:
                yield [None if r is None else _outputs_of(name, r) for r in taken]
            elif self._ended():
                return
            else:
                yield None

    def rounds(self) -> Iterator[Round]:
        """The responses as they are sent, until every request has ended (waiting in this thread)."""
        for taken in self._polled():
            if taken is not None:
                yield taken
                continue
            with self._changed:
                if not any(self._pending):
                    self._changed.wait(_WAIT_S)

    async def rounds_async(self) -> AsyncIterator[Round]:
        """``rounds`` for ``async def execute``: senders on the event loop (or other threads) wake it."""
        loop = asyncio.get_running_loop()
        sent = asyncio.Event()
        self._wake = lambda: loop.call_soon_threadsafe(sent.set)
        try:
            for taken in self._polled():
                if taken is not None:
                    yield taken
                else:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(sent.wait(), _WAIT_S)
                sent.clear()  # before the next take: a send from here on sets it again
        finally:
            self._wake = None


def _outputs_of(model: str, response: Any) -> Outputs:
    """A response's tensors as an output dict; a response with an error raises it as a pyserve error."""
    if not isinstance(response, pb_utils.InferenceResponse):
        raise OutputMismatchError(
            f"model '{model}': execute() must answer with pb_utils.InferenceResponse, got {type(response).__name__}"
        )
    error = response.error()
    if error is not None:
        raise _ERROR_OF_CODE.get(error.code(), InferenceError)(error.message())
    return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}


def initialize_args(model: BackendModel, device: str) -> dict[str, str]:
    """The ``args`` Triton gives ``initialize``: model configuration (JSON), instance, repository, version."""
    spec = model.spec
    try:
        instance = current_model().instance
    except LookupError:  # setup() runs before the instance loop sets its model context
        instance = 0
    return {
        "model_config": json.dumps(dict(model.config_json) or triton_config(spec)),
        "model_instance_kind": "GPU" if device.startswith("cuda") else "CPU",
        "model_instance_name": f"{spec.name}_0_{instance}",
        "model_instance_device_id": device.partition(":")[2] or "0",
        "model_repository": str(model.model_dir),
        "model_version": str(spec.version),
        "model_name": spec.name,
    }


def triton_config(spec: ModelSpec) -> dict[str, Any]:
    """The essentials of Triton's JSON configuration for a model served without one (bound directly)."""
    cfg = spec.config
    doc: dict[str, Any] = {
        "name": spec.name,
        "backend": NAME,
        "max_batch_size": cfg.max_batch_size,
        "input": [
            {"name": t.name, "data_type": config_type(t.datatype), "dims": list(t.shape), "optional": t.optional}
            for t in spec.inputs
        ],
        "output": [{"name": t.name, "data_type": config_type(t.datatype), "dims": list(t.shape)} for t in spec.outputs],
        "parameters": {key: {"string_value": value} for key, value in cfg.parameters.items()},
        "model_transaction_policy": {"decoupled": cfg.decoupled},
    }
    if cfg.dynamic_batching and cfg.batcher is not None:
        doc["dynamic_batching"] = {
            "preferred_batch_size": list(cfg.batcher.preferred_batch_size),
            "max_queue_delay_microseconds": cfg.batcher.max_queue_delay_microseconds,
        }
    return doc


def declared_by(doc: Mapping[str, Any]) -> tuple[list[Tensor], list[Tensor], ModelConfig]:
    """The tensors and configuration a Triton JSON configuration declares."""

    def tensors(kind: str) -> list[Tensor]:
        return [
            Tensor(e["name"], e["data_type"], tuple(e.get("dims", (-1,))), bool(e.get("optional", False)))
            for e in doc.get(kind, ())
        ]

    max_batch_size = int(doc.get("max_batch_size", 0))
    batching = doc.get("dynamic_batching")
    options: dict[str, Any] = {
        "max_batch_size": max_batch_size,
        "decoupled": pb_utils.using_decoupled_model_transaction_policy(doc),
        "parameters": {key: value.get("string_value", "") for key, value in doc.get("parameters", {}).items()},
    }
    if max_batch_size > 0:
        options["batcher"] = (
            None
            if batching is None
            else DynamicBatcher(
                max_queue_delay_microseconds=int(batching.get("max_queue_delay_microseconds", 0)),
                preferred_batch_size=tuple(batching.get("preferred_batch_size", ())),
            )
        )
    return tensors("input"), tensors("output"), ModelConfig(**options)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Describe a model.py for auto-complete (run by describe()).")
    parser.add_argument("--describe", metavar="MODEL_FILE", required=True)
    _describe_main(parser.parse_args().describe)
