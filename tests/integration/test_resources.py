"""What a server costs while it waits, and what it keeps after a large request: CPU, wake-ups, memory, early 413s.

Measured from /proc: CPU time (utime + stime), voluntary context switches (each one a wake-up), VmRSS (which
includes mapped shared memory) and the session's /dev/shm segments.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import glob
import http.client
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.client import ModelClient
from pyserve.transport.shm import SHM_DIR

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="measures processes through /proc"),
]

FP32_IN = [Tensor("INPUT0", np.float32, (-1,))]
FP32_OUT = [Tensor("OUTPUT0", np.float32, (-1,))]
MIB = 1 << 20
# Above the pools' retained bytes (64 MiB), small enough for a 2-core CI machine.
LARGE_REQUEST_BYTES = 128 * MIB
IDLE_CPU_LIMIT = 0.005


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


class Identity:
    """The same, as a class: process instances instantiate it in the worker."""

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        return identity(requests)


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    """A thread-instance and a process-instance model, one instance each."""
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as s:
        s.bind("thread_identity", identity, FP32_IN, FP32_OUT)
        s.bind("process_identity", Identity, FP32_IN, FP32_OUT, ModelConfig(worker="process"))
        yield s


# /proc ----------------------------------------------------------------------------------------------------------


def stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name: [0] is the state, [1] the parent pid."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread the process ever had, user and system."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu_seconds(pid: int, threads: list[int]) -> float:
    """CPU time of the given threads of a process, user and system."""
    total = 0.0
    for tid in threads:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def wakeups(pid: int, threads: list[int] | None = None) -> int:
    """Voluntary context switches of the process's threads (or of the given thread ids)."""
    total = 0
    for tid in threads if threads is not None else [int(t) for t in os.listdir(f"/proc/{pid}/task")]:
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        total += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return total


def rss_bytes(pid: int) -> int:
    """Resident memory, shared memory it maps included."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def children_of(pid: int) -> list[int]:
    """Live child processes."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = stat_fields(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        return stat_fields(pid)[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def shm_bytes(session: str) -> int:
    """Memory held by the session's shared-memory segments."""
    total = 0
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(session) + "*")):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(path).st_blocks * 512
    return total


def pyserve_threads() -> list[int]:
    """Thread ids of the threads pyserve runs in this process (instances, cancel listeners)."""
    return [t.native_id for t in threading.enumerate() if t.name.startswith("pyserve-") and t.native_id is not None]


def core_and_worker(server: Serve) -> tuple[int, int]:
    assert server._core is not None
    core = server._core.pid
    (worker,) = children_of(core)
    return core, worker


def infer_large(conn: http.client.HTTPConnection, model: str, data: np.ndarray) -> None:
    """POST ``data`` as binary FP32 on a keep-alive connection; check that the same bytes come back."""
    size = {"binary_data_size": data.nbytes}
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [data.size], "parameters": size}
    head = orjson.dumps({"inputs": [tensor], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]})
    conn.putrequest("POST", f"/v2/models/{model}/infer")
    conn.putheader("Content-Length", str(len(head) + data.nbytes))
    conn.putheader("Inference-Header-Content-Length", str(len(head)))
    conn.endheaders(head)
    conn.send(data.view(np.uint8).data)
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200, body[:500]
    header_length = int(response.getheader("Inference-Header-Content-Length", "0"))
    assert np.array_equal(np.frombuffer(body, np.float32, offset=header_length), data)


# idle -----------------------------------------------------------------------------------------------------------


