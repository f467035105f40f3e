"""Stage times: when each HTTP infer request passed each stage of its path, across the core and its instance.

A debug switch, off by default (``ServeConfig.stage_times``, ``PYSERVE_STAGE_TIMES=/path/file.jsonl``). When it is
on, an HTTP request carries ``stamps``, a list of ``time.monotonic_ns()`` readings that each stage appends to
(CLOCK_MONOTONIC, which a thread or process instance reads alike on Linux); the instance's own stamps come back in
its result (``BatchResult.stage_times``). Once the response is written, the request's stamps become one JSON line,
``{stage: ns, ...}`` in the order of ``STAGES``. When it is off, each stage costs one check of an attribute that is
None. ``benchmarks/hop_budget.py`` reads the file into the latency budget of docs/architecture.md.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

import orjson

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pyserve.core.inference import InferenceRequest

STAGES: Final = (
    "complete",  # the front end parsed the whole request (httptools' on_message_complete)
    "submitted",  # decoded and handed to the core (RequestFlow.submit)
    "sent",  # its batch goes to the instance (BatchesInFlight.dispatch, before the socket send)
    "worker_received",  # the instance received the batch (after recv)
    "worker_decoded",  # the instance decoded it (numpy views, RequestBatch)
    "worker_returned",  # the user's function returned
    "worker_sent",  # the instance sends the result (as the reply is built: the stamp travels in it)
    "received",  # the core reads the result (BatchesInFlight.on_result)
    "written",  # the response went to the transport (HttpProtocol.respond, after transport.write)
)
"""The stages of an HTTP infer request, in the order it passes them."""

WORKER_STAGES: Final = STAGES[3:7]
"""The stages an instance stamps; they travel back in its result."""

FLUSH_EVERY: Final = 1000
"""Lines buffered before they are appended to the file (the rest at ``close``)."""


class StageTimes:
    """Collects the stamps of each request and appends one JSON line per answered request to ``path``.

    A request answered without passing every stage (a cached answer, an error, a request that is not an infer
    request) leaves no line.
    """

    def __init__(self, path: str, flush_every: int = FLUSH_EVERY) -> None:
        self.path = path
        self._flush_every = flush_every
        self._lines: list[bytes] = []

    @staticmethod
    def start() -> list[int]:
        """The stamps of a request the front end has just read in full."""
        return [time.monotonic_ns()]

    def sent(self, requests: Iterable[InferenceRequest]) -> None:
        """A batch of these requests is about to be sent to its instance."""
        now = time.monotonic_ns()
        for request in requests:
            if request.stamps is not None:
                request.stamps.append(now)

    def received(self, requests: Iterable[InferenceRequest], worker_stamps: list[int] | None, now: int) -> None:
        """The core read the final result of these requests' batch at ``now``, with the instance's stamps."""
        for request in requests:
            stamps = request.stamps
            if stamps is not None:
                if worker_stamps is not None:
                    stamps.extend(worker_stamps)
                stamps.append(now)

    def written(self, stamps: list[int]) -> None:
        """The response of a request with these stamps is written: its line, if it passed every stage."""
        stamps.append(time.monotonic_ns())
        if len(stamps) != len(STAGES):
            return
        self._lines.append(orjson.dumps(dict(zip(STAGES, stamps, strict=True))))
        if len(self._lines) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        """Append the buffered lines to the file."""
        if not self._lines:
            return
        lines, self._lines = self._lines, []
        with open(self.path, "ab") as handle:
            handle.write(b"\n".join(lines) + b"\n")

    def close(self) -> None:
        """Write what is buffered (the core is stopping)."""
        self.flush()


def stage_times(path: str) -> StageTimes | None:
    """The recorder for ``ServeConfig.stage_times``: None when it is off (the empty path)."""
    return StageTimes(path) if path else None
