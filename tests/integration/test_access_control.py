"""Access control with real servers and Triton's clients: restricted endpoint groups over HTTP and gRPC (tritonserver's
``--http-restricted-api`` / ``--grpc-restricted-protocol``), the value kept out of the logs, and the 503 /
UNAVAILABLE of a full queue or a draining server with ``Retry-After``. docs/security.md describes what is tested."""

from __future__ import annotations

import contextlib
import http.client
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import DynamicBatcher, ModelConfig, QueuePolicy, Request, Serve, ServeConfig, Tensor
from pyserve.frontends.protocol import health_pb2

pytestmark = pytest.mark.integration

# Three groups of endpoints, each with its own header, on both protocols.
PUBLIC, INFER, ADMIN = ("pub-key", "p-7f3a"), ("infer-key", "i-91c2"), ("admin-key", "a-5e08")
RESTRICTIONS = (
    f"health,metadata:{PUBLIC[0]}={PUBLIC[1]}",
    f"inference:{INFER[0]}={INFER[1]}",
    f"shared-memory,model-config,model-repository,statistics,trace,logging:{ADMIN[0]}={ADMIN[1]}",
)
GRPC_PREFIX = "triton-grpc-protocol-"


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def fp32(name: str) -> Tensor:
    return Tensor(name, np.float32, (-1,))


def identity_server(**settings: Any) -> Serve:
    serve = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, **settings))
    serve.bind("identity", identity, [fp32("INPUT0")], [fp32("OUTPUT0")], ModelConfig(max_batch_size=8))
    return serve


@pytest.fixture(scope="module")
def locked() -> Iterator[Serve]:
    """Every group restricted, on both protocols."""
    with identity_server(http_restricted_api=RESTRICTIONS, grpc_restricted_protocol=RESTRICTIONS) as serve:
        yield serve


def http_header(key_value: tuple[str, str]) -> dict[str, str]:
    return {key_value[0]: key_value[1]}


def grpc_header(key_value: tuple[str, str]) -> dict[str, str]:
    return {GRPC_PREFIX + key_value[0]: key_value[1]}


def http_input(module: Any) -> Any:
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return tensor


# Each call of a restricted group, with the header it needs; the same names on both clients.
CALLS: list[tuple[str, tuple[str, str], Callable[[Any, Any, dict[str, str]], Any]]] = [
    ("metadata", PUBLIC, lambda c, m, h: c.get_server_metadata(headers=h)),
    ("metadata", PUBLIC, lambda c, m, h: c.get_model_metadata("identity", headers=h)),
    ("model-config", ADMIN, lambda c, m, h: c.get_model_config("identity", headers=h)),
    ("inference", INFER, lambda c, m, h: c.infer("identity", [http_input(m)], headers=h)),
    ("statistics", ADMIN, lambda c, m, h: c.get_inference_statistics("identity", headers=h)),
    ("trace", ADMIN, lambda c, m, h: c.get_trace_settings(headers=h)),
    ("logging", ADMIN, lambda c, m, h: c.get_log_settings(headers=h)),
    ("model-repository", ADMIN, lambda c, m, h: c.get_model_repository_index(headers=h)),
    ("shared-memory", ADMIN, lambda c, m, h: c.get_system_shared_memory_status(headers=h)),
    ("shared-memory", ADMIN, lambda c, m, h: c.get_cuda_shared_memory_status(headers=h)),
]


@pytest.mark.parametrize(("group", "needed", "call"), CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CALLS)])
def test_each_http_group_wants_its_header(
    locked: Serve, group: str, needed: tuple[str, str], call: Callable[[Any, Any, dict[str, str]], Any]
) -> None:
    with triton_http.InferenceServerClient(f"127.0.0.1:{locked.http_port}") as client:
        others = [other for other in (PUBLIC, INFER, ADMIN) if other != needed]
        for headers in ({}, {needed[0]: "wrong"}, {needed[0]: needed[1][:-1]}, *map(http_header, others)):
            with pytest.raises(InferenceServerException) as info:
                call(client, triton_http, headers)
            assert info.value.status() == "403", (group, headers)
            assert info.value.message() == f"This API is restricted, expecting header '{needed[0]}'"
        call(client, triton_http, {**http_header(needed), "other": "x"})
        call(client, triton_http, {needed[0].upper(): needed[1]})  # header names are case-insensitive


