"""Fixtures for integration tests: one real server on loopback with a model of every kind, clients to reach it.

Most tests share the session's ``server`` (started once, stopped at the end). Tests that need their own server
(lifecycle, limits) start it themselves with ``ServeConfig(http_port=0, grpc_port=0, metrics_port=0)`` so ports
never clash.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from pyserve import DynamicBatcher, ModelConfig, Request, Serve, ServeConfig, Tensor, batch

# KServe datatype -> the dtype a model declares for it.
DTYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": "bfloat16",
    "BYTES": bytes,
}
MAX_BATCH = 16
# Request headers for RawHttp; a None value leaves that header out.
Headers = dict[str, str | None]


# models -------------------------------------------------------------------------------------------------------


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def cast_to_fp32(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [
        {"HALF_AS_FP32": r["HALF"].astype(np.float32), "BF16_AS_FP32": r["BF16"].astype(np.float32)} for r in requests
    ]


@batch
def add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def times_ten(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"] * 10} for request in requests]


def raise_on_negative(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    for request in requests:
        if (request["INPUT0"] < 0).any():
            raise ValueError(f"negative input seen: {float(request['INPUT0'].min())}")
    return identity(requests)


def wrong_dtype(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"].astype(np.float64)} for request in requests]


def wrong_shape(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": np.zeros((len(request["INPUT0"]), 4), np.float32)} for request in requests]


def add_optional(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    out = []
    for request in requests:
        total = request["INPUT0"].copy()
        if "INPUT1" in request:
            total += request["INPUT1"]
        out.append({"OUTPUT0": total, "HAD_INPUT1": np.full((len(total), 1), "INPUT1" in request)})
    return out


@batch
def multi_output(INPUT0: np.ndarray) -> dict[str, np.ndarray]:
    text = np.array([[f"sum={row.sum():g}".encode()] for row in INPUT0], dtype=object)
    return {"PLUS_ONE": INPUT0 + 1, "TIMES_TWO": INPUT0 * 2, "NEGATED": -INPUT0, "TEXT": text}


def echo_parameters(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [
        {
            "OUTPUT0": request["INPUT0"],
            "PARAMETERS": np.array([orjson.dumps(request.parameters, option=orjson.OPT_SORT_KEYS)], dtype=object),
            "REQUEST_ID": np.array([request.id.encode()], dtype=object),
        }
        for request in requests
    ]


def sleep_then_identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    time.sleep(max(float(request.parameters.get("sleep_s", 0.0)) for request in requests))
    return identity(requests)


def stream_twice(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for step in range(2):
        yield [{"OUTPUT0": request["INPUT0"] + step} for request in requests]


def serve_in_thread(server: Any, timeout_s: float = 30.0) -> tuple[threading.Thread, list[BaseException]]:
    """``server.serve()`` (a ``Serve`` or ``RemoteServe``) blocking in a thread of its own, as PyTriton code runs it;
    returns once the server runs (or ``timeout_s`` passed). What ``serve()`` raised, which would otherwise reach the
    thread's excepthook, collects in the list."""
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            server.serve()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.is_running and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread, errors


def fp32(name: str, shape: tuple[int, ...] = (-1,), optional: bool = False) -> Tensor:
    return Tensor(name=name, dtype=np.float32, shape=shape, optional=optional)


