"""pyserve.client against a real server: every client class over HTTP and gRPC.

``ModelClient``, ``FuturesModelClient`` and ``AsyncioModelClient`` run behind one blocking ``Driver`` so each test
covers the three alike. The streaming clients are in test_client_streaming.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from pyserve import DynamicBatcher, ModelConfig, QueuePolicy, Serve, ServeConfig
from pyserve.client import (
    AsyncioModelClient,
    ClientTimeoutError,
    FuturesModelClient,
    ModelClient,
    ServerUnreachableError,
)
from pyserve.errors import (
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    QueueFullError,
    RequestTimeoutError,
    UnsupportedError,
)

from .conftest import fp32, identity, sleep_then_identity
from .repository_models import FREE_PORTS, add_python_model

pytestmark = pytest.mark.integration

KINDS = ("blocking", "futures", "asyncio")
PROTOCOLS = ("http", "grpc")
CALL_TIMEOUT_S = 30.0


class Driver:
    """One client class behind a blocking interface: ``driver.call("infer_sample", x)`` runs the method of a
    ModelClient, a FuturesModelClient (waiting for the future) or an AsyncioModelClient (on the driver's loop)."""

    def __init__(self, kind: str, url: str, model: str, **options: Any) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop() if kind == "asyncio" else None
        classes = {"blocking": ModelClient, "futures": FuturesModelClient, "asyncio": AsyncioModelClient}
        self.client: Any = classes[kind](url, model, **options)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        attribute = getattr(self.client, method)
        if self.kind == "blocking" and method == "model_config":
            return attribute
        if self.loop is not None:
            awaitable = attribute if method == "model_config" else attribute(*args, **kwargs)
            return self.loop.run_until_complete(awaitable)
        result = attribute(*args, **kwargs)
        return result.result(timeout=CALL_TIMEOUT_S) if self.kind == "futures" else result

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.client.close())
            self.loop.close()
        else:
            self.client.close()


def url_of(server: Serve, protocol: str) -> str:
    return server.url if protocol == "http" else f"grpc://{server.grpc_address}"


MakeDriver = Callable[..., Driver]


@pytest.fixture
def make_driver() -> Iterator[MakeDriver]:
    """``make_driver(kind, url, model, **options)``; every driver made is closed after the test."""
    drivers: list[Driver] = []

    def make(kind: str, url: str, model: str, **options: Any) -> Driver:
        options.setdefault("init_timeout_s", CALL_TIMEOUT_S)
        drivers.append(Driver(kind, url, model, **options))
        return drivers[-1]

    yield make
    for driver in drivers:
        driver.close()


both = pytest.mark.parametrize("protocol", PROTOCOLS)
every = pytest.mark.parametrize(("kind", "protocol"), [(k, p) for k in KINDS for p in PROTOCOLS])


# a server of the models only these tests use -----------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def bounded_queue_config() -> ModelConfig:
    """One instance, one row per batch, two priority levels, one request waiting at most, a request may set its
    queue timeout."""
    policy = QueuePolicy(allow_timeout_override=True, max_queue_size=1)
    batcher = DynamicBatcher(priority_levels=2, default_priority_level=2, default_queue_policy=policy)
    return ModelConfig(max_batch_size=1, batcher=batcher)


@pytest.fixture(scope="module")
def queue_server() -> Iterator[Serve]:
    with Serve(ServeConfig(**FREE_PORTS)) as server:
        server.bind("bounded", sleep_then_identity, [fp32("INPUT0")], [fp32("OUTPUT0")], bounded_queue_config())
        yield server


# round trips -------------------------------------------------------------------------------------------------


@every
def test_infer_sample_and_batch_by_position_and_by_name(
    server: Serve, make_driver: MakeDriver, kind: str, protocol: str
) -> None:
    driver = make_driver(kind, url_of(server, protocol), "add_sub")
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    # Positional inputs follow the model's declared order: OUTPUT1 = INPUT0 - INPUT1 tells them apart.
    out = driver.call("infer_sample", a, b)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    out = driver.call("infer_sample", INPUT1=a, INPUT0=b)
    np.testing.assert_array_equal(out["OUTPUT1"], b - a)
    out = driver.call("infer_batch", np.stack([a, b]), np.stack([b, a]))
    assert out["OUTPUT0"].shape == (2, 4)
    np.testing.assert_array_equal(out["OUTPUT1"], [a - b, b - a])
    out = make_driver(kind, url_of(server, protocol), "add_sub", model_version=1).call("infer_sample", a, b)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    config = driver.call("model_config")
    assert config.max_batch_size == 64 and config.batching and not config.decoupled
    assert [t.name for t in config.inputs] == ["INPUT0", "INPUT1"] and config.inputs[0].datatype == "FP32"


