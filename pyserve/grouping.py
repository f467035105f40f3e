"""``@group_by_keys``, ``@group_by_values`` and ``ConstantPadder``: a request batch split into sub-batches that
``@batch`` can concatenate, served one after another, the responses put back in request order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pyserve.errors import ModelExecutionError, OutputMismatchError
from pyserve.request import Request
from pyserve.wrapping import (
    ENDED,
    Call,
    InferFunc,
    Inputs,
    Merge,
    adapt,
    check_keys,
    inputs_of,
    model_batches,
    request_batch,
    split_args,
    with_inputs,
)

# --- sub-batches ----------------------------------------------------------------------------------------------


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
    return [request_batch([requests[index] for index in group]) for group in groups]


def _grouped_plan(
    leading: tuple[Any, ...],
    kwargs: dict[str, Any],
    batches: list[Sequence[Inputs]],
    groups: list[list[int]],
    who: str,
) -> tuple[list[Call], Merge]:
    """Call the function once per sub-batch and put the responses back in the original request order."""
    count = sum(len(group) for group in groups)

    def merge(results: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * count
        for group, result in zip(groups, results, strict=True):
            if result is ENDED:
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

    return [Call((*leading, sub_batch), kwargs) for sub_batch in batches], merge


# --- the decorators -------------------------------------------------------------------------------------------


def group_by_keys(fn: InferFunc) -> InferFunc:
    """Call ``fn`` once per group of requests that have the same set of input names, in order of first appearance.

    ``fn`` works on requests (typically it is a ``@batch`` function) and gets each group as a ``RequestBatch``;
    the responses come back in the original request order. When every request has the same inputs the batch is
    passed on unchanged, ``merged`` layout included.
    """

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
        leading, requests = split_args(args, "@group_by_keys")
        groups = _group_indices([frozenset(inputs_of(request)) for request in requests])
        return _grouped_plan(leading, kwargs, _sub_batches(requests, groups), groups, "@group_by_keys")

    return adapt(fn, plan)


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
    check_keys("@group_by_values", keys)

    def decorator(fn: InferFunc) -> InferFunc:
        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Call], Merge]:
            leading, requests = split_args(args, "@group_by_values")
            by_rows = model_batches()
            values = [tuple(_value_key(inputs_of(request).get(key), by_rows) for key in keys) for request in requests]
            groups = _group_indices(values)
            batches = _sub_batches(requests, groups)
            if pad_fn is not None:
                batches = [_pad_group(sub_batch, pad_fn) for sub_batch in batches]
            return _grouped_plan(leading, kwargs, batches, groups, "@group_by_values")

        return adapt(fn, plan)

    return decorator


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
    return request_batch(
        [
            with_inputs(old, dict(inputs_of(new))) if isinstance(old, Request) and not isinstance(new, Request) else new
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
        datas = [inputs_of(item) for item in items]
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
            with_inputs(item, {**data, **new}) if new else item
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