def test_an_idle_server_sleeps(server: Serve) -> None:
    """While nothing happens no process spends CPU, and instances and listeners do not wake up at all."""
    core, worker = core_and_worker(server)
    me = os.getpid()
    threads = pyserve_threads()
    assert len(threads) >= 2, "expected the thread instance and its cancel listener"
    time.sleep(1.0)  # settle after start-up

    # The core and worker processes are pyserve's alone; in this process only pyserve's threads are counted (pytest
    # and what earlier tests left behind share it).
    def spent() -> dict[str, float]:
        return {"core": cpu_seconds(core), "worker": cpu_seconds(worker), "threads": threads_cpu_seconds(me, threads)}

    cpu_before = spent()
    wakeups_before = (wakeups(worker), wakeups(me, threads))
    started = time.monotonic()
    time.sleep(3.0)
    elapsed = time.monotonic() - started
    cpu_after = spent()
    usage = {name: (cpu_after[name] - cpu_before[name]) / elapsed for name in cpu_before}
    assert usage["core"] <= IDLE_CPU_LIMIT, f"idle core process used {usage['core']:.2%} CPU"
    assert usage["worker"] <= IDLE_CPU_LIMIT, f"idle worker process used {usage['worker']:.2%} CPU"
    assert usage["threads"] <= IDLE_CPU_LIMIT, f"idle pyserve threads of this process used {usage['threads']:.2%} CPU"
    # Before, each instance and listener woke every 100 ms to look at its stop flag: 10 wake-ups a second each.
    worker_wakeups = wakeups(worker) - wakeups_before[0]
    thread_wakeups = wakeups(me, threads) - wakeups_before[1]
    assert worker_wakeups <= 2, f"the idle worker process woke up {worker_wakeups} times in {elapsed:.1f} s"
    assert thread_wakeups <= 2, f"idle pyserve threads of this process woke up {thread_wakeups} times"


def test_serve_sleeps_until_sigterm() -> None:
    """serve() blocks without polling the core, and SIGTERM still ends it (then it stops the server)."""
    own = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    own.bind("sleeper", identity, FP32_IN, FP32_OUT)
    own.run()
    main = threading.main_thread().native_id
    assert threading.current_thread() is threading.main_thread() and main is not None
    default = signal.getsignal(signal.SIGTERM)
    measured: list[int] = []

    def terminate_when_serving() -> None:
        deadline = time.monotonic() + 10
        while signal.getsignal(signal.SIGTERM) is default:  # serve() has not installed its handler yet
            if time.monotonic() > deadline:
                return  # never send SIGTERM unhandled: the test fails on serve() not returning instead
            time.sleep(0.01)
        time.sleep(0.3)
        before = wakeups(os.getpid(), [main])
        time.sleep(1.0)
        measured.append(wakeups(os.getpid(), [main]) - before)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=terminate_when_serving)
    try:
        sender.start()
        own.serve()
    finally:
        sender.join(15)
        own.stop()
    assert not own.is_running
    assert signal.getsignal(signal.SIGTERM) is default
    assert measured and measured[0] <= 1, f"serve() woke up {measured} times in 1 s while waiting"


# memory ---------------------------------------------------------------------------------------------------------


