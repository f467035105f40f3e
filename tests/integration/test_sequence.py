"""Stateful models (sequence batching) on a real server, driven by Triton's own clients the way its sequence examples
(``simple_*sequence*`` over HTTP, gRPC and gRPC streams) drive Triton: the same models, requests and expected
values; many clients' sequences interleaved; implicit state over 1,000 steps; idle release; an instance that dies
mid-sequence; Triton's errors; statistics and metrics; a config.pbtxt model; perf_analyzer's sequence mode."""

from __future__ import annotations

import asyncio
import os
import queue
import random
import re
import textwrap
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import (
    ModelConfig,
    Request,
    SequenceBatcher,
    SequenceControl,
    SequenceState,
    Serve,
    ServeConfig,
    Tensor,
    sequence,
)

from .conftest import run_perf_analyzer

pytestmark = pytest.mark.integration

# Triton's examples send these after a first value (0, 100 or 20) and expect them back as the models compute them.
VALUES = [11, 7, 5, 3, 2, 0, 1]
INT_ID0, INT_ID1 = 1000, 1001
IO = {"inputs": [Tensor("INPUT", np.int32, (1,))], "outputs": [Tensor("OUTPUT", np.int32, (1,))]}
START_READY = (SequenceControl("START", "START"), SequenceControl("READY", "READY"))
START_END_READY = (*START_READY, SequenceControl("END", "END"))


# models ----------------------------------------------------------------------------------------------------------


def simple_sequence(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Triton's simple_sequence: OUTPUT = INPUT + START for a ready slot."""
    return [{"OUTPUT": (r["INPUT"] + r["START"]) * r["READY"]} for r in requests]


def simple_dyna_sequence(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Triton's simple_dyna_sequence: as simple_sequence, and the correlation ID added to the last request."""
    return [
        {"OUTPUT": (r["INPUT"] + r["START"] + r["END"] * r["CORRID"].astype(np.int32)) * r["READY"]} for r in requests
    ]


def simple_string_dyna_sequence(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Triton's simple_string_dyna_sequence: a running sum (from the first value, in implicit state), and the
    string correlation ID, read as a number, added to the last request."""
    outputs = []
    for r in requests:
        total = np.where(r["START"] == 1, r["INPUT"], r["ACC"] + r["INPUT"])
        ending = int(r["CORRID"][0, 0]) if r["END"][0, 0] else 0
        outputs.append({"OUTPUT": total + ending, "ACC_OUT": total})
    return outputs


@sequence
def running_sum(inputs: dict[str, np.ndarray], total: Any) -> tuple[dict[str, np.ndarray], Any]:
    """The accumulator, its state a Python value kept per sequence by @sequence."""
    total = inputs["INPUT"].astype(np.int64) + (0 if total is None else total)
    return {"OUTPUT": total.astype(np.int32)}, total


def implicit_sum(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """The accumulator, its state an implicit state tensor kept by the instance."""
    return [{"OUTPUT": r["TOTAL"] + r["INPUT"], "TOTAL_OUT": r["TOTAL"] + r["INPUT"]} for r in requests]


@sequence
def sum_or_die(inputs: dict[str, np.ndarray], total: Any) -> tuple[dict[str, np.ndarray], Any]:
    """The accumulator in a process instance that exits on the value -999."""
    if int(inputs["INPUT"][0, 0]) == -999:
        os._exit(7)
    total = inputs["INPUT"] + (0 if total is None else total)
    return {"OUTPUT": total}, total


REPOSITORY_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A running sum in implicit state, as a Triton Python-backend model."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "ACC").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            total = value + state
            assert bool(start[0, 0]) == bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            outputs = [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("ACC_OUT", total)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

REPOSITORY_CONFIG = """
backend: "python"
max_batch_size: 4
sequence_batching {
  oldest { max_candidate_sequences: 8 }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] } ]
  state [ { input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] data_file: "start" } } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def write_repository(root: Path) -> Path:
    model = root / "repo_sum"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(textwrap.dedent(REPOSITORY_MODEL))
    (model / "config.pbtxt").write_text(REPOSITORY_CONFIG)
    (model / "initial_state").mkdir()
    (model / "initial_state" / "start").write_bytes(np.array([1000], np.int32).tobytes())
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    repository = write_repository(tmp_path_factory.mktemp("sequence_repository"))
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0), model_repository=repository) as s:
        s.bind(
            "simple_sequence",
            simple_sequence,
            **IO,
            config=ModelConfig(max_batch_size=8, sequence_batcher=SequenceBatcher(control_inputs=START_READY)),
        )
        oldest = {"strategy": "oldest", "max_candidate_sequences": 16, "max_queue_delay_microseconds": 1000}
        s.bind(
            "simple_dyna_sequence",
            [simple_dyna_sequence, simple_dyna_sequence],
            **IO,
            config=ModelConfig(
                max_batch_size=8,
                instances=2,
                sequence_batcher=SequenceBatcher(
                    control_inputs=(*START_END_READY, SequenceControl("CORRID", "CORRID", np.uint64)), **oldest
                ),
            ),
        )
        s.bind(
            "simple_string_dyna_sequence",
            simple_string_dyna_sequence,
            **IO,
            config=ModelConfig(
                max_batch_size=8,
                sequence_batcher=SequenceBatcher(
                    control_inputs=(*START_END_READY, SequenceControl("CORRID", "CORRID", bytes)),
                    states=(SequenceState("ACC", "ACC_OUT", np.int32, (1,)),),
                    **oldest,
                ),
            ),
        )
        s.bind(
            "running_sum",
            [running_sum, running_sum],
            **IO,
            config=ModelConfig(
                max_batch_size=16,
                instances=2,
                sequence_batcher=SequenceBatcher(strategy="oldest", max_candidate_sequences=32),
            ),
        )
        s.bind(
            "pa_sum",
            running_sum,
            **IO,
            # perf_analyzer may pause a sequence between its measurements longer than the default 1 s on a busy
            # machine: a released sequence would fail its next request, as in Triton.
            config=ModelConfig(
                max_batch_size=8, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=60_000_000)
            ),
        )
        s.bind(
            "implicit_sum",
            implicit_sum,
            **IO,
            config=ModelConfig(
                max_batch_size=16,
                sequence_batcher=SequenceBatcher(states=(SequenceState("TOTAL", "TOTAL_OUT", np.int32, (1,)),)),
            ),
        )
        s.bind(
            "short_idle",
            running_sum,
            **IO,
            config=ModelConfig(
                max_batch_size=4, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=200_000)
            ),
        )
        for name, backlog in (("one_slot_queued", None), ("one_slot_refusing", 0)):
            s.bind(
                name,
                running_sum,
                **IO,
                config=ModelConfig(max_batch_size=1, sequence_batcher=SequenceBatcher(max_backlog_sequences=backlog)),
            )
        s.bind(
            "sum_or_die",
            sum_or_die,
            **IO,
            config=ModelConfig(max_batch_size=4, instances=2, worker="process", sequence_batcher=SequenceBatcher()),
        )
        yield s


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


