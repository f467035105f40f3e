"""KServe v2 infer bodies <-> numpy, for the ASGI app (``pyserve.routes.kserve_app``): the request's JSON tensors
or binary tensor data extension become the arrays ``Serve.ainfer`` takes, its outputs the response body.

The core's own codec (``pyserve.frontends.kserve``) decodes into the core's request types, bound to a model entry;
here there is no entry, only arrays: the datatype and shape each input declares are checked against its data, and
the model's declared tensors are checked by the core when the call reaches it, with the same errors.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import orjson

from pyserve.client.model import array_from_bytes, tensor_bytes
from pyserve.dtypes import DATATYPES, as_bytes_array, datatype_of, numpy_dtype
from pyserve.errors import ConfigError, InvalidInputError, UnsupportedError
from pyserve.kserve_json import flatten, json_object, json_values

# Request parameters that steer the protocol, not the model.
_PROTOCOL_PARAMETERS = frozenset({"binary_data_output"})
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclasses.dataclass
class DecodedRequest:
    """An infer request as ``Serve.ainfer`` takes it, and how its outputs go back."""

    request_id: str
    inputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    outputs: list[str] | None
    binary_outputs: dict[str, bool]
    binary_default: bool


def decode_request(body: bytes, header_length: int | None) -> DecodedRequest:
    """An infer body: a JSON header, then the binary data of the inputs that declare ``binary_data_size``."""
    view = memoryview(body)
    if header_length is None:
        header, binary = view, view[len(view) :]
    else:
        if header_length <= 0 or header_length > len(view):
            raise InvalidInputError(
                f"Inference-Header-Content-Length must be in 1..{len(view)} (the body's size), got {header_length}"
            )
        header, binary = view[:header_length], view[header_length:]
    doc = json_object(header, "request")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInputError(f"request 'id' must be a string, got {type(request_id).__name__}")
    parameters = _parameters(doc.get("parameters"), "request")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInputError("the request JSON must have an 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for raw in raw_inputs:
        name, array, used = _decode_input(raw, binary, offset)
        if name in inputs:
            raise InvalidInputError(f"input '{name}' appears more than once")
        inputs[name] = array
        offset += used
    if offset != len(binary):
        left = len(binary) - offset
        raise InvalidInputError(f"the request body has {left} bytes after the binary data of its inputs")
    outputs: list[str] | None = None
    binary_outputs: dict[str, bool] = {}
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InvalidInputError("'outputs' must be a list")
        outputs = []
        for raw in raw_outputs:
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise InvalidInputError("each requested output must be an object with a 'name'")
            out_parameters = _parameters(raw.get("parameters"), f"output '{raw['name']}'")
            _refuse_shared_memory(out_parameters, f"output '{raw['name']}'")
            outputs.append(raw["name"])
            binary_outputs[raw["name"]] = bool(out_parameters.get("binary_data", False))
    binary_default = bool(parameters.get("binary_data_output", False))
    model_parameters = {key: value for key, value in parameters.items() if key not in _PROTOCOL_PARAMETERS}
    return DecodedRequest(request_id, inputs, model_parameters, outputs, binary_outputs, binary_default)


def encode_response(
    model: str, version: str | None, request: DecodedRequest, outputs: dict[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The response body, and the length of its JSON header when binary outputs follow it (else None)."""
    described: list[dict[str, Any]] = []
    parts: list[Any] = []
    for name, array in outputs.items():
        try:
            datatype = datatype_of(array.dtype)
        except ConfigError:
            raise InvalidInputError(f"output '{name}': numpy dtype {array.dtype} has no KServe datatype") from None
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if request.binary_outputs.get(name, request.binary_default):
            data = tensor_bytes(datatype, array)
            entry["parameters"] = {"binary_data_size": memoryview(data).nbytes}
            parts.append(data)
        else:
            entry["data"] = json_values(name, datatype, array, compact=False)
        described.append(entry)
    doc: dict[str, Any] = {"model_name": model}
    if version:
        doc["model_version"] = version
    if request.request_id:
        doc["id"] = request.request_id
    doc["outputs"] = described
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not parts:
        return header, None
    return b"".join([header, *(bytes(part) for part in parts)]), len(header)


