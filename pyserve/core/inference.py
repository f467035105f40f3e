"""The request and response types front ends hand to the core and get back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pyserve.dtypes import deserialize_bytes, numpy_dtype
from pyserve.errors import InferenceError

if TYPE_CHECKING:
    from pyserve.core.registry import ModelEntry


@dataclass(slots=True)
class InputTensor:
    """A decoded request input: fixed-size data as a numpy array, BYTES as their length-prefixed blob."""

    datatype: str
    shape: list[int]
    data: Any  # np.ndarray for fixed-size types; bytes/memoryview (length-prefixed) for BYTES

    @property
    def nbytes(self) -> int:
        """Size of the data in bytes."""
        return int(self.data.nbytes) if isinstance(self.data, np.ndarray) else memoryview(self.data).nbytes

    def buffer(self) -> Any:
        """The raw bytes, as a buffer (no copy for contiguous arrays)."""
        if isinstance(self.data, np.ndarray):
            return np.ascontiguousarray(self.data).reshape(-1).view(np.uint8)
        return self.data


@dataclass(slots=True)
class OutputTensor:
    """One output of a response: its raw bytes (BYTES length-prefixed) and how to read them."""

    name: str
    datatype: str
    shape: list[int]
    buffer: memoryview

    def to_numpy(self) -> np.ndarray:
        """The output as a numpy array (a view for fixed-size types)."""
        count = 1
        for dim in self.shape:
            count *= dim
        if self.datatype == "BYTES":
            return deserialize_bytes(self.buffer, count, self.name).reshape(self.shape)
        return np.frombuffer(self.buffer, dtype=numpy_dtype(self.datatype), count=count).reshape(self.shape)


@dataclass(slots=True)
class InferenceResponse:
    """One response to a request: outputs, or an error. ``final`` marks the last (decoupled models send many).

    Output buffers may point into shared memory that is reused once the response callback returns: a front end
    must encode (copy) them inside the callback.
    """

    outputs: list[OutputTensor]
    error: InferenceError | None = None
    final: bool = True
    parameters: dict[str, Any] = field(default_factory=dict)


ResponseCallback = Callable[["InferenceRequest", InferenceResponse], None]


@dataclass(slots=True, eq=False)
class InferenceRequest:
    """A validated request for one model version, as the scheduler and workers see it."""

    model: ModelEntry
    id: str
    inputs: dict[str, InputTensor]
    parameters: dict[str, Any]
    requested_outputs: list[str]
    rows: int
    on_response: ResponseCallback
    arrival_ns: int = 0
    signature: tuple[Any, ...] = ()
    cancelled: bool = False
    done: bool = False
    batch_id: int = 0
    batch_index: int = 0
