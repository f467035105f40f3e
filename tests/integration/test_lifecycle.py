"""Serve's lifetime: binding, live loading, large tensors through shared memory, clean shutdown on every path."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import select
import shutil
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
import tritonclient.http as triton_http

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.errors import ConfigError, ModelAlreadyBoundError
from pyserve.transport.shm import SHM_DIR, remove_segments

from .conftest import serve_in_thread

pytestmark = pytest.mark.integration

ONE_MIB_FLOATS = 262_144


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def bind_identity(s: Serve, name: str, **kwargs: object) -> None:
    s.bind(
        name,
        identity,
        inputs=[Tensor("INPUT0", np.float32, (-1,))],
        outputs=[Tensor("OUTPUT0", np.float32, (-1,))],
        **kwargs,  # type: ignore[arg-type]
    )


def segments(session: str) -> list[str]:
    return glob.glob(os.path.join(SHM_DIR, glob.escape(session) + "*"))


def process_gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def processes_of_session(session: str) -> list[int]:
    """Live processes whose command line names the session (the core and any worker it started)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if session.encode() in cmdline and not process_gone(int(entry)):
            found.append(int(entry))
    return found


def wait_until(condition: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(condition())  # type: ignore[operator]


def infer_fp32(url: str, model: str, data: np.ndarray) -> np.ndarray:
    client = triton_http.InferenceServerClient(url, network_timeout=30.0)
    try:
        infer_input = triton_http.InferInput("INPUT0", list(data.shape), "FP32")
        infer_input.set_data_from_numpy(data)
        return client.infer(model, [infer_input]).as_numpy("OUTPUT0")
    finally:
        client.close()


@pytest.fixture
def own_server() -> Iterator[Serve]:
    """A server of the test's own, stopped afterwards whatever happened."""
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    try:
        yield s
    finally:
        s.stop()


# shutdown -------------------------------------------------------------------------------------------------------


def test_stop_is_idempotent_and_leaves_nothing_behind(own_server: Serve) -> None:
    s = own_server
    bind_identity(s, "lifecycle_model", config=ModelConfig(max_batch_size=4))
    s.run()
    assert s.is_running
    assert s._core is not None
    pid, session, runtime_dir, port = s._core.pid, s._session, s._core.runtime_dir, s.http_port
    assert runtime_dir is not None and os.path.isdir(runtime_dir)
    data = np.random.default_rng(0).random((1, ONE_MIB_FLOATS), dtype=np.float32)
    np.testing.assert_array_equal(infer_fp32(f"127.0.0.1:{port}", "lifecycle_model", data), data)
    assert segments(session), "a 1 MiB request should have gone through shared memory"
    assert processes_of_session(session) == [pid]

    s.stop()
    s.stop()
    assert not s.is_running
    assert process_gone(pid)
    assert processes_of_session(session) == []
    assert segments(session) == []
    assert not os.path.exists(runtime_dir)
    assert not [t for t in threading.enumerate() if t.name.startswith("pyserve-lifecycle_model-")]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_context_manager_stops(own_server: Serve) -> None:
    bind_identity(own_server, "ctx_model")
    with own_server as s:
        assert s._core is not None
        pid = s._core.pid
        assert s.is_running
    assert not own_server.is_running
    assert process_gone(pid)


def test_restart_after_stop(own_server: Serve) -> None:
    bind_identity(own_server, "again")
    data = np.arange(4, dtype=np.float32)
    for _ in range(2):
        own_server.run()
        np.testing.assert_array_equal(infer_fp32(f"127.0.0.1:{own_server.http_port}", "again", data), data)
        own_server.stop()


def test_server_started_from_a_thread_outlives_that_thread(own_server: Serve) -> None:
    bind_identity(own_server, "from_thread")
    starter = threading.Thread(target=own_server.run)
    starter.start()
    starter.join(30)
    time.sleep(1.0)
    assert own_server.is_running
    data = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(infer_fp32(f"127.0.0.1:{own_server.http_port}", "from_thread", data), data)


# binding ---------------------------------------------------------------------------------------------------------


def test_second_bind_of_the_same_name_is_refused(own_server: Serve) -> None:
    bind_identity(own_server, "twice")
    with pytest.raises(ModelAlreadyBoundError, match="twice"):
        bind_identity(own_server, "twice")
    bind_identity(own_server, "twice", model_version=2)
    own_server.run()
    with pytest.raises(ModelAlreadyBoundError, match="twice"):
        bind_identity(own_server, "twice", model_version=2)
    # Both versions serve and are listed; the unversioned request goes to the latest.
    client = triton_http.InferenceServerClient(f"127.0.0.1:{own_server.http_port}")
    try:
        assert client.get_model_metadata("twice")["versions"] == ["1", "2"]
        assert client.get_model_metadata("twice", model_version="1")["versions"] == ["1", "2"]
        assert client.get_model_config("twice")["name"] == "twice"
        data = np.arange(3, dtype=np.float32)
        infer_input = triton_http.InferInput("INPUT0", [3], "FP32")
        infer_input.set_data_from_numpy(data)
        assert client.infer("twice", [infer_input]).get_response()["model_version"] == "2"
        assert client.infer("twice", [infer_input], model_version="1").get_response()["model_version"] == "1"
        assert client.is_model_ready("twice", model_version="1")
        assert client.is_model_ready("twice", model_version="2")
    finally:
        client.close()


@pytest.mark.parametrize("name", ["", "has space", "-leading-dash", ".hidden", "a/b", "x" * 129, "caf\u00e9"])
def test_invalid_model_name(own_server: Serve, name: str) -> None:
    with pytest.raises(ConfigError, match="model name"):
        bind_identity(own_server, name)


def test_bind_after_start_loads_live(own_server: Serve) -> None:
    bind_identity(own_server, "first")
    own_server.run()
    url = f"127.0.0.1:{own_server.http_port}"
    client = triton_http.InferenceServerClient(url)
    try:
        assert not client.is_model_ready("late")
        own_server.bind(
            "late",
            lambda requests: [{"OUTPUT0": r["INPUT0"] * 3} for r in requests],
            inputs=[Tensor("INPUT0", np.int64, (-1,))],
            outputs=[Tensor("OUTPUT0", np.int64, (-1,))],
        )
        assert client.is_model_ready("late")
        assert client.is_server_ready()
        infer_input = triton_http.InferInput("INPUT0", [3], "INT64")
        infer_input.set_data_from_numpy(np.array([1, 2, 3], np.int64))
        assert client.infer("late", [infer_input]).as_numpy("OUTPUT0").tolist() == [3, 6, 9]
        assert {m["name"] for m in client.get_model_repository_index()} == {"first", "late"}
        # A failed live bind leaves the server as it was.
        with pytest.raises(ModelAlreadyBoundError):
            bind_identity(own_server, "late")
        assert client.is_model_ready("first")
    finally:
        client.close()


# shared memory under load -----------------------------------------------------------------------------------------


def test_large_tensors_round_trip_concurrently(server: Serve) -> None:
    url = f"127.0.0.1:{server.http_port}"
    errors: list[BaseException] = []
    checked = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = triton_http.InferenceServerClient(url, network_timeout=60.0)
        try:
            for i in range(4):
                rows = 1 + (seed + i) % 2
                data = rng.standard_normal((rows, ONE_MIB_FLOATS // rows), dtype=np.float32)
                infer_input = triton_http.InferInput("INPUT0", list(data.shape), "FP32")
                infer_input.set_data_from_numpy(data)
                result = client.infer("large_fp32", [infer_input])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
                checked.append(seed)
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[0]
    assert len(checked) == 32
    assert segments(server._session), "1 MiB tensors should travel through shared memory"


# the parent dies ------------------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, time, urllib.request
    import numpy as np
    from pyserve import ModelConfig, Serve, ServeConfig, Tensor

    def identity(requests):
        return [{"OUTPUT0": r["INPUT0"]} for r in requests]

    tensors = dict(inputs=[Tensor("INPUT0", np.float32, (-1,))], outputs=[Tensor("OUTPUT0", np.float32, (-1,))])
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    s.bind("identity", identity, **tensors)
    s.bind("identity_process", identity, **tensors, config=ModelConfig(worker="process"))
    s.run()
    body = np.ones(262144, np.float32).tobytes()
    for model in ("identity", "identity_process"):
        request = urllib.request.Request(s.url + f"/v2/models/{model}/infer", data=body,
                                         headers={"Inference-Header-Content-Length": "0"})
        urllib.request.urlopen(request, timeout=30).read()
    workers = [int(pid) for pid in open(f"/proc/{s._core.pid}/task/{s._core.pid}/children").read().split()]
    print(json.dumps({"pid": s._core.pid, "session": s._session, "runtime_dir": s._core.runtime_dir,
                      "workers": workers}), flush=True)
    time.sleep(120)
    """
)


@dataclasses.dataclass
class KilledParent:
    """What was left a few seconds after a process running Serve was killed with SIGKILL."""

    core_gone: bool
    segments_left: list[str]
    runtime_dir_left: bool
    workers: list[int]
    workers_left: list[int]


@pytest.fixture(scope="module")
def killed_parent(repo_root: Path) -> Iterator[KilledParent]:
    """Start Serve in a child process, make it use shared memory, SIGKILL the child, watch the core."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=repo_root
    )
    info: dict[str, object] = {}
    try:
        assert child.stdout is not None
        readable, _, _ = select.select([child.stdout], [], [], 30)
        line = child.stdout.readline() if readable else b""
        if not line:
            child.kill()
            _, err = child.communicate(timeout=10)
            pytest.fail(f"the child did not start its server: {err.decode(errors='replace')[-2000:]}")
        info = json.loads(line)
        core_pid, session, runtime_dir = int(info["pid"]), str(info["session"]), str(info["runtime_dir"])  # type: ignore[call-overload]
        assert not process_gone(core_pid)
        assert segments(session), "the child's 1 MiB request should have created shared-memory segments"
        assert os.path.isdir(runtime_dir)

        child.send_signal(signal.SIGKILL)
        child.wait(10)

        workers = [int(pid) for pid in info["workers"]]  # type: ignore[attr-defined]
        core_gone = wait_until(lambda: process_gone(core_pid))
        wait_until(lambda: all(process_gone(pid) for pid in workers))
        wait_until(lambda: segments(session) == [])
        workers_left = [pid for pid in workers if not process_gone(pid)]
        yield KilledParent(core_gone, segments(session), os.path.exists(runtime_dir), workers, workers_left)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
        for pid in [info.get("pid"), *info.get("workers", [])]:  # type: ignore[misc]
            if isinstance(pid, int) and not process_gone(pid):
                os.kill(pid, signal.SIGKILL)
        leftover_session = info.get("session")
        if isinstance(leftover_session, str):
            remove_segments(leftover_session)
        leftover_dir = info.get("runtime_dir")
        if isinstance(leftover_dir, str):
            shutil.rmtree(leftover_dir, ignore_errors=True)


def test_core_exits_when_the_parent_is_killed(killed_parent: KilledParent) -> None:
    assert killed_parent.core_gone, "the core process outlived its killed parent"


def test_process_instances_exit_when_the_parent_is_killed(killed_parent: KilledParent) -> None:
    assert len(killed_parent.workers) == 1
    assert killed_parent.workers_left == [], "a process instance outlived its killed parent"


def test_shared_memory_is_removed_when_the_parent_is_killed(killed_parent: KilledParent) -> None:
    assert killed_parent.segments_left == []


def test_ipc_directory_is_removed_when_the_parent_is_killed(killed_parent: KilledParent) -> None:
    assert not killed_parent.runtime_dir_left


class SlowToSetUp:
    """A factory-form model whose setup takes a while: the server is still starting when it is stopped."""

    def setup(self, device: str) -> None:
        time.sleep(1.0)

    def __call__(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def test_stop_from_another_thread_while_serve_is_starting_ends_serve_quietly() -> None:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    tensors = [Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))]
    s.bind("slow_setup", SlowToSetUp, *tensors, config=ModelConfig(max_batch_size=4))
    thread, errors = serve_in_thread(s)
    s.stop()  # the instance is still in setup(): serve() is inside run()
    thread.join(30)
    assert not thread.is_alive() and not errors, errors


def test_front_ends_turned_off_do_not_listen() -> None:
    config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0, allow_http=False, allow_metrics=False)
    with Serve(config) as s:
        s.bind("identity", SlowToSetUp, [Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))])
        assert s.http_port == 0 and s.metrics_port == 0 and s.grpc_port > 0
        import tritonclient.grpc as triton_grpc

        client = triton_grpc.InferenceServerClient(s.grpc_address)
        try:
            assert client.is_server_ready() and client.is_model_ready("identity")
        finally:
            client.close()
        np.testing.assert_array_equal(s.infer("identity", {"INPUT0": np.ones(3, np.float32)})["OUTPUT0"], np.ones(3))
    with pytest.raises(ConfigError, match="allow_http and allow_grpc are both off"):
        ServeConfig(allow_http=False, allow_grpc=False)
