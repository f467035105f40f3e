"""Instances: process workers, placement, crash and restart, setup(device), cancellation of running requests."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.errors import ConfigError, ServerError

pytestmark = pytest.mark.integration

FP32_IN = [Tensor("INPUT0", np.float32, (-1,))]
FP32_OUT = [Tensor("OUTPUT0", np.float32, (-1,))]
INFO_OUT = [Tensor("PID", np.int64, (1,)), Tensor("DEVICE", bytes, (1,)), Tensor("VISIBLE", bytes, (1,))]


class WhereAmI:
    """Reports the process it runs in, the device setup() got and CUDA_VISIBLE_DEVICES; sleeps on request."""

    def setup(self, device: str) -> None:
        self.device = device

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        outputs = []
        for request in requests:
            rows = request["INPUT0"].shape[0]
            seconds = float(request["INPUT0"].max()) if request["INPUT0"].size else 0.0
            if seconds > 0:
                time.sleep(min(seconds, 10.0))
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
            outputs.append(
                {
                    "PID": np.full((rows, 1), os.getpid(), dtype=np.int64),
                    "DEVICE": np.array([[self.device.encode()]] * rows, dtype=object),
                    "VISIBLE": np.array([[visible.encode()]] * rows, dtype=object),
                }
            )
        return outputs


class FailsToLoad:
    def setup(self, device: str) -> None:
        raise RuntimeError("weights file is corrupt")

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        return []


def where(server: Serve, model: str, sleep_s: float = 0.0) -> dict[str, object]:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
    try:
        tensor = triton_http.InferInput("INPUT0", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[sleep_s]], dtype=np.float32))
        result = client.infer(model, [tensor])
        return {
            "pid": int(result.as_numpy("PID")[0, 0]),
            "device": result.as_numpy("DEVICE")[0, 0].decode(),
            "visible": result.as_numpy("VISIBLE")[0, 0].decode(),
        }
    finally:
        client.close()


def index_entry(server: Serve, model: str) -> dict[str, object]:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        return next(e for e in client.get_model_repository_index() if e["name"] == model)
    finally:
        client.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        serve.bind(
            "process_pair",
            WhereAmI,
            FP32_IN,
            INFO_OUT,
            ModelConfig(max_batch_size=4, instances=2, worker="process", devices=("cuda:0", "cuda:1")),
        )
        serve.bind(
            "thread_devices",
            [WhereAmI(), WhereAmI()],
            FP32_IN,
            INFO_OUT,
            ModelConfig(max_batch_size=4, devices=("cuda:1", "cpu")),
        )
        yield serve


def test_process_instances_run_in_their_own_processes_on_their_own_device(server: Serve) -> None:
    seen = {}
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        info = where(server, "process_pair")
        seen[info["pid"]] = info
    assert len(seen) == 2, "requests never reached both process instances"
    assert os.getpid() not in seen
    # Round-robin placement: each process sees only its GPU, which it knows as cuda:0.
    assert sorted(info["visible"] for info in seen.values()) == ["0", "1"]
    assert {info["device"] for info in seen.values()} == {"cuda:0"}


def test_thread_instances_get_their_device_string(server: Serve) -> None:
    devices = set()
    deadline = time.monotonic() + 10
    while len(devices) < 2 and time.monotonic() < deadline:
        info = where(server, "thread_devices")
        assert info["pid"] == os.getpid()
        devices.add(info["device"])
    assert devices == {"cuda:1", "cpu"}


def test_a_killed_process_fails_only_its_request_and_is_restarted(server: Serve) -> None:
    outcome: dict[str, object] = {}

    def slow_call() -> None:
        try:
            outcome["result"] = where(server, "process_pair", sleep_s=5.0)
        except triton_http.InferenceServerException as exc:
            outcome["error"] = str(exc)

    caller = threading.Thread(target=slow_call)
    caller.start()
    # Find the busy instance: the other one answers quick requests meanwhile.
    time.sleep(0.5)
    idle_pid = where(server, "process_pair")["pid"]
    core_pid = server._core.pid if server._core is not None else -1
    pids = {p for p in _worker_processes(core_pid) if p != idle_pid}
    assert pids, "no busy worker process found"
    busy_pid = pids.pop()
    os.kill(busy_pid, signal.SIGKILL)
    caller.join(30)
    error = str(outcome.get("error"))
    assert "process_pair" in error and "died" in error and "SIGKILL" in error, outcome
    assert "instance" in error
    # The model stays ready on the surviving instance.
    assert where(server, "process_pair")["pid"] == idle_pid
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        entry = index_entry(server, "process_pair")
        if entry["instances"] == {"configured": 2, "live": 2}:
            break
        time.sleep(0.1)
    assert index_entry(server, "process_pair")["instances"] == {"configured": 2, "live": 2}
    assert busy_pid not in _worker_processes(core_pid)


def _worker_processes(core_pid: int) -> set[int]:
    """Live worker processes whose parent is this server's core."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as handle:
                state, parent = handle.read().rsplit(b")", 1)[1].split()[:2]
        except OSError:
            continue
        if b"pyserve.worker" in command and state != b"Z" and int(parent) == core_pid:
            pids.add(int(entry))
    return pids


