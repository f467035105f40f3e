"""perf_analyzer over gRPC: synchronous, asynchronous and streaming (a decoupled model), with zero errors."""

from __future__ import annotations

import re

import pytest
import tritonclient.grpc as triton_grpc

from pyserve import Serve

from .conftest import run_perf_analyzer

pytestmark = pytest.mark.integration


def run_grpc(perf_analyzer: str, server: Serve, model: str, *options: str) -> str:
    return run_perf_analyzer(perf_analyzer, server.grpc_port, model, *options, protocol="grpc", concurrency=(4,))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_perf_analyzer_grpc(
    perf_analyzer: str, server: Serve, grpc_client: triton_grpc.InferenceServerClient, mode: str
) -> None:
    before = grpc_client.get_inference_statistics("pa_identity").model_stats[0].inference_stats
    options = ["--async"] if mode == "async" else ["--sync"]
    output = run_grpc(perf_analyzer, server, "pa_identity", *options)
    server_counts = [int(n) for n in re.findall(r"Successful request count: (\d+)", output)]
    assert server_counts and all(n > 0 for n in server_counts), output
    after = grpc_client.get_inference_statistics("pa_identity").model_stats[0].inference_stats
    assert after.fail.count == before.fail.count
    assert after.success.count - before.success.count >= sum(server_counts)


def test_perf_analyzer_grpc_streaming_a_decoupled_model(
    perf_analyzer: str, server: Serve, grpc_client: triton_grpc.InferenceServerClient
) -> None:
    before = grpc_client.get_inference_statistics("decoupled").model_stats[0].inference_stats.fail.count
    run_grpc(perf_analyzer, server, "decoupled", "--streaming")
    after = grpc_client.get_inference_statistics("decoupled").model_stats[0].inference_stats.fail.count
    assert after == before