def give_back_free_heap() -> None:
    """Collect garbage and return this process's free malloc heap to the system (glibc), so that its RSS counts what
    is still referenced. After a large block is freed glibc raises its mmap threshold (up to 32 MiB), and what this
    busy test process (pytest, earlier tests' threads) allocates afterwards may stay mapped though free."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: RSS as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def test_memory_is_given_back_after_a_large_request(server: Serve) -> None:
    core, worker = core_and_worker(server)
    me = os.getpid()
    session = server._session
    data = np.arange(LARGE_REQUEST_BYTES // 4, dtype=np.float32)
    connections = {
        model: http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
        for model in ("thread_identity", "process_identity")
    }
    try:
        # Warm up with 1 MiB so what is kept for small and medium requests is part of the baseline.
        for model, conn in connections.items():
            infer_large(conn, model, data[: MIB // 4])
        give_back_free_heap()
        baseline = {pid: rss_bytes(pid) for pid in (core, worker, me)}
        shm_baseline = shm_bytes(session)
        for model, conn in connections.items():
            infer_large(conn, model, data)
        del data
        # The keep-alive connections stay open: they must not hold the large bodies either.
        time.sleep(0.5)
        give_back_free_heap()  # this process only: the others' RSS is measured as they left it
        grown = {pid: (rss_bytes(pid) - baseline[pid]) / MIB for pid in baseline}
        shm_grown = (shm_bytes(session) - shm_baseline) / MIB
    finally:
        for conn in connections.values():
            conn.close()
    # Before, the core kept the last request body and both pools kept their 128 MiB slots until stop().
    assert grown[core] < 32, f"the core process kept {grown[core]:.0f} MiB after two 128 MiB requests"
    assert grown[worker] < 32, f"the worker process kept {grown[worker]:.0f} MiB after a 128 MiB request"
    assert grown[me] < 32, f"this process (thread instance) kept {grown[me]:.0f} MiB after a 128 MiB request"
    assert shm_grown < 8, f"the session's shared memory grew by {shm_grown:.0f} MiB"


# limits ---------------------------------------------------------------------------------------------------------


def request_head(port: int, content_length: int) -> bytes:
    return (
        f"POST /v2/models/thread_identity/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Length: {content_length}\r\nInference-Header-Content-Length: 0\r\n\r\n"
    ).encode()


def read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_body_over_the_limit_is_refused_from_its_headers(server: Serve) -> None:
    too_large = server.config.max_request_bytes + 1
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=2) as sock:
        started = time.monotonic()
        sock.sendall(request_head(server.http_port, too_large))  # and no body
        answer = read_until_closed(sock)  # the server answers and closes without waiting for the body
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"connection: close" in answer.lower()
    assert str(server.config.max_request_bytes).encode() in answer
    assert elapsed < 1.0


def test_a_client_sending_its_body_anyway_still_reads_the_413(server: Serve) -> None:
    # The server reads and drops what follows instead of closing on unread data, which would reset the connection.
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=5) as sock:
        sock.sendall(request_head(server.http_port, server.config.max_request_bytes + 1))
        for _ in range(16):
            sock.sendall(bytes(MIB))
        sock.shutdown(socket.SHUT_WR)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


# parent death ---------------------------------------------------------------------------------------------------


def test_process_instances_exit_when_the_core_is_killed() -> None:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    s.bind("orphan", Identity, FP32_IN, FP32_OUT, ModelConfig(worker="process"))
    try:
        s.run()
        core, worker = core_and_worker(s)
        os.kill(core, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "the worker process outlived its killed core"
        stopping = time.monotonic()
    finally:
        s.stop()
    assert time.monotonic() - stopping < 2.0, "stop() was slow after the core died"


def test_serve_stops_and_cleans_up_when_its_core_dies(caplog: pytest.LogCaptureFixture) -> None:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    s.bind("orphan", Identity, FP32_IN, FP32_OUT, ModelConfig(worker="process"))
    s.bind("thread_model", Identity, FP32_IN, FP32_OUT)
    try:
        s.run()
        core, worker = core_and_worker(s)
        session = s._session
        os.kill(core, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while s._core is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not s.is_running and s._core is None, "Serve did not notice its core died"
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "the worker process outlived its killed core"
        assert not [name for name in os.listdir("/dev/shm") if name.startswith(session)]
        assert any("exited unexpectedly (killed by SIGKILL)" in r.getMessage() for r in caplog.records)
        # It can be started again.
        s.run()
        assert s.is_running
    finally:
        s.stop()


def test_process_instances_leave_nothing_after_stop() -> None:
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    s.bind("procs", Identity, FP32_IN, FP32_OUT, ModelConfig(worker="process", instances=2))
    s.run()
    session = s._session
    assert s._core is not None
    workers = children_of(s._core.pid)
    assert len(workers) == 2
    with ModelClient(s.url, "procs") as client:  # a large tensor: the instances' shared-memory pools are used
        client.infer_sample(INPUT0=np.ones(1 << 20, np.float32))
    assert [name for name in os.listdir("/dev/shm") if name.startswith(session)]
    s.stop()
    assert not [pid for pid in workers if alive(pid)]
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(session)]
