"""Queue policies over HTTP with real workers: priorities, timeouts, queue bounds, ordering."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton_http

from pyserve import DynamicBatcher, ModelConfig, QueuePolicy, Request, Serve, ServeConfig, Tensor

pytestmark = pytest.mark.integration

gate = threading.Event()
order: list[float] = []


def gated(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Blocks until the test opens the gate; records the order requests ran in (by their first value)."""
    gate.wait(10)
    for request in requests:
        order.extend(float(v) for v in request["INPUT0"][:, 0])
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def fp32(name: str) -> Tensor:
    return Tensor(name, np.float32, (1,))


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        serve.bind(
            "prioritized",
            gated,
            [fp32("INPUT0")],
            [fp32("OUTPUT0")],
            ModelConfig(
                max_batch_size=1,
                batcher=DynamicBatcher(priority_levels=2, default_priority_level=2),
            ),
        )
        serve.bind(
            "bounded",
            gated,
            [fp32("INPUT0")],
            [fp32("OUTPUT0")],
            ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=2))),
        )
        serve.bind(
            "timed",
            gated,
            [fp32("INPUT0")],
            [fp32("OUTPUT0")],
            ModelConfig(
                max_batch_size=1,
                batcher=DynamicBatcher(
                    default_queue_policy=QueuePolicy(default_timeout_microseconds=200_000, allow_timeout_override=True)
                ),
            ),
        )
        yield serve


def call(server: Serve, model: str, value: float, results: dict[float, object], **kwargs: object) -> None:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
    tensor = triton_http.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    try:
        results[value] = float(client.infer(model, [tensor], **kwargs).as_numpy("OUTPUT0")[0, 0])  # type: ignore[arg-type]
    except triton_http.InferenceServerException as exc:
        results[value] = exc
    finally:
        client.close()


def start(server: Serve, model: str, value: float, results: dict[float, object], **kwargs: object) -> threading.Thread:
    thread = threading.Thread(target=call, args=(server, model, value, results), kwargs=kwargs)
    thread.start()
    return thread


def test_higher_priority_requests_run_first(server: Serve) -> None:
    gate.clear()
    order.clear()
    results: dict[float, object] = {}
    threads = [start(server, "prioritized", 0.0, results)]  # occupies the instance
    time.sleep(0.3)
    threads += [start(server, "prioritized", 1.0, results)]  # default level 2
    time.sleep(0.2)
    threads += [start(server, "prioritized", 2.0, results, priority=1)]  # level 1 overtakes
    time.sleep(0.2)
    gate.set()
    for thread in threads:
        thread.join(30)
    assert order == [0.0, 2.0, 1.0]
    assert results == {0.0: 0.0, 1.0: 1.0, 2.0: 2.0}


def test_priority_out_of_range_is_refused(server: Serve) -> None:
    gate.set()
    results: dict[float, object] = {}
    call(server, "prioritized", 5.0, results, priority=7)
    assert isinstance(results[5.0], triton_http.InferenceServerException)
    assert "priority" in str(results[5.0])


def test_a_full_queue_rejects_with_503(server: Serve) -> None:
    gate.clear()
    results: dict[float, object] = {}
    threads = [start(server, "bounded", 0.0, results)]
    time.sleep(0.3)
    threads += [start(server, "bounded", float(v), results) for v in (1, 2)]
    time.sleep(0.3)
    call(server, "bounded", 3.0, results)
    gate.set()
    for thread in threads:
        thread.join(30)
    error = results[3.0]
    assert isinstance(error, triton_http.InferenceServerException)
    assert error.status() == "503" and "maximum queue size" in str(error).lower()
    assert [results[v] for v in (0.0, 1.0, 2.0)] == [0.0, 1.0, 2.0]


def test_a_request_that_waits_past_its_timeout_is_rejected(server: Serve) -> None:
    gate.clear()
    results: dict[float, object] = {}
    blocker = start(server, "timed", 0.0, results)
    time.sleep(0.3)
    # 50 ms override: it must be rejected while the instance is still blocked (the gate opens only after).
    started = time.monotonic()
    call(server, "timed", 1.0, results, timeout=50_000)
    waited = time.monotonic() - started
    gate.set()
    blocker.join(30)
    error = results[1.0]
    assert isinstance(error, triton_http.InferenceServerException)
    assert "timeout" in str(error).lower()
    assert waited < 0.9, f"the timeout was not enforced while the instance was busy ({waited:.2f} s)"
    assert results[0.0] == 0.0
