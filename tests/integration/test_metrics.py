"""Metrics (``GET /metrics`` on the metrics port) and the statistics extension after known traffic: exact counters,
failure reasons, decoupled response statistics, numbers from process workers, and perf_analyzer's view."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from pyserve import DynamicBatcher, ModelConfig, QueuePolicy, Request, Serve, ServeConfig, Tensor

pytestmark = pytest.mark.integration

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "triton-2.51"
FP32 = [Tensor("INPUT0", np.float32, (-1,))]
FP32_OUT = [Tensor("OUTPUT0", np.float32, (-1,))]
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


# models ---------------------------------------------------------------------------------------------------------


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def raises(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    raise ValueError("this model always fails")


# Set when a sleeping request starts running (thread instances run in this process).
RUNNING = threading.Event()


def sleeps(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    seconds = max(float(request.parameters.get("sleep_s", 0.0)) for request in requests)
    if seconds:
        RUNNING.set()
        time.sleep(seconds)
    return identity(requests)


def dies_on_request(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    if any(request.parameters.get("die") for request in requests):
        os._exit(3)
    time.sleep(0.01)  # measured in the worker process: shows up in compute_infer
    return identity(requests)


def streams_three(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for step in range(3):
        yield [{"OUTPUT0": request["INPUT0"] + step} for request in requests]


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, metrics_summaries=True, metrics_histograms=True))
    one_at_a_time = ModelConfig(
        max_batch_size=4,
        batcher=DynamicBatcher(
            default_queue_policy=QueuePolicy(default_timeout_microseconds=300_000, max_queue_size=1)
        ),
    )
    s.bind("untouched", identity, FP32, FP32_OUT, ModelConfig(max_batch_size=4))
    s.bind("counted", identity, FP32, FP32_OUT, ModelConfig(max_batch_size=8))
    s.bind("raises", raises, FP32, FP32_OUT, ModelConfig(max_batch_size=4))
    s.bind("timeouts", sleeps, FP32, FP32_OUT, one_at_a_time)
    s.bind("cancels", sleeps, FP32, FP32_OUT, ModelConfig(max_batch_size=4))
    s.bind("streams", streams_three, FP32, FP32_OUT, ModelConfig(max_batch_size=4, decoupled=True))
    s.bind("in_process", dies_on_request, FP32, FP32_OUT, ModelConfig(max_batch_size=4, worker="process"))
    try:
        s.run()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server: Serve) -> Iterator[triton_http.InferenceServerClient]:
    c = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0, concurrency=4)
    yield c
    c.close()


def tensor(rows: int = 1, value: float = 1.0) -> triton_http.InferInput:
    item = triton_http.InferInput("INPUT0", [rows, 4], "FP32")
    item.set_data_from_numpy(np.full((rows, 4), value, np.float32))
    return item


def scrape(server: Serve) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return str(response.read().decode())


def series(page: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name as on the page, labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            bare = family.type == "counter" and sample.name == family.name + "_total"
            out[(family.name if bare else sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(page: str, name: str, model: str, **labels: str) -> float:
    return series(page)[(name, frozenset({"model": model, "version": "1", **labels}.items()))]


def failures(page: str, model: str) -> dict[str, float]:
    return {reason: value(page, "nv_inference_request_failure", model, reason=reason) for reason in REASONS}


def stats(client: triton_http.InferenceServerClient, model: str) -> dict[str, Any]:
    (entry,) = client.get_inference_statistics(model)["model_stats"]
    return entry  # type: ignore[no-any-return]


def settle(check: Any, timeout_s: float = 5.0) -> None:
    """Counters of a request settle just after its response (as in Triton): wait for ``check()`` to hold."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "counters did not settle"
        time.sleep(0.02)


# the endpoint ---------------------------------------------------------------------------------------------------


def test_the_metrics_port_serves_tritons_families_for_every_model_from_the_start(server: Serve) -> None:
    assert server.metrics_port not in (0, server.http_port, server.grpc_port)
    page = scrape(server)
    for name in (
        "nv_inference_request_success",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
    ):
        assert value(page, name, "untouched") == 0, name
    assert failures(page, "untouched") == dict.fromkeys(REASONS, 0)
    assert value(page, "nv_model_load_duration_secs", "untouched") > 0
    reference = (REFERENCE / "metrics_full.txt").read_text().splitlines()
    for line in reference:
        if line.startswith("# ") and ("nv_inference" in line or "nv_cpu" in line):
            assert line in page.splitlines(), line


def test_the_metrics_port_answers_only_metrics(server: Serve) -> None:
    base = f"http://127.0.0.1:{server.metrics_port}"
    for request, status in (
        (urllib.request.Request(f"{base}/v2/health/ready"), 404),
        (urllib.request.Request(f"{base}/metrics", data=b"", method="POST"), 405),
    ):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        info.value.close()
        assert info.value.code == status


# exact counters after known traffic ----------------------------------------------------------------------------


