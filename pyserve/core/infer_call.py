"""How a decoded infer call becomes the core's request, whoever made it: a front end or a BLS call from a worker.

A front end decodes its wire format (pyserve.frontends.kserve, grpc_codec) into an ``InferCall`` validated against
the model, then hands it to ``build_request`` with its response callback; the core's BLS broker and the ensemble
executor build their requests the same way. Keeping these rules in one place means a request behaves the same
whichever way it came: the same reserved parameter names, the same checks of raw tensor bytes, the same batching
signature.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyserve.core.inference import InferenceRequest, InputTensor, ModelEntry, ResponseCallback, SharedMemorySlice
from pyserve.dtypes import itemsize, numpy_dtype
from pyserve.errors import InvalidInputError

# Request parameters Triton defines; any other name starting with "triton_" is reserved and refused.
TRITON_PARAMETERS = frozenset({"triton_enable_empty_final_response"})
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"


@dataclass(slots=True)
class InferCall:
    """A decoded infer request: inputs, parameters and how each output should be encoded (HTTP only); outputs the
    client wants in its shared-memory regions (``shm_outputs``, None when none) are written there by the front end."""

    id: str
    inputs: dict[str, InputTensor]
    parameters: dict[str, Any]
    requested_outputs: list[str]
    binary_outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False
    shm_outputs: dict[str, SharedMemorySlice] | None = None

    @property
    def wants_empty_final_response(self) -> bool:
        """Whether the client asked for a flag-only final response of a decoupled model."""
        return bool(self.parameters.get(EMPTY_FINAL_RESPONSE, False))


def check_parameter_names(parameters: Mapping[str, Any]) -> None:
    """Refuse names Triton reserves (``triton_*``) other than the ones it defines."""
    for name in parameters:
        if name.startswith("triton_") and name not in TRITON_PARAMETERS:
            raise InvalidInputError(f"parameter '{name}' is reserved: names starting with 'triton_' are Triton's")


def forward_headers(
    parameters: dict[str, Any], headers: Iterable[tuple[str, str]], pattern: re.Pattern[str] | None
) -> None:
    """Add the headers (HTTP) or metadata (gRPC) whose name ``pattern`` finds to a request's parameters, as strings
    under the name in lower case (tritonserver's ``--http-header-forward-pattern``); a forwarded header takes the
    place of a request parameter of the same name, and reserved names are refused as for parameters."""
    if pattern is None:
        return
    forwarded = {name.lower(): value for name, value in headers if pattern.search(name)}
    check_parameter_names(forwarded)
    parameters.update(forwarded)


def tensor_from_binary(name: str, datatype: str, shape: list[int], chunk: memoryview) -> InputTensor:
    """An input from its raw bytes (binary tensor data, gRPC raw contents): a view, no copy; BYTES checked."""
    count = math.prod(shape)
    if datatype == "BYTES":
        check_bytes_blob(name, chunk, count)
        return InputTensor(datatype, shape, chunk)
    expected = count * itemsize(datatype)
    if len(chunk) != expected:
        raise InvalidInputError(f"input '{name}': shape {shape} of {datatype} needs {expected} bytes, got {len(chunk)}")
    array = np.frombuffer(chunk, dtype=numpy_dtype(datatype), count=count).reshape(shape)
    return InputTensor(datatype, shape, array)


def tensor_from_shared_memory(name: str, datatype: str, shape: list[int], where: SharedMemorySlice) -> InputTensor:
    """An input whose bytes lie in a client's shared-memory region: checked like raw bytes, read in place (a system
    region's bytes are also marked with their segment, for an instance to map them itself)."""
    tensor = tensor_from_binary(name, datatype, shape, where.read())
    tensor.location = where.location
    return tensor


def check_bytes_blob(name: str, chunk: memoryview, count: int) -> None:
    """Check that chunk holds exactly ``count`` length-prefixed elements."""
    size = len(chunk)
    offset = 0
    raw = chunk.cast("B") if chunk.format != "B" else chunk
    for index in range(count):
        if offset + 4 > size:
            raise InvalidInputError(
                f"input '{name}': BYTES data ends after {index} of {count} elements (no room for a length prefix)"
            )
        length = int.from_bytes(raw[offset : offset + 4], "little")
        offset += 4 + length
        if offset > size:
            raise InvalidInputError(
                f"input '{name}': BYTES element {index} declares {length} bytes but only "
                f"{size - offset + length} remain"
            )
    if offset != size:
        raise InvalidInputError(f"input '{name}': BYTES data has {size - offset} bytes after its {count} elements")


def build_request(entry: ModelEntry, call: InferCall, on_response: ResponseCallback) -> InferenceRequest:
    """The core's request for a decoded, validated call; ``on_response`` runs once per response."""
    request = InferenceRequest(
        model=entry,
        id=call.id,
        inputs=call.inputs,
        parameters=call.parameters,
        requested_outputs=call.requested_outputs,
        rows=1,
        on_response=on_response,
    )
    if entry.batching:
        request.rows = next(iter(call.inputs.values())).shape[0]
        # Only requests with the same input names, datatypes and non-batch dimensions share a batch.
        request.signature = tuple(sorted((name, t.datatype, tuple(t.shape[1:])) for name, t in call.inputs.items()))
    return request
