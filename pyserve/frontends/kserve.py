"""KServe v2 / Triton HTTP infer codec: JSON tensors and the binary tensor data extension.

Decoding turns a request body into validated ``InputTensor`` objects (fixed-size data as numpy views of the
body, no copy; BYTES as their length-prefixed blob; tensors in clients' shared-memory regions as views of the
region). Encoding turns ``OutputTensor`` objects into the response JSON header plus the binary parts that follow it
(an output written into a region is only described).

JSON has no NaN or infinity: as Triton, floats read and write them as the tokens ``NaN``, ``Infinity`` and
``-Infinity`` (Python's json and tritonclient read and write those), never as ``null``. BYTES are JSON strings, so a
BYTES output that is not UTF-8 cannot go out as JSON: the request is answered with an error that names the output and
asks for it as binary data, rather than with altered bytes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from pyserve.core.api import SharedMemoryControls
from pyserve.core.infer_call import InferCall, check_parameter_names, tensor_from_binary
from pyserve.core.inference import InputTensor, ModelEntry, OutputTensor, SharedMemorySlice
from pyserve.dtypes import DATATYPES, itemsize, numpy_dtype, serialize_bytes
from pyserve.errors import InvalidInputError, UnsupportedError
from pyserve.frontends.common import check_shape, model_parameters
from pyserve.frontends.shared_memory import input_from_region, slice_of, uses_shared_memory
from pyserve.kserve_json import flatten, json_object, json_values


def decode_request(
    body: bytes | bytearray | memoryview,
    header_length: int | None,
    entry: ModelEntry,
    regions: SharedMemoryControls | None = None,
) -> InferCall:
    """Split and decode an infer request body for ``entry`` (raises InvalidInputError with the reason); tensors in
    clients' shared-memory regions are looked up in ``regions``."""
    view = memoryview(body)
    if header_length == 0:
        return _decode_raw(view, entry)
    if header_length is None:
        header_bytes, binary = view, view[len(view) :]
    else:
        if header_length < 0:
            raise InvalidInputError(f"Inference-Header-Content-Length {header_length} is negative")
        if header_length > len(view):
            raise InvalidInputError(
                f"Inference-Header-Content-Length {header_length} is larger than the request body ({len(view)} bytes)"
            )
        header_bytes, binary = view[:header_length], view[header_length:]
    doc = json_object(header_bytes, "request")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInputError(f"request 'id' must be a string, got {type(request_id).__name__}")
    parameters = _parameters(doc.get("parameters"), "request")
    check_parameter_names(parameters)
    binary_default = bool(parameters.get("binary_data_output", False))

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInputError("the request JSON must have an 'inputs' list")
    inputs: dict[str, InputTensor] = {}
    offset = 0
    for raw in raw_inputs:
        tensor, name, used = _decode_input(raw, binary, offset, regions)
        offset += used
        if name in inputs:
            raise InvalidInputError(f"input '{name}' appears more than once")
        inputs[name] = tensor
    if offset != len(binary):
        raise InvalidInputError(
            f"the request body has {len(binary) - offset} bytes after the binary data of its inputs"
        )

    requested: list[str] = []
    binary_outputs: dict[str, bool] = {}
    shm_outputs: dict[str, SharedMemorySlice] | None = None
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InvalidInputError("'outputs' must be a list")
        for raw in raw_outputs:
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise InvalidInputError("each requested output must be an object with a 'name'")
            name = raw["name"]
            out_params = _parameters(raw.get("parameters"), f"output '{name}'")
            if "classification" in out_params:
                raise InvalidInputError(f"output '{name}': the classification extension is not supported")
            requested.append(name)
            # An output listed without binary_data comes back as JSON, whatever binary_data_output says.
            binary_outputs[name] = bool(out_params.get("binary_data", False))
            if out_params and uses_shared_memory(out_params):
                if shm_outputs is None:
                    shm_outputs = {}
                shm_outputs[name] = slice_of(_regions(regions), out_params, f"output '{name}'")
    entry.validate(inputs, requested)
    return InferCall(
        request_id, inputs, model_parameters(parameters), requested, binary_outputs, binary_default, shm_outputs
    )


def _regions(regions: SharedMemoryControls | None) -> SharedMemoryControls:
    if regions is None:
        raise UnsupportedError("shared memory regions cannot be used here")
    return regions


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError(f"{where} 'parameters' must be an object")
    return value


