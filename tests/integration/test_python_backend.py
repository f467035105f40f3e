"""The Python backend on a real server: Triton Python-backend models (tests/data/python_models) served unchanged in
process instances — add_sub, decoupled models streaming from threads and from asyncio tasks, BLS (sync, async,
streaming, failing), error responses, initialize's args, finalize — and a pyserve-form model.py; checked with
Triton's HTTP and gRPC clients."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from pyserve import ModelConfig, Serve, ServeConfig, Tensor
from pyserve.backends import BackendModel, backend
from pyserve.backends import python as python_backend
from pyserve.config import ModelSpec
from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2
from pyserve.repository.config_document import config_json

from .conftest import triton_grpc_for, triton_http_for

pytestmark = pytest.mark.integration

MODELS = Path(__file__).resolve().parents[1] / "data" / "python_models"
STREAM_TIMEOUT_S = 10
FINAL = "triton_final_response"
# The InferInput of Triton's HTTP or gRPC client.
InferInput = TypeVar("InferInput", triton_http.InferInput, triton_grpc.InferInput)


def fp32(name: str, shape: tuple[int, ...] = (-1,)) -> Tensor:
    return Tensor(name, np.float32, shape)


def int32(name: str, shape: tuple[int, ...] = (-1,)) -> Tensor:
    return Tensor(name, np.int32, shape)


# The configuration add_sub is given, as the repository hands it over (Triton's JSON form): its initialize() reads
# the output datatypes from it, so OUTPUT1 comes back INT32 only if the model parsed it.
ADD_SUB_CONFIG = {
    "name": "add_sub",
    "backend": "python",
    "max_batch_size": 8,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [-1]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [-1]},
    ],
    "dynamic_batching": {},
}


def bind_python_model(
    server: Serve,
    name: str,
    inputs: list[Tensor],
    outputs: list[Tensor],
    config: ModelConfig,
    config_json: dict[str, Any] | None = None,
    strict: bool = False,
) -> None:
    """Bind tests/data/python_models/<name>/1/model.py through the Python backend, in a process instance."""
    config = dataclasses.replace(config, worker="process")
    spec = ModelSpec(name, 1, tuple(inputs), tuple(outputs), config, strict)
    model_dir = MODELS / name
    model = BackendModel(
        spec=spec,
        model_file=model_dir / "1" / "model.py",
        version_dir=model_dir / "1",
        model_dir=model_dir,
        repository=MODELS,
        config_json=config_json or {},
    )
    server.bind(name, python_backend.create(model), inputs, outputs, config=config, strict=strict)


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as s:
        add_sub_inputs, add_sub_outputs, add_sub_config = described("add_sub")
        bind_python_model(s, "add_sub", add_sub_inputs, add_sub_outputs, add_sub_config, ADD_SUB_CONFIG, strict=True)
        decoupled = ModelConfig(decoupled=True)
        bind_python_model(s, "repeat", [int32("IN", (1,))], [int32("OUT", (1,))], decoupled)
        bind_python_model(s, "square_async", [int32("IN", (1,))], [int32("OUT", (1,))], decoupled)
        batching = ModelConfig(max_batch_size=8)
        bind_python_model(
            s,
            "bls_sync",
            [Tensor("MODEL_NAME", bytes, (1,)), fp32("INPUT0"), fp32("INPUT1")],
            [fp32("OUTPUT0"), int32("OUTPUT1"), int32("STREAMED")],
            batching,
        )
        bind_python_model(
            s,
            "bls_async",
            [fp32("INPUT0"), fp32("INPUT1")],
            [fp32("OUTPUT0"), int32("OUTPUT1"), int32("SQUARES")],
            batching,
        )
        bind_python_model(s, "error", [fp32("INPUT0")], [fp32("OUTPUT0")], ModelConfig())
        bind_python_model(s, "respond_once", [fp32("INPUT0")], [fp32("OUTPUT0")], batching)
        scale_inputs, scale_outputs, scale_config = described("scale")
        bind_python_model(s, "scale", scale_inputs, scale_outputs, scale_config)
        yield s


def described(name: str) -> tuple[list[Tensor], list[Tensor], ModelConfig]:
    found = python_backend.describe(MODELS / name / "1" / "model.py")
    assert found is not None and found[2] is not None
    return found[0], found[1], found[2]


@pytest.fixture(scope="module")
def http(server: Serve) -> Iterator[triton_http.InferenceServerClient]:
    with triton_http_for(server) as client:
        yield client


@pytest.fixture(scope="module")
def grpc(server: Serve) -> Iterator[triton_grpc.InferenceServerClient]:
    with triton_grpc_for(server) as client:
        yield client


def infer_inputs(input_type: type[InferInput], **arrays: np.ndarray) -> list[InferInput]:
    """The client's inputs holding ``arrays``, by name."""
    inputs = []
    for name, array in arrays.items():
        infer_input = input_type(name, list(array.shape), np_to_triton_dtype(array.dtype))
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


