"""What the HTTP and gRPC front ends share: the decoded infer call, the parameter rules, and the core request.

Each front end decodes its wire format into an ``InferCall`` (validated against the model), then hands it to
``build_request`` with its response callback. Keeping the rules here means a request behaves the same whichever
protocol carried it: the same reserved names, the same parameters reach the scheduler and the function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyserve._version import __version__
from pyserve.core.inference import InferenceRequest, InputTensor, ResponseCallback
from pyserve.core.registry import ModelEntry
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
]

# Request parameters Triton defines; any other name starting with "triton_" is reserved and refused.
TRITON_PARAMETERS = frozenset({"triton_enable_empty_final_response"})
# Protocol-level parameters consumed by the front end, not handed to the model.
PROTOCOL_PARAMETERS = frozenset({"binary_data_output"})
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"


@dataclass(slots=True)
class InferCall:
    """A decoded infer request: inputs, parameters and how each output should be encoded (HTTP only)."""

    id: str
    inputs: dict[str, InputTensor]
    parameters: dict[str, Any]
    requested_outputs: list[str]
    binary_outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False

    @property
    def wants_empty_final_response(self) -> bool:
        """Whether the client asked for a flag-only final response of a decoupled model."""
        return bool(self.parameters.get(EMPTY_FINAL_RESPONSE, False))


def check_parameter_names(parameters: Mapping[str, Any]) -> None:
    """Refuse names Triton reserves (``triton_*``) other than the ones it defines."""
    for name in parameters:
        if name.startswith("triton_") and name not in TRITON_PARAMETERS:
            raise InvalidInputError(f"parameter '{name}' is reserved: names starting with 'triton_' are Triton's")


def model_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The request parameters the scheduler and the model see (protocol-level ones removed)."""
    return {key: value for key, value in parameters.items() if key not in PROTOCOL_PARAMETERS}


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