Client = triton_http.InferenceServerClient | triton_grpc.InferenceServerClient


def inputs(client: Any, value: int) -> list[Any]:
    module = triton_http if isinstance(client, triton_http.InferenceServerClient) else triton_grpc
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    return [tensor]


def step(client: Client, model: str, sequence_id: int | str, value: int, start: bool = False, end: bool = False) -> int:
    result = client.infer(model, inputs(client, value), sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def run_sequence(client: Client, model: str, sequence_id: int | str, values: list[int]) -> list[int]:
    last = len(values) - 1
    return [step(client, model, sequence_id, v, i == 0, i == last) for i, v in enumerate(values)]


# What Triton's example clients expect of each model, for the values [first] + VALUES (or their negatives).
def expected_simple(first: int, sign: int) -> list[int]:
    return [first + 1] + [sign * v for v in VALUES]


def expected_dyna(first: int, sign: int, sequence_id: int) -> list[int]:
    return [first + 1] + [sign * v for v in VALUES[:-1]] + [sign * VALUES[-1] + sequence_id]


def expected_string_dyna(first: int, sequence_id: str) -> list[int]:
    totals = list(np.cumsum([first] + [-v for v in VALUES]))
    return [int(t) for t in totals[:-1]] + [int(totals[-1]) + int(sequence_id)]


def three_sequences(dyna: bool) -> list[tuple[str, int | str, list[int], list[int]]]:
    """The examples' three sequences: (model, sequence ID, values sent, outputs expected)."""
    negatives = [-v for v in VALUES]
    if dyna:
        string_id = "1002"
        return [
            ("simple_dyna_sequence", INT_ID0, [0, *VALUES], expected_dyna(0, 1, INT_ID0)),
            ("simple_dyna_sequence", INT_ID1, [100, *negatives], expected_dyna(100, -1, INT_ID1)),
            ("simple_string_dyna_sequence", string_id, [20, *negatives], expected_string_dyna(20, string_id)),
        ]
    string_id = str(uuid.uuid4())
    return [
        ("simple_sequence", INT_ID0, [0, *VALUES], expected_simple(0, 1)),
        ("simple_sequence", INT_ID1, [100, *negatives], expected_simple(100, -1)),
        ("simple_sequence", string_id, [20, *negatives], expected_simple(20, -1)),
    ]


# Triton's example clients ----------------------------------------------------------------------------------------


def test_the_config_shows_sequence_batching_as_triton_does(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient
) -> None:
    config = http.get_model_config("simple_dyna_sequence")
    assert "dynamic_batching" not in config
    batching = config["sequence_batching"]
    assert batching["oldest"] == {
        "max_candidate_sequences": 16,
        "preferred_batch_size": [8],
        "max_queue_delay_microseconds": 1000,
        "preserve_ordering": False,
    }
    assert batching["max_sequence_idle_microseconds"] == 1_000_000
    assert [c["name"] for c in batching["control_input"]] == ["START", "READY", "END", "CORRID"]
    assert batching["control_input"][3]["control"][0]["data_type"] == "TYPE_UINT64"
    grpc_batching = grpc.get_model_config("simple_dyna_sequence").config.sequence_batching
    assert grpc_batching.oldest.max_candidate_sequences == 16
    assert [(c.name, c.control[0].kind) for c in grpc_batching.control_input] == [
        ("START", 0),  # CONTROL_SEQUENCE_START
        ("READY", 1),
        ("END", 2),
        ("CORRID", 3),
    ]
    metadata = http.get_model_metadata("simple_dyna_sequence")
    assert [t["name"] for t in metadata["inputs"]] == ["INPUT"]  # control inputs are the server's


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sync_sequences(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient, protocol: str, dyna: bool
) -> None:
    client: Client = http if protocol == "http" else grpc
    for model, sequence_id, values, expected in three_sequences(dyna):
        assert run_sequence(client, model, sequence_id, values) == expected, (model, sequence_id)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_async_sequences_interleaved(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient, protocol: str
) -> None:
    # Each step of the three sequences goes out at once (async_infer); a sequence's next step after its last answer.
    sequences = three_sequences(dyna=True)
    results: list[list[int]] = [[] for _ in sequences]
    for index in range(len(VALUES) + 1):
        flags = {"sequence_start": index == 0, "sequence_end": index == len(VALUES)}
        if protocol == "http":
            handles = [
                http.async_infer(model, inputs(http, values[index]), sequence_id=sequence_id, **flags)
                for model, sequence_id, values, _ in sequences
            ]
            answers = [handle.get_result() for handle in handles]
        else:
            done: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
            for position, (model, sequence_id, values, _) in enumerate(sequences):
                grpc.async_infer(
                    model,
                    inputs(grpc, values[index]),
                    lambda result, error, position=position, done=done: done.put((position, result, error)),
                    sequence_id=sequence_id,
                    **flags,
                )
            collected = sorted((done.get(timeout=30) for _ in sequences), key=lambda item: item[0])
            assert all(error is None for _, _, error in collected), collected
            answers = [result for _, result, _ in collected]
        for result, answer in zip(results, answers, strict=True):
            result.append(int(answer.as_numpy("OUTPUT")[0, 0]))
    assert results == [expected for _, _, _, expected in sequences]


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
def test_sequences_over_a_grpc_stream(server: Serve, dyna: bool) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    sequences = three_sequences(dyna)
    with triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for model, sequence_id, values, _ in sequences:
            for index, value in enumerate(values):
                client.async_stream_infer(
                    model,
                    inputs(client, value),
                    request_id=f"{sequence_id}_{index}",
                    sequence_id=sequence_id,
                    sequence_start=index == 0,
                    sequence_end=index == len(values) - 1,
                )
        received = [answers.get(timeout=30) for _ in range(sum(len(values) for _, _, values, _ in sequences))]
        client.stop_stream()
    assert [error for _, error in received if error is not None] == []
    by_id: dict[str, dict[int, int]] = {}
    for result, _ in received:
        sequence_id, index = result.get_response().id.rsplit("_", 1)
        by_id.setdefault(sequence_id, {})[int(index)] = int(result.as_numpy("OUTPUT")[0, 0])
    for _, sequence_id, values, expected in sequences:
        assert [by_id[str(sequence_id)][i] for i in range(len(values))] == expected


def test_sequences_over_an_asyncio_grpc_stream(server: Serve) -> None:
    sequences = three_sequences(dyna=True)

    async def requests() -> Any:
        for model, sequence_id, values, _ in sequences:
            for index, value in enumerate(values):
                tensor = triton_grpc_aio.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
                yield {
                    "model_name": model,
                    "inputs": [tensor],
                    "request_id": f"{sequence_id}_{index}",
                    "sequence_id": sequence_id,
                    "sequence_start": index == 0,
                    "sequence_end": index == len(values) - 1,
                }

    async def stream() -> dict[str, dict[int, int]]:
        by_id: dict[str, dict[int, int]] = {}
        async with triton_grpc_aio.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                sequence_id, index = result.get_response().id.rsplit("_", 1)
                by_id.setdefault(sequence_id, {})[int(index)] = int(result.as_numpy("OUTPUT")[0, 0])
                if sum(len(v) for v in by_id.values()) == sum(len(values) for _, _, values, _ in sequences):
                    break
        return by_id

    by_id = asyncio.run(stream())
    for _, sequence_id, values, expected in sequences:
        assert [by_id[str(sequence_id)][i] for i in range(len(values))] == expected


# many clients, long sequences ------------------------------------------------------------------------------------


def test_interleaved_sequences_from_many_clients(server: Serve) -> None:
    clients, sequences_each, steps = 12, 2, 20
    failures: list[str] = []

    def client_thread(number: int) -> None:
        rng = random.Random(number)
        client: Client
        if number % 2:
            client = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        else:
            client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0)
        try:
            for index in range(sequences_each):
                sequence_id: int | str = number * 100 + index + 1 if index % 2 else f"client-{number}-{index}"
                values = [rng.randint(-50, 50) for _ in range(steps)]
                got = run_sequence(client, "running_sum", sequence_id, values)
                if got != [int(t) for t in np.cumsum(values)]:
                    failures.append(f"sequence {sequence_id}: {got}")
        except Exception as exc:
            failures.append(f"client {number}: {exc!r}")
        finally:
            client.close()

    threads = [threading.Thread(target=client_thread, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    (stats,) = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}").get_inference_statistics(
        "running_sum"
    )["model_stats"]
    # Sequences shared batches: fewer executions than requests.
    assert stats["inference_count"] >= clients * sequences_each * steps
    assert stats["execution_count"] < stats["inference_count"]


