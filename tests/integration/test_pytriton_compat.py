"""PyTriton user code on pyserve: written as a PyTriton user writes it, with only ``pytriton`` changed to
``pyserve.pytriton`` in the imports, served by a real server and called by every client class, by ``tritonclient``,
and by PyTriton's own ``ModelClient`` (from benchmarks/.pytriton-venv, in a subprocess, where that venv exists).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import wait
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from pyserve import ModelConfig as PyServeModelConfig
from pyserve import Serve, ServeConfig
from pyserve import Tensor as PyServeTensor
from pyserve.pytriton.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from pyserve.pytriton.client.exceptions import PyTritonClientInferenceServerError
from pyserve.pytriton.decorators import batch, fill_optionals, group_by_keys, sample, triton_context
from pyserve.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pyserve.pytriton.proxy.types import Request
from pyserve.pytriton.triton import Triton, TritonConfig

pytestmark = pytest.mark.integration

PYTRITON_PYTHON = Path(__file__).resolve().parents[2] / "benchmarks" / ".pytriton-venv" / "bin" / "python"


# models, as PyTriton's users write them ----------------------------------------------------------------------


@batch
def add_sub(**inputs: np.ndarray) -> list[np.ndarray]:
    # Unnamed tensors: the inputs are INPUT_1, INPUT_2; the outputs go back as a list in declared order.
    a, b = inputs["INPUT_1"], inputs["INPUT_2"]
    return [a + b, a - b]


@fill_optionals(b=np.array([10.0], dtype=np.float32))
@group_by_keys
@batch
def add_optionals(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> dict[str, np.ndarray]:
    return {"total": a + b + (c if c is not None else 0)}


@batch
def identity_bytes(text: np.ndarray) -> dict[str, np.ndarray]:
    return {"text": text}


@sample
def sample_upper(text: np.ndarray) -> tuple[np.ndarray]:
    return (np.char.upper(text.astype(bytes)),)


def with_parameters(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    responses = []
    for request in requests:
        divisor = float(request.parameters.get("header_divisor", 1))
        multiplier = float(request.parameters.get("multiplier", 1))
        responses.append({"scaled": request["values"] * multiplier / divisor})
    return responses


@batch
@triton_context
def describe(x: np.ndarray, triton_context: Any) -> dict[str, np.ndarray]:
    config = triton_context.model_configs[describe]
    return {"max_batch_size": np.full((len(x), 1), config.max_batch_size, dtype=np.int32)}


@batch
def countdown(start: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
    for step in range(int(start.max()), 0, -1):
        yield {"remaining": np.full_like(start, step)}


def stream_header(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for _ in range(2):
        yield [{"divisor": np.array([float(r.parameters.get("header_divisor", 0))], np.float32)} for r in requests]


def instance(tag: int) -> Any:
    @batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        time.sleep(0.02)  # long enough for concurrent requests to need both instances
        return {"tag": np.full((len(x), 1), tag, dtype=np.int32)}

    return infer


def plain_lists(requests: list[Request]) -> list[list[np.ndarray]]:
    return [[request["x"], request["x"] * 2] for request in requests]


def too_few(requests: list[Request]) -> list[list[np.ndarray]]:
    return [[request["x"]] for request in requests]


def fp32(name: str | None = None, shape: tuple[int, ...] = (-1,), optional: bool = False) -> Tensor:
    return Tensor(shape=shape, dtype=np.float32, name=name, optional=optional)


def bind_models(triton: Triton) -> None:
    triton.bind(
        model_name="add_sub",
        infer_func=add_sub,
        inputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=100)),
    )
    triton.bind(
        "add_optionals",
        add_optionals,
        inputs=[fp32("a", (1,)), fp32("b", (1,), optional=True), fp32("c", (1,), optional=True)],
        outputs=[fp32("total", (1,))],
    )
    triton.bind("identity_bytes", identity_bytes, [Tensor((1,), np.bytes_, "text")], [Tensor((1,), np.bytes_, "text")])
    triton.bind(
        "sample_upper",
        sample_upper,
        inputs=[Tensor(name="text", dtype=np.bytes_, shape=(-1,))],
        outputs=[Tensor(name="upper", dtype=np.bytes_, shape=(-1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind("parameters", with_parameters, [fp32("values")], [fp32("scaled")], config=ModelConfig(batching=False))
    triton.bind("describe", describe, [fp32("x")], [Tensor(name="max_batch_size", dtype=np.int32, shape=(1,))])
    triton.bind(
        "countdown",
        countdown,
        [Tensor(name="start", dtype=np.int32, shape=(1,))],
        [Tensor(name="remaining", dtype=np.int32, shape=(1,))],
        config=ModelConfig(decoupled=True),
    )
    triton.bind(
        "stream_header",
        stream_header,
        [fp32("x")],
        [fp32("divisor", (1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    triton.bind("instances", [instance(0), instance(1)], [fp32("x")], [Tensor((1,), np.int32, "tag")])
    triton.bind("plain_lists", plain_lists, [fp32("x")], [fp32("once"), fp32("twice")])
    triton.bind("too_few", too_few, [fp32("x")], [fp32("once"), fp32("twice")])


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    config = TritonConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        http_header_forward_pattern="header.*",
        grpc_header_forward_pattern="header.*",
    )
    with Triton(config=config) as server:
        bind_models(server)
        yield server


@pytest.fixture(scope="module", params=["http", "grpc"])
def url(request: pytest.FixtureRequest, triton: Triton) -> str:
    if request.param == "http":
        return f"http://127.0.0.1:{triton.server.http_port}"
    return f"grpc://127.0.0.1:{triton.server.grpc_port}"


# the models through pyserve.pytriton.client -------------------------------------------------------------------


def test_unnamed_tensors_and_list_returns(url: str) -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    with ModelClient(url, "add_sub") as client:
        result = client.infer_batch(a, a * 10)
        assert sorted(result) == ["OUTPUT_1", "OUTPUT_2"]
        np.testing.assert_array_equal(result["OUTPUT_1"], a * 11)
        np.testing.assert_array_equal(result["OUTPUT_2"], a * -9)
        named = client.infer_sample(INPUT_1=a[0], INPUT_2=a[1])
        np.testing.assert_array_equal(named["OUTPUT_2"], a[0] - a[1])
        assert [t.name for t in client.model_config.inputs] == ["INPUT_1", "INPUT_2"]


def test_optional_inputs_filled_or_grouped(url: str) -> None:
    one = np.array([1.0], dtype=np.float32)
    with ModelClient(url, "add_optionals") as client:
        assert client.infer_sample(a=one)["total"].tolist() == [11.0]
        assert client.infer_sample(a=one, b=one)["total"].tolist() == [2.0]
        assert client.infer_sample(a=one, c=one * 100)["total"].tolist() == [111.0]


def test_bytes_batched_and_sampled(url: str) -> None:
    text = np.array([[b"hello"], [b"world"]], dtype=np.bytes_)
    with ModelClient(url, "identity_bytes") as client:
        np.testing.assert_array_equal(client.infer_batch(text)["text"].astype(bytes), text)
    with ModelClient(url, "sample_upper") as client:
        upper = client.infer_sample(np.array([b"ab", b"c"], dtype=np.bytes_))["upper"]
        assert upper.astype(bytes).tolist() == [b"AB", b"C"]
        assert client.model_config.max_batch_size == 0


def test_parameters_and_forwarded_headers(url: str) -> None:
    values = np.array([6.0, 9.0], dtype=np.float32)
    with ModelClient(url, "parameters") as client:
        assert client.infer_sample(values)["scaled"].tolist() == [6.0, 9.0]
        scaled = client.infer_sample(values, parameters={"multiplier": 2}, headers={"header_divisor": "3"})
        assert scaled["scaled"].tolist() == [4.0, 6.0]
        # A header the pattern does not match stays a header.
        assert client.infer_sample(values, headers={"divisor": "3"})["scaled"].tolist() == [6.0, 9.0]


def test_triton_context_sees_the_model_config(url: str) -> None:
    with ModelClient(url, "describe") as client:
        assert client.infer_sample(np.zeros(2, np.float32))["max_batch_size"].tolist() == [4]


def test_decoupled_model_streams(url: str) -> None:
    start = np.array([3], dtype=np.int32)
    with DecoupledModelClient(url, "countdown") as client:
        assert [r["remaining"].tolist() for r in client.infer_sample(start)] == [[3], [2], [1]]

    async def collect() -> list[list[int]]:
        async with AsyncioDecoupledModelClient(url, "countdown") as client:
            return [r["remaining"].tolist() async for r in client.infer_sample(start)]

    assert asyncio.run(collect()) == [[3], [2], [1]]


def test_streams_forward_headers_too(url: str) -> None:
    with DecoupledModelClient(url, "stream_header") as client:
        responses = client.infer_sample(np.zeros(1, np.float32), headers={"header_divisor": "5"})
        assert [r["divisor"].tolist() for r in responses] == [[5.0], [5.0]]


def test_futures_and_asyncio_clients(url: str) -> None:
    a = np.ones(3, dtype=np.float32)
    with FuturesModelClient(url, "add_sub") as client:
        futures = [client.infer_sample(a * i, a) for i in range(4)]
        assert [f.result(timeout=30)["OUTPUT_1"][0] for f in futures] == [1.0, 2.0, 3.0, 4.0]

    async def infer() -> dict[str, np.ndarray]:
        async with AsyncioModelClient(url, "add_sub") as client:
            return await client.infer_sample(a, a)

    assert asyncio.run(infer())["OUTPUT_1"].tolist() == [2.0, 2.0, 2.0]


def test_a_list_of_infer_functions_is_one_instance_each(triton: Triton) -> None:
    url = f"http://127.0.0.1:{triton.server.http_port}"
    with FuturesModelClient(url, "instances", max_workers=8) as client:
        futures = [client.infer_sample(np.zeros(1, np.float32)) for _ in range(16)]
        wait(futures, timeout=30)
        assert {int(f.result()["tag"][0]) for f in futures} == {0, 1}


def test_plain_functions_return_lists_and_a_wrong_length_is_named(url: str) -> None:
    x = np.array([1.0, 2.0], dtype=np.float32)
    with ModelClient(url, "plain_lists") as client:
        result = client.infer_sample(x)
        assert (result["once"].tolist(), result["twice"].tolist()) == ([1.0, 2.0], [2.0, 4.0])
    with ModelClient(url, "too_few") as client, pytest.raises(PyTritonClientInferenceServerError) as raised:
        client.infer_sample(x)
    assert "returned a list of 1 outputs, but the model declares 2 ('once', 'twice')" in str(raised.value)


# headers through Triton's own clients --------------------------------------------------------------------------


def test_tritonclient_headers_become_parameters(triton: Triton) -> None:
    values = np.array([[8.0]], dtype=np.float32)
    http = triton_http.InferenceServerClient(f"127.0.0.1:{triton.server.http_port}")
    tensor = triton_http.InferInput("values", [1], "FP32")
    tensor.set_data_from_numpy(values[0])
    # Case-insensitive, and named in lower case as Triton forwards them.
    result = http.infer("parameters", [tensor], headers={"Header_Divisor": "4"})
    assert result.as_numpy("scaled").tolist() == [2.0]
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{triton.server.grpc_port}")
    tensor = triton_grpc.InferInput("values", [1], "FP32")
    tensor.set_data_from_numpy(values[0])
    result = grpc.infer("parameters", [tensor], headers={"header_divisor": "2"}, parameters={"multiplier": 3})
    assert result.as_numpy("scaled").tolist() == [12.0]
    http.close()
    grpc.close()


# the lifecycle ------------------------------------------------------------------------------------------------


def test_run_bind_serve_and_stop_as_pytriton_does() -> None:
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0))
    triton.bind("add_sub", add_sub, [fp32(), fp32()], [fp32(), fp32()])
    assert not triton.is_alive()
    assert triton.stop() is False
    triton.run()
    try:
        assert triton.is_alive() and triton.is_connected()
        triton.connect()  # already running: nothing to do
        # Bound on a running server: loaded at once.
        triton.bind("later", with_parameters, [fp32("values")], [fp32("scaled")], config=ModelConfig(batching=False))
        with ModelClient(f"http://127.0.0.1:{triton.server.http_port}", "later") as client:
            assert client.infer_sample(np.ones(1, np.float32))["scaled"].tolist() == [1.0]
    finally:
        assert triton.stop() is True
    assert not triton.is_alive()
    assert triton.stop() is False

    serving = threading.Thread(target=triton.serve)
    serving.start()
    deadline = time.monotonic() + 30
    while not triton.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert triton.is_alive()
    triton.stop()
    serving.join(30)
    assert not serving.is_alive() and not triton.is_alive()


def test_pyserves_own_api_takes_the_same_code() -> None:
    config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0, http_header_forward_pattern="Header.*")
    with Serve(config) as server:
        server.bind(
            "add_sub",
            add_sub,
            inputs=[PyServeTensor(dtype=np.float32), PyServeTensor(dtype=np.float32)],
            outputs=[PyServeTensor(dtype=np.float32), PyServeTensor(dtype=np.float32)],
            config=PyServeModelConfig(max_batch_size=8),
        )
        server.bind(
            "parameters",
            with_parameters,
            [PyServeTensor("values", np.float32)],
            [PyServeTensor("scaled", np.float32)],
            config=PyServeModelConfig(batching=False),
        )
        a = np.array([[1.0, 2.0]], dtype=np.float32)
        assert server.infer("add_sub", {"INPUT_1": a, "INPUT_2": a})["OUTPUT_2"].tolist() == [[0.0, 0.0]]
        with ModelClient(server.url, "parameters") as client:
            scaled = client.infer_sample(np.array([9.0], np.float32), headers={"header_divisor": "3"})
        assert scaled["scaled"].tolist() == [3.0]


# PyTriton's own client -----------------------------------------------------------------------------------------

PYTRITON_CLIENT = """
import json, sys
import numpy as np
from pytriton.client import ModelClient

