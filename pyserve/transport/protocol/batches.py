"""Batches: ``infer``, ``res``, ``free`` and the cancel notice, with the request, input-block and trace layouts
an ``infer`` carries."""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from pyserve.errors import InferenceError, error_from_kind, error_kind
from pyserve.transport.protocol.message import Header, Message, MessageKind, TensorDescriptor

RequestEntry = list[Any]
"""One request of an infer batch: ``[request id, parameters, requested output names, rows]``."""

InputBlock = list[Any]
"""One input of an infer batch: ``[name, datatype, shape, loc, target]``; ``target`` is the index of the request the
tensor belongs to, or ``MERGED``."""

MERGED: Final = -1
"""The ``target`` of an input block that holds every request's rows of that input, end to end."""

SequenceEntry = list[Any]
"""Where one request of a stateful model's batch stands in its sequence: ``[correlation id, flags, slot]``."""

SEQUENCE_START: Final = 1
"""The flag of a ``SequenceEntry`` whose request starts its sequence."""
SEQUENCE_END: Final = 2
"""The flag of a ``SequenceEntry`` whose request ends its sequence."""


class TraceContext(NamedTuple):
    """What a worker needs to put its compute spans under the batch's traced requests."""

    file: str
    """Where the core writes its trace (Triton's ``trace_file``), for a worker that exports to a file too."""
    parents: list[str | None]
    """Per request of the batch, the ``traceparent`` of its request span, or None for a request not traced."""


class InferBatch(Message):
    """core -> instance: a batch to run, its inputs in the frames that follow or in the core's pool."""

    __slots__ = ("batch_id", "blocks", "released_sequences", "requests", "sequences", "trace")
    KIND = MessageKind.INFER

    batch_id: int
    """The batch's id, which its results carry."""
    requests: list[RequestEntry]
    """The batch's requests in order."""
    blocks: list[InputBlock]
    """The batch's inputs."""
    trace: TraceContext | None
    """The trace context of a batch with traced requests, else None."""
    sequences: list[SequenceEntry] | None
    """Of a stateful model's batch: per request, where it stands in its sequence; else None."""
    released_sequences: list[Any]
    """Correlation IDs of sequences the core released on this instance (idle) since its last batch: their state goes
    before the batch runs (usually empty)."""

    def __init__(self, header: Header) -> None:
        self.batch_id = header["b"]
        self.requests = header["r"]
        self.blocks = header["x"]
        trace = header.get("tc")
        self.trace = None if trace is None else TraceContext(trace["file"], trace["parents"])
        self.sequences = header.get("sq")
        self.released_sequences = header.get("sr") or []

    @staticmethod
    def build(
        batch_id: int,
        requests: list[RequestEntry],
        blocks: list[InputBlock],
        trace: TraceContext | None = None,
        sequences: list[SequenceEntry] | None = None,
        released_sequences: list[Any] | None = None,
    ) -> Header:
        """The message (fields: see the class); ``trace`` for a batch with traced requests, ``sequences`` and
        ``released_sequences`` for a stateful model's (the keys are absent otherwise)."""
        header: Header = {"t": "infer", "b": batch_id, "r": requests, "x": blocks}
        if trace is not None:
            header["tc"] = {"file": trace.file, "parents": trace.parents}
        if sequences is not None:
            header["sq"] = sequences
        if released_sequences:
            header["sr"] = released_sequences
        return header


