"""Faults under load: a process instance killed (SIGKILL) mid-batch, mid-stream and mid-BLS call — only its requests
fail, each with the reason; the instance is back within seconds; the shared memory in use does not grow. The slow
variant does it in a loop at concurrency 64 (``bash scripts/test.sh -m slow tests/integration/test_faults.py``)."""

from __future__ import annotations

import contextlib
import glob
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import pyserve
from pyserve import DynamicBatcher, ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.transport.shm import SHM_DIR

pytestmark = pytest.mark.integration

X = [Tensor("x", np.float32, (-1,))]
Y = [Tensor("y", np.float32, (-1,))]
ROW = 8192  # floats per request: 32 KiB, so a batch of them travels through shared memory


def echo_slowly(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    time.sleep(float(requests[0].parameters.get("sleep", 0)))
    return [{"y": request["x"]} for request in requests]


def stream_slowly(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for step in range(20):
        time.sleep(0.1)
        yield [{"y": request["x"] + step} for request in requests]


def call_slow_inner(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"y": pyserve.infer("slow_inner", {"x": r["x"]}, parameters={"sleep": "2"})["y"]} for r in requests]


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    batched = ModelConfig(
        max_batch_size=64, worker="process", batcher=DynamicBatcher(max_queue_delay_microseconds=200_000)
    )
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        serve.bind("batched", echo_slowly, X, Y, config=batched)
        serve.bind("streamer", stream_slowly, X, Y, config=ModelConfig(decoupled=True, worker="process"))
        serve.bind("slow_inner", echo_slowly, X, Y, config=ModelConfig(instances=2))
        serve.bind("bls_outer", call_slow_inner, X, Y, config=ModelConfig(worker="process"))
        yield serve


def _workers(server: Serve) -> set[int]:
    assert server._core is not None
    core = server._core.pid
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                state, parent = handle.read().rsplit(b")", 1)[1].split()[:2]
        except OSError:
            continue
        if int(parent) == core and state != b"Z":
            found.add(int(entry))
    return found


def _live_instances(server: Serve, model: str) -> int:
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        entry = next(e for e in client.get_model_repository_index() if e["name"] == model)
        return int(entry["instances"]["live"])
    finally:
        client.close()


def _shm_bytes(session: str) -> int:
    total = 0
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(session) + "*")):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(path).st_blocks * 512
    return total


def _infer(url: str, model: str, x: np.ndarray, sleep: str, outcomes: list[Any]) -> None:
    client = triton_http.InferenceServerClient(url, network_timeout=60)
    tensor = triton_http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    try:
        outcomes.append(client.infer(model, [tensor], parameters={"sleep": sleep}).as_numpy("y"))
    except InferenceServerException as exc:
        outcomes.append(exc)
    finally:
        client.close()


def _wait_back(server: Serve, model: str, instances: int, timeout_s: float) -> float:
    started = time.monotonic()
    while _live_instances(server, model) < instances:
        assert time.monotonic() - started < timeout_s, f"model '{model}' did not get its instance back"
        time.sleep(0.05)
    return time.monotonic() - started


def test_kill_mid_batch_fails_that_batch_only(server: Serve) -> None:
    url = server.url.removeprefix("http://")
    rows = [np.full((1, ROW), i, np.float32) for i in range(16)]
    # Warm up: the pools exist before their size is taken.
    warm: list[Any] = []
    _infer(url, "batched", rows[0], "0", warm)
    session = server._session
    shm_before = _shm_bytes(session)
    for cycle in range(3):
        outcomes: list[Any] = []
        callers = [threading.Thread(target=_infer, args=(url, "batched", row, "3", outcomes)) for row in rows]
        for caller in callers:
            caller.start()
        time.sleep(0.8)  # batched together (200 ms window), now running for 3 s
        victim = _process_of(server, "batched")
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        for caller in callers:
            caller.join(30)
        failures = [o for o in outcomes if isinstance(o, InferenceServerException)]
        assert len(failures) == 16, f"cycle {cycle}: {outcomes}"
        assert all("died" in str(f) and "SIGKILL" in str(f) and "batched" in str(f) for f in failures)
        _wait_back(server, "batched", 1, 10)
        back_in = time.monotonic() - killed_at
        # The first restart is quick; a process that keeps dying waits longer each time (0.1, 0.2, 0.4 s...).
        assert back_in < (2.0 if cycle == 0 else 4.0), f"cycle {cycle}: instance back only {back_in:.1f} s after"
        answers: list[Any] = []
        _infer(url, "batched", rows[3], "0", answers)
        np.testing.assert_array_equal(answers[0], rows[3])
    # Killed batches' input slots went back to the core's pool: nothing more is held than after the first call.
    assert _shm_bytes(session) <= shm_before + 2 * ROW * 4 * 16


