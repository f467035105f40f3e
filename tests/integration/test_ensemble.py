"""Ensembles on a real server, called with Triton's clients: pipelines, DAGs, failures, batching, deadlines and
perf_analyzer, over HTTP and gRPC."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import DynamicBatcher, ModelConfig, Request, Serve, ServeConfig, Step, Tensor, batch
from pyserve.errors import ConfigError, ModelAlreadyBoundError

from .conftest import run_perf_analyzer

pytestmark = pytest.mark.integration

TOKENS = 8


# models ----------------------------------------------------------------------------------------------------------


def tokenize_rows(text: np.ndarray) -> np.ndarray:
    """Each text (one BYTES element per row) as TOKENS character codes, zero-padded."""
    ids = np.zeros((len(text), TOKENS), np.int64)
    for row, value in enumerate(text[:, 0]):
        codes = list(value[:TOKENS])
        ids[row, : len(codes)] = codes
    return ids


def embed_rows(ids: np.ndarray) -> np.ndarray:
    present = (ids > 0).sum(axis=1)
    return np.stack([ids.sum(axis=1), ids.max(axis=1), present, ids[:, 0]], axis=1).astype(np.float32)


def label_rows(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    labels = np.array([[b"long" if n > 4 else b"short"] for n in features[:, 2]], dtype=object)
    return labels, features[:, :1] / 100


@batch
def tokenize(text: np.ndarray) -> dict[str, np.ndarray]:
    return {"ids": tokenize_rows(text)}


@batch
def embed(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"features": embed_rows(ids)}


@batch
def classify(features: np.ndarray) -> dict[str, np.ndarray]:
    labels, scores = label_rows(features)
    return {"label": labels, "score": scores}


def sleep_for(requests: list[Request]) -> None:
    time.sleep(max(float(r.parameters.get("sleep_s", 0.0)) for r in requests))


def slow_double(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    sleep_for(requests)
    return [{"y": r["x"] * 2} for r in requests]


def slow_plus_one(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    sleep_for(requests)
    return [{"y": r["x"] + 1} for r in requests]


@batch
def add(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"sum": a + b}


@batch
def plus_one(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x + 1}


@batch
def double(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x * 2}


def check_positive(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    for request in requests:
        if (request["x"] < 0).any():
            raise ValueError(f"negative input: {float(request['x'].min())}")
    return [{"y": request["x"]} for request in requests]


def fp32(name: str, shape: tuple[int, ...] = (-1,)) -> Tensor:
    return Tensor(name, np.float32, shape)


def bind_models(s: Serve) -> None:
    config = ModelConfig(max_batch_size=16)
    s.bind("tokenize", tokenize, [Tensor("text", bytes, (1,))], [Tensor("ids", np.int64, (TOKENS,))], config)
    s.bind("embed", embed, [Tensor("ids", np.int64, (TOKENS,))], [fp32("features", (4,))], config)
    s.bind("classify", classify, [fp32("features", (4,))], [Tensor("label", bytes, (1,)), fp32("score", (1,))], config)
    s.bind_ensemble(
        "text_pipeline",
        steps=[
            Step("tokenize", inputs={"text": "TEXT"}, outputs={"ids": "ids"}),
            Step("embed", inputs={"ids": "ids"}, outputs={"features": "features"}),
            Step("classify", inputs={"features": "features"}, outputs={"label": "LABEL", "score": "SCORE"}),
        ],
        inputs=[Tensor("TEXT", bytes, (1,))],
        outputs=[Tensor("LABEL", bytes, (1,)), fp32("SCORE", (1,))],
        max_batch_size=16,
    )
    for name, function in (("slow_double", slow_double), ("slow_plus_one", slow_plus_one)):
        s.bind(name, function, [fp32("x")], [fp32("y")], ModelConfig(max_batch_size=16, batcher=None))
    s.bind("add", add, [fp32("a"), fp32("b")], [fp32("sum")], config)
    s.bind_ensemble(
        "diamond",
        steps=[
            Step("slow_double", inputs={"x": "IN"}, outputs={"y": "doubled"}, name="left"),
            Step("slow_plus_one", inputs={"x": "IN"}, outputs={"y": "plus_one"}, name="right"),
            Step("add", inputs={"a": "doubled", "b": "plus_one"}, outputs={"sum": "OUT"}, name="join"),
        ],
        inputs=[fp32("IN")],
        outputs=[fp32("OUT")],
        max_batch_size=16,
    )
    s.bind("plus_one", plus_one, [fp32("x")], [fp32("y")], config)
    s.bind("check_positive", check_positive, [fp32("x")], [fp32("y")], config)
    s.bind("last_step", double, [fp32("x")], [fp32("y")], config)
    s.bind_ensemble(
        "failing",
        steps=[
            Step("plus_one", {"x": "IN"}, {"y": "a"}),
            Step("check_positive", {"x": "a"}, {"y": "b"}, name="check"),
            Step("last_step", {"x": "b"}, {"y": "OUT"}),
        ],
        inputs=[fp32("IN")],
        outputs=[fp32("OUT")],
        max_batch_size=16,
    )
    s.bind(
        "batched_double",
        double,
        [fp32("x")],
        [fp32("y")],
        ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=20_000)),
    )
    s.bind_ensemble(
        "batched",
        steps=[Step("plus_one", {"x": "IN"}, {"y": "a"}), Step("batched_double", {"x": "a"}, {"y": "OUT"})],
        inputs=[fp32("IN")],
        outputs=[fp32("OUT")],
        max_batch_size=16,
    )
    s.bind("after_sleep", double, [fp32("x")], [fp32("y")], config)
    s.bind_ensemble(
        "sleepy",
        steps=[Step("slow_double", {"x": "IN"}, {"y": "a"}), Step("after_sleep", {"x": "a"}, {"y": "OUT"})],
        inputs=[fp32("IN")],
        outputs=[fp32("OUT")],
        max_batch_size=16,
    )
    s.bind_ensemble(
        "nested",
        steps=[Step("diamond", {"IN": "X"}, {"OUT": "d"}), Step("plus_one", {"x": "d"}, {"y": "Y"})],
        inputs=[fp32("X")],
        outputs=[fp32("Y")],
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
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0, concurrency=16)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: Serve) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield client
    client.close()


def http_input(name: str, value: np.ndarray) -> triton_http.InferInput:
    datatype = "BYTES" if value.dtype == object else "FP32"
    tensor = triton_http.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def grpc_input(name: str, value: np.ndarray) -> triton_grpc.InferInput:
    datatype = "BYTES" if value.dtype == object else "FP32"
    tensor = triton_grpc.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def stats(client: triton_http.InferenceServerClient, model: str) -> dict[str, Any]:
    (entry,) = client.get_inference_statistics(model)["model_stats"]
    return entry  # type: ignore[no-any-return]


# a linear pipeline -------------------------------------------------------------------------------------------------

TEXTS = np.array([[b"hello world"], [b"hi"], [b"abc"]], dtype=object)


def expected_pipeline(texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return label_rows(embed_rows(tokenize_rows(texts)))


def test_a_three_step_pipeline_answers_over_http(http: triton_http.InferenceServerClient) -> None:
    result = http.infer("text_pipeline", [http_input("TEXT", TEXTS)])
    labels, scores = expected_pipeline(TEXTS)
    assert result.as_numpy("LABEL").tolist() == labels.tolist()
    np.testing.assert_allclose(result.as_numpy("SCORE"), scores)


def test_a_three_step_pipeline_answers_over_grpc_with_the_outputs_asked_for(
    grpc: triton_grpc.InferenceServerClient,
) -> None:
    result = grpc.infer(
        "text_pipeline", [grpc_input("TEXT", TEXTS[:1])], outputs=[triton_grpc.InferRequestedOutput("SCORE")]
    )
    np.testing.assert_allclose(result.as_numpy("SCORE"), expected_pipeline(TEXTS[:1])[1])
    assert result.as_numpy("LABEL") is None


def test_the_ensemble_is_served_like_a_model(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient
) -> None:
    assert http.is_model_ready("text_pipeline")
    metadata = http.get_model_metadata("text_pipeline")
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    config = http.get_model_config("text_pipeline")
    assert config["platform"] == "ensemble"
    steps = config["ensemble_scheduling"]["step"]
    assert [(s["model_name"], s["input_map"], s["output_map"]) for s in steps] == [
        ("tokenize", {"text": "TEXT"}, {"ids": "ids"}),
        ("embed", {"ids": "ids"}, {"features": "features"}),
        ("classify", {"features": "features"}, {"label": "LABEL", "score": "SCORE"}),
    ]
    grpc_config = grpc.get_model_config("text_pipeline", as_json=True)["config"]
    assert grpc_config["platform"] == "ensemble"
    assert [s["model_name"] for s in grpc_config["ensemble_scheduling"]["step"]] == ["tokenize", "embed", "classify"]
    assert grpc.get_model_metadata("text_pipeline", as_json=True)["platform"] == "ensemble"


def test_statistics_count_the_ensemble_and_each_composing_model(http: triton_http.InferenceServerClient) -> None:
    before = {m: stats(http, m)["inference_count"] for m in ("text_pipeline", "tokenize", "embed", "classify")}
    http.infer("text_pipeline", [http_input("TEXT", TEXTS)])
    after = stats(http, "text_pipeline")
    assert after["inference_count"] == before["text_pipeline"] + 3
    assert after["inference_stats"]["success"]["count"] >= 1
    for model in ("tokenize", "embed", "classify"):
        assert stats(http, model)["inference_count"] == before[model] + 3, model


def test_bad_requests_are_refused_against_the_ensembles_own_inputs(http: triton_http.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="unexpected inference input 'text'") as info:
        http.infer("text_pipeline", [http_input("text", TEXTS)])
    assert info.value.status() == "400"


# a DAG -------------------------------------------------------------------------------------------------------------


def test_a_diamond_runs_its_branches_concurrently_and_joins_them(http: triton_http.InferenceServerClient) -> None:
    x = np.array([[1, 2, 3]], np.float32)
    started = time.perf_counter()
    result = http.infer("diamond", [http_input("IN", x)], parameters={"sleep_s": 0.4})
    elapsed = time.perf_counter() - started
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2 + (x + 1))
    assert elapsed < 0.75, f"branches of 0.4 s each took {elapsed:.2f} s together: they ran one after the other"


def test_an_ensemble_can_be_a_step_of_another(grpc: triton_grpc.InferenceServerClient) -> None:
    x = np.array([[1, 2]], np.float32)
    result = grpc.infer("nested", [grpc_input("X", x)])
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 2 + (x + 1) + 1)


# failures, deadlines, cancellation ---------------------------------------------------------------------------------


def test_a_failing_middle_step_ends_the_request_with_its_name_and_error(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient
) -> None:
    last_before = stats(http, "last_step")["inference_count"]
    x = np.array([[-5, 1]], np.float32)
    with pytest.raises(InferenceServerException) as info:
        http.infer("failing", [http_input("IN", x)])
    assert info.value.status() == "500"
    message = info.value.message()
    assert message.startswith("ensemble 'failing' step 'check' (model 'check_positive') failed: ")
    assert "ValueError: negative input: -4.0" in message
    with pytest.raises(InferenceServerException, match="step 'check'") as grpc_info:
        grpc.infer("failing", [grpc_input("IN", x)])
    assert grpc_info.value.status() == "StatusCode.INTERNAL"
    assert stats(http, "last_step")["inference_count"] == last_before  # never reached
    assert stats(http, "failing")["inference_stats"]["fail"]["count"] >= 2
    ok = http.infer("failing", [http_input("IN", np.ones((1, 2), np.float32))])
    np.testing.assert_array_equal(ok.as_numpy("OUT"), np.full((1, 2), 4, np.float32))


def test_a_timed_out_request_stops_before_the_next_step(http: triton_http.InferenceServerClient) -> None:
    before = stats(http, "after_sleep")["inference_count"]
    x = np.ones((1, 2), np.float32)
    started = time.perf_counter()
    with pytest.raises(InferenceServerException) as info:
        http.infer("sleepy", [http_input("IN", x)], parameters={"sleep_s": 0.8}, timeout=200_000)
    elapsed = time.perf_counter() - started
    assert info.value.status() == "503"
    assert "ensemble 'sleepy': the request's deadline passed while step 'slow_double' ran" in info.value.message()
    assert elapsed < 0.6, f"the timeout of 0.2 s was answered after {elapsed:.2f} s"
    time.sleep(0.9)  # slow_double finishes meanwhile
    assert stats(http, "after_sleep")["inference_count"] == before


def test_a_cancelled_request_stops_before_the_next_step(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient
) -> None:
    before = stats(http, "after_sleep")["inference_count"]
    x = np.ones((1, 2), np.float32)
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        grpc.infer("sleepy", [grpc_input("IN", x)], parameters={"sleep_s": 0.6}, client_timeout=0.2)
    time.sleep(0.8)
    assert stats(http, "after_sleep")["inference_count"] == before


# batching and large tensors ------------------------------------------------------------------------------------------


def test_steps_are_batched_with_other_traffic_under_concurrency(http: triton_http.InferenceServerClient) -> None:
    before = {s["batch_size"]: s["compute_infer"]["count"] for s in stats(http, "batched_double")["batch_stats"]}
    values = [np.full((1, 4), i, np.float32) for i in range(16)]
    pending = [http.async_infer("batched", [http_input("IN", v)]) for v in values]
    for value, request in zip(values, pending, strict=True):
        np.testing.assert_array_equal(request.get_result().as_numpy("OUT"), (value + 1) * 2)
    after = {s["batch_size"]: s["compute_infer"]["count"] for s in stats(http, "batched_double")["batch_stats"]}
    grown = {size for size, count in after.items() if count > before.get(size, 0)}
    assert max(grown) > 1, f"batched_double only ran batches of {sorted(grown)}"


def test_large_tensors_pass_between_steps_through_shared_memory(server: Serve) -> None:
    # 1 MiB per tensor, above the shared-memory threshold at every hop; concurrent requests must not mix.
    def call(seed: int) -> None:
        with triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0) as client:
            x = np.random.default_rng(seed).random((1, 262_144), dtype=np.float32)
            for _ in range(3):
                result = client.infer("diamond", [http_input("IN", x)])
                np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2 + (x + 1))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(call, seed) for seed in range(4)]:
            future.result(timeout=60)


# binding -------------------------------------------------------------------------------------------------------------


def test_bind_mistakes_are_clear_and_a_running_server_loads_an_ensemble_at_once(server: Serve) -> None:
    with pytest.raises(ConfigError, match="ensemble 'broken' step 'nope': model 'nope' is not bound"):
        server.bind_ensemble("broken", [Step("nope", {"x": "IN"}, {"y": "OUT"})], [fp32("IN")], [fp32("OUT")], 16)
    with pytest.raises(ModelAlreadyBoundError):
        server.bind_ensemble("plus_one", [Step("double", {"x": "IN"}, {"y": "OUT"})], [fp32("IN")], [fp32("OUT")])
    with pytest.raises(ModelAlreadyBoundError, match="an ensemble named 'diamond'"):
        server.bind("diamond", double, [fp32("x")], [fp32("y")])
    server.bind_ensemble(
        "late", [Step("plus_one", {"x": "IN"}, {"y": "OUT"})], [fp32("IN")], [fp32("OUT")], max_batch_size=8
    )
    with triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}") as client:
        result = client.infer("late", [http_input("IN", np.zeros((2, 1), np.float32))])
        np.testing.assert_array_equal(result.as_numpy("OUT"), np.ones((2, 1), np.float32))


# perf_analyzer -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_runs_against_the_ensemble_without_errors(
    perf_analyzer: str, server: Serve, protocol: str
) -> None:
    port = server.http_port if protocol == "http" else server.grpc_port
    output = run_perf_analyzer(perf_analyzer, port, "diamond", protocol=protocol, shape="IN:16")
    # perf_analyzer found the composing models through the config and read their statistics.
    assert "Composing models:" in output, output
    for model in ("add", "slow_double", "slow_plus_one"):
        assert f"{model}, version: 1" in output, output
