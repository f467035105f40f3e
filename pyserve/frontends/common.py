"""What the HTTP and gRPC front ends share: the server's identity and the protocol-level parameter rules.

Each front end decodes its wire format into a ``pyserve.core.infer_call.InferCall`` (validated against the model),
then hands it to ``build_request`` there with its response callback; the core builds its own requests (BLS calls,
ensemble steps) the same way. What stays here concerns the protocols only: parameters the front end consumes
itself, and the names a server announces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyserve._version import __version__
from pyserve.dtypes import itemsize
from pyserve.errors import InvalidInputError

SERVER_NAME = "pyserve"
SERVER_VERSION = __version__
EXTENSIONS = [
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_configuration",
    "schedule_policy",
    "trace",
    "logging",
    "system_shared_memory",
    "cuda_shared_memory",
]

# The most dimensions a tensor may have (numpy's limit; numpy 2 allows 64).
MAX_DIMENSIONS = 32
# The most bytes the dimensions of a tensor other than 0 may multiply to (numpy refuses more, even for no elements).
_MAX_EXTENT_BYTES = (1 << 63) - 1

# Protocol-level parameters consumed by the front end, not handed to the model.
PROTOCOL_PARAMETERS = frozenset({"binary_data_output"})
FINAL_RESPONSE = "triton_final_response"


def model_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The request parameters the scheduler and the model see (protocol-level ones removed)."""
    return {key: value for key, value in parameters.items() if key not in PROTOCOL_PARAMETERS}


def check_shape(tensor: str, shape: Sequence[int], datatype: str) -> None:
    """Refuse a shape of non-negative dimensions that no array can have: more than ``MAX_DIMENSIONS`` dimensions, or
    dimensions (zeros aside) that multiply past 2**63 - 1 bytes. ``tensor`` names it: "input 'x'"."""
    if len(shape) > MAX_DIMENSIONS:
        raise InvalidInputError(f"{tensor}: shape has {len(shape)} dimensions; at most {MAX_DIMENSIONS} are supported")
    extent = max(itemsize(datatype), 1)
    for dim in shape:
        if dim:
            extent *= dim
    if extent > _MAX_EXTENT_BYTES:
        raise InvalidInputError(f"{tensor}: shape {list(shape)} of {datatype} is too large to be a tensor")
