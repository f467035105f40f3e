"""The gRPC front end with Triton's own client: health, metadata, config, every datatype, errors, parameters."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import Serve
from pyserve.frontends.protocol import health_pb2, health_pb2_grpc

from .test_infer_dtypes import ALL_TYPES, sample

pytestmark = pytest.mark.integration

DATA = np.array([[1.0, 2.0, 3.0], [-4.0, 0.5, 8.0]], np.float32)


def fp32_input(data: np.ndarray = DATA, name: str = "INPUT0") -> triton_grpc.InferInput:
    infer_input = triton_grpc.InferInput(name, list(data.shape), "FP32")
    infer_input.set_data_from_numpy(data)
    return infer_input


def status_of(info: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(info.value.status())


# health, metadata, config --------------------------------------------------------------------------------------


def test_health_and_readiness(grpc_client: triton_grpc.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready("identity_fp32")
    assert grpc_client.is_model_ready("identity_fp32", "1")
    # As Triton: an unknown model or version is not ready (status OK), so the client returns False.
    assert grpc_client.is_model_ready("no_such_model") is False
    assert grpc_client.is_model_ready("identity_fp32", "7") is False


def test_standard_grpc_health_check(server: Serve) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_server_and_model_metadata_match_http(
    grpc_client: triton_grpc.InferenceServerClient, client: triton_http.InferenceServerClient
) -> None:
    server = grpc_client.get_server_metadata(as_json=True)
    assert server == client.get_server_metadata()
    metadata = grpc_client.get_model_metadata("add_sub", as_json=True)
    http_metadata = client.get_model_metadata("add_sub")
    assert metadata["name"] == "add_sub" and metadata["versions"] == ["1"]
    for kind in ("inputs", "outputs"):
        # protobuf's JSON writes int64 as strings.
        got = [{**t, "shape": [int(d) for d in t["shape"]]} for t in metadata[kind]]
        assert got == http_metadata[kind]


def test_model_config_matches_http(
    grpc_client: triton_grpc.InferenceServerClient, client: triton_http.InferenceServerClient
) -> None:
    config = grpc_client.get_model_config("add_sub").config
    http_config = client.get_model_config("add_sub")
    assert config.name == "add_sub"
    assert config.max_batch_size == http_config["max_batch_size"] == 64
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]
    assert config.input[0].data_type == triton_grpc.model_config_pb2.TYPE_FP32
    assert list(config.input[0].dims) == [-1]
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert list(config.dynamic_batching.preferred_batch_size) == [64]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert not config.model_transaction_policy.decoupled
    assert grpc_client.get_model_config("decoupled").config.model_transaction_policy.decoupled


def test_statistics_and_repository_index(grpc_client: triton_grpc.InferenceServerClient) -> None:
    infer_input = triton_grpc.InferInput("INPUT0", [2, 3], "FP64")
    infer_input.set_data_from_numpy(DATA.astype(np.float64))
    grpc_client.infer("identity_fp64", [infer_input])
    (stats,) = grpc_client.get_inference_statistics("identity_fp64").model_stats
    assert stats.name == "identity_fp64" and stats.version == "1"
    assert stats.inference_count >= 2 and stats.inference_stats.success.count >= 1
    everything = grpc_client.get_inference_statistics().model_stats
    assert "identity_fp64" in {s.name for s in everything}
    with pytest.raises(InferenceServerException) as info:
        grpc_client.get_inference_statistics("no_such_model")
    assert status_of(info) == "StatusCode.INVALID_ARGUMENT"  # as HTTP answers 400
    index = grpc_client.get_model_repository_index().models
    assert any(m.name == "identity_fp32" and m.version == "1" and m.state == "READY" for m in index)


def test_what_this_server_does_not_do_is_refused_clearly(grpc_client: triton_grpc.InferenceServerClient) -> None:
    grpc_client.load_model("identity_fp32")  # already loaded: nothing to do
    with pytest.raises(InferenceServerException) as info:
        grpc_client.load_model("not_bound")
    assert status_of(info) == "StatusCode.UNIMPLEMENTED" and "--model-repository" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        grpc_client.unload_model("identity_fp32")
    assert status_of(info) == "StatusCode.UNIMPLEMENTED"
    assert grpc_client.is_model_ready("identity_fp32")
    # Shared-memory regions work: tests/integration/test_shared_memory.py.
    # Trace and log settings can be read here and changed too: tests/integration/test_tracing.py, test_logging.py.
    assert grpc_client.get_trace_settings().settings["trace_level"].value == ["OFF"]
    assert "log_verbose_level" in grpc_client.get_log_settings().settings


# infer ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_every_datatype_round_trips(grpc_client: triton_grpc.InferenceServerClient, datatype: str) -> None:
    data = sample(datatype)
    if datatype == "BYTES":
        data = np.concatenate([data, np.array([[b"\x00\xff\xfe", b"\x00", b"\x80" * 3]], object)])
    infer_input = triton_grpc.InferInput("INPUT0", list(data.shape), datatype)
    infer_input.set_data_from_numpy(data)
    result = grpc_client.infer(f"identity_{datatype.lower()}", [infer_input])
    output = result.get_output("OUTPUT0")
    assert output.datatype == datatype and list(output.shape) == list(data.shape)
    got = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


def test_one_raw_output_per_output_in_order(grpc_client: triton_grpc.InferenceServerClient) -> None:
    outputs = [triton_grpc.InferRequestedOutput(name) for name in ("TEXT", "NEGATED", "PLUS_ONE")]
    response = grpc_client.infer("multi", [fp32_input()], outputs=outputs, request_id="r-1").get_response()
    assert response.id == "r-1" and response.model_name == "multi" and response.model_version == "1"
    assert [o.name for o in response.outputs] == ["TEXT", "NEGATED", "PLUS_ONE"]
    assert len(response.raw_output_contents) == 3
    assert np.frombuffer(response.raw_output_contents[1], np.float32).tolist() == (-DATA).reshape(-1).tolist()
    everything = grpc_client.infer("multi", [fp32_input()]).get_response()
    assert len(everything.raw_output_contents) == len(everything.outputs) == 4


def test_model_without_batching_and_optional_inputs(grpc_client: triton_grpc.InferenceServerClient) -> None:
    matrix = np.arange(6, dtype=np.int32).reshape(2, 3)
    infer_input = triton_grpc.InferInput("INPUT0", [2, 3], "INT32")
    infer_input.set_data_from_numpy(matrix)
    np.testing.assert_array_equal(grpc_client.infer("no_batch", [infer_input]).as_numpy("OUTPUT0"), matrix * 10)
    result = grpc_client.infer("optional", [fp32_input()])
    assert result.as_numpy("HAD_INPUT1").reshape(-1).tolist() == [False, False]
    result = grpc_client.infer("optional", [fp32_input(), fp32_input(DATA, "INPUT1")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA * 2)


def test_typed_contents_are_accepted(server: Serve) -> None:
    # tritonclient always sends raw bytes; other clients may send InferTensorContents.
    request = triton_grpc.service_pb2.ModelInferRequest(model_name="identity_int32")
    tensor = request.inputs.add(name="INPUT0", datatype="INT32", shape=[2, 2])
    tensor.contents.int_contents.extend([1, -2, 3, 2**31 - 1])
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = triton_grpc.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request, timeout=10)
    assert np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == [1, -2, 3, 2**31 - 1]


def test_tensor_of_256_mib_round_trips(grpc_client: triton_grpc.InferenceServerClient) -> None:
    data = np.arange(64 * 1024 * 1024, dtype=np.float32).reshape(1, -1)
    result = grpc_client.infer("large_fp32", [fp32_input(data)], client_timeout=120)
    got = result.as_numpy("OUTPUT0")
    assert got.shape == data.shape
    assert np.array_equal(got, data)


# errors --------------------------------------------------------------------------------------------------------


def test_errors_carry_tritons_status_codes(grpc_client: triton_grpc.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("no_such_model", [fp32_input()])
    assert status_of(info) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("identity_fp32", [fp32_input()], model_version="7")
    assert status_of(info) == "StatusCode.NOT_FOUND"
    wrong_type = triton_grpc.InferInput("INPUT0", [1, 2], "INT32")
    wrong_type.set_data_from_numpy(np.array([[1, 2]], np.int32))
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("identity_fp32", [wrong_type])
    assert status_of(info) == "StatusCode.INVALID_ARGUMENT" and "FP32" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("no_batch", [fp32_input()])
    assert status_of(info) == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("identity_fp32", [fp32_input(name="NOPE")])
    assert status_of(info) == "StatusCode.INVALID_ARGUMENT" and "'NOPE'" in info.value.message()


def test_a_failing_model_is_internal_with_its_message(grpc_client: triton_grpc.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("raises", [fp32_input(np.array([[1.0, -3.0]], np.float32))])
    assert status_of(info) == "StatusCode.INTERNAL"
    assert info.value.message() == "model 'raises' raised ValueError: negative input seen: -3.0"
    # The server keeps serving.
    positive = np.abs(DATA)
    assert grpc_client.infer("raises", [fp32_input(positive)]).as_numpy("OUTPUT0").tolist() == positive.tolist()


def test_decoupled_model_on_model_infer_is_unimplemented(grpc_client: triton_grpc.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("decoupled", [fp32_input()])
    assert status_of(info) == "StatusCode.UNIMPLEMENTED"
    assert "ModelStreamInfer" in info.value.message()


def test_malformed_request_bytes_are_invalid_argument(server: Serve) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\x0a\xff\xff\xff\x0f", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# parameters ----------------------------------------------------------------------------------------------------


def test_parameters_reach_the_model_exactly_as_over_http(
    grpc_client: triton_grpc.InferenceServerClient, client: triton_http.InferenceServerClient
) -> None:
    custom = {"temperature": 0.5, "mode": "fast", "flag": True, "n": 3}
    options: dict[str, Any] = {"priority": 1, "timeout": 30_000_000, "parameters": custom, "request_id": "p-1"}
    grpc_result = grpc_client.infer("echo_parameters", [fp32_input(DATA[0])], **options)
    http_input = triton_http.InferInput("INPUT0", [3], "FP32")
    http_input.set_data_from_numpy(DATA[0])
    http_result = client.infer("echo_parameters", [http_input], **options)
    seen = orjson.loads(grpc_result.as_numpy("PARAMETERS")[0])
    assert seen == orjson.loads(http_result.as_numpy("PARAMETERS")[0])
    assert seen == {**custom, "priority": 1, "timeout": 30_000_000}
    assert grpc_result.as_numpy("REQUEST_ID").tolist() == [b"p-1"]


def test_reserved_parameters_are_refused_but_tritons_own_accepted(
    grpc_client: triton_grpc.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("echo_parameters", [fp32_input(DATA[0])], parameters={"triton_secret": 1})
    assert status_of(info) == "StatusCode.INVALID_ARGUMENT" and "triton_secret" in info.value.message()
    result = grpc_client.infer(
        "echo_parameters", [fp32_input(DATA[0])], parameters={"triton_enable_empty_final_response": True}
    )
    assert orjson.loads(result.as_numpy("PARAMETERS")[0]) == {"triton_enable_empty_final_response": True}


# asyncio client ------------------------------------------------------------------------------------------------


def test_asyncio_client(server: Serve) -> None:
    async def main() -> None:
        client = triton_grpc_aio.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            assert await client.is_server_ready()
            metadata = await client.get_model_metadata("add_sub", as_json=True)
            assert metadata["name"] == "add_sub"
            pending = []
            for i in range(16):
                a = np.full((1 + i % 3, 4), i, np.float32)
                b = np.arange(a.size, dtype=np.float32).reshape(a.shape)
                inputs = [triton_grpc_aio.InferInput(name, list(a.shape), "FP32") for name in ("INPUT0", "INPUT1")]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                pending.append((a, b, client.infer("add_sub", inputs, request_id=str(i))))
            results = await asyncio.gather(*(call for _, _, call in pending))
            for i, ((a, b, _), result) in enumerate(zip(pending, results, strict=True)):
                assert result.get_response().id == str(i)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            with pytest.raises(InferenceServerException) as info:
                await client.infer("raises", [fp32_input_aio(np.array([[-1.0]], np.float32))])
            assert str(info.value.status()) == "StatusCode.INTERNAL"
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def fp32_input_aio(data: np.ndarray) -> triton_grpc_aio.InferInput:
    infer_input = triton_grpc_aio.InferInput("INPUT0", list(data.shape), "FP32")
    infer_input.set_data_from_numpy(data)
    return infer_input
