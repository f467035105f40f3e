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
    """One output of a response: its raw bytes (BYTES length-prefixed) and how to read them.

    ``shm`` is ``[segment, nbytes]`` when the bytes lie in a worker's shared-memory slot, so the core can hand the
    location on (to a BLS caller, to the next step of an ensemble) instead of the bytes.
    """

    name: str
    datatype: str
    shape: list[int]
    buffer: memoryview
    shm: list[Any] | None = None

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
    must encode (copy) them inside the callback, or ``retain()`` them (ensembles and BLS keep intermediate tensors
    in shared memory that way).
    """

    outputs: list[OutputTensor]
    error: InferenceError | None = None
    final: bool = True
    parameters: dict[str, Any] = field(default_factory=dict)
    lease: BufferLease | None = None

    def retain(self) -> Callable[[], None]:
        """Keep the output buffers valid after the callback returns; call the returned function once done."""
        return self.lease.acquire() if self.lease is not None else _nothing


class BufferLease:
    """Holds the shared-memory slots behind a response's outputs until every holder has let go.

    Its creator holds it from the start and ``drop()``-s it once the response callbacks have run; ``acquire()``
    adds a holder and returns that holder's one-shot release. ``release`` runs when the last holder lets go.
    """

    __slots__ = ("_holders", "_release")

    def __init__(self, release: Callable[[], None]) -> None:
        self._holders = 1
        self._release = release

    def acquire(self) -> Callable[[], None]:
        """One more holder; the result releases it (calling it again does nothing)."""
        self._holders += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.drop()

        return release

    def drop(self) -> None:
        """The creator (or one holder) lets go; the last one out releases the slots."""
        self._holders -= 1
        if self._holders == 0:
            self._release()


def _nothing() -> None:
    return None


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
    # Absolute time.monotonic_ns() by which the request must be answered (0: none), set by the core for the steps
    # of an ensemble and for BLS calls, whose callers wait on them.
    deadline_ns: int = 0
    # Observability (pyserve.core.stats / tracing): responses so far (a decoupled model's response index), the
    # client's W3C traceparent header, and the request's spans while it is traced.
    responses: int = 0
    traceparent: str = ""
    trace: Any = None
