"""What the framework backends share: batching requests into one model call, reshaping, datatype names, devices and
the check of a model's configuration against what its file declares.

Each backend supplies one function, ``run(inputs, output_names) -> outputs``, over arrays in the shapes the model
itself sees; ``BatchRunner`` turns it into the instance callable: one call per batch when the model batches (requests
concatenated along dim 0 and outputs split back by rows, by ``pyserve.decorators.batch``), one per request
otherwise, ``BackendModel.reshape`` applied both ways, and each response holding only the outputs its request asked
for.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pyserve.backends.base import BackendModel, Signature, TensorSignature
from pyserve.config import Tensor
from pyserve.decorators import batch
from pyserve.dtypes import BF16
from pyserve.errors import ConfigError, InvalidInputError
from pyserve.request import Request

Arrays = dict[str, np.ndarray]
RunFunction = Callable[[Arrays, tuple[str, ...]], Mapping[str, np.ndarray]]

# ONNX Runtime's tensor type strings -> KServe datatypes.
ORT_DATATYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}
# KServe datatypes -> the names of torch dtypes (``getattr(torch, name)``); torch has no string tensors.
TORCH_DTYPE_NAMES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "bfloat16",
}
# TensorRT ``DataType`` member names -> KServe datatypes.
TRT_DATATYPES = {
    "BOOL": "BOOL",
    "UINT8": "UINT8",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "HALF": "FP16",
    "FLOAT": "FP32",
    "BF16": "BF16",
}

_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def parse_device(device: str) -> tuple[str, int]:
    """``"cpu"`` -> ("cpu", 0); ``"cuda"`` / ``"cuda:N"`` -> ("cuda", N); ConfigError for anything else."""
    match = _DEVICE.match(device)
    if match is None or (match.group(1) == "cpu" and match.group(2)):
        raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return match.group(1), int(match.group(2) or 0)


def existing_file(model: BackendModel) -> Path:
    """The model file, or ConfigError naming the model and the path when it is missing."""
    if not model.model_file.is_file():
        raise ConfigError(f"model '{model.spec.name}': model file {model.model_file} does not exist")
    return model.model_file


def kserve_datatype(table: Mapping[str, str], framework_type: str, what: str) -> str:
    """The KServe datatype of a framework type name, or ConfigError naming the tensor and the type."""
    try:
        return table[framework_type]
    except KeyError:
        raise ConfigError(f"{what} has type {framework_type}, which pyserve cannot serve") from None


def torch_dtype(datatype: str) -> Any:
    """The torch dtype of a KServe datatype (ConfigError for BYTES)."""
    import torch

    if datatype not in TORCH_DTYPE_NAMES:
        raise ConfigError(f"torch tensors cannot hold {datatype}")
    return getattr(torch, TORCH_DTYPE_NAMES[datatype])


def to_torch(array: np.ndarray, device: Any) -> Any:
    """A numpy array as a torch tensor on ``device``: a view of the same memory on the CPU, a copy on a GPU.

    A read-only array (shared with the server) is copied for the CPU, since a model may write to its inputs.
    """
    import torch

    if array.dtype == BF16:
        return to_torch(array.view(np.int16), device).view(torch.bfloat16)
    if not array.flags.writeable:
        if torch.device(device).type == "cpu":
            return torch.from_numpy(array.copy())
        with warnings.catch_warnings():
            # Only the host-to-device copy reads this view.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array).to(device)
    return torch.from_numpy(array).to(device)


def to_numpy(tensor: Any) -> np.ndarray:
    """A torch tensor as a numpy array (on the CPU: a view of the same memory)."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BF16)  # type: ignore[no-any-return]
    return tensor.numpy()  # type: ignore[no-any-return]


# --- the check of a config against a model file -----------------------------------------------------------------


def model_dims(model: BackendModel, tensor: Tensor) -> tuple[int, ...]:
    """The dims the model itself sees for a declared tensor: its reshape (or config shape), after -1 for the batch."""
    dims = tuple(model.reshape.get(tensor.name, tensor.shape))
    return (-1, *dims) if model.spec.config.max_batch_size > 0 else dims


def sequence_tensors(model: BackendModel) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """The tensors a stateful model's file takes and gives beside its declared ones (``sequence_batching``): the
    control inputs (one value per request, dims [1]) and implicit state inputs, and the state outputs. The instance
    feeds the inputs with every request and takes the state outputs out of the answers (``worker.sequence_state``)."""
    settings = model.spec.config.sequence_batcher
    if settings is None:
        return (), ()
    inputs = [Tensor(control.name, control.datatype, (1,)) for control in settings.control_inputs]
    inputs += [Tensor(state.input_name, state.datatype, state.shape) for state in settings.states]
    outputs = tuple(Tensor(state.output_name, state.datatype, state.shape) for state in settings.states)
    return tuple(inputs), outputs


def check_signature(model: BackendModel, found: Signature) -> None:
    """Raise ConfigError where the config's tensors disagree with the model file's (name, datatype, rank, dims).

    Every input the file needs must be declared (a stateful model's control and state inputs count); declared
    outputs, and the state outputs, must exist in the file, which may have more.
    """
    spec = model.spec
    max_batch_size = spec.config.max_batch_size
    extra_inputs, state_outputs = sequence_tensors(model)
    inputs, outputs = (*spec.inputs, *extra_inputs), (*spec.outputs, *state_outputs)
    for kind, declared, in_file in (("input", inputs, found.inputs), ("output", outputs, found.outputs)):
        by_name = {t.name: t for t in in_file}
        for tensor in declared:
            what = f"model '{spec.name}' {kind} '{tensor.name}'"
            sig = by_name.get(tensor.name)
            if sig is None:
                names = ", ".join(f"'{t.name}'" for t in in_file)
                raise ConfigError(f"{what} is declared in the config but the model file has no such {kind} ({names})")
            if sig.datatype != tensor.datatype:
                raise ConfigError(f"{what}: the config declares {tensor.datatype}, the model file has {sig.datatype}")
            _check_dims(what, model_dims(model, tensor), sig.dims, max_batch_size)
    declared_inputs = {t.name for t in inputs}
    undeclared = [t.name for t in found.inputs if t.name not in declared_inputs]
    if undeclared:
        raise ConfigError(f"model '{spec.name}': the model file needs inputs {undeclared}, which the config lacks")


