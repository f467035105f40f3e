"""The deadline of a request: when whoever waits on it stops waiting.

A request's deadline is the one the core imposed on it (``InferenceRequest.deadline_ns``: the steps of an ensemble,
BLS calls) or, for a request from a client, its ``timeout`` parameter in microseconds counted from its arrival.
Ensembles stop before the next step once it has passed, and a BLS call made while a request runs gets what is left
of it, so a timeout propagates down a chain of calls.
"""

from __future__ import annotations

from pyserve.core.inference import InferenceRequest
from pyserve.errors import InvalidInputError


def deadline_ns(request: InferenceRequest) -> int:
    """The absolute ``time.monotonic_ns()`` deadline of a request, or 0 when it has none.

    ``arrival_ns`` must be set (the scheduler or the ensemble executor sets it on submit).
    """
    if request.deadline_ns:
        return request.deadline_ns
    timeout_us = request.parameters.get("timeout")
    if timeout_us is None or timeout_us == 0:
        return 0
    if type(timeout_us) is not int or timeout_us < 0:
        raise InvalidInputError(
            f"model '{request.model.name}': timeout {timeout_us!r} must be a whole number of microseconds >= 0"
        )
    return request.arrival_ns + timeout_us * 1000


def batch_deadline_ns(requests: list[InferenceRequest]) -> int:
    """The deadline of work done for a whole batch: the latest of its requests' (0 if any has none)."""
    latest = 0
    for request in requests:
        try:
            deadline = deadline_ns(request)
        except InvalidInputError:
            deadline = 0
        if not deadline:
            return 0
        latest = max(latest, deadline)
    return latest


def earliest(*deadlines: int) -> int:
    """The earliest of deadlines, ignoring 0 (none); 0 when all are 0."""
    set_ = [d for d in deadlines if d]
    return min(set_) if set_ else 0
