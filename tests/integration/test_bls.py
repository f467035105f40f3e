"""BLS on a real server: infer functions calling other models (sync, async, streaming), errors, deadlines, the
deadlock guard, batching of calls, large tensors and process instances — checked with Triton's clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import pyserve
from pyserve import DynamicBatcher, ModelConfig, Request, Serve, ServeConfig, Step, Tensor, batch
from pyserve.errors import (
    DeadlockError,
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    RequestTimeoutError,
)

pytestmark = pytest.mark.integration


# models called by others -------------------------------------------------------------------------------------------


@batch
def double(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x * 2}


def fail(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    raise ValueError("the inner model broke")


def slow(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    time.sleep(1.0)
    return [{"y": r["x"]} for r in requests]


def count_up(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for step in range(3):
        yield [{"y": r["x"] + step} for r in requests]


# callers -----------------------------------------------------------------------------------------------------------


def call_double(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"y": pyserve.infer("double", {"x": r["x"]})["y"] + 1} for r in requests]


async def call_double_async(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    # Two calls per request, all in flight together.
    calls = [pyserve.ainfer("batched_double", {"x": r["x"]}) for r in requests for _ in range(2)]
    results = await asyncio.gather(*calls)
    return [{"y": results[2 * i]["y"] + results[2 * i + 1]["y"]} for i in range(len(requests))]


def call_stream(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    out = []
    for request in requests:
        parts = [response["y"] for response in pyserve.infer_stream("count_up", {"x": request["x"]})]
        out.append({"y": np.concatenate(parts, axis=1)})
    return out


async def call_stream_async(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    out = []
    for request in requests:
        stream: AsyncIterator[dict[str, np.ndarray]] = pyserve.ainfer_stream("count_up", {"x": request["x"]})
        parts = [response["y"] async for response in stream]
        out.append({"y": np.concatenate(parts, axis=1)})
    return out


def call_by_name(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Calls the model named by the request's ``target`` parameter; reports an error's class instead of raising when
    ``catch`` is set."""
    out = []
    for request in requests:
        target = str(request.parameters["target"])
        timeout = request.parameters.get("call_timeout_s")
        try:
            y = pyserve.infer(target, {"x": request["x"]}, timeout_s=float(timeout) if timeout else None)["y"]
        except pyserve.PyServeError as exc:
            if not request.parameters.get("catch"):
                raise
            y = np.array([[type(exc).__name__.encode()]], dtype=object)
        out.append({"y": y})
    return out


def recurse(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Calls itself ``depth`` times, adding one each time."""
    out = []
    for request in requests:
        depth = int(request.parameters.get("depth", 0))
        x = request["x"]
        if depth:
            x = pyserve.infer("recurse", {"x": x}, parameters={"depth": depth - 1})["y"] + 1
        out.append({"y": x})
    return out


def ping(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """ping -> pong -> ping: a cycle between two models of one instance each."""
    return [{"y": pyserve.infer("pong", {"x": r["x"]})["y"]} for r in requests]


def pong(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"y": pyserve.infer("ping", {"x": r["x"]})["y"]} for r in requests]


def through_ensemble(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Calls the ensemble "back", whose last step is this very model (asked with ``inner`` to just answer)."""
    out = []
    for request in requests:
        if request.parameters.get("inner"):
            out.append({"y": request["x"]})
        else:
            out.append({"y": pyserve.infer("back", {"X": request["x"]}, parameters={"inner": True})["Y"]})
    return out


def fp32(name: str) -> Tensor:
    return Tensor(name, np.float32, (-1,))


def bind_models(s: Serve) -> None:
    config = ModelConfig(max_batch_size=16)
    one = [fp32("x")], [fp32("y")]
    s.bind("double", double, *one, config)
    s.bind(
        "batched_double",
        double,
        *one,
        ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=10_000)),
    )
    s.bind("fail", fail, *one, config)
    s.bind("takes_a", double, [fp32("a")], [fp32("y")], config)
    s.bind("slow", slow, *one, config)
    s.bind("count_up", count_up, *one, ModelConfig(max_batch_size=16, decoupled=True))
    s.bind("call_double", call_double, *one, config)
    s.bind("call_double_async", call_double_async, *one, config)
    s.bind("call_stream", call_stream, *one, config)
    s.bind("call_stream_async", call_stream_async, *one, config)
    s.bind("call_by_name", call_by_name, [fp32("x")], [Tensor("y", object, (-1,))], config)
    s.bind("recurse", recurse, *one, ModelConfig(max_batch_size=16, instances=2))
    s.bind("recurse_alone", recurse, *one, config)  # calls "recurse", never itself
    s.bind("ping", ping, *one, config)
    s.bind("pong", pong, *one, config)
    s.bind("call_double_process", call_double, *one, ModelConfig(max_batch_size=16, worker="process"))
    s.bind("through_ensemble", through_ensemble, *one, config)
    s.bind_ensemble(
        "back",
        [Step("double", {"x": "X"}, {"y": "doubled"}), Step("through_ensemble", {"x": "doubled"}, {"y": "Y"})],
        [fp32("X")],
        [fp32("Y")],
        max_batch_size=16,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    bind_models(s)
    try:
        s.run()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def http(server: Serve) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0, concurrency=8)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: Serve) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield client
    client.close()


