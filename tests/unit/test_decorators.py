"""Tests of pyserve.decorators: each decorator on sync, async and generator functions, and stacked."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from pyserve import decorators
from pyserve.config import DynamicBatcher, ModelConfig, Tensor
from pyserve.decorators import (
    ConstantPadder,
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
)
from pyserve.errors import ConfigError, InvalidInputError, ModelExecutionError, OutputMismatchError
from pyserve.request import ModelContext, Request, RequestBatch, reset_current_model, set_current_model


def req(**inputs: Any) -> Request:
    """A request whose inputs are the given array-likes."""
    return Request({name: np.asarray(value) for name, value in inputs.items()}, id=str(len(inputs)))


def requests(*items: Request, merged: dict[str, np.ndarray] | None = None) -> RequestBatch:
    """A RequestBatch, optionally with the core's contiguous layout."""
    out = RequestBatch(items)
    out.merged = merged
    return out


@contextlib.contextmanager
def running_model(
    max_batch_size: int = 8,
    preferred: tuple[int, ...] = (),
    inputs: tuple[Tensor, ...] = (),
    outputs: tuple[Tensor, ...] = (),
) -> Iterator[ModelContext]:
    """Run the block as if inside the infer function of a model with this config."""
    context = ModelContext(
        name="m",
        version=1,
        inputs=inputs or (Tensor("x", np.float32, (-1,)),),
        outputs=outputs or (Tensor("y", np.float32, (-1,)),),
        config=ModelConfig(max_batch_size=max_batch_size, batcher=DynamicBatcher(preferred_batch_size=preferred)),
    )
    token = set_current_model(context)
    try:
        yield context
    finally:
        reset_current_model(token)


