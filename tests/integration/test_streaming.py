"""Decoupled (streaming) models over gRPC ModelStreamInfer and HTTP generate / generate_stream (SSE)."""

from __future__ import annotations

import asyncio
import http.client
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
from tritonclient.utils import InferenceServerException

from pyserve import DynamicBatcher, ModelConfig, Request, Serve, ServeConfig, Tensor, batch

pytestmark = pytest.mark.integration

CHUNKS = 100
STREAM_TIMEOUT_S = 30


# models --------------------------------------------------------------------------------------------------------


def chunks(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray] | None]]:
    """Yields ``chunks`` (a parameter, default 100) responses per request: the step number and a token."""
    counts = [int(r.parameters.get("chunks", CHUNKS)) for r in requests]
    for step in range(max(counts)):
        yield [
            {"STEP": np.array([step], np.int32), "TOKEN": np.array([f"tok{step}".encode()], object)}
            if step < count
            else None
            for count in counts
        ]


@batch
def plus_step(INPUT0: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
    """A batched generator: every yield is split back into one response per request."""
    for step in range(3):
        yield {"OUTPUT0": INPUT0 + step}


def fail_midway(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for step in range(3):
        yield [{"STEP": np.array([step], np.int32)} for _ in requests]
    raise RuntimeError("the model broke after 3 chunks")


class Progress:
    """What the cancellable model did, read by the test from the same process (thread workers)."""

    def __init__(self) -> None:
        self.steps = 0
        self.closed = threading.Event()
        self.started = threading.Event()

    def reset(self) -> None:
        self.steps = 0
        self.closed.clear()
        self.started.clear()


progress = Progress()


def slow_chunks(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    """100 chunks, 10 ms apart, counting each; a close (cancellation) is recorded."""
    progress.started.set()
    try:
        for step in range(CHUNKS):
            progress.steps += 1
            yield [{"STEP": np.array([step], np.int32)} for _ in requests]
            time.sleep(0.01)
    finally:
        progress.closed.set()


def words(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray] | None]]:
    """Streams the words of ``text_input`` one by one, as ``text_output``."""
    texts = [r["text_input"].reshape(-1)[0].decode().split() for r in requests]
    for index in range(max(len(t) for t in texts)):
        yield [
            {"text_output": np.array([[t[index].encode()]], object), "index": np.array([[index]], np.int32)}
            if index < len(t)
            else None
            for t in texts
        ]
    if any("boom" in t for t in texts):
        raise ValueError("boom was said")


def shout(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    out = []
    for request in requests:
        text = request["text_input"].reshape(-1)[0].decode()
        repeat = int(request.parameters.get("repeat", 1))
        out.append({"text_output": np.array([[(text.upper() + "!") * repeat]], object)})
    return out


STEP = Tensor("STEP", np.int32, (1,))
TOKEN = Tensor("TOKEN", bytes, (1,))
TEXT_IN = Tensor("text_input", bytes, (1,))
TEXT_OUT = Tensor("text_output", bytes, (1,))


@pytest.fixture(scope="module")
def stream_server() -> Iterator[Serve]:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    decoupled = ModelConfig(max_batch_size=0, decoupled=True)
    x = Tensor("INPUT0", np.float32, (-1,))
    s.bind("chunks", chunks, inputs=[x], outputs=[STEP, TOKEN], config=decoupled)
    s.bind(
        "plus_step",
        plus_step,
        inputs=[x],
        outputs=[Tensor("OUTPUT0", np.float32, (-1,))],
        config=ModelConfig(
            max_batch_size=8, decoupled=True, batcher=DynamicBatcher(max_queue_delay_microseconds=20_000)
        ),
    )
    s.bind("fail_midway", fail_midway, inputs=[x], outputs=[STEP], config=decoupled)
    s.bind("slow_chunks", slow_chunks, inputs=[x], outputs=[STEP], config=decoupled)
    s.bind(
        "words",
        words,
        inputs=[TEXT_IN],
        outputs=[TEXT_OUT, Tensor("index", np.int32, (1,))],
        config=ModelConfig(max_batch_size=4, decoupled=True),
    )
    s.bind("shout", shout, inputs=[TEXT_IN], outputs=[TEXT_OUT], config=ModelConfig(max_batch_size=4))
    try:
        s.run()
        yield s
    finally:
        s.stop()


# gRPC helpers --------------------------------------------------------------------------------------------------

Event = tuple[Any, InferenceServerException | None]


class Stream:
    """tritonclient's sync stream, with its callbacks collected in a queue."""

    def __init__(self, server: Serve) -> None:
        self.client = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        self.events: queue.Queue[Event] = queue.Queue()
        self.client.start_stream(lambda result, error: self.events.put((result, error)))

    def send(self, model: str, data: np.ndarray | None = None, **options: Any) -> None:
        data = np.zeros(1, np.float32) if data is None else data
        inputs = [triton_grpc.InferInput("INPUT0", list(data.shape), "FP32")]
        inputs[0].set_data_from_numpy(data)
        self.client.async_stream_infer(model, inputs, **options)

    def next(self) -> Event:
        return self.events.get(timeout=STREAM_TIMEOUT_S)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(stream_server: Serve) -> Iterator[Stream]:
    s = Stream(stream_server)
    try:
        yield s
    finally:
        s.close(cancel=True)


def final_flag(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


# gRPC streaming ------------------------------------------------------------------------------------------------


def test_a_stream_of_100_chunks_with_the_empty_final_response(stream: Stream) -> None:
    stream.send("chunks", request_id="a", enable_empty_final_response=True)
    for step in range(CHUNKS):
        result, error = stream.next()
        assert error is None
        response = result.get_response()
        assert response.id == "a" and response.model_name == "chunks" and response.model_version == "1"
        assert result.as_numpy("STEP").tolist() == [step]
        assert result.as_numpy("TOKEN").tolist() == [f"tok{step}".encode()]
        assert not final_flag(result)
    result, error = stream.next()
    assert error is None
    response = result.get_response()
    assert final_flag(result) and not response.outputs and not response.raw_output_contents
    assert response.id == "a" and response.model_version == ""  # as the request gave it
    assert stream.events.empty()


def test_many_requests_on_one_stream_are_told_apart_by_id(stream: Stream) -> None:
    for index in range(5):
        stream.send("chunks", request_id=f"r{index}", parameters={"chunks": 4 + index})
    seen: dict[str, list[int]] = {}
    for _ in range(sum(4 + index for index in range(5))):
        result, error = stream.next()
        assert error is None
        seen.setdefault(result.get_response().id, []).extend(result.as_numpy("STEP").tolist())
    assert seen == {f"r{index}": list(range(4 + index)) for index in range(5)}
    # Without triton_enable_empty_final_response no flag-only response follows.
    time.sleep(0.1)
    assert stream.events.empty()


def test_an_error_midway_arrives_as_error_message_and_the_stream_stays_usable(stream: Stream) -> None:
    stream.send("fail_midway", request_id="bad")
    steps = []
    for _ in range(3):
        result, error = stream.next()
        assert error is None
        steps.extend(result.as_numpy("STEP").tolist())
    assert steps == [0, 1, 2]
    result, error = stream.next()
    assert result is None and error is not None
    assert "the model broke after 3 chunks" in error.message()
    # The same stream carries the next request.
    stream.send("chunks", request_id="after", parameters={"chunks": 2})
    assert [stream.next()[0].as_numpy("STEP").tolist() for _ in range(2)] == [[0], [1]]
    # A request that fails validation is answered on the stream too.
    stream.send("no_such_model", request_id="lost")
    result, error = stream.next()
    assert result is None and "no_such_model" in error.message()


def test_batched_generator_splits_each_yield_per_request(stream: Stream) -> None:
    for index in range(4):
        stream.send("plus_step", np.full((1, 2), 10.0 * index, np.float32), request_id=str(index))
    got: dict[str, list[float]] = {}
    for _ in range(4 * 3):
        result, error = stream.next()
        assert error is None
        got.setdefault(result.get_response().id, []).extend(result.as_numpy("OUTPUT0").reshape(-1).tolist())
    assert got == {str(index): [10.0 * index + step for step in range(3) for _ in range(2)] for index in range(4)}


def test_a_non_decoupled_model_on_a_stream_answers_once_flagged_final(stream_server: Serve) -> None:
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{stream_server.grpc_port}")
    events: queue.Queue[Event] = queue.Queue()
    client.start_stream(lambda result, error: events.put((result, error)))
    try:
        text = triton_grpc.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"hi"]], object))
        client.async_stream_infer("shout", [text], request_id="s", enable_empty_final_response=True)
        result, error = events.get(timeout=STREAM_TIMEOUT_S)
        assert error is None and final_flag(result)
        assert result.as_numpy("text_output").tolist() == [[b"HI!"]]
    finally:
        client.stop_stream()
        client.close()
    assert events.empty()