def infer(client: triton_http.InferenceServerClient, model: str, x: np.ndarray, **parameters: Any) -> np.ndarray:
    tensor = triton_http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], parameters=parameters or None).as_numpy("y")  # type: ignore[no-any-return]


X = np.array([[1, 2, 3]], np.float32)


# the three forms ---------------------------------------------------------------------------------------------------


def test_a_sync_call_returns_the_other_models_outputs(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient
) -> None:
    np.testing.assert_array_equal(infer(http, "call_double", X), X * 2 + 1)
    tensor = triton_grpc.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    np.testing.assert_array_equal(grpc.infer("call_double", [tensor]).as_numpy("y"), X * 2 + 1)


def test_async_calls_run_concurrently_and_are_batched_like_any_request(
    http: triton_http.InferenceServerClient,
) -> None:
    def batch_sizes() -> dict[int, int]:
        (entry,) = http.get_inference_statistics("batched_double")["model_stats"]
        return {s["batch_size"]: s["compute_infer"]["count"] for s in entry["batch_stats"]}

    before = batch_sizes()
    started = time.perf_counter()
    np.testing.assert_array_equal(infer(http, "call_double_async", X), X * 4)
    elapsed = time.perf_counter() - started
    grown = {size for size, count in batch_sizes().items() if count > before.get(size, 0)}
    # The function's two calls were in flight together and the batcher (10 ms delay) merged them.
    assert grown == {2}, grown
    assert elapsed < 1.0


def test_streaming_calls_iterate_a_decoupled_models_responses(http: triton_http.InferenceServerClient) -> None:
    expected = np.concatenate([X, X + 1, X + 2], axis=1)
    np.testing.assert_array_equal(infer(http, "call_stream", X), expected)
    np.testing.assert_array_equal(infer(http, "call_stream_async", X), expected)


def test_large_tensors_go_both_ways_through_shared_memory(http: triton_http.InferenceServerClient) -> None:
    x = np.random.default_rng(0).random((1, 262_144), dtype=np.float32)  # 1 MiB
    for _ in range(3):
        np.testing.assert_array_equal(infer(http, "call_double", x), x * 2 + 1)


def test_a_process_instance_calls_models_too(http: triton_http.InferenceServerClient) -> None:
    np.testing.assert_array_equal(infer(http, "call_double_process", X), X * 2 + 1)


# errors --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("fail", ModelExecutionError),
        ("missing", ModelNotFoundError),
        ("count_up", pyserve.PyServeError),  # a decoupled model needs infer_stream
    ],
)
def test_errors_are_raised_inside_the_caller_as_pyserve_errors(
    http: triton_http.InferenceServerClient, target: str, error: type[Exception]
) -> None:
    caught = infer(http, "call_by_name", X, target=target, catch=True)
    assert issubclass(getattr(pyserve.errors, caught[0, 0].decode()), error)