def test_exports() -> None:
    assert sorted(decorators.__all__) == sorted(
        [
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
    )


# --- @batch ---------------------------------------------------------------------------------------------------


def test_batch_concatenates_requests_and_splits_outputs_as_views() -> None:
    seen: dict[str, np.ndarray] = {}
    full: dict[str, np.ndarray] = {}

    @batch
    def infer(x: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
        seen.update(x=x, w=w)
        full["y"] = x * w
        return {"y": full["y"]}

    batch_ = requests(req(x=[[1.0], [2.0]], w=[[10.0], [10.0]]), req(x=[[3.0]], w=[[100.0]]))
    out = infer(batch_)

    np.testing.assert_array_equal(seen["x"], [[1.0], [2.0], [3.0]])
    assert [list(o) for o in out] == [["y"], ["y"]]
    np.testing.assert_array_equal(out[0]["y"], [[10.0], [20.0]])
    np.testing.assert_array_equal(out[1]["y"], [[300.0]])
    assert all(o["y"].base is full["y"] for o in out)


def test_batch_passes_a_single_request_through_without_copying() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    seen = {}

    @batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        seen["x"] = x
        return {"y": x}

    (response,) = infer(requests(Request({"x": x})))
    assert seen["x"] is x
    assert np.shares_memory(response["y"], x)


def test_batch_uses_the_merged_layout_for_multi_row_requests() -> None:
    merged = {"x": np.arange(6, dtype=np.int64).reshape(6, 1)}
    batch_ = requests(
        Request({"x": merged["x"][0:2]}),
        Request({"x": merged["x"][2:3]}),
        Request({"x": merged["x"][3:6]}),
        merged=merged,
    )
    seen = {}

    @batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        seen["x"] = x
        return {"y": x + 1}

    out = infer(batch_)
    assert seen["x"] is merged["x"]
    assert [o["y"].ravel().tolist() for o in out] == [[1, 2], [3], [4, 5, 6]]


def test_batch_concatenates_inputs_missing_from_merged_or_stale() -> None:
    merged = {"x": np.zeros((9, 1))}  # rows do not add up to this batch: must be ignored
    batch_ = requests(req(x=[[1.0]], w=[[2.0]]), req(x=[[3.0]], w=[[4.0]]), merged=merged)

    @batch
    def infer(x: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
        assert not np.shares_memory(x, merged["x"])
        return {"y": x + w}

    assert [o["y"].item() for o in infer(batch_)] == [3.0, 7.0]


def test_batch_rejects_outputs_with_wrong_rows() -> None:
    @batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": x[:1]}

    with pytest.raises(OutputMismatchError, match=r"output 'y' has shape \(1, 1\), expected 3 rows"):
        infer(requests(req(x=[[1], [2]]), req(x=[[3]])))


@pytest.mark.parametrize("returned", [None, np.zeros(1), "y"])
def test_batch_rejects_a_return_value_that_is_not_a_dict_or_list(returned: Any) -> None:
    @batch
    def infer(x: np.ndarray) -> Any:
        return returned

    with pytest.raises(OutputMismatchError, match=f"got {type(returned).__name__}"):
        infer(requests(req(x=[1])))


# --- outputs as a list or tuple, in declared order -------------------------------------------------------------

TWO_OUTPUTS = (Tensor("sum", np.float32), Tensor("diff", np.float32))


def test_batch_names_a_returned_tuple_by_the_declared_outputs() -> None:
    @batch
    def add_sub(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x + 1, x - 1

    with running_model(outputs=TWO_OUTPUTS):
        out = add_sub(requests(req(x=[[1.0], [2.0]]), req(x=[[3.0]])))
    assert [{name: a.ravel().tolist() for name, a in o.items()} for o in out] == [
        {"sum": [2.0, 3.0], "diff": [0.0, 1.0]},
        {"sum": [4.0], "diff": [2.0]},
    ]


@pytest.mark.parametrize("returned", [[np.zeros(1)], (np.zeros(1), np.zeros(1), np.zeros(1))])
def test_a_returned_list_of_the_wrong_length_names_both_counts(returned: Any) -> None:
    infer = batch(lambda x: returned)
    count = len(returned)
    with (
        running_model(outputs=TWO_OUTPUTS),
        pytest.raises(OutputMismatchError, match=rf"returned a \w+ of {count} outputs, but the model declares 2 "),
    ):
        infer(requests(req(x=[1])))


def test_a_returned_list_needs_the_model_to_name_it() -> None:
    infer = batch(lambda x: [x])
    with pytest.raises(OutputMismatchError, match=r"named by the model's declared outputs.*set_current_model"):
        infer(requests(req(x=[1])))


def test_sample_pad_batch_and_generators_take_lists_too() -> None:
    with running_model(max_batch_size=4, outputs=TWO_OUTPUTS):
        (sampled,) = sample(lambda x: [x, -x])(requests(req(x=[1.0])))
        assert sampled["diff"].tolist() == [-1.0]
        padded = pad_batch(lambda x: (x, x * 2))(x=np.ones(3, np.float32))
        assert {name: len(a) for name, a in padded.items()} == {"sum": 3, "diff": 3}

        @batch
        def stream(x: np.ndarray) -> Iterator[list[np.ndarray]]:
            yield [x, x]
            yield [x + 1, x - 1]

        rounds = list(stream(requests(req(x=[5.0]))))
    assert [r[0]["diff"].tolist() for r in rounds] == [[5.0], [4.0]]


def test_batch_names_the_fix_for_requests_with_different_inputs() -> None:
    infer = batch(lambda **inputs: inputs)
    with pytest.raises(ModelExecutionError, match=r"request 1 has inputs.*@group_by_keys or @fill_optionals"):
        infer(requests(req(x=[1], w=[1]), req(x=[2])))


def test_batch_names_the_fix_for_different_per_row_shapes() -> None:
    infer = batch(lambda x: {"y": x})
    with pytest.raises(ModelExecutionError, match=r"input 'x'.*\[\(2,\), \(3,\)\].*ConstantPadder"):
        infer(requests(req(x=[[1, 2]]), req(x=[[1, 2, 3]])))


def test_batch_rejects_a_request_whose_inputs_disagree_on_rows() -> None:
    infer = batch(lambda x, w: {"y": x})
    with pytest.raises(InvalidInputError, match="request 0: inputs disagree on the batch size"):
        infer(requests(req(x=[1, 2], w=[1])))


def test_batch_of_no_requests_does_not_call_the_function() -> None:
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        raise AssertionError("called")

    assert batch(infer)(requests()) == []


def test_batch_passes_leading_arguments_through_for_methods() -> None:
    class Model:
        scale = 3

        @batch
        def infer(self, x: np.ndarray) -> dict[str, np.ndarray]:
            return {"y": x * self.scale}

    out = Model().infer(requests(req(x=[1]), req(x=[2])))
    assert [o["y"].tolist() for o in out] == [[3], [6]]


def test_batch_of_an_async_function_is_a_coroutine_function() -> None:
    @batch
    async def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        await asyncio.sleep(0)
        return {"y": -x}

    assert inspect.iscoroutinefunction(infer)
    assert infer.__name__ == "infer"
    out = asyncio.run(infer(requests(req(x=[1, 2]), req(x=[3]))))
    assert [o["y"].tolist() for o in out] == [[-1, -2], [-3]]


def test_batch_of_a_callable_object_with_async_call_is_a_coroutine_function() -> None:
    class Model:
        async def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
            return {"y": x + 1}

    infer = batch(Model())
    assert inspect.iscoroutinefunction(infer)
    assert [o["y"].tolist() for o in asyncio.run(infer(requests(req(x=[1]), req(x=[2]))))] == [[2], [3]]


def test_batch_of_a_generator_yields_split_response_lists() -> None:
    @batch
    def infer(x: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
        for step in range(3):
            yield {"y": x + step}

    assert inspect.isgeneratorfunction(infer)
    out = [[o["y"].tolist() for o in item] for item in infer(requests(req(x=[1, 2]), req(x=[10])))]
    assert out == [[[1, 2], [10]], [[2, 3], [11]], [[3, 4], [12]]]


def test_batch_of_an_async_generator_yields_split_response_lists() -> None:
    @batch
    async def infer(x: np.ndarray) -> AsyncIterator[dict[str, np.ndarray]]:
        yield {"y": x}
        yield {"y": x * 2}

    assert inspect.isasyncgenfunction(infer)

    async def collect() -> list[list[list[int]]]:
        return [[o["y"].tolist() for o in item] async for item in infer(requests(req(x=[1]), req(x=[2])))]

    assert asyncio.run(collect()) == [[[1], [2]], [[2], [4]]]


def test_closing_a_wrapped_async_generator_closes_the_inner_one_at_once() -> None:
    closed = []

    @batch
    async def infer(x: np.ndarray) -> AsyncIterator[dict[str, np.ndarray]]:
        try:
            while True:
                yield {"y": x}
        finally:
            closed.append(True)

    async def cancel_after_one() -> list[bool]:
        stream = infer(requests(req(x=[1])))
        await anext(stream)
        await stream.aclose()
        return list(closed)  # before the event loop gets to finalize anything

    assert asyncio.run(cancel_after_one()) == [True]


# --- @sample --------------------------------------------------------------------------------------------------


def test_sample_calls_once_per_request_with_its_inputs() -> None:
    calls = []

    @sample
    def infer(x: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
        calls.append((x.tolist(), w.tolist()))
        return {"y": x + w}

    out = infer(requests(req(x=[1], w=[2]), req(x=[3, 4], w=[5, 6])))
    assert calls == [([1], [2]), ([3, 4], [5, 6])]
    assert [o["y"].tolist() for o in out] == [[3], [8, 10]]


def test_sample_rejects_a_return_value_that_is_not_a_dict() -> None:
    infer = sample(lambda x: x)
    with pytest.raises(OutputMismatchError, match=r"@sample.*got ndarray"):
        infer(requests(req(x=[1])))


def test_sample_of_an_async_function() -> None:
    @sample
    async def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": x * 2}

    assert inspect.iscoroutinefunction(infer)
    out = asyncio.run(infer(requests(req(x=[1]), req(x=[2]))))
    assert [o["y"].tolist() for o in out] == [[2], [4]]


def test_sample_of_generators_of_different_lengths_answers_none_for_ended_streams() -> None:
    @sample
    def infer(n: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
        for step in range(int(n[0])):
            yield {"y": np.array([step])}

    assert inspect.isgeneratorfunction(infer)
    out = [[None if o is None else o["y"].tolist() for o in item] for item in infer(requests(req(n=[1]), req(n=[3])))]
    assert out == [[[0], [0]], [None, [1]], [None, [2]]]


# --- @group_by_keys -------------------------------------------------------------------------------------------


def test_group_by_keys_calls_once_per_key_set_and_keeps_request_order() -> None:
    groups = []

    @group_by_keys
    @batch
    def infer(x: np.ndarray, w: np.ndarray | None = None) -> dict[str, np.ndarray]:
        groups.append((x.ravel().tolist(), None if w is None else w.ravel().tolist()))
        return {"y": x if w is None else x * w}

    batch_ = requests(req(x=[1]), req(x=[2], w=[10]), req(x=[3]), req(w=[100], x=[4]))
    out = infer(batch_)
    assert groups == [([1, 3], None), ([2, 4], [10, 100])]
    assert [o["y"].tolist() for o in out] == [[1], [20], [3], [400]]


def test_group_by_keys_hands_on_a_uniform_batch_unchanged() -> None:
    seen = []

    @group_by_keys
    def infer(batch_: RequestBatch) -> list[dict[str, np.ndarray]]:
        seen.append(batch_)
        return [{"y": r["x"]} for r in batch_]

    batch_ = requests(req(x=[1]), req(x=[2]), merged={"x": np.array([1, 2])})
    infer(batch_)
    assert seen == [batch_] and seen[0] is batch_


def test_group_by_keys_rejects_a_wrong_number_of_responses() -> None:
    infer = group_by_keys(lambda batch_: [{}])
    with pytest.raises(OutputMismatchError, match="got 1 responses for 2 requests"):
        infer(requests(req(x=[1]), req(x=[2])))


def test_group_by_keys_of_an_async_function() -> None:
    @group_by_keys
    async def infer(batch_: RequestBatch) -> list[dict[str, Any]]:
        return [{"n": len(batch_)} for _ in batch_]

    out = asyncio.run(infer(requests(req(x=[1]), req(w=[1]), req(x=[2]))))
    assert out == [{"n": 2}, {"n": 1}, {"n": 2}]


def test_group_by_keys_of_generators_answers_none_for_ended_groups() -> None:
    @group_by_keys
    def infer(batch_: RequestBatch) -> Iterator[list[dict[str, Any]]]:
        for step in range(len(batch_)):
            yield [{"step": step} for _ in batch_]

    assert inspect.isgeneratorfunction(infer)
    out = list(infer(requests(req(x=[1]), req(w=[1]), req(x=[2]))))
    assert out == [[{"step": 0}] * 3, [{"step": 1}, None, {"step": 1}]]


# --- @group_by_values and ConstantPadder ----------------------------------------------------------------------


def test_group_by_values_groups_equal_values_and_keeps_request_order() -> None:
    groups = []

    @group_by_values("t")
    @batch
    def infer(x: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
        groups.append((x.ravel().tolist(), t.ravel().tolist()))
        return {"y": x * t}

    out = infer(requests(req(x=[[1]], t=[[2.0]]), req(x=[[2]], t=[[3.0]]), req(x=[[3]], t=[[2.0]])))
    assert groups == [([1, 3], [2.0, 2.0]), ([2], [3.0])]
    assert [o["y"].item() for o in out] == [2.0, 6.0, 6.0]


def test_group_by_values_compares_bytes_contents() -> None:
    seen = []

    @group_by_values("mode")
    def infer(batch_: RequestBatch) -> list[dict[str, Any]]:
        seen.append([r.id for r in batch_])
        return [{} for _ in batch_]

    # Equal contents in distinct objects: object arrays must be compared by element, not by pointer.
    modes = [b"greedy", b"beam", bytes(bytearray(b"greedy")), bytes(bytearray(b"beam"))]
    batch_ = requests(
        *(Request({"mode": np.array([mode], dtype=object)}, id=str(index)) for index, mode in enumerate(modes))
    )
    infer(batch_)
    assert seen == [["0", "2"], ["1", "3"]]


def test_group_by_values_treats_a_request_by_its_distinct_rows_when_the_model_batches() -> None:
    sizes = []

    @group_by_values("t")
    def infer(batch_: RequestBatch) -> list[dict[str, Any]]:
        sizes.append(len(batch_))
        return [{} for _ in batch_]

    batch_ = requests(req(t=[[0.5], [0.5]]), req(t=[[0.5]]), req(t=[[0.7]]), req(x=[1]))
    infer(batch_)
    assert sizes == [2, 1, 1]  # missing 't' is its own group
    sizes.clear()
    with running_model(max_batch_size=0):  # no batch dimension: the whole array is the value
        infer(batch_)
    assert sizes == [1, 1, 1, 1]


def test_group_by_values_with_a_constant_padder_lets_batch_concatenate() -> None:
    seen = []

    @group_by_values("t", pad_fn=ConstantPadder(-1))
    @batch
    def infer(tokens: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(tokens.tolist())
        return {"y": tokens.sum(axis=1, keepdims=True)}

    out = infer(
        requests(
            req(tokens=[[1, 2, 3]], t=[[1]]),
            req(tokens=[[4]], t=[[2]]),
            req(tokens=[[5, 6]], t=[[1]]),
        )
    )
    assert seen == [[[1, 2, 3], [5, 6, -1]], [[4]]]
    assert [o["y"].item() for o in out] == [6, 4, 10]


def test_group_by_values_keeps_the_merged_layout_when_nothing_needs_padding() -> None:
    seen = []

    @group_by_values("t", pad_fn=ConstantPadder())
    def infer(batch_: RequestBatch) -> list[dict[str, Any]]:
        seen.append(batch_)
        return [{} for _ in batch_]

    batch_ = requests(req(x=[[1, 2]], t=[1]), req(x=[[3, 4]], t=[1]), merged={"x": np.array([[1, 2], [3, 4]])})
    infer(batch_)
    assert seen[0] is batch_


def test_group_by_values_needs_input_names() -> None:
    with pytest.raises(ConfigError, match="one or more input names"):
        group_by_values()


def test_constant_padder_pads_non_batch_axes_of_requests() -> None:
    unchanged = Request({"a": np.ones((1, 2, 2), dtype=np.float32)}, parameters={"p": 1}, id="keep")
    short = Request({"a": np.ones((2, 1, 2), dtype=np.float32)}, parameters={"p": 2}, id="pad")

    padded = ConstantPadder(pad_value=7)([unchanged, short])

    assert padded[0] is unchanged
    assert isinstance(padded[1], Request) and padded[1].id == "pad" and padded[1].parameters == {"p": 2}
    np.testing.assert_array_equal(padded[1]["a"], [[[1, 1], [7, 7]], [[1, 1], [7, 7]]])
    assert padded[1]["a"].dtype == np.float32
    assert short["a"].shape == (2, 1, 2)  # the original request is left alone


def test_constant_padder_pads_bytes_with_empty_bytes_and_keeps_dicts() -> None:
    words = [{"w": np.array([[b"a", b"b"]], dtype=object)}, {"w": np.array([[b"c"]], dtype=object), "n": np.ones(1)}]
    padded = ConstantPadder()(words)
    assert padded[1]["w"].tolist() == [[b"c", b""]]
    assert set(padded[1]) == {"w", "n"}
    assert padded[0] is words[0]


def test_constant_padder_widens_fixed_width_strings() -> None:
    padded = ConstantPadder()([{"s": np.array([[b"ab"]])}, {"s": np.array([[b"abcd", b"x"]])}])
    assert padded[0]["s"].dtype == np.dtype("S4")
    assert padded[0]["s"].tolist() == [[b"ab", b""]]


def test_constant_padder_widens_strings_of_equal_shape() -> None:
    padded = ConstantPadder()([{"s": np.array([b"ab"])}, {"s": np.array([b"abcd"])}])
    assert [item["s"].dtype for item in padded] == [np.dtype("S4")] * 2
    assert padded[0]["s"].tolist() == [b"ab"]


def test_constant_padder_rejects_different_ranks() -> None:
    with pytest.raises(ModelExecutionError, match="input 'a' has arrays of different ranks"):
        ConstantPadder()([{"a": np.ones((1, 2))}, {"a": np.ones((1, 2, 3))}])


# --- @first_value ---------------------------------------------------------------------------------------------


def test_first_value_squeezes_a_single_value_to_a_numpy_scalar() -> None:
    seen = {}

    @batch
    @first_value("t", "missing")
    def infer(x: np.ndarray, t: Any) -> dict[str, np.ndarray]:
        seen["t"] = t
        return {"y": x * t}

    t = np.array([[0.5], [0.5], [0.5]], dtype=np.float32)
    out = infer(requests(Request({"x": np.ones((2, 1)), "t": t[:2]}), Request({"x": np.ones((1, 1)), "t": t[2:]})))
    assert type(seen["t"]) is np.float32 and seen["t"] == 0.5
    assert [o["y"].ravel().tolist() for o in out] == [[0.5, 0.5], [0.5]]


def test_first_value_without_squeezing_gives_the_first_row() -> None:
    infer = first_value("t", squeeze_single_values=False)(lambda t: t)
    result = infer(t=np.array([[1, 2], [1, 2]]))
    assert isinstance(result, np.ndarray) and result.tolist() == [1, 2]
    assert first_value("mode")(lambda mode: mode)(mode=np.array([[b"x"], [b"x"]], dtype=object)) == b"x"


def test_first_value_strict_rejects_rows_that_differ() -> None:
    infer = first_value("t")(lambda t: t)
    with pytest.raises(InvalidInputError, match=r"input 't'.*row 2 \(\[0\.7\]\) differs from row 0 \(\[0\.5\]\)"):
        infer(t=np.array([[0.5], [0.5], [0.7]]))
    assert first_value("t", strict=False)(lambda t: t)(t=np.array([[0.5], [0.7]])) == 0.5
    assert np.isnan(infer(t=np.array([np.nan, np.nan])))  # NaN rows count as equal
    assert infer(t=np.zeros((0, 1))).shape == (0, 1)  # an empty batch has no first value to take


# --- @fill_optionals ------------------------------------------------------------------------------------------


def test_first_value_on_a_function_taking_requests_replaces_each_requests_input() -> None:
    seen = []

    @first_value("t")
    def infer(batch_: list[Request]) -> list[dict[str, Any]]:
        seen.extend((r["t"], r.parameters) for r in batch_)
        return [{"y": r["x"]} for r in batch_]

    first = Request({"x": np.ones(2), "t": np.array([[0.5], [0.5]], np.float32)}, {"p": 1})
    infer(requests(first, req(x=[1.0], t=[[2.0]])))
    assert seen == [(np.float32(0.5), {"p": 1}), (2.0, {})]
    assert isinstance(first["t"], np.ndarray)  # the caller's request is left as it was


def test_fill_optionals_repeats_the_default_per_row_outside_a_model_context() -> None:
    seen = []

    @fill_optionals(t=np.array([0.5], dtype=np.float32), mode=b"greedy")
    @batch
    def infer(x: np.ndarray, t: np.ndarray, mode: np.ndarray) -> dict[str, np.ndarray]:
        seen.append((t.tolist(), mode.tolist()))
        return {"y": x * t}

    given = req(x=[[1.0]], t=np.array([[2.0]], dtype=np.float32), mode=np.array([b"beam"], dtype=object))
    out = infer(requests(req(x=[[1.0], [1.0]]), given))
    assert seen == [([[0.5], [0.5], [2.0]], [b"greedy", b"greedy", b"beam"])]
    assert [o["y"].ravel().tolist() for o in out] == [[0.5, 0.5], [2.0]]


def test_fill_optionals_copies_filled_requests_and_keeps_the_merged_layout() -> None:
    seen = []

    @fill_optionals(t=np.float32(1.0))
    def infer(batch_: RequestBatch) -> list[dict[str, Any]]:
        seen.append(batch_)
        return [{} for _ in batch_]

    complete = req(x=[1], t=np.array([2.0], dtype=np.float32))
    partial = Request({"x": np.array([3])}, parameters={"k": "v"}, id="p")
    merged = {"x": np.array([1, 3])}
    infer(requests(complete, partial, merged=merged))
    (filled,) = seen
    assert filled[0] is complete and filled.merged is merged
    assert filled[1].id == "p" and filled[1].parameters == {"k": "v"} and "t" not in partial
    assert filled[1]["t"].tolist() == [1.0] and filled[1]["t"].dtype == np.float32


def test_fill_optionals_uses_the_default_as_is_for_a_model_without_batching() -> None:
    default = np.array([1, 2], dtype=np.int32)
    infer = fill_optionals(k=default)(lambda batch_: [{"k": r["k"]} for r in batch_])
    with running_model(max_batch_size=0, inputs=(Tensor("x", np.int32, (-1,)), Tensor("k", np.int32, (2,)))):
        (out,) = infer(requests(req(x=[1, 2, 3])))
    assert out["k"].tolist() == [1, 2] and not np.shares_memory(out["k"], default)


def test_fill_optionals_checks_defaults_against_the_model() -> None:
    infer = fill_optionals(t=np.array([1.0]))(lambda batch_: [{} for _ in batch_])
    mismatches = [
        (Tensor("t", np.float32, (1,)), r"input 't' has dtype float64, but model 'm' declares FP32"),
        (Tensor("x", np.float32), r"model 'm' has no input 't'"),
        (Tensor("t", np.float64, (2,)), r"shape \(1,\), but model 'm' declares \(2,\)"),
    ]
    for declared, message in mismatches:
        with running_model(inputs=(declared,)), pytest.raises(ConfigError, match=message):
            infer(requests(req(x=[1])))
    with running_model(inputs=(Tensor("t", np.float64, (1,)),)):
        assert infer(requests(req(x=[1]))) == [{}]


@pytest.mark.parametrize("bad", [None, {"a": 1}, [[1, 2], [3]]])
def test_fill_optionals_rejects_defaults_that_are_not_array_like(bad: Any) -> None:
    with pytest.raises(ConfigError, match="default for 't'"):
        fill_optionals(t=bad)


# --- @pad_batch -----------------------------------------------------------------------------------------------


def padded_model() -> Any:
    seen = []

    @batch
    @pad_batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(x.ravel().tolist())
        return {"y": x * 10}

    return infer, seen


def test_pad_batch_pads_to_the_next_preferred_size_and_trims_outputs() -> None:
    infer, seen = padded_model()
    with running_model(max_batch_size=16, preferred=(8, 4)):
        out = infer(requests(req(x=[[1], [2]]), req(x=[[3]])))
    assert seen == [[1, 2, 3, 3]]
    assert [o["y"].ravel().tolist() for o in out] == [[10, 20], [30]]


def test_pad_batch_pads_to_max_batch_size_past_the_preferred_sizes() -> None:
    infer, seen = padded_model()
    with running_model(max_batch_size=6, preferred=(2,)):
        (out,) = infer(requests(req(x=[[1], [2], [3]])))
    assert seen == [[1, 2, 3, 3, 3, 3]]
    assert out["y"].ravel().tolist() == [10, 20, 30]


def test_pad_batch_leaves_a_full_batch_alone() -> None:
    infer, seen = padded_model()
    with running_model(max_batch_size=2):
        infer(requests(req(x=[[1], [2]])))
    assert seen == [[1, 2]]


def test_pad_batch_needs_a_model_context() -> None:
    infer, _ = padded_model()
    with pytest.raises(LookupError, match=r"@pad_batch.*set_current_model"):
        infer(requests(req(x=[[1]])))


def test_pad_batch_rejects_outputs_that_lost_the_padding() -> None:
    infer = pad_batch(lambda x: {"y": x[:1]})
    with running_model(max_batch_size=4), pytest.raises(OutputMismatchError, match="expected 4 rows"):
        infer(x=np.ones((3, 1)))


def test_pad_batch_trims_each_item_of_a_generator() -> None:
    @pad_batch
    def infer(x: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
        yield {"y": x}
        yield {"y": x + 1}

    with running_model(max_batch_size=4):
        out = [item["y"].tolist() for item in infer(x=np.array([5, 6]))]
    assert out == [[5, 6], [6, 7]]


# --- stacks ---------------------------------------------------------------------------------------------------


def test_full_stack_on_an_async_generator() -> None:
    @fill_optionals(t=np.array([1.0], dtype=np.float32))
    @group_by_values("t")
    @batch
    @first_value("t")
    async def infer(x: np.ndarray, t: np.float32) -> AsyncIterator[dict[str, np.ndarray]]:
        yield {"y": x * t}

    assert inspect.isasyncgenfunction(infer)
    half = np.array([[0.5]], dtype=np.float32)

    async def collect() -> list[list[float]]:
        batch_ = requests(req(x=[[2.0]]), req(x=[[4.0]], t=half), req(x=[[6.0]]))
        return [[o["y"].item() for o in item] async for item in infer(batch_)]

    assert asyncio.run(collect()) == [[2.0, 2.0, 6.0]]