def _check_dims(what: str, expected: tuple[int, ...], dims: tuple[int, ...], max_batch_size: int) -> None:
    if len(expected) != len(dims):
        raise ConfigError(
            f"{what}: the config gives the model {len(expected)} dims {list(expected)} (batch dim and reshape "
            f"included), the model file has {len(dims)} dims {list(dims)}"
        )
    if max_batch_size > 0 and 0 < dims[0] < max_batch_size:
        raise ConfigError(
            f"{what}: the model file fixes the batch dim at {dims[0]}, less than max_batch_size {max_batch_size}"
        )
    start = 1 if max_batch_size > 0 else 0
    for index in range(start, len(dims)):
        if expected[index] > 0 and dims[index] > 0 and expected[index] != dims[index]:
            raise ConfigError(
                f"{what}: dim {index} is {expected[index]} in the config, {dims[index]} in the model file "
                f"(config dims {list(expected)}, file dims {list(dims)})"
            )


def signature_of(
    inputs: Iterable[tuple[str, str, Iterable[Any]]], outputs: Iterable[tuple[str, str, Iterable[Any]]]
) -> Signature:
    """A Signature of (name, KServe datatype, dims) triples; a dim that is not a positive int becomes -1."""

    def tensors(items: Iterable[tuple[str, str, Iterable[Any]]]) -> tuple[TensorSignature, ...]:
        return tuple(
            TensorSignature(name, datatype, tuple(d if isinstance(d, int) and d > 0 else -1 for d in dims))
            for name, datatype, dims in items
        )

    return Signature(tensors(inputs), tensors(outputs))


# --- running a request batch ------------------------------------------------------------------------------------


class BatchRunner:
    """The instance callable of a backend: a RequestBatch in, one output dict per request out, around ``run``."""

    def __init__(self, model: BackendModel, run: RunFunction) -> None:
        spec = model.spec
        self._name = spec.name
        self._run = run
        self._batching = spec.config.max_batch_size > 0
        self._outputs = tuple(t.name for t in spec.outputs)
        # A stateful model's state outputs: always computed, always returned (the instance keeps them).
        self._states = tuple(t.name for t in sequence_tensors(model)[1])
        self._input_shapes = {t.name: model.reshape[t.name] for t in spec.inputs if t.name in model.reshape}
        # Outputs the model gives in its own shape go back to the shape clients see (the config's).
        self._output_shapes = {t.name: t.shape for t in spec.outputs if t.name in model.reshape}
        for tensor in spec.outputs:
            if tensor.name in model.reshape and tensor.shape.count(-1) > 1:
                raise ConfigError(
                    f"model '{spec.name}' output '{tensor.name}': a reshaped output may have one variable dim at "
                    f"most, its dims are {list(tensor.shape)}"
                )

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        names = self._output_names(requests) + self._states
        if self._batching:
            responses: list[dict[str, np.ndarray]] = _run_batch(self, names, requests)
        else:
            responses = [self.run_once(names, request.data) for request in requests]
        return [
            response
            if not request.requested_output_names
            else {n: response[n] for n in (*request.requested_output_names, *self._states)}
            for request, response in zip(requests, responses, strict=True)
        ]

    def run_once(self, names: tuple[str, ...], inputs: Mapping[str, np.ndarray]) -> Arrays:
        """Run the model once on inputs in the clients' shapes; the outputs named, in the clients' shapes."""
        feeds = {name: self._to_model(name, array) for name, array in inputs.items()}
        results = self._run(feeds, names)
        outputs = {}
        for name in names:
            array = results[name]
            shape = self._output_shapes.get(name)
            if shape is not None:
                array = array.reshape((array.shape[0], *shape) if self._batching else shape)
            outputs[name] = array
        return outputs

    def _to_model(self, name: str, array: np.ndarray) -> np.ndarray:
        shape = self._input_shapes.get(name)
        if shape is None:
            return array
        try:
            return array.reshape((array.shape[0], *shape) if self._batching else shape)
        except ValueError:
            raise InvalidInputError(
                f"model '{self._name}' input '{name}': shape {list(array.shape)} cannot be reshaped to the model's "
                f"{list(shape)}"
            ) from None

    def _output_names(self, requests: list[Request]) -> tuple[str, ...]:
        """The outputs to compute: every declared one when any request wants all, else the union asked for."""
        wanted: set[str] = set()
        for request in requests:
            if not request.requested_output_names:
                return self._outputs
            wanted.update(request.requested_output_names)
        unknown = wanted.difference(self._outputs)
        if unknown:
            raise InvalidInputError(f"model '{self._name}' has no outputs {sorted(unknown)}")
        return tuple(name for name in self._outputs if name in wanted)


def _run_rows(runner: BatchRunner, names: tuple[str, ...], /, **inputs: np.ndarray) -> Arrays:
    return runner.run_once(names, inputs)


# Concatenates the batch's inputs (or uses the core's contiguous layout) and splits the outputs back by rows.
_run_batch = batch(_run_rows)