def test_an_uncaught_error_answers_the_outer_request(http: triton_http.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="the inner model broke") as info:
        infer(http, "call_by_name", X, target="fail")
    assert info.value.status() == "500"


def test_inputs_are_validated_as_for_a_client(http: triton_http.InferenceServerClient) -> None:
    # call_by_name sends input "x"; takes_a declares only "a".
    caught = infer(http, "call_by_name", X, target="takes_a", catch=True)
    assert caught[0, 0] == InvalidInputError.__name__.encode()


# deadlines -----------------------------------------------------------------------------------------------------------


def test_the_callers_deadline_propagates_to_the_call(http: triton_http.InferenceServerClient) -> None:
    started = time.perf_counter()
    caught = infer(http, "call_by_name", X, target="slow", catch=True, timeout=300_000)
    elapsed = time.perf_counter() - started
    assert caught[0, 0] == b"RequestTimeoutError"
    assert elapsed < 0.9, f"the call waited {elapsed:.2f} s past a 0.3 s deadline"


def test_a_calls_own_timeout_applies(http: triton_http.InferenceServerClient) -> None:
    started = time.perf_counter()
    caught = infer(http, "call_by_name", X, target="slow", catch=True, call_timeout_s=0.2)
    assert caught[0, 0] == b"RequestTimeoutError"
    assert time.perf_counter() - started < 0.9
    assert issubclass(RequestTimeoutError, TimeoutError)


# the deadlock guard --------------------------------------------------------------------------------------------------


def test_a_model_calling_itself_with_its_only_instance_fails_at_once(
    http: triton_http.InferenceServerClient,
) -> None:
    started = time.perf_counter()
    with pytest.raises(InferenceServerException) as info:
        infer(http, "call_by_name", X, target="call_by_name")
    assert time.perf_counter() - started < 1.0
    assert info.value.status() == "500"
    assert "BLS call from model 'call_by_name' to model 'call_by_name' would deadlock" in info.value.message()
    assert issubclass(DeadlockError, pyserve.PyServeError)


def test_recursion_uses_the_other_instances_and_stops_where_none_is_left(
    http: triton_http.InferenceServerClient,
) -> None:
    np.testing.assert_array_equal(infer(http, "recurse", X, depth=1), X + 1)  # the second instance serves it
    np.testing.assert_array_equal(infer(http, "recurse_alone", X, depth=2), X + 2)  # two levels on two instances
    started = time.perf_counter()
    with pytest.raises(InferenceServerException, match="would deadlock"):
        infer(http, "recurse", X, depth=2)  # the third level would need a third instance
    assert time.perf_counter() - started < 1.0


def test_two_models_calling_each_other_fail_at_once(http: triton_http.InferenceServerClient) -> None:
    started = time.perf_counter()
    with pytest.raises(InferenceServerException, match="BLS call from model 'pong' to model 'ping' would deadlock"):
        infer(http, "ping", X)
    assert time.perf_counter() - started < 1.0
    # Nothing is left stuck: both models still answer.
    np.testing.assert_array_equal(infer(http, "double", X), X * 2)


def test_a_cycle_through_an_ensemble_step_fails_at_once(http: triton_http.InferenceServerClient) -> None:
    started = time.perf_counter()
    with pytest.raises(InferenceServerException) as info:
        infer(http, "through_ensemble", X)
    assert time.perf_counter() - started < 1.0
    message = info.value.message()
    assert "ensemble 'back' step 'through_ensemble' (model 'through_ensemble') failed" in message
    assert "model 'through_ensemble' can never take this step" in message


def test_outside_an_infer_function_the_calls_say_where_they_work() -> None:
    with pytest.raises(RuntimeError, match=r"pyserve.infer\(\) is only available inside a pyserve infer function"):
        pyserve.infer("double", {"x": X})
    with pytest.raises(RuntimeError, match="infer_stream"):
        pyserve.infer_stream("count_up", {"x": X})