def test_asyncio_client_streams_100_chunks(stream_server: Serve) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        for request_id in ("x", "y"):
            infer_input = triton_grpc_aio.InferInput("INPUT0", [1], "FP32")
            infer_input.set_data_from_numpy(np.zeros(1, np.float32))
            yield {"model_name": "chunks", "inputs": [infer_input], "request_id": request_id}

    async def main() -> dict[str, list[int]]:
        client = triton_grpc_aio.InferenceServerClient(f"127.0.0.1:{stream_server.grpc_port}")
        seen: dict[str, list[int]] = {}
        try:
            responses = client.stream_infer(requests())
            async for result, error in responses:
                assert error is None
                seen.setdefault(result.get_response().id, []).extend(result.as_numpy("STEP").tolist())
                if sum(len(steps) for steps in seen.values()) == 2 * CHUNKS:
                    break
        finally:
            await client.close()
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), STREAM_TIMEOUT_S))
    assert seen == {"x": list(range(CHUNKS)), "y": list(range(CHUNKS))}


# cancellation --------------------------------------------------------------------------------------------------


def wait_until_closed(deadline_s: float) -> float:
    """Seconds until the generator was closed (inf if it was not within ``deadline_s``)."""
    started = time.monotonic()
    if progress.closed.wait(deadline_s):
        return time.monotonic() - started
    return float("inf")


