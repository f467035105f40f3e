"""Decorators that adapt an infer function to the shape it wants to see.

A pyserve infer function receives one ``RequestBatch`` (a list of ``Request``) and returns one output dict per
request, in order. These decorators let the function see something more convenient:

- ``@batch``: the inputs of all requests concatenated along axis 0, as keyword arguments; outputs split back;
- ``@sample``: one request's inputs as keyword arguments, called once per request;
- ``@group_by_keys`` / ``@group_by_values``: the batch split into sub-batches that ``@batch`` can concatenate;
- ``@fill_optionals``: defaults for inputs a request left out;
- ``@first_value`` / ``@pad_batch``: adjust the keyword arguments ``@batch`` passes on (place them below it).

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

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
from numpy.typing import NDArray

from pyserve.dtypes import as_bytes_array
from pyserve.errors import ConfigError, InvalidInputError, ModelExecutionError, OutputMismatchError
from pyserve.request import ModelContext, Request, RequestBatch, current_model

__all__ = [
    "ConstantPadder",
    "batch",
    "fill_optionals",
    "first_value",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
]

InferFunc = Callable[..., Any]
Inputs = Mapping[str, NDArray[Any]]


class _Call(NamedTuple):
    """One call a wrapper makes to the function it wraps."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


_Merge = Callable[[list[Any]], Any]
_Plan = Callable[[tuple[Any, ...], dict[str, Any]], tuple[list[_Call], _Merge]]

# Stands in for the next item of a stream that has already ended, when several streams advance together.
_ENDED: Any = object()


# --- one implementation, four kinds of wrapper ----------------------------------------------------------------


def _kind(fn: InferFunc) -> str:
    """'asyncgen', 'gen', 'async' or 'sync'; a callable object is judged by its ``__call__``."""
    candidates: list[object] = [fn]
    if not inspect.isroutine(fn):
        candidates.append(type(fn).__call__)
    for candidate in candidates:
        if inspect.isasyncgenfunction(candidate):
            return "asyncgen"
        if inspect.isgeneratorfunction(candidate):
            return "gen"
        if inspect.iscoroutinefunction(candidate):
            return "async"
    return "sync"


def _adapt(fn: InferFunc, plan: _Plan) -> InferFunc:
    """Wrap ``fn``: each call runs ``plan`` (which says how to call ``fn`` and how to merge what comes back).

    Decorators only write their plan; this is the one place that knows how to call and await functions and how to
    drive generators, so every decorator handles the four kinds alike.
    """
    kind = _kind(fn)
    if kind == "asyncgen":

        @functools.wraps(fn)
        async def async_generator_wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            calls, merge = plan(args, kwargs)
            streams = [fn(*call.args, **call.kwargs) for call in calls]
            try:
                while True:
                    items = [await anext(stream, _ENDED) for stream in streams]
                    if all(item is _ENDED for item in items):
                        return
                    yield merge(items)
            finally:
                # A cancelled client closes the outer stream; the inner ones must stop too.
                for stream in streams:
                    await stream.aclose()

        return async_generator_wrapper
    if kind == "gen":

        @functools.wraps(fn)
        def generator_wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
            calls, merge = plan(args, kwargs)
            streams = [fn(*call.args, **call.kwargs) for call in calls]
            try:
                while True:
                    items = [next(stream, _ENDED) for stream in streams]
                    if all(item is _ENDED for item in items):
                        return
                    yield merge(items)
            finally:
                for stream in streams:
                    stream.close()

        return generator_wrapper
    if kind == "async":

        @functools.wraps(fn)
        async def coroutine_wrapper(*args: Any, **kwargs: Any) -> Any:
            calls, merge = plan(args, kwargs)
            return merge([await fn(*call.args, **call.kwargs) for call in calls])

        return coroutine_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls, merge = plan(args, kwargs)
        return merge([fn(*call.args, **call.kwargs) for call in calls])

    return wrapper


def _only(results: list[Any]) -> Any:
    return results[0]


def _no_responses(results: list[Any]) -> list[dict[str, NDArray[Any]]]:
    return []


# --- shared helpers -------------------------------------------------------------------------------------------


def _split_args(args: tuple[Any, ...], who: str) -> tuple[tuple[Any, ...], Sequence[Inputs]]:
    """Leading positional arguments (passed through) and the request batch (the last one)."""
    if not args:
        raise TypeError(f"{who}: expected the request batch (a list of Request) as the last positional argument")
    return args[:-1], args[-1]


