"""pyserve.client's streaming clients against decoupled models: ``DecoupledModelClient`` and
``AsyncioDecoupledModelClient`` over gRPC (ModelStreamInfer) and HTTP (generate_stream)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.client import AsyncioDecoupledModelClient, ClientTimeoutError, DecoupledModelClient
from pyserve.errors import ModelExecutionError, ModelNotFoundError, UnsupportedError

from .conftest import fp32
from .repository_models import FREE_PORTS
from .test_streaming import STEP, progress, slow_chunks

pytestmark = pytest.mark.integration

PROTOCOLS = ("http", "grpc")
INIT_TIMEOUT_S = 30.0


def pause_after_first(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    """One response at once, the next one a second later."""
    yield [{"STEP": np.array([0], np.int32)} for _ in requests]
    time.sleep(1.0)
    yield [{"STEP": np.array([1], np.int32)} for _ in requests]


def echo_text_twice(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    """The text, then the text shouted."""
    yield [{"TEXT": request["TEXT"]} for request in requests]
    yield [{"TEXT": np.char.upper(request["TEXT"].astype(bytes)).astype(object)} for request in requests]


def fail_after_one(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    yield [{"STEP": np.array([0], np.int32)} for _ in requests]
    raise RuntimeError("the model broke after one response")


TEXT = Tensor("TEXT", bytes, (-1,))


@pytest.fixture(scope="module")
def stream_server() -> Iterator[Serve]:
    decoupled = ModelConfig(max_batch_size=0, decoupled=True)
    with Serve(ServeConfig(**FREE_PORTS)) as server:
        server.bind("count_slowly", slow_chunks, [fp32("INPUT0")], [STEP], decoupled)
        # A request that timed out still sleeps on its instance: enough of them that the next test's gets its own.
        paused = ModelConfig(max_batch_size=0, decoupled=True, instances=4)
        server.bind("pause_after_first", pause_after_first, [fp32("INPUT0")], [STEP], paused)
        server.bind("echo_text_twice", echo_text_twice, [TEXT], [TEXT], ModelConfig(max_batch_size=8, decoupled=True))
        server.bind("fail_after_one", fail_after_one, [fp32("INPUT0")], [STEP], decoupled)
        yield server


def url_of(server: Serve, protocol: str) -> str:
    return server.url if protocol == "http" else f"grpc://{server.grpc_address}"


def collect_async(url: str, model: str, method: str, *inputs: Any, **options: Any) -> list[dict[str, np.ndarray]]:
    """Every response of one AsyncioDecoupledModelClient call."""

    async def run() -> list[dict[str, np.ndarray]]:
        async with AsyncioDecoupledModelClient(url, model, init_timeout_s=INIT_TIMEOUT_S, **options) as client:
            return [response async for response in getattr(client, method)(*inputs)]

    return asyncio.run(run())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_streamed_responses_one_sample_and_a_batch(server: Serve, protocol: str) -> None:
    url = url_of(server, protocol)
    x = np.arange(3, dtype=np.float32)
    with DecoupledModelClient(url, "decoupled", init_timeout_s=INIT_TIMEOUT_S) as client:
        responses = list(client.infer_sample(x))
        assert [r["OUTPUT0"].tolist() for r in responses] == [x.tolist(), (x + 1).tolist()]
        if protocol == "grpc":
            rows = np.stack([x, x * 10])
            batches = list(client.infer_batch(rows))
            np.testing.assert_array_equal(batches[1]["OUTPUT0"], rows + 1)
        else:
            # generate_stream sends inputs flat: two rows of a variable dimension would arrive as one.
            with pytest.raises(UnsupportedError, match=r"server would read shape \[1, 6\].*grpc://"):
                client.infer_batch(np.stack([x, x]))
    responses = collect_async(url, "decoupled", "infer_sample", x)
    assert [r["OUTPUT0"].tolist() for r in responses] == [x.tolist(), (x + 1).tolist()]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_streamed_bytes(stream_server: Serve, protocol: str) -> None:
    url = url_of(stream_server, protocol)
    words = np.array([b"hello", b"caf\xc3\xa9"], dtype=object)
    with DecoupledModelClient(url, "echo_text_twice", init_timeout_s=INIT_TIMEOUT_S) as client:
        first, second = client.infer_sample(words)
    assert first["TEXT"].tolist() == [b"hello", b"caf\xc3\xa9"]
    assert second["TEXT"].tolist() == [b"HELLO", b"CAF\xc3\xa9"]
    (first, _) = collect_async(url, "echo_text_twice", "infer_batch", words[np.newaxis])
    assert first["TEXT"].shape == (1, 2)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_closing_the_iterator_cancels_the_request(stream_server: Serve, protocol: str) -> None:
    progress.reset()
    with DecoupledModelClient(url_of(stream_server, protocol), "count_slowly", init_timeout_s=INIT_TIMEOUT_S) as client:
        responses = client.infer_sample(np.ones(1, np.float32))
        steps = [int(next(responses)["STEP"][0]) for _ in range(3)]
        responses.close()  # as leaving a for loop early does
    assert steps == [0, 1, 2]
    assert progress.closed.wait(5)
    assert progress.steps < 30


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cancelling_the_task_cancels_the_request(stream_server: Serve, protocol: str) -> None:
    progress.reset()
    received: list[int] = []

    async def run() -> None:
        url = url_of(stream_server, protocol)
        async with AsyncioDecoupledModelClient(url, "count_slowly", init_timeout_s=INIT_TIMEOUT_S) as client:
            three = asyncio.Event()

            async def read(responses: AsyncIterator[dict[str, np.ndarray]]) -> None:
                async for response in responses:
                    received.append(int(response["STEP"][0]))
                    if len(received) == 3:
                        three.set()

            task = asyncio.ensure_future(read(client.infer_sample(np.ones(1, np.float32))))
            await asyncio.wait_for(three.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    assert received[:3] == [0, 1, 2]
    assert progress.closed.wait(5)
    assert progress.steps < 30


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_response_has_its_timeout(stream_server: Serve, protocol: str) -> None:
    url = url_of(stream_server, protocol)
    x = np.ones(1, np.float32)
    with DecoupledModelClient(
        url, "pause_after_first", init_timeout_s=INIT_TIMEOUT_S, inference_timeout_s=0.3
    ) as client:
        responses = client.infer_sample(x)
        assert int(next(responses)["STEP"][0]) == 0
        started = time.monotonic()
        with pytest.raises(ClientTimeoutError, match=r"stream from model 'pause_after_first'.*0\.3 s"):
            next(responses)
        assert time.monotonic() - started < 0.8
    started = time.monotonic()
    with pytest.raises(ClientTimeoutError, match="response"):
        collect_async(url, "pause_after_first", "infer_sample", x, inference_timeout_s=0.3)
    assert time.monotonic() - started < 0.9


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_stream_errors_come_back_as_pyserve_errors(stream_server: Serve, protocol: str) -> None:
    url = url_of(stream_server, protocol)
    with DecoupledModelClient(url, "fail_after_one", init_timeout_s=INIT_TIMEOUT_S) as client:
        responses = client.infer_sample(np.ones(1, np.float32))
        assert int(next(responses)["STEP"][0]) == 0
        with pytest.raises(ModelExecutionError, match="RuntimeError: the model broke after one response"):
            next(responses)
    with pytest.raises(ModelNotFoundError, match="no_such_model"):
        collect_async(url, "no_such_model", "infer_sample", np.ones(1, np.float32))
