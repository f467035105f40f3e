"""Decorators that adapt an infer function to the shape it wants to see.

A pyserve infer function receives one ``RequestBatch`` (a list of ``Request``) and returns one output dict per
request, in order. These decorators let the function see something more convenient:

- ``@batch``: the inputs of all requests concatenated along axis 0, as keyword arguments; outputs split back;
- ``@sample``: one request's inputs as keyword arguments, called once per request;
- ``@group_by_keys`` / ``@group_by_values``: the batch split into sub-batches that ``@batch`` can concatenate;
- ``@fill_optionals``: defaults for inputs a request left out;
- ``@first_value`` / ``@pad_batch``: adjust the keyword arguments ``@batch`` passes on (place them below it);
- ``@sequence``: for a stateful model, ``(inputs, state) -> (outputs, state)`` per sequence.

Requests-level decorators (``batch``, ``sample``, ``group_by_*``, ``fill_optionals``) take the request batch as
their last positional argument and pass any leading ones (``self`` of a method) through. A typical stack::

    @fill_optionals(temperature=np.array([1.0], dtype=np.float32))
    @group_by_values("temperature")
    @batch
    @first_value("temperature")
    def infer(prompt, temperature): ...

Every decorator accepts sync, ``async def``, generator and async generator functions and returns a wrapper of the
same kind, so the worker still recognises a decoupled (streaming) model. Each item a generator yields is adapted
like a return value. Where a decorator calls the function several times (``sample``, the ``group_by_*`` ones) the
calls run one after another; for generators their streams advance in lockstep, and a request whose stream has
ended contributes ``None`` (no response this round, as the worker reads it) to the later response lists.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np
from numpy.typing import NDArray

from pyserve.dtypes import as_bytes_array
from pyserve.errors import ConfigError, InvalidInputError, ModelExecutionError, OutputMismatchError
from pyserve.grouping import ConstantPadder, group_by_keys, group_by_values
from pyserve.request import ModelContext, Request, SequenceContext, current_model
from pyserve.wrapping import (
    ENDED,
    Call,
    InferFunc,
    Inputs,
    Merge,
    adapt,
    check_keys,
    inputs_of,
    no_responses,
    only_result,
    output_arrays,
    request_batch,
    request_rows,
    split_args,
    with_inputs,
)

__all__ = [
    "ConstantPadder",
    "batch",
    "fill_optionals",
    "first_value",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "sequence",
]

# --- @batch and @sample ---------------------------------------------------------------------------------------


def batch(fn: InferFunc) -> InferFunc:
    """Call ``fn`` once per batch with every input concatenated along axis 0 as a keyword argument.

    ``fn`` returns a dict of output arrays whose first dimension is the batch's total number of rows; each is split
    back into per-request views (slices, no copies) by the requests' row counts. Nothing is copied on the way in
    either: a batch of one request passes its arrays as they are, and the server's contiguous
    ``RequestBatch.merged`` layout is used for every input it holds (only missing inputs are concatenated).

    Raises ``ModelExecutionError`` for requests that cannot be concatenated (different input names: put
    ``@group_by_keys`` or ``@fill_optionals`` above; different per-row shapes: put ``@group_by_values`` with a
    ``ConstantPadder`` above), ``InvalidInputError`` for a request whose inputs disagree on its row count, and
    ``OutputMismatchError`` for a return value that is not a dict or an output with the wrong number of rows.
    """

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
        leading, requests = split_args(args, "@batch")
        if not requests:
            return [], no_responses
        inputs, rows = _concatenate(requests)
        return [Call(leading, {**kwargs, **inputs})], lambda results: _split_outputs(results[0], rows)

    return adapt(fn, plan)


def _concatenate(requests: Sequence[Inputs]) -> tuple[dict[str, NDArray[Any]], list[int]]:
    """The batch's inputs as single arrays, and each request's row count."""
    datas = [inputs_of(request) for request in requests]
    names = set(datas[0])
    for index, data in enumerate(datas[1:], start=1):
        if data.keys() != names:
            raise ModelExecutionError(
                f"@batch: request {index} has inputs {sorted(data)} but request 0 has {sorted(names)}; requests with "
                "different inputs cannot be concatenated: put @group_by_keys or @fill_optionals above @batch"
            )
    rows = [_checked_rows(index, data) for index, data in enumerate(datas)]
    if len(datas) == 1:
        return dict(datas[0]), rows
    total = sum(rows)
    merged = getattr(requests, "merged", None) or {}
    inputs = {}
    for name in datas[0]:
        laid_out = merged.get(name)
        # Rows that do not add up mean a decorator above took requests out without resetting ``merged``.
        if laid_out is not None and laid_out.shape[:1] == (total,):
            inputs[name] = laid_out
        else:
            inputs[name] = _concatenate_input(name, [data[name] for data in datas])
    return inputs, rows


def _checked_rows(index: int, data: Inputs) -> int:
    sizes = set()
    for name, array in data.items():
        if array.ndim == 0:
            raise ModelExecutionError(
                f"@batch: input '{name}' of request {index} has no batch dimension (shape ()); @batch needs a model "
                "with max_batch_size > 0, use @sample otherwise"
            )
        sizes.add(int(array.shape[0]))
    if len(sizes) > 1:
        shapes = ", ".join(f"'{name}' {array.shape}" for name, array in data.items())
        raise InvalidInputError(f"request {index}: inputs disagree on the batch size: {shapes}")
    return sizes.pop() if sizes else 1


def _concatenate_input(name: str, arrays: list[NDArray[Any]]) -> NDArray[Any]:
    try:
        return np.concatenate(arrays, axis=0)
    except ValueError as exc:
        shapes = sorted({array.shape[1:] for array in arrays})
        raise ModelExecutionError(
            f"@batch: input '{name}' cannot be concatenated across requests, their per-row shapes differ: {shapes}; "
            "put @group_by_values(..., pad_fn=ConstantPadder()) (or @group_by_values on the input deciding the "
            "shape) above @batch"
        ) from exc


def _split_outputs(outputs: Any, rows: list[int]) -> list[dict[str, NDArray[Any]]]:
    arrays = output_arrays(outputs, "@batch")
    total = sum(rows)
    for name, array in arrays.items():
        if array.shape[:1] != (total,):
            raise OutputMismatchError(
                f"@batch: output '{name}' has shape {array.shape}, expected {total} rows (first dimension) for the "
                f"{len(rows)} requests of the batch"
            )
    if len(rows) == 1:
        return [arrays]
    responses = []
    start = 0
    for count in rows:
        stop = start + count
        responses.append({name: array[start:stop] for name, array in arrays.items()})
        start = stop
    return responses


def sample(fn: InferFunc) -> InferFunc:
    """Call ``fn`` once per request with that request's inputs as keyword arguments.

    ``fn`` returns the output dict of its request (``OutputMismatchError`` otherwise). Arrays are passed as they
    are, batch dimension included when the model batches.
    """

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
        leading, requests = split_args(args, "@sample")
        return [Call(leading, {**kwargs, **inputs_of(request)}) for request in requests], _sample_responses

    return adapt(fn, plan)


def _sample_responses(results: list[Any]) -> list[dict[str, NDArray[Any]] | None]:
    return [None if result is ENDED else output_arrays(result, "@sample") for result in results]


# --- keyword-level: @first_value, @pad_batch ------------------------------------------------------------------


def first_value(
    *keys: str, squeeze_single_values: bool = True, strict: bool = True
) -> Callable[[InferFunc], InferFunc]:
    """Replace the named keyword arguments (batch arrays) by their first row; place it below ``@batch``.

    For parameters that hold one value per batch (``temperature``): ``arr`` becomes ``arr[0]``. With
    ``squeeze_single_values`` a first row of exactly one element becomes a numpy scalar that keeps its dtype
    (``np.float32(0.7)``; a BYTES element gives ``bytes``), via ``arr[0].reshape(())[()]``. With ``strict`` every
    row must equal the first (NaN equals NaN), else ``InvalidInputError`` names the input; put
    ``@group_by_values(key)`` above ``@batch`` so that requests with different values never share a call. Names
    that are not passed, and values that are not arrays, are left alone; a 0-d array counts as its own first row.

    On a function that takes the request batch instead (no keyword argument named by ``keys``, a list of requests
    as the last positional argument), each request's input is replaced the same way, in a copy of the request.
    """
    check_keys("@first_value", keys)

    def decorator(fn: InferFunc) -> InferFunc:
        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
            if args and not any(key in kwargs for key in keys) and isinstance(args[-1], (list, tuple)):
                requests = [
                    with_inputs(request, _first_values(inputs_of(request), keys, squeeze_single_values, strict))
                    for request in args[-1]
                ]
                return [Call((*args[:-1], request_batch(requests)), kwargs)], only_result
            return [Call(args, _first_values(kwargs, keys, squeeze_single_values, strict))], only_result

        return adapt(fn, plan)

    return decorator


def _first_values(inputs: Inputs, keys: tuple[str, ...], squeeze: bool, strict: bool) -> dict[str, Any]:
    replaced = dict(inputs)
    for key in keys:
        value = replaced.get(key)
        if isinstance(value, np.ndarray):
            replaced[key] = _first_row(key, value, squeeze, strict)
    return replaced


def _first_row(key: str, array: NDArray[Any], squeeze: bool, strict: bool) -> Any:
    if array.ndim and not len(array):
        return array  # no rows, no first value: the function sees the empty batch
    first = array[0] if array.ndim else array
    if strict and array.ndim and len(array) > 1:
        same = array == first
        if array.dtype.kind in "fc":
            same |= np.isnan(array) & np.isnan(first)
        row_same = np.asarray(same).reshape(len(array), -1).all(axis=1)
        if not row_same.all():
            other = int(np.argmin(row_same))
            raise InvalidInputError(
                f"@first_value: input '{key}' must hold one value for the whole batch, but row {other} "
                f"({_preview(array[other])}) differs from row 0 ({_preview(first)}); put @group_by_values('{key}') "
                "above @batch, or use strict=False"
            )
    if squeeze and first.size == 1:
        return first.reshape(())[()]
    return first


def _preview(row: NDArray[Any]) -> str:
    text = repr(row.tolist())
    return text if len(text) <= 60 else text[:57] + "..."


def pad_batch(fn: InferFunc) -> InferFunc:
    """Pad the batch to the next preferred batch size (or ``max_batch_size``) by repeating its last row.

    Place it below ``@batch``. The target is the smallest of the model's ``batcher.preferred_batch_size`` that is
    at least the batch's rows, else ``max_batch_size``; a batch already that large is passed as it is. Every array
    keyword argument is padded (non-arrays and 0-d arrays are left alone); the outputs, which must have the padded
    number of rows (``OutputMismatchError`` otherwise), are trimmed back to the real rows (views). Reads the config
    through ``current_model()``, so it raises ``LookupError`` outside a model context and ``ConfigError`` for a
    model with ``max_batch_size`` 0.
    """

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
        model = _require_model("@pad_batch")
        if model.config.max_batch_size <= 0:
            raise ConfigError(f"@pad_batch: model '{model.name}' has max_batch_size 0, so it has no batch to pad")
        arrays = {name: value for name, value in kwargs.items() if isinstance(value, np.ndarray) and value.ndim}
        sizes = {int(array.shape[0]) for array in arrays.values()}
        if len(sizes) > 1:
            shapes = ", ".join(f"'{name}' {array.shape}" for name, array in arrays.items())
            raise ModelExecutionError(f"@pad_batch: inputs disagree on the batch size: {shapes}")
        rows = sizes.pop() if sizes else 0
        target = _padded_size(rows, model)
        if rows == 0 or target <= rows:
            return [Call(args, kwargs)], only_result
        padded = {name: _repeat_last_row(array, target) for name, array in arrays.items()}
        return [Call(args, {**kwargs, **padded})], lambda results: _trim(results[0], rows, target)

    return adapt(fn, plan)


def _require_model(who: str) -> ModelContext:
    try:
        return current_model()
    except LookupError:
        raise LookupError(
            f"{who} reads the model's config through current_model(), so it only runs inside a pyserve infer "
            "function (in tests, set one with set_current_model(ModelContext(...)))"
        ) from None


def _padded_size(rows: int, model: ModelContext) -> int:
    batcher = model.config.batcher
    preferred = sorted(batcher.preferred_batch_size) if batcher is not None else []
    return next((size for size in (*preferred, model.config.max_batch_size) if size >= rows), rows)


def _repeat_last_row(array: NDArray[Any], target: int) -> NDArray[Any]:
    return np.concatenate([array, np.repeat(array[-1:], target - len(array), axis=0)])


def _trim(outputs: Any, rows: int, target: int) -> dict[str, NDArray[Any]]:
    arrays = output_arrays(outputs, "@pad_batch")
    for name, array in arrays.items():
        if array.shape[:1] != (target,):
            raise OutputMismatchError(
                f"@pad_batch: output '{name}' has shape {array.shape}, expected {target} rows (the batch of {rows} "
                f"padded to {target})"
            )
    return {name: array[:rows] for name, array in arrays.items()}


# --- @fill_optionals ------------------------------------------------------------------------------------------


def fill_optionals(**defaults: Any) -> Callable[[InferFunc], InferFunc]:
    """Give requests that lack one of the named inputs its default value.

    Works on requests; place it at the top of the stack so the grouping decorators below see complete requests.
    A default is ONE row, without batch dimension (``np.array([1.0], dtype=np.float32)`` for an input of shape
    ``(1,)``); when the model batches it is repeated once per row of the request (rows read from the request's
    other inputs; one row for a request without inputs), otherwise a copy is used as it is. Outside a model
    context (plain unit tests) the model is assumed to batch. Bytes and str defaults become BYTES (object arrays
    of bytes).

    Defaults that are not array-like raise ``ConfigError`` when decorating. Inside a model context, the first call
    checks each default against the model's declared inputs (name, dtype, shape) and raises ``ConfigError`` on a
    mismatch: a Python float is float64, so pass ``np.float32(...)`` for an FP32 input. Requests that need nothing
    are passed on unchanged; filled ones are copies, and the batch keeps its ``merged`` layout for the other inputs.
    """
    values = {name: _default_array(name, value) for name, value in defaults.items()}
    checked: set[tuple[str, int]] = set()

    def decorator(fn: InferFunc) -> InferFunc:
        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
            leading, requests = split_args(args, "@fill_optionals")
            try:
                model: ModelContext | None = current_model()
            except LookupError:
                model = None
            if model is not None and (model.name, model.version) not in checked:
                _check_defaults(values, model)
                checked.add((model.name, model.version))
            batching = model is None or model.config.max_batch_size > 0
            return [Call((*leading, _filled(requests, values, batching)), kwargs)], only_result

        return adapt(fn, plan)

    return decorator


def _default_array(name: str, value: Any) -> NDArray[Any]:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"@fill_optionals: the default for '{name}' is not array-like: {value!r}") from exc
    if array.dtype == object and not all(isinstance(item, (bytes, str)) for item in array.flat):
        raise ConfigError(
            f"@fill_optionals: the default for '{name}' must hold numbers, booleans, bytes or str, got {value!r}"
        )
    if array.dtype.kind in "OSU":
        return as_bytes_array(array)
    return array


def _check_defaults(values: dict[str, NDArray[Any]], model: ModelContext) -> None:
    declared = {tensor.name: tensor for tensor in model.inputs}
    for name, array in values.items():
        tensor = declared.get(name)
        if tensor is None:
            raise ConfigError(
                f"@fill_optionals: model '{model.name}' has no input '{name}' (inputs: {sorted(declared)})"
            )
        if array.dtype != tensor.numpy_dtype:
            raise ConfigError(
                f"@fill_optionals: the default for input '{name}' has dtype {array.dtype}, but model "
                f"'{model.name}' declares {tensor.datatype} ({tensor.numpy_dtype})"
            )
        if len(array.shape) != len(tensor.shape) or any(
            want not in (-1, have) for have, want in zip(array.shape, tensor.shape, strict=True)
        ):
            raise ConfigError(
                f"@fill_optionals: the default for input '{name}' has shape {array.shape}, but model "
                f"'{model.name}' declares {tensor.shape} (a default is one row, without the batch dimension)"
            )


def _filled(requests: Sequence[Inputs], values: dict[str, NDArray[Any]], batching: bool) -> Sequence[Inputs]:
    out: list[Inputs] = []
    for request in requests:
        data = inputs_of(request)
        missing = [name for name in values if name not in data]
        if not missing:
            out.append(request)
            continue
        rows = request_rows(data)
        added = {
            # A copy per request: the function may write into its inputs, and defaults are shared across calls.
            name: np.repeat(values[name][np.newaxis], rows, axis=0) if batching else values[name].copy()
            for name in missing
        }
        out.append(with_inputs(request, {**data, **added}))
    if all(new is old for new, old in zip(out, requests, strict=True)):
        return requests
    filled = request_batch(out)
    # The inputs already present are unchanged, so their contiguous layout stays valid.
    filled.merged = getattr(requests, "merged", None)
    return filled


# --- @sequence ------------------------------------------------------------------------------------------------


@overload
def sequence(fn: InferFunc, *, batched: bool = False, initial_state: Any = None) -> InferFunc: ...


@overload
def sequence(
    fn: None = None, *, batched: bool = False, initial_state: Any = None
) -> Callable[[InferFunc], InferFunc]: ...


def sequence(
    fn: InferFunc | None = None, *, batched: bool = False, initial_state: Any = None
) -> InferFunc | Callable[[InferFunc], InferFunc]:
    """Give a stateful model's function its sequence's state: ``fn(inputs, state) -> (outputs, state)``.

    For models with ``ModelConfig(sequence_batcher=...)``. Called once per request, ``fn`` gets the request's inputs
    (a dict of arrays, batch dimension included when the model batches, control and state inputs too) and the state
    it returned with the previous request of the same sequence, and returns the request's outputs and the new state.
    A sequence starts from ``initial_state`` (a callable is called for each new sequence, any other value is copied;
    None by default). The state may be any Python object: the instance keeps it (``Request.sequence.state``), never
    sent anywhere, and drops it when the sequence ends or is released.

    With ``batched=True``, ``fn`` is called once per batch, which holds at most one request of each sequence:
    ``fn(inputs, states) -> (outputs, states)`` with every input concatenated along axis 0 (as ``@batch`` does,
    one row per sequence) and ``states`` the list of the sequences' states in the same order; the outputs are split
    back by rows. Use it as ``@sequence`` or ``@sequence(batched=True, initial_state=...)``.
    """

    def decorator(fn: InferFunc) -> InferFunc:
        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
            leading, requests = split_args(args, "@sequence")
            contexts = [_sequence_of(request) for request in requests]
            states = [_starting_state(context, initial_state) for context in contexts]
            if not batched:
                calls = [
                    Call((*leading, dict(inputs_of(request)), state), kwargs)
                    for request, state in zip(requests, states, strict=True)
                ]
                return calls, lambda results: _per_sequence_outputs(results, contexts)
            if not requests:
                return [], no_responses
            inputs, rows = _concatenate(requests)
            return [Call((*leading, inputs, states), kwargs)], lambda results: _batched_outputs(results, contexts, rows)

        return adapt(fn, plan)

    return decorator if fn is None else decorator(fn)


def _sequence_of(request: Inputs) -> SequenceContext:
    context = request.sequence if isinstance(request, Request) else None
    if context is None:
        raise ConfigError(
            "@sequence needs a stateful model: bind it with ModelConfig(sequence_batcher=SequenceBatcher(...)) "
            "(the requests it got belong to no sequence)"
        )
    return context


def _starting_state(context: SequenceContext, initial_state: Any) -> Any:
    if context.state is not None:
        return context.state
    return initial_state() if callable(initial_state) else copy.deepcopy(initial_state)


def _state_pair(result: Any, who: str) -> tuple[Any, Any]:
    if not isinstance(result, tuple) or len(result) != 2:
        raise OutputMismatchError(f"{who}: the function must return (outputs, state), got {type(result).__name__}")
    return result[0], result[1]


def _per_sequence_outputs(results: list[Any], contexts: list[SequenceContext]) -> list[Any]:
    responses: list[Any] = []
    for result, context in zip(results, contexts, strict=True):
        if result is ENDED:  # a stream of a decoupled model that has ended
            responses.append(None)
            continue
        outputs, context.state = _state_pair(result, "@sequence")
        responses.append(output_arrays(outputs, "@sequence"))
    return responses


def _batched_outputs(results: list[Any], contexts: list[SequenceContext], rows: list[int]) -> Any:
    outputs, states = _state_pair(results[0], "@sequence(batched=True)")
    if not isinstance(states, (list, tuple)) or len(states) != len(contexts):
        raise OutputMismatchError(
            f"@sequence(batched=True): the function must return one state per sequence of the batch "
            f"({len(contexts)}), got {type(states).__name__}"
            + (f" of length {len(states)}" if isinstance(states, (list, tuple)) else "")
        )
    for context, state in zip(contexts, states, strict=True):
        context.state = state
    return _split_outputs(outputs, rows)
