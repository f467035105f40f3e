"""pyserve's ``triton_python_backend_utils``: what Triton Python-backend models import as ``pb_utils``.

Written from Triton's documented Python-backend API. The Python backend (``pyserve.backends.python``) installs this
module as ``sys.modules["triton_python_backend_utils"]`` before it imports a ``model.py``, so a Triton model runs
unchanged: ``Tensor``, ``InferenceRequest`` (received in ``execute``, or built for BLS with ``exec`` /
``async_exec``), ``InferenceResponse``, ``TritonError``, the response sender of decoupled models, the model-config
helpers, ``ModelConfig`` for ``auto_complete_config`` and ``Logger``.

Tensors live in CPU memory as numpy arrays. BLS calls go through ``pyserve.bls`` and, as in Triton, a failed call
answers with a response whose ``has_error()`` is true rather than raising.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

import pyserve.bls as bls
from pyserve.backends._pb_utils_types import Tensor as Tensor  # re-exported: models see one pb_utils module
from pyserve.backends._pb_utils_types import TritonError as TritonError
from pyserve.backends._pb_utils_types import TritonModelException as TritonModelException
from pyserve.backends._pb_utils_types import triton_error as triton_error
from pyserve.errors import InferenceError
from pyserve.request import Request

logger = logging.getLogger(__name__)

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

TRITON_STRING_TO_NUMPY: dict[str, type[Any]] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


# tensors ---------------------------------------------------------------------------------------------------------


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input called ``name``, or None."""
    return next((tensor for tensor in request.inputs() if tensor.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output called ``name``, or None."""
    return next((tensor for tensor in response.output_tensors() if tensor.name() == name), None)


# model configuration -----------------------------------------------------------------------------------------------


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The ``input`` entry called ``name`` of a model configuration dict, or None."""
    return next((entry for entry in model_config.get("input", ()) if entry.get("name") == name), None)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The ``output`` entry called ``name`` of a model configuration dict, or None."""
    return next((entry for entry in model_config.get("output", ()) if entry.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether the configuration makes the model decoupled."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> type[Any]:
    """The numpy type of a config datatype: ``"TYPE_FP32"`` -> ``np.float32``."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


class ModelConfig:
    """The configuration ``auto_complete_config(auto_complete_model_config)`` receives, completes and returns."""

    def __init__(self, model_config: Mapping[str, Any] | str) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else copy.deepcopy(dict(model_config))
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a dict (Triton's JSON form)."""
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``."""
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        """Turn on dynamic batching (keeping settings the configuration already has)."""
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy: Mapping[str, Any]) -> None:
        """Set ``model_transaction_policy`` (``{"decoupled": True}`` makes the model decoupled)."""
        self._config["model_transaction_policy"] = dict(transaction_policy)

    def add_input(self, input: Mapping[str, Any]) -> None:
        """Declare an input (``name``, ``data_type``, ``dims``, optionally ``optional``)."""
        self._add("input", input)

    def add_output(self, output: Mapping[str, Any]) -> None:
        """Declare an output (``name``, ``data_type``, ``dims``)."""
        self._add("output", output)

    def _add(self, kind: str, tensor: Mapping[str, Any]) -> None:
        if "name" not in tensor:
            raise TritonModelException(f"add_{kind}: the {kind} needs a 'name', got {dict(tensor)}")
        existing = next((entry for entry in self._config[kind] if entry["name"] == tensor["name"]), None)
        if existing is None:
            self._config[kind].append(dict(tensor))
            return
        # Completing what config.pbtxt declared: fill in what it left out, refuse a datatype or dims contradicting it.
        for key, value in tensor.items():
            current = existing.get(key)
            if current in (None, "TYPE_INVALID", []):  # unset (config_json writes every field, unset ones empty)
                existing[key] = value
            elif (key == "data_type" and current != value) or (key == "dims" and list(current) != list(value)):
                raise TritonModelException(
                    f"add_{kind}: {kind} '{tensor['name']}' has {key} {current!r} in the configuration, "
                    f"auto_complete_config gives {value!r}"
                )


# requests and responses ------------------------------------------------------------------------------------------


class InferenceResponse:
    """The response to one request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] = (),
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(dict(parameters or {}))

    def output_tensors(self) -> list[Tensor]:
        """The response's tensors."""
        return self._outputs

    def has_error(self) -> bool:
        """Whether the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The response's error, or None."""
        return self._error

    def parameters(self) -> str:
        """The response's parameters as a JSON string."""
        return self._parameters


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model, from any thread, until the final flag."""

    def __init__(self, push: Callable[[InferenceResponse | None, int], None], is_cancelled: Callable[[], bool]):
        self._push = push
        self._is_cancelled = is_cancelled
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send a response; ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` ends the request (a response or None)."""
        with self._lock:
            if self._closed:
                raise TritonModelException("this request's final response was already sent")
            if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                raise TritonModelException(
                    "send() needs a response unless flags is TRITONSERVER_RESPONSE_COMPLETE_FINAL"
                )
            self._closed = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self._push(response, flags)

    def is_cancelled(self) -> bool:
        """True once the client cancelled the request or went away."""
        return self._is_cancelled()


class InferenceRequest:
    """A request: one ``execute`` received, or one a model builds to call another model (BLS).

    BLS: ``InferenceRequest(model_name=..., inputs=[Tensor...], requested_output_names=[...]).exec()``;
    ``timeout`` is in microseconds, ``model_version=-1`` runs the latest version.
    """

    def __init__(
        self,
        model_name: str = "",
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        *,
        correlation_id: int | str = 0,
        request_id: str = "",
        flags: int = 0,
        timeout: int = 0,
        parameters: Mapping[str, Any] | str | None = None,
        model_version: int = -1,
        preferred_memory: Any = None,
        trace: Any = None,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._correlation_id = correlation_id
        self._request_id = request_id
        self._flags = flags
        self._timeout = timeout
        self._parameters: dict[str, Any] = dict(
            json.loads(parameters) if isinstance(parameters, str) else parameters or {}
        )
        self._model_version = model_version
        self._make_sender: Callable[[], InferenceResponseSender] | None = None
        self._sender: InferenceResponseSender | None = None
        self._received: Request | None = None

    @classmethod
    def received(
        cls, request: Request, sender: Callable[[], InferenceResponseSender] | None = None
    ) -> InferenceRequest:
        """The request ``execute`` gets for a pyserve request (used by the Python backend); ``sender`` makes its
        response sender when the model first asks for it."""
        params = request.parameters
        flags = (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if params.get("sequence_start") else 0) | (
            TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if params.get("sequence_end") else 0
        )
        made = cls(
            inputs=[Tensor(name, array) for name, array in request.data.items()],
            requested_output_names=request.requested_output_names,
            correlation_id=params.get("sequence_id", 0),
            request_id=request.id,
            flags=flags,
            parameters=params,
        )
        made._make_sender = sender
        made._received = request
        return made

    def inputs(self) -> list[Tensor]:
        """The request's input tensors."""
        return self._inputs

    def request_id(self) -> str:
        """The request's id (empty when the client gave none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence id (0 outside a sequence)."""
        return self._correlation_id

    def flags(self) -> int:
        """Sequence start/end flags."""
        return self._flags

    def timeout(self) -> int:
        """The timeout in microseconds (0: none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON string."""
        return json.dumps(self._parameters, default=str)

    def requested_output_names(self) -> list[str]:
        """The outputs the client asked for (empty: all)."""
        return self._requested

    def model_name(self) -> str:
        """The model a BLS request calls."""
        return self._model_name

    def is_cancelled(self) -> bool:
        """True once the client cancelled the request or went away."""
        return self._received is not None and self._received.is_cancelled

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender of this request's responses (decoupled models, or models whose execute returns None)."""
        if self._sender is None:
            if self._make_sender is None:
                raise TritonModelException("only a request received by execute() has a response sender")
            self._sender = self._make_sender()
        return self._sender

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run the request on its model: its response, or with ``decoupled=True`` an iterator of its responses."""
        if decoupled:
            try:
                stream = bls.infer_stream(**self._call())
            except InferenceError as exc:
                return iter([InferenceResponse(error=triton_error(exc))])
            return _responses(stream)
        try:
            return _response(bls.infer(**self._call()))
        except InferenceError as exc:
            return InferenceResponse(error=triton_error(exc))

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """``exec`` for ``async def execute``: other coroutines run while the call is in flight."""
        if not decoupled:
            try:
                return _response(await bls.ainfer(**self._call()))
            except InferenceError as exc:
                return InferenceResponse(error=triton_error(exc))
        responses: list[InferenceResponse] = []
        try:
            async for outputs in bls.ainfer_stream(**self._call()):
                responses.append(_response(outputs))
        except InferenceError as exc:
            responses.append(InferenceResponse(error=triton_error(exc)))
        return iter(responses)

    def _call(self) -> dict[str, Any]:
        return {
            "model": self._model_name,
            "inputs": {tensor.name(): tensor.as_numpy() for tensor in self._inputs},
            "version": None if self._model_version < 0 else self._model_version,
            "outputs": self._requested or None,
            "parameters": self._parameters,
            "timeout_s": self._timeout / 1e6 if self._timeout else None,
            "request_id": self._request_id,
        }


def _response(outputs: Mapping[str, np.ndarray]) -> InferenceResponse:
    return InferenceResponse([Tensor(name, array) for name, array in outputs.items()])


def _responses(stream: Iterator[dict[str, np.ndarray]]) -> Iterator[InferenceResponse]:
    try:
        for outputs in stream:
            yield _response(outputs)
    except InferenceError as exc:
        yield InferenceResponse(error=triton_error(exc))
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


# logging ---------------------------------------------------------------------------------------------------------


class LogLevel:
    """Levels of ``Logger.log``."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """Triton's model logger, writing to Python logging (VERBOSE is DEBUG)."""

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        """Log ``message`` at a ``LogLevel``."""
        logger.log(_LEVELS.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        logger.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        logger.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        logger.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at DEBUG."""
        logger.debug("%s", message)