def test_implicit_state_across_1000_steps(http: triton_http.InferenceServerClient) -> None:
    rng = np.random.default_rng(7)
    values = rng.integers(-1000, 1000, size=1000).tolist()
    got = run_sequence(http, "implicit_sum", 77, values)
    assert got == [int(t) for t in np.cumsum(values)]


# idle release, errors, too many sequences ------------------------------------------------------------------------


def test_an_idle_sequence_is_released_with_a_clear_error(http: triton_http.InferenceServerClient) -> None:
    assert step(http, "short_idle", 5, 1, start=True) == 1
    assert step(http, "short_idle", 5, 2) == 3
    time.sleep(0.4)
    with pytest.raises(InferenceServerException) as caught:
        step(http, "short_idle", 5, 3)
    assert caught.value.status() == "400"
    assert "must specify the START flag" in str(caught.value)
    assert "released after it stayed idle longer than max_sequence_idle_microseconds (200000)" in str(caught.value)
    assert step(http, "short_idle", 5, 3, start=True, end=True) == 3


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritons_sequence_errors(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient, protocol: str
) -> None:
    client: Client = http if protocol == "http" else grpc
    with pytest.raises(InferenceServerException) as caught:
        client.infer("running_sum", inputs(client, 1))
    assert "inference request to model 'running_sum' must specify a non-zero or non-empty correlation ID" in str(
        caught.value
    )
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    with pytest.raises(InferenceServerException, match="must specify the START flag on the first request"):
        step(client, "running_sum", 424242, 1)
    module = triton_http if protocol == "http" else triton_grpc
    two_rows = module.InferInput("INPUT", [2, 1], "INT32")
    two_rows.set_data_from_numpy(np.ones((2, 1), np.int32))
    with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to requirements of sequence"):
        client.infer("running_sum", [two_rows], sequence_id=9, sequence_start=True)
    # A new START for a sequence still going ends it early: it starts over (Triton logs the conflict).
    assert step(client, "running_sum", 31337, 5, start=True) == 5
    assert step(client, "running_sum", 31337, 6) == 11
    assert step(client, "running_sum", 31337, 7, start=True) == 7
    assert step(client, "running_sum", 31337, 1, end=True) == 8


