"""HTTP/REST front end: KServe v2 with Triton's extensions, on httptools and the core's asyncio loop.

``HttpApp`` routes each request of a connection (``pyserve.frontends.http_connection``) on its path segments,
decodes an infer request with ``kserve``, submits it to the core (``CoreApi.submit``) and writes the response from
the request's callback. Health, metadata, statistics, the settings endpoints and Triton's shared-memory endpoints
(``/v2/systemsharedmemory``, ``/v2/cudasharedmemory``; see ``shared_memory``) reach the core through the same
``CoreApi``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gzip
import logging
import zlib
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

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
from pyserve.frontends.http_connection import JSON, HttpProtocol, HttpRequest, listen
from pyserve.frontends.kserve import (
    decode_generate_request,
    decode_request,
    encode_generate_response,
    encode_response,
)
from pyserve.frontends.shared_memory import CUDA, SYSTEM, check_restricted, write_outputs

logger = logging.getLogger(__name__)

_BINARY = b"application/octet-stream"
_SHARED_MEMORY_KINDS = {"systemsharedmemory": SYSTEM, "cudasharedmemory": CUDA}
_EVENT_STREAM = b"text/event-stream; charset=utf-8"


class HttpApp:
    """Routes requests to the core; shared by every connection."""

    def __init__(self, core: CoreApi, config: ServeConfig) -> None:
        self.core = core
        self.max_body = config.max_request_bytes
        # The header the shared-memory endpoints require (ServeConfig.restricted_api), or None.
        self.restriction = config.shared_memory_restriction()
        # ServeConfig.http_header_forward_pattern: headers whose names match become request parameters.
        self.forward_pattern = header_pattern(config.http_header_forward_pattern)
        self._tasks: set[asyncio.Future[None]] = set()

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
        parts = request.path.decode("latin-1").strip("/").split("/")
        method = request.method
        if not parts or parts[0] != "v2":
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")
            return
        rest = parts[1:]
        if not rest:
            self._json(
                conn, request, method, {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}
            )
            return
        if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            if method != b"GET":
                conn.respond_error(request, 405, "use GET")
                return
            ok = self.core.is_live() if rest[1] == "live" else self.core.is_ready()
            conn.respond(request, 200 if ok else 400)
            return
        if rest[0] == "models":
            self._route_models(conn, request, method, rest[1:])
            return
        if rest == ["logging"]:
            logs = self.core.logs
            self._settings(conn, request, method, logs.to_json, logs.update)
            return
        if rest == ["trace", "setting"]:
            tracing = self.core.tracing
            self._settings(conn, request, method, tracing.to_json, lambda changes: tracing.update(None, changes))
            return
        if rest[0] == "repository":
            self._route_repository(conn, request, method, rest[1:])
            return
        if rest[0] in _SHARED_MEMORY_KINDS:
            self._route_shared_memory(conn, request, method, _SHARED_MEMORY_KINDS[rest[0]], rest[1:])
            return
        conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")

    def _route_models(self, conn: HttpProtocol, request: HttpRequest, method: bytes, rest: list[str]) -> None:
        models = self.core.models
        if rest == ["stats"] or not rest:
            if not rest:
                conn.respond_error(request, 404, "not found: /v2/models")
                return
            stats = [e.stats.to_json(e.name, e.version) for e in models.entries()]
            self._json(conn, request, method, {"model_stats": stats})
            return
        name = unquote(rest[0])
        version: str | None = None
        tail = rest[1:]
        if len(tail) >= 2 and tail[0] == "versions":
            version = unquote(tail[1])
            tail = tail[2:]
        if tail == ["trace", "setting"] and version is None:
            models.get(name)  # unknown model: 404
            tracing = self.core.tracing
            self._settings(
                conn, request, method, lambda: tracing.to_json(name), lambda changes: tracing.update(name, changes)
            )
            return
        if len(tail) > 1:
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")
            return
        action = tail[0] if tail else ""
        if action == "infer":
            if method != b"POST":
                conn.respond_error(request, 405, "use POST for infer")
                return
            self._infer(conn, request, models.get(name, version))
            return
        if action == "stats":
            if version is None:
                entries = models.versions(name)
                if not entries:
                    raise ModelNotFoundError(f"requested model '{name}' is not found")
            else:
                entries = [models.get(name, version)]
            self._json(conn, request, method, {"model_stats": [e.stats.to_json(e.name, e.version) for e in entries]})
            return
        entry = models.get(name, version)
        if action == "":
            self._json(conn, request, method, entry.metadata([e.version for e in models.versions(name)]))
        elif action == "config":
            self._json(conn, request, method, entry.config_json())
        elif action == "ready":
            conn.respond(request, 200 if entry.ready else 400)
        elif action in ("generate", "generate_stream"):
            if method != b"POST":
                conn.respond_error(request, 405, f"use POST for {action}")
                return
            self._generate(conn, request, entry, streaming=action == "generate_stream")
        else:
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")

    # model repository ----------------------------------------------------------------------------------------------

    def _route_repository(self, conn: HttpProtocol, request: HttpRequest, method: bytes, rest: list[str]) -> None:
        """Triton's repository extension: ``POST /v2/repository/index`` and ``.../models/{m}/load|unload``."""
        if method != b"POST" or not (rest == ["index"] or (len(rest) == 3 and rest[0] == "models")):
            conn.respond_error(
                request,
                404 if method == b"POST" else 405,
                "use POST on /v2/repository/index or /v2/repository/models/{model}/load|unload",
            )
            return
        body = self._json_body(request)
        repository = self.core.repository
        if rest == ["index"]:
            conn.respond(request, 200, orjson.dumps(repository.index(bool(body.get("ready", False)))))
            return
        name, action = unquote(rest[1]), rest[2]
        parameters = body.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidInputError("'parameters' of a repository request must be a JSON object")
        if action == "load":
            config, files = _load_parameters(parameters)
            operation = repository.request_load(name, config, files)
        elif action == "unload":
            operation = repository.request_unload(name, bool(parameters.get("unload_dependents", False)))
        else:
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")
            return
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

    # shared memory ----------------------------------------------------------------------------------------------

    def _route_shared_memory(
        self, conn: HttpProtocol, request: HttpRequest, method: bytes, kind: str, rest: list[str]
    ) -> None:
        """Triton's shared-memory extension: ``GET .../status``, ``POST .../register``, ``POST .../unregister``, each
        for every region or under ``region/{name}`` for one (register: one only)."""
        name = ""
        if len(rest) == 3 and rest[0] == "region":
            name = unquote(rest[1])
        elif len(rest) != 1:
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")
            return
        action = rest[-1]
        wanted = {"status": b"GET", "register": b"POST", "unregister": b"POST"}.get(action)
        if wanted is None or (action == "register" and not name):
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}")
            return
        if method != wanted:
            conn.respond_error(request, 405, f"use {wanted.decode()} for shared memory {action}")
            return
        if self.restriction is not None:
            header = self.restriction[0]
            value = request.headers.get(header.encode("latin-1"))
            check_restricted(self.restriction, header, None if value is None else value.decode("latin-1"))
        regions = self.core.shared_memory
        if action == "status":
            conn.respond(request, 200, orjson.dumps(regions.status(kind, name)))
        elif action == "unregister":
            regions.unregister(kind, name)
            conn.respond(request, 200)
        else:
            body = self._json_body(request, "register request")
            byte_size = _natural(body, "byte_size")
            if kind == SYSTEM:
                key = body.get("key")
                if not isinstance(key, str):
                    raise InvalidInputError(
                        f"a system shared memory register request needs a string 'key', got {key!r}"
                    )
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

    def _settings(
        self,
        conn: HttpProtocol,
        request: HttpRequest,
        method: bytes,
        read: Callable[[], dict[str, Any]],
        update: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        """Triton's settings endpoints (logging, trace): GET reads them; POST applies a JSON object of changes and
        answers the settings now in force."""
        if method == b"GET":
            conn.respond(request, 200, orjson.dumps(read()))
            return
        if method != b"POST":
            conn.respond_error(request, 405, "use GET or POST")
            return
        conn.respond(request, 200, orjson.dumps(update(self._json_body(request, "settings"))))

    def _json(self, conn: HttpProtocol, request: HttpRequest, method: bytes, doc: Any) -> None:
        if method != b"GET":
            conn.respond_error(request, 405, "use GET")
            return
        conn.respond(request, 200, orjson.dumps(doc))

    # infer ---------------------------------------------------------------------------------------------------

    def _infer(self, conn: HttpProtocol, request: HttpRequest, entry: ModelEntry) -> None:
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
            if error is not None:
                event = orjson.dumps({"error": str(error)})
            elif response.final and decoupled and not response.outputs:
                event = b""
            else:
                event = encode_generate_response(entry, call, response.outputs, response.parameters or None)
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
        if error is None and call.shm_outputs is not None:
            try:
                write_outputs(call.shm_outputs, response.outputs)
            except InferenceError as exc:
                error = exc
        if error is not None:
            conn.respond_error(request, error.http_status, str(error), error_kind(error))
            return
        header, parts = encode_response(entry, call, response.outputs, response.parameters or None)
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
    try:
        if encoding == b"gzip":
            decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == b"deflate":
            decompressor = zlib.decompressobj()
        elif encoding == b"identity":
            return bytes(body)
        else:
            raise UnsupportedError(f"unsupported Content-Encoding {encoding.decode('latin-1')!r}; use gzip or deflate")
        out = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInputError(f"could not decompress the {encoding.decode('latin-1')} request body: {exc}") from None
    if len(out) > limit:
        raise PayloadTooLargeError(f"decompressed request body exceeds the limit of {limit} bytes")
    return out


async def start_http_server(core: CoreApi, config: ServeConfig) -> tuple[asyncio.base_events.Server, int]:
    """Listen on config.host:http_port; returns the server and the bound port."""
    return await listen(
        HttpApp(core, config), config.host, config.http_port, backlog=1024, stage_times=core.stage_times
    )


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
            except binascii.Error as exc:
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
    except binascii.Error as exc:
        raise InvalidInputError(f"'raw_handle' is not valid base64: {exc}") from None