url = sys.argv[1]
a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
with ModelClient(url, "add_sub", init_timeout_s=30) as client:
    batch = client.infer_batch(a, a * 10)
    sample = client.infer_sample(INPUT_1=a[0], INPUT_2=a[1])
with ModelClient(url, "parameters", init_timeout_s=30) as client:
    scaled = client.infer_sample(
        np.array([6.0], dtype=np.float32), parameters={"multiplier": 2}, headers={"header_divisor": "3"}
    )
with ModelClient(url, "identity_bytes", init_timeout_s=30) as client:
    text = client.infer_sample(np.array([b"hi"], dtype=np.bytes_))
print(json.dumps({
    "sum": batch["OUTPUT_1"].tolist(),
    "diff": sample["OUTPUT_2"].tolist(),
    "scaled": scaled["scaled"].tolist(),
    "text": [item.decode() for item in text["text"].astype(bytes).tolist()],
}))
"""


@pytest.mark.skipif(not PYTRITON_PYTHON.exists(), reason="no benchmarks/.pytriton-venv with PyTriton installed")
def test_pytritons_own_model_client_against_pyserve(url: str) -> None:
    run = subprocess.run(
        [str(PYTRITON_PYTHON), "-c", PYTRITON_CLIENT, url], capture_output=True, text=True, timeout=90, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {
        "sum": [[11.0, 22.0], [33.0, 44.0]],
        "diff": [-2.0, -2.0],
        "scaled": [4.0],
        "text": ["hi"],
    }
