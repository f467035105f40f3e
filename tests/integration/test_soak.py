"""Soak: many requests of mixed sizes through HTTP, checking every answer, memory and shared memory at the end.

Marked slow: run apart with ``bash scripts/test.sh -m slow``. Bounded in count and time.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import tritonclient.http as triton_http

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.transport.shm import SHM_DIR

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REQUESTS_PER_CLIENT = 1500
CLIENTS = 8
TIME_LIMIT_S = 240.0


def plus_one(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"] + 1} for request in requests]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_mixed_traffic_soak_keeps_answers_right_and_memory_flat() -> None:
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    server.bind(
        "plus_one",
        [plus_one, plus_one],
        [Tensor("INPUT0", np.float32, (-1,))],
        [Tensor("OUTPUT0", np.float32, (-1,))],
        ModelConfig(max_batch_size=16),
    )
    errors: list[str] = []
    deadline = time.monotonic() + TIME_LIMIT_S
    with server:
        assert server._core is not None
        core_pid = server._core.pid

        def client(index: int, count: int) -> None:
            rng = np.random.default_rng(index)
            connection = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=60)
            try:
                for _ in range(count):
                    if time.monotonic() > deadline:
                        errors.append("time limit reached")
                        return
                    # Mostly small tensors, some large enough for shared memory (64 KiB and up).
                    size = int(rng.choice([4, 64, 1024, 40_000]))
                    rows = int(rng.integers(1, 4))
                    data = rng.standard_normal((rows, size)).astype(np.float32)
                    tensor = triton_http.InferInput("INPUT0", list(data.shape), "FP32")
                    tensor.set_data_from_numpy(data, binary_data=bool(rng.integers(0, 2)) or size > 1024)
                    got = connection.infer("plus_one", [tensor]).as_numpy("OUTPUT0")
                    if not np.array_equal(got, data + 1):
                        errors.append(f"client {index}: wrong answer for shape {data.shape}")
                        return
            except Exception as exc:
                errors.append(f"client {index}: {exc!r}")
            finally:
                connection.close()

        def run_round(count: int) -> None:
            threads = [threading.Thread(target=client, args=(i, count)) for i in range(CLIENTS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(TIME_LIMIT_S)

        run_round(200)  # warm up: pools, allocator, imports
        baseline = rss_kib(core_pid)
        run_round(REQUESTS_PER_CLIENT)
        grown = rss_kib(core_pid) - baseline
        assert errors == []
        # A leak of even a few hundred bytes per request would show as tens of MiB here.
        assert grown < 32 * 1024, f"the core's RSS grew by {grown} KiB over {CLIENTS * REQUESTS_PER_CLIENT} requests"
        stats = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}").get_inference_statistics("plus_one")[
            "model_stats"
        ][0]
        assert stats["inference_stats"]["success"]["count"] == CLIENTS * (REQUESTS_PER_CLIENT + 200)
        assert stats["inference_stats"]["fail"]["count"] == 0
        session = server._session
    assert [name for name in os.listdir(SHM_DIR) if name.startswith(session)] == []
