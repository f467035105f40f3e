"""Tests of pyserve.core.stats: counters in the shape of Triton's statistics extension."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pyserve.core.stats import Duration, ModelStats

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "triton-2.51"


def key_tree(value: Any) -> Any:
    """The keys of a JSON document and their nesting, without the values."""
    if isinstance(value, dict):
        return {key: key_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [key_tree(item) for item in value]
    return type(value).__name__


def reference_stats() -> dict[str, Any]:
    (entry,) = json.loads((REFERENCE / "v2_models_identity_fp32_stats.json").read_text())["model_stats"]
    return entry  # type: ignore[no-any-return]


def test_duration_adds_counts_and_nanoseconds() -> None:
    duration = Duration()
    duration.add(100)
    duration.add(50, count=3)
    assert duration.to_json() == {"count": 4, "ns": 150}


def test_fresh_stats_are_zero_with_no_batch_stats() -> None:
    doc = ModelStats().to_json("m", 2)
    assert doc["name"] == "m"
    assert doc["version"] == "2"
    assert doc["inference_count"] == 0
    assert doc["execution_count"] == 0
    assert doc["last_inference"] == 0
    assert doc["batch_stats"] == []
    assert all(value == {"count": 0, "ns": 0} for value in doc["inference_stats"].values())


def test_to_json_has_exactly_tritons_keys_and_nesting() -> None:
    reference = reference_stats()
    stats = ModelStats()
    for _ in range(4):
        stats.record_execution(batch_size=1, requests=1, input_ns=10, infer_ns=20, output_ns=30)
        stats.success.add(100)
        stats.queue.add(5)
    doc = stats.to_json("identity_fp32", 1)
    assert key_tree(doc) == key_tree(reference)
    # Same counts as Triton after four single-request executions.
    assert doc["inference_count"] == reference["inference_count"] == 4
    assert doc["execution_count"] == reference["execution_count"] == 4
    for name, duration in reference["inference_stats"].items():
        assert doc["inference_stats"][name]["count"] == duration["count"], name
    assert [b["batch_size"] for b in doc["batch_stats"]] == [1]
    assert doc["batch_stats"][0]["compute_infer"] == {"count": 4, "ns": 80}


def test_record_execution_counts_rows_executions_and_per_request_compute() -> None:
    stats = ModelStats()
    before = time.time_ns() // 1_000_000
    stats.record_execution(batch_size=8, requests=3, input_ns=10, infer_ns=100, output_ns=1)
    stats.record_execution(batch_size=2, requests=2, input_ns=20, infer_ns=200, output_ns=2)
    stats.record_execution(batch_size=8, requests=1, input_ns=30, infer_ns=300, output_ns=3)
    doc = stats.to_json("m", 1)
    assert doc["inference_count"] == 18  # rows
    assert doc["execution_count"] == 3
    assert doc["last_inference"] >= before
    # every request of a batch is charged the batch's compute time
    assert doc["inference_stats"]["compute_infer"] == {"count": 6, "ns": 3 * 100 + 2 * 200 + 300}
    assert doc["inference_stats"]["compute_input"] == {"count": 6, "ns": 3 * 10 + 2 * 20 + 30}
    # batch_stats count executions per batch size, sorted by size
    assert doc["batch_stats"] == [
        {
            "batch_size": 2,
            "compute_input": {"count": 1, "ns": 20},
            "compute_infer": {"count": 1, "ns": 200},
            "compute_output": {"count": 1, "ns": 2},
        },
        {
            "batch_size": 8,
            "compute_input": {"count": 2, "ns": 40},
            "compute_infer": {"count": 2, "ns": 400},
            "compute_output": {"count": 2, "ns": 4},
        },
    ]


def test_failed_executions_count_as_executions_only() -> None:
    stats = ModelStats()
    stats.record_execution(batch_size=1, requests=1, input_ns=1, infer_ns=1, output_ns=1)
    stats.record_failed_execution()
    stats.fail.add(500)
    doc = stats.to_json("m", 1)
    assert doc["execution_count"] == 2
    assert doc["inference_count"] == 1
    assert doc["inference_stats"]["fail"] == {"count": 1, "ns": 500}
    assert doc["inference_stats"]["compute_infer"]["count"] == 1
    assert [b["batch_size"] for b in doc["batch_stats"]] == [1]
    assert doc["last_inference"] > 0


def test_to_json_is_json_serialisable() -> None:
    stats = ModelStats()
    stats.record_execution(batch_size=4, requests=2, input_ns=1, infer_ns=2, output_ns=3)
    doc = stats.to_json("m", 1)
    assert json.loads(json.dumps(doc)) == doc