@every
def test_multiple_outputs_and_bytes(server: Serve, make_driver: MakeDriver, kind: str, protocol: str) -> None:
    url = url_of(server, protocol)
    out = make_driver(kind, url, "multi").call("infer_sample", np.array([1, 2], np.float32))
    assert sorted(out) == ["NEGATED", "PLUS_ONE", "TEXT", "TIMES_TWO"]
    np.testing.assert_array_equal(out["TIMES_TWO"], [2, 4])
    assert out["TEXT"].dtype == object and out["TEXT"].tolist() == [b"sum=3"]
    words = np.array([b"caf\xc3\xa9", b"", b"\x00\xffraw"], dtype=object)
    echoed = make_driver(kind, url, "identity_bytes").call("infer_batch", words[np.newaxis])["OUTPUT0"]
    assert echoed.shape == (1, 3) and echoed.tolist() == [list(words)]


@every
def test_a_model_without_batching_takes_its_tensors_as_they_are(
    server: Serve, make_driver: MakeDriver, kind: str, protocol: str
) -> None:
    driver = make_driver(kind, url_of(server, protocol), "no_batch")
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(driver.call("infer_sample", x)["OUTPUT0"], x * 10)
    with pytest.raises(UnsupportedError, match="does not batch"):
        driver.call("infer_batch", x)


@every
def test_parameters_reach_the_model(server: Serve, make_driver: MakeDriver, kind: str, protocol: str) -> None:
    driver = make_driver(kind, url_of(server, protocol), "echo_parameters")
    parameters = {"text": "hi", "count": 3, "ratio": 0.5, "flag": True}
    out = driver.call("infer_sample", np.ones(2, np.float32), parameters=parameters)
    assert orjson.loads(out["PARAMETERS"].reshape(-1)[0]) == parameters


@both
def test_priority_and_timeout_reach_the_scheduler(queue_server: Serve, make_driver: MakeDriver, protocol: str) -> None:
    url = url_of(queue_server, protocol)
    driver = make_driver("futures", url, "bounded")
    x = np.ones(1, np.float32)
    # The model has two priority levels: only the scheduler reading the value as an integer can refuse it so.
    with pytest.raises(InvalidInputError, match="priority 5 is out of range"):
        driver.call("infer_sample", x, parameters={"priority": 5})
    busy = driver.client.infer_sample(x, parameters={"sleep_s": 0.5})
    time.sleep(0.1)  # it runs on the one instance; the next one waits in the queue past its 1 ms timeout
    with pytest.raises(RequestTimeoutError, match="timeout") as info:
        driver.call("infer_sample", x, parameters={"timeout": 1000})
    assert not isinstance(info.value, ClientTimeoutError)  # the server's timeout, not the client's
    busy.result(timeout=CALL_TIMEOUT_S)


@both
def test_a_full_queue_is_a_queue_full_error(queue_server: Serve, make_driver: MakeDriver, protocol: str) -> None:
    driver = make_driver("futures", url_of(queue_server, protocol), "bounded")
    x = np.ones(1, np.float32)
    running = driver.client.infer_sample(x, parameters={"sleep_s": 0.4})
    time.sleep(0.1)
    waiting = driver.client.infer_sample(x)
    time.sleep(0.1)
    with pytest.raises(QueueFullError, match="maximum queue size 1"):
        driver.call("infer_sample", x)
    running.result(timeout=CALL_TIMEOUT_S)
    waiting.result(timeout=CALL_TIMEOUT_S)


# errors ------------------------------------------------------------------------------------------------------


@every
def test_server_errors_come_back_as_pyserve_errors(
    server: Serve, make_driver: MakeDriver, kind: str, protocol: str
) -> None:
    url = url_of(server, protocol)
    with pytest.raises(ModelNotFoundError, match="no_such_model"):
        make_driver(kind, url, "no_such_model").call("infer_sample", np.ones(2, np.float32))
    with pytest.raises(ModelNotFoundError):
        make_driver(kind, url, "add_sub", model_version=7).call("infer_sample", np.ones(2, np.float32))
    add_sub = make_driver(kind, url, "add_sub")
    with pytest.raises(InvalidInputError, match=r"INPUT0.*(FP32.*INT64|INT64.*FP32)"):
        add_sub.call("infer_sample", np.ones(2, np.int64), np.ones(2, np.float32))
    with pytest.raises(InvalidInputError, match="by position or by name"):
        add_sub.call("infer_sample", np.ones(2, np.float32), INPUT1=np.ones(2, np.float32))
    raises = make_driver(kind, url, "raises")
    with pytest.raises(ModelExecutionError, match="ValueError: negative input seen: -2"):
        raises.call("infer_sample", np.array([1, -2], np.float32))
    with pytest.raises(UnsupportedError, match="DecoupledModelClient"):
        make_driver(kind, url, "decoupled").call("infer_sample", np.ones(2, np.float32))


@both
def test_an_unknown_model_fails_at_construction_without_lazy_init(server: Serve, protocol: str) -> None:
    with pytest.raises(ModelNotFoundError):
        ModelClient(url_of(server, protocol), "no_such_model", lazy_init=False, init_timeout_s=5)


# timeouts and waiting ----------------------------------------------------------------------------------------


