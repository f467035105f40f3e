"""Tests of pyserve.core.cache: request keys, LRU eviction by bytes, and answering from the cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, Tensor
from pyserve.config import ModelSpec
from pyserve.core.cache import ResponseCache, request_key
from pyserve.core.inference import InferenceRequest, InferenceResponse, InputTensor, ModelEntry, OutputTensor
from pyserve.errors import ConfigError, ModelExecutionError


def entry(name: str = "m", version: int = 1) -> ModelEntry:
    spec = ModelSpec(
        name,
        version,
        inputs=(Tensor("a", np.float32, (-1,)), Tensor("b", np.int32, (-1,))),
        outputs=(Tensor("y", np.float32, (-1,)),),
        config=ModelConfig(max_batch_size=8, response_cache=True),
    )
    return ModelEntry(spec)


def make_request(
    model: ModelEntry | None = None,
    a: Any = (1.0, 2.0),
    b: Any = (3, 4),
    parameters: dict[str, Any] | None = None,
    outputs: list[str] | None = None,
    sent: list[InferenceResponse] | None = None,
) -> InferenceRequest:
    arrays = {"a": np.array([a], np.float32), "b": np.array([b], np.int32)}
    inputs = {name: InputTensor("FP32" if name == "a" else "INT32", list(x.shape), x) for name, x in arrays.items()}

    def on_response(request: InferenceRequest, response: InferenceResponse) -> None:
        if sent is not None:
            sent.append(response)

    return InferenceRequest(model or entry(), "id", inputs, parameters or {}, outputs or [], 1, on_response)


def response(values: Any = (5.0, 6.0), final: bool = True) -> InferenceResponse:
    data = np.array([values], np.float32)
    return InferenceResponse([OutputTensor("y", "FP32", list(data.shape), memoryview(data.tobytes()))], final=final)


# keys ------------------------------------------------------------------------------------------------------------


def test_identical_requests_have_the_same_key() -> None:
    assert request_key(make_request()) == request_key(make_request())


@pytest.mark.parametrize(
    "changed",
    [
        {"a": (1.0, 2.5)},  # input bytes
        {"a": (1.0, 2.0, 0.0), "b": (3, 4, 0)},  # shapes
        {"parameters": {"temperature": 0.5}},  # a parameter the model may read
        {"outputs": ["y"]},  # requested outputs
        {"model": entry("other")},
        {"model": entry("m", 2)},
    ],
)
def test_anything_that_decides_the_outputs_changes_the_key(changed: dict[str, Any]) -> None:
    assert request_key(make_request(**changed)) != request_key(make_request())


def test_scheduling_parameters_do_not_change_the_key() -> None:
    assert request_key(make_request(parameters={"priority": 1, "timeout": 500})) == request_key(make_request())


def test_parameter_order_does_not_change_the_key() -> None:
    first = make_request(parameters={"x": 1, "y": "z"})
    second = make_request(parameters={"y": "z", "x": 1})
    assert request_key(first) == request_key(second)


# the LRU ---------------------------------------------------------------------------------------------------------


def test_a_stored_response_is_a_copy() -> None:
    cache = ResponseCache(1 << 20)
    buffer = bytearray(np.array([[5.0, 6.0]], np.float32).tobytes())
    original = InferenceResponse([OutputTensor("y", "FP32", [1, 2], memoryview(buffer))], parameters={"p": 1})
    assert cache.insert(b"k", original)
    buffer[:] = bytes(len(buffer))  # the worker's slot is reused
    cached = cache.lookup(b"k")
    assert cached is not None
    out = cached.response()
    assert out.outputs[0].to_numpy().tolist() == [[5.0, 6.0]]
    assert out.parameters == {"p": 1}


def test_least_recently_used_entries_are_evicted_to_stay_under_the_limit() -> None:
    one = ResponseCache(1 << 20)
    one.insert(b"probe", response())
    size = one.nbytes
    cache = ResponseCache(3 * size)
    for key in (b"a", b"b", b"c"):
        assert cache.insert(key, response())
    assert cache.lookup(b"a") is not None  # a is now the most recently used
    cache.insert(b"d", response())
    assert cache.lookup(b"b") is None
    assert all(cache.lookup(key) is not None for key in (b"a", b"c", b"d"))
    assert cache.evictions == 1
    assert cache.nbytes == 3 * size <= cache.max_bytes


def test_a_response_larger_than_the_cache_is_not_stored() -> None:
    cache = ResponseCache(100)
    assert not cache.insert(b"big", response(tuple(range(64))))
    assert len(cache) == 0 and cache.nbytes == 0


def test_storing_a_key_again_replaces_it() -> None:
    cache = ResponseCache(1 << 20)
    cache.insert(b"k", response((1.0, 1.0)))
    size = cache.nbytes
    cache.insert(b"k", response((2.0, 2.0)))
    assert len(cache) == 1 and cache.nbytes == size
    cached = cache.lookup(b"k")
    assert cached is not None and cached.response().outputs[0].to_numpy().tolist() == [[2.0, 2.0]]


# answering -------------------------------------------------------------------------------------------------------


def test_a_miss_stores_the_successful_final_response_then_a_hit_answers_it() -> None:
    cache = ResponseCache(1 << 20)
    model = entry()
    sent: list[InferenceResponse] = []
    first = make_request(model, sent=sent)
    assert not cache.answer(first, respond=lambda request, out: pytest.fail("a miss must not be answered"))
    first.on_response(first, response())  # the worker's answer, on its way to the client
    assert len(sent) == 1 and len(cache) == 1
    assert model.stats.cache_miss.count == 1 and model.stats.cache_hit.count == 0

    answered: list[InferenceResponse] = []
    second = make_request(model)
    assert cache.answer(second, respond=lambda request, out: answered.append(out))
    assert answered[0].outputs[0].to_numpy().tolist() == [[5.0, 6.0]]
    stats = model.stats.to_json("m", 1)
    assert stats["inference_stats"]["cache_hit"]["count"] == 1
    assert stats["inference_stats"]["success"]["count"] == 1  # the hit; the miss succeeds when its batch ends
    assert stats["inference_stats"]["queue"] == {"count": 1, "ns": 0}
    assert stats["execution_count"] == 0 and stats["inference_count"] == 0


@pytest.mark.parametrize("outcome", ["error", "cancelled", "partial"])
def test_failed_cancelled_and_partial_responses_are_not_stored(outcome: str) -> None:
    cache = ResponseCache(1 << 20)
    request = make_request()
    cache.answer(request, respond=lambda request, out: None)
    if outcome == "error":
        request.on_response(request, InferenceResponse([], ModelExecutionError("boom")))
    elif outcome == "cancelled":
        request.cancelled = True
        request.on_response(request, response())
    else:
        request.on_response(request, response(final=False))
    assert len(cache) == 0
    assert request.model.stats.cache_miss.count == 0


def test_a_decoupled_model_cannot_use_the_cache() -> None:
    spec = ModelSpec(
        "streams",
        1,
        inputs=(Tensor("a", np.float32, (-1,)),),
        outputs=(Tensor("y", np.float32, (-1,)),),
        config=ModelConfig(decoupled=True, response_cache=True),
    )
    with pytest.raises(ConfigError, match="response_cache cannot be used with a decoupled"):
        ModelEntry(spec)
