"""pyserve.bench.windows and server_stats: latency statistics, perf_analyzer's stability rule, and the server's
split of a request's time from two readings of its statistics."""

from __future__ import annotations

import numpy as np
import pytest

from pyserve.bench.server_stats import ServerCounters, ServerSplit
from pyserve.bench.windows import Collected, LatencyStats, Records, Window, is_stable, merge, window_of


def window(requests_per_s: float, latency_ms: float, server: ServerCounters | None = None) -> Window:
    latencies = np.full(int(requests_per_s), latency_ms / 1000)
    return Window(0.0, 1.0, latencies, {}, 0.1, 0, 0, server)


def test_latency_statistics_in_microseconds() -> None:
    stats = LatencyStats.of(np.arange(1, 101) / 1000)  # 1 .. 100 ms
    assert stats is not None
    assert stats.count == 100
    assert stats.min_us == pytest.approx(1000) and stats.max_us == pytest.approx(100_000)
    assert stats.avg_us == pytest.approx(50_500)
    assert stats.p50_us == pytest.approx(50_500)
    assert stats.p99_us == pytest.approx(99_010)
    assert LatencyStats.of(np.empty(0)) is None


def test_records_split_at_a_moment() -> None:
    records = Records(np.array([0.0, 0.1, 0.2]), np.array([0.5, 1.5, 0.9]), np.array([0, 0, 3]))
    early, late = records.ending_before(1.0)
    assert early.ends.tolist() == [0.5, 0.9] and late.ends.tolist() == [1.5]
    assert len(Records.concatenate([early, late])) == 3


def test_a_window_counts_successes_and_names_errors() -> None:
    records = Records(np.array([0.0, 0.0, 0.0, 0.0]), np.array([0.01, 0.02, 0.5, 0.6]), np.array([0, 0, 7, 7]))
    result = window_of(Collected(records, 0.25, 1, 0), 0.0, 2.0, {7: "QueueFullError: full"}, None)
    assert result.successes == 2 and result.failures == 2
    assert result.errors == {"QueueFullError: full": 2}
    assert result.requests_per_s == 1.0
    assert result.mean_latency_s == pytest.approx(0.015)
    assert result.client_cpu == 0.25 and result.late == 1


def test_stable_when_the_last_three_windows_agree_within_the_threshold() -> None:
    assert not is_stable([window(100, 5), window(100, 5)], 0.1)
    assert is_stable([window(50, 9), window(100, 5), window(104, 5.2), window(97, 4.9)], 0.1)
    assert not is_stable([window(100, 5), window(100, 5), window(120, 5)], 0.1)  # throughput off by > 10 %
    assert not is_stable([window(100, 5), window(100, 5), window(100, 6)], 0.1)  # latency off by > 10 %
    assert is_stable([window(100, 5), window(100, 5), window(100, 6)], 0.2)


def counters(success: int, queue_ns: int, infer_ns: int, inferences: int, executions: int) -> ServerCounters:
    return ServerCounters(
        success_count=success,
        success_ns=success * 1_000_000,
        queue_ns=queue_ns,
        compute_input_ns=success * 10_000,
        compute_infer_ns=infer_ns,
        compute_output_ns=success * 20_000,
        inference_count=inferences,
        execution_count=executions,
    )


def test_the_server_split_is_per_request_between_two_readings() -> None:
    before = counters(100, 0, 0, 100, 100)
    after = counters(300, 40_000_000, 120_000_000, 300, 150)
    split = ServerSplit.between(before, after)
    assert split is not None
    assert split.requests == 200
    assert split.queue_us == pytest.approx(200.0)
    assert split.compute_infer_us == pytest.approx(600.0)
    assert split.compute_us == pytest.approx(10 + 600 + 20)
    assert split.overhead_us == pytest.approx(1000 - 200 - 630)
    assert split.batch_rows == pytest.approx(4.0)
    assert ServerSplit.between(after, after) is None


def test_counters_read_http_and_grpc_documents_alike() -> None:
    http = {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "inference_count": 6,
                "execution_count": 2,
                "inference_stats": {
                    "success": {"count": 6, "ns": 600},
                    "fail": {"count": 1, "ns": 5},
                    "queue": {"count": 6, "ns": 60},
                    "compute_input": {"count": 6, "ns": 6},
                    "compute_infer": {"count": 6, "ns": 300},
                    "compute_output": {"count": 6, "ns": 12},
                },
            }
        ]
    }
    # gRPC's statistics as JSON: 64-bit numbers as strings, zero counters left out.
    grpc = {
        "model_stats": [
            {
                "name": "m",
                "inference_count": "6",
                "execution_count": "2",
                "inference_stats": {
                    "success": {"count": "6", "ns": "600"},
                    "fail": {"count": "1", "ns": "5"},
                    "queue": {"count": "6", "ns": "60"},
                    "compute_input": {"count": "6", "ns": "6"},
                    "compute_infer": {"count": "6", "ns": "300"},
                    "compute_output": {"count": "6", "ns": "12"},
                    "cache_hit": {},
                },
            }
        ]
    }
    assert ServerCounters.from_document(http) == ServerCounters.from_document(grpc)
    assert ServerCounters.from_document(http).fail_count == 1
    assert ServerCounters.from_document({}) == ServerCounters()


def test_merging_windows_pools_latencies_and_errors() -> None:
    first = Window(0.0, 1.0, np.array([0.001, 0.002]), {"E": 1}, 0.2, 0, 0, counters(10, 0, 0, 10, 10))
    second = Window(1.0, 2.0, np.array([0.003]), {"E": 2, "F": 1}, 0.5, 2, 1, counters(13, 0, 3_000_000, 13, 11))
    merged = merge([first, second], counters(8, 0, 0, 8, 8))
    assert merged.seconds == 2.0 and merged.successes == 3
    assert merged.errors == {"E": 3, "F": 1}
    assert merged.client_cpu == 0.5 and merged.late == 2 and merged.held == 1
    assert merged.latency is not None and merged.latency.max_us == pytest.approx(3000)
    assert merged.server is not None and merged.server.requests == 5
    assert merge([second], None).server is None
