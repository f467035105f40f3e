"""The blocking calls a benchmark makes beside its load: the model's description and its statistics.

They go over the benchmark's own protocol, on pyserve's client transports and codecs, so they work with any KServe
v2 server: the model's configuration (Triton's ``/config``) where the server has one, else its KServe metadata;
the statistics extension where the server offers it (None where it does not: the server-side split is then left
out, as perf_analyzer leaves it out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from google.protobuf import json_format

from pyserve.client.calls import Call, GrpcCall, HttpCall, Transport
from pyserve.client.grpc_codec import SERVICE, GrpcCodec
from pyserve.client.http_codec import HttpCodec, error_of, model_path
from pyserve.client.model import RemoteModelConfig, ServerAddress, parse_url
from pyserve.client.tls import ClientTls
from pyserve.client.transports import GrpcTransport, HttpTransport
from pyserve.config import Tensor
from pyserve.errors import ClientError, ConfigError, InferenceError
from pyserve.frontends.protocol import grpc_service_pb2 as pb

CALL_TIMEOUT_S = 10.0


class ServerCalls:
    """Blocking calls to one server about one model; ``close()`` (or ``with``) closes the connection."""

    def __init__(
        self,
        url: str,
        model: str,
        version: str | None = None,
        headers: Mapping[str, str] | None = None,
        tls: ClientTls | None = None,
    ):
        self.address: ServerAddress = parse_url(url, tls)
        self.model = model
        self.version = version
        self._headers = dict(headers or {})
        self._metadata_pairs = tuple((key.lower(), value) for key, value in self._headers.items())
        self._transport: Transport
        if self.address.scheme == "http":
            self._transport = HttpTransport(self.address, CALL_TIMEOUT_S, 2)
        else:
            self._transport = GrpcTransport(self.address)

    def __enter__(self) -> ServerCalls:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self._transport.close()

    def _run(self, call: Call[Any]) -> Any:
        return self._transport.run(call, CALL_TIMEOUT_S)

    def describe(self) -> RemoteModelConfig:
        """The model's inputs and batching: its configuration, or its metadata on a server without the config
        endpoint (then ``max_batch_size`` is 0 and shapes are the metadata's, batch dimension included)."""
        codec = HttpCodec(self._headers) if self.address.scheme == "http" else GrpcCodec(self._headers)
        try:
            config: RemoteModelConfig = self._run(codec.model_config(self.model, self.version))
        except InferenceError:
            return self._metadata()
        if not config.inputs:
            raise ConfigError(f"model '{self.model}' declares no inputs in its configuration: nothing to send")
        return config

    def _metadata(self) -> RemoteModelConfig:
        doc: dict[str, Any] = self._run(self._metadata_call())

        def tensors(key: str) -> tuple[Tensor, ...]:
            return tuple(
                Tensor(str(item["name"]), str(item["datatype"]), tuple(int(dim) for dim in item.get("shape", ())))
                for item in doc.get(key, ())
            )

        try:
            inputs, outputs = tensors("inputs"), tensors("outputs")
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise ClientError(f"model '{self.model}': cannot read the metadata the server sent: {exc}") from None
        if not inputs:
            raise ConfigError(f"model '{self.model}' declares no inputs in its metadata: nothing to send")
        return RemoteModelConfig(self.model, self.version, 0, False, inputs, outputs, document=doc)

    def _metadata_call(self) -> Call[dict[str, Any]]:
        what = f"metadata of model '{self.model}'"
        if self.address.scheme == "http":
            path = model_path(self.model, self.version)
            return HttpCall(what, True, False, "GET", path, _http_json, headers=self._headers)
        request = pb.ModelMetadataRequest(name=self.model, version=self.version or "").SerializeToString()
        return GrpcCall(what, True, False, SERVICE + "ModelMetadata", request, _metadata_json, self._metadata_pairs)

    def statistics(self) -> dict[str, Any] | None:
        """The model's statistics document (Triton's JSON form), or None where the server offers none."""
        what = f"statistics of model '{self.model}'"
        call: Call[dict[str, Any]]
        if self.address.scheme == "http":
            path = f"{model_path(self.model, self.version)}/stats"
            call = HttpCall(what, True, False, "GET", path, _http_json, headers=self._headers)
        else:
            request = pb.ModelStatisticsRequest(name=self.model, version=self.version or "").SerializeToString()
            method = SERVICE + "ModelStatistics"
            call = GrpcCall(what, True, False, method, request, _statistics_json, self._metadata_pairs)
        try:
            stats: dict[str, Any] = self._run(call)
        except InferenceError:
            return None
        return stats


def _http_json(status: int, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    if status != 200:
        raise error_of(status, headers, body)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ClientError(f"the server answered with something that is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ClientError("the server answered with JSON that is not an object")
    return doc


def _metadata_json(data: bytes) -> dict[str, Any]:
    message = pb.ModelMetadataResponse.FromString(data)
    doc: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return doc


def _statistics_json(data: bytes) -> dict[str, Any]:
    message = pb.ModelStatisticsResponse.FromString(data)
    # Zero counters are left out of proto3 JSON and 64-bit integers come as strings: server_stats reads both.
    doc: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return doc
