"""docs/openapi.yaml describes exactly the routes the HTTP front end answers: the same paths and methods as
``pyserve.frontends.http_routes.ROUTES``, which the router is built from; every listed method reaches its handler
and no other method or path does."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import yaml

from pyserve import ModelConfig, ServeConfig, Tensor
from pyserve.config import ModelSpec
from pyserve.core.api import CoreApi
from pyserve.core.inference import Instance, ModelEntry
from pyserve.core.logs import log_settings
from pyserve.core.registry import Registry
from pyserve.core.shm_regions import SharedMemoryRegistry
from pyserve.core.tracing import Tracing
from pyserve.errors import UnsupportedError
from pyserve.frontends.http import HttpApp
from pyserve.frontends.http_connection import HttpProtocol
from pyserve.frontends.http_routes import ROUTES
from pyserve.frontends.metrics_endpoint import MetricsApp

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# Values for path parameters: a model the fake core knows, its version, a region name.
EXAMPLES = {"model": "identity", "version": "1", "region": "r0"}


@pytest.fixture(scope="module")
def document(repo_root: Any) -> dict[str, Any]:
    with open(repo_root / "docs" / "openapi.yaml", encoding="utf-8") as file:
        doc: dict[str, Any] = yaml.safe_load(file)
    return doc


def documented(doc: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in doc["paths"].items() for method in item if method in METHODS}


def test_the_document_is_openapi_3_with_the_protocol_version(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.")
    assert document["info"]["version"] == "2"
    assert document["servers"][0]["url"].endswith(":8000")


def test_the_document_lists_every_route_and_nothing_else(document: dict[str, Any]) -> None:
    routed = {(method, route.template) for route in ROUTES for method in route.methods}
    api = {(method, path) for method, path in documented(document) if path != "/metrics"}  # /metrics: its own port
    assert sorted(routed - api) == [], "routes missing from docs/openapi.yaml"
    assert sorted(api - routed) == [], "documented paths the server does not route"


def test_the_metrics_page_is_documented_on_its_own_port(document: dict[str, Any]) -> None:
    routed = {(method, route.template) for route in ROUTES for method in route.methods}
    assert documented(document) - routed == {("GET", "/metrics")}
    assert document["paths"]["/metrics"]["servers"][0]["url"].endswith(":8002")


def test_each_path_declares_its_parameters(document: dict[str, Any]) -> None:
    parameters = document["components"]["parameters"]

    def names(entries: list[dict[str, Any]]) -> set[str]:
        resolved = [parameters[e["$ref"].rsplit("/", 1)[-1]] if "$ref" in e else e for e in entries]
        return {p["name"] for p in resolved if p["in"] == "path"}

    for path, item in document["paths"].items():
        in_template = set(re.findall(r"\{(\w+)\}", path))
        assert names(item.get("parameters", [])) == in_template, path
        for method in METHODS:
            if method in item:
                assert not names(item[method].get("parameters", [])), f"{method} {path}: path parameters per path"
                assert {"200", "302"} & set(item[method]["responses"]), f"{method} {path}"


# The router answers what the table says ---------------------------------------------------------------------


class RecordingTransport:
    """Stands in for a connection's transport: keeps what is written."""

    def __init__(self) -> None:
        self.written = bytearray()

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


class NoRepository:
    """Load and unload are refused, as on a server without a model repository."""

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return []

    async def request_load(self, name: str, config: str | None, files: Mapping[str, bytes]) -> None:
        raise UnsupportedError("no model repository")

    async def request_unload(self, name: str, unload_dependents: bool = False) -> None:
        raise UnsupportedError("no model repository")


def make_app() -> HttpApp:
    models = Registry()
    spec = ModelSpec(
        "identity", 1, (Tensor("INPUT0", np.float32, (-1,)),), (Tensor("OUTPUT0", np.float32, (-1,)),), ModelConfig()
    )
    entry = ModelEntry(spec)
    entry.instances.append(Instance(b"i", 0, "thread", 1))
    models.add(entry)
    config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0)
    core = CoreApi(
        submit=lambda request: None,
        cancel=lambda request: None,
        is_ready=lambda: True,
        models=models,
        tracing=Tracing(config),
        logs=log_settings(),
        metrics_page=lambda: b"",
        repository=NoRepository(),
        shared_memory=SharedMemoryRegistry(),
        remote_address="tcp://127.0.0.1:8005",  # a remote port is open (else its route answers 404)
    )
    return HttpApp(core, config)


async def status_of(app: Any, method: str, path: str) -> int:
    conn = HttpProtocol(app)
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(f"{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n".encode())
    for _ in range(3):  # the repository calls answer from a task
        await asyncio.sleep(0)
    head = bytes(transport.written).split(b"\r\n", 1)[0]
    return int(head.split()[1]) if head else 0  # 0: not answered yet (an infer request waits for the core)


def concrete(template: str) -> str:
    return template.format(**EXAMPLES)


def test_each_documented_method_reaches_its_handler_and_no_other_does(document: dict[str, Any]) -> None:
    async def check() -> None:
        app = make_app()
        for method, path in sorted(documented(document)):
            if path == "/metrics":
                continue
            status = await status_of(app, method, concrete(path))
            assert status not in (404, 405), (method, path, status)
            for other in ("GET", "POST", "PUT", "DELETE"):
                if (other, path) not in documented(document):
                    assert await status_of(app, other, concrete(path)) == 405, (other, path)
            assert await status_of(app, method, concrete(path) + "/nonsense") == 404, (method, path)

    asyncio.run(check())


def test_the_metrics_app_answers_only_its_documented_path(document: dict[str, Any]) -> None:
    async def check() -> None:
        app = MetricsApp(make_app().core, ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
        assert await status_of(app, "GET", "/metrics") == 200
        assert await status_of(app, "GET", "/v2") == 404

    asyncio.run(check())
