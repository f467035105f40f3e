"""Ray instances: a model's instances as Ray actors on a local Ray — served over HTTP and gRPC, placed and reported,
an actor killed under load (only its requests fail; Ray restarts it and it rejoins), removed on stop."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import pyserve
from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor, batch
from pyserve.client import DecoupledModelClient, ModelClient
from pyserve.errors import ConfigError

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")

pytestmark = pytest.mark.integration

X = [Tensor("x", np.float32, (-1,))]
Y = [Tensor("y", np.float32, (-1,))]
PID = [Tensor("pid", np.int64, (1,))]


@batch
def double(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x * 2}


def which_process(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    time.sleep(float(requests[0].parameters.get("sleep", 0)))
    return [{"pid": np.array([os.getpid()], np.int64)} for _ in requests]


def calls_double(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    # BLS from inside an actor: the server's core schedules the call to another model (here a thread instance).
    return [{"y": pyserve.infer("local_double", {"x": r["x"]})["y"] + 1} for r in requests]


def count_up(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for step in range(3):
        yield [{"y": r["x"] + step} for r in requests]


def wait_for_cancel(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    # Runs in the actor: says it started, then whether it saw its request cancelled, in files the test reads.
    marker = str(requests[0].parameters["marker"])
    open(marker + ".started", "w").close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not requests[0].is_cancelled:
        time.sleep(0.005)
    if requests[0].is_cancelled:
        open(marker + ".cancelled", "w").close()
    return [{"y": r["x"]} for r in requests]


class Setup:
    """The factory form: ``setup(device)`` runs inside the actor, with the device Ray gave it."""

    def __init__(self) -> None:
        self.device = ""

    def setup(self, device: str) -> None:
        self.device = device

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        return [{"device": np.array([self.device.encode()], object)} for _ in requests]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # A Ray of two CPUs, connected before the server starts: Serve uses it as it is and leaves it running.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server(local_ray: None) -> Iterator[Serve]:
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        serve.bind("ray_double", double, X, Y, config=ModelConfig(max_batch_size=8, worker="ray"))
        serve.bind(
            "ray_pid",
            which_process,
            X,
            PID,
            config=ModelConfig(max_batch_size=0, worker="ray", instances=2, ray_actor_options={"num_cpus": 0}),
        )
        serve.bind(
            "ray_setup",
            Setup,
            X,
            [Tensor("device", bytes, (1,))],
            config=ModelConfig(max_batch_size=0, worker="ray", ray_actor_options={"num_cpus": 0}),
        )
        serve.bind("local_double", double, X, Y, config=ModelConfig(max_batch_size=0))
        on_ray = ModelConfig(max_batch_size=0, worker="ray", ray_actor_options={"num_cpus": 0})
        serve.bind("ray_bls", calls_double, X, Y, config=on_ray)
        serve.bind("ray_stream", count_up, X, Y, config=dataclasses.replace(on_ray, decoupled=True))
        serve.bind("ray_cancellable", wait_for_cancel, X, Y, config=on_ray)
        yield serve


def test_ray_model_answers_over_http_and_grpc(server: Serve) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = triton_http.InferInput("x", [2, 3], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("ray_double", [tensor]).as_numpy("y"), x * 2)
    http.close()
    grpc = triton_grpc.InferenceServerClient(server.grpc_address)
    tensor = triton_grpc.InferInput("x", [2, 3], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc.infer("ray_double", [tensor]).as_numpy("y"), x * 2)
    grpc.close()
    # Large tensors travel inline to and from the actor.
    big = np.random.default_rng(1).random((1, 1 << 19), dtype=np.float32)
    with ModelClient(server.url, "ray_double") as client:
        np.testing.assert_array_equal(client.infer_batch(x=big)["y"], big * 2)


def test_instances_are_actors_in_their_own_processes(server: Serve) -> None:
    placements = server._ray.placements[("ray_pid", 1)]
    assert len(placements) == 2
    assert all(p["node_id"] == ray.get_runtime_context().get_node_id() for p in placements)
    pids = {p["pid"] for p in placements}
    assert os.getpid() not in pids and len(pids) == 2
    seen: set[int] = set()
    with ModelClient(server.url, "ray_pid") as client:
        for _ in range(40):
            seen.add(int(client.infer_sample(x=np.ones(1, np.float32))["pid"][0]))
            if seen == pids:
                break
    assert seen <= pids and seen


def test_a_ray_instance_calls_other_models(server: Serve) -> None:
    with ModelClient(server.url, "ray_bls") as client:
        assert client.infer_sample(x=np.array([1, 2], np.float32))["y"].tolist() == [3.0, 5.0]


def test_a_ray_instance_streams_a_decoupled_models_responses(server: Serve) -> None:
    for url in (server.url, f"grpc://{server.grpc_address}"):
        with DecoupledModelClient(url, "ray_stream") as client:
            got = [answer["y"].tolist() for answer in client.infer_sample(x=np.array([10], np.float32))]
        assert got == [[10.0], [11.0], [12.0]], url


def test_a_running_request_on_an_actor_sees_its_client_go_away(server: Serve, tmp_path: Any) -> None:
    marker = tmp_path / "request"
    body = json.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}],
            "parameters": {"marker": str(marker)},
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as conn:
        conn.sendall(
            b"POST /v2/models/ray_cancellable/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )
        deadline = time.monotonic() + 20
        while not os.path.exists(f"{marker}.started") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.path.exists(f"{marker}.started"), "the actor never ran the request"
    # The connection is closed while the function runs in the actor: its request's flag must go up there.
    deadline = time.monotonic() + 5
    while not os.path.exists(f"{marker}.cancelled") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(f"{marker}.cancelled"), "the actor's function never saw Request.is_cancelled"


def test_ray_instances_are_reported_with_their_node(server: Serve) -> None:
    node = ray.get_runtime_context().get_node_id()
    placements = server._ray.placements[("ray_pid", 1)]
    with urllib.request.urlopen(f"{server.url}/dashboard/data", timeout=10) as response:
        data = json.loads(response.read())
    (model,) = [m for m in data["models"] if m["name"] == "ray_pid"]
    assert {(i["kind"], i["node"], i["host"], i["device"]) for i in model["instances"]} == {
        ("ray", node, platform.node(), "cpu")
    }
    assert sorted(i["pid"] for i in model["instances"]) == sorted(p["pid"] for p in placements)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        page = response.read().decode()
    lines = page.splitlines()
    info = [line for line in lines if line.startswith("pyserve_instance_info{") and 'model="ray_pid"' in line]
    assert len(info) == 2 and all(f'node="{node}"' in line and 'kind="ray"' in line for line in info), info


def test_setup_gets_the_actors_device(server: Serve) -> None:
    with ModelClient(server.url, "ray_setup") as client:
        assert client.infer_sample(x=np.ones(1, np.float32))["device"][0] == b"cpu"


def test_killed_actor_fails_only_its_requests_and_rejoins(server: Serve) -> None:
    victim, _ = server._ray.actors("ray_pid", 1)
    victim_pid = ray.get(victim.placement.remote())["pid"]
    outcomes: list[Any] = []

    def call() -> None:
        client = triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)
        tensor = triton_http.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, np.float32))
        try:
            outcomes.append(int(client.infer("ray_pid", [tensor], parameters={"sleep": "1.5"}).as_numpy("pid")[0]))
        except InferenceServerException as exc:
            outcomes.append(exc)
        finally:
            client.close()

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    time.sleep(0.7)  # one request running on each actor
    ray.kill(victim, no_restart=False)
    for caller in callers:
        caller.join(60)
    failures = [o for o in outcomes if isinstance(o, InferenceServerException)]
    answers = [o for o in outcomes if not isinstance(o, InferenceServerException)]
    assert len(failures) == 1 and "lost its remote connection" in str(failures[0]), outcomes
    assert len(answers) == 1 and answers[0] != victim_pid
    # Ray restarts the actor; it connects again and the model has two instances once more.
    deadline = time.monotonic() + 60
    pids: set[int] = set()
    with ModelClient(server.url, "ray_pid") as client:
        while time.monotonic() < deadline and len(pids) < 2:
            pids.add(int(client.infer_sample(x=np.ones(1, np.float32))["pid"][0]))
    assert len(pids) == 2 and victim_pid not in pids


def test_stop_removes_the_actors(local_ray: None) -> None:
    serve = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    serve.bind("ray_double", double, X, Y, config=ModelConfig(max_batch_size=8, worker="ray"))
    with serve:
        (actor,) = serve._ray.actors("ray_double", 1)
        assert ray.get(actor.placement.remote())["device"] == "cpu"
    # ray.kill is asynchronous: a call made at once may still be answered; within seconds the actor is gone.
    deadline = time.monotonic() + 30
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray.get(actor.placement.remote(), timeout=10)
            time.sleep(0.2)
    assert ray.is_initialized()  # the user's Ray is left running


def test_the_remote_port_opened_for_ray_is_named_over_http(server: Serve) -> None:
    # No remote_port was configured: binding the Ray models opened one, with a token of the server's own.
    assert server.remote_address.startswith("tcp://127.0.0.1:")
    http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    response = http._get("v2/pyserve/remote", None, None)
    assert response.status_code == 200 and server.remote_address in response.read().decode()
    http.close()


def test_actor_options_need_the_ray_worker() -> None:
    with pytest.raises(ConfigError, match="ray_actor_options"):
        ModelConfig(ray_actor_options={"num_gpus": 1})


def busy(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    # Pure Python: holds its process's interpreter lock, so only more processes (actors) add throughput.
    deadline = time.thread_time() + 0.02
    while time.thread_time() < deadline:
        pass
    return [{"y": r["x"]} for r in requests]


def _throughput(url: str, model: str, seconds: float, clients: int = 4) -> float:
    done = [0] * clients
    stop_at = time.monotonic() + seconds

    def loop(slot: int) -> None:
        with ModelClient(url, model) as client:
            while time.monotonic() < stop_at:
                client.infer_sample(x=np.ones(1, np.float32))
                done[slot] += 1

    threads = [threading.Thread(target=loop, args=(slot,)) for slot in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / seconds


@pytest.mark.slow
def test_two_actors_double_a_cpu_bound_model(local_ray: None) -> None:
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        options = {"num_cpus": 0}
        serve.bind("one", busy, X, Y, config=ModelConfig(worker="ray", ray_actor_options=options))
        serve.bind("two", busy, X, Y, config=ModelConfig(worker="ray", instances=2, ray_actor_options=options))
        _throughput(serve.url, "one", 0.5)
        one = _throughput(serve.url, "one", 4)
        two = _throughput(serve.url, "two", 4)
    print(f"one actor {one:.1f}/s, two actors {two:.1f}/s: {two / one:.2f}x")  # the figure docs/deploy.md records
    assert two / one > 1.6, f"one actor {one:.1f}/s, two actors {two:.1f}/s"