def _data(request: Inputs) -> Inputs:
    """The input arrays of a Request (or of a plain dict standing in for one)."""
    return request.data if isinstance(request, Request) else request


def _with_data(request: Inputs, data: dict[str, NDArray[Any]]) -> Inputs:
    """A copy of ``request`` holding ``data``; the caller's Request objects are never changed."""
    if not isinstance(request, Request):
        return data
    # The cancel flag has no public setter; the copy must still report the original request's cancellation.
    return Request(data, request.parameters, request.requested_output_names, request.id, request._cancel_flag)


def _request_rows(data: Inputs) -> int:
    """Rows of one request: the first dimension of its first input (1 for a request without inputs)."""
    for array in data.values():
        return int(array.shape[0]) if array.ndim else 1
    return 1


def _model_batches() -> bool:
    """Whether the running model has a batch dimension; assumed outside a model context (plain unit tests)."""
    try:
        return current_model().config.max_batch_size > 0
    except LookupError:
        return True


def _request_batch(items: list[Inputs]) -> RequestBatch:
    """A RequestBatch (without ``merged``) of requests, or of plain dicts standing in for them."""
    return RequestBatch(cast("list[Request]", items))


def _output_arrays(outputs: Any, who: str) -> dict[str, NDArray[Any]]:
    """A function's output dict, with array-likes turned into arrays."""
    if not isinstance(outputs, Mapping):
        raise OutputMismatchError(
            f"{who}: the function must return a dict of output arrays, got {type(outputs).__name__}"
        )
    return {name: value if isinstance(value, np.ndarray) else np.asarray(value) for name, value in outputs.items()}


