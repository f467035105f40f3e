"""pyserve.client with ``shared_memory`` on, against a server on this host: tensors placed in the client's regions
round trip over HTTP and gRPC (64 MiB too), outputs without a size travel as usual, regions are reused and cleaned
up (no /dev/shm object left, the server's status empty), a restricted server, a server reached by an address of
this host, and what a client that gave up on a call, was never closed or outlived its server leaves behind.
"""

from __future__ import annotations

import gc
import glob
import logging
import os
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import orjson
import pytest

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.client import (
    AsyncioDecoupledModelClient,
    ClientTimeoutError,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from pyserve.client.shared_memory import KEY_PREFIX, MIN_SHARED_BYTES
from pyserve.errors import ConfigError, InvalidInputError, PermissionDeniedError
from pyserve.transport.shm import SHM_DIR

from .conftest import add_sub, fp32, identity, sleep_then_identity, times_ten
from .repository_models import FREE_PORTS
from .test_client import CALL_TIMEOUT_S, KINDS, PROTOCOLS, Driver, url_of

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="system shared memory lives in /dev/shm"),
]

ROW = 1 << 15  # FP32 elements of one row of the fixed-size models: 128 KiB
LARGE = 16 << 20  # FP32 elements of 64 MiB
SECRET = {"http": {"admin-key": "s3cret"}, "grpc": {"triton-grpc-protocol-admin-key": "s3cret"}}
both = pytest.mark.parametrize("protocol", PROTOCOLS)