def http_inputs(**arrays: np.ndarray) -> list[triton_http.InferInput]:
    return infer_inputs(triton_http.InferInput, **arrays)


def grpc_inputs(**arrays: np.ndarray) -> list[triton_grpc.InferInput]:
    return infer_inputs(triton_grpc.InferInput, **arrays)


def stream(server: Serve, model: str, count: int) -> list[tuple[Any, InferenceServerException | None]]:
    """Every event of one request on a gRPC stream, up to its final response (or error)."""
    events: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
    with triton_grpc_for(server) as client:
        client.start_stream(lambda result, error: events.put((result, error)))
        try:
            inputs = grpc_inputs(IN=np.array([count], np.int32))
            client.async_stream_infer(model, inputs, request_id="s", enable_empty_final_response=True)
            seen = []
            while True:
                result, error = events.get(timeout=STREAM_TIMEOUT_S)
                seen.append((result, error))
                if error is not None or result.get_response().parameters[FINAL].bool_param:
                    return seen
        finally:
            client.stop_stream(cancel_requests=True)  # a stream the model never ended must not hang the test


# a Triton model, unchanged -----------------------------------------------------------------------------------------

A = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
B = np.array([[0.5, 0.5, 5.0, 1.0]], np.float32)


def test_add_sub_over_http_with_output_types_from_its_configuration(http: triton_http.InferenceServerClient) -> None:
    result = http.infer("add_sub", http_inputs(INPUT0=A, INPUT1=B))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    difference = result.as_numpy("OUTPUT1")
    assert difference.dtype == np.int32  # strict: only a model that read its configuration passes
    np.testing.assert_array_equal(difference, (A - B).astype(np.int32))


def test_add_sub_over_grpc_answers_only_the_requested_output(grpc: triton_grpc.InferenceServerClient) -> None:
    result = grpc.infer(
        "add_sub", grpc_inputs(INPUT0=A, INPUT1=B), outputs=[triton_grpc.InferRequestedOutput("OUTPUT0")]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    assert result.as_numpy("OUTPUT1") is None


def test_add_sub_answers_each_request_of_a_batch(http: triton_http.InferenceServerClient) -> None:
    rows = [np.full((1, 4), float(i), np.float32) for i in range(8)]
    pending = [http.async_infer("add_sub", http_inputs(INPUT0=row, INPUT1=row * 2)) for row in rows]
    for row, request in zip(rows, pending, strict=True):
        result = request.get_result()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), row * 3)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), -row.astype(np.int32))


# decoupled models --------------------------------------------------------------------------------------------------


def test_decoupled_model_streams_what_a_thread_sends_until_the_final_flag(server: Serve) -> None:
    events = stream(server, "repeat", 4)
    assert [error for _, error in events] == [None] * 5
    assert [result.as_numpy("OUT").tolist() for result, _ in events[:4]] == [[0], [1], [2], [3]]
    final = events[4][0].get_response()
    assert final.parameters[FINAL].bool_param and not final.outputs


def test_decoupled_model_sending_only_the_final_flag_gives_no_response(server: Serve) -> None:
    events = stream(server, "repeat", 0)
    assert len(events) == 1 and events[0][1] is None
    assert not events[0][0].get_response().outputs


def test_an_error_response_of_a_decoupled_model_reaches_the_client(server: Serve) -> None:
    events = stream(server, "repeat", -2)
    error = events[-1][1]
    assert error is not None and "count must be >= 0, got -2" in error.message()


