"""The server's side of a measurement, from the statistics extension (``/v2/models/{m}/stats``, gRPC
``ModelStatistics``): counters read before and after a span, and their difference per request, as perf_analyzer
reports it (``queue``, ``compute input``, ``compute infer``, ``compute output``, and the rest of the server's time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

_DURATIONS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@dataclasses.dataclass(frozen=True)
class ServerCounters:
    """A model's cumulative statistics at one moment, summed over its versions (nanoseconds and counts)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> ServerCounters:
        """Read a statistics document (HTTP JSON, or gRPC's as JSON: 64-bit numbers as strings, zeros left out)."""
        totals = dict.fromkeys((field.name for field in dataclasses.fields(cls)), 0)
        for entry in doc.get("model_stats", ()):
            stats = entry.get("inference_stats", {})
            for name in _DURATIONS:
                totals[f"{name}_ns"] += int(stats.get(name, {}).get("ns", 0))
            totals["success_count"] += int(stats.get("success", {}).get("count", 0))
            totals["fail_count"] += int(stats.get("fail", {}).get("count", 0))
            totals["inference_count"] += int(entry.get("inference_count", 0))
            totals["execution_count"] += int(entry.get("execution_count", 0))
        return cls(**totals)

    def since(self, before: ServerCounters) -> ServerCounters:
        """What was counted between ``before`` and this reading."""
        return ServerCounters(
            **{
                field.name: getattr(self, field.name) - getattr(before, field.name)
                for field in dataclasses.fields(self)
            }
        )


@dataclasses.dataclass(frozen=True)
class ServerSplit:
    """Where a request's time went inside the server over a span, averaged per successful request (µs)."""

    requests: int
    failures: int
    inferences: int
    executions: int
    request_us: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float

    @classmethod
    def between(cls, before: ServerCounters, after: ServerCounters) -> ServerSplit | None:
        """The split of what the server counted between two readings (None: no request succeeded)."""
        delta = after.since(before)
        count = delta.success_count
        if count <= 0:
            return None

        def per_request(ns: int) -> float:
            return ns / count / 1000.0

        return cls(
            requests=count,
            failures=delta.fail_count,
            inferences=delta.inference_count,
            executions=delta.execution_count,
            request_us=per_request(delta.success_ns),
            queue_us=per_request(delta.queue_ns),
            compute_input_us=per_request(delta.compute_input_ns),
            compute_infer_us=per_request(delta.compute_infer_ns),
            compute_output_us=per_request(delta.compute_output_ns),
        )

    @property
    def compute_us(self) -> float:
        """Compute input + infer + output."""
        return self.compute_input_us + self.compute_infer_us + self.compute_output_us

    @property
    def overhead_us(self) -> float:
        """The server's time outside the queue and compute: decoding, encoding, handing requests over."""
        return max(self.request_us - self.queue_us - self.compute_us, 0.0)

    @property
    def batch_rows(self) -> float | None:
        """Rows per execution of the model: the batch size the server formed on average."""
        return self.inferences / self.executions if self.executions else None

    def to_json(self) -> dict[str, Any]:
        """Counts and microseconds, for the JSON report."""
        doc: dict[str, Any] = dataclasses.asdict(self)
        doc.update(compute_us=self.compute_us, overhead_us=self.overhead_us, batch_rows=self.batch_rows)
        return doc
