"""The HTTP front end against a ``CoreApi`` built from fakes: no core, no worker, no socket.

Front ends see the core only through ``pyserve.core.api.CoreApi``; these tests drive ``HttpApp`` through one
connection (``HttpProtocol`` over a recording transport) and play the core's part by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from pyserve import ModelConfig, ServeConfig, Tensor
from pyserve.config import ModelSpec
from pyserve.core.api import CoreApi
from pyserve.core.inference import InferenceRequest, InferenceResponse, Instance, ModelEntry, OutputTensor
from pyserve.core.logs import log_settings
from pyserve.core.registry import Registry
from pyserve.core.shm_regions import SharedMemoryRegistry
from pyserve.core.tracing import Tracing
from pyserve.errors import UnsupportedError
from pyserve.frontends.http import HttpApp
from pyserve.frontends.http_connection import HttpProtocol


class RecordingTransport:
    """Stands in for the connection's asyncio transport: keeps what is written."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False


class FakeRepository:
    """A repository without models of its own: the index lists the bound ones; load and unload are refused."""

    def __init__(self, models: Registry) -> None:
        self.models = models

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [entry.index_entry() for entry in self.models.entries()]

    async def request_load(self, name: str, config: str | None, files: Mapping[str, bytes]) -> None:
        raise UnsupportedError(f"cannot load '{name}' here")

    async def request_unload(self, name: str, unload_dependents: bool = False) -> None:
        raise UnsupportedError(f"cannot unload '{name}' here")


class FakeCore:
    """The core's side of the interface: requests submitted and cancelled are kept, readiness is a switch."""

    def __init__(self) -> None:
        self.models = Registry()
        self.ready = False
        self.submitted: list[InferenceRequest] = []
        self.cancelled: list[InferenceRequest] = []
        config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0)
        self.api = CoreApi(
            submit=self.submitted.append,
            cancel=self.cancelled.append,
            is_ready=lambda: self.ready,
            models=self.models,
            tracing=Tracing(config),
            logs=log_settings(),
            metrics_page=lambda: b"",
            repository=FakeRepository(self.models),
            shared_memory=SharedMemoryRegistry(),
        )
        self.app = HttpApp(self.api, config)

    def add_identity(self) -> ModelEntry:
        tensor = Tensor("INPUT0", np.float32, (-1,))
        entry = ModelEntry(ModelSpec("identity", 1, (tensor,), (Tensor("OUTPUT0", np.float32, (-1,)),), ModelConfig()))
        entry.instances.append(Instance(b"i", 0, "thread", 1))
        self.models.add(entry)
        return entry

    def connect(self) -> tuple[HttpProtocol, RecordingTransport]:
        conn = HttpProtocol(self.app)
        transport = RecordingTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        return conn, transport


def http_request(method: str, path: str, body: bytes = b"") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


def status_and_body(written: bytes) -> tuple[int, Any]:
    head, _, body = bytes(written).partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body) if body else None


def infer_body() -> bytes:
    return orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]})


def test_readiness_is_the_cores_answer() -> None:
    core = FakeCore()
    conn, transport = core.connect()
    conn.data_received(http_request("GET", "/v2/health/ready"))
    assert status_and_body(transport.written)[0] == 400
    core.ready = True
    conn, transport = core.connect()
    conn.data_received(http_request("GET", "/v2/health/ready"))
    assert status_and_body(transport.written)[0] == 200


def test_an_infer_request_is_submitted_and_answered_from_its_callback() -> None:
    core = FakeCore()
    core.add_identity()
    conn, transport = core.connect()
    conn.data_received(http_request("POST", "/v2/models/identity/infer", infer_body()))
    assert not transport.written  # nothing until the core answers
    [request] = core.submitted
    assert request.model.name == "identity"
    assert request.inputs["INPUT0"].data.tolist() == [1.0, 2.0, 3.0]
    output = np.array([1, 2, 3], dtype=np.float32)
    request.on_response(request, InferenceResponse([OutputTensor("OUTPUT0", "FP32", [3], memoryview(output))]))
    status, body = status_and_body(transport.written)
    assert status == 200
    assert body["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [3], "data": [1.0, 2.0, 3.0]}]


def test_a_closed_connection_cancels_its_request_in_flight() -> None:
    core = FakeCore()
    core.add_identity()
    conn, _ = core.connect()
    conn.data_received(http_request("POST", "/v2/models/identity/infer", infer_body()))
    conn.connection_lost(None)
    assert core.cancelled == core.submitted


def test_an_unknown_model_is_404_and_never_reaches_the_core() -> None:
    core = FakeCore()
    conn, transport = core.connect()
    conn.data_received(http_request("POST", "/v2/models/missing/infer", infer_body()))
    status, body = status_and_body(transport.written)
    assert status == 404 and "missing" in body["error"]
    assert not core.submitted