def test_async_execute_streams_what_asyncio_tasks_send(server: Serve) -> None:
    events = stream(server, "square_async", 5)
    assert [result.as_numpy("OUT").tolist() for result, _ in events[:-1]] == [[0], [1], [4], [9], [16]]
    assert all(error is None for _, error in events)


def test_a_model_that_is_not_decoupled_may_answer_through_its_senders(http: triton_http.InferenceServerClient) -> None:
    rows = [np.full((1, 3), float(i), np.float32) for i in range(6)]
    pending = [http.async_infer("respond_once", http_inputs(INPUT0=row)) for row in rows]
    for row, request in zip(rows, pending, strict=True):
        np.testing.assert_array_equal(request.get_result().as_numpy("OUTPUT0"), row * 2)


# BLS ---------------------------------------------------------------------------------------------------------------


def test_bls_exec_calls_add_sub_and_a_decoupled_model(http: triton_http.InferenceServerClient) -> None:
    name = np.array([[b"add_sub"]], dtype=object)
    result = http.infer("bls_sync", http_inputs(MODEL_NAME=name, INPUT0=A, INPUT1=B))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), (A - B).astype(np.int32))
    assert result.as_numpy("STREAMED").tolist() == [[0, 1, 2]]


def test_bls_call_to_a_missing_model_is_a_response_with_an_error(http: triton_http.InferenceServerClient) -> None:
    name = np.array([[b"no_such_model"]], dtype=object)
    with pytest.raises(InferenceServerException) as info:
        http.infer("bls_sync", http_inputs(MODEL_NAME=name, INPUT0=A, INPUT1=B))
    message = info.value.message()
    assert "BLS call to 'no_such_model' failed (code 2)" in message and "no_such_model" in message.split(":", 1)[1]


def test_async_bls_runs_three_calls_together(grpc: triton_grpc.InferenceServerClient) -> None:
    result = grpc.infer("bls_async", grpc_inputs(INPUT0=A, INPUT1=B))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), (B - A).astype(np.int32))
    assert result.as_numpy("SQUARES").tolist() == [[0, 1, 4, 9]]


