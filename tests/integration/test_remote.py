"""Remote models: ``RemoteServe`` / ``RemoteTriton`` attach functions of another process to a running server over its
authenticated tcp port — served through HTTP and gRPC (tritonclient), tensors inline, BLS both ways, detached on
exit, dropped when the peer dies, and strangers refused."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import zmq
from tritonclient.utils import InferenceServerException

import pyserve
from pyserve import ModelConfig, RemoteServe, Request, Serve, ServeConfig, Tensor, batch
from pyserve.client import ModelClient
from pyserve.errors import ConfigError, ModelNotFoundError, ServerError
from pyserve.transport.curve import TOKEN_ENV, secure_client
from pyserve.transport.messages import pack_header, unpack_header
from pyserve.transport.protocol import BatchResult, ControlReply, Load, Shutdown, Unload

from .conftest import serve_in_thread

pytestmark = pytest.mark.integration

TOKEN = "test-remote-token-0123456789abcdef"
X = [Tensor("x", np.float32, (-1,))]
Y = [Tensor("y", np.float32, (-1,))]


@batch
def double(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x * 2}


@batch
def plus_local(x: np.ndarray) -> dict[str, np.ndarray]:
    # A remote model calling the server's local model (BLS over the tcp socket).
    return {"y": pyserve.infer("local_double", {"x": x})["y"] + 1}


def call_remote(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    # A local model calling the remote one.
    return [{"y": pyserve.infer("remote_double", {"x": r["x"][np.newaxis]})["y"][0] - 1} for r in requests]


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    config = ServeConfig(
        http_port=0, grpc_port=0, metrics_port=0, remote_port=0, remote_token=TOKEN, remote_peer_timeout_s=2
    )
    with Serve(config) as serve:
        serve.bind("local_double", double, X, Y, config=ModelConfig(max_batch_size=8))
        serve.bind("local_calls_remote", call_remote, X, Y, config=ModelConfig(max_batch_size=0))
        yield serve


def test_remote_model_is_served_over_http_and_grpc(server: Serve) -> None:
    with RemoteServe(server.url, token=TOKEN) as remote:
        remote.bind("remote_double", double, X, Y, config=ModelConfig(max_batch_size=8, instances=2))
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        tensor = triton_http.InferInput("x", [2, 3], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_array_equal(http.infer("remote_double", [tensor]).as_numpy("y"), x * 2)
        grpc = triton_grpc.InferenceServerClient(server.grpc_address)
        tensor = triton_grpc.InferInput("x", [2, 3], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_array_equal(grpc.infer("remote_double", [tensor]).as_numpy("y"), x * 2)
        assert http.is_model_ready("remote_double")
        http.close()
        grpc.close()


def test_large_tensors_travel_inline(server: Serve) -> None:
    # 4 MiB each way: far above the shared-memory threshold, which a remote instance never uses.
    x = np.random.default_rng(0).random((1, 1 << 20), dtype=np.float32)
    with RemoteServe(server.url, token=TOKEN) as remote:
        remote.bind("remote_double", double, X, Y, config=ModelConfig(max_batch_size=8))
        session = remote._session
        with ModelClient(server.url, "remote_double") as client:
            np.testing.assert_array_equal(client.infer_batch(x=x)["y"], x * 2)
        assert not [name for name in os.listdir("/dev/shm") if name.startswith(session)]


def test_bls_both_ways(server: Serve) -> None:
    with RemoteServe(f"tcp://{server.remote_address.removeprefix('tcp://')}", token=TOKEN) as remote:
        remote.bind("remote_double", double, X, Y, config=ModelConfig(max_batch_size=8))
        remote.bind("remote_plus_local", plus_local, X, Y, config=ModelConfig(max_batch_size=8))
        x = np.array([1.0, 2.0, 3.0], np.float32)
        with ModelClient(server.url, "remote_plus_local") as client:
            np.testing.assert_array_equal(client.infer_sample(x=x)["y"], x * 2 + 1)
        with ModelClient(server.url, "local_calls_remote") as client:
            np.testing.assert_array_equal(client.infer_sample(x=x)["y"], x * 2 - 1)


remote_started = threading.Event()
remote_saw_cancel = threading.Event()


def wait_for_cancel(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    remote_started.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(request.is_cancelled for request in requests):
        time.sleep(0.005)
    if all(request.is_cancelled for request in requests):
        remote_saw_cancel.set()
    return [{"y": request["x"]} for request in requests]


def test_a_running_remote_request_sees_its_client_go_away(server: Serve) -> None:
    # The cancel publisher is a socket on the server's host: a remote session hears cancellations on its own
    # socket on the remote port instead.
    with RemoteServe(server.url, token=TOKEN) as remote:
        remote.bind("remote_cancellable", wait_for_cancel, X, Y, config=ModelConfig(max_batch_size=4))
        body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}'
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as conn:
            conn.sendall(
                b"POST /v2/models/remote_cancellable/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                % len(body)
                + body
            )
            assert remote_started.wait(10)
        assert remote_saw_cancel.wait(5), "the remote function never saw Request.is_cancelled"


def slow_double(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    remote_started.set()
    time.sleep(float(requests[0].parameters.get("sleep", 0.5)))
    return [{"y": request["x"] * 2} for request in requests]


def _infer_in_threads(server: Serve, count: int, sleep: float) -> tuple[list[threading.Thread], list[Any]]:
    outcomes: list[Any] = []

    def call() -> None:
        try:
            with ModelClient(server.url, "remote_slow", inference_timeout_s=30) as client:
                outcomes.append(client.infer_sample(x=np.ones(2, np.float32), parameters={"sleep": sleep})["y"])
        except Exception as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=call) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, outcomes


def test_stop_lets_the_requests_in_flight_finish(server: Serve) -> None:
    # A graceful detach, as Triton unloads: no new requests, what was accepted finishes on the peer, then it goes.
    remote_started.clear()
    remote = RemoteServe(server.url, token=TOKEN)
    remote.bind("remote_slow", slow_double, X, Y, config=ModelConfig(max_batch_size=0, instances=2))
    remote.run()
    threads, outcomes = _infer_in_threads(server, 4, 0.5)
    assert remote_started.wait(10)
    time.sleep(0.1)  # all four accepted: two running, two queued
    remote.stop()
    for thread in threads:
        thread.join(30)
    assert len(outcomes) == 4 and all(isinstance(y, np.ndarray) for y in outcomes), outcomes
    assert all(y.tolist() == [2, 2] for y in outcomes)
    with pytest.raises(ModelNotFoundError), ModelClient(server.url, "remote_slow", init_timeout_s=2) as client:
        client.infer_sample(x=np.ones(2, np.float32))


def test_stop_waits_for_requests_in_flight_at_most_exit_timeout_s(server: Serve) -> None:
    remote_started.clear()
    config = ServeConfig(exit_timeout_s=0.5)
    remote = RemoteServe(server.url, token=TOKEN, config=config)
    remote.bind("remote_slow", slow_double, X, Y, config=ModelConfig(max_batch_size=0))
    remote.run()
    threads, outcomes = _infer_in_threads(server, 1, 3.0)
    assert remote_started.wait(10)
    started = time.monotonic()
    stopping = threading.Thread(target=remote.stop)  # returns once the thread running the 3 s call is done
    stopping.start()
    for thread in threads:
        thread.join(30)
    # The drain gave up after 0.5 s: the client has its answer well before the 3 s call ends.
    assert time.monotonic() - started < 2.5
    assert len(outcomes) == 1 and "unloaded" in str(outcomes[0]), outcomes
    stopping.join(30)
    assert not stopping.is_alive()


def test_serve_in_a_thread_and_stop_from_another(server: Serve) -> None:
    # PyTriton's pattern: serve() blocks in a thread, stop() comes from elsewhere; the monitor serve() polls is
    # closed only between its polls, and the two stop() calls (the caller's and serve()'s own) do not overlap.
    for _ in range(3):
        remote = RemoteServe(server.url, token=TOKEN)
        remote.bind("remote_double", double, X, Y, config=ModelConfig(max_batch_size=8))
        thread, errors = serve_in_thread(remote, 20)
        with ModelClient(server.url, "remote_double", init_timeout_s=10) as client:
            assert client.infer_sample(x=np.ones(1, np.float32))["y"].tolist() == [2]
        remote.stop()
        thread.join(20)
        assert not thread.is_alive() and not errors, errors


def test_stop_detaches_the_models(server: Serve) -> None:
    remote = RemoteServe(server.url, token=TOKEN)
    remote.bind("remote_double", double, X, Y, config=ModelConfig(max_batch_size=8))
    remote.run()
    with ModelClient(server.url, "remote_double") as client:
        assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [2, 2]
    remote.stop()
    with pytest.raises(ModelNotFoundError), ModelClient(server.url, "remote_double", init_timeout_s=2) as client:
        client.infer_sample(x=np.ones(2, np.float32))
    # The server's own models are untouched, and the name can be attached again.
    with ModelClient(server.url, "local_double") as client:
        assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [2, 2]
    with RemoteServe(server.url, token=TOKEN) as again:
        again.bind("remote_double", double, X, Y, config=ModelConfig(max_batch_size=8))


def test_model_bound_after_attach_loads_at_once(server: Serve) -> None:
    with RemoteServe(server.url, token=TOKEN) as remote:
        remote.bind("remote_late", double, X, Y, config=ModelConfig(max_batch_size=8))
        with ModelClient(server.url, "remote_late") as client:
            assert client.infer_sample(x=np.ones(1, np.float32))["y"].tolist() == [2]


def test_wrong_token_missing_token_and_closed_port(server: Serve) -> None:
    with pytest.raises(ServerError, match="remote token"):
        RemoteServe(server.url, token="not-the-servers-token-at-all", timeout_s=5).run()
    env = {key: value for key, value in os.environ.items() if key != TOKEN_ENV}
    saved = os.environ.copy()
    os.environ.clear()
    os.environ.update(env)
    try:
        with pytest.raises(ConfigError, match=TOKEN_ENV):
            RemoteServe(server.url)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    with pytest.raises(ConfigError, match="at least 16"):
        RemoteServe(server.url, token="short")
    with (
        Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as plain,
        pytest.raises(ServerError, match="does not accept remote models"),
    ):
        RemoteServe(plain.url, token=TOKEN).run()


def test_process_models_are_refused() -> None:
    with pytest.raises(ConfigError, match="thread instances"):
        RemoteServe("tcp://127.0.0.1:1", token=TOKEN).bind(
            "m", double, X, Y, config=ModelConfig(max_batch_size=8, worker="process")
        )


def test_the_token_is_not_on_the_core_command_line(server: Serve) -> None:
    assert server._core is not None
    command_line = Path(f"/proc/{server._core.pid}/cmdline").read_bytes()
    assert b"pyserve.core" in command_line
    assert TOKEN.encode() not in command_line


# peers that misbehave ------------------------------------------------------------------------------------------------


def _peer(server: Serve, routing_id: bytes) -> zmq.Socket[Any]:
    socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    secure_client(socket, TOKEN)
    socket.setsockopt(zmq.ROUTING_ID, routing_id)
    socket.connect(server.remote_address)
    return socket


def _reply(socket: zmq.Socket[Any]) -> ControlReply:
    assert socket.poll(5000), "no reply from the core"
    return ControlReply(unpack_header(socket.recv()))


def test_a_peer_may_not_ship_functions_or_stop_the_core(server: Serve) -> None:
    spec = pyserve.serve._spec("shipped", 1, X, Y, ModelConfig(max_batch_size=8, worker="process"))
    socket = _peer(server, b"evil-session/control")
    try:
        socket.send(pack_header(Load.build(spec, 7, payload=b"\x80\x04pickled")))
        reply = _reply(socket)
        assert reply.request_id == 7 and reply.error is not None and "may not ship functions" in reply.error
        socket.send(pack_header(Shutdown.build(8)))
        reply = _reply(socket)
        assert reply.request_id == 8 and reply.error is not None and "may not send 'shutdown'" in reply.error
        # Nor unload a model it did not attach (the server's own one here).
        socket.send(pack_header(Unload.build("local_double", 1, 9)))
        reply = _reply(socket)
        assert reply.request_id == 9 and reply.error is not None and "only the models it attached" in reply.error
        # A result pointing into shared memory is dropped: the core never opens a segment a peer names.
        socket.send(pack_header(BatchResult.build_final(1, [[["y", "FP32", [1], ["/etc-passwd", 4]]]], [], [0, 0, 0])))
    finally:
        socket.close(linger=0)
    assert server.is_running
    with ModelClient(server.url, "local_double") as client:
        assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [2, 2]


def test_a_peer_without_a_session_name_is_ignored(server: Serve) -> None:
    spec = pyserve.serve._spec("nameless", 1, X, Y, ModelConfig(max_batch_size=8))
    socket = _peer(server, b"no-slash-here")
    try:
        socket.send(pack_header(Load.build(spec, 1)))
        assert not socket.poll(500)
    finally:
        socket.close(linger=0)


# a peer in another process ------------------------------------------------------------------------------------------

_PEER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from pyserve import ModelConfig, RemoteServe, Tensor, batch

    @batch
    def slow_double(x):
        time.sleep(float(sys.argv[2]))
        return {"y": x * 2}

    remote = RemoteServe(sys.argv[1])
    remote.bind("peer_double", slow_double, [Tensor("x", np.float32, (-1,))], [Tensor("y", np.float32, (-1,))],
                config=ModelConfig(max_batch_size=8))
    remote.run()
    print("attached", flush=True)
    remote.serve()
    """
)


