"""Soak: concurrency 64 over mixed models — a batched thread model, process instances, an ensemble, a streaming
model over gRPC, large tensors through shared memory — every answer checked, the RSS of every process of the server
(this one, which runs Serve and the thread instances; the core; each process instance) sampled, and nothing left in
/dev/shm at the end. The clients run in a process of their own (soak_clients.py): their memory is not the server's.

Marked slow. ``bash scripts/test.sh -m slow tests/integration/test_soak.py`` runs it for ``PYSERVE_SOAK_S`` seconds
(120 by default); the long run (docs/reliability.md) is ``PYSERVE_SOAK_S=1800``. Memory after warm-up (the first
fifth of the run, at least 30 s) may not grow by more than 5 % by the end (medians of the first and last samples).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pyserve import DynamicBatcher, ModelConfig, Request, Serve, ServeConfig, Step, Tensor, batch
from pyserve.transport.shm import SHM_DIR

SOAK_S = float(os.environ.get("PYSERVE_SOAK_S", "120"))
# The run, plus start-up, warm-up and clean-up: the suite's per-test timeout would cut it short.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(SOAK_S + 300)]

CLIENTS = 64  # HTTP client threads, and gRPC stream threads, in a process of their own (soak_clients.py)
CLIENTS_SCRIPT = Path(__file__).with_name("soak_clients.py")
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
    samples: list[tuple[float, dict[int, int]]] = []
    client_rss: list[int] = []
    with server:
        assert server._core is not None
        core_pid = server._core.pid
        started = time.monotonic()
        command = [sys.executable, str(CLIENTS_SCRIPT), server.url.removeprefix("http://"), server.grpc_address]
        command += [str(duration_s), str(CLIENTS), str(STREAMERS)]
        clients = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            while clients.poll() is None and time.monotonic() - started < duration_s:
                time.sleep(SAMPLE_EVERY_S)
                pids = [os.getpid(), core_pid, *children(core_pid)]
                samples.append((time.monotonic() - started, {pid: rss_kib(pid) for pid in pids}))
                client_rss.append(rss_kib(clients.pid))
            output, _ = clients.communicate(timeout=180)
        finally:
            if clients.poll() is None:
                clients.kill()
                clients.wait()
        session = server._session
    assert clients.returncode == 0, f"the clients' process exited with {clients.returncode}"
    result = json.loads(output.strip().splitlines()[-1])
    errors, answered = result["errors"], result
    assert errors == [], errors[:5]
    assert [name for name in os.listdir(SHM_DIR) if name.startswith(session)] == []
    after_warmup = [rss for at, rss in samples if at >= warmup_s]
    assert len(after_warmup) >= 6, "the run is too short to compare memory"
    first, last = after_warmup[: len(after_warmup) // 4 or 1], after_warmup[-(len(after_warmup) // 4 or 1) :]
    report = []
    names = {os.getpid(): "Serve's process (with the thread instances)", core_pid: "core"}
    for pid in after_warmup[0]:
        start = statistics.median(sample.get(pid, 0) for sample in first)
        end = statistics.median(sample.get(pid, 0) for sample in last)
        name = names.get(pid, f"process instance {pid}")
        report.append(f"{name}: {start / 1024:.1f} -> {end / 1024:.1f} MiB ({(end / start - 1) * 100:+.1f} %)")
        assert end <= start * 1.05, f"RSS of the {name} grew by more than 5 % after warm-up: " + "; ".join(report)
    clients_at = [rss for (at, _), rss in zip(samples, client_rss, strict=True) if at >= warmup_s and rss]
    quarter = len(clients_at) // 4 or 1
    start, end = statistics.median(clients_at[:quarter]), statistics.median(clients_at[-quarter:])
    report.append(f"the clients' process (not asserted): {start / 1024:.1f} -> {end / 1024:.1f} MiB")
    print(  # the figures docs/reliability.md records (pytest -s shows them)
        f"soak {duration_s:.0f} s: {answered['unary']} unary and {answered['stream']} streamed requests, 0 errors; "
        + "; ".join(report)
    )
