"""``Serve.asgi_app()``: the KServe v2 routes as a Starlette app, to mount into an application served by the user's
own ASGI server (``app.mount("/kserve", server.asgi_app())`` under uvicorn).

Infer goes through the in-process API (``Serve.ainfer``): no second HTTP hop, batched with every other request. The
other routes (server and model metadata, model config, readiness, statistics) are answered by the core's HTTP front
end and relayed as they are, so they say exactly what pyserve's own port says. Every path is the KServe one
(``/v2/...``) below wherever the app is mounted: ``tritonclient.http`` reaches it at ``host:port/kserve``.

Not here (use pyserve's own ports): generate / generate_stream, clients' shared-memory regions, the model
repository and settings endpoints, gRPC.

The app belongs to the application it is mounted in, which decides who may call it: pyserve's restricted groups
(``ServeConfig.http_restricted_api``) are not applied here. Infer never passes the HTTP port; the relayed requests
carry the restricted groups' headers themselves, and go over TLS when the HTTP port serves it (trusting the server's
own ``tls_certfile``). With mutual TLS (``tls_client_ca``) the relay has no client certificate: relayed routes
answer 503 then.
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import numpy as np
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from pyserve.config import ServeConfig
from pyserve.errors import ERROR_KIND_HEADER, InferenceError, InvalidInputError, ServerError, error_kind
from pyserve.routes.app import error_response, read_body
from pyserve.routes.kserve_codec import decode_request, encode_response

# How long a relayed request may take (metadata and statistics answer at once).
RELAY_TIMEOUT_S = 10.0
_RELAYED_HEADERS = ("content-type", ERROR_KIND_HEADER)


class InProcessServer(Protocol):
    """What the app needs of a ``Serve``."""

    config: ServeConfig

    @property
    def is_running(self) -> bool: ...

    @property
    def url(self) -> str: ...

    async def ainfer(
        self,
        model_name: str,
        inputs: Mapping[str, Any],
        *,
        model_version: int | None = None,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> dict[str, np.ndarray]: ...


Endpoint = Callable[[Request], Awaitable[Response]]


def kserve_app(server: InProcessServer) -> Starlette:
    """The KServe v2 routes of ``server``, infer through ``Serve.ainfer``."""
    relayed = [
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/stats",  # before /v2/models/{model}: a literal wins
    ]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        relayed += [prefix, f"{prefix}/ready", f"{prefix}/config", f"{prefix}/stats"]
    routes = [Route(path, _relay(server, path), methods=["GET"]) for path in relayed]
    infer = _infer(server)
    routes += [
        Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", infer, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def _infer(server: InProcessServer) -> Endpoint:
    async def infer(request: Request) -> Response:
        if not server.is_running:
            return error_response(503, "the server is not running")
        model = request.path_params["model"]
        version = request.path_params.get("version")
        try:
            body = await read_body(request.scope, request.receive, server.config.max_request_bytes)
            decoded = decode_request(body, _header_length(request))
            outputs = await server.ainfer(
                model,
                decoded.inputs,
                model_version=_version(version),
                outputs=decoded.outputs,
                parameters=decoded.parameters or None,
                request_id=decoded.request_id,
            )
            content, header_length = encode_response(model, version, decoded, outputs)
        except ClientDisconnect:
            return Response(status_code=499)
        except InferenceError as exc:
            return error_response(exc.http_status, str(exc), {ERROR_KIND_HEADER: error_kind(exc)})
        except ServerError as exc:
            return error_response(503, str(exc))
        if header_length is None:
            return Response(content, media_type="application/json")
        return Response(
            content,
            media_type="application/octet-stream",
            headers={"inference-header-content-length": str(header_length)},
        )

    return infer


def _relay(server: InProcessServer, template: str) -> Endpoint:
    """An endpoint answering what the core's HTTP front end answers at ``template`` (its parameters filled in)."""

    async def relay(request: Request) -> Response:
        if not server.is_running:
            return error_response(503, "the server is not running")
        if not server.config.allow_http:
            return error_response(501, "pyserve's HTTP front end is off (allow_http=False): only infer is served here")
        path = template.format(**{name: quote(str(value), safe="") for name, value in request.path_params.items()})
        try:
            status, headers, body = await asyncio.to_thread(_get, server.config, server.url, path)
        except (OSError, http.client.HTTPException) as exc:
            return error_response(503, f"the server's HTTP front end did not answer: {exc}")
        return Response(body, status_code=status, headers=headers)

    return relay


def _get(config: ServeConfig, base_url: str, path: str) -> tuple[int, dict[str, str], bytes]:
    address = urlsplit(base_url)
    host, port = address.hostname or "127.0.0.1", address.port
    conn: http.client.HTTPConnection
    if config.uses_tls("http"):
        conn = http.client.HTTPSConnection(host, port, timeout=RELAY_TIMEOUT_S, context=_own_certificate(config))
    else:
        conn = http.client.HTTPConnection(host, port, timeout=RELAY_TIMEOUT_S)
    # Restrictions are the mounting application's to enforce (module docstring).
    restricted = {restriction.header: restriction.value for restriction in config.http_restrictions().values()}
    try:
        conn.request("GET", path, headers=restricted)
        response = conn.getresponse()
        body = response.read()
        headers = {name: value for name in _RELAYED_HEADERS if (value := response.getheader(name)) is not None}
        return response.status, headers, body
    finally:
        conn.close()


def _own_certificate(config: ServeConfig) -> ssl.SSLContext:
    """A client context that trusts the server's own certificate (by itself: the relay reaches the port by its
    address, which the certificate need not name)."""
    context = ssl.create_default_context(cafile=config.tls_certfile)
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def _header_length(request: Request) -> int | None:
    raw = request.headers.get("inference-header-content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidInputError(f"Inference-Header-Content-Length must be an integer, got {raw!r}") from None


def _version(version: str | None) -> int | None:
    if version is None:
        return None
    try:
        return int(version)
    except ValueError:
        raise InvalidInputError(f"model version must be an integer, got {version!r}") from None