@pytest.mark.parametrize(("group", "needed", "call"), CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CALLS)])
def test_each_grpc_group_wants_its_metadata(
    locked: Serve, group: str, needed: tuple[str, str], call: Callable[[Any, Any, dict[str, str]], Any]
) -> None:
    with triton_grpc.InferenceServerClient(f"127.0.0.1:{locked.grpc_port}") as client:
        # The key as tritonserver takes it: the HTTP name alone is not enough over gRPC.
        for headers in ({}, {GRPC_PREFIX + needed[0]: "wrong"}, http_header(needed)):
            with pytest.raises(InferenceServerException) as info:
                call(client, triton_grpc, headers)
            assert info.value.status() == "StatusCode.PERMISSION_DENIED", (group, headers)
            assert f"expecting header '{GRPC_PREFIX}{needed[0]}'" in str(info.value.message())
        call(client, triton_grpc, grpc_header(needed))


def test_health_is_a_group_too(locked: Serve) -> None:
    with triton_http.InferenceServerClient(f"127.0.0.1:{locked.http_port}") as client:
        # tritonclient reads any status but 200 as "not live": the 403 itself is checked below.
        assert not client.is_server_live() and not client.is_model_ready("identity")
        assert client.is_server_ready(headers=http_header(PUBLIC))
        assert client.is_model_ready("identity", headers=http_header(PUBLIC))
    connection = http.client.HTTPConnection("127.0.0.1", locked.http_port, timeout=10)
    connection.request("GET", "/v2/health/live")
    assert connection.getresponse().status == 403
    connection.close()
    with triton_grpc.InferenceServerClient(f"127.0.0.1:{locked.grpc_port}") as client:
        for call in (client.is_server_live, client.is_server_ready, lambda **h: client.is_model_ready("identity", **h)):
            with pytest.raises(InferenceServerException, match="PERMISSION_DENIED"):
                call()
            assert call(headers=grpc_header(PUBLIC))
    # The standard health service is the health group's as well.
    with grpc.insecure_channel(f"127.0.0.1:{locked.grpc_port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            check(health_pb2.HealthCheckRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        metadata = tuple(grpc_header(PUBLIC).items())
        assert check(health_pb2.HealthCheckRequest(), metadata=metadata, timeout=10).status == 1  # SERVING


def first_stream_answer(port: int, headers: dict[str, str]) -> tuple[Any, Any]:
    """(result, error) of one request on a ModelStreamInfer stream opened with ``headers``."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with triton_grpc.InferenceServerClient(f"127.0.0.1:{port}") as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
        # A refused stream may end before this request goes: the client then raises, and its callback has the reason.
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("identity", [http_input(triton_grpc)])
        answer = answers.get(timeout=10)
        client.stop_stream()
    return answer


def test_a_stream_wants_the_inference_metadata_before_its_first_request(locked: Serve) -> None:
    result, error = first_stream_answer(locked.grpc_port, {})
    assert result is None and "expecting header 'triton-grpc-protocol-infer-key'" in str(error)
    result, error = first_stream_answer(locked.grpc_port, grpc_header(INFER))
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_groups_left_out_stay_open_and_the_protocols_are_apart() -> None:
    with identity_server(
        http_restricted_api=("inference:infer-key=i1",), grpc_restricted_protocol=("model-repository:k=v",)
    ) as serve:
        with triton_http.InferenceServerClient(f"127.0.0.1:{serve.http_port}") as client:
            assert client.is_server_live() and client.get_model_metadata("identity")["name"] == "identity"
            assert [model["name"] for model in client.get_model_repository_index()] == ["identity"]
            with pytest.raises(InferenceServerException, match="infer-key"):
                client.infer("identity", [http_input(triton_http)])
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{serve.grpc_port}") as grpc_client:
            grpc_client.infer("identity", [http_input(triton_grpc)])
            assert grpc_client.get_inference_statistics("identity").model_stats
            with pytest.raises(InferenceServerException, match="PERMISSION_DENIED"):
                grpc_client.get_model_repository_index()


def test_the_value_is_never_logged(capfd: pytest.CaptureFixture[str]) -> None:
    secret = "never-in-a-log-8d1e"
    restriction = (f"inference,statistics:admin-key={secret}",)
    with identity_server(
        http_restricted_api=restriction, grpc_restricted_protocol=restriction, log_level="DEBUG"
    ) as serve:
        assert serve._core is not None
        # Nor on the core's command line, which any local user can read (/proc/<pid>/cmdline).
        assert secret[:-1].encode() not in Path(f"/proc/{serve._core.pid}/cmdline").read_bytes()
        with triton_http.InferenceServerClient(f"127.0.0.1:{serve.http_port}") as client:
            for headers in ({}, {"admin-key": secret[:-1]}, {"admin-key": secret}):
                with contextlib.suppress(InferenceServerException):
                    client.infer("identity", [http_input(triton_http)], headers=headers)
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{serve.grpc_port}") as grpc_client:
            for headers in ({}, {"triton-grpc-protocol-admin-key": secret}):
                with contextlib.suppress(InferenceServerException):
                    grpc_client.get_inference_statistics(headers=headers)
    out, err = capfd.readouterr()
    assert "DEBUG" in err  # the core did log, at its most verbose
    assert secret[:-1] not in out + err


# Retry-After ---------------------------------------------------------------------------------------------------

gate = threading.Event()


def gated(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    gate.wait(10)
    return identity(requests)


def raw_infer(connection: http.client.HTTPConnection, model: str) -> http.client.HTTPResponse:
    body = b'{"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}'
    connection.request("POST", f"/v2/models/{model}/infer", body, {"content-type": "application/json"})
    response = connection.getresponse()
    response.read()
    return response


def ready(connection: http.client.HTTPConnection) -> int:
    connection.request("GET", "/v2/health/ready")
    response = connection.getresponse()
    response.read()
    return response.status


def test_a_full_queue_answers_503_with_retry_after_and_unavailable() -> None:
    gate.clear()
    bounded = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=1)))
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        serve.bind("bounded", gated, [fp32("INPUT0")], [fp32("OUTPUT0")], bounded)
        connections = [http.client.HTTPConnection("127.0.0.1", serve.http_port, timeout=30) for _ in range(3)]
        answers: list[int] = []
        callers = [
            threading.Thread(target=lambda c=c: answers.append(raw_infer(c, "bounded").status)) for c in connections[:2]
        ]
        try:
            callers[0].start()  # runs, held at the gate
            time.sleep(0.3)
            callers[1].start()  # queued: the queue is full
            time.sleep(0.3)
            refused = raw_infer(connections[2], "bounded")
            assert refused.status == 503 and refused.getheader("retry-after") == "1"
            with triton_grpc.InferenceServerClient(f"127.0.0.1:{serve.grpc_port}") as client:
                tensor = triton_grpc.InferInput("INPUT0", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
                with pytest.raises(InferenceServerException) as info:
                    client.infer("bounded", [tensor])
                assert info.value.status() == "StatusCode.UNAVAILABLE"
                assert "maximum queue size" in str(info.value.message())
        finally:
            gate.set()
            for caller in callers:
                caller.join(30)
            for connection in connections:
                connection.close()
        assert answers == [200, 200]


def test_a_draining_server_answers_503_with_retry_after() -> None:
    gate.clear()
    serve = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    serve.bind("gated", gated, [fp32("INPUT0")], [fp32("OUTPUT0")], ModelConfig(max_batch_size=1))
    serve.run()
    busy = http.client.HTTPConnection("127.0.0.1", serve.http_port, timeout=30)
    late = http.client.HTTPConnection("127.0.0.1", serve.http_port, timeout=30)  # kept alive across the stop
    answers: list[int] = []
    caller = threading.Thread(target=lambda: answers.append(raw_infer(busy, "gated").status))
    stopper = threading.Thread(target=serve.stop)
    try:
        assert ready(late) == 200
        caller.start()
        time.sleep(0.3)
        stopper.start()
        deadline = time.monotonic() + 10
        while ready(late) == 200 and time.monotonic() < deadline:  # draining once it says it is not ready
            time.sleep(0.05)
        refused = raw_infer(late, "gated")
        assert refused.status == 503 and refused.getheader("retry-after") == "1"
    finally:
        gate.set()
        caller.join(30)
        stopper.join(30)
        busy.close()
        late.close()
    assert answers == [200]