def test_too_many_sequences_are_refused_or_queued_as_configured(server: Serve) -> None:
    with triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0) as client:
        assert step(client, "one_slot_refusing", 1, 1, start=True) == 1
        with pytest.raises(InferenceServerException) as caught:
            step(client, "one_slot_refusing", 2, 1, start=True)
        assert caught.value.status() == "503"
        assert "every sequence slot is taken (1 on 1 instances)" in str(caught.value)
        assert step(client, "one_slot_refusing", 1, 1, end=True) == 2
        assert step(client, "one_slot_refusing", 2, 5, start=True, end=True) == 5

        assert step(client, "one_slot_queued", 1, 1, start=True) == 1
        waited: list[int] = []

        def second_sequence() -> None:
            with triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0) as other:
                waited.append(step(other, "one_slot_queued", 2, 9, start=True))

        second = threading.Thread(target=second_sequence)
        second.start()
        time.sleep(0.3)
        assert waited == []  # in the backlog until the first sequence ends
        assert step(client, "one_slot_queued", 1, 1, end=True) == 2
        second.join(10)
        assert waited == [9]
        assert step(client, "one_slot_queued", 2, 1, end=True) == 10


# an instance that dies -------------------------------------------------------------------------------------------


def test_an_instance_dying_mid_sequence_loses_only_its_sequences(http: triton_http.InferenceServerClient) -> None:
    # Two sequences, one on each process instance (a new sequence takes the instance with the most free slots).
    assert step(http, "sum_or_die", 1, 1, start=True) == 1
    assert step(http, "sum_or_die", 2, 10, start=True) == 10
    assert step(http, "sum_or_die", 1, 2) == 3
    with pytest.raises(InferenceServerException) as died:
        step(http, "sum_or_die", 1, -999)
    assert "died" in str(died.value) and "exit status 7" in str(died.value)
    with pytest.raises(InferenceServerException) as lost:
        step(http, "sum_or_die", 1, 3)
    assert "sequence 1 of model 'sum_or_die' was lost with its state" in str(lost.value)
    assert "start it again" in str(lost.value)
    assert lost.value.status() == "500"
    assert step(http, "sum_or_die", 2, 20) == 30  # the other instance's sequence goes on
    assert step(http, "sum_or_die", 1, 5, start=True) == 5  # started again, with a fresh state
    assert step(http, "sum_or_die", 1, 6, end=True) == 11
    assert step(http, "sum_or_die", 2, 1, end=True) == 31
    (stats,) = http.get_inference_statistics("sum_or_die")["model_stats"]
    assert stats["inference_stats"]["fail"]["count"] >= 1


