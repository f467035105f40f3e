"""Per-model statistics in the shape of Triton's statistics extension (``/v2/models/stats``).

The core counts here, once per request or batch, and nothing else: the Prometheus metrics are read from these
counters at scrape time (``pyserve.core.metrics_collector``). Only the opt-in latency summaries and histograms
observe each request, through ``ModelStats.latency``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyserve.config import ModelSpec

# Triton's failure reasons (the ``reason`` label of nv_inference_request_failure).
REJECTED = "REJECTED"  # refused by the scheduler: queue full, queue timeout
CANCELED = "CANCELED"  # the client cancelled or went away
BACKEND = "BACKEND"  # the model's function raised
OTHER = "OTHER"  # anything else: the instance died, the model was unloaded
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)


class _SpecHolder(Protocol):
    @property
    def spec(self) -> ModelSpec: ...


class CountedRequest(Protocol):
    """What the statistics read of a request (``pyserve.core.inference.InferenceRequest``).

    A protocol, because the request's module imports this one: statistics sit below the requests they count.
    """

    @property
    def model(self) -> _SpecHolder: ...

    @property
    def cancelled(self) -> bool: ...

    @property
    def arrival_ns(self) -> int: ...

    responses: int


class LatencyObserver(Protocol):
    """Per-request observations for the opt-in latency summaries and histograms (pyserve.core.metrics_collector)."""

    def request(self, queue_ns: int, request_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None: ...

    def cache_hit(self, queue_ns: int, request_ns: int, lookup_ns: int) -> None: ...

    def cache_miss(self, miss_ns: int) -> None: ...

    def first_response(self, ns: int) -> None: ...


@dataclass(slots=True)
class Duration:
    """A {count, ns} pair."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    """Compute durations of executions of one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ResponseStats:
    """Triton's response_stats entry: the responses of decoupled requests at one response index."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def to_json(self) -> dict[str, dict[str, int]]:
        return {
            "compute_infer": self.compute_infer.to_json(),
            "compute_output": self.compute_output.to_json(),
            "success": self.success.to_json(),
            "fail": self.fail.to_json(),
            "empty_response": self.empty_response.to_json(),
            "cancel": self.cancel.to_json(),
        }


@dataclass(slots=True)
class ModelStats:
    """Counters of one model version. Failed executions count in ``fail`` and ``execution_count`` only.

    ``load_started_ns`` is when the model's load began (the entry is made then); ``load_duration_ns`` is set once
    every configured instance is connected.
    """

    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStats] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    responses: dict[int, ResponseStats] = field(default_factory=dict)
    load_started_ns: int = field(default_factory=time.monotonic_ns)
    load_duration_ns: int = 0
    latency: LatencyObserver | None = None

    def record_execution(self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """A successful execution totalling ``batch_size`` rows, of which ``requests`` requests succeeded (as in
        Triton, compute counts only those: a request cancelled while its batch ran counts as a failure alone)."""
        self.execution_count += 1
        self.inference_count += batch_size
        self.last_inference_ms = time.time_ns() // 1_000_000
        # Triton counts compute per request: every request of the batch shares the batch's compute time.
        self.compute_input.add(input_ns * requests, requests)
        self.compute_infer.add(infer_ns * requests, requests)
        self.compute_output.add(output_ns * requests, requests)
        per_size = self.batches.get(batch_size)
        if per_size is None:
            per_size = self.batches[batch_size] = BatchStats()
        per_size.compute_input.add(input_ns)
        per_size.compute_infer.add(infer_ns)
        per_size.compute_output.add(output_ns)

    def record_failed_execution(self) -> None:
        """An execution that ended in an error (counts toward execution_count, not inference_count)."""
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_failure(self, reason: str, ns: int) -> None:
        """A request that failed after ``ns`` nanoseconds, for one of FAILURE_REASONS."""
        self.fail.add(ns)
        self.failures[reason] += 1

    def record_successes(
        self, requests: Iterable[CountedRequest], dispatched_ns: int, now_ns: int, timings: list[int]
    ) -> int:
        """The requests of a finished execution: each succeeded, or failed as CANCELED if its client left. Returns
        how many succeeded."""
        queue, success, latency = self.queue, self.success, self.latency
        succeeded = 0
        for request in requests:
            if request.cancelled:
                self.record_failure(CANCELED, now_ns - request.arrival_ns)
                if request.model.spec.config.decoupled:
                    # The worker reports no timing for a response that was never produced.
                    self.response(request.responses).cancel.add(0)
                continue
            queue_ns = dispatched_ns - request.arrival_ns
            request_ns = now_ns - request.arrival_ns
            queue.add(queue_ns)
            success.add(request_ns)
            succeeded += 1
            if latency is not None:
                latency.request(queue_ns, request_ns, timings[0], timings[1], timings[2])
        return succeeded

    def record_response(self, request: CountedRequest, outcome: str, timings: list[int] | None, now_ns: int) -> None:
        """The next response of a decoupled request, by response index (Triton's response_stats).

        ``outcome`` is ``success`` (``timings`` = [infer_ns, output_ns] the worker measured for it), ``empty`` (the
        flag-only final response; [infer_ns] since the previous one) or ``fail`` ([infer_ns] until the error).
        """
        index = request.responses
        request.responses += 1
        stats = self.response(index)
        infer_ns = timings[0] if timings else 0
        if outcome == "success":
            output_ns = timings[1] if timings and len(timings) > 1 else 0
            stats.compute_output.add(output_ns)
            stats.success.add(infer_ns + output_ns)
        elif outcome == "empty":
            stats.empty_response.add(infer_ns)
        else:
            stats.fail.add(infer_ns)
        stats.compute_infer.add(infer_ns)
        if index == 0 and outcome != "fail" and self.latency is not None:
            self.latency.first_response(now_ns - request.arrival_ns)

    def record_cache_hit(self, lookup_ns: int, request_ns: int) -> None:
        """A request answered from the response cache: a success with no queue time and no execution."""
        self.success.add(request_ns)
        self.queue.add(0)
        self.cache_hit.add(lookup_ns)
        if self.latency is not None:
            self.latency.cache_hit(0, request_ns, lookup_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """Lookup plus insertion of a miss; as in Triton, it adds to the request's duration too."""
        self.cache_miss.add(miss_ns)
        self.success.ns += miss_ns
        if self.latency is not None:
            self.latency.cache_miss(miss_ns)

    def response(self, index: int) -> ResponseStats:
        """The response_stats entry of a response index (created at first use)."""
        stats = self.responses.get(index)
        if stats is None:
            stats = self.responses[index] = ResponseStats()
        return stats

    def mark_loaded(self, instances: int, configured: int) -> None:
        """An instance connected: the load is complete once every configured instance is."""
        if not self.load_duration_ns and instances >= configured:
            self.load_duration_ns = max(time.monotonic_ns() - self.load_started_ns, 1)

    def to_json(self, name: str, version: int) -> dict[str, Any]:
        """The model_stats entry Triton returns for this model version."""
        return {
            "name": name,
            "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_json(),
                "fail": self.fail.to_json(),
                "queue": self.queue.to_json(),
                "compute_input": self.compute_input.to_json(),
                "compute_infer": self.compute_infer.to_json(),
                "compute_output": self.compute_output.to_json(),
                "cache_hit": self.cache_hit.to_json(),
                "cache_miss": self.cache_miss.to_json(),
            },
            "response_stats": {str(index): stats.to_json() for index, stats in sorted(self.responses.items())},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": stats.compute_input.to_json(),
                    "compute_infer": stats.compute_infer.to_json(),
                    "compute_output": stats.compute_output.to_json(),
                }
                for size, stats in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