# errors ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "status", "message"),
    [
        ([-1.0, 2.0], "500", "bad"),
        ([0.0, 0.0], "400", "zero is not an argument"),
        ([1.0, 200.0], "500", "TritonModelException: too large: 200.0"),
    ],
)
def test_error_responses_reach_the_client(
    http: triton_http.InferenceServerClient, values: list[float], status: str, message: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        http.infer("error", http_inputs(INPUT0=np.array(values, np.float32)))
    assert info.value.status() == status
    assert info.value.message() == message or message in info.value.message()


def test_error_response_message_over_grpc(grpc: triton_grpc.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("error", grpc_inputs(INPUT0=np.array([-3.0], np.float32)))
    assert info.value.message() == "bad"
    ok = grpc.infer("error", grpc_inputs(INPUT0=np.array([7.0], np.float32)))
    assert ok.as_numpy("OUTPUT0").tolist() == [7.0]


# pyserve's form ----------------------------------------------------------------------------------------------------


def test_pyserve_form_declares_itself_and_serves_with_batch(http: triton_http.InferenceServerClient) -> None:
    inputs, outputs, config = described("scale")
    assert [(t.name, t.datatype, t.shape) for t in inputs + outputs] == [("x", "FP32", (-1,)), ("y", "FP32", (-1,))]
    assert config.max_batch_size == 16
    x = np.array([[1.0, -2.0]], np.float32)
    assert http.infer("scale", http_inputs(x=x)).as_numpy("y").tolist() == [[3.0, -6.0]]


def test_describe_runs_auto_complete_config_on_the_given_configuration() -> None:
    # What the repository passes: a partial config.pbtxt in Triton's JSON form, every field written out.
    partial = text_format.Parse(
        'name: "add_sub" input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]', model_config_pb2.ModelConfig()
    )
    given = config_json(partial)
    found = python_backend.describe(MODELS / "add_sub" / "1" / "model.py", given)
    assert found is not None
    inputs, outputs, config = found
    assert [(t.name, t.datatype, t.shape) for t in inputs] == [("INPUT0", "FP32", (-1,)), ("INPUT1", "FP32", (-1,))]
    assert [t.datatype for t in outputs] == ["FP32", "INT32"]
    assert config is not None and config.max_batch_size == 8 and config.dynamic_batching
    assert given == config_json(partial)  # the caller's document is left alone
    conflicting = {"input": [{"name": "INPUT0", "data_type": "TYPE_INT64"}]}
    with pytest.raises(Exception, match="INPUT0' has data_type 'TYPE_INT64'"):
        python_backend.describe(MODELS / "add_sub" / "1" / "model.py", conflicting)
    assert python_backend.describe(MODELS / "repeat" / "1" / "model.py") is None


def test_describe_names_a_file_that_cannot_be_imported(tmp_path: Path) -> None:
    broken = tmp_path / "model.py"
    broken.write_text("import no_such_module_anywhere\n")
    with pytest.raises(ConfigError, match="could not be imported: ModuleNotFoundError"):
        python_backend.describe(broken)


def test_describe_imports_the_file_in_a_child_process(tmp_path: Path) -> None:
    model_file = tmp_path / "model.py"
    model_file.write_text(
        "import os, pathlib\n"
        "from pyserve import Tensor\n"
        'pathlib.Path(__file__).with_name("imported_by").write_text(str(os.getpid()))\n'
        'print("printed at import")\n'
        'inputs = [Tensor("x", "FP32", (2,), optional=True)]\n'
    )
    assert python_backend.describe(model_file) == ([Tensor("x", "FP32", (2,), optional=True)], [], None)
    assert int((tmp_path / "imported_by").read_text()) != os.getpid()


def test_describe_gives_the_error_a_model_py_raises_at_import(tmp_path: Path) -> None:
    model_file = tmp_path / "model.py"
    model_file.write_text("raise ValueError('weights missing:\\n  /models/w.bin')\n")
    with pytest.raises(ConfigError, match=r"could not be imported: ValueError: weights missing: /models/w.bin$"):
        python_backend.describe(model_file)


def test_describe_gives_up_on_a_model_py_that_does_not_finish_importing(tmp_path: Path) -> None:
    model_file = tmp_path / "model.py"
    model_file.write_text("import time\ntime.sleep(3600)\n")
    with pytest.raises(ConfigError, match=r"model file '.*model.py': describing it passed the timeout of 1 s"):
        python_backend.describe(model_file, timeout_s=1)


def test_the_backend_module_is_found_by_name() -> None:
    module = backend("python")
    assert module.NAME == "python" and module.DEFAULT_MODEL_FILENAME == "model.py"
    assert module.autocomplete(MODELS / "add_sub" / "1" / "model.py") is None


# initialize's args, the request API, finalize ----------------------------------------------------------------------


def test_initialize_args_request_api_and_finalize(tmp_path: Path) -> None:
    marker = tmp_path / "finalized"
    config = ModelConfig(parameters={"FINALIZE_MARKER": str(marker)})
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as s:
        bind_python_model(
            s, "inspect", [fp32("INPUT0", (3,))], [fp32("OUTPUT0", (3,)), Tensor("REPORT", bytes, (1,))], config
        )
        values = np.array([1.0, 2.0, 3.0], np.float32)
        with triton_http_for(s) as client:
            result = client.infer("inspect", http_inputs(INPUT0=values), request_id="r-1", parameters={"answer": 42})
            limited = client.infer(
                "inspect", http_inputs(INPUT0=values), outputs=[triton_http.InferRequestedOutput("REPORT")]
            )
        assert not marker.exists()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
    report = json.loads(result.as_numpy("REPORT")[0])
    assert report["args"] == {
        "model_instance_kind": "CPU",
        "model_instance_name": "inspect_0_0",
        "model_instance_device_id": "0",
        "model_repository": str(MODELS / "inspect"),
        "model_version": "1",
        "model_name": "inspect",
    }
    assert report["input_type"] == "TYPE_FP32"
    assert report["request_id"] == "r-1" and report["parameters"]["answer"] == 42
    assert report["requested"] == [] and report["inputs"] == ["INPUT0"]
    assert report["cancelled"] is False and report["is_cpu"] is True
    assert json.loads(limited.as_numpy("REPORT")[0])["requested"] == ["REPORT"]
    assert limited.as_numpy("OUTPUT0") is None
    assert marker.read_text() == "finalized"
