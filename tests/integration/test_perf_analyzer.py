"""perf_analyzer, Triton's load generator, runs against pyserve unchanged."""

from __future__ import annotations

import re

import pytest
import tritonclient.http as triton_http

from pyserve import Serve

from .conftest import run_perf_analyzer

pytestmark = pytest.mark.integration


def test_perf_analyzer_http_concurrency_1_and_8(
    perf_analyzer: str, server: Serve, client: triton_http.InferenceServerClient
) -> None:
    output = run_perf_analyzer(perf_analyzer, server.http_port, "pa_identity", concurrency=(1, 8))
    # perf_analyzer read the server-side statistics too.
    server_counts = [int(n) for n in re.findall(r"Successful request count: (\d+)", output)]
    assert len(server_counts) == 2 and all(n > 0 for n in server_counts), output

    (stats,) = client.get_inference_statistics("pa_identity")["model_stats"]
    inference = stats["inference_stats"]
    assert inference["fail"]["count"] == 0
    assert inference["success"]["count"] >= sum(server_counts)
    counts = {key: inference[key]["count"] for key in ("queue", "compute_input", "compute_infer", "compute_output")}
    assert set(counts.values()) == {inference["success"]["count"]}, counts
    assert stats["inference_count"] == inference["success"]["count"]
