"""BLS calls an instance's function makes: ``bls``, ``bls_res``, ``bls_cancel``, ``bls_free``."""

from __future__ import annotations

from typing import Any

from pyserve.errors import InferenceError, error_from_kind, error_kind
from pyserve.transport.protocol.message import Header, Message, MessageKind, TensorDescriptor


class BlsRequest(Message):
    """instance -> core: a call its function makes to a model, its inputs in frames or the instance's pool."""

    __slots__ = (
        "call_id",
        "inputs",
        "model",
        "outputs",
        "parameters",
        "request_id",
        "stream",
        "timeout_us",
        "version",
    )
    KIND = MessageKind.BLS_REQUEST

    call_id: int
    """The caller's number for the call, which its responses carry."""
    model: str
    """The model called."""
    version: int | None
    """Its version; None for the latest."""
    inputs: list[TensorDescriptor]
    parameters: dict[str, Any]
    """The request's parameters."""
    outputs: list[str]
    """The names of the outputs requested; empty for all of them."""
    request_id: str
    """The request's id ("" for none)."""
    stream: bool
    """Whether the caller takes several responses (``infer_stream``)."""
    timeout_us: int
    """The caller's own timeout in microseconds; 0 for none."""

    def __init__(self, header: Header) -> None:
        self.call_id = header["c"]
        self.model = header["model"]
        self.version = header.get("version")
        self.inputs = header["x"]
        self.parameters = header.get("p") or {}
        self.outputs = list(header.get("o") or ())
        self.request_id = header.get("id", "")
        self.stream = bool(header.get("stream"))
        self.timeout_us = int(header.get("tu") or 0)

    @staticmethod
    def build(
        call_id: int,
        model: str,
        version: int | None,
        inputs: list[TensorDescriptor],
        parameters: dict[str, Any],
        outputs: list[str],
        request_id: str,
        stream: bool,
        timeout_us: int,
    ) -> Header:
        """The message (fields: see the class)."""
        return {
            "t": "bls",
            "c": call_id,
            "model": model,
            "version": version,
            "x": inputs,
            "p": parameters,
            "o": outputs,
            "id": request_id,
            "stream": stream,
            "tu": timeout_us,
        }


class BlsResponse(Message):
    """core -> instance: a response to a BLS call, or its error.

    Outputs in a worker's pool travel as their location; the response then carries a ``lease``, which the caller
    hands back with ``BlsFree`` once it has copied them.
    """

    __slots__ = ("call_id", "error", "final", "lease", "outputs")
    KIND = MessageKind.BLS_RESPONSE

    call_id: int
    """The call answered (``BlsRequest.call_id``)."""
    outputs: list[TensorDescriptor]
    """The response's outputs (none for an error)."""
    final: bool
    """Whether the call is over."""
    lease: int | None
    """What to hand back with ``BlsFree`` once the outputs are copied; None when there is nothing to free."""
    error: InferenceError | None
    """The call's error, or None."""

    def __init__(self, header: Header) -> None:
        self.call_id = header["c"]
        self.outputs = header.get("o") or []
        self.final = header["final"]
        self.lease = header.get("l")
        error = header.get("err")
        self.error = None if error is None else error_from_kind(error[0], error[1])

    @staticmethod
    def build(call_id: int, outputs: list[TensorDescriptor], final: bool, lease: int | None = None) -> Header:
        """A response (fields: see the class)."""
        header: Header = {"t": "bls_res", "c": call_id, "o": outputs, "final": final}
        if lease is not None:
            header["l"] = lease
        return header

    @staticmethod
    def build_error(call_id: int, error: InferenceError) -> Header:
        """The call failed (it is over)."""
        return {"t": "bls_res", "c": call_id, "final": True, "err": [error_kind(error), str(error)]}


class BlsCancel(Message):
    """instance -> core: the caller no longer waits for this call."""

    __slots__ = ("call_id",)
    KIND = MessageKind.BLS_CANCEL

    call_id: int
    """The call withdrawn."""

    def __init__(self, header: Header) -> None:
        self.call_id = header["c"]

    @staticmethod
    def build(call_id: int) -> Header:
        """The message (fields: see the class)."""
        return {"t": "bls_cancel", "c": call_id}


class BlsFree(Message):
    """instance -> core: the caller copied a response's outputs; their slots may go."""

    __slots__ = ("lease",)
    KIND = MessageKind.BLS_FREE

    lease: int
    """The response's ``BlsResponse.lease``."""

    def __init__(self, header: Header) -> None:
        self.lease = header["l"]

    @staticmethod
    def build(lease: int) -> Header:
        """The message (fields: see the class)."""
        return {"t": "bls_free", "l": lease}