@contextlib.contextmanager
def _peer_process(server: Serve, delay_s: float) -> Iterator[subprocess.Popen[str]]:
    """A child process that attaches ``peer_double`` (sleeping ``delay_s`` per batch); killed at the end."""
    peer = subprocess.Popen(
        [sys.executable, "-c", _PEER_SCRIPT, server.url, str(delay_s)],
        env={**os.environ, TOKEN_ENV: TOKEN},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert peer.stdout is not None
    try:
        assert peer.stdout.readline().strip() == "attached"
        yield peer
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.wait()
        peer.stdout.close()


def test_peer_process_serves_and_detaches_on_sigterm(server: Serve) -> None:
    with _peer_process(server, 0.0) as peer:
        with ModelClient(server.url, "peer_double") as client:
            assert client.infer_sample(x=np.ones(3, np.float32))["y"].tolist() == [2, 2, 2]
        peer.send_signal(signal.SIGTERM)
        assert peer.wait(15) == 0
    with pytest.raises(ModelNotFoundError), ModelClient(server.url, "peer_double", init_timeout_s=2) as client:
        client.infer_sample(x=np.ones(3, np.float32))


def test_killed_peer_fails_its_requests_at_once() -> None:
    # A peer timeout far longer than the test: what notices the death is the closed connection, probed at once.
    config = ServeConfig(
        http_port=0, grpc_port=0, metrics_port=0, remote_port=0, remote_token=TOKEN, remote_peer_timeout_s=60
    )
    with Serve(config) as server, _peer_process(server, 3.0) as peer:
        errors: list[BaseException] = []

        def call() -> None:
            client = triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30)
            tensor = triton_http.InferInput("x", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
            try:
                client.infer("peer_double", [tensor])
            except InferenceServerException as exc:
                errors.append(exc)
            finally:
                client.close()

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(0.5)  # the request is running on the peer
        peer.kill()
        peer.wait()
        started = time.monotonic()
        caller.join(30)
        assert not caller.is_alive()
        assert time.monotonic() - started < 10
        assert len(errors) == 1 and "lost its remote connection" in str(errors[0])
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        assert not http.is_model_ready("peer_double")
        http.close()


def test_silent_peer_is_dropped_after_the_peer_timeout(server: Serve) -> None:
    # A stopped process keeps its connections open but sends nothing: the session times out (2 s here).
    with _peer_process(server, 0.0) as peer:
        with ModelClient(server.url, "peer_double") as client:
            assert client.infer_sample(x=np.ones(1, np.float32))["y"].tolist() == [2]
        peer.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
            try:
                listed = {model["name"] for model in http.get_model_repository_index()}
            finally:
                http.close()
            if "peer_double" not in listed:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the silent peer's model was never unloaded")


# PyTriton's remote mode ---------------------------------------------------------------------------------------------


def test_remote_triton_binds_into_a_running_server(server: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyserve.pytriton.client import ModelClient as PyTritonModelClient
    from pyserve.pytriton.decorators import batch as pytriton_batch
    from pyserve.pytriton.model_config import ModelConfig as PyTritonModelConfig
    from pyserve.pytriton.model_config import Tensor as PyTritonTensor
    from pyserve.pytriton.triton import RemoteTriton

    @pytriton_batch
    def add_sub(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        a, b = inputs["INPUT_1"], inputs["INPUT_2"]
        return {"OUTPUT_1": a + b, "OUTPUT_2": a - b}

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    port = server.url.rsplit(":", 1)[1]
    with RemoteTriton(url=f"localhost:{port}") as triton:
        triton.bind(
            model_name="AddSub",
            infer_func=add_sub,
            inputs=[PyTritonTensor(dtype=np.float32, shape=(-1,)), PyTritonTensor(dtype=np.float32, shape=(-1,))],
            outputs=[PyTritonTensor(dtype=np.float32, shape=(-1,)), PyTritonTensor(dtype=np.float32, shape=(-1,))],
            config=PyTritonModelConfig(max_batch_size=16),
        )
        assert triton.is_alive() and triton.is_connected()
        a = np.array([[1.0, 2.0]], np.float32)
        b = np.array([[0.5, 0.5]], np.float32)
        with PyTritonModelClient(server.url, "AddSub") as client:
            result = client.infer_batch(a, b)
        np.testing.assert_array_equal(result["OUTPUT_1"], a + b)
        np.testing.assert_array_equal(result["OUTPUT_2"], a - b)
    assert not triton.is_alive()
