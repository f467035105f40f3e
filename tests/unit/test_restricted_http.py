"""The HTTP front end's router with restricted groups, on a fake core: every route of a restricted group wants its
header before anything else, the others are untouched; and a 503 says when to retry (``Retry-After``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, ServeConfig, Tensor
from pyserve.config import ModelSpec
from pyserve.core.api import CoreApi
from pyserve.core.inference import InferenceRequest, Instance, ModelEntry
from pyserve.core.logs import log_settings
from pyserve.core.registry import Registry
from pyserve.core.shm_regions import SharedMemoryRegistry
from pyserve.core.tracing import Tracing
from pyserve.errors import ModelNotReadyError, QueueFullError, UnsupportedError
from pyserve.frontends.http import HttpApp
from pyserve.frontends.http_connection import HttpProtocol
from pyserve.frontends.http_routes import ROUTES
from pyserve.server_config import RESTRICTED_GROUPS

SECRET = "s3cret"
PATH_VALUES = {"model": "identity", "version": "1", "region": "r0"}
INFER_BODY = b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}'


class RecordingTransport:
    def __init__(self) -> None:
        self.written = bytearray()

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


class NoRepository:
    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return []

    async def request_load(self, name: str, config: str | None, files: Mapping[str, bytes]) -> None:
        raise UnsupportedError("no model repository")

    async def request_unload(self, name: str, unload_dependents: bool = False) -> None:
        raise UnsupportedError("no model repository")


def make_app(submit: Callable[[InferenceRequest], None] = lambda request: None, **settings: Any) -> HttpApp:
    models = Registry()
    tensors = (Tensor("INPUT0", np.float32, (-1,)),), (Tensor("OUTPUT0", np.float32, (-1,)),)
    entry = ModelEntry(ModelSpec("identity", 1, *tensors, ModelConfig()))
    entry.instances.append(Instance(b"i", 0, "thread", 1))
    models.add(entry)
    config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0, **settings)
    core = CoreApi(
        submit=submit,
        cancel=lambda request: None,
        is_ready=lambda: True,
        models=models,
        tracing=Tracing(config),
        logs=log_settings(),
        metrics_page=lambda: b"",
        repository=NoRepository(),
        shared_memory=SharedMemoryRegistry(),
        remote_address="tcp://127.0.0.1:8005",
    )
    return HttpApp(core, config)


async def answer(app: HttpApp, method: str, path: str, headers: Mapping[str, str] = {}, body: bytes = b"") -> bytes:
    """The response's head and body ("" while the request waits for the core)."""
    conn = HttpProtocol(app)
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    lines = [f"{method} {path} HTTP/1.1", "host: test", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    conn.data_received("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
    for _ in range(3):  # the repository calls answer from a task
        await asyncio.sleep(0)
    return bytes(transport.written)


def status(response: bytes) -> int:
    head = response.split(b"\r\n", 1)[0]
    return int(head.split()[1]) if head else 0


@pytest.mark.parametrize("group", RESTRICTED_GROUPS)
def test_each_route_of_a_restricted_group_wants_its_header_and_the_others_do_not(group: str) -> None:
    async def check() -> None:
        app = make_app(http_restricted_api=(f"{group}:Admin-Key={SECRET}",))
        for route in ROUTES:
            path = route.template.format(**PATH_VALUES)
            for method in route.methods:
                refused = await answer(app, method, path)
                if route.group != group:
                    assert status(refused) != 403, (method, path)
                    continue
                assert status(refused) == 403, (method, path)
                assert b"This API is restricted, expecting header 'admin-key'" in refused
                assert SECRET.encode() not in refused
                for wrong in ("", "s3cre", "S3CRET", SECRET + " x"):
                    assert status(await answer(app, method, path, {"admin-key": wrong})) == 403, (method, path)
                allowed = await answer(app, method, path, {"ADMIN-KEY": SECRET}, INFER_BODY)
                assert status(allowed) != 403, (method, path)
            # Before the method is looked at, as in Triton.
            if route.group == group:
                assert status(await answer(app, "PUT", path)) == 403
                assert status(await answer(app, "PUT", path, {"admin-key": SECRET})) == 405

    asyncio.run(check())


def test_the_old_restricted_api_restricts_the_shared_memory_routes() -> None:
    async def check() -> None:
        app = make_app(restricted_api=f"shared-memory:admin-key={SECRET}")
        assert status(await answer(app, "GET", "/v2/systemsharedmemory/status")) == 403
        assert status(await answer(app, "GET", "/v2/cudasharedmemory/status", {"admin-key": SECRET})) == 200
        assert status(await answer(app, "GET", "/v2/models/stats")) == 200

    asyncio.run(check())


@pytest.mark.parametrize(
    "refusal",
    [
        QueueFullError("model 'identity' version 1: request exceeds maximum queue size 1"),
        ModelNotReadyError("the server is shutting down: it takes no new requests"),
    ],
)
def test_a_503_says_when_to_retry(refusal: Exception) -> None:
    def submit(request: InferenceRequest) -> None:
        raise refusal

    async def check() -> None:
        app = make_app(submit)
        response = await answer(app, "POST", "/v2/models/identity/infer", body=INFER_BODY)
        head = response.split(b"\r\n\r\n", 1)[0].lower()
        assert status(response) == 503
        assert b"\r\nretry-after: 1\r\n" in head + b"\r\n"
        # Other errors do not.
        other = await answer(app, "POST", "/v2/models/nonesuch/infer", body=INFER_BODY)
        assert status(other) == 404 and b"retry-after" not in other.lower()

    asyncio.run(check())