def _process_of(server: Serve, model: str) -> int:
    for pid in sorted(_workers(server)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read()
        except OSError:
            continue
        if f"/{model}-".encode() in command:
            return pid
    raise AssertionError(f"no worker process of '{model}'")


def test_kill_mid_stream_ends_that_stream_with_the_reason(server: Serve) -> None:
    events: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    client.start_stream(lambda result, error: events.put((result, error)))
    try:
        tensor = triton_grpc.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        client.async_stream_infer("streamer", [tensor], request_id="doomed")
        first, error = events.get(timeout=10)
        assert error is None and first.as_numpy("y").tolist() == [0.0]
        os.kill(_process_of(server, "streamer"), signal.SIGKILL)
        deadline = time.monotonic() + 15
        while True:
            _result, error = events.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                break
        assert "died" in str(error) and "streamer" in str(error)
    finally:
        client.stop_stream()
        client.close()
    _wait_back(server, "streamer", 1, 10)


def test_kill_mid_bls_call_fails_the_caller_and_withdraws_its_call(server: Serve) -> None:
    url = server.url.removeprefix("http://")
    outcomes: list[Any] = []
    caller = threading.Thread(target=_infer, args=(url, "bls_outer", np.ones(2, np.float32), "0", outcomes))
    caller.start()
    time.sleep(0.7)  # bls_outer is waiting on slow_inner (2 s)
    os.kill(_process_of(server, "bls_outer"), signal.SIGKILL)
    caller.join(30)
    assert len(outcomes) == 1 and isinstance(outcomes[0], InferenceServerException)
    assert "died" in str(outcomes[0]) and "bls_outer" in str(outcomes[0])
    _wait_back(server, "bls_outer", 1, 10)
    # The inner model is free again (its withdrawn call does not hold an instance for long) and the caller works.
    answers: list[Any] = []
    _infer(url, "slow_inner", np.ones(2, np.float32), "0", answers)
    np.testing.assert_array_equal(answers[0], np.ones(2, np.float32))


FAULT_LOOP_S = float(os.environ.get("PYSERVE_FAULT_LOOP_S", "120"))


@pytest.mark.slow
@pytest.mark.timeout(FAULT_LOOP_S + 120)  # the loop, plus its wind-down: past the suite's per-test timeout
def test_kill_loop_at_concurrency_64(server: Serve) -> None:
    """Minutes of concurrency 64 on a batching process model while its process is killed every few seconds:
    every answer is right, every failure names the death, the pool does not grow, the model always comes back."""
    duration_s = FAULT_LOOP_S
    url = server.url.removeprefix("http://")
    session = server._session
    stop_at = time.monotonic() + duration_s
    wrong: list[str] = []
    counts = {"ok": 0, "died": 0}
    lock = threading.Lock()

    def client(index: int) -> None:
        connection = triton_http.InferenceServerClient(url, network_timeout=60)
        x = np.full((1, ROW), index, np.float32)
        tensor = triton_http.InferInput("x", [1, ROW], "FP32")
        tensor.set_data_from_numpy(x)
        try:
            while time.monotonic() < stop_at:
                try:
                    y = connection.infer("batched", [tensor], parameters={"sleep": "0.05"}).as_numpy("y")
                    ok = bool(np.array_equal(y, x))
                    with lock:
                        counts["ok"] += 1
                        if not ok:
                            wrong.append(f"client {index}: wrong answer")
                except InferenceServerException as exc:
                    with lock:
                        if "died" in str(exc) or "not ready" in str(exc) or "no live instance" in str(exc):
                            counts["died"] += 1
                        else:
                            wrong.append(str(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    shm_after_warmup = _shm_bytes(session)
    kills = 0
    while time.monotonic() < stop_at - 3:
        time.sleep(3)
        try:
            os.kill(_process_of(server, "batched"), signal.SIGKILL)
            kills += 1
        except AssertionError:
            pass  # between a death and its restart
    for thread in threads:
        thread.join(120)
    assert not wrong, wrong[:5]
    assert kills >= duration_s / 6 and counts["ok"] > 0, (kills, counts)
    _wait_back(server, "batched", 1, 10)
    assert _shm_bytes(session) <= shm_after_warmup * 1.5 + (1 << 20), (shm_after_warmup, _shm_bytes(session))
