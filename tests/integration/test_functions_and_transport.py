"""Function kinds, decorators and batching through a real server; the tcp:// transport; the demo CLI."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton_http

from pyserve import (
    DynamicBatcher,
    ModelConfig,
    Request,
    Serve,
    ServeConfig,
    Tensor,
    batch,
    current_model,
    first_value,
    sample,
)
from pyserve.transport.shm import SHM_DIR

pytestmark = pytest.mark.integration


async def async_double(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    await asyncio.sleep(0)
    return [{"OUTPUT0": request["INPUT0"] * 2} for request in requests]


@batch
@first_value("scale")
def scaled(INPUT0: np.ndarray, scale: np.float32) -> dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0 * scale}


@sample
def describe(INPUT0: np.ndarray) -> dict[str, np.ndarray]:
    model = current_model()
    return {"OUTPUT0": np.array([f"{model.name}:{model.instance}:{INPUT0.shape[0]}".encode()], dtype=object)}


seen_batch_rows: list[int] = []


@batch
def record_rows(INPUT0: np.ndarray) -> dict[str, np.ndarray]:
    seen_batch_rows.append(int(INPUT0.shape[0]))
    return {"OUTPUT0": INPUT0 + 1}


def fp32(name: str, shape: tuple[int, ...] = (-1,)) -> Tensor:
    return Tensor(name, np.float32, shape)


@pytest.fixture(scope="module")
def tcp_server() -> Iterator[Serve]:
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, transport="tcp"))
    server.bind("async_double", async_double, [fp32("INPUT0")], [fp32("OUTPUT0")], ModelConfig(max_batch_size=8))
    server.bind(
        "scaled",
        scaled,
        [fp32("INPUT0"), fp32("scale", (1,))],
        [fp32("OUTPUT0")],
        ModelConfig(max_batch_size=8),
    )
    server.bind(
        "describe",
        [describe, describe],
        [fp32("INPUT0")],
        [Tensor("OUTPUT0", bytes, (1,))],
        ModelConfig(max_batch_size=0),
    )
    server.bind(
        "record_rows",
        record_rows,
        [fp32("INPUT0", (4,))],
        [fp32("OUTPUT0", (4,))],
        ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=20_000)),
    )
    with server:
        yield server


def infer(server: Serve, model: str, **arrays: np.ndarray) -> triton_http.InferResult:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    inputs = []
    for name, array in arrays.items():
        tensor = triton_http.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        return client.infer(model, inputs)
    finally:
        client.close()


def test_tcp_transport_serves_an_async_function(tcp_server: Serve) -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = infer(tcp_server, "async_double", INPUT0=data)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)


def test_tcp_transport_carries_large_tensors(tcp_server: Serve) -> None:
    data = np.random.default_rng(0).standard_normal((2, 200_000)).astype(np.float32)
    result = infer(tcp_server, "async_double", INPUT0=data)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)


def test_batch_with_first_value_through_the_server(tcp_server: Serve) -> None:
    data = np.ones((3, 2), dtype=np.float32)
    scale = np.full((3, 1), 4.0, dtype=np.float32)
    result = infer(tcp_server, "scaled", INPUT0=data, scale=scale)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 4)


def test_current_model_inside_a_sample_function(tcp_server: Serve) -> None:
    result = infer(tcp_server, "describe", INPUT0=np.zeros(5, dtype=np.float32))
    (text,) = result.as_numpy("OUTPUT0")
    name, instance, rows = text.decode().split(":")
    assert (name, rows) == ("describe", "5")
    assert instance in ("0", "1")


def test_concurrent_requests_are_batched_by_rows(tcp_server: Serve) -> None:
    seen_batch_rows.clear()
    results: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(8)

    def call(index: int) -> None:
        data = np.full((2, 4), index, dtype=np.float32)
        barrier.wait(10)
        results[index] = infer(tcp_server, "record_rows", INPUT0=data).as_numpy("OUTPUT0")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for index in range(8):
        np.testing.assert_array_equal(results[index], np.full((2, 4), index + 1, dtype=np.float32))
    assert sum(seen_batch_rows) == 16
    assert max(seen_batch_rows) > 2, f"no two requests were batched together: {seen_batch_rows}"
    stats = triton_http.InferenceServerClient(f"127.0.0.1:{tcp_server.http_port}").get_inference_statistics(
        "record_rows"
    )["model_stats"][0]
    assert stats["inference_count"] == 16
    assert stats["execution_count"] == len(seen_batch_rows)


def test_demo_cli_serves_and_stops_on_ctrl_c() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "pyserve.cli", "demo", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A shell's background job inherits SIGINT ignored; the CLI must still stop on it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        match = re.search(r"serving on http://127\.0\.0\.1:(\d+)", first)
        assert match, first
        port = int(match.group(1))
        client = triton_http.InferenceServerClient(f"127.0.0.1:{port}")
        a = np.array([[1, 2, 3]], dtype=np.float32)
        inputs = [triton_http.InferInput("INPUT0", [1, 3], "FP32"), triton_http.InferInput("INPUT1", [1, 3], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a * 10)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 11)
        mlp = triton_http.InferInput("x", [4, 64], "FP32")
        mlp.set_data_from_numpy(np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32))
        probs = client.infer("mlp", [mlp]).as_numpy("probs")
        np.testing.assert_allclose(probs.sum(axis=1), np.ones(4), rtol=1e-5)
        client.close()
        process.send_signal(signal.SIGINT)
        assert process.wait(15) == 0
        printed = first + process.stdout.read()
        assert "curl -s -X POST" in printed and "tritonclient" in printed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
    leftovers = [name for name in os.listdir(SHM_DIR) if name.startswith(f"pyserve-{process.pid}-")]
    assert leftovers == []
