"""How the decorators wrap an infer function, whatever its kind, and the request helpers they share.

A decorator (``pyserve.decorators``, ``pyserve.grouping``) only writes a *plan*: given the call's arguments, which
calls to make to the function it wraps and how to merge what they return. ``adapt`` is the one place that knows
how to call and await functions and how to drive generators, so every decorator handles sync, ``async def``,
generator and async generator functions alike, and returns a wrapper of the same kind.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
from numpy.typing import NDArray

from pyserve.errors import ConfigError, OutputMismatchError
from pyserve.request import Request, RequestBatch, current_model

InferFunc = Callable[..., Any]
Inputs = Mapping[str, NDArray[Any]]


class Call(NamedTuple):
    """One call a wrapper makes to the function it wraps."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


Merge = Callable[[list[Any]], Any]
Plan = Callable[[tuple[Any, ...], dict[str, Any]], tuple[list[Call], Merge]]

# Stands in for the next item of a stream that has already ended, when several streams advance together.
ENDED: Any = object()


# --- one implementation, four kinds of wrapper ----------------------------------------------------------------


def function_kind(fn: InferFunc) -> str:
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


def adapt(fn: InferFunc, plan: Plan) -> InferFunc:
    """Wrap ``fn``: each call runs ``plan`` (which says how to call ``fn`` and how to merge what comes back).

    Decorators only write their plan; this is the one place that knows how to call and await functions and how to
    drive generators, so every decorator handles the four kinds alike.
    """
    kind = function_kind(fn)
    if kind == "asyncgen":

        @functools.wraps(fn)
        async def async_generator_wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            calls, merge = plan(args, kwargs)
            streams = [fn(*call.args, **call.kwargs) for call in calls]
            try:
                while True:
                    items = [await anext(stream, ENDED) for stream in streams]
                    if all(item is ENDED for item in items):
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
                    items = [next(stream, ENDED) for stream in streams]
                    if all(item is ENDED for item in items):
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


def only_result(results: list[Any]) -> Any:
    """The merge of a plan that makes one call: its result as it is."""
    return results[0]


def no_responses(results: list[Any]) -> list[dict[str, NDArray[Any]]]:
    """The merge of a plan for an empty request batch: no responses."""
    return []


# --- shared helpers -------------------------------------------------------------------------------------------


def split_args(args: tuple[Any, ...], who: str) -> tuple[tuple[Any, ...], Sequence[Inputs]]:
    """Leading positional arguments (passed through) and the request batch (the last one)."""
    if not args:
        raise TypeError(f"{who}: expected the request batch (a list of Request) as the last positional argument")
    return args[:-1], args[-1]


def inputs_of(request: Inputs) -> Inputs:
    """The input arrays of a Request (or of a plain dict standing in for one)."""
    return request.data if isinstance(request, Request) else request


def with_inputs(request: Inputs, data: dict[str, NDArray[Any]]) -> Inputs:
    """A copy of ``request`` holding ``data``; the caller's Request objects are never changed."""
    if not isinstance(request, Request):
        return data
    # The cancel flag has no public setter; the copy must still report the original request's cancellation.
    return Request(
        data, request.parameters, request.requested_output_names, request.id, request._cancel_flag, request.sequence
    )


def request_rows(data: Inputs) -> int:
    """Rows of one request: the first dimension of its first input (1 for a request without inputs)."""
    for array in data.values():
        return int(array.shape[0]) if array.ndim else 1
    return 1


def model_batches() -> bool:
    """Whether the running model has a batch dimension; assumed outside a model context (plain unit tests)."""
    try:
        return current_model().config.max_batch_size > 0
    except LookupError:
        return True


def request_batch(items: list[Inputs]) -> RequestBatch:
    """A RequestBatch (without ``merged``) of requests, or of plain dicts standing in for them."""
    return RequestBatch(cast("list[Request]", items))


def output_arrays(outputs: Any, who: str) -> dict[str, NDArray[Any]]:
    """A function's outputs as a dict of arrays (array-likes turned into arrays); outputs returned as a list or
    tuple are named by the running model's declared outputs, in order (see ``named_outputs``)."""
    if not isinstance(outputs, Mapping):
        try:
            declared: tuple[str, ...] | None = tuple(tensor.name for tensor in current_model().outputs)
        except LookupError:
            declared = None
        outputs = named_outputs(outputs, declared, who)
    return {name: value if isinstance(value, np.ndarray) else np.asarray(value) for name, value in outputs.items()}


def named_outputs(outputs: Any, declared: Sequence[str] | None, who: str) -> Mapping[str, Any]:
    """One response's outputs by name: a dict as it is, a list or tuple of arrays named by ``declared`` (the model's
    output names, in declared order; None outside a model). Anything else, or a list of another length, raises
    ``OutputMismatchError``."""
    if isinstance(outputs, Mapping):
        return outputs
    kind = type(outputs).__name__
    if not isinstance(outputs, (list, tuple)):
        raise OutputMismatchError(
            f"{who}: the function must return a dict of output arrays (or a list or tuple of them in declared "
            f"order), got {kind}"
        )
    if declared is None:
        raise OutputMismatchError(
            f"{who}: outputs returned as a {kind} are named by the model's declared outputs, which are only known "
            "inside a model (in tests, set one with set_current_model(ModelContext(...))); return a dict instead"
        )
    if len(outputs) != len(declared):
        names = ", ".join(f"'{name}'" for name in declared)
        raise OutputMismatchError(
            f"{who}: the function returned a {kind} of {len(outputs)} outputs, but the model declares "
            f"{len(declared)} ({names}); a {kind} must hold every declared output, in order"
        )
    return dict(zip(declared, outputs, strict=True))


def check_keys(who: str, keys: tuple[str, ...]) -> None:
    """Raise ConfigError unless ``keys`` (a decorator's input names) is one or more strings."""
    if not keys or not all(isinstance(key, str) for key in keys):
        raise ConfigError(f"{who} needs one or more input names, got {keys!r}")
