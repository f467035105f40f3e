"""Per-model statistics in the shape of Triton's statistics extension (``/v2/models/stats``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


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
class ModelStats:
    """Counters of one model version. Failed executions count in ``fail`` and ``execution_count`` only."""

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

    def record_execution(self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """A successful execution of ``requests`` requests totalling ``batch_size`` rows."""
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
            "response_stats": {},
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