@every
def test_an_inference_past_its_timeout_raises_within_the_bound(
    server: Serve, make_driver: MakeDriver, kind: str, protocol: str
) -> None:
    driver = make_driver(kind, url_of(server, protocol), "slow", inference_timeout_s=0.2)
    driver.call("model_config")
    started = time.monotonic()
    with pytest.raises(ClientTimeoutError, match=r"infer on model 'slow'.*0\.2 s"):
        driver.call("infer_sample", np.ones(1, np.float32), parameters={"sleep_s": 0.6})
    assert 0.2 <= time.monotonic() - started < 0.55


@every
def test_waiting_for_server_and_model(server: Serve, make_driver: MakeDriver, kind: str, protocol: str) -> None:
    url = url_of(server, protocol)
    driver = make_driver(kind, url, "add_sub")
    driver.call("wait_for_server", 5.0)
    driver.call("wait_for_model", 5.0)
    started = time.monotonic()
    with pytest.raises(ClientTimeoutError, match=r"model 'nope' was not ready within 0\.3 s"):
        make_driver(kind, url, "nope").call("wait_for_model", 0.3)
    assert time.monotonic() - started < 1.0


@every
def test_a_server_that_is_not_there(make_driver: MakeDriver, kind: str, protocol: str) -> None:
    (port,) = free_ports(1)
    url = f"{protocol}://127.0.0.1:{port}"
    driver = make_driver(kind, url, "add_sub", init_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(ClientTimeoutError, match=rf"127\.0\.0\.1:{port}.*not ready within 0\.3 s") as info:
        driver.call("wait_for_server", 0.3)
    assert "refused" in str(info.value).lower()
    with pytest.raises(ClientTimeoutError, match=r"not ready within 0\.3 s"):
        driver.call("infer_sample", np.ones(2, np.float32))  # the first call waits init_timeout_s for the server
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("kind", ("blocking", "asyncio"))
def test_a_connection_that_cannot_open_times_out(make_driver: MakeDriver, kind: str) -> None:
    # A listener that never accepts, its backlog full: the kernel drops further connection attempts.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        # listen(0) queues one connection: it fills the backlog.
        fillers = [socket.create_connection(("127.0.0.1", port), timeout=1)]
        try:
            driver = make_driver(kind, f"http://127.0.0.1:{port}", "add_sub", connect_timeout_s=0.2)
            started = time.monotonic()
            with pytest.raises(ClientTimeoutError, match=rf"connecting to http://127\.0\.0\.1:{port}.*0\.2 s"):
                driver.call("load_model")
            assert time.monotonic() - started < 1.0
        finally:
            for filler in fillers:
                filler.close()


# a server restarted between calls ------------------------------------------------------------------------------


def start_server(http_port: int, grpc_port: int) -> Serve:
    server = Serve(ServeConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=0))
    server.bind("identity", identity, [fp32("INPUT0")], [fp32("OUTPUT0")], ModelConfig(max_batch_size=8))
    return server.run()


def test_clients_reach_a_restarted_server_again(make_driver: MakeDriver) -> None:
    http_port, grpc_port = free_ports(2)
    server = start_server(http_port, grpc_port)
    addresses = {"http": f"http://127.0.0.1:{http_port}", "grpc": f"grpc://127.0.0.1:{grpc_port}"}
    x = np.arange(3, dtype=np.float32)
    try:
        drivers = [make_driver(kind, addresses[protocol], "identity") for kind in KINDS for protocol in PROTOCOLS]
        for driver in drivers:
            np.testing.assert_array_equal(driver.call("infer_sample", x)["OUTPUT0"], x)
        server.stop()
        for driver, protocol in zip(drivers, PROTOCOLS * len(KINDS), strict=True):
            with pytest.raises(ServerUnreachableError, match=re.escape(addresses[protocol])):
                driver.call("infer_sample", x)
        server = start_server(http_port, grpc_port)
        for driver in drivers:
            np.testing.assert_array_equal(driver.call("infer_sample", x + 1)["OUTPUT0"], x + 1)
    finally:
        server.stop()


# the model repository ----------------------------------------------------------------------------------------


def test_load_and_unload_models(tmp_path: Path, make_driver: MakeDriver) -> None:
    add_python_model(tmp_path, "plus", offset=1.0)
    config = ServeConfig(**FREE_PORTS, model_control_mode="explicit")
    x = np.arange(3, dtype=np.float32)
    with Serve(config, model_repository=tmp_path) as server:
        for kind, protocol in (("blocking", "http"), ("asyncio", "grpc"), ("futures", "http")):
            driver = make_driver(kind, url_of(server, protocol), "plus")
            with pytest.raises(ModelNotFoundError):
                driver.call("infer_sample", x)
            driver.call("load_model")
            np.testing.assert_array_equal(driver.call("infer_sample", x)["OUTPUT0"], x + 1)
            driver.call("unload_model")
            with pytest.raises(ModelNotFoundError):
                driver.call("infer_sample", x)
