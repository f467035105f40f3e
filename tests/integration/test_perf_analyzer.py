"""perf_analyzer, Triton's load generator, runs against pyserve unchanged."""

from __future__ import annotations

import re
import subprocess

import pytest
import tritonclient.http as triton_http

from pyserve import Serve

pytestmark = pytest.mark.integration


def test_perf_analyzer_http_concurrency_1_and_8(
    perf_analyzer: str, server: Serve, client: triton_http.InferenceServerClient
) -> None:
    command = [
        perf_analyzer,
        "-m",
        "pa_identity",
        "-u",
        f"127.0.0.1:{server.http_port}",
        "-i",
        "http",
        "--shape",
        "INPUT0:16",
        "--concurrency-range",
        "1:8:7",
        "--measurement-interval",
        "500",
        "--max-trials",
        "6",
        # A smoke test, not a benchmark: any three windows count as stable, so a busy machine cannot fail it.
        "--stability-percentage",
        "1000",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=90)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert not re.search(r"error|fail|unable", output, re.IGNORECASE), output
    for concurrency in (1, 8):
        assert f"Concurrency: {concurrency}, throughput:" in output, output
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