def bind_test_models(s: Serve) -> None:
    """Bind every model the shared server serves."""
    batching = ModelConfig(max_batch_size=MAX_BATCH)
    for datatype, dtype in DTYPES.items():
        s.bind(
            f"identity_{datatype.lower()}",
            identity,
            inputs=[Tensor("INPUT0", dtype, (-1,))],
            outputs=[Tensor("OUTPUT0", dtype, (-1,))],
            config=batching,
        )
    s.bind(
        "cast_fp32",
        cast_to_fp32,
        inputs=[Tensor("HALF", np.float16, (-1,)), Tensor("BF16", "bfloat16", (-1,))],
        outputs=[fp32("HALF_AS_FP32"), fp32("BF16_AS_FP32")],
        config=batching,
    )
    s.bind(
        "add_sub",
        add_sub,
        inputs=[fp32("INPUT0"), fp32("INPUT1")],
        outputs=[fp32("OUTPUT0"), fp32("OUTPUT1")],
        config=ModelConfig(
            max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=100, preferred_batch_size=(64,))
        ),
    )
    s.bind(
        "no_batch",
        times_ten,
        inputs=[Tensor("INPUT0", np.int32, (2, 3))],
        outputs=[Tensor("OUTPUT0", np.int32, (2, 3))],
        config=ModelConfig(max_batch_size=0),
    )
    s.bind("raises", raise_on_negative, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0")], config=batching)
    s.bind(
        "strict_dtype", wrong_dtype, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0")], config=batching, strict=True
    )
    s.bind(
        "strict_shape",
        wrong_shape,
        inputs=[fp32("INPUT0")],
        outputs=[fp32("OUTPUT0", (3,))],
        config=batching,
        strict=True,
    )
    s.bind(
        "optional",
        add_optional,
        inputs=[fp32("INPUT0"), fp32("INPUT1", optional=True)],
        outputs=[fp32("OUTPUT0"), Tensor("HAD_INPUT1", np.bool_, (1,))],
        config=batching,
    )
    s.bind(
        "multi",
        multi_output,
        inputs=[fp32("INPUT0")],
        outputs=[fp32("PLUS_ONE"), fp32("TIMES_TWO"), fp32("NEGATED"), Tensor("TEXT", bytes, (1,))],
        config=batching,
    )
    s.bind(
        "echo_parameters",
        echo_parameters,
        inputs=[fp32("INPUT0")],
        outputs=[fp32("OUTPUT0"), Tensor("PARAMETERS", bytes, (1,)), Tensor("REQUEST_ID", bytes, (1,))],
    )
    s.bind(
        "decoupled",
        stream_twice,
        inputs=[fp32("INPUT0")],
        outputs=[fp32("OUTPUT0")],
        config=ModelConfig(max_batch_size=MAX_BATCH, decoupled=True),
    )
    # Models only one test uses, so their statistics and load are that test's own.
    s.bind("stats_identity", identity, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0")], config=batching)
    s.bind("local_identity", identity, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0")], config=batching)
    s.bind(
        "pa_identity",
        identity,
        inputs=[fp32("INPUT0")],
        outputs=[fp32("OUTPUT0")],
        config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=100)),
    )
    s.bind("slow", sleep_then_identity, inputs=[fp32("INPUT0")], outputs=[fp32("OUTPUT0")], config=batching)
    s.bind(
        "large_fp32",
        identity,
        inputs=[fp32("INPUT0")],
        outputs=[fp32("OUTPUT0")],
        config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)),
    )


# fixtures -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def server() -> Iterator[Serve]:
    """One running server with every test model, shared by the session."""
    s = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    bind_test_models(s)
    try:
        s.run()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def client(server: Serve) -> Iterator[triton_http.InferenceServerClient]:
    """Triton's own HTTP client, pointed at the shared server."""
    c = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0)
    yield c
    c.close()


@pytest.fixture(scope="session")
def grpc_client(server: Serve) -> Iterator[triton_grpc.InferenceServerClient]:
    """Triton's own gRPC client, pointed at the shared server."""
    c = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield c
    c.close()


def triton_http_for(server: Serve, **options: Any) -> triton_http.InferenceServerClient:
    """Triton's HTTP client for a server a test module starts itself (``with`` closes it); ``options`` are the
    client's."""
    return triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0, **options)


def triton_grpc_for(server: Serve) -> triton_grpc.InferenceServerClient:
    """Triton's gRPC client for a server a test module starts itself (``with`` closes it)."""
    return triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


