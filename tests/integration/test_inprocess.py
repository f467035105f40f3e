"""Serve.infer and its variants: calls from the server's own process, scheduled like network requests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, Serve, ServeConfig
from pyserve.errors import (
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelNotReadyError,
    RequestTimeoutError,
    ServerError,
)

from .conftest import fp32, identity

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_infer_returns_the_models_outputs(server: Serve) -> None:
    np.testing.assert_array_equal(server.infer("identity_fp32", {"INPUT0": X})["OUTPUT0"], X)
    outputs = server.infer("add_sub", {"INPUT0": X, "INPUT1": X * 2}, outputs=["OUTPUT1"])
    assert list(outputs) == ["OUTPUT1"]
    np.testing.assert_array_equal(outputs["OUTPUT1"], -X)
    texts = server.infer("multi", {"INPUT0": X})["TEXT"]
    assert texts.dtype == object and isinstance(texts.ravel()[0], bytes)


def test_large_inputs_and_outputs_travel_through_shared_memory(server: Serve) -> None:
    big = np.random.default_rng(0).standard_normal((1, 1 << 21)).astype(np.float32)  # 8 MiB
    np.testing.assert_array_equal(server.infer("large_fp32", {"INPUT0": big})["OUTPUT0"], big)


def test_calls_from_many_threads_are_batched_together(server: Serve) -> None:
    before = server.infer  # the same server object serves every thread
    stats_before = _counts(server, "local_identity")
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def call(value: float) -> None:
        try:
            for _ in range(20):
                results.append(before("local_identity", {"INPUT0": np.full((1, 4), value, np.float32)})["OUTPUT0"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(float(i),)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:2]
    assert len(results) == 160
    inferences, executions = (a - b for a, b in zip(_counts(server, "local_identity"), stats_before, strict=True))
    assert inferences == 160  # counted in the model's statistics like any request
    assert executions < inferences, "concurrent calls should share batches"


def _counts(server: Serve, model: str) -> tuple[int, int]:
    import urllib.request

    import orjson

    with urllib.request.urlopen(f"{server.url}/v2/models/{model}/stats", timeout=10) as response:
        stats = orjson.loads(response.read())["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_errors_are_the_servers_errors(server: Serve) -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        server.infer("no_such_model", {"INPUT0": X})
    with pytest.raises(InvalidInputError, match="INPUT7"):
        server.infer("identity_fp32", {"INPUT7": X})
    with pytest.raises(ModelExecutionError, match="negative input seen"):
        server.infer("raises", {"INPUT0": -X})
    np.testing.assert_array_equal(server.infer("raises", {"INPUT0": X})["OUTPUT0"], X)  # still serving


def test_a_call_gives_up_after_its_timeout(server: Serve) -> None:
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError):
        server.infer("slow", {"INPUT0": X}, parameters={"sleep_s": 2.0}, timeout_s=0.2)
    assert time.monotonic() - started < 1.5


def test_ainfer_runs_calls_concurrently_on_the_event_loop(server: Serve) -> None:
    async def main() -> list[np.ndarray]:
        calls = [server.ainfer("identity_fp32", {"INPUT0": X + i}) for i in range(10)]
        return [result["OUTPUT0"] for result in await asyncio.gather(*calls)]

    for index, output in enumerate(asyncio.run(main())):
        np.testing.assert_array_equal(output, X + index)
    # The thread's channel outlives the loop that used it: a plain call works afterwards.
    np.testing.assert_array_equal(server.infer("identity_fp32", {"INPUT0": X})["OUTPUT0"], X)


def test_streams_are_iterated_and_can_be_left_early(server: Serve) -> None:
    responses = [r["OUTPUT0"] for r in server.infer_stream("decoupled", {"INPUT0": X})]
    assert len(responses) == 2
    np.testing.assert_array_equal(responses[1], X + 1)
    stream = server.infer_stream("decoupled", {"INPUT0": X})
    np.testing.assert_array_equal(next(stream)["OUTPUT0"], X)
    stream.close()  # withdraws the request

    async def main() -> int:
        return len([r async for r in server.ainfer_stream("decoupled", {"INPUT0": X})])

    assert asyncio.run(main()) == 2


def test_infer_needs_a_running_server_and_works_again_after_a_restart() -> None:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    s.bind("identity", identity, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0")], config=ModelConfig(8))
    with pytest.raises(ServerError, match="running server"):
        s.infer("identity", {"INPUT0": X})
    for _ in range(2):
        with s:
            np.testing.assert_array_equal(s.infer("identity", {"INPUT0": X})["OUTPUT0"], X)
        with pytest.raises(ServerError):
            s.infer("identity", {"INPUT0": X})


def test_stop_while_threads_and_event_loops_keep_calling() -> None:
    # Callers that keep calling while the server stops: the drain refuses their new calls (it used to wait out its
    # whole timeout while they kept it busy), calls under way fail with a clear error, and no caller's socket is
    # closed under it by the stopping thread ("Socket operation on non-socket").
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=20))
    s.bind("identity", identity, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0")], config=ModelConfig(8))
    s.run()
    stop = threading.Event()
    unexpected: list[BaseException] = []
    answered = [0]
    one = np.ones((1, 4), np.float32)

    def outcome(call: Callable[[], Any]) -> None:
        try:
            call()
            answered[0] += 1
        except (ModelNotReadyError, ServerError):
            pass  # "the server is shutting down" / "stopped" / "needs a running server"
        except BaseException as exc:
            unexpected.append(exc)

    def blocking() -> None:
        while not stop.is_set():
            outcome(lambda: s.infer("identity", {"INPUT0": one}))

    def looping() -> None:
        async def caller() -> None:
            while not stop.is_set():
                try:
                    await s.ainfer("identity", {"INPUT0": one})
                    answered[0] += 1
                except (ModelNotReadyError, ServerError):
                    await asyncio.sleep(0.001)
                except BaseException as exc:
                    unexpected.append(exc)

        async def callers() -> None:
            await asyncio.gather(*(caller() for _ in range(3)))

        asyncio.run(callers())

    threads = [threading.Thread(target=blocking) for _ in range(6)]
    threads += [threading.Thread(target=looping) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while answered[0] < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert answered[0] >= 200
        started = time.monotonic()
        s.stop()
        took = time.monotonic() - started
        time.sleep(0.2)  # the callers go on against the stopped server
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
        s.stop()
    assert not any(thread.is_alive() for thread in threads), "a caller hangs"
    assert not unexpected, unexpected[:3]
    assert took < 10, f"stop() took {took:.1f} s: the drain waited on calls that kept coming"