def _group_indices(keys: Sequence[Hashable]) -> list[list[int]]:
    """Indices of equal keys, groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def _sub_batches(requests: Sequence[Inputs], groups: list[list[int]]) -> list[Sequence[Inputs]]:
    # A single group is the whole batch: hand it on as it is, so @batch keeps its zero-copy ``merged`` layout.
    if len(groups) == 1:
        return [requests]
    return [_request_batch([requests[index] for index in group]) for group in groups]


def _grouped_plan(
    leading: tuple[Any, ...],
    kwargs: dict[str, Any],
    batches: list[Sequence[Inputs]],
    groups: list[list[int]],
    who: str,
) -> tuple[list[_Call], _Merge]:
    """Call the function once per sub-batch and put the responses back in the original request order."""
    count = sum(len(group) for group in groups)

    def merge(results: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * count
        for group, result in zip(groups, results, strict=True):
            if result is _ENDED:
                result = [None] * len(group)
            if not isinstance(result, (list, tuple)) or len(result) != len(group):
                got = f"{len(result)} responses" if isinstance(result, (list, tuple)) else type(result).__name__
                raise OutputMismatchError(
                    f"{who}: the function must return a list with one output dict per request; "
                    f"got {got} for {len(group)} requests"
                )
            for index, response in zip(group, result, strict=True):
                responses[index] = response
        return responses

    return [_Call((*leading, sub_batch), kwargs) for sub_batch in batches], merge


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

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[_Call], _Merge]:
        leading, requests = _split_args(args, "@batch")
        if not requests:
            return [], _no_responses
        inputs, rows = _concatenate(requests)
        return [_Call(leading, {**kwargs, **inputs})], lambda results: _split_outputs(results[0], rows)

    return _adapt(fn, plan)


def _concatenate(requests: Sequence[Inputs]) -> tuple[dict[str, NDArray[Any]], list[int]]:
    """The batch's inputs as single arrays, and each request's row count."""
    datas = [_data(request) for request in requests]
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
    arrays = _output_arrays(outputs, "@batch")
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

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[_Call], _Merge]:
        leading, requests = _split_args(args, "@sample")
        return [_Call(leading, {**kwargs, **_data(request)}) for request in requests], _sample_responses

    return _adapt(fn, plan)


def _sample_responses(results: list[Any]) -> list[dict[str, NDArray[Any]] | None]:
    return [None if result is _ENDED else _output_arrays(result, "@sample") for result in results]


# --- grouping -------------------------------------------------------------------------------------------------


def group_by_keys(fn: InferFunc) -> InferFunc:
    """Call ``fn`` once per group of requests that have the same set of input names, in order of first appearance.

    ``fn`` works on requests (typically it is a ``@batch`` function) and gets each group as a ``RequestBatch``;
    the responses come back in the original request order. When every request has the same inputs the batch is
    passed on unchanged, ``merged`` layout included.
    """

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[_Call], _Merge]:
        leading, requests = _split_args(args, "@group_by_keys")
        groups = _group_indices([frozenset(_data(request)) for request in requests])
        return _grouped_plan(leading, kwargs, _sub_batches(requests, groups), groups, "@group_by_keys")

    return _adapt(fn, plan)


def group_by_values(
    *keys: str, pad_fn: Callable[[list[Inputs]], Sequence[Inputs]] | None = None
) -> Callable[[InferFunc], InferFunc]:
    """Call the function once per group of requests holding equal values in the inputs named by ``keys``.

    Works on requests, like ``@group_by_keys``, and is placed above ``@batch``. Values compare by content (bytes
    of numeric arrays, elements of BYTES arrays) and include dtype and per-row shape. When the model batches (or
    outside a model context) a request's value is the *set of its distinct rows*, so a request of two rows
    ``[[0.7], [0.7]]`` joins one of a single row ``[[0.7]]``; a request whose rows differ is never split, it simply
    groups with requests having the same mix (``@first_value(strict=True)`` below ``@batch`` rejects it). For a
    model with ``max_batch_size`` 0 the whole array is the value. A request without a key input groups with the
    others lacking it.

    ``pad_fn``, when given, receives each group as a list of requests and returns the same number of requests (or
    dicts of arrays), padded so that ``@batch`` can concatenate them, e.g. ``ConstantPadder()``: then requests
    whose only difference is the length of variable axes of their (non-key) inputs are served in one call.
    Groups are served one after another and the responses come back in the original request order.
    """
    _check_keys("@group_by_values", keys)

    def decorator(fn: InferFunc) -> InferFunc:
        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[_Call], _Merge]:
            leading, requests = _split_args(args, "@group_by_values")
            by_rows = _model_batches()
            values = [tuple(_value_key(_data(request).get(key), by_rows) for key in keys) for request in requests]
            groups = _group_indices(values)
            batches = _sub_batches(requests, groups)
            if pad_fn is not None:
                batches = [_pad_group(sub_batch, pad_fn) for sub_batch in batches]
            return _grouped_plan(leading, kwargs, batches, groups, "@group_by_values")

        return _adapt(fn, plan)

    return decorator


def _check_keys(who: str, keys: tuple[str, ...]) -> None:
    if not keys or not all(isinstance(key, str) for key in keys):
        raise ConfigError(f"{who} needs one or more input names, got {keys!r}")


def _value_key(array: NDArray[Any] | None, by_rows: bool) -> Hashable:
    """A hashable stand-in for an input's value in one request (see group_by_values)."""
    if array is None:
        return None
    if by_rows and array.ndim:
        rows = array.reshape(array.shape[0], int(np.prod(array.shape[1:])))
        return (array.dtype.str, array.shape[1:], frozenset(_content_key(row) for row in rows))
    return (array.dtype.str, array.shape, _content_key(array.reshape(-1)))


def _content_key(flat: NDArray[Any]) -> Hashable:
    # Object (BYTES) arrays hold pointers, so their bytes say nothing: compare the elements themselves.
    return tuple(flat.tolist()) if flat.dtype == object else flat.tobytes()


def _pad_group(requests: Sequence[Inputs], pad_fn: Callable[[list[Inputs]], Sequence[Inputs]]) -> Sequence[Inputs]:
    padded = list(pad_fn(list(requests)))
    if len(padded) != len(requests):
        raise ModelExecutionError(f"@group_by_values: pad_fn returned {len(padded)} items for {len(requests)} requests")
    if all(new is old for new, old in zip(padded, requests, strict=True)):
        return requests  # nothing needed padding: keep the batch and its merged layout
    return _request_batch(
        [
            _with_data(old, dict(_data(new))) if isinstance(old, Request) and not isinstance(new, Request) else new
            for new, old in zip(padded, requests, strict=True)
        ]
    )


