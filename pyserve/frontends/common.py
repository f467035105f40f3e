"""What the HTTP and gRPC front ends share: the server's identity and the protocol-level parameter rules.

Each front end decodes its wire format into a ``pyserve.core.infer_call.InferCall`` (validated against the model),
then hands it to ``build_request`` there with its response callback; the core builds its own requests (BLS calls,
ensemble steps) the same way. What stays here concerns the protocols only: parameters the front end consumes
itself, and the names a server announces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyserve._version import __version__

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

# Protocol-level parameters consumed by the front end, not handed to the model.
PROTOCOL_PARAMETERS = frozenset({"binary_data_output"})
FINAL_RESPONSE = "triton_final_response"


def model_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The request parameters the scheduler and the model see (protocol-level ones removed)."""
    return {key: value for key, value in parameters.items() if key not in PROTOCOL_PARAMETERS}