def assert_generator_stopped(steps_at_cancel: int) -> None:
    waited = wait_until_closed(0.1)
    steps_when_closed = progress.steps
    time.sleep(0.3)
    # Counter-based: the function made little progress after the cancel (at most the 100 ms the close may take, at
    # 10 ms a chunk: under CPU load the cancel takes a few chunks to arrive) and none after it was closed.
    assert progress.steps == steps_when_closed, "the generator kept running after it was closed"
    assert steps_when_closed <= steps_at_cancel + 10, (steps_at_cancel, steps_when_closed)
    assert steps_when_closed < CHUNKS
    assert waited <= 0.1, f"the generator was not closed within 100 ms of the cancel (waited {waited:.3f} s)"


def test_cancelling_a_stream_stops_the_generator(stream_server: Serve) -> None:
    progress.reset()
    stream = Stream(stream_server)
    try:
        stream.send("slow_chunks", request_id="c")
        for _ in range(3):
            _, error = stream.next()
            assert error is None
        steps_at_cancel = progress.steps
        stream.close(cancel=True)
        assert_generator_stopped(steps_at_cancel)
    finally:
        stream.close(cancel=True)


def test_a_client_that_drops_the_stream_stops_the_generator(stream_server: Serve) -> None:
    progress.reset()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        infer_input = triton_grpc_aio.InferInput("INPUT0", [1], "FP32")
        infer_input.set_data_from_numpy(np.zeros(1, np.float32))
        yield {"model_name": "slow_chunks", "inputs": [infer_input], "request_id": "d"}

    async def main() -> int:
        client = triton_grpc_aio.InferenceServerClient(f"127.0.0.1:{stream_server.grpc_port}")
        try:
            received = 0
            async for _, error in client.stream_infer(requests()):
                assert error is None
                received += 1
                if received == 3:
                    break
            return progress.steps
        finally:
            await client.close()  # the channel goes away with the call still open

    steps_at_cancel = asyncio.run(asyncio.wait_for(main(), STREAM_TIMEOUT_S))
    assert_generator_stopped(steps_at_cancel)


# HTTP generate / generate_stream -------------------------------------------------------------------------------


