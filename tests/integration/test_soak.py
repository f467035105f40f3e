"""Soak: concurrency 64 over mixed models — a batched thread model, process instances, an ensemble, a streaming
model over gRPC, large tensors through shared memory — every answer checked, the RSS of every process (this one,
the core, each process instance) sampled, and nothing left in /dev/shm at the end.

Marked slow. ``bash scripts/test.sh -m slow tests/integration/test_soak.py`` runs it for ``PYSERVE_SOAK_S`` seconds
(120 by default); the long run (docs/reliability.md) is ``PYSERVE_SOAK_S=1800``. Memory after warm-up (the first
fifth of the run, at least 30 s) may not grow by more than 5 % by the end (medians of the first and last samples).
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from pyserve import DynamicBatcher, ModelConfig, Request, Serve, ServeConfig, Step, Tensor, batch
from pyserve.transport.shm import SHM_DIR

SOAK_S = float(os.environ.get("PYSERVE_SOAK_S", "120"))
# The run, plus start-up, warm-up and clean-up: the suite's per-test timeout would cut it short.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(SOAK_S + 300)]

CLIENTS = 64
STREAMERS = 4
SAMPLE_EVERY_S = 2.0
X = [Tensor("INPUT0", np.float32, (-1,))]
Y = [Tensor("OUTPUT0", np.float32, (-1,))]


@batch
def plus_one(INPUT0: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0 + 1}


@batch
def times_two(INPUT0: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0 * 2}


def count_up(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for step in range(3):
        yield [{"OUTPUT0": request["INPUT0"] + step} for request in requests]


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        return 0
    return 0


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except FileNotFoundError:
        return []


def test_soak_at_concurrency_64_keeps_answers_right_and_memory_flat() -> None:
    duration_s = SOAK_S
    warmup_s = max(30.0, duration_s / 5)
    batching = ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=500))
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    server.bind("plus_one", plus_one, X, Y, config=batching)
    server.bind(
        "times_two_process",
        times_two,
        X,
        Y,
        config=ModelConfig(max_batch_size=32, worker="process", instances=2),
    )
    server.bind_ensemble(
        "pipeline",
        [
            Step("plus_one", inputs={"INPUT0": "INPUT0"}, outputs={"OUTPUT0": "added"}),
            Step("times_two_process", inputs={"INPUT0": "added"}, outputs={"OUTPUT0": "OUTPUT0"}),
        ],
        X,
        Y,
        max_batch_size=32,
    )
    server.bind("count_up", count_up, X, Y, config=ModelConfig(decoupled=True))
    errors: list[str] = []
    answered = {"unary": 0, "stream": 0}
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s
    samples: list[tuple[float, dict[int, int]]] = []
    with server:
        assert server._core is not None
        core_pid = server._core.pid
        started = time.monotonic()
        url = server.url.removeprefix("http://")
        expected = {
            "plus_one": lambda x: x + 1,
            "times_two_process": lambda x: x * 2,
            "pipeline": lambda x: (x + 1) * 2,
        }

        def client(index: int) -> None:
            rng = np.random.default_rng(index)
            connection = triton_http.InferenceServerClient(url, network_timeout=60, connection_timeout=60)
            try:
                while time.monotonic() < stop_at:
                    model = ("plus_one", "times_two_process", "pipeline")[int(rng.integers(0, 3))]
                    # Mostly small tensors; some of 160 KiB, which travel through shared memory.
                    size = int(rng.choice([4, 64, 1024, 40_000], p=[0.4, 0.3, 0.2, 0.1]))
                    data = rng.standard_normal((1, size)).astype(np.float32)
                    tensor = triton_http.InferInput("INPUT0", [1, size], "FP32")
                    tensor.set_data_from_numpy(data, binary_data=size > 64 or bool(rng.integers(0, 2)))
                    got = connection.infer(model, [tensor]).as_numpy("OUTPUT0")
                    if not np.allclose(got, expected[model](data)):
                        with lock:
                            errors.append(f"client {index}: wrong answer from {model} for {size} floats")
                        return
                    with lock:
                        answered["unary"] += 1
            except Exception as exc:
                with lock:
                    errors.append(f"client {index}: {exc!r}")
            finally:
                connection.close()

        def streamer(index: int) -> None:
            events: queue.Queue[tuple[Any, Any]] = queue.Queue()
            connection = triton_grpc.InferenceServerClient(server.grpc_address)
            connection.start_stream(lambda result, error: events.put((result, error)))
            try:
                number = 0
                while time.monotonic() < stop_at:
                    number += 1
                    tensor = triton_grpc.InferInput("INPUT0", [2], "FP32")
                    tensor.set_data_from_numpy(np.full(2, number, np.float32))
                    connection.async_stream_infer("count_up", [tensor], request_id=str(number))
                    for step in range(3):
                        result, error = events.get(timeout=30)
                        if error is not None or result.as_numpy("OUTPUT0").tolist() != [number + step] * 2:
                            with lock:
                                errors.append(f"streamer {index}: {error or 'wrong answer'} at step {step}")
                            return
                    with lock:
                        answered["stream"] += 1
            except Exception as exc:
                with lock:
                    errors.append(f"streamer {index}: {exc!r}")
            finally:
                connection.stop_stream()
                connection.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        threads += [threading.Thread(target=streamer, args=(i,)) for i in range(STREAMERS)]
        for thread in threads:
            thread.start()
        while time.monotonic() < stop_at and not errors:
            time.sleep(SAMPLE_EVERY_S)
            pids = [os.getpid(), core_pid, *children(core_pid)]
            samples.append((time.monotonic() - started, {pid: rss_kib(pid) for pid in pids}))
        for thread in threads:
            thread.join(120)
        session = server._session
    assert errors == [], errors[:5]
    assert [name for name in os.listdir(SHM_DIR) if name.startswith(session)] == []
    after_warmup = [rss for at, rss in samples if at >= warmup_s]
    assert len(after_warmup) >= 6, "the run is too short to compare memory"
    first, last = after_warmup[: len(after_warmup) // 4 or 1], after_warmup[-(len(after_warmup) // 4 or 1) :]
    report = []
    for pid in after_warmup[0]:
        start = statistics.median(sample.get(pid, 0) for sample in first)
        end = statistics.median(sample.get(pid, 0) for sample in last)
        report.append(f"pid {pid}: {start / 1024:.1f} -> {end / 1024:.1f} MiB")
        assert end <= start * 1.05, f"RSS of pid {pid} grew by more than 5 % after warm-up: " + "; ".join(report)
    print(  # the figures docs/reliability.md records (pytest -s shows them)
        f"soak {duration_s:.0f} s: {answered['unary']} unary and {answered['stream']} streamed requests, 0 errors; "
        + "; ".join(report)
    )
