"""The Flask route served by pyserve itself: ``python examples/from_flask/routes_app.py [--port 5000]``.

``@server.route("/predict", methods=["POST"])`` keeps Flask's endpoint, JSON and clients (``{"features": [...]}`` in,
``{"label": ..., "score": ...}`` out), with no Flask: uvicorn + Starlette serve it on ``ServeConfig.routes_port``
in this process, and the handler calls the ``classifier`` model (``pyserve_app.py``'s, bound here as it is there)
through ``await server.ainfer``, batched with every other request in flight. The KServe v2 endpoint stays available
on pyserve's HTTP port (``--http-port``).
"""

from __future__ import annotations

import argparse
from typing import Any

from model import parse_features
from pyserve_app import MODEL_NAME, bind
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from pyserve import Serve, ServeConfig
from pyserve.errors import InvalidInputError


def add_routes(server: Serve) -> None:
    """``POST /predict`` and ``GET /health``, answering as ``flask_app.py`` does."""

    @server.route("/predict", methods=["POST"])
    async def predict(request: Request) -> dict[str, Any]:
        try:
            features = parse_features(request.get_json())  # pyserve's Request reads JSON like Flask's
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None  # 400 {"error": ...}, as the Flask route answers
        outputs = await server.ainfer(MODEL_NAME, {"features": features})
        return {"label": outputs["label"][0, 0].decode(), "score": float(outputs["score"][0, 0])}

    @server.route("/health")
    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000, help="the routes' port (ServeConfig.routes_port)")
    parser.add_argument("--http-port", type=int, default=0, help="pyserve's KServe v2 HTTP port (default: any)")
    args = parser.parse_args()
    config = ServeConfig.from_env(
        host=args.host, routes_port=args.port, http_port=args.http_port, grpc_port=0, metrics_port=0
    )
    with Serve(config) as server:
        bind(server)
        add_routes(server)
        server.serve()  # says where it serves, the routes included, once they listen


if __name__ == "__main__":
    main()