def test_setup_failure_in_a_process_fails_bind_with_the_reason(server: Serve) -> None:
    with pytest.raises(ServerError, match="exited before it was ready"):
        server.bind("broken", FailsToLoad, FP32_IN, INFO_OUT, ModelConfig(max_batch_size=4, worker="process"))
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    assert not client.is_model_ready("broken")
    client.close()


def test_an_unpicklable_function_is_refused_with_the_factory_hint() -> None:
    lock = threading.Lock()

    def uses_a_lock(requests: list[Request]) -> list[dict[str, np.ndarray]]:
        with lock:
            return []

    with pytest.raises(ConfigError, match=r"cannot be pickled.*setup\(device\)"):
        Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)).bind(
            "locked", uses_a_lock, FP32_IN, INFO_OUT, ModelConfig(max_batch_size=4, worker="process")
        )


observed_cancel = threading.Event()
started = threading.Event()


def wait_for_cancel(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    started.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(request.is_cancelled for request in requests):
            observed_cancel.set()
            break
        time.sleep(0.005)
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def test_a_running_request_sees_its_client_go_away() -> None:
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        serve.bind(
            "cancellable",
            wait_for_cancel,
            FP32_IN,
            [Tensor("OUTPUT0", np.float32, (-1,))],
            ModelConfig(max_batch_size=4),
        )
        body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]})
        with socket.create_connection(("127.0.0.1", serve.http_port), timeout=10) as conn:
            conn.sendall(
                b"POST /v2/models/cancellable/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
            )
            assert started.wait(10)
        # The connection is closed while the function runs: its request's flag must go up.
        assert observed_cancel.wait(5), "the running function never saw Request.is_cancelled"
        # Counted as Triton counts it: a failure, and no success, queue or compute for that request.
        client = triton_http.InferenceServerClient(f"127.0.0.1:{serve.http_port}")
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                (entry,) = client.get_inference_statistics("cancellable")["model_stats"]
                if entry["inference_stats"]["fail"]["count"]:
                    break
                time.sleep(0.05)
        finally:
            client.close()
        stats = entry["inference_stats"]
        assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 0, stats
        assert stats["queue"]["count"] == 0 and stats["compute_infer"]["count"] == 0, stats


def test_an_instance_is_ready_only_once_its_cancel_subscription_is_in_place() -> None:
    # A cancel published before the subscription reached the core would be lost (it flaked under CPU load): the
    # core confirms each subscription, and bind() returns only after the instance's listener heard it.
    from pyserve.worker.cancel import _listeners

    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        serve.bind("subscribed", wait_for_cancel, FP32_IN, [Tensor("OUTPUT0", np.float32, (-1,))])
        listeners = [listener for listener, _ in _listeners.values()]
        assert listeners, "the instance started no cancel listener"
        for listener in listeners:
            assert select.select([listener.synced_fd], [], [], 0)[0], "bind() returned before the subscription"


class SlowToLoad(WhereAmI):
    def setup(self, device: str) -> None:
        time.sleep(1.5)
        super().setup(device)


def test_the_server_is_not_ready_until_the_models_bound_before_start_are_loaded() -> None:
    import urllib.error
    import urllib.request

    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    server.bind("slow", SlowToLoad, FP32_IN, INFO_OUT, ModelConfig(max_batch_size=4, worker="process"))
    starter = threading.Thread(target=server.run)
    starter.start()

    def status(path: str) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}{path}", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    answers = []
    try:
        deadline = time.monotonic() + 30
        while starter.is_alive() and time.monotonic() < deadline:
            if server.http_port:
                answer = status("/v2/health/ready")
                answers.append(answer)
                if answer == 200:
                    # run() may not have returned yet (the thread is slow under load), but a ready server must
                    # already serve the model bound before start: models load before the core says ready.
                    assert status("/v2/models/slow/ready") == 200, "the server said ready before its models loaded"
            time.sleep(0.05)
        starter.join(30)
        assert 400 in answers, "readiness was never observed while the model loaded"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2/health/ready", timeout=5) as r:
            assert r.status == 200
        assert where(server, "slow")["device"] == "cpu"
    finally:
        starter.join(30)
        server.stop()