# statistics and metrics ------------------------------------------------------------------------------------------


def test_statistics_and_metrics_count_every_step(server: Serve, http: triton_http.InferenceServerClient) -> None:
    (before,) = http.get_inference_statistics("implicit_sum")["model_stats"]
    run_sequence(http, "implicit_sum", 88, [1, 2, 3, 4, 5])
    deadline = time.monotonic() + 5
    while True:
        (after,) = http.get_inference_statistics("implicit_sum")["model_stats"]
        if after["inference_count"] - before["inference_count"] == 5 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    inference = after["inference_stats"]
    assert after["inference_count"] - before["inference_count"] == 5
    counts = {key: inference[key]["count"] for key in ("success", "queue", "compute_input", "compute_infer")}
    assert len(set(counts.values())) == 1, counts
    page = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    success = re.search(r'nv_inference_request_success\{model="implicit_sum",version="1"\} (\d+)', page)
    assert success is not None and int(success.group(1)) == inference["success"]["count"]
    assert re.search(r'nv_inference_pending_request_count\{model="implicit_sum",version="1"\} 0', page)


# a model repository ----------------------------------------------------------------------------------------------


def test_a_config_pbtxt_sequence_model_keeps_its_implicit_state(http: triton_http.InferenceServerClient) -> None:
    # initial_state from the model directory's initial_state/start: the running sum starts at 1000.
    assert run_sequence(http, "repo_sum", 5, [1, 2, 3]) == [1001, 1003, 1006]
    config = http.get_model_config("repo_sum")
    state = config["sequence_batching"]["state"][0]
    assert state["initial_state"][0]["data_file"] == "start"
    assert config["sequence_batching"]["oldest"]["preferred_batch_size"] == [4]


# perf_analyzer ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.slow)])
def test_perf_analyzer_sequence_mode_runs_clean(perf_analyzer: str, server: Serve, protocol: str) -> None:
    port = server.http_port if protocol == "http" else server.grpc_port
    output = run_perf_analyzer(
        perf_analyzer,
        port,
        "pa_sum",
        *("--sequence-length", "8", "--num-of-sequences", "4"),
        protocol=protocol,
        shape="INPUT:1",
        concurrency=(1, 4),
    )
    assert re.search(r"Sequence count: \d+", output), output