class ConstantPadder:
    """A ``pad_fn`` for ``@group_by_values``: pads every input to the largest shape in the group.

    Given a list of requests (``Request`` or dicts of arrays), for each input name it pads the non-batch axes (all
    but axis 0) of every array up to the largest size any array of that input has on that axis, filling with
    ``pad_value`` (``b""`` for BYTES, ``""`` for unicode arrays); fixed-width ``S``/``U`` arrays are widened to the
    widest. Axis 0 (the rows) and 0-d arrays are left alone, inputs missing from a request stay missing, and
    arrays that need nothing are passed on as they are. Returns a new list of the same length; an item none of
    whose arrays changed is returned as the same object, others as copies (a ``Request`` keeps its parameters,
    requested outputs, id and cancellation). Arrays of one input with different ranks or dtypes raise
    ``ModelExecutionError``.
    """

    def __init__(self, pad_value: Any = 0) -> None:
        """Pad numeric (and bool) arrays with ``pad_value``."""
        self.pad_value = pad_value

    def __repr__(self) -> str:
        return f"ConstantPadder(pad_value={self.pad_value!r})"

    def __call__(self, items: Sequence[Inputs]) -> list[Inputs]:
        """The items, padded (see the class docstring)."""
        datas = [_data(item) for item in items]
        padded: list[dict[str, NDArray[Any]]] = [{} for _ in items]
        for name in dict.fromkeys(name for data in datas for name in data):
            present = [(index, data[name]) for index, data in enumerate(datas) if name in data]
            ranks = {array.ndim for _, array in present}
            if len(ranks) > 1:
                shapes = [array.shape for _, array in present]
                raise ModelExecutionError(f"ConstantPadder: input '{name}' has arrays of different ranks: {shapes}")
            if not ranks.pop():
                continue
            dtype = _common_dtype(name, [array.dtype for _, array in present])
            target = tuple(max(array.shape[axis] for _, array in present) for axis in range(1, present[0][1].ndim))
            fill = b"" if dtype.kind in "OS" else "" if dtype.kind == "U" else self.pad_value
            for index, array in present:
                if array.shape[1:] != target or array.dtype != dtype:
                    out = np.full((array.shape[0], *target), fill, dtype=dtype)
                    out[tuple(slice(0, size) for size in array.shape)] = array
                    padded[index][name] = out
        return [
            _with_data(item, {**data, **new}) if new else item
            for item, data, new in zip(items, datas, padded, strict=True)
        ]


def _common_dtype(name: str, dtypes: list[np.dtype[Any]]) -> np.dtype[Any]:
    first = dtypes[0]
    if all(dtype == first for dtype in dtypes):
        return first
    if all(dtype.kind == first.kind for dtype in dtypes) and first.kind in "SU":
        return max(dtypes, key=lambda dtype: dtype.itemsize)
    raise ModelExecutionError(
        f"ConstantPadder: input '{name}' has different dtypes: {sorted({str(d) for d in dtypes})}"
    )


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
    """
    _check_keys("@first_value", keys)

    def decorator(fn: InferFunc) -> InferFunc:
        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[_Call], _Merge]:
            inputs = dict(kwargs)
            for key in keys:
                value = inputs.get(key)
                if isinstance(value, np.ndarray):
                    inputs[key] = _first_row(key, value, squeeze_single_values, strict)
            return [_Call(args, inputs)], _only

        return _adapt(fn, plan)

    return decorator


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

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[_Call], _Merge]:
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
            return [_Call(args, kwargs)], _only
        padded = {name: _repeat_last_row(array, target) for name, array in arrays.items()}
        return [_Call(args, {**kwargs, **padded})], lambda results: _trim(results[0], rows, target)

    return _adapt(fn, plan)


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
    arrays = _output_arrays(outputs, "@pad_batch")
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
        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[_Call], _Merge]:
            leading, requests = _split_args(args, "@fill_optionals")
            try:
                model: ModelContext | None = current_model()
            except LookupError:
                model = None
            if model is not None and (model.name, model.version) not in checked:
                _check_defaults(values, model)
                checked.add((model.name, model.version))
            batching = model is None or model.config.max_batch_size > 0
            return [_Call((*leading, _filled(requests, values, batching)), kwargs)], _only

        return _adapt(fn, plan)

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
        data = _data(request)
        missing = [name for name in values if name not in data]
        if not missing:
            out.append(request)
            continue
        rows = _request_rows(data)
        added = {
            # A copy per request: the function may write into its inputs, and defaults are shared across calls.
            name: np.repeat(values[name][np.newaxis], rows, axis=0) if batching else values[name].copy()
            for name in missing
        }
        out.append(_with_data(request, {**data, **added}))
    if all(new is old for new, old in zip(out, requests, strict=True)):
        return requests
    filled = _request_batch(out)
    # The inputs already present are unchanged, so their contiguous layout stays valid.
    filled.merged = getattr(requests, "merged", None)
    return filled
