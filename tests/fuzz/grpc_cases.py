"""Hostile gRPC messages as hypothesis strategies, each with what a correct answer looks like.

ModelInferRequest messages for the identity models (valid ones, and ones changed by a mutation from a catalogue:
wrong sizes, datatypes, shapes, raw contents that do not match, huge and negative dimensions, duplicate names...),
the same messages damaged byte by byte (the server cuts raw contents out of the wire format itself), and messages
for every other RPC of the service.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from pyserve.frontends.protocol import grpc_service_pb2 as pb

from .models import (
    DATATYPES,
    MAX_REQUEST_BYTES,
    MODEL_NAMES,
    Tensor,
    from_raw,
    same_values,
    same_values_reshaped,
    tensors,
)

# The typed contents field of each datatype (FP16 and BF16 have none).
CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT32": "uint_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class GrpcCase:
    """One message for one method, and what its answer may be: ``may_succeed`` / ``may_fail`` whether OK / an error
    is correct; an error's details must contain one of ``expect`` (any non-empty text when empty); ``check`` looks at
    a successful ModelInferResponse and returns what is wrong with it. ``id`` is the request's id when it has a unique
    one (a stream's answers are matched to their requests by it)."""

    def __init__(
        self,
        label: str,
        data: bytes,
        method: str = "ModelInfer",
        may_succeed: bool = True,
        may_fail: bool = True,
        expect: tuple[str, ...] = (),
        check: Callable[[pb.ModelInferResponse], str | None] | None = None,
        request_id: str = "",
    ) -> None:
        self.label = label
        self.data = data
        self.method = method
        self.may_succeed = may_succeed
        self.may_fail = may_fail
        self.expect = expect
        self.check = check
        self.id = request_id

    def __repr__(self) -> str:
        data = self.data if len(self.data) <= 300 else self.data[:300] + b"..."
        return f"GrpcCase({self.label!r}, {self.method}, {data!r})"


_ODD_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "INPUT0 ", "input0", "OUTPUT0", "\x00", "x" * 300, "triton_x", "😀"]),
)
_INT64 = st.integers(-(2**63), 2**63 - 1)
_ODD_SHAPES = st.one_of(
    st.lists(st.integers(-3, 6), max_size=5),
    st.lists(st.sampled_from([-1, 0, 1, 2**31, 2**62, 2**63 - 1, -(2**63)]), min_size=1, max_size=4),
    st.lists(st.integers(0, 2), min_size=33, max_size=40),
    st.lists(_INT64, max_size=3),
)


@st.composite
def _parameter(draw: st.DrawFn) -> pb.InferParameter:
    choice = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]))
    value = {
        "bool_param": st.booleans(),
        "int64_param": _INT64,
        "string_param": st.text(max_size=8),
        "double_param": st.floats(),
        "uint64_param": st.integers(0, 2**64 - 1),
    }[choice]
    return pb.InferParameter(**{choice: draw(value)})


def _parameters() -> st.SearchStrategy[dict[str, pb.InferParameter]]:
    names = st.one_of(_ODD_TEXT, st.sampled_from(["binary_data_output", "triton_enable_empty_final_response"]))
    return st.dictionaries(names, _parameter(), max_size=3)


def _round_trip(tensor: Tensor) -> Callable[[pb.ModelInferResponse], str | None]:
    def check(response: pb.ModelInferResponse) -> str | None:
        if len(response.outputs) != 1 or len(response.raw_output_contents) != 1:
            return f"{len(response.outputs)} outputs, {len(response.raw_output_contents)} raw output contents"
        output = response.outputs[0]
        shape = list(output.shape)
        return same_values(
            tensor, output.datatype, shape, from_raw(output.datatype, shape, response.raw_output_contents[0])
        )

    return check


