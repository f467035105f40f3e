"""KServe v2 / Triton gRPC infer codec: ``ModelInferRequest`` bytes to an ``InferCall``, responses back to bytes.

The tensor bytes never go through protobuf objects. On the way in, ``raw_input_contents`` (field 7) are cut out
of the received message as views, and only the rest (names, shapes, parameters) is parsed with protobuf. On the way
out, the response's small part is serialized with protobuf and each output's bytes are appended as a
``raw_output_contents`` field (6), in output order: the output buffer is copied once, into the message that goes
to gRPC. Protobuf merges repeated fields written in any order, so the result is an ordinary message to any client.
Measured on a 1 MiB tensor: parsing the whole request with protobuf and reading the field costs ~40 µs against
~3 µs here, and building the response with protobuf ~1.9 ms against ~22 µs here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from pyserve.core.api import ModelsView, SharedMemoryControls
from pyserve.core.infer_call import InferCall, check_parameter_names, tensor_from_binary
from pyserve.core.inference import InputTensor, ModelEntry, OutputTensor, SharedMemorySlice
from pyserve.dtypes import DATATYPES, numpy_dtype, serialize_bytes
from pyserve.errors import InvalidInputError, UnsupportedError
from pyserve.frontends.common import FINAL_RESPONSE, check_shape, model_parameters
from pyserve.frontends.protocol import grpc_service_pb2 as pb
from pyserve.frontends.shared_memory import input_from_region, output_parameters, slice_of, uses_shared_memory

_RAW_INPUT_FIELD = 7
_RAW_OUTPUT_TAG = b"\x32"  # field 6, length-delimited
_INFER_RESPONSE_TAG = b"\x12"  # ModelStreamInferResponse.infer_response: field 2, length-delimited
# InferTensorContents field per datatype, for requests that send typed contents instead of raw bytes.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_CONTENTS_DTYPE = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


# varints ----------------------------------------------------------------------------------------------------


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise InvalidInputError("malformed ModelInferRequest: a varint is longer than 10 bytes")


def encode_varint(value: int) -> bytes:
    """The protobuf varint encoding of a non-negative integer."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# requests -----------------------------------------------------------------------------------------------------


def split_raw_contents(data: bytes) -> tuple[bytes, list[memoryview]]:
    """Cut the ``raw_input_contents`` fields out of a serialized ModelInferRequest.

    Returns the message without them (small: names, shapes, parameters) and a view of each raw content, in order.
    """
    view = memoryview(data)
    size = len(data)
    raw: list[memoryview] = []
    kept: list[memoryview] = []
    start = pos = 0
    try:
        while pos < size:
            tag, after_tag = _read_varint(data, pos)
            wire_type = tag & 7
            if wire_type == 2:
                length, body = _read_varint(data, after_tag)
                end = body + length
                if end > size:
                    raise InvalidInputError("malformed ModelInferRequest: a field runs past the end of the message")
                if tag >> 3 == _RAW_INPUT_FIELD:
                    if start < pos:
                        kept.append(view[start:pos])
                    raw.append(view[body:end])
                    start = end
                pos = end
            elif wire_type == 0:
                _, pos = _read_varint(data, after_tag)
            elif wire_type == 1:
                pos = after_tag + 8
            elif wire_type == 5:
                pos = after_tag + 4
            else:
                raise InvalidInputError(f"malformed ModelInferRequest: unsupported wire type {wire_type}")
    except IndexError:
        raise InvalidInputError("malformed ModelInferRequest: the message is truncated") from None
    if pos != size:
        raise InvalidInputError("malformed ModelInferRequest: the message is truncated")
    if not raw:
        return data, raw
    if start < size:
        kept.append(view[start:size])
    return b"".join(kept), raw


def parse_infer_request(data: bytes) -> tuple[pb.ModelInferRequest, list[memoryview]]:
    """The request's protobuf message (without raw contents) and views of its raw input contents."""
    head, raw = split_raw_contents(data)
    try:
        message = pb.ModelInferRequest.FromString(head)
    except DecodeError as exc:
        raise InvalidInputError(f"malformed ModelInferRequest: {exc}") from None
    return message, raw