def mixed(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """A variable output, a fixed one and a BYTES one."""
    return [
        {
            "DOUBLED": request["INPUT0"] * 2,
            "SUM": request["INPUT0"].sum(axis=1, keepdims=True, dtype=np.float64),
            "TEXT": np.char.upper(request["TEXT"].astype(bytes)).astype(object),
        }
        for request in requests
    ]


def bind_models(server: Serve) -> None:
    server.bind(
        "large",
        identity,
        inputs=[fp32("INPUT0", (LARGE,))],
        outputs=[fp32("OUTPUT0", (LARGE,))],
        config=ModelConfig(max_batch_size=1),
    )
    server.bind(
        "add_sub",
        add_sub,
        inputs=[fp32("INPUT0", (ROW,)), fp32("INPUT1", (ROW,))],
        outputs=[fp32("OUTPUT0", (ROW,)), fp32("OUTPUT1", (ROW,))],
        config=ModelConfig(max_batch_size=8),
    )
    server.bind(
        "mixed",
        mixed,
        inputs=[fp32("INPUT0"), Tensor("TEXT", bytes, (1,))],
        outputs=[fp32("DOUBLED"), Tensor("SUM", np.float64, (1,)), Tensor("TEXT", bytes, (1,))],
        config=ModelConfig(max_batch_size=8),
    )
    server.bind(
        "grid",
        times_ten,
        inputs=[Tensor("INPUT0", np.int32, (256, 256))],
        outputs=[Tensor("OUTPUT0", np.int32, (256, 256))],
        config=ModelConfig(max_batch_size=0),
    )
    server.bind(
        "slow",
        sleep_then_identity,
        inputs=[fp32("INPUT0", (ROW,))],
        outputs=[fp32("OUTPUT0", (ROW,))],
        config=ModelConfig(max_batch_size=8, instances=2),
    )
    # Declares 4 elements a row and returns the whole input (not strict, so without regions it passes).
    server.bind("undersized", identity, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0", (4,))])
    server.bind("small", identity, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0")])


def serve(**config: Any) -> Serve:
    server = Serve(ServeConfig(**FREE_PORTS, **config))
    bind_models(server)
    server.run()
    return server


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    with serve() as running:
        yield running


@pytest.fixture(autouse=True)
def nothing_left(server: Serve) -> Iterator[None]:
    """Every test starts and ends without a client object in /dev/shm or a region on the shared server."""
    assert objects() == []
    yield
    assert objects() == []
    assert registered(server) == []


def objects() -> list[str]:
    """This process's client objects in /dev/shm."""
    return sorted(glob.glob(os.path.join(SHM_DIR, f"{KEY_PREFIX}-{os.getpid()}-*")))


def registered(server: Serve, headers: dict[str, str] | None = None) -> list[str]:
    """The names of the server's system shared-memory regions (its HTTP status endpoint)."""
    status = urllib.request.Request(f"{server.url}/v2/systemsharedmemory/status", headers=headers or {})
    with urllib.request.urlopen(status, timeout=10) as response:
        return sorted(region["name"] for region in orjson.loads(response.read()))


def unregister(server: Serve, name: str) -> None:
    path = f"{server.url}/v2/systemsharedmemory/region/{name}/unregister"
    with urllib.request.urlopen(urllib.request.Request(path, method="POST"), timeout=10):
        pass


@pytest.fixture
def drivers() -> Iterator[Callable[..., Driver]]:
    """``drivers(kind, url, model, **options)``: a client with shared_memory=True, closed after the test."""
    made: list[Driver] = []

    def make(kind: str, url: str, model: str, **options: Any) -> Driver:
        options.setdefault("init_timeout_s", CALL_TIMEOUT_S)
        options.setdefault("shared_memory", True)
        made.append(Driver(kind, url, model, **options))
        return made[-1]

    yield make
    for driver in made:
        if driver.loop is None or not driver.loop.is_closed():  # not closed by the test already
            driver.close()


def rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, ROW)).astype(np.float32)


@pytest.mark.parametrize(("kind", "protocol"), [(k, p) for k in KINDS for p in PROTOCOLS])
def test_a_batch_round_trips_through_one_region(
    server: Serve, drivers: Callable[..., Driver], kind: str, protocol: str
) -> None:
    client = drivers(kind, url_of(server, protocol), "add_sub")
    a, b = rows(3, seed=1), rows(3, seed=2)
    for first, second in ((a, b), (b, a)):
        out = client.call("infer_batch", first, second)
        np.testing.assert_array_equal(out["OUTPUT0"], first + second)
        np.testing.assert_array_equal(out["OUTPUT1"], first - second)
    assert len(objects()) == 1  # two calls of one size: one region
    sample = client.call("infer_sample", INPUT0=a[0], INPUT1=b[0])
    np.testing.assert_array_equal(sample["OUTPUT1"], a[0] - b[0])
    assert len(objects()) == 2  # a third of the bytes: a region of another size class
    assert registered(server) == [os.path.basename(path) for path in objects()]
    client.close()
    assert objects() == []
    assert registered(server) == []


@both
def test_64_mib_in_and_out(server: Serve, protocol: str) -> None:
    data = np.random.default_rng(3).standard_normal(LARGE).astype(np.float32)
    with ModelClient(url_of(server, protocol), "large", shared_memory=True, init_timeout_s=CALL_TIMEOUT_S) as client:
        for _ in range(2):
            out = client.infer_sample(data)["OUTPUT0"]
            np.testing.assert_array_equal(out, data)
        (path,) = objects()
        assert os.path.getsize(path) >= 2 * data.nbytes
        assert out.flags.writeable  # a copy: the region is the next call's
    assert objects() == []


@both
def test_outputs_without_a_size_and_bytes_travel_as_usual(server: Serve, protocol: str) -> None:
    data = rows(2)
    text = np.array([[b"one"], [b"two"]], dtype=object)
    with ModelClient(url_of(server, protocol), "mixed", shared_memory=True) as client:
        out = client.infer_batch(INPUT0=data, TEXT=text)
        assert len(objects()) == 1
    np.testing.assert_array_equal(out["DOUBLED"], data * 2)
    np.testing.assert_allclose(out["SUM"], data.sum(axis=1, keepdims=True, dtype=np.float64))
    assert out["TEXT"].tolist() == [[b"ONE"], [b"TWO"]]


@both
def test_a_model_without_batching(server: Serve, protocol: str) -> None:
    grid = np.arange(256 * 256, dtype=np.int32).reshape(256, 256)
    with ModelClient(url_of(server, protocol), "grid", shared_memory="auto") as client:
        np.testing.assert_array_equal(client.infer_sample(grid)["OUTPUT0"], grid * 10)
        assert len(objects()) == 1


@both
def test_calls_at_once_each_lease_their_own_region_and_sizes_get_theirs(server: Serve, protocol: str) -> None:
    url = url_of(server, protocol)
    with FuturesModelClient(url, "add_sub", max_workers=4, shared_memory=True) as client:
        batches = [(rows(2, seed), rows(2, seed + 100)) for seed in range(16)]
        futures: list[Future[Any]] = [client.infer_batch(a, b) for a, b in batches]
        for (a, b), future in zip(batches, futures, strict=True):
            np.testing.assert_array_equal(future.result(CALL_TIMEOUT_S)["OUTPUT0"], a + b)
        assert 1 <= len(objects()) <= 4
        before = set(objects())
        client.infer_batch(*(rows(8), rows(8))).result(CALL_TIMEOUT_S)  # four times the bytes: another class
        assert len(set(objects()) - before) == 1


@both
def test_a_small_request_travels_as_usual(server: Serve, protocol: str) -> None:
    data = np.ones(MIN_SHARED_BYTES // 16, np.float32)
    with ModelClient(url_of(server, protocol), "small", shared_memory=True) as client:
        np.testing.assert_array_equal(client.infer_sample(data)["OUTPUT0"], data)
        assert objects() == []
        assert registered(server) == []


@both
def test_a_call_the_client_gave_up_on_does_not_lend_its_region_again(server: Serve, protocol: str) -> None:
    url = url_of(server, protocol)
    with ModelClient(url, "slow", shared_memory=True, inference_timeout_s=0.5) as client:
        with pytest.raises(ClientTimeoutError):
            client.infer_sample(rows(1)[0], parameters={"sleep_s": 1.5})
        # The server may still write into that region: the client unlinked it at once, and unregisters it on its
        # next call, which leases a region of its own.
        assert objects() == []
        (given_up,) = registered(server)
        data = rows(1, seed=9)[0]
        np.testing.assert_array_equal(client.infer_sample(data)["OUTPUT0"], data)
        (path,) = objects()
        assert registered(server) == [os.path.basename(path)] != [given_up]
        time.sleep(1.2)  # the first request ends and writes into the region nobody reads any more
        np.testing.assert_array_equal(client.infer_sample(data)["OUTPUT0"], data)


@both
def test_an_output_larger_than_declared_is_the_servers_error(server: Serve, protocol: str) -> None:
    data = rows(1)[0]
    with ModelClient(url_of(server, protocol), "undersized") as plain:
        np.testing.assert_array_equal(plain.infer_sample(data)["OUTPUT0"], data)
    with (
        ModelClient(url_of(server, protocol), "undersized", shared_memory=True) as client,
        pytest.raises(InvalidInputError, match=r"output 'OUTPUT0'.*should be at least"),
    ):
        client.infer_sample(data)


@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # its connection is left open too
def test_a_client_dropped_without_close_leaves_no_object(server: Serve) -> None:
    client = ModelClient(server.url, "add_sub", shared_memory=True)
    client.infer_batch(rows(1), rows(1))
    (name,) = registered(server)
    del client
    gc.collect()
    assert objects() == []
    unregister(server, name)  # only close() can unregister: the server keeps its mapping until then or it stops


def test_true_with_a_server_elsewhere_fails_before_any_call() -> None:
    client = ModelClient("203.0.113.7:8000", "m", shared_memory=True, init_timeout_s=60)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"not on this host.*shared_memory='auto'"):
        client.infer_sample(np.zeros(4, np.float32))
    assert time.monotonic() - started < 5
    client.close()


@pytest.mark.parametrize("cls", [DecoupledModelClient, AsyncioDecoupledModelClient])
def test_the_streaming_clients_take_no_shared_memory(cls: type[Any]) -> None:
    with pytest.raises(ConfigError, match="streams its responses: it takes no shared_memory"):
        cls("127.0.0.1:8000", "m", shared_memory=True)


# servers of their own ------------------------------------------------------------------------------------------


def own_address() -> str | None:
    """This host's address on its default route (no packet is sent), if it has one other than loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


@both
def test_a_server_reached_by_an_address_of_this_host(protocol: str) -> None:
    address = own_address()
    if address is None:
        pytest.skip("this host has no address besides loopback")
    with serve(host="0.0.0.0") as everywhere:
        port = everywhere.http_port if protocol == "http" else everywhere.grpc_port
        a, b = rows(2), rows(2, seed=5)
        with ModelClient(f"{protocol}://{address}:{port}", "add_sub", shared_memory=True) as client:
            np.testing.assert_array_equal(client.infer_batch(a, b)["OUTPUT1"], a - b)
            assert registered(everywhere) == [os.path.basename(path) for path in objects()] != []
        assert registered(everywhere) == []


@pytest.fixture(scope="module")
def restricted() -> Iterator[Serve]:
    with serve(restricted_api="shared-memory:admin-key=s3cret") as running:
        yield running


@both
def test_a_restricted_server_needs_the_header(
    restricted: Serve, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = url_of(restricted, protocol)
    a, b = rows(2), rows(2, seed=5)
    with (
        ModelClient(url, "add_sub", shared_memory=True) as insisting,
        pytest.raises(PermissionDeniedError, match=r"expecting header '(triton-grpc-protocol-)?admin-key'"),
    ):
        insisting.infer_batch(a, b)
    with (
        caplog.at_level(logging.WARNING, logger="pyserve.client"),
        ModelClient(url, "add_sub", shared_memory="auto") as auto,
    ):
        for _ in range(2):
            np.testing.assert_array_equal(auto.infer_batch(a, b)["OUTPUT0"], a + b)
    header = "admin-key" if protocol == "http" else "triton-grpc-protocol-admin-key"
    assert [record.getMessage() for record in caplog.records].count(
        f"{auto.url} refused a shared-memory region (This API is restricted, expecting header '{header}'): "
        "tensors travel over the connection from now on"
    ) == 1
    with ModelClient(url, "add_sub", shared_memory=True, headers=SECRET[protocol]) as allowed:
        np.testing.assert_array_equal(allowed.infer_batch(a, b)["OUTPUT0"], a + b)
        assert len(registered(restricted, SECRET["http"])) == 1
    assert registered(restricted, SECRET["http"]) == []


@both
def test_closing_after_the_server_went_away_still_removes_the_objects(protocol: str) -> None:
    with serve() as gone:
        client = ModelClient(url_of(gone, protocol), "add_sub", shared_memory=True)
        client.infer_batch(rows(1), rows(1))
        assert len(objects()) == 1
    started = time.monotonic()
    client.close()
    assert time.monotonic() - started < 3
    assert objects() == []
