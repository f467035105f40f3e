"""Hostile input over gRPC, the cases a fuzzer reaches seldom: messages past max_request_bytes (RESOURCE_EXHAUSTED,
also compressed and on a stream), zero-size tensors on every path, impossible shapes, typed contents that must stay
exact, messages that do not parse, hundreds of streams at once. docs/security.md describes the limits tested here."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.frontends.protocol import grpc_service_pb2 as pb

pytestmark = pytest.mark.integration

MAX_REQUEST_BYTES = 100_000
SERVICE = "/inference.GRPCInferenceService/"


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0, max_request_bytes=MAX_REQUEST_BYTES)
    batching = ModelConfig(max_batch_size=8)
    with Serve(config) as s:
        for name, dtype in (("fp32", np.float32), ("uint64", np.uint64), ("bytes", bytes)):
            s.bind(
                f"identity_{name}",
                identity,
                inputs=[Tensor("INPUT0", dtype, (-1,))],
                outputs=[Tensor("OUTPUT0", dtype, (-1,))],
                config=batching,
            )
        yield s


@pytest.fixture(scope="module")
def client(server: Serve) -> Iterator[triton_grpc.InferenceServerClient]:
    with triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as c:
        yield c


@pytest.fixture(scope="module")
def channel(server: Serve) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as c:
        yield c


def fp32_input(values: np.ndarray) -> triton_grpc.InferInput:
    infer_input = triton_grpc.InferInput("INPUT0", list(values.shape), "FP32")
    infer_input.set_data_from_numpy(values)
    return infer_input


def infer_message(model: str, datatype: str, shape: list[int], raw: bytes | None = None) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    if raw is not None:
        message.raw_input_contents.append(raw)
    return message


def model_infer(channel: grpc.Channel, message: pb.ModelInferRequest | bytes) -> pb.ModelInferResponse:
    data = message if isinstance(message, bytes) else message.SerializeToString()
    return pb.ModelInferResponse.FromString(channel.unary_unary(SERVICE + "ModelInfer")(data, timeout=10))


# the size limit ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_message_past_max_request_bytes_is_resource_exhausted(client: Any, compression: str | None) -> None:
    big = np.zeros((1, 50_000), np.float32)  # 200 kB, which gzip makes small: the limit is on what it unpacks to
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_fp32", [fp32_input(big)], compression_algorithm=compression)
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "larger than max" in info.value.message()
    below = np.ones((1, 20_000), np.float32)  # 80 kB
    result = client.infer("identity_fp32", [fp32_input(below)], compression_algorithm=compression)
    assert np.array_equal(result.as_numpy("OUTPUT0"), below)


def test_a_stream_message_past_max_request_bytes_ends_the_stream_with_resource_exhausted(
    channel: grpc.Channel,
) -> None:
    big = infer_message("identity_fp32", "FP32", [1, 50_000], np.zeros(50_000, np.float32).tobytes())
    stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
    with pytest.raises(grpc.RpcError) as info:
        list(stream(iter([big.SerializeToString()]), timeout=10))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# zero-size tensors, shapes, exact values ----------------------------------------------------------------------------


def test_zero_size_tensors_on_every_grpc_path(channel: grpc.Channel) -> None:
    for model, datatype in (("identity_fp32", "FP32"), ("identity_bytes", "BYTES")):
        raw = model_infer(channel, infer_message(model, datatype, [1, 0], b""))
        assert list(raw.outputs[0].shape) == [1, 0] and raw.raw_output_contents == [b""]
        typed = infer_message(model, datatype, [3, 0])
        typed.inputs[0].contents.SetInParent()  # present and empty
        answer = model_infer(channel, typed)
        assert list(answer.outputs[0].shape) == [3, 0] and answer.raw_output_contents == [b""]
    message = infer_message("identity_fp32", "FP32", [2, 0], b"")
    message.id = "empty"
    stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
    (response,) = [pb.ModelStreamInferResponse.FromString(data) for data in stream(iter([message.SerializeToString()]))]
    assert not response.error_message
    assert list(response.infer_response.outputs[0].shape) == [2, 0]


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [([1, 0, 2**62], "too large"), ([1] + [0] * 40, "41 dimensions"), ([1, -3], "non-negative"), ([-(2**63)], "")],
)
def test_shapes_no_array_can_have_are_invalid_argument(channel: grpc.Channel, shape: list[int], fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        model_infer(channel, infer_message("identity_fp32", "FP32", shape, b""))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'INPUT0'" in (info.value.details() or "") and fragment in (info.value.details() or "")


def test_typed_uint64_contents_stay_exact(channel: grpc.Channel) -> None:
    values = [433, 2**63 + 1, 2**64 - 1]
    message = infer_message("identity_uint64", "UINT64", [1, 3])
    message.inputs[0].contents.uint64_contents.extend(values)
    response = model_infer(channel, message)
    assert np.frombuffer(response.raw_output_contents[0], np.uint64).tolist() == values


# messages that do not parse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "ModelConfig", "SystemSharedMemoryRegister"])
def test_a_message_that_does_not_parse_is_invalid_argument(channel: grpc.Channel, method: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(SERVICE + method)(b"\x0a\xff\xff\xff\xff\x0f", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed" in (info.value.details() or "")


def test_a_stream_answers_each_hostile_message_and_stays_open(channel: grpc.Channel) -> None:
    good = infer_message("identity_fp32", "FP32", [1, 2], np.array([1.0, 2.0], np.float32).tobytes())
    good.id = "good"
    wrong_size = infer_message("identity_fp32", "FP32", [1, 3], b"\x00" * 8)
    wrong_size.id = "wrong-size"
    duplicate = infer_message("identity_fp32", "FP32", [1, 1], b"\x00" * 4)
    duplicate.inputs.append(duplicate.inputs[0])
    duplicate.raw_input_contents.append(b"\x00" * 4)
    duplicate.id = "duplicate"
    messages = [good.SerializeToString(), wrong_size.SerializeToString(), duplicate.SerializeToString(), b"\xff\xff"]
    stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
    responses = [pb.ModelStreamInferResponse.FromString(data) for data in stream(iter(messages), timeout=10)]
    by_id = {response.infer_response.id: response for response in responses}
    assert len(responses) == 4
    assert not by_id["good"].error_message
    assert "needs 12 bytes, got 8" in by_id["wrong-size"].error_message
    assert "appears more than once" in by_id["duplicate"].error_message
    assert "malformed ModelInferRequest" in by_id[""].error_message


# many streams -------------------------------------------------------------------------------------------------------


def test_hundreds_of_streams_at_once_are_all_answered(server: Serve) -> None:
    streams, per_stream = 200, 3

    async def one(channel: grpc.aio.Channel, index: int) -> list[float]:
        call = channel.stream_stream(SERVICE + "ModelStreamInfer")()
        for step in range(per_stream):
            value = float(index * per_stream + step)
            await call.write(
                infer_message("identity_fp32", "FP32", [1, 1], np.float32(value).tobytes()).SerializeToString()
            )
        await call.done_writing()
        answers = []
        async for data in call:
            response = pb.ModelStreamInferResponse.FromString(data)
            assert not response.error_message, response.error_message
            answers.append(float(np.frombuffer(response.infer_response.raw_output_contents[0], np.float32)[0]))
        return sorted(answers)

    async def all_at_once() -> list[list[float]]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            return await asyncio.wait_for(asyncio.gather(*(one(channel, i) for i in range(streams))), 60)

    results = asyncio.run(all_at_once())
    assert results == [[float(i * per_stream + step) for step in range(per_stream)] for i in range(streams)]


def test_the_server_still_serves_after_all_this(client: Any) -> None:
    assert client.is_server_ready()
    values = np.array([[1.0, 2.0]], np.float32)
    assert np.array_equal(client.infer("identity_fp32", [fp32_input(values)]).as_numpy("OUTPUT0"), values)