@st.composite
def _valid_infer(draw: st.DrawFn) -> tuple[Tensor, pb.ModelInferRequest]:
    tensor = draw(tensors())
    message = pb.ModelInferRequest(model_name=tensor.model, id=draw(st.text(max_size=6)))
    if draw(st.booleans()):
        message.model_version = "1"
    entry = message.inputs.add(name="INPUT0", datatype=tensor.datatype, shape=tensor.shape)
    field = CONTENTS.get(tensor.datatype)
    if field is None or draw(st.booleans()):
        message.raw_input_contents.append(tensor.raw())
    else:
        values = tensor.array.reshape(-1)
        getattr(entry.contents, field).extend(list(values) if tensor.datatype == "BYTES" else values.tolist())
    if draw(st.booleans()):
        message.outputs.add(name="OUTPUT0")
    return tensor, message


Mutation = Callable[[st.DrawFn, pb.ModelInferRequest], tuple[tuple[str, ...], bool]]


def _mutate_model(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    message.model_name = draw(st.one_of(_ODD_TEXT, st.sampled_from(MODEL_NAMES)))
    return ("model", "input"), True


def _mutate_version(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    version = draw(st.one_of(_ODD_TEXT, st.sampled_from(["0", "2", "-1", "01", "1 ", "+1"])))
    message.model_version = version
    try:
        number: int | None = int(version)  # as Triton reads it: "01" and " 1" are version 1
    except ValueError:
        number = None
    return ("version", "model"), version == "" or number == 1


def _mutate_datatype(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    before = message.inputs[0].datatype
    message.inputs[0].datatype = draw(st.one_of(st.sampled_from(DATATYPES), _ODD_TEXT))
    return ("INPUT0",), message.inputs[0].datatype == before


def _mutate_shape(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    before = list(message.inputs[0].shape)
    after = draw(_ODD_SHAPES)
    if same_values_reshaped(message.model_name, before, after):
        after = before  # the same values in another valid shape (batch 3 of 1 as batch 1 of 3): no mutation
    del message.inputs[0].shape[:]
    message.inputs[0].shape.extend(after)
    return ("INPUT0", "batch size"), after == before


def _mutate_raw(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    how = draw(st.sampled_from(["longer", "shorter", "extra", "none", "also-contents"]))
    raw = bytes(message.raw_input_contents[0]) if message.raw_input_contents else b""
    del message.raw_input_contents[:]
    if how == "longer":
        message.raw_input_contents.append(raw + draw(st.binary(min_size=1, max_size=9)))
    elif how == "shorter":
        message.raw_input_contents.append(raw[: draw(st.integers(0, max(0, len(raw) - 1)))])
    elif how == "extra":
        message.raw_input_contents.extend([raw, draw(st.binary(max_size=8))])
    elif how == "also-contents":
        message.raw_input_contents.append(raw)
        message.inputs[0].contents.fp32_contents.append(1.0)
    else:
        message.inputs[0].ClearField("contents")
    return ("INPUT0", "raw_input_contents"), how == "shorter" and not raw


def _mutate_contents(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    del message.raw_input_contents[:]
    contents = message.inputs[0].contents
    contents.Clear()
    field = draw(st.sampled_from(sorted(set(CONTENTS.values()))))
    values = {
        "bool_contents": st.booleans(),
        "int_contents": st.integers(-(2**31), 2**31 - 1),
        "int64_contents": _INT64,
        "uint_contents": st.integers(0, 2**32 - 1),
        "uint64_contents": st.integers(0, 2**64 - 1),
        "fp32_contents": st.floats(width=32),
        "fp64_contents": st.floats(),
        "bytes_contents": st.binary(max_size=4),
    }[field]
    getattr(contents, field).extend(draw(st.lists(values, max_size=9)))
    return ("INPUT0",), True


def _mutate_duplicate(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    message.inputs.append(message.inputs[0])
    if message.raw_input_contents and draw(st.booleans()):
        message.raw_input_contents.append(message.raw_input_contents[0])
    return ("more than once", "raw_input_contents"), False


def _mutate_name(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    message.inputs[0].name = draw(_ODD_TEXT)
    return ("input",), message.inputs[0].name == "INPUT0"


def _mutate_inputs(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    del message.inputs[:]
    return ("input",), False


def _mutate_parameters(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    for name, value in draw(_parameters()).items():
        message.parameters[name].CopyFrom(value)
    return ("parameter",), True


def _mutate_outputs(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    name = draw(st.one_of(_ODD_TEXT, st.just("OUTPUT0")))
    output = message.outputs.add(name=name)
    for key, value in draw(
        st.one_of(_parameters(), st.just({"classification": pb.InferParameter(int64_param=2)}))
    ).items():
        output.parameters[key].CopyFrom(value)
    return ("output",), True


def _mutate_shared_memory(draw: st.DrawFn, message: pb.ModelInferRequest) -> tuple[tuple[str, ...], bool]:
    keys = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
    where = message.inputs[0].parameters if draw(st.booleans()) else message.outputs.add(name="OUTPUT0").parameters
    for key in draw(st.lists(st.sampled_from(keys), min_size=1, unique=True)):
        where[key].CopyFrom(draw(_parameter()))
    return ("shared memory", "INPUT0", "OUTPUT0", "raw_input_contents"), False


MUTATIONS: dict[str, Mutation] = {
    "model": _mutate_model,
    "version": _mutate_version,
    "datatype": _mutate_datatype,
    "shape": _mutate_shape,
    "raw": _mutate_raw,
    "contents": _mutate_contents,
    "duplicate": _mutate_duplicate,
    "name": _mutate_name,
    "parameters": _mutate_parameters,
    "outputs": _mutate_outputs,
    "shared_memory": _mutate_shared_memory,
    "inputs": _mutate_inputs,  # last: the others change the first input
}


@st.composite
def infer_cases(draw: st.DrawFn, request_id: str = "") -> GrpcCase:
    """A valid ModelInferRequest of an identity model, or one changed by a mutation; ``request_id`` replaces its
    id (a stream matches answers to requests by it)."""
    tensor, message = draw(_valid_infer())
    if request_id:
        message.id = request_id
    name = draw(st.one_of(st.none(), st.sampled_from(list(MUTATIONS))))
    if name is None:
        return GrpcCase(
            f"infer {tensor.model} valid",
            message.SerializeToString(),
            may_fail=False,
            check=_round_trip(tensor),
            request_id=message.id,
        )
    expect, may_succeed = MUTATIONS[name](draw, message)
    label = f"infer {tensor.model} {name}"
    return GrpcCase(label, message.SerializeToString(), may_succeed=may_succeed, expect=expect, request_id=message.id)


@st.composite
def damaged_cases(draw: st.DrawFn) -> GrpcCase:
    """A valid message damaged on the wire: cut short, bytes changed, bytes or whole fields added."""
    _, message = draw(_valid_infer())
    data = bytearray(message.SerializeToString())
    how = draw(st.sampled_from(["cut", "flip", "insert", "field", "noise"]))
    if how == "cut" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif how == "flip" and data:
        rng = random.Random(draw(st.integers(0, 2**32)))
        for _ in range(draw(st.integers(1, 4))):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif how == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=8))
    elif how == "field":
        # A field of any number and wire type, its length (if any) anything.
        tag = draw(st.integers(1, 2**29 - 1)) << 3 | draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7]))
        data += _varint(tag) + _varint(draw(st.integers(0, 2**64 - 1))) + draw(st.binary(max_size=8))
    else:
        data = bytearray(draw(st.binary(max_size=64)))
    return GrpcCase(f"damaged ({how})", bytes(data))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def oversized_case() -> GrpcCase:
    """A message past max_request_bytes: RESOURCE_EXHAUSTED."""
    values = np.zeros(MAX_REQUEST_BYTES // 4 + 16, np.float32)
    message = pb.ModelInferRequest(model_name="identity_fp32")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, values.size])
    message.raw_input_contents.append(values.tobytes())
    return GrpcCase("oversized", message.SerializeToString(), may_succeed=False, expect=("larger than max",))


# other RPCs -----------------------------------------------------------------------------------------------------


@st.composite
def other_cases(draw: st.DrawFn) -> GrpcCase:
    """A message for another RPC of the service: odd names and versions, settings, repository calls, shared-memory
    registrations, or bytes that are no message at all."""
    name = st.one_of(_ODD_TEXT, st.sampled_from(MODEL_NAMES))
    choices: dict[str, Callable[[], Any]] = {
        "ServerLive": lambda: pb.ServerLiveRequest(),
        "ServerReady": lambda: pb.ServerReadyRequest(),
        "ServerMetadata": lambda: pb.ServerMetadataRequest(),
        "ModelReady": lambda: pb.ModelReadyRequest(name=draw(name), version=draw(_ODD_TEXT)),
        "ModelMetadata": lambda: pb.ModelMetadataRequest(name=draw(name), version=draw(_ODD_TEXT)),
        "ModelConfig": lambda: pb.ModelConfigRequest(name=draw(name), version=draw(_ODD_TEXT)),
        "ModelStatistics": lambda: pb.ModelStatisticsRequest(name=draw(name), version=draw(_ODD_TEXT)),
        "RepositoryIndex": lambda: pb.RepositoryIndexRequest(
            repository_name=draw(_ODD_TEXT), ready=draw(st.booleans())
        ),
        # Never the fuzz server's own models: an unload that worked would take them away.
        "RepositoryModelLoad": lambda: pb.RepositoryModelLoadRequest(model_name="fuzz-" + draw(_ODD_TEXT)),
        "RepositoryModelUnload": lambda: pb.RepositoryModelUnloadRequest(model_name="fuzz-" + draw(_ODD_TEXT)),
        "TraceSetting": lambda: _trace_setting(draw),
        "LogSettings": lambda: _log_settings(draw),
        "SystemSharedMemoryStatus": lambda: pb.SystemSharedMemoryStatusRequest(name=draw(_ODD_TEXT)),
        "SystemSharedMemoryRegister": lambda: pb.SystemSharedMemoryRegisterRequest(
            name=draw(_ODD_TEXT),
            key=draw(st.one_of(_ODD_TEXT, st.sampled_from(["/fuzz-none", "a\x00b", "../x", "/"]))),
            offset=draw(st.integers(0, 2**64 - 1)),
            byte_size=draw(st.integers(0, 2**64 - 1)),
        ),
        "SystemSharedMemoryUnregister": lambda: pb.SystemSharedMemoryUnregisterRequest(name="fuzz-" + draw(_ODD_TEXT)),
        "CudaSharedMemoryStatus": lambda: pb.CudaSharedMemoryStatusRequest(name=draw(_ODD_TEXT)),
        "CudaSharedMemoryRegister": lambda: pb.CudaSharedMemoryRegisterRequest(
            name=draw(_ODD_TEXT),
            raw_handle=draw(st.binary(max_size=80)),
            device_id=draw(st.integers(-(2**63), 2**63 - 1)),
            byte_size=draw(st.integers(0, 2**64 - 1)),
        ),
        "CudaSharedMemoryUnregister": lambda: pb.CudaSharedMemoryUnregisterRequest(name="fuzz-" + draw(_ODD_TEXT)),
    }
    method = draw(st.sampled_from(sorted(choices)))
    if draw(st.integers(0, 4)) == 0:
        return GrpcCase(f"{method} (noise)", draw(st.binary(max_size=32)), method)
    return GrpcCase(method, choices[method]().SerializeToString(), method)


def _trace_setting(draw: st.DrawFn) -> pb.TraceSettingRequest:
    message = pb.TraceSettingRequest(model_name=draw(st.one_of(st.just(""), st.sampled_from(MODEL_NAMES), _ODD_TEXT)))
    keys = ["trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode"]
    for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        message.settings[key].value.extend(draw(st.lists(_ODD_TEXT, max_size=2)))
    # Settings apply all or nothing: an unknown key leaves them as they are, whatever the others hold.
    message.settings["fuzz_unknown_setting"].value.append("1")
    return message


def _log_settings(draw: st.DrawFn) -> pb.LogSettingsRequest:
    message = pb.LogSettingsRequest()
    keys = ["log_info", "log_warning", "log_verbose_level", "log_format", "log_file"]
    for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        setting = message.settings[key]
        choice = draw(st.sampled_from(["bool_param", "uint32_param", "string_param"]))
        value = {"bool_param": st.booleans(), "uint32_param": st.integers(0, 2**32 - 1), "string_param": _ODD_TEXT}
        setattr(setting, choice, draw(value[choice]))
    message.settings["fuzz_unknown_setting"].bool_param = True
    return message