def _decode_input(
    raw: Any, binary: memoryview, offset: int, regions: SharedMemoryControls | None
) -> tuple[InputTensor, str, int]:
    if not isinstance(raw, dict):
        raise InvalidInputError("each input must be a JSON object")
    name = raw.get("name")
    if not isinstance(name, str):
        raise InvalidInputError("each input must have a string 'name'")
    datatype = raw.get("datatype")
    if datatype not in DATATYPES:
        raise InvalidInputError(
            f"input '{name}': unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        )
    shape = raw.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidInputError(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")
    check_shape(f"input '{name}'", shape, datatype)
    count = math.prod(shape)
    params = _parameters(raw.get("parameters"), f"input '{name}'")
    if params and uses_shared_memory(params):
        if "data" in raw or "binary_data_size" in params:
            raise InvalidInputError(f"input '{name}' has shared memory parameters and data too")
        return input_from_region(_regions(regions), name, datatype, shape, params), name, 0
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInputError(f"input '{name}': binary_data_size must be a non-negative integer, got {size!r}")
        if "data" in raw:
            raise InvalidInputError(f"input '{name}' has both 'data' and binary_data_size")
        if offset + size > len(binary):
            raise InvalidInputError(
                f"input '{name}': binary_data_size {size} exceeds the {len(binary) - offset} bytes left in the body"
            )
        chunk = binary[offset : offset + size]
        return tensor_from_binary(name, datatype, shape, chunk), name, size
    if "data" not in raw:
        raise InvalidInputError(f"input '{name}' has neither 'data' nor a binary_data_size parameter")
    return _from_json(name, datatype, shape, count, raw["data"]), name, 0


def _from_json(name: str, datatype: str, shape: list[int], count: int, data: Any) -> InputTensor:
    if datatype in ("FP16", "BF16"):
        raise InvalidInputError(
            f"input '{name}': {datatype} cannot be sent as JSON; use the binary tensor data extension "
            "(binary_data_size)"
        )
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        flat = flatten(data)
        if len(flat) != count:
            raise InvalidInputError(f"input '{name}': shape {shape} has {count} elements but data has {len(flat)}")
        items = np.empty(count, dtype=object)
        for index, item in enumerate(flat):
            if isinstance(item, str):
                items[index] = item.encode("utf-8")
            else:
                raise InvalidInputError(f"input '{name}': BYTES data must be strings, got {type(item).__name__}")
        return InputTensor(datatype, shape, serialize_bytes(items))
    try:
        array = np.asarray(data)
    except ValueError as exc:
        raise InvalidInputError(f"input '{name}': data is not a regular nested list: {exc}") from None
    if array.size != count:
        raise InvalidInputError(f"input '{name}': shape {shape} has {count} elements but data has {array.size}")
    target = numpy_dtype(datatype)
    kind = array.dtype.kind
    if count and target.kind in ("i", "u") and kind in ("f", "O"):
        # numpy reads integers past the int64 range (large UINT64 values) as float64: keep them exact.
        exact = _exact_integers(name, datatype, flatten(data), target, array.dtype)
        return InputTensor(datatype, shape, exact.reshape(shape))
    if count:
        if datatype == "BOOL":
            ok = kind == "b"
        elif target.kind in ("i", "u"):
            ok = kind in ("i", "u")
        else:
            ok = kind in ("i", "u", "f")
        if not ok:
            raise InvalidInputError(f"input '{name}': data of type {array.dtype} is not valid {datatype}")
        if target.kind in ("i", "u"):
            info = np.iinfo(target)
            if array.min() < info.min or array.max() > info.max:
                raise InvalidInputError(f"input '{name}': a value is out of range for {datatype}")
        elif target.itemsize < array.itemsize:
            # A finite number past the type's range would become an infinity: refused, as out-of-range integers are.
            with np.errstate(over="ignore"):
                converted = array.astype(target)
            if np.isinf(converted).any() and (np.isinf(converted) & np.isfinite(array)).any():
                raise InvalidInputError(f"input '{name}': a value is out of range for {datatype}")
            return InputTensor(datatype, shape, converted.reshape(shape))
    return InputTensor(datatype, shape, array.astype(target, copy=False).reshape(shape))


def _exact_integers(
    name: str, datatype: str, flat: list[Any], target: np.dtype[Any], seen: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    if not all(type(item) is int for item in flat):
        raise InvalidInputError(f"input '{name}': data of type {seen} is not valid {datatype}")
    info = np.iinfo(target)
    if min(flat) < info.min or max(flat) > info.max:
        raise InvalidInputError(f"input '{name}': a value is out of range for {datatype}")
    return np.array(flat, dtype=target)


def _decode_raw(body: memoryview, entry: ModelEntry) -> InferCall:
    # Inference-Header-Content-Length: 0 means the body is the raw bytes of the model's only input.
    declared = entry.single_input
    if declared is None:
        raise InvalidInputError(
            f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one input; "
            f"model '{entry.name}' has {len(entry.inputs)}"
        )
    dims = list(declared.shape)
    datatype = declared.datatype
    if datatype == "BYTES":
        shape = [1] * (len(dims) + (1 if entry.batching else 0))
    else:
        size = itemsize(datatype)
        fixed = math.prod(d for d in dims if d != -1)
        variable = [i for i, d in enumerate(dims) if d == -1]
        if len(variable) > 1:
            raise InvalidInputError(
                f"input '{declared.name}': a raw binary request cannot infer shape {dims} (more than one -1)"
            )
        if len(body) % (size * fixed):
            raise InvalidInputError(
                f"input '{declared.name}': {len(body)} raw bytes are not a whole number of {datatype} elements "
                f"of shape {dims}"
            )
        if variable:
            dims[variable[0]] = len(body) // (size * fixed)
        elif len(body) != size * fixed:
            raise InvalidInputError(
                f"input '{declared.name}': shape {dims} of {datatype} needs {size * fixed} bytes, got {len(body)}"
            )
        shape = ([1] if entry.batching else []) + dims
    tensor = tensor_from_binary(declared.name, datatype, shape, body)
    inputs = {declared.name: tensor}
    entry.validate(inputs, [])
    return InferCall("", inputs, {}, [], {}, binary_default=True)


def encode_response(
    entry: ModelEntry, call: InferCall, outputs: list[OutputTensor], parameters: dict[str, Any] | None = None
) -> tuple[bytes, list[Any]]:
    """The response JSON header and the binary parts that follow it (empty when every output is JSON)."""
    described: list[dict[str, Any]] = []
    parts: list[Any] = []
    binary_outputs = call.binary_outputs
    default = call.binary_default
    shm_outputs = call.shm_outputs
    for output in outputs:
        entry_doc: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": output.shape}
        if shm_outputs is None or output.name not in shm_outputs:
            if binary_outputs.get(output.name, default):
                entry_doc["parameters"] = {"binary_data_size": output.buffer.nbytes}
                parts.append(output.buffer)
            else:
                entry_doc["data"] = json_values(output.name, output.datatype, output.to_numpy())
        # else: written into the client's region (shared_memory.write_outputs), described by name, datatype and shape
        # only. No parameters: Triton's C++ client (perf_analyzer) reads an output's parameters as binary data and
        # fails on an object without binary_data_size.
        described.append(entry_doc)
    doc: dict[str, Any] = {"model_name": entry.name, "model_version": str(entry.version)}
    if call.id:
        doc["id"] = call.id
    if parameters:
        doc["parameters"] = parameters
    doc["outputs"] = described
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), parts


# generate extension ------------------------------------------------------------------------------------------


def decode_generate_request(body: bytes | bytearray | memoryview, entry: ModelEntry) -> InferCall:
    """Decode a ``/generate`` body: a JSON object whose keys are model inputs or parameters (as Triton maps them).

    A key naming a model input becomes that input (a scalar or a flat list, its shape filled in from the model's
    declared shape); any other key, and every key of a nested ``parameters`` object, is a request parameter.
    """
    doc = json_object(body, "generate request")
    inputs: dict[str, InputTensor] = {}
    parameters: dict[str, Any] = {}

    def take(key: str, value: Any) -> None:
        declared = entry.inputs.get(key)
        if declared is not None:
            if key in inputs:
                raise InvalidInputError(f"input '{key}' is given more than once")
            inputs[key] = _generate_input(entry, key, declared.datatype, list(declared.shape), value)
        elif isinstance(value, (str, int, float)):  # bool is an int
            parameters[key] = value
        else:
            raise InvalidInputError(
                f"parameter '{key}' must be a string, number or boolean, got {type(value).__name__}"
            )

    for key, value in doc.items():
        if key == "parameters" and key not in entry.inputs:
            for name, item in _parameters(value, "generate request").items():
                take(name, item)
        else:
            take(key, value)
    check_parameter_names(parameters)
    entry.validate(inputs, [])
    return InferCall("", inputs, model_parameters(parameters), [])


def _generate_input(entry: ModelEntry, name: str, datatype: str, dims: list[int], value: Any) -> InputTensor:
    if isinstance(value, list) and any(isinstance(item, (list, dict)) for item in value):
        raise InvalidInputError(f"input '{name}': a generate request input must be a scalar or a flat list")
    count = len(value) if isinstance(value, list) else 1
    # Fixed dimensions take their share of the elements; the innermost -1 (the batch dimension included) takes
    # what is left and any other -1 becomes 1.
    shape = ([-1] if entry.batching else []) + dims
    remaining = count
    for dim in shape:
        if dim != -1:
            if remaining % dim:
                raise InvalidInputError(f"input '{name}': {count} element(s) do not fit its shape {shape}")
            remaining //= dim
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] == -1:
            shape[index] = remaining
            remaining = 1
    if remaining != 1:
        raise InvalidInputError(f"input '{name}': {count} element(s) do not fit its shape {shape}")
    return _from_json(name, datatype, shape, count, value)


def encode_generate_response(
    entry: ModelEntry, call: InferCall, outputs: list[OutputTensor], parameters: dict[str, Any] | None = None
) -> bytes:
    """One generate response object: model name and version, response parameters, then each output by name
    (a one-element output as a JSON scalar, any other as a flat list)."""
    doc: dict[str, Any] = {}
    if call.id:
        doc["id"] = call.id
    doc["model_name"] = entry.name
    doc["model_version"] = str(entry.version)
    if parameters:
        doc.update(parameters)
    for output in outputs:
        doc[output.name] = json_values(output.name, output.datatype, output.to_numpy(), scalar=True)
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
