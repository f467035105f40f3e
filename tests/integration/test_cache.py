"""The response cache on a real server: a hit never reaches the model's function and answers the same bytes."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.errors import ConfigError

pytestmark = pytest.mark.integration

FP32 = [Tensor("INPUT0", np.float32, (-1,))]
OUT = [Tensor("OUTPUT0", np.float32, (-1,)), Tensor("CALL", np.int64, (1,))]


class CountingModel:
    """Doubles its input and says which call of the function produced the answer; fails on negative input."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        with self.lock:
            self.calls += 1
            call = self.calls
        outputs = []
        for request in requests:
            data = request["INPUT0"]
            if (data < 0).any():
                raise ValueError("negative input")
            scale = float(request.parameters.get("scale", 2.0))
            outputs.append({"OUTPUT0": data * scale, "CALL": np.full((len(data), 1), call, np.int64)})
        return outputs


# Room for a few small responses only: the eviction test fills it.
CACHE_BYTES = 2048


@pytest.fixture(scope="module")
def models() -> dict[str, CountingModel]:
    return {"cached": CountingModel(), "evicting": CountingModel(), "plain": CountingModel()}


@pytest.fixture(scope="module")
def server(models: dict[str, CountingModel]) -> Iterator[Serve]:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, response_cache_bytes=CACHE_BYTES))
    s.bind("cached", models["cached"], FP32, OUT, ModelConfig(max_batch_size=8, response_cache=True))
    s.bind("evicting", models["evicting"], FP32, OUT, ModelConfig(max_batch_size=8, response_cache=True))
    s.bind("plain", models["plain"], FP32, OUT, ModelConfig(max_batch_size=8))
    try:
        s.run()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server: Serve) -> Iterator[triton_http.InferenceServerClient]:
    c = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0)
    yield c
    c.close()


def infer(
    client: triton_http.InferenceServerClient, model: str, values: list[float], **kwargs: object
) -> tuple[np.ndarray, int]:
    item = triton_http.InferInput("INPUT0", [1, len(values)], "FP32")
    item.set_data_from_numpy(np.array([values], np.float32))
    result = client.infer(model, [item], **kwargs)  # type: ignore[arg-type]
    return result.as_numpy("OUTPUT0"), int(result.as_numpy("CALL")[0, 0])


def cache_stats(client: triton_http.InferenceServerClient, model: str) -> tuple[int, int]:
    (entry,) = client.get_inference_statistics(model)["model_stats"]
    inference = entry["inference_stats"]
    return inference["cache_hit"]["count"], inference["cache_miss"]["count"]


def test_identical_requests_are_answered_without_calling_the_model(
    client: triton_http.InferenceServerClient, models: dict[str, CountingModel]
) -> None:
    model = models["cached"]
    first, call = infer(client, "cached", [1, 2, 3])
    assert model.calls == 1 and call == 1
    for _ in range(3):
        again, again_call = infer(client, "cached", [1, 2, 3], request_id="another id")
        np.testing.assert_array_equal(again, first)
        assert again_call == 1  # the stored answer of the first call
    assert model.calls == 1
    assert cache_stats(client, "cached") == (3, 1)
    (entry,) = client.get_inference_statistics("cached")["model_stats"]
    assert entry["inference_stats"]["success"]["count"] == 4
    assert entry["execution_count"] == 1 and entry["inference_count"] == 1  # hits are not executions


def test_different_inputs_or_parameters_are_separate_entries(
    client: triton_http.InferenceServerClient, models: dict[str, CountingModel]
) -> None:
    model = models["cached"]
    calls = model.calls
    infer(client, "cached", [9, 9])
    infer(client, "cached", [9, 9, 9])  # another shape
    infer(client, "cached", [9, 9], parameters={"scale": 3.0})  # a parameter the model reads
    assert model.calls == calls + 3
    tripled, _ = infer(client, "cached", [9, 9], parameters={"scale": 3.0})
    np.testing.assert_array_equal(tripled, [[27, 27]])
    infer(client, "cached", [9, 9], priority=0, timeout=1_000_000)  # scheduling parameters do not matter
    assert model.calls == calls + 3


def test_failed_responses_are_never_cached(
    client: triton_http.InferenceServerClient, models: dict[str, CountingModel]
) -> None:
    model = models["cached"]
    calls = model.calls
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="negative input"):
            infer(client, "cached", [-1.0])
    assert model.calls == calls + 2


def test_a_model_without_the_cache_always_runs(
    client: triton_http.InferenceServerClient, models: dict[str, CountingModel]
) -> None:
    for _ in range(3):
        infer(client, "plain", [5.0])
    assert models["plain"].calls == 3
    assert cache_stats(client, "plain") == (0, 0)


def test_grpc_requests_share_the_cache(
    server: Serve, client: triton_http.InferenceServerClient, models: dict[str, CountingModel]
) -> None:
    expected, _ = infer(client, "cached", [4, 5, 6])
    calls = models["cached"].calls
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        item = triton_grpc.InferInput("INPUT0", [1, 3], "FP32")
        item.set_data_from_numpy(np.array([[4, 5, 6]], np.float32))
        result = grpc.infer("cached", [item])
    finally:
        grpc.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    assert models["cached"].calls == calls


def test_the_least_recently_used_answers_are_evicted_at_the_size_limit(
    server: Serve, client: triton_http.InferenceServerClient, models: dict[str, CountingModel]
) -> None:
    model = models["evicting"]
    for value in range(20):  # far more than CACHE_BYTES holds
        infer(client, "evicting", [float(value)] * 16)
    calls = model.calls
    infer(client, "evicting", [19.0] * 16)  # the newest is still there
    assert model.calls == calls
    infer(client, "evicting", [0.0] * 16)  # the oldest was evicted
    assert model.calls == calls + 1
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        page = response.read().decode()
    held = int(next(line.split()[-1] for line in page.splitlines() if line.startswith("pyserve_response_cache_bytes ")))
    assert 0 < held <= CACHE_BYTES
    evictions = next(line for line in page.splitlines() if line.startswith("pyserve_response_cache_evictions "))
    assert int(evictions.split()[-1]) > 0
    assert 'nv_cache_num_hits_per_model{model="evicting",version="1"} 1' in page
    assert 'nv_cache_num_misses_per_model{model="evicting",version="1"} 21' in page


def test_a_decoupled_model_cannot_enable_the_cache(server: Serve) -> None:
    def streams(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
        yield [{"OUTPUT0": r["INPUT0"]} for r in requests]

    with pytest.raises(ConfigError, match="response_cache cannot be used with a decoupled"):
        server.bind(
            "streams_cached",
            streams,
            FP32,
            [Tensor("OUTPUT0", np.float32, (-1,))],
            ModelConfig(max_batch_size=8, decoupled=True, response_cache=True),
        )
