"""Custom JSON routes (``Serve.route``) and the KServe v2 ASGI app (``Serve.asgi_app``), on real servers."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor, batch
from pyserve.errors import ConfigError, InvalidInputError, ServerError

pytest.importorskip("starlette", reason="custom routes need Starlette and uvicorn: pip install 'pyserve[routes]'")
pytest.importorskip("uvicorn", reason="custom routes need Starlette and uvicorn: pip install 'pyserve[routes]'")

pytestmark = pytest.mark.integration

PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0, "routes_port": 0}


@batch
def double(x: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(0.002)  # long enough for concurrent requests to queue up behind a batch
    if (x < 0).any():
        raise ValueError("negative input")
    return {"y": x * 2}


def count_to(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for step in range(int(requests[0]["n"][0])):
        yield [{"i": np.array([step], np.int32)}]


def bind_models(server: Serve) -> None:
    server.bind(
        "double",
        double,
        inputs=[Tensor("x", np.float32, (-1,))],
        outputs=[Tensor("y", np.float32, (-1,))],
        config=ModelConfig(max_batch_size=32),
    )
    server.bind(
        "count_to",
        count_to,
        inputs=[Tensor("n", np.int32, (1,))],
        outputs=[Tensor("i", np.int32, (1,))],
        config=ModelConfig(decoupled=True),
    )


def add_routes(server: Serve) -> None:
    @server.route("/predict", methods=["POST"])
    def predict(request: Any) -> dict[str, Any]:
        x = np.asarray(request.get_json()["x"], dtype=np.float32)[np.newaxis]
        return {"y": server.infer("double", {"x": x})["y"][0]}

    @server.route("/apredict/{model}", methods=["POST"])
    async def apredict(request: Any) -> dict[str, Any]:
        document = await request.json()
        if not isinstance(document.get("x"), list):
            raise InvalidInputError('expected {"x": [numbers]}')
        x = np.asarray(document["x"], dtype=np.float32)[np.newaxis]
        outputs = await server.ainfer(request.path_params["model"], {"x": x})
        return {"y": outputs["y"][0].tolist()}

    @server.route("/count", methods=["POST"])
    async def count(request: Any) -> AsyncIterator[dict[str, int]]:
        n = np.array([request.get_json()["n"]], np.int32)
        async for response in server.ainfer_stream("count_to", {"n": n}):
            yield {"i": int(response["i"][0])}

    @server.route("/broken")
    def broken(request: Any) -> Any:
        raise RuntimeError("the handler broke")


@pytest.fixture(scope="module")
def routed() -> Iterator[Serve]:
    with Serve(ServeConfig(**PORTS, max_request_bytes=64 * 1024)) as server:
        bind_models(server)
        add_routes(server)
        server.run()
        yield server


def request(target: Serve | int, method: str, path: str, document: Any = None) -> tuple[int, Any, str]:
    """(status, body as JSON or bytes, content type) from a server's routes port, or from a port."""
    port = target if isinstance(target, int) else target.routes_port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = None if document is None else (document if isinstance(document, bytes) else json.dumps(document))
        conn.request(method, path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        kind = response.getheader("content-type", "")
        return response.status, json.loads(data) if kind == "application/json" else data, kind
    finally:
        conn.close()


def test_routes_listen_once_the_server_runs(routed: Serve) -> None:
    assert routed.routes_port > 0
    assert routed.routes_url == f"http://127.0.0.1:{routed.routes_port}"
    assert request(routed, "POST", "/predict", {"x": [1, 2.5]})[:2] == (200, {"y": [2.0, 5.0]})
    assert request(routed, "POST", "/apredict/double", {"x": [3]})[:2] == (200, {"y": [6.0]})


def test_sync_handlers_in_many_threads_are_batched_together(routed: Serve) -> None:
    stats_before = _counts(routed)
    answers: list[Any] = []

    def client(value: float) -> None:
        for _ in range(10):
            answers.append(request(routed, "POST", "/predict", {"x": [value]})[1])

    threads = [threading.Thread(target=client, args=(float(i),)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answer["y"][0] for answer in answers) == sorted(2.0 * i for i in range(8) for _ in range(10))
    inferences, executions = (after - first for after, first in zip(_counts(routed), stats_before, strict=True))
    assert inferences == 80
    assert executions < inferences, "concurrent route calls should share batches"


def _counts(server: Serve) -> tuple[int, int]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    conn.request("GET", "/v2/models/double/stats")
    stats = json.loads(conn.getresponse().read())["model_stats"][0]
    conn.close()
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_an_async_generator_streams_server_sent_events(routed: Serve) -> None:
    status, body, kind = request(routed, "POST", "/count", {"n": 3})
    assert (status, kind) == (200, "text/event-stream; charset=utf-8")
    assert body == b'data: {"i":0}\n\ndata: {"i":1}\n\ndata: {"i":2}\n\n'


def test_errors_answer_with_pyserves_status_codes(routed: Serve, caplog: pytest.LogCaptureFixture) -> None:
    status, body, _ = request(routed, "POST", "/apredict/double", {"x": [-1]})
    assert status == 500 and "raised ValueError: negative input" in body["error"]  # the model's error
    assert request(routed, "POST", "/apredict/nope", {"x": [1]})[0] == 404  # unknown model
    assert request(routed, "POST", "/apredict/double", {"x": "text"})[:2] == (
        400,
        {"error": 'expected {"x": [numbers]}'},
    )
    assert request(routed, "POST", "/predict", b"{not json")[0] == 400
    assert request(routed, "POST", "/predict", b"x" * (64 * 1024 + 1))[0] == 413
    assert request(routed, "GET", "/nowhere")[:2] == (404, {"error": "not found: /nowhere"})
    with caplog.at_level("ERROR", logger="pyserve.routes.app"):
        status, body, _ = request(routed, "GET", "/broken")
    assert (status, body) == (500, {"error": "route /broken raised RuntimeError: the handler broke"})
    assert "RuntimeError: the handler broke" in caplog.text


def test_the_routes_port_serves_their_metrics(routed: Serve) -> None:
    request(routed, "GET", "/broken")
    status, body, kind = request(routed, "GET", "/metrics")
    assert status == 200 and kind.startswith("text/plain")
    page = body.decode()
    assert 'pyserve_route_requests{code="500",method="GET",route="/broken"}' in page
    assert 'pyserve_route_requests{code="200",method="POST",route="/predict"}' in page
    assert "pyserve_route_request_duration_ms_bucket" in page


def test_a_route_declared_on_a_running_server_is_served_at_once() -> None:
    with Serve(ServeConfig(**PORTS)) as server:
        bind_models(server)
        server.run()
        assert server.routes_port == 0  # no route: nothing listens
        assert "routes" not in server._endpoints()

        @server.route("/hello")
        def hello(request: Any) -> str:
            return "world"

        assert request(server, "GET", "/hello")[:2] == (200, "world")
        port = server.routes_port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_routes_port_in_use_fails_run() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = Serve(ServeConfig(**{**PORTS, "routes_port": taken.getsockname()[1]}))
        server.route("/x")(lambda request: {})
        with pytest.raises(ServerError, match="routes_port"), server:
            pass


def test_declaring_a_route_twice_is_a_config_error() -> None:
    server = Serve(ServeConfig(**PORTS))
    server.route("/x", methods=["POST"])(lambda request: {})
    with pytest.raises(ConfigError, match="already served"):
        server.route("/x", methods=["post"])(lambda request: {})


# the KServe v2 ASGI app -------------------------------------------------------------------------------------------


def test_the_asgi_app_mounted_in_an_application_serves_kserve_v2(routed: Serve) -> None:
    import tritonclient.http as triton_http
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def home(request: Any) -> PlainTextResponse:
        return PlainTextResponse("the application's own page")

    app = Starlette(routes=[Route("/", home), Mount("/kserve", routed.asgi_app())])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    user_server = uvicorn.Server(uvicorn.Config(app, port=port, log_config=None, lifespan="off"))
    thread = threading.Thread(target=user_server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not user_server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert request(port, "GET", "/")[1] == b"the application's own page"
        client = triton_http.InferenceServerClient(f"127.0.0.1:{port}/kserve")
        assert client.is_server_ready() and client.is_model_ready("double")
        assert client.get_model_metadata("double")["name"] == "double"
        x = np.array([[1, 2, 3]], np.float32)
        for binary in (True, False):
            inputs = [triton_http.InferInput("x", list(x.shape), "FP32")]
            inputs[0].set_data_from_numpy(x, binary_data=binary)
            outputs = [triton_http.InferRequestedOutput("y", binary_data=binary)]
            result = client.infer("double", inputs, outputs=outputs)
            np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        status, body, _ = request(port, "POST", "/kserve/v2/models/nope/infer", {"inputs": []})
        assert status == 404 and "nope" in body["error"]
        client.close()
    finally:
        user_server.should_exit = True
        thread.join(10)


def test_routes_answer_503_while_the_models_load() -> None:
    from pyserve.routes.server import ServedRoutes

    routes = ServedRoutes(ServeConfig(**PORTS))
    routes.declare("/x", ["GET"], lambda request: "here")
    routes.listen()  # what Serve.run() does once the core runs, before it loads the models
    try:
        status, body, _ = request(routes.port, "GET", "/x")
        assert status == 503 and "not ready" in body["error"]
        routes.ready()  # ... and once they are loaded
        assert request(routes.port, "GET", "/x")[:2] == (200, "here")
    finally:
        routes.stop()
    assert routes.port == 0
