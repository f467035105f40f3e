"""The Python backend: a ``model.py`` in pyserve's form, or a Triton Python-backend model served unchanged.

pyserve's form defines ``infer_func`` (a function or class, decorated as for ``Serve.bind``) and may declare
module-level ``inputs`` and ``outputs`` (lists of ``Tensor``) and ``config`` (a ``ModelConfig``) for a repository
without config.pbtxt, which ``describe`` reads. Triton's form defines ``class TritonPythonModel`` (``initialize``,
``execute``, ``finalize``, optionally ``auto_complete_config``) and imports ``triton_python_backend_utils``, which
is pyserve's own (``pyserve.backends.triton_python_backend_utils``).

Either is imported in ``setup(device)``, in the instance's process, and for auto-complete by ``describe`` in a
short-lived child process of its own, never in the core (both in ``pyserve.backends.python_loader``; ``describe`` is
re-exported here). ``execute`` gets the batch's requests as ``pb_utils.InferenceRequest`` objects and returns one
``InferenceResponse`` each; a decoupled model's response senders may send from any thread, and the instance streams
what they send, one round of responses at a time, until every request's sender has sent the final flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pyserve.backends import triton_python_backend_utils as pb_utils
from pyserve.backends.base import BackendModel, Signature
from pyserve.backends.python_loader import describe as describe  # re-exported: callers and docs name it here
from pyserve.backends.python_loader import load_module
from pyserve.config import ModelSpec
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

_WAIT_S = 0.1  # how often a batch waiting on response senders looks whether its clients went away

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