def test_counters_after_known_traffic_are_exact(server: Serve, client: triton_http.InferenceServerClient) -> None:
    for _ in range(5):
        client.infer("counted", [tensor(1)])
    client.infer("counted", [tensor(3)])
    settle(lambda: stats(client, "counted")["inference_stats"]["success"]["count"] == 6)
    page = scrape(server)
    assert value(page, "nv_inference_request_success", "counted") == 6
    assert failures(page, "counted") == dict.fromkeys(REASONS, 0)
    assert value(page, "nv_inference_count", "counted") == 8  # rows
    assert value(page, "nv_inference_exec_count", "counted") == 6  # one request at a time: one batch each
    assert value(page, "nv_inference_pending_request_count", "counted") == 0

    doc = stats(client, "counted")
    inference = doc["inference_stats"]
    assert doc["inference_count"] == 8 and doc["execution_count"] == 6
    assert inference["fail"]["count"] == 0
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[key]["count"] == 6, key
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in doc["batch_stats"]} == {1: 5, 3: 1}
    assert doc["last_inference"] > 0
    # the counters and the statistics are the same numbers
    assert value(page, "nv_inference_request_duration_us", "counted") == inference["success"]["ns"] // 1000
    assert value(page, "nv_inference_queue_duration_us", "counted") == inference["queue"]["ns"] // 1000
    assert value(page, "nv_inference_compute_infer_duration_us", "counted") == inference["compute_infer"]["ns"] // 1000
    # the parts of a request's time fit inside it
    parts = sum(inference[key]["ns"] for key in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert 0 < parts <= inference["success"]["ns"]
    # the opt-in summaries saw the same requests
    assert value(page, "nv_inference_request_summary_us_count", "counted") == 6
    assert value(page, "nv_inference_queue_summary_us", "counted", quantile="0.5") >= 0


def test_grpc_statistics_are_the_same_document(server: Serve, client: triton_http.InferenceServerClient) -> None:
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        over_grpc = grpc.get_inference_statistics("counted", as_json=True)["model_stats"][0]
    finally:
        grpc.close()
    over_http = stats(client, "counted")
    assert int(over_grpc["inference_count"]) == over_http["inference_count"]
    assert int(over_grpc["execution_count"]) == over_http["execution_count"]
    for key, duration in over_http["inference_stats"].items():
        got = over_grpc["inference_stats"].get(key, {})
        assert int(got.get("count", 0)) == duration["count"], key
        assert int(got.get("ns", 0)) == duration["ns"], key


def test_a_model_exception_counts_as_backend_failure(server: Serve, client: triton_http.InferenceServerClient) -> None:
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="this model always fails"):
            client.infer("raises", [tensor()])
    settle(lambda: stats(client, "raises")["inference_stats"]["fail"]["count"] == 2)
    page = scrape(server)
    assert failures(page, "raises") == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 2, "OTHER": 0}
    assert value(page, "nv_inference_request_success", "raises") == 0
    assert value(page, "nv_inference_exec_count", "raises") == 2  # failed executions count, as in Triton
    assert value(page, "nv_inference_count", "raises") == 0
    doc = stats(client, "raises")
    assert doc["execution_count"] == 2 and doc["inference_stats"]["compute_infer"]["count"] == 0


