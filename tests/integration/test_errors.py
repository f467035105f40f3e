"""Errors reach tritonclient as InferenceServerException with Triton's status codes and pyserve's message.

A model function that fails answers its batch with its exception's type and message (the traceback too with
``ServeConfig.debug_errors``) and is logged on the server with the traceback, once per batch; a declared output it
did not return is such a failure, unless the output is optional.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import DynamicBatcher, ModelConfig, Request, Serve, ServeConfig, Tensor

pytestmark = pytest.mark.integration


def make_input(name: str, data: np.ndarray, datatype: str = "FP32") -> triton_http.InferInput:
    infer_input = triton_http.InferInput(name, list(data.shape), datatype)
    infer_input.set_data_from_numpy(data)
    return infer_input


ROW = np.array([[1.0, 2.0, 3.0]], np.float32)


def infer_error(
    client: triton_http.InferenceServerClient, model: str, inputs: list[triton_http.InferInput], **kwargs: object
) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, inputs, **kwargs)
    return info.value


# unknown models and versions ---------------------------------------------------------------------------------


def test_unknown_model(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "no_such_model", [make_input("INPUT0", ROW)])
    assert error.status() == "404"
    assert "no_such_model" in error.message()
    for call in (client.get_model_metadata, client.get_model_config):
        with pytest.raises(InferenceServerException) as info:
            call("no_such_model")
        assert info.value.status() == "404"
        assert "no_such_model" in info.value.message()
    # Triton answers 400 (not 404) for statistics of an unknown model.
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("no_such_model")
    assert info.value.status() == "400"
    assert "no_such_model" in info.value.message()


def test_unknown_version(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", ROW)], model_version="7")
    assert error.status() == "404"
    assert "7" in error.message()
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("identity_fp32", model_version="7")
    assert info.value.status() == "404"
    with pytest.raises(InferenceServerException) as info:
        client.get_model_config("identity_fp32", model_version="abc")
    assert info.value.status() == "404"


# inputs that do not match the model ---------------------------------------------------------------------------


def test_wrong_datatype(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", ROW.astype(np.int32), "INT32")])
    assert error.status() == "400"
    assert error.message() == "input 'INPUT0': expected datatype FP32, got INT32"


def test_wrong_shape_without_batching(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "no_batch", [make_input("INPUT0", np.zeros((3, 2), np.int32), "INT32")])
    assert error.status() == "400"
    assert "expected shape [2,3]" in error.message() and "[3, 2]" in error.message()
    ok = client.infer("no_batch", [make_input("INPUT0", np.arange(6, dtype=np.int32).reshape(2, 3), "INT32")])
    np.testing.assert_array_equal(ok.as_numpy("OUTPUT0"), np.arange(6).reshape(2, 3) * 10)


def test_missing_batch_dimension(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", ROW[0])])
    assert error.status() == "400"
    assert "batch dimension" in error.message()


def test_missing_input(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "add_sub", [make_input("INPUT0", ROW)])
    assert error.status() == "400"
    assert "missing required input(s) ['INPUT1']" in error.message()


def test_extra_input(client: triton_http.InferenceServerClient) -> None:
    inputs = [make_input("INPUT0", ROW), make_input("INPUT1", ROW), make_input("INPUT2", ROW)]
    error = infer_error(client, "add_sub", inputs)
    assert error.status() == "400"
    assert "unexpected inference input 'INPUT2'" in error.message()


def test_batch_larger_than_max_batch_size(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", np.zeros((17, 2), np.float32))])
    assert error.status() == "400"
    assert "batch size 17 exceeds max_batch_size 16" in error.message()
    ok = client.infer("identity_fp32", [make_input("INPUT0", np.ones((16, 2), np.float32))])
    assert ok.as_numpy("OUTPUT0").shape == (16, 2)


def test_batch_sizes_of_inputs_must_agree(client: triton_http.InferenceServerClient) -> None:
    inputs = [make_input("INPUT0", np.zeros((2, 3), np.float32)), make_input("INPUT1", np.zeros((3, 3), np.float32))]
    error = infer_error(client, "add_sub", inputs)
    assert error.status() == "400"
    assert "batch size" in error.message()


def test_optional_input(client: triton_http.InferenceServerClient) -> None:
    only_required = client.infer("optional", [make_input("INPUT0", ROW)])
    np.testing.assert_array_equal(only_required.as_numpy("OUTPUT0"), ROW)
    assert only_required.as_numpy("HAD_INPUT1").tolist() == [[False]]
    both = client.infer("optional", [make_input("INPUT0", ROW), make_input("INPUT1", ROW * 10)])
    np.testing.assert_array_equal(both.as_numpy("OUTPUT0"), ROW * 11)
    assert both.as_numpy("HAD_INPUT1").tolist() == [[True]]
    error = infer_error(client, "optional", [make_input("INPUT1", ROW)])
    assert error.status() == "400"
    assert "INPUT0" in error.message()


def test_reserved_triton_parameter(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "identity_fp32", [make_input("INPUT0", ROW)], parameters={"triton_secret": 1})
    assert error.status() == "400"
    assert "triton_secret" in error.message() and "reserved" in error.message()


# the model's own failures -------------------------------------------------------------------------------------


def test_model_exception_is_500_with_type_and_message_and_server_recovers(
    client: triton_http.InferenceServerClient,
) -> None:
    error = infer_error(client, "raises", [make_input("INPUT0", np.array([[1.0, -2.5]], np.float32))])
    assert error.status() == "500"
    assert error.message() == "model 'raises' raised ValueError: negative input seen: -2.5"
    result = client.infer("raises", [make_input("INPUT0", ROW)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ROW)


def test_strict_model_wrong_output_dtype(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "strict_dtype", [make_input("INPUT0", ROW)])
    assert error.status() == "500"
    assert "output 'OUTPUT0'" in error.message()
    assert "float64" in error.message()


def test_strict_model_wrong_output_shape(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "strict_shape", [make_input("INPUT0", ROW)])
    assert error.status() == "500"
    assert "output 'OUTPUT0'" in error.message()
    assert "expected shape [-1, 3], got [1, 4]" in error.message()


def test_decoupled_model_over_http_infer_is_501(client: triton_http.InferenceServerClient) -> None:
    error = infer_error(client, "decoupled", [make_input("INPUT0", ROW)])
    assert error.status() == "501"
    assert "decoupled" in error.message()
    assert client.get_model_config("decoupled")["model_transaction_policy"] == {"decoupled": True}


# what the client gets and the server logs when the function fails ----------------------------------------------

FP32_IN = [Tensor("INPUT0", np.float32, (-1,))]
OUTPUT0 = Tensor("OUTPUT0", np.float32, (-1,))


def fail_on_negative(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    if any((request["INPUT0"] < 0).any() for request in requests):
        raise ValueError("negative input")
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


class FailEveryBatch:
    """Raises on every batch after noting its size (thread instances run in the test's process)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        self.sizes.append(len(requests))
        raise RuntimeError("out of memory")


fail_every_batch = FailEveryBatch()


def renamed_output(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Returns 'yy' where 'y' is declared."""
    return [{"yy": request["INPUT0"]} for request in requests]


def optional_extra(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Returns OUTPUT0, and the optional EXTRA only when the request's parameter 'extra' is set."""
    results = []
    for request in requests:
        outputs = {"OUTPUT0": request["INPUT0"]}
        if request.parameters.get("extra"):
            outputs["EXTRA"] = request["INPUT0"] * 2
        results.append(outputs)
    return results


def stream_without_token(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    """A decoupled model whose second response leaves out its declared TOKEN."""
    yield [{"STEP": np.array([0], np.int32), "TOKEN": np.array([b"t0"], object)} for _ in requests]
    yield [{"STEP": np.array([1], np.int32)} for _ in requests]


@pytest.fixture(scope="module")
def failing() -> Iterator[Serve]:
    batching = ModelConfig(max_batch_size=8)
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        serve.bind("fails", fail_on_negative, FP32_IN, [OUTPUT0], batching)
        # Four requests sent together fill a batch long before the delay runs out.
        per_batch = ModelConfig(max_batch_size=4, batcher=DynamicBatcher(max_queue_delay_microseconds=2_000_000))
        serve.bind("fails_per_batch", fail_every_batch, FP32_IN, [OUTPUT0], per_batch)
        serve.bind("renamed", renamed_output, FP32_IN, [Tensor("y", np.float32, (-1,))], batching)
        extra = Tensor("EXTRA", np.float32, (-1,), optional=True)
        serve.bind("optional_output", optional_extra, FP32_IN, [OUTPUT0, extra], batching)
        step, token = Tensor("STEP", np.int32, (1,)), Tensor("TOKEN", bytes, (1,))
        serve.bind("stream_missing", stream_without_token, FP32_IN, [step, token], ModelConfig(decoupled=True))
        yield serve


@pytest.fixture
def failing_client(failing: Serve) -> Iterator[triton_http.InferenceServerClient]:
    with triton_http.InferenceServerClient(
        f"127.0.0.1:{failing.http_port}", concurrency=4, network_timeout=30.0
    ) as client:
        yield client


def worker_errors(caplog: pytest.LogCaptureFixture, model: str) -> list[logging.LogRecord]:
    """The error records the instances of a model logged (thread instances log in this process)."""
    return [
        record
        for record in caplog.records
        if record.name == "pyserve.worker.instance" and vars(record).get("model") == model
    ]


def test_the_client_gets_type_and_message_and_the_server_logs_the_traceback(
    failing_client: triton_http.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    error = infer_error(failing_client, "fails", [make_input("INPUT0", -ROW)])
    assert error.status() == "500"
    assert error.message() == "model 'fails' raised ValueError: negative input"
    (record,) = worker_errors(caplog, "fails")
    assert record.levelno == logging.ERROR
    assert (vars(record)["version"], vars(record)["instance"]) == (1, 0)
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    logged = caplog.text
    assert "Traceback (most recent call last)" in logged and "in fail_on_negative" in logged
    assert "instance 0 of model 'fails' version 1 raised ValueError: negative input (batch of 1 requests)" in logged
    result = failing_client.infer("fails", [make_input("INPUT0", ROW)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ROW)


def test_a_failing_batch_is_logged_once_not_once_per_request(
    failing_client: triton_http.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    fail_every_batch.sizes.clear()
    pending = [failing_client.async_infer("fails_per_batch", [make_input("INPUT0", ROW)]) for _ in range(4)]
    for request in pending:
        with pytest.raises(InferenceServerException) as info:
            request.get_result()
        assert info.value.message() == "model 'fails_per_batch' raised RuntimeError: out of memory"
    assert sum(fail_every_batch.sizes) == 4 and len(fail_every_batch.sizes) < 4, fail_every_batch.sizes
    records = worker_errors(caplog, "fails_per_batch")
    assert [record.getMessage().rsplit("(", 1)[1] for record in records] == [
        f"batch of {size} requests)" for size in fail_every_batch.sizes
    ]


def test_a_declared_output_left_out_is_an_error_naming_it(
    failing_client: triton_http.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    error = infer_error(failing_client, "renamed", [make_input("INPUT0", ROW)])
    assert error.status() == "500"
    assert error.message() == "model 'renamed' did not return declared output 'y' (returned: 'yy'; undeclared: 'yy')"
    (record,) = worker_errors(caplog, "renamed")
    assert record.levelno == logging.ERROR and "did not return declared output 'y'" in record.getMessage()
    stats = failing_client.get_inference_statistics("renamed")["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == 0 and stats["fail"]["count"] == 1


def test_an_optional_output_may_be_left_out_unless_it_is_requested(
    failing_client: triton_http.InferenceServerClient,
) -> None:
    without = failing_client.infer("optional_output", [make_input("INPUT0", ROW)])
    assert [output["name"] for output in without.get_response()["outputs"]] == ["OUTPUT0"]
    both = failing_client.infer("optional_output", [make_input("INPUT0", ROW)], parameters={"extra": True})
    np.testing.assert_array_equal(both.as_numpy("EXTRA"), ROW * 2)
    requested = [triton_http.InferRequestedOutput("EXTRA")]
    error = infer_error(failing_client, "optional_output", [make_input("INPUT0", ROW)], outputs=requested)
    assert error.status() == "500"
    assert error.message() == "model 'optional_output' did not return requested output 'EXTRA' (returned: 'OUTPUT0')"
    # Triton's ModelOutput has no 'optional': the model config keeps its shape.
    assert [sorted(output) for output in failing_client.get_model_config("optional_output")["output"]] == [
        ["data_type", "dims", "is_non_linear_format_io", "is_shape_tensor", "label_filename", "name"]
    ] * 2


def test_a_streamed_response_without_a_declared_output_ends_the_stream_with_an_error(failing: Serve) -> None:
    events: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{failing.grpc_port}")
    client.start_stream(lambda result, error: events.put((result, error)))
    try:
        infer_input = triton_grpc.InferInput("INPUT0", [1], "FP32")
        infer_input.set_data_from_numpy(np.zeros(1, np.float32))
        client.async_stream_infer("stream_missing", [infer_input])
        result, error = events.get(timeout=30)
        assert error is None and result.as_numpy("STEP").tolist() == [0]
        result, error = events.get(timeout=30)
        assert result is None and error is not None
        assert error.message() == "model 'stream_missing' did not return declared output 'TOKEN' (returned: 'STEP')"
    finally:
        client.stop_stream()
        client.close()


def test_debug_errors_sends_the_traceback_from_thread_and_process_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSERVE_DEBUG_ERRORS", "1")
    config = ServeConfig.from_env(http_port=0, grpc_port=0, metrics_port=0)
    assert config.debug_errors is True
    with Serve(config) as serve:
        serve.bind("in_thread", fail_on_negative, FP32_IN, [OUTPUT0], ModelConfig(max_batch_size=8))
        serve.bind("in_process", fail_on_negative, FP32_IN, [OUTPUT0], ModelConfig(max_batch_size=8, worker="process"))
        with triton_http.InferenceServerClient(f"127.0.0.1:{serve.http_port}", network_timeout=30.0) as client:
            for model in ("in_thread", "in_process"):
                message = infer_error(client, model, [make_input("INPUT0", -ROW)]).message()
                assert message.startswith(f"model '{model}' raised ValueError: negative input\nTraceback"), message
                assert "test_errors.py" in message and "in fail_on_negative" in message
                result = client.infer(model, [make_input("INPUT0", ROW)])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ROW)


def test_a_process_instance_logs_the_traceback_to_the_servers_standard_error(capfd: pytest.CaptureFixture[str]) -> None:
    # Started in the test's call phase, the core and its worker processes write to the stderr capfd reads.
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, log_format="json")) as serve:
        serve.bind("in_process", fail_on_negative, FP32_IN, [OUTPUT0], ModelConfig(max_batch_size=8, worker="process"))
        with triton_http.InferenceServerClient(f"127.0.0.1:{serve.http_port}", network_timeout=30.0) as client:
            capfd.readouterr()
            error = infer_error(client, "in_process", [make_input("INPUT0", -ROW)])
            assert error.message() == "model 'in_process' raised ValueError: negative input"
            lines: list[dict[str, Any]] = []
            deadline = time.monotonic() + 5.0
            while not lines and time.monotonic() < deadline:
                text = capfd.readouterr().err
                lines += [json.loads(line) for line in text.splitlines() if '"pyserve.worker.instance"' in line]
                time.sleep(0.05)
            (line,) = lines
            assert line["level"] == "ERROR"
            assert (line["model"], line["version"], line["instance"]) == ("in_process", 1, 0)
            assert "Traceback (most recent call last)" in line["exception"]
            assert "ValueError: negative input" in line["exception"]
            result = client.infer("in_process", [make_input("INPUT0", ROW)])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ROW)
