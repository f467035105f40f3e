"""Graceful shutdown: SIGTERM (or ``Serve.stop()``) takes nothing new, lets what is in flight finish within
``exit_timeout_s``, then exits 0 — over HTTP and gRPC, for thread and process instances."""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.client import ModelClient

from .cli_process import FREE_PORTS, SERVING_LINE, RunningCommand, pyserve_command

pytestmark = pytest.mark.integration

X = [Tensor("x", np.float32, (-1,))]
Y = [Tensor("y", np.float32, (-1,))]


def slow(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    time.sleep(float(requests[0].parameters.get("sleep", 1.0)))
    return [{"y": request["x"]} for request in requests]


def _call_http(url: str, outcomes: list[Any], sleep: float = 1.0) -> None:
    client = triton_http.InferenceServerClient(url, network_timeout=30)
    tensor = triton_http.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.ones(2, np.float32))
    try:
        outcomes.append(client.infer("slow", [tensor], parameters={"sleep": str(sleep)}).as_numpy("y").tolist())
    except InferenceServerException as exc:
        outcomes.append(exc)
    finally:
        client.close()


def _call_grpc(address: str, outcomes: list[Any]) -> None:
    client = triton_grpc.InferenceServerClient(address)
    tensor = triton_grpc.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.ones(2, np.float32))
    try:
        outcomes.append(client.infer("slow", [tensor], parameters={"sleep": "1.0"}).as_numpy("y").tolist())
    except InferenceServerException as exc:
        outcomes.append(exc)
    finally:
        client.close()


APP = textwrap.dedent(
    """
    import time
    import numpy as np
    from pyserve import ModelConfig, Serve, ServeConfig, Tensor

    def slow(requests):
        time.sleep(1.0)
        return [{"y": r["x"]} for r in requests]

    server = Serve(ServeConfig())
    server.bind("slow", slow, [Tensor("x", np.float32, (-1,))], [Tensor("y", np.float32, (-1,))],
                config=ModelConfig(max_batch_size=0, instances=4))
    """
)


def test_sigterm_lets_the_requests_in_flight_finish(tmp_path: Path) -> None:
    # The case: four requests in flight on a 1 s model when `pyserve serve` gets SIGTERM.
    (tmp_path / "slow_app.py").write_text(APP)
    with RunningCommand(pyserve_command("serve", "slow_app:server", *FREE_PORTS), tmp_path) as command:
        http_port = int(command.wait_for(SERVING_LINE).group(1))
        outcomes: list[Any] = []
        callers = [threading.Thread(target=_call_http, args=(f"127.0.0.1:{http_port}", outcomes)) for _ in range(4)]
        for caller in callers:
            caller.start()
        time.sleep(0.4)
        command.terminate()
        for caller in callers:
            caller.join(30)
        assert command.finish() == 0, command.output
    assert outcomes == [[1.0, 1.0]] * 4, outcomes


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_stop_drains_http_and_grpc_and_refuses_new_requests(worker: str) -> None:
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    server.bind("slow", slow, X, Y, config=ModelConfig(max_batch_size=0, instances=2, worker=worker))
    server.run()
    address = server.url.removeprefix("http://")
    outcomes: list[Any] = []
    callers = [
        threading.Thread(target=_call_http, args=(address, outcomes)),
        threading.Thread(target=_call_grpc, args=(server.grpc_address, outcomes)),
    ]
    for caller in callers:
        caller.start()
    time.sleep(0.4)
    # A keep-alive connection opened before the stop: a request on it while draining is refused, not queued.
    late = triton_http.InferenceServerClient(address)
    assert late.is_server_ready()
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    time.sleep(0.2)
    assert not late.is_server_ready()  # draining: not ready, so a load balancer stops sending
    refused: list[Any] = []
    _call_http_on(late, refused)
    late.close()
    stopper.join(30)
    for caller in callers:
        caller.join(30)
    assert outcomes == [[1.0, 1.0]] * 2, outcomes
    assert len(refused) == 1 and isinstance(refused[0], InferenceServerException)
    assert "shutting down" in str(refused[0]) and refused[0].status() in ("503", "StatusCode.UNAVAILABLE")


def _call_http_on(client: triton_http.InferenceServerClient, outcomes: list[Any]) -> None:
    tensor = triton_http.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.ones(2, np.float32))
    try:
        outcomes.append(client.infer("slow", [tensor], parameters={"sleep": "0"}).as_numpy("y").tolist())
    except InferenceServerException as exc:
        outcomes.append(exc)


def test_exit_timeout_bounds_the_drain() -> None:
    # A process instance: a thread stuck in a function cannot be ended, and stop() waits for it (up to 5 s).
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=0.5))
    server.bind("slow", slow, X, Y, config=ModelConfig(max_batch_size=0, worker="process"))
    server.run()
    outcomes: list[Any] = []
    caller = threading.Thread(target=_call_http, args=(server.url.removeprefix("http://"), outcomes, 5.0))
    caller.start()
    time.sleep(0.3)
    started = time.monotonic()
    server.stop()
    stopped_in = time.monotonic() - started
    caller.join(30)
    assert stopped_in < 4.0  # the 5 s request was not waited for
    assert len(outcomes) == 1 and isinstance(outcomes[0], InferenceServerException)
    assert "shutting down" in str(outcomes[0])


def test_nothing_in_flight_stops_at_once() -> None:
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    server.bind("slow", slow, X, Y, config=ModelConfig(max_batch_size=0))
    with server, ModelClient(server.url, "slow") as client:
        assert client.infer_sample(x=np.ones(1, np.float32), parameters={"sleep": "0"})["y"].tolist() == [1.0]
    started = time.monotonic()
    server.stop()  # idempotent, and quick with nothing to drain
    assert time.monotonic() - started < 1.0