class Reply:
    """A whole HTTP response (http.client reads chunked bodies, as SSE streams are sent)."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.content_type = response.getheader("content-type")
        self.chunked = response.getheader("transfer-encoding") == "chunked"
        self.body = response.read()

    def json(self) -> Any:
        return orjson.loads(self.body)


def post(server: Serve, path: str, doc: Any) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=STREAM_TIMEOUT_S)
    try:
        conn.request("POST", path, orjson.dumps(doc), {"Content-Type": "application/json"})
        return Reply(conn.getresponse())
    finally:
        conn.close()


def sse_events(response: Reply) -> list[Any]:
    assert response.chunked
    body = response.body.decode()
    assert body.endswith("\n\n")
    events = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        events.append(orjson.loads(block[len("data: ") :]))
    return events


def test_generate_maps_keys_to_inputs_and_parameters(stream_server: Serve) -> None:
    response = post(stream_server, "/v2/models/shout/generate", {"text_input": "hey", "parameters": {"repeat": 2}})
    assert response.status == 200
    assert response.content_type == "application/json"
    # One-element outputs are JSON scalars.
    assert response.json() == {"model_name": "shout", "model_version": "1", "text_output": "HEY!HEY!"}
    versioned = post(stream_server, "/v2/models/shout/versions/1/generate", {"text_input": "a", "repeat": 1})
    assert versioned.json()["text_output"] == "A!"


def test_generate_errors(stream_server: Serve) -> None:
    reserved = post(stream_server, "/v2/models/shout/generate", {"text_input": "a", "triton_x": 1})
    assert reserved.status == 400 and "triton_x" in reserved.json()["error"]
    not_scalar = post(stream_server, "/v2/models/shout/generate", {"text_input": "a", "bad": {"nested": 1}})
    assert not_scalar.status == 400
    missing = post(stream_server, "/v2/models/shout/generate", {"parameters": {"repeat": 1}})
    assert missing.status == 400 and "text_input" in missing.json()["error"]
    unknown = post(stream_server, "/v2/models/nope/generate", {"text_input": "a"})
    assert unknown.status == 404
    several = post(stream_server, "/v2/models/words/generate", {"text_input": "two words"})
    assert several.status == 500 and "exactly 1 response" in several.json()["error"]
    one = post(stream_server, "/v2/models/words/generate", {"text_input": "single"})
    assert one.status == 200 and one.json()["text_output"] == "single"


def test_generate_stream_sends_one_event_per_response(stream_server: Serve) -> None:
    response = post(stream_server, "/v2/models/words/generate_stream", {"text_input": "the quick brown fox"})
    assert response.status == 200
    assert response.content_type == "text/event-stream; charset=utf-8"
    events = sse_events(response)
    assert [event["text_output"] for event in events] == ["the", "quick", "brown", "fox"]
    assert [event["index"] for event in events] == [0, 1, 2, 3]
    assert all(event["model_name"] == "words" and event["model_version"] == "1" for event in events)


def test_generate_stream_error_midway_is_an_error_event(stream_server: Serve) -> None:
    response = post(stream_server, "/v2/models/words/generate_stream", {"text_input": "say boom"})
    assert response.status == 200
    events = sse_events(response)
    assert [event.get("text_output") for event in events[:2]] == ["say", "boom"]
    assert "boom was said" in events[2]["error"]
    # The connection-level protocol stays sound: the next request on a new connection works.
    assert post(stream_server, "/v2/models/shout/generate", {"text_input": "ok"}).status == 200


def test_generate_stream_on_a_non_decoupled_model_and_decoupled_on_infer(stream_server: Serve) -> None:
    events = sse_events(post(stream_server, "/v2/models/shout/generate_stream", {"text_input": "one"}))
    assert events == [{"model_name": "shout", "model_version": "1", "text_output": "ONE!"}]
    doc = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]}
    response = post(stream_server, "/v2/models/words/infer", doc)
    assert response.status == 501
    assert "decoupled" in response.json()["error"]


def test_generate_stream_pipelined_on_one_connection(stream_server: Serve) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", stream_server.http_port, timeout=STREAM_TIMEOUT_S)
    for text in ("a b", "c d e"):
        conn.request("POST", "/v2/models/words/generate_stream", orjson.dumps({"text_input": text}))
        events = sse_events(Reply(conn.getresponse()))
        assert [event["text_output"] for event in events] == text.split()
    conn.close()
