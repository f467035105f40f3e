"""What the sequence batcher (``pyserve.core.sequence_batcher``) keeps and reads: a request's sequence parameters,
checked as Triton checks them, and the sequences and instance slots it schedules."""

from __future__ import annotations

from collections import deque
from typing import Any, NoReturn

import numpy as np

from pyserve.core.inference import InferenceRequest, Instance
from pyserve.errors import InvalidInputError
from pyserve.sequence_config import MAX_STRING_ID_BYTES
from pyserve.transport.protocol import SEQUENCE_END, SEQUENCE_START

CorrelationId = int | str

_MAX_ID = 2**64


class SequenceReader:
    """Reads a stateful model's request: its correlation ID and START / END flags (``InferBatch`` flag bits).

    ``corrid_datatype`` is the datatype of the model's CORRID control (None without one): a numeric one refuses
    string IDs and IDs it cannot hold.
    """

    def __init__(self, model: str, corrid_datatype: str | None) -> None:
        self._model = model
        self._corrid_datatype = None if corrid_datatype == "BYTES" else corrid_datatype

    def read(self, request: InferenceRequest) -> tuple[CorrelationId, int]:
        """The request's correlation ID and flags; InvalidInputError (Triton's message) when they are wrong."""
        # On every request: the common case (an int or str ID, bool flags) takes the fewest checks.
        parameters = request.parameters
        correlation_id = parameters.get("sequence_id", 0)
        kind = type(correlation_id)
        if kind is int:
            if not 0 < correlation_id < _MAX_ID:
                self._bad_id(correlation_id)
        elif kind is not str or not correlation_id or len(correlation_id.encode()) > MAX_STRING_ID_BYTES:
            self._bad_id(correlation_id)
        start = parameters.get("sequence_start", False)
        end = parameters.get("sequence_end", False)
        if type(start) is not bool or type(end) is not bool:
            key, value = ("sequence_start", start) if type(start) is not bool else ("sequence_end", end)
            raise InvalidInputError(
                f"inference request to model '{self._model}': {key} must be a boolean, got {value!r}"
            )
        if request.rows != 1:
            raise InvalidInputError(
                f"inference request to model '{self._model}' must specify batch-size 1 due to requirements of "
                f"sequence batcher (got {request.rows})"
            )
        if self._corrid_datatype is not None:
            self._check_corrid_type(correlation_id, self._corrid_datatype)
        return correlation_id, (SEQUENCE_START if start else 0) | (SEQUENCE_END if end else 0)

    def _bad_id(self, correlation_id: Any) -> NoReturn:
        name = self._model
        if correlation_id == 0 or correlation_id == "":
            raise InvalidInputError(
                f"inference request to model '{name}' must specify a non-zero or non-empty correlation ID"
            )
        if type(correlation_id) is int:
            raise InvalidInputError(
                f"inference request to model '{name}': sequence_id {correlation_id} is out of range (correlation IDs "
                "are unsigned 64-bit integers)"
            )
        if type(correlation_id) is str:
            raise InvalidInputError(
                f"inference request to model '{name}': string sequence_id is longer than {MAX_STRING_ID_BYTES} bytes"
            )
        raise InvalidInputError(
            f"inference request to model '{name}': sequence_id must be an integer or a string, got {correlation_id!r}"
        )

    def _check_corrid_type(self, correlation_id: CorrelationId, datatype: str) -> None:
        # A BYTES CORRID takes any ID (an integer as its decimal string); a numeric one only integers it can hold.
        if isinstance(correlation_id, str):
            raise InvalidInputError(
                f"inference request to model '{self._model}': the model takes integer correlation IDs (its CORRID "
                f"control is {datatype}), got the string {correlation_id!r}"
            )
        if correlation_id > np.iinfo(datatype.lower()).max:
            raise InvalidInputError(
                f"inference request to model '{self._model}': sequence_id {correlation_id} does not fit the model's "
                f"CORRID control ({datatype})"
            )


class Sequence:
    """One sequence: its requests not yet sent, and where it runs."""

    __slots__ = ("busy", "correlation_id", "end_sent", "ended", "in_heap", "lane", "last_ns", "queue", "sent", "slot")

    def __init__(self, correlation_id: CorrelationId) -> None:
        self.correlation_id = correlation_id
        self.queue: deque[InferenceRequest] = deque()
        self.lane: Lane | None = None  # None while in the backlog
        self.slot = -1
        self.busy = False  # a request of it is running
        self.ended = False  # its END request is queued or running (a new START may still follow)
        self.sent = False  # its instance has seen a request of it (and so may hold its state)
        self.end_sent = False  # the last request its instance saw ended it (the instance dropped its state)
        self.last_ns = 0  # its last request's arrival, or the end of its last run
        self.in_heap = False  # has an entry in the idle heap (at most one, maybe due earlier than now needed)


class Lane:
    """One instance and the sequences in its slots."""

    __slots__ = ("free", "instance", "running", "slots", "waiting")

    def __init__(self, instance: Instance, slots: int) -> None:
        self.instance = instance
        self.slots: list[Sequence | None] = [None] * slots
        self.free = list(range(slots))  # a heap: the lowest free slot first
        self.waiting: dict[Sequence, None] = {}  # sequences with a queued request, in the order they became ready
        self.running: list[Sequence] = []