def post_infer(server: Serve, model: str, parameters: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One JSON infer request over a connection of its own (safe from any thread): (status, body)."""
    doc = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
        "parameters": parameters or {},
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}/v2/models/{model}/infer", data=orjson.dumps(doc), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, orjson.loads(error.read())


def test_queue_timeouts_and_a_full_queue_count_as_rejected(
    server: Serve, client: triton_http.InferenceServerClient
) -> None:
    with ThreadPoolExecutor(2) as pool:
        RUNNING.clear()
        busy = pool.submit(post_infer, server, "timeouts", {"sleep_s": 1.5})
        assert RUNNING.wait(10)  # the instance is running it
        queued = pool.submit(post_infer, server, "timeouts")
        settle(lambda: value(scrape(server), "nv_inference_pending_request_count", "timeouts") == 1)
        status, body = post_infer(server, "timeouts")  # the queue holds its one request: refused at once
        assert status == 503 and "maximum queue size" in body["error"]
        status, body = queued.result()  # waited past its 300 ms in the queue
        assert status == 503 and "timeout" in body["error"]
        assert busy.result()[0] == 200
    settle(lambda: stats(client, "timeouts")["inference_stats"]["success"]["count"] == 1)
    page = scrape(server)
    assert failures(page, "timeouts") == {"REJECTED": 2, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert stats(client, "timeouts")["inference_stats"]["fail"]["count"] == 2


def test_a_client_that_goes_away_while_queued_counts_as_canceled(
    server: Serve, client: triton_http.InferenceServerClient
) -> None:
    with ThreadPoolExecutor(1) as pool:
        RUNNING.clear()
        busy = pool.submit(post_infer, server, "cancels", {"sleep_s": 1.0})
        assert RUNNING.wait(10)  # the instance is running it
        body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]})
        head = f"POST /v2/models/cancels/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as gone:
            gone.sendall(head.encode() + body)
            settle(lambda: value(scrape(server), "nv_inference_pending_request_count", "cancels") == 1)
        settle(lambda: failures(scrape(server), "cancels")["CANCELED"] == 1)
        assert busy.result()[0] == 200
    settle(lambda: stats(client, "cancels")["inference_stats"]["success"]["count"] == 1)
    page = scrape(server)
    assert failures(page, "cancels") == {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert value(page, "nv_inference_pending_request_count", "cancels") == 0
    assert value(page, "nv_inference_exec_count", "cancels") == 1  # the cancelled request never ran


# process workers --------------------------------------------------------------------------------------------


def test_numbers_measured_in_a_worker_process_reach_the_core(
    server: Serve, client: triton_http.InferenceServerClient
) -> None:
    for _ in range(3):
        client.infer("in_process", [tensor()])
    settle(lambda: stats(client, "in_process")["inference_stats"]["success"]["count"] == 3)
    page = scrape(server)
    assert value(page, "nv_inference_exec_count", "in_process") == 3
    assert value(page, "nv_inference_compute_infer_duration_us", "in_process") >= 3 * 10_000  # 10 ms sleeps


def test_an_instance_that_dies_fails_its_requests_as_other(
    server: Serve, client: triton_http.InferenceServerClient
) -> None:
    before = failures(scrape(server), "in_process")
    with pytest.raises(InferenceServerException, match="died"):
        client.infer("in_process", [tensor()], parameters={"die": True})
    settle(lambda: failures(scrape(server), "in_process")["OTHER"] == before["OTHER"] + 1)
    assert failures(scrape(server), "in_process")["BACKEND"] == before["BACKEND"]


# decoupled models -------------------------------------------------------------------------------------------


def test_decoupled_models_report_response_stats_and_the_first_response_histogram(
    server: Serve, client: triton_http.InferenceServerClient
) -> None:
    received: list[Any] = []
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        grpc.start_stream(callback=lambda result, error: received.append(error or result))
        for _ in range(2):
            item = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
            item.set_data_from_numpy(np.zeros((1, 4), np.float32))
            grpc.async_stream_infer("streams", [item])
        grpc.stop_stream()
    finally:
        grpc.close()
    assert len(received) == 6 and not any(isinstance(r, Exception) for r in received)
    settle(lambda: stats(client, "streams")["inference_stats"]["success"]["count"] == 2)
    doc = stats(client, "streams")
    responses = doc["response_stats"]
    assert sorted(responses, key=int) == ["0", "1", "2", "3"]
    for index in ("0", "1", "2"):
        assert responses[index]["success"]["count"] == 2
        assert responses[index]["compute_infer"]["count"] == 2
        assert responses[index]["compute_output"]["count"] == 2
        assert responses[index]["fail"]["count"] == 0
    assert responses["3"]["empty_response"]["count"] == 2  # the flag-only final response
    assert responses["3"]["success"]["count"] == 0
    page = scrape(server)
    assert value(page, "nv_inference_request_success", "streams") == 2
    assert value(page, "nv_inference_first_response_histogram_ms_count", "streams") == 2
    assert value(page, "nv_inference_first_response_histogram_ms_bucket", "streams", le="+Inf") == 2
    assert not any(name.startswith("nv_inference_first_response") and dict(labels)["model"] == "counted"
                   for name, labels in series(page) if "model" in dict(labels))  # fmt: skip


# perf_analyzer ------------------------------------------------------------------------------------------------


def test_perf_analyzer_collects_metrics_and_its_server_breakdown_adds_up(server: Serve, perf_analyzer: str) -> None:
    command = [
        perf_analyzer,
        "-m",
        "counted",
        "-u",
        f"127.0.0.1:{server.http_port}",
        "--shape",
        "INPUT0:4",
        "--concurrency-range",
        "4",
        "--measurement-interval",
        "1000",
        "--max-trials",
        "6",
        "--stability-percentage",
        "1000",
        "--collect-metrics",
        "--metrics-url",
        f"127.0.0.1:{server.metrics_port}/metrics",
        "--metrics-interval",
        "200",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Server Prometheus Metrics:" in output, output
    # On a machine without a GPU only the GPU families are missing (Triton's CPU-only servers say the same).
    problems = [
        line
        for line in output.splitlines()
        if re.search(r"error|fail|unable", line, re.IGNORECASE) and not re.search(r"Unable to parse 'nv_gpu_", line)
    ]
    assert not problems, output
    match = re.search(
        r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ compute input (\d+) usec "
        r"\+ compute infer (\d+) usec \+ compute output (\d+) usec\)",
        output,
    )
    assert match, output
    total, overhead, queue, compute_input, compute_infer, compute_output = map(int, match.groups())
    assert total > 0 and overhead >= 0
    assert abs(overhead + queue + compute_input + compute_infer + compute_output - total) <= 5, output
    client_latency = re.search(r"Avg latency: (\d+) usec", output)
    assert client_latency and total <= int(client_latency.group(1)), output