@dataclasses.dataclass
class RawResponse:
    """One HTTP response as read off the socket (header names lower-cased)."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class RawHttp:
    """Plain-socket HTTP/1.1, so tests control every byte sent and see every byte answered."""

    def __init__(self, port: int) -> None:
        self.port = port

    @staticmethod
    def build_request(method: str, path: str, body: bytes = b"", headers: Headers | None = None) -> bytes:
        """The bytes of one request; Content-Length is set unless ``headers`` replaces it."""
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
        all_headers: dict[str, str | None] = {"Content-Length": str(len(body))} if body or method == "POST" else {}
        all_headers.update(headers or {})
        lines += [f"{name}: {value}" for name, value in all_headers.items() if value is not None]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def connect(self) -> RawConnection:
        return RawConnection(self.port)

    def request(self, method: str, path: str, body: bytes = b"", headers: Headers | None = None) -> RawResponse:
        """One request with a content-length body on a new connection; the final response."""
        with self.connect() as conn:
            conn.sendall(self.build_request(method, path, body, headers))
            return conn.read_response()

    def infer(self, model: str, doc: Any, binary: bytes = b"", headers: Headers | None = None) -> RawResponse:
        """POST an infer request: JSON header plus optional binary tensor data."""
        header = orjson.dumps(doc)
        extra = dict(headers or {})
        if binary:
            extra.setdefault("Inference-Header-Content-Length", str(len(header)))
        return self.request("POST", f"/v2/models/{model}/infer", header + binary, extra)


class RawConnection:
    """One keep-alive connection: send any bytes, read responses one at a time in order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = self.sock.makefile("rb")

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_response(self) -> RawResponse:
        status_line = self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection without a response")
        version, status, *_ = status_line.decode("latin-1").split(" ", 2)
        assert version == "HTTP/1.1", status_line
        headers: dict[str, str] = {}
        while True:
            line = self.reader.readline().decode("latin-1").rstrip("\r\n")
            if not line:
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        code = int(status)
        if code < 200:
            return RawResponse(code, headers, b"")
        length = int(headers.get("content-length", "0"))
        body = self.reader.read(length)
        assert len(body) == length, f"response body cut short: {len(body)} of {length} bytes"
        return RawResponse(code, headers, body)

    def is_closed_by_peer(self) -> bool:
        """True when the server has closed its side (reading gives EOF)."""
        self.sock.settimeout(2)
        try:
            return self.reader.read(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


@pytest.fixture(scope="session")
def raw_http(server: Serve) -> RawHttp:
    """Raw HTTP access to the shared server."""
    return RawHttp(server.http_port)


@pytest.fixture(scope="session")
def raw_http_for() -> type[RawHttp]:
    """RawHttp itself, for tests that start their own server: ``raw_http_for(port)``."""
    return RawHttp


def find_perf_analyzer(repo_root: Path) -> str | None:
    """$PERF_ANALYZER, else <repo>/.tools/pa/perf_analyzer, else perf_analyzer on PATH: the first that runs."""
    candidates = [os.environ.get("PERF_ANALYZER"), str(repo_root / ".tools" / "pa" / "perf_analyzer")]
    candidates.append(shutil.which("perf_analyzer"))
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        try:
            probe = subprocess.run([candidate, "--version"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return candidate
    return None


def run_perf_analyzer(
    perf_analyzer: str,
    port: int,
    model: str,
    *options: str,
    protocol: str = "http",
    shape: str = "INPUT0:16",
    concurrency: tuple[int, ...] = (1, 4),
) -> str:
    """Run perf_analyzer as a smoke test against ``127.0.0.1:port`` at each of ``concurrency`` (one value, or the
    first and last of a range); assert that it ran clean and measured each one; return its output."""
    first, last = concurrency[0], concurrency[-1]
    command = [
        perf_analyzer,
        *("-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol, "--shape", shape),
        *("--concurrency-range", str(first) if first == last else f"{first}:{last}:{last - first}"),
        *("--measurement-interval", "500", "--max-trials", "6"),
        # A smoke test, not a benchmark: any three windows count as stable, so a busy machine cannot fail it.
        *("--stability-percentage", "1000"),
        *options,
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert not re.search(r"error|fail|unable", output, re.IGNORECASE), output
    for each in concurrency:
        assert f"Concurrency: {each}, throughput:" in output, output
    return output


@pytest.fixture(scope="session")
def perf_analyzer(repo_root: Path) -> str:
    """Triton's load generator; tests that need it skip with the reason where it cannot run — except in CI
    (``CI=true``), where a missing perf_analyzer fails them: scripts/test.sh installs it, so its absence is a broken
    set-up, not a platform without it (``PYSERVE_ALLOW_NO_PERF_ANALYZER=1`` says it is one)."""
    found = find_perf_analyzer(repo_root)
    if found is None:
        reason = "perf_analyzer not found or not runnable: set $PERF_ANALYZER, or install it at .tools/pa/"
        if os.environ.get("CI") == "true" and os.environ.get("PYSERVE_ALLOW_NO_PERF_ANALYZER") != "1":
            pytest.fail(f"{reason} (CI installs it: scripts/install-perf-analyzer.sh)")
        pytest.skip(reason)
    return found