# inputs ------------------------------------------------------------------------------------------------------------


def _decode_input(raw: Any, binary: memoryview, offset: int) -> tuple[str, np.ndarray, int]:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise InvalidInputError("each input must be a JSON object with a string 'name'")
    name = raw["name"]
    datatype = raw.get("datatype")
    if datatype not in DATATYPES:
        expected = ", ".join(DATATYPES)
        raise InvalidInputError(f"input '{name}': unknown datatype {datatype!r}; expected one of {expected}")
    shape = raw.get("shape")
    if not isinstance(shape, list) or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise InvalidInputError(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")
    parameters = _parameters(raw.get("parameters"), f"input '{name}'")
    _refuse_shared_memory(parameters, f"input '{name}'")
    size = parameters.get("binary_data_size")
    if size is not None:
        if type(size) is not int or size < 0:
            raise InvalidInputError(f"input '{name}': binary_data_size must be a non-negative integer, got {size!r}")
        if "data" in raw:
            raise InvalidInputError(f"input '{name}' has both 'data' and binary_data_size")
        if offset + size > len(binary):
            raise InvalidInputError(
                f"input '{name}': binary_data_size {size} exceeds the {len(binary) - offset} bytes left in the body"
            )
        return name, _from_binary(name, datatype, shape, binary[offset : offset + size]), size
    if "data" not in raw:
        raise InvalidInputError(f"input '{name}' has neither 'data' nor a binary_data_size parameter")
    return name, _from_json(name, datatype, shape, raw["data"]), 0


def _from_binary(name: str, datatype: str, shape: list[int], data: memoryview) -> np.ndarray:
    count = math.prod(shape)
    if datatype != "BYTES" and data.nbytes != count * numpy_dtype(datatype).itemsize:
        raise InvalidInputError(
            f"input '{name}': shape {shape} of {datatype} needs {count * numpy_dtype(datatype).itemsize} bytes, "
            f"got {data.nbytes}"
        )
    try:
        return array_from_bytes(datatype, shape, data)
    except (ValueError, InvalidInputError) as exc:
        raise InvalidInputError(f"input '{name}': {exc}") from None


def _from_json(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    count = math.prod(shape)
    flat = flatten(data if isinstance(data, list) else [data])
    if len(flat) != count:
        raise InvalidInputError(f"input '{name}': shape {shape} has {count} elements but data has {len(flat)}")
    if datatype == "BYTES":
        if not all(isinstance(item, str) for item in flat):
            raise InvalidInputError(f"input '{name}': BYTES data must be strings")
        return as_bytes_array(np.array([item.encode() for item in flat], dtype=object)).reshape(shape)
    target = numpy_dtype(datatype)
    if datatype == "BOOL":
        valid = all(type(item) is bool for item in flat)
    elif target.kind in ("i", "u"):
        valid = all(type(item) is int for item in flat)
    else:
        valid = all(type(item) in (int, float) for item in flat)
    if not valid:
        raise InvalidInputError(f"input '{name}': data is not all {datatype} values")
    if target.kind in ("i", "u") and flat:
        info = np.iinfo(target)
        if min(flat) < info.min or max(flat) > info.max:
            raise InvalidInputError(f"input '{name}': a value is out of range for {datatype}")
    return np.array(flat, dtype=target).reshape(shape)


# outputs ----------------------------------------------------------------------------------------------------------


# helpers -----------------------------------------------------------------------------------------------------------


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError(f"{where} 'parameters' must be an object")
    return value


def _refuse_shared_memory(parameters: dict[str, Any], where: str) -> None:
    if any(key in parameters for key in _SHARED_MEMORY):
        raise UnsupportedError(f"{where}: shared memory regions are served on pyserve's own HTTP port, not here")
