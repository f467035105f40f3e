"""The gRPC infer codec against Triton's own client messages (tritonclient's generated protobuf classes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as triton_pb

from pyserve.config import ModelConfig, ModelSpec, Tensor
from pyserve.core.inference import ModelEntry, OutputTensor
from pyserve.core.registry import Registry
from pyserve.dtypes import serialize_bytes
from pyserve.errors import InvalidInputError, ModelNotFoundError, UnsupportedError
from pyserve.frontends.grpc_codec import (
    decode_infer_call,
    encode_varint,
    infer_response_bytes,
    parse_infer_request,
    split_raw_contents,
    stream_flag_bytes,
    stream_response_bytes,
)
from pyserve.frontends.protocol import grpc_service_pb2 as pb


def registry(*entries: ModelEntry) -> Registry:
    out = Registry()
    for entry in entries:
        out.add(entry)
    return out


def model(inputs: list[Tensor], outputs: list[Tensor] | None = None, max_batch_size: int = 8) -> ModelEntry:
    spec = ModelSpec(
        "m", 1, tuple(inputs), tuple(outputs or [Tensor("OUTPUT0", np.float32)]), ModelConfig(max_batch_size)
    )
    return ModelEntry(spec)


IDENTITY = model([Tensor("INPUT0", np.float32, (-1,))])


def client_request(*arrays: tuple[str, np.ndarray, str], **options: Any) -> bytes:
    """What tritonclient sends for these inputs (its own message classes, its own request builder)."""
    from tritonclient.grpc._utils import _get_inference_request

    inputs = []
    for name, array, datatype in arrays:
        infer_input = triton_grpc.InferInput(name, list(array.shape), datatype)
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    request = _get_inference_request(
        model_name=options.pop("model_name", "m"),
        inputs=inputs,
        model_version=options.pop("model_version", ""),
        request_id=options.pop("request_id", ""),
        outputs=options.pop("outputs", None),
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=options.pop("priority", 0),
        timeout=options.pop("timeout", None),
        parameters=options.pop("parameters", None),
    )
    assert not options
    return bytes(request.SerializeToString())


def decode(data: bytes, reg: Registry | None = None) -> Any:
    message, raw = parse_infer_request(data)
    return decode_infer_call(message, raw, reg or registry(IDENTITY))


# requests ----------------------------------------------------------------------------------------------------


def test_varints_round_trip_through_protobuf() -> None:
    assert encode_varint(0) == b"\x00"
    for value in (1, 127, 128, 300, 2**31, 2**63 - 1):
        assert encode_varint(value) == pb.StatisticDuration(count=value).SerializeToString()[1:]


def test_split_raw_contents_views_the_tensor_bytes() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[1, 2, 3]], np.int64)
    data = client_request(("A", a, "FP32"), ("B", b, "INT64"), request_id="x", parameters={"k": 1})
    head, raw = split_raw_contents(data)
    assert [bytes(view) for view in raw] == [a.tobytes(), b.tobytes()]
    assert all(view.obj is data for view in raw)  # views, not copies
    parsed = pb.ModelInferRequest.FromString(head)
    assert [t.name for t in parsed.inputs] == ["A", "B"] and parsed.id == "x" and not parsed.raw_input_contents
    # The message without raw contents is the rest of the original, field for field.
    original = triton_pb.ModelInferRequest.FromString(data)
    original.ClearField("raw_input_contents")
    assert triton_pb.ModelInferRequest.FromString(head) == original


def test_split_raw_contents_without_raw_returns_the_message() -> None:
    data = pb.ModelInferRequest(model_name="m", id="1").SerializeToString()
    assert split_raw_contents(data) == (data, [])


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_truncated_messages_are_invalid(cut: int) -> None:
    data = client_request(("INPUT0", np.ones((1, 4), np.float32), "FP32"))
    with pytest.raises(InvalidInputError, match="malformed"):
        decode(data[:-cut])


def test_decode_a_tritonclient_request() -> None:
    array = np.array([[1.5, -2.0, 3.25]], np.float32)
    outputs = [triton_grpc.InferRequestedOutput("OUTPUT0")]
    data = client_request(
        ("INPUT0", array, "FP32"),
        request_id="r-1",
        outputs=outputs,
        priority=2,
        timeout=1000,
        parameters={"s": "text", "f": 0.5, "b": True, "i": 7},
    )
    entry, call = decode(data)
    assert entry is IDENTITY
    assert call.id == "r-1" and call.requested_outputs == ["OUTPUT0"]
    assert call.parameters == {"s": "text", "f": 0.5, "b": True, "i": 7, "priority": 2, "timeout": 1000}
    tensor = call.inputs["INPUT0"]
    assert tensor.datatype == "FP32" and tensor.shape == [1, 3]
    np.testing.assert_array_equal(tensor.data, array)


def test_bytes_inputs_are_checked() -> None:
    entry = model([Tensor("T", bytes, (-1,))])
    data = client_request(("T", np.array([[b"ab", b""]], object), "BYTES"))
    _, call = decode(data, registry(entry))
    assert bytes(call.inputs["T"].data) == serialize_bytes(np.array([b"ab", b""], object))
    message = triton_pb.ModelInferRequest.FromString(data)
    message.raw_input_contents[0] = message.raw_input_contents[0][:-1] + b"\x00\x00"
    with pytest.raises(InvalidInputError, match="BYTES"):
        decode(message.SerializeToString(), registry(entry))


def test_typed_contents_decode() -> None:
    entry = model([Tensor("A", np.int16, (-1,)), Tensor("B", bytes, (-1,)), Tensor("C", np.bool_, (-1,))])
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="A", datatype="INT16", shape=[1, 3]).contents.int_contents.extend([-3, 0, 300])
    message.inputs.add(name="B", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend([b"x", b"yz"])
    message.inputs.add(name="C", datatype="BOOL", shape=[1, 1]).contents.bool_contents.extend([True])
    _, call = decode(message.SerializeToString(), registry(entry))
    assert call.inputs["A"].data.dtype == np.int16 and call.inputs["A"].data.tolist() == [[-3, 0, 300]]
    assert bytes(call.inputs["B"].data) == serialize_bytes(np.array([b"x", b"yz"], object))
    assert call.inputs["C"].data.tolist() == [[True]]
    message.inputs[0].contents.int_contents[2] = 70_000
    with pytest.raises(InvalidInputError, match="out of range"):
        decode(message.SerializeToString(), registry(entry))


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda m: setattr(m, "model_name", "other"), ModelNotFoundError, "other"),
        (lambda m: setattr(m, "model_version", "3"), ModelNotFoundError, "version 3"),
        (lambda m: setattr(m.inputs[0], "datatype", "FLOAT"), InvalidInputError, "unknown datatype"),
        (lambda m: setattr(m.inputs[0], "datatype", "INT32"), InvalidInputError, "expected datatype FP32"),
        (lambda m: m.inputs[0].shape.__setitem__(1, 5), InvalidInputError, "needs 20 bytes"),
        (lambda m: m.inputs[0].shape.__setitem__(0, -1), InvalidInputError, "non-negative"),
        (lambda m: m.raw_input_contents.append(b""), InvalidInputError, "raw_input_contents"),
        (
            lambda m: (
                m.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2]),
                m.raw_input_contents.append(b"0" * 8),
            ),
            InvalidInputError,
            "more than once",
        ),
        (
            lambda m: m.parameters["triton_x"].CopyFrom(triton_pb.InferParameter(bool_param=True)),
            InvalidInputError,
            "reserved",
        ),
        (
            lambda m: (
                m.inputs[0].parameters["shared_memory_region"].CopyFrom(triton_pb.InferParameter(string_param="r"))
            ),
            UnsupportedError,
            "shared memory",
        ),
        (lambda m: m.outputs.add(name="NOPE"), InvalidInputError, "'NOPE'"),
        (
            lambda m: (
                m.outputs.add(name="OUTPUT0")
                .parameters["classification"]
                .CopyFrom(triton_pb.InferParameter(int64_param=2))
            ),
            InvalidInputError,
            "classification",
        ),
    ],
)
def test_bad_requests_name_what_is_wrong(mutate: Any, error: type[Exception], match: str) -> None:
    message = triton_pb.ModelInferRequest.FromString(client_request(("INPUT0", np.ones((1, 2), np.float32), "FP32")))
    mutate(message)
    with pytest.raises(error, match=match):
        decode(message.SerializeToString())


def test_inputs_without_data_are_invalid() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    with pytest.raises(InvalidInputError, match="neither contents nor raw_input_contents"):
        decode(message.SerializeToString())


# responses ---------------------------------------------------------------------------------------------------


def outputs() -> list[OutputTensor]:
    values = np.array([[1.0, 2.0]], np.float32)
    text = serialize_bytes(np.array([b"hi", b""], object))
    empty = np.zeros((1, 0), np.int32)
    return [
        OutputTensor("OUT", "FP32", [1, 2], memoryview(values.tobytes())),
        OutputTensor("TEXT", "BYTES", [1, 2], memoryview(text)),
        OutputTensor("EMPTY", "INT32", [1, 0], memoryview(empty.tobytes())),
    ]


def test_response_reads_back_with_tritonclient() -> None:
    data = infer_response_bytes(IDENTITY, "r-9", outputs(), {"p": 3, "q": "s", "flag": False, "x": 0.25})
    response = triton_pb.ModelInferResponse.FromString(data)
    assert response.model_name == "m" and response.model_version == "1" and response.id == "r-9"
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUT", "FP32", [1, 2]),
        ("TEXT", "BYTES", [1, 2]),
        ("EMPTY", "INT32", [1, 0]),
    ]
    # One raw entry per output, in order, an empty one included.
    assert len(response.raw_output_contents) == 3 and response.raw_output_contents[2] == b""
    result = triton_grpc.InferResult(response)
    np.testing.assert_array_equal(result.as_numpy("OUT"), [[1.0, 2.0]])
    assert result.as_numpy("TEXT").tolist() == [[b"hi", b""]]
    assert response.parameters["p"].int64_param == 3 and response.parameters["q"].string_param == "s"
    assert response.parameters["flag"].HasField("bool_param") and response.parameters["x"].double_param == 0.25


def test_stream_responses_are_flagged() -> None:
    for final in (False, True):
        data = stream_response_bytes(IDENTITY, "s", outputs()[:1], final)
        response = triton_pb.ModelStreamInferResponse.FromString(data)
        assert response.error_message == ""
        assert response.infer_response.parameters["triton_final_response"].bool_param is final
        assert response.infer_response.raw_output_contents[0] == np.array([1.0, 2.0], np.float32).tobytes()
    request = pb.ModelInferRequest(model_name="m", id="e")
    error = triton_pb.ModelStreamInferResponse.FromString(stream_flag_bytes(request, "it broke"))
    assert error.error_message == "it broke" and error.infer_response.id == "e"
    empty = triton_pb.ModelStreamInferResponse.FromString(stream_flag_bytes(request))
    assert empty.error_message == "" and not empty.infer_response.outputs
    assert empty.infer_response.model_version == "" and empty.infer_response.model_name == "m"
    assert empty.infer_response.parameters["triton_final_response"].bool_param
