"""HTTP/REST front end: KServe v2 with Triton's extensions, on httptools and the core's asyncio loop.

``HttpApp`` routes each request of a connection (``pyserve.frontends.http_connection``) through the table of
``pyserve.frontends.http_routes`` (the paths docs/openapi.yaml documents), decodes an infer request with ``kserve``,
submits it to the core (``CoreApi.submit``) and writes the response from the request's callback. Health, metadata,
statistics, the settings endpoints and Triton's shared-memory endpoints (``/v2/systemsharedmemory``,
``/v2/cudasharedmemory``; see ``shared_memory``) reach the core through the same ``CoreApi``. A route of a restricted
group (``ServeConfig.http_restricted_api``; see ``restricted``) answers 403 to a request without the group's header.
With ``ServeConfig.tls_certfile`` (and ``http`` among ``tls_endpoints``) the port serves TLS only.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from pyserve.config import ServeConfig, header_pattern
from pyserve.core.api import CoreApi
from pyserve.core.infer_call import InferCall, build_request, forward_headers
from pyserve.core.inference import InferenceRequest, InferenceResponse, ModelEntry
from pyserve.errors import (
    InferenceError,
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    PayloadTooLargeError,
    UnsupportedError,
    error_kind,
)
from pyserve.frontends.common import EXTENSIONS, SERVER_NAME, SERVER_VERSION
from pyserve.frontends.dashboard import Dashboard
from pyserve.frontends.http_connection import JSON, HttpProtocol, HttpRequest, listen
from pyserve.frontends.http_routes import Router
from pyserve.frontends.kserve import (
    decode_generate_request,
    decode_request,
    encode_generate_response,
    encode_response,
)
from pyserve.frontends.restricted import header_checks
from pyserve.frontends.shared_memory import SYSTEM, write_outputs
from pyserve.frontends.tls import server_ssl_context

logger = logging.getLogger(__name__)

_BINARY = b"application/octet-stream"
_EVENT_STREAM = b"text/event-stream; charset=utf-8"


class HttpApp:
    """Routes requests to the core; shared by every connection."""

    def __init__(self, core: CoreApi, config: ServeConfig) -> None:
        self.core = core
        self.max_body = config.max_request_bytes
        # ServeConfig.http_header_forward_pattern: headers whose names match become request parameters.
        self.forward_pattern = header_pattern(config.http_header_forward_pattern)
        self._tasks: set[asyncio.Future[None]] = set()
        # Each restricted group's routes check its header (ServeConfig.http_restricted_api, restricted_api).
        self.router = Router(self, checks=header_checks(config.http_restrictions()))
        # The status page (ServeConfig.dashboard; pyserve.frontends.dashboard), sampling once the server listens.
        self.dashboard = Dashboard(core, config) if config.dashboard else None

    def cancel(self, request: InferenceRequest) -> None:
        """The client closed its connection before its answer."""
        self.core.cancel(request)

    def handle(self, conn: HttpProtocol, request: HttpRequest) -> None:
        """Answer one request (infer answers later, from the core's callback)."""
        try:
            if request.too_large:
                raise PayloadTooLargeError(f"request body exceeds the limit of {self.max_body} bytes")
            self._route(conn, request)
        except InferenceError as exc:
            status = (
                400 if isinstance(exc, ModelNotFoundError) and request.path.endswith(b"/stats") else exc.http_status
            )
            conn.respond_error(request, status, str(exc), error_kind(exc))
        except Exception as exc:
            logger.exception("unexpected error handling %r", request.path)
            conn.respond_error(request, 500, f"internal server error: {exc}")

    def _route(self, conn: HttpProtocol, request: HttpRequest) -> None:
        segments = request.path.decode("latin-1").strip("/").split("/")
        route = self.router.match(segments)
        if route is None:
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")
            return
        if route.check is not None:  # a restricted group's route: its header before anything else, as in Triton
            route.check.check(request.headers.get(route.check.header_bytes))
        if request.method not in route.methods:
            conn.respond_error(request, 405, route.wrong_method)
        else:
            route.handler(conn, request, route.arguments(segments))

    # health, metadata, statistics (each handler answers one route of http_routes.ROUTES) ---------------------------

    def server_metadata(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /v2``."""
        doc = {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}
        conn.respond(request, 200, orjson.dumps(doc))

    def health_live(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /v2/health/live``: 200, or 400 when not live (as Triton)."""
        conn.respond(request, 200 if self.core.is_live() else 400)

    def health_ready(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /v2/health/ready``."""
        conn.respond(request, 200 if self.core.is_ready() else 400)

    def remote_address(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /v2/pyserve/remote``: where ``RemoteServe`` attaches (docs/remote.md); 404 while the remote port is
        closed. The token is never part of it."""
        if not self.core.remote_address:
            conn.respond_error(request, 404, "this server has no remote port (ServeConfig.remote_port)")
            return
        conn.respond(request, 200, orjson.dumps({"address": self.core.remote_address}))

    def all_model_stats(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /v2/models/stats``: every model's statistics."""
        stats = [e.stats.to_json(e.name, e.version) for e in self.core.models.entries()]
        conn.respond(request, 200, orjson.dumps({"model_stats": stats}))

    def model_metadata(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /v2/models/{model}[/versions/{version}]``."""
        entry = self._entry(path)
        doc = entry.metadata([e.version for e in self.core.models.versions(entry.name)])
        conn.respond(request, 200, orjson.dumps(doc))

    def model_config(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET .../config``."""
        conn.respond(request, 200, orjson.dumps(self._entry(path).config_json()))

    def model_ready(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET .../ready``: 200, or 400 when the model has no live instance."""
        conn.respond(request, 200 if self._entry(path).ready else 400)

    def model_stats(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET .../stats``: one model's statistics, of every version unless the path names one."""
        models = self.core.models
        version = path.get("version")
        if version is None:
            entries = models.versions(path["model"])
            if not entries:
                raise ModelNotFoundError(f"requested model '{path['model']}' is not found")
        else:
            entries = [models.get(path["model"], version)]
        doc = {"model_stats": [e.stats.to_json(e.name, e.version) for e in entries]}
        conn.respond(request, 200, orjson.dumps(doc))

    def _entry(self, path: dict[str, str]) -> ModelEntry:
        return self.core.models.get(path["model"], path.get("version"))

    # the status page (pyserve.frontends.dashboard) -----------------------------------------------------------------

    def dashboard_redirect(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /``: to the status page."""
        if self._dashboard(conn, request) is not None:
            conn.respond(request, 302, b"", b"text/plain", b"location: /dashboard\r\n")

    def dashboard_page(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /dashboard``: the page."""
        dashboard = self._dashboard(conn, request)
        if dashboard is not None:
            conn.respond(request, 200, dashboard.page, b"text/html; charset=utf-8", b"cache-control: no-cache\r\n")

    def dashboard_data(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET /dashboard/data``: what the page shows, as JSON."""
        dashboard = self._dashboard(conn, request)
        if dashboard is not None:
            conn.respond(request, 200, orjson.dumps(dashboard.data()), JSON, b"cache-control: no-store\r\n")

    def _dashboard(self, conn: HttpProtocol, request: HttpRequest) -> Dashboard | None:
        if self.dashboard is None:
            conn.respond_error(request, 404, "the status page is off (ServeConfig.dashboard, --dashboard)")
        return self.dashboard

    # settings ------------------------------------------------------------------------------------------------------

    def model_trace_setting(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET|POST /v2/models/{model}/trace/setting``."""
        name = path["model"]
        self.core.models.get(name)  # unknown model: 404
        tracing = self.core.tracing
        self._settings(conn, request, lambda: tracing.to_json(name), lambda changes: tracing.update(name, changes))

    def trace_setting(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET|POST /v2/trace/setting``."""
        tracing = self.core.tracing
        self._settings(conn, request, tracing.to_json, lambda changes: tracing.update(None, changes))

    def log_settings(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET|POST /v2/logging``."""
        logs = self.core.logs
        self._settings(conn, request, logs.to_json, logs.update)

    def _settings(
        self,
        conn: HttpProtocol,
        request: HttpRequest,
        read: Callable[[], dict[str, Any]],
        update: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        """Triton's settings endpoints (logging, trace): GET reads them; POST applies a JSON object of changes and
        answers the settings now in force."""
        if request.method == b"GET":
            conn.respond(request, 200, orjson.dumps(read()))
        else:
            conn.respond(request, 200, orjson.dumps(update(self._json_body(request, "settings"))))

    # model repository ----------------------------------------------------------------------------------------------

    def repository_index(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``POST /v2/repository/index``."""
        body = self._json_body(request)
        conn.respond(request, 200, orjson.dumps(self.core.repository.index(bool(body.get("ready", False)))))

    def repository_load(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``POST /v2/repository/models/{model}/load``, with Triton's ``config`` and ``file:<path>`` parameters."""
        config, files = _load_parameters(self._repository_parameters(request))
        self._answer_when_done(conn, request, self.core.repository.request_load(path["model"], config, files))

    def repository_unload(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``POST /v2/repository/models/{model}/unload``."""
        dependents = bool(self._repository_parameters(request).get("unload_dependents", False))
        self._answer_when_done(conn, request, self.core.repository.request_unload(path["model"], dependents))

    def _repository_parameters(self, request: HttpRequest) -> dict[str, Any]:
        parameters = self._json_body(request).get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidInputError("'parameters' of a repository request must be a JSON object")
        return parameters

    def _answer_when_done(self, conn: HttpProtocol, request: HttpRequest, operation: Awaitable[None]) -> None:
        task = asyncio.ensure_future(operation)
        self._tasks.add(task)

        def answered(done: asyncio.Future[None]) -> None:
            self._tasks.discard(task)
            if done.cancelled():
                return
            error = done.exception()
            if error is None:
                conn.respond(request, 200)
            elif isinstance(error, InferenceError):
                conn.respond_error(request, error.http_status, str(error), error_kind(error))
            else:
                logger.error("unexpected error in a repository request", exc_info=error)
                conn.respond_error(request, 500, f"internal server error: {error}")

        task.add_done_callback(answered)

    # shared memory: Triton's extension (pyserve.frontends.shared_memory) ------------------------------------------

    def shm_status(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``GET .../status`` of every region of a kind, or of ``region/{region}``."""
        conn.respond(request, 200, orjson.dumps(self.core.shared_memory.status(path["kind"], path.get("region", ""))))

    def shm_unregister(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``POST .../unregister`` of every region of a kind, or of ``region/{region}``."""
        self.core.shared_memory.unregister(path["kind"], path.get("region", ""))
        conn.respond(request, 200)

    def shm_register(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``POST .../region/{region}/register``: a system region's ``key``, ``offset`` and ``byte_size``, or a CUDA
        region's ``raw_handle``, ``device_id`` and ``byte_size``."""
        regions = self.core.shared_memory
        name = path["region"]
        body = self._json_body(request, "register request")
        byte_size = _natural(body, "byte_size")
        if path["kind"] == SYSTEM:
            key = body.get("key")
            if not isinstance(key, str):
                raise InvalidInputError(f"a system shared memory register request needs a string 'key', got {key!r}")
            regions.register_system(name, key, _natural(body, "offset", 0), byte_size)
        else:
            regions.register_cuda(name, _raw_handle(body), _natural(body, "device_id"), byte_size)
        conn.respond(request, 200)

    def _json_body(self, request: HttpRequest, what: str = "request") -> dict[str, Any]:
        """The body as a JSON object (an empty body is ``{}``)."""
        try:
            body = orjson.loads(self._body(request) or b"{}")
        except orjson.JSONDecodeError as exc:
            raise InvalidInputError(f"failed to parse the {what} JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidInputError(f"the {what} JSON must be an object")
        return body

    # infer ---------------------------------------------------------------------------------------------------

    def infer(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``POST .../infer``: JSON tensors, or the binary tensor data extension (Inference-Header-Content-Length)."""
        self._submit_infer(conn, request, self._entry(path))

    def _submit_infer(self, conn: HttpProtocol, request: HttpRequest, entry: ModelEntry) -> None:
        if entry.spec.config.decoupled:
            raise UnsupportedError(
                f"model '{entry.name}' is decoupled (streaming): use gRPC ModelStreamInfer or /generate_stream"
            )
        headers = request.headers
        body = self._body(request)
        header_length: int | None = None
        raw_length = headers.get(b"inference-header-content-length")
        if raw_length is not None:
            try:
                header_length = int(raw_length)
            except ValueError:
                raise InvalidInputError(
                    f"Inference-Header-Content-Length must be an integer, got {raw_length!r}"
                ) from None
        call = decode_request(body, header_length, entry, self.core.shared_memory)
        if self.forward_pattern is not None:
            self._forward_headers(request, call)
        accept = headers.get(b"accept-encoding", b"").lower()
        compress = b"gzip" if b"gzip" in accept else b"deflate" if b"deflate" in accept else b""

        def on_response(infer: InferenceRequest, response: InferenceResponse) -> None:
            self._write_response(conn, request, entry, call, response, compress)

        infer = build_request(entry, call, on_response)
        infer.stamps = request.stamps  # None unless the stage-times switch is on
        if self.core.tracing.active:
            infer.traceparent = headers.get(b"traceparent", b"").decode("latin-1")
        conn.in_flight = infer
        self.core.submit(infer)

    def _forward_headers(self, request: HttpRequest, call: InferCall) -> None:
        headers = ((name.decode("latin-1"), value.decode("latin-1")) for name, value in request.headers.items())
        forward_headers(call.parameters, headers, self.forward_pattern)

    def _body(self, request: HttpRequest) -> Any:
        encoding = request.headers.get(b"content-encoding")
        if encoding:
            return _decompress(request.body, encoding.lower(), self.max_body)
        return request.body

    # generate ------------------------------------------------------------------------------------------------

    def generate(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``POST .../generate``: one JSON object in, one out."""
        self._generate(conn, request, self._entry(path), streaming=False)

    def generate_stream(self, conn: HttpProtocol, request: HttpRequest, path: dict[str, str]) -> None:
        """``POST .../generate_stream``: one JSON object in, one Server-Sent Event per response out."""
        self._generate(conn, request, self._entry(path), streaming=True)

    def _generate(self, conn: HttpProtocol, request: HttpRequest, entry: ModelEntry, streaming: bool) -> None:
        """Triton's generate extension: ``/generate`` answers one JSON object, ``/generate_stream`` one Server-Sent
        Event per response. Once a stream has started, a later error arrives as an ``{"error": ...}`` event."""
        call = decode_generate_request(self._body(request), entry)
        if self.forward_pattern is not None:
            self._forward_headers(request, call)
        # A decoupled model ends with a flag-only response; it carries nothing to send.
        decoupled = entry.spec.config.decoupled
        collected: list[bytes] = []
        started = finished = False

        def on_response(infer: InferenceRequest, response: InferenceResponse) -> None:
            nonlocal started, finished
            if finished:
                return
            finished = response.final
            error = response.error
            event = b""
            if error is None and not (response.final and decoupled and not response.outputs):
                try:
                    event = encode_generate_response(entry, call, response.outputs, response.parameters or None)
                except InferenceError as exc:  # an output JSON cannot carry (BYTES that are not UTF-8)
                    error = exc
            if error is not None:
                event = orjson.dumps({"error": str(error)})
            if not streaming:
                if error is not None:
                    finished = True
                    conn.respond_error(request, error.http_status, str(error), error_kind(error))
                    return
                if event:
                    collected.append(event)
                if response.final:
                    if len(collected) == 1:
                        conn.respond(request, 200, collected[0])
                    else:
                        conn.respond_error(
                            request,
                            ModelExecutionError.http_status,
                            f"generate expects model '{entry.name}' to produce exactly 1 response, got "
                            f"{len(collected)}; use generate_stream for a model that streams responses",
                        )
                return
            if not started:
                started = True
                conn.start_stream(request, 200 if error is None else error.http_status, _EVENT_STREAM)
            if event:
                conn.write_chunk(b"data: " + event + b"\n\n")
            if response.final:
                conn.end_stream(request)

        infer = build_request(entry, call, on_response)
        if self.core.tracing.active:
            infer.traceparent = request.headers.get(b"traceparent", b"").decode("latin-1")
        conn.in_flight = infer
        self.core.submit(infer)

    # responses -----------------------------------------------------------------------------------------------

    def _write_response(
        self,
        conn: HttpProtocol,
        request: HttpRequest,
        entry: ModelEntry,
        call: InferCall,
        response: InferenceResponse,
        compress: bytes,
    ) -> None:
        error = response.error
        if error is None:
            # Output buffers are valid only during this callback: encode (copy) them now. A failure answers the
            # request (it is the core's callback: an exception here would leave the client waiting).
            try:
                if call.shm_outputs is not None:
                    write_outputs(call.shm_outputs, response.outputs)
                header, parts = encode_response(entry, call, response.outputs, response.parameters or None)
            except InferenceError as exc:
                error = exc
            except Exception as exc:
                logger.exception("could not encode the response of request %r", call.id)
                error = InferenceError(f"could not encode the response: {exc}")
        if error is not None:
            conn.respond_error(request, error.http_status, str(error), error_kind(error))
            return
        extra = b""
        if parts:
            extra = b"inference-header-content-length: %d\r\n" % len(header)
            content_type = _BINARY
        else:
            content_type = JSON
        body: bytes | list[Any] = [header, *parts] if parts else header
        if compress:
            joined = b"".join(body) if isinstance(body, list) else body
            body = gzip.compress(joined, 1) if compress == b"gzip" else zlib.compress(joined, 1)
            extra += b"content-encoding: " + compress + b"\r\n"
        conn.respond(request, 200, body, content_type, extra)


def _decompress(body: bytes | bytearray, encoding: bytes, limit: int) -> bytes:
    """A gzip (one member or several, as gzip writes them) or deflate body, whole: a stream cut short or followed by
    other bytes is refused rather than read in part, and the result may hold at most ``limit`` bytes."""
    if encoding == b"identity":
        return bytes(body)
    if encoding not in (b"gzip", b"deflate"):
        raise InvalidInputError(
            f"unsupported Content-Encoding {encoding.decode('latin-1')!r}; use gzip, deflate or identity"
        )
    name = encoding.decode()
    parts: list[bytes] = []
    size = 0
    rest = bytes(body)
    try:
        while True:
            decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS)
            part = decompressor.decompress(rest, limit + 1 - size)
            size += len(part)
            if size > limit:
                raise PayloadTooLargeError(f"decompressed request body exceeds the limit of {limit} bytes")
            parts.append(part)
            if not decompressor.eof:
                raise InvalidInputError(f"could not decompress the {name} request body: it ends within its data")
            rest = decompressor.unused_data
            if not rest:
                return b"".join(parts)
            if encoding != b"gzip":
                raise InvalidInputError(f"the {name} request body has {len(rest)} bytes after its compressed data")
    except zlib.error as exc:
        raise InvalidInputError(f"could not decompress the {name} request body: {exc}") from None


async def start_http_server(core: CoreApi, config: ServeConfig) -> tuple[asyncio.base_events.Server, int]:
    """Listen on config.host:http_port (TLS when ``http`` is among ``tls_endpoints``); returns the server and the
    bound port."""
    tls = server_ssl_context(config) if config.uses_tls("http") else None
    app = HttpApp(core, config)
    server_and_port = await listen(
        app,
        config.host,
        config.http_port,
        backlog=1024,
        stage_times=core.stage_times,
        header_timeout_s=config.http_header_timeout_s,
        tls=tls,
    )
    if app.dashboard is not None:
        app.dashboard.start()
    return server_and_port


def _load_parameters(parameters: dict[str, Any]) -> tuple[str | None, dict[str, bytes]]:
    """A load request's ``config`` (JSON text) and ``file:<path>`` parameters (base64 content), as Triton takes them."""
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise InvalidInputError("load parameter 'config' must be a string holding the model configuration as JSON")
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if key.startswith("file:"):
            if not isinstance(value, str):
                raise InvalidInputError(f"load parameter '{key}' must be the file's content in base64")
            try:
                files[key[len("file:") :]] = base64.b64decode(value, validate=True)
            except ValueError as exc:  # binascii.Error, or text that is not ASCII
                raise InvalidInputError(f"load parameter '{key}' is not valid base64: {exc}") from None
    return config, files


def _natural(body: dict[str, Any], key: str, default: int | None = None) -> int:
    """A non-negative integer field of a register request."""
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(
            f"shared memory register request: '{key}' must be a non-negative integer, got {value!r}"
        )
    return value


def _raw_handle(body: dict[str, Any]) -> bytes:
    """The ``cudaIpcMemHandle_t`` of a CUDA register request: ``{"raw_handle": {"b64": ...}}``."""
    raw = body.get("raw_handle")
    encoded = raw.get("b64") if isinstance(raw, dict) else None
    if not isinstance(encoded, str):
        raise InvalidInputError("a CUDA shared memory register request needs 'raw_handle': {\"b64\": <base64>}")
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError as exc:  # binascii.Error, or text that is not ASCII
        raise InvalidInputError(f"'raw_handle' is not valid base64: {exc}") from None
