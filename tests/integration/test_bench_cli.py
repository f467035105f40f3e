"""``pyserve bench`` against a real server: each step measured, the table, the JSON/CSV results and the plot, both
protocols, closed and open loop, errors counted, and a server that offers only KServe's metadata.

The models sleep a fixed time, so the numbers have known bounds: ``sleep5`` takes 5 ms a request on each of four
instances; ``batched`` takes 2 ms a batch.
"""

from __future__ import annotations

import asyncio
import csv
import itertools
import json
import multiprocessing
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor, batch
from pyserve.bench.progress import Progress
from pyserve.bench.runner import run_bench
from pyserve.bench.settings import BenchSettings, levels_of

from .cli_process import clean_environment, pyserve_command

pytestmark = pytest.mark.integration

SERVICE_S = 0.005
FAST = ("--warmup", "0.2s", "--window", "0.5s", "--duration", "1.5s")


def sleep5(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    time.sleep(SERVICE_S)
    return [{"y": request["x"]} for request in requests]


@batch
def batched(x: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(0.002)
    return {"y": x}


_calls = itertools.count()


def every_other_fails(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    if next(_calls) % 2:
        raise ValueError("odd call")
    return [{"y": request["x"]} for request in requests]


def always_fails(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    raise RuntimeError("this model always fails")


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    x, y = [Tensor("x", np.float32, (-1,))], [Tensor("y", np.float32, (-1,))]
    s.bind("sleep5", sleep5, inputs=x, outputs=y, config=ModelConfig(instances=4))
    s.bind("batched", batched, inputs=x, outputs=y, config=ModelConfig(max_batch_size=16))
    s.bind("flaky", every_other_fails, inputs=x, outputs=y)
    s.bind("broken", always_fails, inputs=x, outputs=y)
    try:
        s.run()
        yield s
    finally:
        s.stop()


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pyserve_command("bench", *args), cwd=cwd, env=clean_environment(), capture_output=True, text=True, timeout=120
    )


def test_bench_measures_each_step_and_writes_results_and_plot(server: Serve, tmp_path: Path) -> None:
    run = bench(
        "sleep5", "--url", server.url, "--shape", "x:16", "--concurrency", "1,4", *FAST,
        "--output", "out.json", "--plot", "out.html", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    # The live progress went to stderr, the table to stdout.
    assert "[2/2] concurrency 4: window 1/3" in run.stderr
    table = run.stdout.splitlines()
    assert "model 'sleep5' at http://127.0.0.1:" in table[0] and "(x FP32[16])" in table[0]
    rows = {line.split()[0]: line.split() for line in table if line.strip()[:1].isdigit()}
    assert set(rows) == {"1", "4"}

    report = json.loads((tmp_path / "out.json").read_text())
    assert report["mode"] == "concurrency" and report["client_processes"] == 1
    one, four = report["steps"]
    assert (one["concurrency"], four["concurrency"]) == (1, 4)
    # One request at a time takes 5 ms plus the round trip; four instances serve four at once.
    assert 100 < one["throughput_infer_per_s"] < 1 / SERVICE_S
    assert 2.5 * one["throughput_infer_per_s"] < four["throughput_infer_per_s"] < 4 / SERVICE_S
    for step in (one, four):
        assert step["failures"] == 0 and step["errors"] == {}
        latency = step["latency_us"]
        assert SERVICE_S * 1e6 < latency["p50_us"] <= latency["p90_us"] <= latency["p95_us"] <= latency["p99_us"]
        # The server's split, read from its statistics as perf_analyzer reads it.
        server_side = step["server"]
        assert SERVICE_S * 1e6 < server_side["compute_infer_us"] < 3 * SERVICE_S * 1e6
        assert server_side["queue_us"] < server_side["compute_infer_us"]
        assert server_side["batch_rows"] == 1.0
    page = (tmp_path / "out.html").read_text()
    assert page.count("<svg") == 1 and "latency against throughput" in page and "<script" not in page


def test_bench_over_grpc_with_several_client_processes_writes_csv(server: Serve, tmp_path: Path) -> None:
    run = bench(
        "sleep5", "--url", f"grpc://{server.grpc_address}", "--shape", "x:16", "--concurrency", "4",
        "--processes", "2", *FAST, "--output", "out.csv", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "2 client process(es)" in run.stdout
    (row,) = list(csv.DictReader((tmp_path / "out.csv").read_text().splitlines()))
    assert row["concurrency"] == "4" and row["failures"] == "0"
    assert 250 < float(row["throughput_infer_per_s"]) < 4 / SERVICE_S
    assert float(row["server_compute_infer_us"]) > SERVICE_S * 1e6


def test_rows_per_request_count_as_inferences(server: Serve) -> None:
    settings = BenchSettings(
        model="batched", url=server.url, levels=levels_of([4]), batch_size=4, shapes={"x": (8,)},
        warmup_s=0.2, window_s=0.5, duration_s=1.5,
    )  # fmt: skip
    (step,) = run_bench(settings).steps
    assert step.rows_per_request == 4
    assert step.throughput == pytest.approx(4 * step.requests_per_s)
    assert step.measured.server is not None
    rows = step.measured.server.batch_rows
    assert rows is not None and rows >= 4
    assert not multiprocessing.active_children()  # the client processes are gone


def test_open_loop_sends_the_rate_asked(server: Serve) -> None:
    settings = BenchSettings(
        model="sleep5", url=server.url, levels=levels_of((), [100.0, 200.0]), shapes={"x": (4,)},
        warmup_s=0.2, window_s=0.5, duration_s=1.5, distribution="constant",
    )  # fmt: skip
    report = run_bench(settings)
    assert report.to_json()["mode"] == "request_rate"
    for step, rate in zip(report.steps, (100.0, 200.0), strict=True):
        assert step.level.request_rate == rate
        assert rate * 0.8 < step.throughput < rate * 1.2
        assert step.failures == 0


def test_errors_are_counted_by_message(server: Serve) -> None:
    settings = BenchSettings(
        model="flaky", url=server.url, levels=levels_of([2]), shapes={"x": (4,)},
        warmup_s=0.2, window_s=0.5, duration_s=1.0,
    )  # fmt: skip
    (step,) = run_bench(settings).steps
    assert step.measured.successes > 0 and step.failures > 0
    ((message, count),) = step.measured.errors.items()
    assert message == "ModelExecutionError: model 'flaky' raised ValueError: odd call"
    assert count == step.failures
    assert 0.3 < step.to_json()["error_rate"] < 0.7


def test_a_model_that_always_fails_exits_1_with_the_errors_shown(server: Serve, tmp_path: Path) -> None:
    run = bench("broken", "--url", server.url, "--shape", "x:4", "--concurrency", "1", *FAST, cwd=tmp_path)
    assert run.returncode == 1
    assert "errors:" in run.stdout
    assert "x ModelExecutionError: model 'broken' raised RuntimeError: this model always fails" in run.stdout
    assert "pyserve bench: no request succeeded at concurrency 1" in run.stderr


def test_a_server_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    run = bench("m", "--url", "http://127.0.0.1:9", "--concurrency", "1", cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.startswith("pyserve: error: ") and "127.0.0.1:9" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_bad_option_is_a_usage_error(tmp_path: Path) -> None:
    run = bench("m", "--duration", "ten", cwd=tmp_path)
    assert run.returncode == 2 and "not a duration" in run.stderr
    run = bench("m", "--plot", "report.png", cwd=tmp_path)
    assert run.returncode == 2 and "must end in .html or .svg" in run.stderr


def test_the_load_generator_costs_little_cpu_per_request(server: Serve) -> None:
    # The generator must not be the bottleneck: its CPU per request is a small part of the server's ~100-250 µs.
    settings = BenchSettings(
        model="batched", url=server.url, levels=levels_of([16]), shapes={"x": (4,)}, processes=1,
        warmup_s=0.3, window_s=0.5, duration_s=1.5,
    )  # fmt: skip
    (step,) = run_bench(settings, Progress(None)).steps
    cpu_per_request_us = step.measured.client_cpu / step.requests_per_s * 1e6
    assert step.requests_per_s > 1000
    assert cpu_per_request_us < 60, f"{cpu_per_request_us:.1f} us of client CPU per request"


# a server with KServe's metadata only -------------------------------------------------------------------------------


@pytest.fixture()
def kserve_only() -> Iterator[str]:
    """A bare KServe v2 server (no Triton config or statistics extension): echoes ``x`` (FP32 [4]) as ``y``."""

    async def metadata(request: web.Request) -> web.Response:
        tensor = {"datatype": "FP32", "shape": [4]}
        return web.json_response(
            {"name": "echo", "versions": ["1"], "platform": "custom",
             "inputs": [{"name": "x", **tensor}], "outputs": [{"name": "y", **tensor}]}
        )  # fmt: skip

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"model_name": "echo", "outputs": [{"name": "y", "datatype": "FP32", "shape": [4],
                                                                     "data": [0.0, 1.0, 2.0, 3.0]}]})  # fmt: skip

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.add_routes([web.get("/v2/models/echo", metadata), web.post("/v2/models/echo/infer", infer)])
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_server_without_the_config_endpoint_is_read_from_its_metadata(kserve_only: str) -> None:
    settings = BenchSettings(model="echo", url=kserve_only, levels=levels_of([2]), warmup_s=0.2, window_s=0.5,
                             duration_s=1.5)  # fmt: skip
    report = run_bench(settings)
    assert report.inputs == {"x": ("FP32", (4,))}
    (step,) = report.steps
    assert step.failures == 0 and step.throughput > 50
    assert step.measured.server is None
    doc: dict[str, Any] = step.to_json()
    assert doc["server"] is None and doc["outside_server_us"] is None
