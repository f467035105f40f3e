"""KServe v2 / Triton over gRPC (``inference.GRPCInferenceService``), as calls (no I/O), with pyserve's own stubs.

Messages are pyserve's generated ones (``pyserve.frontends.protocol``, in pyserve's own descriptor pool, so this
client and ``tritonclient`` live in one process). Calls carry serialized bytes: an infer request's tensors are
appended as ``raw_input_contents`` fields after the protobuf-serialized rest, so each input is copied once, into
the request (the server does the same with its outputs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import grpc
import grpc.aio
from google.protobuf import json_format

from pyserve.client.calls import GrpcCall, GrpcStreamCall, Outputs, T, timeout_message
from pyserve.client.errors import server_error
from pyserve.client.model import (
    Headers,
    InferRequest,
    RemoteModelConfig,
    ServerAddress,
    TensorsInRegion,
    array_from_bytes,
    tensor_bytes,
    wire_datatype,
)
from pyserve.errors import (
    ERROR_KIND_HEADER,
    ClientError,
    ClientTimeoutError,
    InferenceError,
    PyServeError,
    ServerUnreachableError,
)
from pyserve.frontends.grpc_codec import encode_varint, set_parameter
from pyserve.frontends.protocol import grpc_service_pb2 as pb
from pyserve.frontends.shared_memory import REGION

SERVICE = "/inference.GRPCInferenceService/"
_RAW_INPUT_TAG = b"\x3a"  # ModelInferRequest.raw_input_contents: field 7, length-delimited
_FINAL = "triton_final_response"
_EMPTY_FINAL = "triton_enable_empty_final_response"
# Tensors of any size (the server takes up to 2 GiB - 1); after a failed connect, try again after 0.1-0.5 s rather
# than gRPC's 1-120 s, so a restarted server is reached again at once.
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)


def grpc_channel(address: ServerAddress, aio: bool = False) -> Any:
    """A channel to ``address`` (grpc.Channel, or grpc.aio.Channel with ``aio``), over TLS when it says so. It
    connects on its first call."""
    module: Any = grpc.aio if aio else grpc
    if address.tls is None:
        return module.insecure_channel(address.authority, options=CHANNEL_OPTIONS)
    return module.secure_channel(address.authority, address.tls.grpc_credentials(), options=CHANNEL_OPTIONS)


# A call that found no connection waits this long (at most) for the channel to connect again, then is sent once
# more: longer than the longest reconnect backoff, so a server that came back is reached.
RECONNECT_GRACE_S = 0.6
# What gRPC's own UNAVAILABLE says when there is no connection (a server's UNAVAILABLE says something else).
_NO_CONNECTION = re.compile(
    r"failed to connect|connection refused|connection reset|socket closed|broken pipe|endpoint closing|"
    r"dns resolution failed|connection aborted|goaway",
    re.IGNORECASE,
)


def _not_ready(error: InferenceError) -> bool:
    return False


class GrpcCodec:
    """The calls of the gRPC protocol (implements ``calls.Codec``); ``headers`` go with every call as metadata."""

    def __init__(self, headers: Headers | None = None) -> None:
        self._metadata = _metadata(headers)

    def server_ready(self) -> GrpcCall[bool]:
        """``ServerReady``."""
        return GrpcCall(
            "server readiness",
            True,
            False,
            SERVICE + "ServerReady",
            pb.ServerReadyRequest().SerializeToString(),
            lambda data: bool(pb.ServerReadyResponse.FromString(data).ready),
            self._metadata,
        )

    def model_ready(self, name: str, version: str | None) -> GrpcCall[bool]:
        """``ModelReady`` (any error answer is "not ready")."""
        return GrpcCall(
            f"readiness of model '{name}'",
            True,
            False,
            SERVICE + "ModelReady",
            pb.ModelReadyRequest(name=name, version=version or "").SerializeToString(),
            lambda data: bool(pb.ModelReadyResponse.FromString(data).ready),
            self._metadata,
            on_error=_not_ready,
        )

    def model_config(self, name: str, version: str | None) -> GrpcCall[RemoteModelConfig]:
        """``ModelConfig``, read through Triton's JSON form of the message."""

        def parse(data: bytes) -> RemoteModelConfig:
            config = pb.ModelConfigResponse.FromString(data).config
            doc = json_format.MessageToDict(config, preserving_proto_field_name=True)
            return RemoteModelConfig.from_json(doc, name, version)

        request = pb.ModelConfigRequest(name=name, version=version or "").SerializeToString()
        what = f"configuration of model '{name}'"
        return GrpcCall(what, True, False, SERVICE + "ModelConfig", request, parse, self._metadata)

    def infer(self, request: InferRequest) -> GrpcCall[Outputs]:
        """``ModelInfer`` with raw input contents (or their places in a region)."""
        regions = request.regions

        def parse(data: bytes) -> Outputs:
            return _outputs(pb.ModelInferResponse.FromString(data), regions)

        return GrpcCall(
            f"infer on model '{request.model_name}'",
            False,
            False,
            SERVICE + "ModelInfer",
            _infer_request_bytes(request),
            parse,
            self._call_metadata(request.headers),
        )

    def stream(self, request: InferRequest, config: RemoteModelConfig) -> GrpcStreamCall[Outputs]:
        """``ModelStreamInfer`` carrying this one request; its end is the response flagged final."""
        return GrpcStreamCall(
            f"stream from model '{request.model_name}'",
            SERVICE + "ModelStreamInfer",
            _infer_request_bytes(request, {_EMPTY_FINAL: True}),
            _parse_stream_message,
            self._call_metadata(request.headers),
        )

    def load_model(self, name: str, config: str | None, files: Mapping[str, bytes] | None) -> GrpcCall[None]:
        """``RepositoryModelLoad`` with Triton's ``config`` and ``file:<path>`` parameters."""
        message = pb.RepositoryModelLoadRequest(model_name=name)
        if config is not None:
            message.parameters["config"].string_param = config
        for path, content in (files or {}).items():
            message.parameters[path if path.startswith("file:") else f"file:{path}"].bytes_param = content
        return GrpcCall(
            f"load of model '{name}'",
            False,
            True,
            SERVICE + "RepositoryModelLoad",
            message.SerializeToString(),
            _ignore,
            self._metadata,
        )

    def unload_model(self, name: str) -> GrpcCall[None]:
        """``RepositoryModelUnload``."""
        request = pb.RepositoryModelUnloadRequest(model_name=name).SerializeToString()
        what = f"unload of model '{name}'"
        return GrpcCall(what, False, True, SERVICE + "RepositoryModelUnload", request, _ignore, self._metadata)

    def register_region(self, name: str, key: str, byte_size: int) -> GrpcCall[None]:
        """``SystemSharedMemoryRegister`` of a whole object."""
        request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=byte_size)
        what = f"registration of shared-memory region '{name}'"
        method = SERVICE + "SystemSharedMemoryRegister"
        return GrpcCall(what, False, False, method, request.SerializeToString(), _ignore, self._metadata)

    def unregister_region(self, name: str) -> GrpcCall[None]:
        """``SystemSharedMemoryUnregister`` of one region."""
        request = pb.SystemSharedMemoryUnregisterRequest(name=name).SerializeToString()
        what = f"unregistration of shared-memory region '{name}'"
        method = SERVICE + "SystemSharedMemoryUnregister"
        return GrpcCall(what, True, False, method, request, _ignore, self._metadata)

    def _call_metadata(self, headers: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
        """The client's metadata, and a call's own headers over it."""
        if not headers:
            return self._metadata
        return tuple({**dict(self._metadata), **dict(_metadata(headers))}.items())


def _ignore(data: bytes) -> None:
    return None


def _metadata(headers: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    # gRPC metadata keys are lower-case.
    return tuple((key.lower(), str(value)) for key, value in (headers or {}).items())


def _infer_request_bytes(request: InferRequest, extra: Mapping[str, Any] | None = None) -> bytes:
    message = pb.ModelInferRequest(model_name=request.model_name, model_version=request.model_version or "")
    regions = request.regions
    raw: list[bytes | memoryview] = []
    for name, array in request.inputs.items():
        datatype = wire_datatype(name, array)
        tensor = message.inputs.add(name=name, datatype=datatype, shape=array.shape)
        placement = None if regions is None else regions.inputs.get(name)
        if placement is not None:
            _set_parameters(tensor.parameters, placement.parameters())
        else:
            raw.append(tensor_bytes(datatype, array))
    if regions is not None and regions.outputs:
        for name in regions.requested:
            output = message.outputs.add(name=name)
            if (placement := regions.outputs.get(name)) is not None:
                _set_parameters(output.parameters, placement.parameters())
    for key, value in {**(request.parameters or {}), **(extra or {})}.items():
        if key == "priority" and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            message.parameters[key].uint64_param = value  # as tritonclient sends it
        else:
            set_parameter(message.parameters[key], value)
    parts: list[bytes | memoryview] = [message.SerializeToString()]
    for data in raw:
        parts += (_RAW_INPUT_TAG, encode_varint(len(data)), data)
    return b"".join(parts)


def _set_parameters(parameters: Any, values: Mapping[str, str | int]) -> None:
    for key, value in values.items():
        set_parameter(parameters[key], value)


def _outputs(response: pb.ModelInferResponse, regions: TensorsInRegion | None = None) -> Outputs:
    raw = response.raw_output_contents
    if len(raw) != len(response.outputs):
        raise ClientError(
            f"the server sent {len(response.outputs)} output(s) with {len(raw)} raw contents; expected one each"
        )
    outputs: Outputs = {}
    for index, output in enumerate(response.outputs):
        shape = list(output.shape)
        if regions is not None and REGION in output.parameters:
            outputs[output.name] = regions.read_output(output.name, output.datatype, shape)
        else:
            outputs[output.name] = array_from_bytes(output.datatype, shape, raw[index])
    return outputs


def _parse_stream_message(data: bytes) -> tuple[Outputs | None, bool]:
    message = pb.ModelStreamInferResponse.FromString(data)
    if message.error_message:
        raise server_error(None, message.error_message)
    response = message.infer_response
    final = _FINAL in response.parameters and response.parameters[_FINAL].bool_param
    return (_outputs(response) if response.outputs else None), final


def rpc_error(exc: Any, what: str, timeout_s: float, address: ServerAddress, repository: bool = False) -> PyServeError:
    """The error for a failed gRPC call (``exc``, a grpc.RpcError or grpc.aio.AioRpcError): the client's own
    deadline or a missing connection, else the server's answer mapped to pyserve's error class (the one named in
    its trailing metadata, where pyserve's server put it)."""
    code: str = exc.code().name
    details: str = exc.details() or ""
    if code == "DEADLINE_EXCEEDED" and details in ("", "Deadline Exceeded"):
        return ClientTimeoutError(timeout_message(what, timeout_s))
    if code == "UNAVAILABLE" and _NO_CONNECTION.search(details):
        return ServerUnreachableError(str(address), details)
    kind = next((str(value) for key, value in exc.trailing_metadata() or () if key == ERROR_KIND_HEADER), None)
    return server_error(code, details or code, repository=repository, kind=kind)


def answer_or_raise(call: GrpcCall[T], error: PyServeError) -> T:
    """What a failed call comes to: its ``on_error`` answer where the server answered an error, else ``error``."""
    if call.on_error is not None and isinstance(error, InferenceError) and not isinstance(error, ClientTimeoutError):
        return call.on_error(error)
    raise error from None
