"""KServe v2 / Triton over HTTP, as calls (no I/O): JSON headers with the binary tensor data extension for infer,
``generate_stream`` Server-Sent Events for streaming, Triton's repository extension for load and unload.

Inputs always travel as binary data after the JSON header, and ``binary_data_output`` asks for every output the
same way, so no tensor goes through JSON. Streaming over HTTP uses Triton's generate extension, which carries inputs
as flat JSON lists that the server reshapes by the model's declared shapes: a request whose shapes the server
would read differently (several rows where a dimension is variable, FP16/BF16, BYTES that are not UTF-8) is
refused here with a pointer to gRPC, which carries any tensor.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from pyserve.client.calls import HttpCall, HttpStreamCall, Outputs
from pyserve.client.errors import server_error
from pyserve.client.model import (
    Headers,
    InferRequest,
    RemoteModelConfig,
    TensorsInRegion,
    array_from_bytes,
    array_from_json,
    fill_shape,
    tensor_bytes,
    wire_datatype,
)
from pyserve.dtypes import as_bytes_array
from pyserve.errors import ERROR_KIND_HEADER, ClientError, InferenceError, UnsupportedError

_JSON_HEADERS = {"Content-Type": "application/json"}
# Compressing a response costs the server more than it saves on loopback or a LAN.
_NO_COMPRESSION = {"Accept-Encoding": "identity"}


def model_path(name: str, version: str | None) -> str:
    """``/v2/models/{name}[/versions/{version}]``, the name escaped."""
    path = f"/v2/models/{quote(name, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}" if version else path


def error_of(status: int, headers: Mapping[str, str], body: bytes, repository: bool = False) -> InferenceError:
    """The pyserve error of a non-200 answer (Triton's ``{"error": "..."}`` body, or whatever text came; the class
    pyserve's server names in a header)."""
    message = body.decode("utf-8", errors="replace")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    else:
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            message = doc["error"]
    kind = headers.get(ERROR_KIND_HEADER)
    return server_error(status, message or f"HTTP status {status}", repository=repository, kind=kind)


class HttpCodec:
    """The calls of the HTTP protocol (implements ``calls.Codec``); ``headers`` go with every call."""

    def __init__(self, headers: Headers | None = None) -> None:
        self._headers = dict(headers or {})
        self._json_headers = {**_JSON_HEADERS, **self._headers}

    def server_ready(self) -> HttpCall[bool]:
        """``GET /v2/health/ready``."""
        return HttpCall("server readiness", True, False, "GET", "/v2/health/ready", _ok, headers=self._headers)

    def model_ready(self, name: str, version: str | None) -> HttpCall[bool]:
        """``GET /v2/models/{m}/ready`` (any error answer is "not ready")."""
        path = f"{model_path(name, version)}/ready"
        return HttpCall(f"readiness of model '{name}'", True, False, "GET", path, _ok, headers=self._headers)

    def model_config(self, name: str, version: str | None) -> HttpCall[RemoteModelConfig]:
        """``GET /v2/models/{m}/config``."""

        def parse(status: int, headers: Mapping[str, str], body: bytes) -> RemoteModelConfig:
            if status != 200:
                raise error_of(status, headers, body)
            return RemoteModelConfig.from_json(_json(body, f"the configuration of model '{name}'"), name, version)

        path = f"{model_path(name, version)}/config"
        return HttpCall(f"configuration of model '{name}'", True, False, "GET", path, parse, headers=self._headers)

    def infer(self, request: InferRequest) -> HttpCall[Outputs]:
        """``POST /v2/models/{m}/infer``: binary inputs in, binary outputs back (or their places in a region)."""
        regions = request.regions
        described: list[dict[str, Any]] = []
        parts: list[bytes | memoryview] = []
        for name, array in request.inputs.items():
            datatype = wire_datatype(name, array)
            tensor: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
            placement = None if regions is None else regions.inputs.get(name)
            if placement is not None:
                tensor["parameters"] = placement.parameters()
            else:
                data = tensor_bytes(datatype, array)
                tensor["parameters"] = {"binary_data_size": len(data)}
                parts.append(data)
            described.append(tensor)
        parameters: dict[str, Any] = dict(request.parameters or {})
        parameters["binary_data_output"] = True
        doc: dict[str, Any] = {"inputs": described, "parameters": parameters}
        if regions is not None and regions.outputs:
            doc["outputs"] = [
                {"name": name, "parameters": placement.parameters()}
                if (placement := regions.outputs.get(name)) is not None
                else {"name": name, "parameters": {"binary_data": True}}
                for name in regions.requested
            ]
        header = orjson.dumps(doc)
        headers = {
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
            **_NO_COMPRESSION,
            **self._headers,
            **(request.headers or {}),
        }

        def parse(status: int, headers: Mapping[str, str], body: bytes) -> Outputs:
            return _parse_infer(status, headers, body, regions)

        what = f"infer on model '{request.model_name}'"
        path = f"{model_path(request.model_name, request.model_version)}/infer"
        return HttpCall(what, False, False, "POST", path, parse, b"".join([header, *parts]), headers)

    def stream(self, request: InferRequest, config: RemoteModelConfig) -> HttpStreamCall[Outputs]:
        """``POST /v2/models/{m}/generate_stream``: inputs as flat JSON lists, one event per response."""
        doc: dict[str, Any] = {name: _generate_input(config, name, array) for name, array in request.inputs.items()}
        if request.parameters:
            doc["parameters"] = dict(request.parameters)
        rows = _rows(config, request)

        def parse_event(data: bytes) -> Outputs:
            return _generate_outputs(config, rows, _json(data, f"a response of model '{config.model_name}'"))

        return HttpStreamCall(
            f"stream from model '{request.model_name}'",
            f"{model_path(request.model_name, request.model_version)}/generate_stream",
            orjson.dumps(doc),
            {
                **self._json_headers,
                **_NO_COMPRESSION,
                "Accept": "text/event-stream",
                **(request.headers or {}),
            },
            parse_event,
            _stream_error,
        )

    def load_model(self, name: str, config: str | None, files: Mapping[str, bytes] | None) -> HttpCall[None]:
        """``POST /v2/repository/models/{m}/load`` with Triton's ``config`` and ``file:<path>`` parameters."""
        parameters: dict[str, str] = {} if config is None else {"config": config}
        for path, content in (files or {}).items():
            key = path if path.startswith("file:") else f"file:{path}"
            parameters[key] = base64.b64encode(content).decode("ascii")
        body = orjson.dumps({"parameters": parameters})
        path = f"/v2/repository/models/{quote(name, safe='')}/load"
        return HttpCall(f"load of model '{name}'", False, True, "POST", path, _parse_done, body, self._json_headers)

    def unload_model(self, name: str) -> HttpCall[None]:
        """``POST /v2/repository/models/{m}/unload``."""
        path = f"/v2/repository/models/{quote(name, safe='')}/unload"
        what = f"unload of model '{name}'"
        return HttpCall(what, False, True, "POST", path, _parse_done, b"{}", self._json_headers)

    def register_region(self, name: str, key: str, byte_size: int) -> HttpCall[None]:
        """``POST /v2/systemsharedmemory/region/{name}/register`` of a whole object."""
        body = orjson.dumps({"key": key, "offset": 0, "byte_size": byte_size})
        path = f"/v2/systemsharedmemory/region/{quote(name, safe='')}/register"
        what = f"registration of shared-memory region '{name}'"
        return HttpCall(what, False, False, "POST", path, _parse_ok, body, self._json_headers)

    def unregister_region(self, name: str) -> HttpCall[None]:
        """``POST /v2/systemsharedmemory/region/{name}/unregister``."""
        path = f"/v2/systemsharedmemory/region/{quote(name, safe='')}/unregister"
        what = f"unregistration of shared-memory region '{name}'"
        return HttpCall(what, True, False, "POST", path, _parse_ok, b"", self._json_headers)


def _ok(status: int, headers: Mapping[str, str], body: bytes) -> bool:
    return status == 200


def _parse_done(status: int, headers: Mapping[str, str], body: bytes) -> None:
    if status != 200:
        raise error_of(status, headers, body, repository=True)


def _parse_ok(status: int, headers: Mapping[str, str], body: bytes) -> None:
    if status != 200:
        raise error_of(status, headers, body)


def _json(data: bytes | memoryview, what: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        # Servers write NaN and Infinity as bare tokens in JSON tensors (Triton and pyserve do); orjson refuses
        # them, the standard library reads them.
        try:
            doc = json.loads(bytes(data))
        except ValueError:
            raise ClientError(f"the server sent {what} that is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ClientError(f"the server sent {what} that is not a JSON object")
    return doc


def _parse_infer(status: int, headers: Mapping[str, str], body: bytes, regions: TensorsInRegion | None) -> Outputs:
    if status != 200:
        raise error_of(status, headers, body)
    view = memoryview(body)
    length = headers.get("inference-header-content-length")
    header_length = len(view) if length is None else int(length)
    doc = _json(view[:header_length], "an infer response")
    binary = view[header_length:]
    outputs: Outputs = {}
    offset = 0
    try:
        for output in doc.get("outputs", ()):
            name, datatype, shape = output["name"], output["datatype"], list(output["shape"])
            size = (output.get("parameters") or {}).get("binary_data_size")
            if regions is not None and size is None and "data" not in output:
                outputs[name] = regions.read_output(name, datatype, shape)  # the server wrote it into the region
            elif size is None:
                outputs[name] = array_from_json(datatype, shape, output["data"])
            else:
                outputs[name] = array_from_bytes(datatype, shape, binary[offset : offset + size])
                offset += size
    except (KeyError, TypeError, ValueError) as exc:
        raise ClientError(f"the server sent an infer response that cannot be read: {exc!r}") from None
    return outputs


def _stream_error(status: int, body: bytes) -> Exception:
    # Before the stream starts, an error is a JSON object; a first response that is an error comes as its event.
    text = body.strip()
    if text.startswith(b"data:"):
        text = text[len(b"data:") :].split(b"\n\n", 1)[0].strip()
    return error_of(status, {}, text)


def _rows(config: RemoteModelConfig, request: InferRequest) -> int | None:
    if not config.batching:
        return None
    return next((array.shape[0] for array in request.inputs.values() if array.ndim), 1)


def _generate_input(config: RemoteModelConfig, name: str, array: np.ndarray) -> Any:
    datatype = wire_datatype(name, array)
    declared = next((t for t in config.inputs if t.name == name), None)
    hint = "stream over gRPC (grpc://) instead"
    if datatype in ("FP16", "BF16"):
        raise UnsupportedError(f"input '{name}': HTTP streaming sends JSON, which cannot carry {datatype}; {hint}")
    if declared is not None:
        shape = _generate_shape(([-1] if config.batching else []) + list(declared.shape), array.size)
        if shape is not None and shape != list(array.shape):
            raise UnsupportedError(
                f"input '{name}': HTTP streaming sends inputs flat and the server would read shape {shape}, "
                f"not {list(array.shape)}; {hint}"
            )
    if datatype == "BYTES":
        try:
            return [item.decode("utf-8") for item in as_bytes_array(array).reshape(-1)]
        except UnicodeDecodeError:
            raise UnsupportedError(f"input '{name}': HTTP streaming sends BYTES as UTF-8 text; {hint}") from None
    return array.reshape(-1).tolist()


def _generate_shape(shape: list[int], count: int) -> list[int] | None:
    """The shape the server gives ``count`` elements of a generate input (docs/grpc.md): fixed dimensions take
    their share, the innermost variable one the rest, other variable ones 1. None where they do not fit (the
    server says why)."""
    remaining = count
    for dim in shape:
        if dim != -1:
            if remaining % dim:
                return None
            remaining //= dim
    filled = list(shape)
    for index in range(len(filled) - 1, -1, -1):
        if filled[index] == -1:
            filled[index], remaining = remaining, 1
    return filled if remaining == 1 else None


def _generate_outputs(config: RemoteModelConfig, rows: int | None, doc: dict[str, Any]) -> Outputs:
    error = doc.get("error")
    if isinstance(error, str):
        raise server_error(None, error)
    outputs: Outputs = {}
    for tensor in config.outputs:
        if tensor.name not in doc:
            continue
        value = doc[tensor.name]
        flat = value if isinstance(value, list) else [value]
        shape = fill_shape(tensor.shape, rows, len(flat))
        outputs[tensor.name] = array_from_json(tensor.datatype, shape, flat)
    return outputs


class EventReader:
    """Splits a Server-Sent Events body into each event's data, whatever chunks it arrives in."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event that ``chunk`` completes."""
        self._buffer += chunk
        events: list[bytes] = []
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if not newline:
                return events
            self._buffer = rest
            line = line.rstrip(b"\r")
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[len(b"data:") :]
                self._data.append(value[1:] if value.startswith(b" ") else value)

    def end(self) -> list[bytes]:
        """The data of an event the body ended without closing (no blank line after it)."""
        events = self.feed(b"\n\n") if self._buffer or self._data else []
        self._buffer = b""
        return events
