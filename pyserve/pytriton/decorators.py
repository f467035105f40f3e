"""PyTriton's ``pytriton.decorators``, over pyserve's (``pyserve.decorators``, docs/binding.md).

``batch``, ``sample``, ``group_by_keys``, ``fill_optionals``, ``first_value``, ``pad_batch`` and ``ConstantPadder``
are pyserve's own, which take PyTriton's arguments and placements; their functions may return outputs as a dict or
as a list or tuple in declared order. Two are written here:

- ``group_by_values`` in PyTriton's placement, *below* ``@batch``: it gets the batch's arrays as keyword arguments,
  calls the function once per group of rows holding equal values in ``keys``, and puts the outputs back in row
  order (``pad_fn``, such as ``ConstantPadder()``, pads the groups' outputs to one shape). pyserve's own
  ``pyserve.group_by_values`` goes *above* ``@batch`` and groups whole requests without copying rows;
- ``triton_context``: passes ``triton_context=TritonContext(...)``, whose ``model_configs[infer_func]`` describes
  the running model (name, version, batching, tensors), from ``pyserve.current_model()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pyserve.config import DynamicBatcher
from pyserve.decorators import ConstantPadder, batch, fill_optionals, first_value, group_by_keys, pad_batch, sample
from pyserve.errors import OutputMismatchError
from pyserve.grouping import group_by_values as group_requests_by_values
from pyserve.pytriton.model_config import DeviceKind
from pyserve.request import ModelContext, current_model
from pyserve.wrapping import ENDED, Call, InferFunc, Inputs, Merge, adapt, only_result, output_arrays, request_batch

__all__ = [
    "ConstantPadder",
    "TensorSpec",
    "TritonContext",
    "TritonModelConfig",
    "batch",
    "fill_optionals",
    "first_value",
    "get_inference_request_batch_size",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "triton_context",
]

TRITON_CONTEXT_FIELD_NAME = "triton_context"


# --- triton_context -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One declared input or output of the running model, as PyTriton describes it."""

    name: str
    shape: tuple[int, ...]
    dtype: Any
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class TritonModelConfig:
    """The running model's configuration, in the fields of PyTriton's ``TritonModelConfig``."""

    model_name: str
    model_version: int
    max_batch_size: int
    batching: bool
    batcher: DynamicBatcher | None
    decoupled: bool
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    response_cache: bool
    instance_group: dict[DeviceKind, int]


class _ModelConfigs:
    """``TritonContext.model_configs``: ``[infer_func]`` gives the running model's config, whatever the key (a
    pyserve context belongs to one model, so the callable PyTriton keys it by is not needed)."""

    def __init__(self, config: TritonModelConfig) -> None:
        self._config = config

    def __getitem__(self, infer_callable: object) -> TritonModelConfig:
        return self._config

    def __contains__(self, infer_callable: object) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class TritonContext:
    """What ``@triton_context`` passes as ``triton_context``: ``model_configs[infer_func]`` is the model's config."""

    model_configs: _ModelConfigs


def _tensor_spec(tensor: Any) -> TensorSpec:
    # PyTriton describes BYTES tensors as np.bytes_; every other dtype as its numpy scalar type.
    dtype = np.bytes_ if tensor.datatype == "BYTES" else tensor.numpy_dtype.type
    return TensorSpec(tensor.name, tuple(tensor.shape), dtype, tensor.optional)


def _model_config(model: ModelContext) -> TritonModelConfig:
    config = model.config
    return TritonModelConfig(
        model_name=model.name,
        model_version=model.version,
        max_batch_size=config.max_batch_size,
        batching=config.max_batch_size > 0,
        batcher=config.batcher,
        decoupled=config.decoupled,
        inputs=tuple(_tensor_spec(tensor) for tensor in model.inputs),
        outputs=tuple(_tensor_spec(tensor) for tensor in model.outputs),
        response_cache=config.response_cache,
        instance_group={DeviceKind.KIND_GPU if config.devices else DeviceKind.KIND_CPU: config.instances},
    )


def triton_context(fn: InferFunc) -> InferFunc:
    """Call ``fn`` with one more keyword argument, ``triton_context`` (a ``TritonContext``); works at any level of
    the stack, since ``@batch`` passes keyword arguments it does not know on. Raises ``LookupError`` outside an
    infer function."""

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
        context = TritonContext(_ModelConfigs(_model_config(current_model())))
        return [Call(args, {**kwargs, TRITON_CONTEXT_FIELD_NAME: context})], only_result

    return adapt(fn, plan)


# --- group_by_values below @batch -----------------------------------------------------------------------------


def group_by_values(
    *keys: str, pad_fn: Callable[[list[Inputs]], Sequence[Inputs]] | None = None
) -> Callable[[InferFunc], InferFunc]:
    """PyTriton's ``@group_by_values``, placed below ``@batch``: call the function once per group of batch rows with
    equal values in the inputs named by ``keys`` (a row's whole value, dtype and shape included), then put the
    outputs back in row order; ``pad_fn`` pads the groups' outputs so that they join into one array per output.

    Built on pyserve's ``group_by_values`` and ``batch``: the rows become one-row requests, grouped and concatenated
    again per group, so each group's inputs are a copy.
    """

    def decorator(fn: InferFunc) -> InferFunc:
        grouped = group_requests_by_values(*keys)(batch(fn))

        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
            arrays = {name: value for name, value in kwargs.items() if isinstance(value, np.ndarray) and value.ndim}
            others = {name: value for name, value in kwargs.items() if name not in arrays}
            rows = next((len(array) for array in arrays.values()), 0)
            row_requests: list[Inputs] = [
                {name: array[row : row + 1] for name, array in arrays.items()} for row in range(rows)
            ]

            def merge(results: list[Any]) -> dict[str, NDArray[Any]]:
                return _join_rows(results[0], pad_fn)

            return [Call((*args, request_batch(row_requests)), others)], merge

        return adapt(grouped, plan)

    return decorator


def _join_rows(responses: Any, pad_fn: Callable[[list[Inputs]], Sequence[Inputs]] | None) -> dict[str, NDArray[Any]]:
    """One output dict of the batch from the per-row output dicts the groups answered."""
    if responses is ENDED or any(response is None for response in responses):
        raise OutputMismatchError(
            "@group_by_values: the groups' generators yielded different numbers of items; below @batch every group "
            "must yield as many"
        )
    rows: list[Inputs] = [output_arrays(response, "@group_by_values") for response in responses]
    if pad_fn is not None:
        rows = list(pad_fn(rows))
    if not rows:
        return {}
    return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}


def get_inference_request_batch_size(inference_request: Mapping[str, NDArray[Any]]) -> int:
    """The batch size of one request: the first dimension of its first input."""
    first = next(iter(inference_request.values()))
    return int(first.shape[0])