def test_a_core_is_not_ready_before_serve_has_loaded_its_models() -> None:
    import urllib.error
    import urllib.request

    def ready_status(port: int) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    try:
        server._start_core()  # the core is up, but Serve has not loaded (or even sent) any model yet
        assert ready_status(server.http_port) == 400
        server.run()
        assert ready_status(server.http_port) == 200
    finally:
        server.stop()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def identity_batch(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def test_worker_spin_reaches_process_instances_and_stops_when_idle() -> None:
    config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0, worker_spin_us=300)
    with Serve(config) as server:
        out = [Tensor("OUTPUT0", np.float32, (-1,))]
        server.bind("spinning", identity_batch, FP32_IN, out, ModelConfig(max_batch_size=4, worker="process"))
        x = np.ones((1, 3), np.float32)
        for _ in range(50):
            np.testing.assert_array_equal(server.infer("spinning", {"INPUT0": x})["OUTPUT0"], x)
        assert server._core is not None
        (worker,) = _worker_processes(server._core.pid)
        with open(f"/proc/{worker}/cmdline", "rb") as handle:
            command = handle.read().split(b"\0")
        assert command[command.index(b"--spin-us") + 1] == b"300"
        before = _cpu_seconds(worker)
        time.sleep(1.0)
        assert _cpu_seconds(worker) - before < 0.05  # it spins after a batch only, never while idle


class RecordsItsSetup:
    """setup() takes 1 s and records when it ran in a file named by the model (thread and process instances)."""

    def __init__(self, record: str) -> None:
        self.record = record

    def setup(self, device: str) -> None:
        started = time.time()
        time.sleep(1.0)
        with open(self.record, "w") as out:
            out.write(f"{started} {time.time()}")

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def _bind_recorders(server: Serve, tmp_path: Any, kinds: list[str]) -> list[str]:
    records = []
    for index, kind in enumerate(kinds):
        record = str(tmp_path / f"setup-{index}")
        records.append(record)
        # An object with setup(): set up in its instance (a process instance's own process).
        config = ModelConfig(max_batch_size=4, worker=kind)
        server.bind(f"recorder_{index}", RecordsItsSetup(record), FP32_IN, FP32_OUT, config)
    return records


def _intervals(records: list[str]) -> list[tuple[float, float]]:
    spans = []
    for record in records:
        with open(record) as handle:
            start, end = handle.read().split()
        spans.append((float(start), float(end)))
    return spans


def test_models_bound_before_start_load_side_by_side(tmp_path: Any) -> None:
    # As tritonserver's --model-load-thread-count: four setups of 1 s each run at once, not one after the other.
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, model_load_thread_count=4))
    records = _bind_recorders(server, tmp_path, ["thread", "process", "thread", "process"])
    with server:
        spans = _intervals(records)
        assert max(start for start, _ in spans) < min(end for _, end in spans), f"setups did not overlap: {spans}"
        ones = {"INPUT0": np.ones((1, 2), np.float32)}
        for index in range(4):
            np.testing.assert_array_equal(server.infer(f"recorder_{index}", ones)["OUTPUT0"], 1)


def test_model_load_thread_count_1_loads_one_at_a_time(tmp_path: Any) -> None:
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, model_load_thread_count=1))
    records = _bind_recorders(server, tmp_path, ["thread", "thread"])
    with server:
        (first, second) = sorted(_intervals(records))
        assert first[1] <= second[0], f"setups overlapped: {first} {second}"


def test_a_model_that_fails_to_load_among_others_fails_run_with_its_reason(tmp_path: Any) -> None:
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    _bind_recorders(server, tmp_path, ["thread", "process"])
    server.bind("broken", FailsToLoad, FP32_IN, INFO_OUT, ModelConfig(max_batch_size=4, worker="process"))
    try:
        with pytest.raises(ServerError, match="exited before it was ready"):
            server.run()
        # The others loaded beside it and serve.
        np.testing.assert_array_equal(server.infer("recorder_1", {"INPUT0": np.ones((1, 2), np.float32)})["OUTPUT0"], 1)
    finally:
        server.stop()