def parameters_from_proto(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """InferParameter values as plain Python values (bool, int, str, float)."""
    out: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(parameter, choice)
    return out


def decode_infer_call(
    message: pb.ModelInferRequest,
    raw: list[memoryview],
    models: ModelsView,
    regions: SharedMemoryControls | None = None,
) -> tuple[ModelEntry, InferCall]:
    """Resolve the model and decode and validate the request for it (raises InferenceError with the reason).

    Inputs in clients' shared-memory regions (looked up in ``regions``) have no ``raw_input_contents``: the raw
    contents, when sent, are those of the other inputs, in order (as tritonclient sends them)."""
    entry = models.get(message.model_name, message.model_version or None)
    parameters = parameters_from_proto(message.parameters)
    check_parameter_names(parameters)
    inputs: dict[str, InputTensor] = {}
    used = 0
    for tensor in message.inputs:
        name = tensor.name
        if name in inputs:
            raise InvalidInputError(f"input '{name}' appears more than once")
        if tensor.parameters:
            tensor_parameters = parameters_from_proto(tensor.parameters)
            if uses_shared_memory(tensor_parameters):
                if tensor.HasField("contents"):
                    raise InvalidInputError(f"input '{name}' has shared memory parameters and contents too")
                datatype = _datatype(tensor)
                shape = _shape(tensor, datatype)
                inputs[name] = input_from_region(_regions(regions), name, datatype, shape, tensor_parameters)
                continue
        if raw and used == len(raw):
            raise InvalidInputError(
                f"expected one raw_input_contents per input not in shared memory, got {len(raw)} for "
                f"{len(message.inputs)} inputs"
            )
        inputs[name] = _decode_input(tensor, raw[used] if raw else None)
        used += 1
    if raw and len(raw) != used:
        raise InvalidInputError(
            f"expected {used} raw_input_contents (one per input not in shared memory), got {len(raw)}"
        )
    requested: list[str] = []
    shm_outputs: dict[str, SharedMemorySlice] | None = None
    for output in message.outputs:
        output_parameters = parameters_from_proto(output.parameters)
        if "classification" in output_parameters:
            raise InvalidInputError(f"output '{output.name}': the classification extension is not supported")
        if output_parameters and uses_shared_memory(output_parameters):
            if shm_outputs is None:
                shm_outputs = {}
            shm_outputs[output.name] = slice_of(_regions(regions), output_parameters, f"output '{output.name}'")
        requested.append(output.name)
    entry.validate(inputs, requested)
    return entry, InferCall(message.id, inputs, model_parameters(parameters), requested, shm_outputs=shm_outputs)


def _regions(regions: SharedMemoryControls | None) -> SharedMemoryControls:
    if regions is None:
        raise UnsupportedError("shared memory regions cannot be used here")
    return regions


def _datatype(tensor: pb.ModelInferRequest.InferInputTensor) -> str:
    datatype = tensor.datatype
    if datatype not in DATATYPES:
        raise InvalidInputError(
            f"input '{tensor.name}': unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        )
    return datatype


def _shape(tensor: pb.ModelInferRequest.InferInputTensor, datatype: str) -> list[int]:
    shape = list(tensor.shape)
    if any(dim < 0 for dim in shape):
        raise InvalidInputError(f"input '{tensor.name}': shape must be non-negative integers, got {shape}")
    check_shape(f"input '{tensor.name}'", shape, datatype)
    return shape


def _decode_input(tensor: pb.ModelInferRequest.InferInputTensor, raw: memoryview | None) -> InputTensor:
    name = tensor.name
    datatype = _datatype(tensor)
    shape = _shape(tensor, datatype)
    if raw is not None:
        if tensor.HasField("contents"):
            raise InvalidInputError(f"input '{name}' has both contents and raw_input_contents")
        return tensor_from_binary(name, datatype, shape, raw)
    if not tensor.HasField("contents"):
        raise InvalidInputError(f"input '{name}' has neither contents nor raw_input_contents")
    return _from_contents(name, datatype, shape, tensor.contents)


def _from_contents(name: str, datatype: str, shape: list[int], contents: pb.InferTensorContents) -> InputTensor:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInputError(f"input '{name}': {datatype} cannot be sent as typed contents; use raw_input_contents")
    values = getattr(contents, field)
    count = 1
    for dim in shape:
        count *= dim
    if len(values) != count:
        raise InvalidInputError(f"input '{name}': shape {shape} has {count} elements but {field} has {len(values)}")
    if datatype == "BYTES":
        items = np.empty(count, dtype=object)
        items[:] = list(values)
        return InputTensor(datatype, shape, serialize_bytes(items))
    target = numpy_dtype(datatype)
    # The field's own type: numpy left to guess reads large UINT64 values as float64, and rounds them.
    array = np.array(values, dtype=_CONTENTS_DTYPE[field])
    if count and target.kind in ("i", "u") and target.itemsize < array.itemsize:
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidInputError(f"input '{name}': a value is out of range for {datatype}")
    return InputTensor(datatype, shape, array.astype(target, copy=False).reshape(shape))


# responses ----------------------------------------------------------------------------------------------------


def set_parameter(parameter: pb.InferParameter, value: Any) -> None:
    """Store a Python value in an InferParameter (bool, int, float, else its string)."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        if value >= 1 << 63:
            parameter.uint64_param = value
        else:
            parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = str(value)


def encode_infer_response(
    entry: ModelEntry,
    request_id: str,
    outputs: list[OutputTensor],
    parameters: Mapping[str, Any] | None = None,
    final: bool | None = None,
    shm_outputs: Mapping[str, SharedMemorySlice] | None = None,
) -> list[Any]:
    """A ModelInferResponse as buffers to join: the protobuf part, then one raw output field per output.

    ``final`` (streams only) sets the ``triton_final_response`` parameter. An output in ``shm_outputs`` was written
    into the client's region: it carries the shared-memory parameters and an empty raw field (as Triton keeps one
    raw field per output, in order).
    """
    message = pb.ModelInferResponse(model_name=entry.name, model_version=str(entry.version), id=request_id)
    for output in outputs:
        described = message.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        if shm_outputs is not None and output.name in shm_outputs:
            for key, value in output_parameters(shm_outputs[output.name], output.buffer.nbytes).items():
                set_parameter(described.parameters[key], value)
    if parameters:
        for key, value in parameters.items():
            set_parameter(message.parameters[key], value)
    if final is not None:
        message.parameters[FINAL_RESPONSE].bool_param = final
    parts: list[Any] = [message.SerializeToString()]
    for output in outputs:
        if shm_outputs is not None and output.name in shm_outputs:
            parts += (_RAW_OUTPUT_TAG, b"\x00")
        else:
            parts += (_RAW_OUTPUT_TAG, encode_varint(output.buffer.nbytes), output.buffer)
    return parts


def infer_response_bytes(
    entry: ModelEntry,
    request_id: str,
    outputs: list[OutputTensor],
    parameters: Mapping[str, Any] | None = None,
    shm_outputs: Mapping[str, SharedMemorySlice] | None = None,
) -> bytes:
    """A serialized ModelInferResponse (the output buffers are copied into it)."""
    return b"".join(encode_infer_response(entry, request_id, outputs, parameters, shm_outputs=shm_outputs))


def stream_response_bytes(
    entry: ModelEntry,
    request_id: str,
    outputs: list[OutputTensor],
    final: bool,
    parameters: Mapping[str, Any] | None = None,
    shm_outputs: Mapping[str, SharedMemorySlice] | None = None,
) -> bytes:
    """A serialized ModelStreamInferResponse carrying one response, flagged with ``triton_final_response``."""
    parts = encode_infer_response(entry, request_id, outputs, parameters, final, shm_outputs)
    size = sum(memoryview(part).nbytes for part in parts)
    return b"".join([_INFER_RESPONSE_TAG, encode_varint(size), *parts])


def stream_flag_bytes(request: pb.ModelInferRequest, error: str = "") -> bytes:
    """A stream response with no outputs: an error, or the empty final response a client asked for.

    As in Triton it names the request's id, model name and version as the request gave them (so an unversioned
    request gets ``model_version`` "") and is flagged final.
    """
    response = pb.ModelStreamInferResponse(error_message=error)
    infer = response.infer_response
    infer.id = request.id
    infer.model_name = request.model_name
    infer.model_version = request.model_version
    infer.parameters[FINAL_RESPONSE].bool_param = True
    return bytes(response.SerializeToString())