class BatchResult(Message):
    """instance -> core: a batch's outputs, or its error.

    A batch ends with one final message: its outputs (``build_final``), its error (``build_error``), or, for a
    decoupled model, after any number of ``build_response`` rounds, ``build_end``. Timings are nanoseconds.
    """

    __slots__ = ("batch_id", "error", "final", "outputs", "response_timings", "slots", "stage_times", "timings")
    KIND = MessageKind.RESULT

    batch_id: int
    """The id of the batch (``InferBatch.batch_id``)."""
    final: bool
    """Whether this is the batch's last message."""
    outputs: list[list[TensorDescriptor] | None] | None
    """Per request its outputs (None: no response this round); None for an error or the end of a decoupled batch."""
    slots: list[str]
    """The instance's pool slots the outputs use, to be freed (``FreeSlots``) once no response needs them."""
    timings: list[int]
    """Of a final message with outputs or ending a decoupled batch: [decode, compute, encode] of the batch (else
    empty)."""
    response_timings: list[int] | None
    """Of a decoupled model's messages: the time this message took to produce (Triton's response_stats)."""
    error: InferenceError | None
    """The batch's error; None when it has outputs."""
    stage_times: list[int] | None
    """Of a final message with outputs, when ``ServeConfig.stage_times`` is on: the instance's
    ``time.monotonic_ns()`` when it received the batch, decoded it, the function returned and it sent this (else
    None; ``pyserve.core.stage_times``)."""

    def __init__(self, header: Header) -> None:
        self.batch_id = header["b"]
        self.final = header["final"]
        self.outputs = header.get("o")
        self.slots = header.get("s") or []
        self.timings = header.get("tm") or []
        self.response_timings = header.get("rt")
        self.stage_times = header.get("st")
        error = header.get("err")
        self.error = None if error is None else error_from_kind(error[0], error[1])

    @staticmethod
    def build_final(
        batch_id: int,
        outputs: list[list[TensorDescriptor]],
        slots: list[str],
        timings: list[int],
        stage_times: list[int] | None = None,
    ) -> Header:
        """A batch's outputs, one list per request; ``timings``: [decode, compute, encode]; ``stage_times`` only
        when the switch is on (the key is absent otherwise)."""
        header: Header = {"t": "res", "b": batch_id, "o": outputs, "s": slots, "final": True, "tm": timings}
        if stage_times is not None:
            header["st"] = stage_times
        return header

    @staticmethod
    def build_response(
        batch_id: int, outputs: list[list[TensorDescriptor] | None], slots: list[str], response_timings: list[int]
    ) -> Header:
        """One round of a decoupled model's responses (None for a request without one this round);
        ``response_timings``: [compute, encode] of this round."""
        return {"t": "res", "b": batch_id, "o": outputs, "s": slots, "final": False, "rt": response_timings}

    @staticmethod
    def build_end(batch_id: int, timings: list[int], response_timings: list[int]) -> Header:
        """The end of a decoupled model's batch: no outputs; ``timings`` for the whole batch, ``response_timings``
        for the time since the last round."""
        return {"t": "res", "b": batch_id, "o": None, "s": [], "final": True, "tm": timings, "rt": response_timings}

    @staticmethod
    def build_error(batch_id: int, error: InferenceError, response_timings: list[int] | None = None) -> Header:
        """The batch failed: every request of it is answered with ``error``; ``response_timings`` for a decoupled
        model's batch."""
        header: Header = {"t": "res", "b": batch_id, "err": [error_kind(error), str(error)], "final": True}
        if response_timings is not None:
            header["rt"] = response_timings
        return header


class FreeSlots(Message):
    """core -> instance: these slots of the instance's pool are no longer read."""

    __slots__ = ("slots",)
    KIND = MessageKind.FREE

    slots: list[str]
    """Names of the instance's pool slots to release."""

    def __init__(self, header: Header) -> None:
        self.slots = header["slots"]

    @staticmethod
    def build(slots: list[str]) -> Header:
        """The message (fields: see the class)."""
        return {"t": "free", "slots": slots}


class CancelNotice(Message):
    """core -> instances, on the cancel publisher: requests of a running batch were cancelled.

    The publisher also answers each new subscription with a sync notice (``build_sync``, ``is_sync``): a listener
    that heard one hears every cancel published after it.
    """

    __slots__ = ("batch_id", "is_sync", "request_indexes")

    batch_id: int
    """The running batch (0 in a sync notice)."""
    request_indexes: list[int]
    """Positions in the batch of the requests cancelled (empty in a sync notice)."""
    is_sync: bool
    """Whether this is the answer to a subscription rather than a cancel."""

    def __init__(self, header: Header) -> None:
        self.is_sync = bool(header.get("sync"))
        self.batch_id = header.get("b", 0)
        self.request_indexes = header.get("i", [])

    @staticmethod
    def build(batch_id: int, request_indexes: list[int]) -> Header:
        """The message (fields: see the class)."""
        return {"b": batch_id, "i": request_indexes}

    @staticmethod
    def build_sync() -> Header:
        """The answer to a new subscription."""
        return {"sync": True}
