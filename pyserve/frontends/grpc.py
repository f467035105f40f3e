"""gRPC front end: ``inference.GRPCInferenceService`` (KServe v2 / Triton) and ``grpc.health.v1.Health`` on grpc.aio.

It runs on the core's asyncio loop (uvloop included: grpc.aio's completion queue is polled on its own thread and
wakes the loop through a socket, which any asyncio loop supports), so responses are written from the core's
callbacks without a thread hop. ``ModelInfer`` and ``ModelStreamInfer`` take and return raw bytes: the tensor
bytes never become protobuf objects (see ``grpc_codec``). Every other RPC uses the generated messages.

Errors map through ``errors.py``: each ``InferenceError`` has its ``grpc_code``. On a stream, an error answers that
one request with ``error_message`` and the stream stays open; a client that cancels or drops the stream has every
request still in flight cancelled.

Every method belongs to a restricted group (``METHOD_GROUPS``): with ``ServeConfig.grpc_restricted_protocol`` a call
to a restricted group's method needs the metadata ``triton-grpc-protocol-<key>`` (see ``restricted``), else it ends
with PERMISSION_DENIED before its message is read. With ``ServeConfig.tls_certfile`` (and ``grpc`` among
``tls_endpoints``) the port serves TLS only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from pyserve.config import ServeConfig, header_pattern
from pyserve.core.api import CoreApi
from pyserve.core.infer_call import build_request, forward_headers
from pyserve.core.inference import InferenceRequest, InferenceResponse, ModelEntry
from pyserve.errors import (
    ERROR_KIND_HEADER,
    InferenceError,
    InvalidInputError,
    ModelNotFoundError,
    PermissionDeniedError,
    UnsupportedError,
    error_kind,
)
from pyserve.frontends.common import EXTENSIONS, SERVER_NAME, SERVER_VERSION
from pyserve.frontends.grpc_codec import (
    decode_infer_call,
    infer_response_bytes,
    parse_infer_request,
    stream_flag_bytes,
    stream_response_bytes,
)
from pyserve.frontends.protocol import grpc_service_pb2 as pb
from pyserve.frontends.protocol import health_pb2
from pyserve.frontends.restricted import GRPC_HEADER_PREFIX, HeaderCheck, header_checks
from pyserve.frontends.shared_memory import CUDA, SYSTEM, write_outputs
from pyserve.frontends.tls import grpc_server_credentials

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
# gRPC caps one message at 2 GiB - 1 (a signed 32-bit length).
_MAX_MESSAGE_BYTES = (1 << 31) - 1

# grpc.aio.ServicerContext (grpc ships no type information).
Context = Any
_R = TypeVar("_R")

# The restricted group of each method (tritonserver's --grpc-restricted-protocol groups); the health service's
# Check is "health" too.
METHOD_GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "TraceSetting": "trace",
    "LogSettings": "logging",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    **{
        f"{kind}SharedMemory{action}": "shared-memory"
        for kind in ("System", "Cuda")
        for action in ("Status", "Register", "Unregister")
    },
}
HEALTH_CHECK_GROUP = "health"


async def _abort(context: Context, error: InferenceError) -> None:
    """End the call with the error's status; its kind rides in the trailing metadata for pyserve's client."""
    await context.abort(
        grpc.StatusCode[error.grpc_code], str(error), trailing_metadata=((ERROR_KIND_HEADER, error_kind(error)),)
    )


class GrpcFrontend:
    """The gRPC server of one core: start() binds it, stop() ends every call."""

    def __init__(self, core: CoreApi, config: ServeConfig) -> None:
        self.core = core
        self.config = config
        self.port = 0
        self._server: grpc.aio.Server | None = None
        # ServeConfig.grpc_header_forward_pattern: metadata whose keys match become request parameters.
        self.forward_pattern = header_pattern(config.grpc_header_forward_pattern)
        # The metadata each restricted group needs (ServeConfig.grpc_restricted_protocol, restricted_api).
        self.checks = header_checks(config.grpc_restrictions(), GRPC_HEADER_PREFIX)

    async def start(self) -> int:
        """Listen on config.host:grpc_port (0 picks a free port; TLS when ``grpc`` is among ``tls_endpoints``);
        returns the bound port."""
        credentials = grpc_server_credentials(self.config) if self.config.uses_tls("grpc") else None
        limit = min(self.config.max_request_bytes, _MAX_MESSAGE_BYTES)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                # Two servers must never share a port silently.
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers((self._inference_handler(), self._health_handler()))
        host = self.config.host
        address = f"[{host}]:{self.config.grpc_port}" if ":" in host else f"{host}:{self.config.grpc_port}"
        try:
            if credentials is None:
                port = int(server.add_insecure_port(address))
            else:
                port = int(server.add_secure_port(address, credentials))
        except RuntimeError as exc:
            raise OSError(f"cannot listen for gRPC on {address}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot listen for gRPC on {address}")
        await server.start()
        self._server = server
        self.port = port
        return port

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop taking calls; those in progress are cancelled (which cancels their requests) at once, or after
        ``grace_s`` seconds if they have not finished by then."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    # handlers -------------------------------------------------------------------------------------------------

    def _inference_handler(self) -> grpc.GenericRpcHandler:
        # method -> (function of the parsed request, request type, response type)
        unary: dict[str, tuple[Callable[[Any], Any], Any, Any]] = {
            "ServerLive": (self._server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": (self._server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": (self._model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": (self._server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
            "ModelMetadata": (self._model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
            "ModelConfig": (self._model_config, pb.ModelConfigRequest, pb.ModelConfigResponse),
            "ModelStatistics": (self._model_statistics, pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
            "RepositoryIndex": (self._repository_index, pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
            "RepositoryModelLoad": (
                self._repository_load,
                pb.RepositoryModelLoadRequest,
                pb.RepositoryModelLoadResponse,
            ),
            "RepositoryModelUnload": (
                self._repository_unload,
                pb.RepositoryModelUnloadRequest,
                pb.RepositoryModelUnloadResponse,
            ),
            "TraceSetting": (self._trace_setting, pb.TraceSettingRequest, pb.TraceSettingResponse),
            "LogSettings": (self._log_settings, pb.LogSettingsRequest, pb.LogSettingsResponse),
        }
        for kind, rpc in ((SYSTEM, "SystemSharedMemory"), (CUDA, "CudaSharedMemory")):
            register = self._system_shm_register if kind == SYSTEM else self._cuda_shm_register
            calls = (("Status", partial(self._shm_status, kind)), ("Register", register))
            for action, function in (*calls, ("Unregister", partial(self._shm_unregister, kind))):
                request, response = getattr(pb, f"{rpc}{action}Request"), getattr(pb, f"{rpc}{action}Response")
                unary[rpc + action] = (function, request, response)
        handlers = {
            name: self._unary(function, request, response, self._check(name))
            for name, (function, request, response) in unary.items()
        }
        # Raw bytes in and out: the codec handles these messages itself.
        infer = _guarded(self._model_infer, self._check("ModelInfer"))
        stream = _guarded(self._model_stream_infer, self._check("ModelStreamInfer"))
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(infer)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(stream)
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _check(self, method: str) -> HeaderCheck | None:
        """The metadata a method's group needs (None: not restricted)."""
        return self.checks.get(METHOD_GROUPS[method])

    def _health_handler(self) -> grpc.GenericRpcHandler:
        check = self._unary(
            self._health_check,
            health_pb2.HealthCheckRequest,
            health_pb2.HealthCheckResponse,
            self.checks.get(HEALTH_CHECK_GROUP),
        )
        return grpc.method_handlers_generic_handler(HEALTH_SERVICE, {"Check": check})

    @staticmethod
    def _unary(
        function: Callable[[Any], Any],
        request_type: Any,
        response_type: Any,
        check: HeaderCheck | None = None,
    ) -> grpc.RpcMethodHandler:
        """A unary handler around a plain function; InferenceError becomes the call's status. With ``check`` (the
        method's group is restricted) the call needs its metadata, checked before the message is parsed."""
        parse = request_type.FromString
        what = request_type.DESCRIPTOR.name

        async def handler(data: bytes, context: Context) -> Any:
            try:
                if check is not None:
                    check.check(_metadata_value(context, check.header))
                # Parsed here rather than by grpc, which answers a message it cannot parse with UNKNOWN.
                try:
                    request = parse(data)
                except DecodeError as exc:
                    raise InvalidInputError(f"malformed {what}: {exc}") from None
                result = function(request)
                return await result if inspect.isawaitable(result) else result
            except InferenceError as exc:
                await _abort(context, exc)
            except Exception as exc:
                logger.exception("unexpected error in a gRPC call")
                await context.abort(grpc.StatusCode.INTERNAL, f"internal server error: {exc}")

        return grpc.unary_unary_rpc_method_handler(handler, response_serializer=response_type.SerializeToString)

    # health and metadata ----------------------------------------------------------------------------------------

    def _server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.core.is_live())

    def _server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.core.is_ready())

    def _model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        # Triton answers an unknown model or version with ready=false and status OK, not NOT_FOUND.
        try:
            return pb.ModelReadyResponse(ready=self._entry(request.name, request.version).ready)
        except ModelNotFoundError:
            return pb.ModelReadyResponse(ready=False)

    def _health_check(self, request: health_pb2.HealthCheckRequest) -> health_pb2.HealthCheckResponse:
        if request.service not in ("", SERVICE):
            raise ModelNotFoundError(f"unknown service '{request.service}'")
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=serving if self.core.is_ready() else not_serving)

    def _server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)

    def _model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        entry = self._entry(request.name, request.version)
        doc = entry.metadata([e.version for e in self.core.models.versions(entry.name)])
        response = pb.ModelMetadataResponse()
        json_format.ParseDict(doc, response)
        return response

    def _model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        entry = self._entry(request.name, request.version)
        response = pb.ModelConfigResponse()
        json_format.ParseDict({"config": entry.config_json()}, response)
        return response

    def _model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        models = self.core.models
        if not request.name:
            entries = models.entries()
        elif not request.version:
            entries = models.versions(request.name)
        else:
            try:
                entries = [models.get(request.name, request.version)]
            except ModelNotFoundError:
                entries = []
        if request.name and not entries:
            # As over HTTP (400): Triton answers INVALID_ARGUMENT for statistics of an unknown model.
            version = f" version {request.version}" if request.version else ""
            raise InvalidInputError(f"requested model '{request.name}'{version} is not available")
        doc = {"model_stats": [e.stats.to_json(e.name, e.version) for e in entries]}
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict(doc, response)
        return response

    def _entry(self, name: str, version: str) -> ModelEntry:
        return self.core.models.get(name, version or None)

    # repository, trace, logging ---------------------------------------------------------------------------------

    def _repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for row in self.core.repository.index(request.ready):
            response.models.add(
                name=row["name"],
                version=row.get("version", ""),
                state=row.get("state", ""),
                reason=row.get("reason", ""),
            )
        return response

    async def _repository_load(self, request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, value in request.parameters.items():
            if key == "config":
                config = value.string_param
            elif key.startswith("file:"):
                files[key[len("file:") :]] = value.bytes_param
        await self.core.repository.request_load(request.model_name, config, files)
        return pb.RepositoryModelLoadResponse()

    async def _repository_unload(self, request: pb.RepositoryModelUnloadRequest) -> pb.RepositoryModelUnloadResponse:
        dependents = request.parameters.get("unload_dependents")
        await self.core.repository.request_unload(request.model_name, dependents is not None and dependents.bool_param)
        return pb.RepositoryModelUnloadResponse()

    # shared memory: Triton's extension (pyserve.frontends.shared_memory) ------------------------------------------

    def _shm_status(self, kind: str, request: Any) -> Any:
        response = pb.SystemSharedMemoryStatusResponse() if kind == SYSTEM else pb.CudaSharedMemoryStatusResponse()
        for region in self.core.shared_memory.status(kind, request.name):
            response.regions[region["name"]].CopyFrom(type(response).RegionStatus(**region))
        return response

    def _system_shm_register(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.core.shared_memory.register_system(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def _cuda_shm_register(self, request: pb.CudaSharedMemoryRegisterRequest) -> pb.CudaSharedMemoryRegisterResponse:
        self.core.shared_memory.register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    def _shm_unregister(self, kind: str, request: Any) -> Any:
        self.core.shared_memory.unregister(kind, request.name)
        return pb.SystemSharedMemoryUnregisterResponse() if kind == SYSTEM else pb.CudaSharedMemoryUnregisterResponse()

    def _trace_setting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        tracing = self.core.tracing
        model = request.model_name or None
        if model is not None:
            self._entry(model, "")  # unknown model: NOT_FOUND
        if request.settings:
            # An empty value list clears the setting (a model's falls back to the server's), as in Triton.
            changes: dict[str, Any] = {}
            for key, setting in request.settings.items():
                values = list(setting.value)
                changes[key] = (values or None) if key == "trace_level" else (values[0] if values else None)
            doc = tracing.update(model, changes)
        else:
            doc = tracing.to_json(model)
        response = pb.TraceSettingResponse()
        for key, value in doc.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    def _log_settings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        logs = self.core.logs
        if request.settings:
            changes: dict[str, Any] = {}
            for key, setting in request.settings.items():
                kind = setting.WhichOneof("parameter_choice")
                changes[key] = getattr(setting, kind) if kind else None
            doc = logs.update(changes)
        else:
            doc = logs.to_json()
        response = pb.LogSettingsResponse()
        for key, value in doc.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = value
        return response

    # infer ------------------------------------------------------------------------------------------------------

    async def _model_infer(self, data: bytes, context: Context) -> bytes:
        try:
            message, raw = parse_infer_request(data)
            entry, call = decode_infer_call(message, raw, self.core.models, self.core.shared_memory)
            if self.forward_pattern is not None:
                forward_headers(call.parameters, _text_metadata(context), self.forward_pattern)
            if entry.spec.config.decoupled:
                raise UnsupportedError(
                    f"model '{entry.name}' is decoupled (streaming): use ModelStreamInfer to receive its responses"
                )
            future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            def on_response(infer: InferenceRequest, response: InferenceResponse) -> None:
                # Output buffers are only valid during this callback: encode (copy) them now.
                if future.done():
                    return
                if response.error is not None:
                    future.set_exception(response.error)
                    return
                try:
                    if call.shm_outputs is not None:
                        write_outputs(call.shm_outputs, response.outputs)
                    future.set_result(
                        infer_response_bytes(entry, call.id, response.outputs, response.parameters, call.shm_outputs)
                    )
                except InferenceError as exc:
                    future.set_exception(exc)
                except Exception as exc:
                    logger.exception("could not encode the response of request %r", call.id)
                    future.set_exception(InferenceError(f"could not encode the response: {exc}"))

            request = build_request(entry, call, on_response)
            request.reply_spin = False  # the core's reply polling would starve grpc.aio's thread of the GIL
            if self.core.tracing.active:
                request.traceparent = _traceparent(context)
            self.core.submit(request)
        except InferenceError as exc:
            await _abort(context, exc)
        except Exception as exc:
            logger.exception("unexpected error handling ModelInfer")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal server error: {exc}")
        try:
            return await future
        except asyncio.CancelledError:
            self.core.cancel(request)
            raise
        except InferenceError as exc:
            await _abort(context, exc)
        raise AssertionError("unreachable")  # abort() raises

    async def _model_stream_infer(self, requests: AsyncIterator[bytes], context: Context) -> None:
        stream = _Stream(self)
        if self.core.tracing.active:
            stream.traceparent = _traceparent(context)
        if self.forward_pattern is not None:
            stream.forwarded = list(_text_metadata(context))
        reader = asyncio.get_running_loop().create_task(stream.read(requests))
        try:
            while True:
                item = await stream.queue.get()
                if item is None:
                    break
                await context.write(item)
        finally:
            reader.cancel()
            stream.close()


class _Stream:
    """One ModelStreamInfer call: requests read as they come, responses queued as the core produces them."""

    def __init__(self, frontend: GrpcFrontend) -> None:
        self.frontend = frontend
        self.core = frontend.core
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.in_flight: set[InferenceRequest] = set()
        self.reading = True
        self.closed = False
        self.traceparent = ""  # the call's W3C traceparent metadata, for every request of the stream
        self.forwarded: list[tuple[str, str]] = []  # the call's metadata, for the forward pattern to pick from

    async def read(self, requests: AsyncIterator[bytes]) -> None:
        """Submit every request of the stream; when the client is done sending, end once all are answered."""
        try:
            async for data in requests:
                self._submit(data)
        finally:
            self.reading = False
            if not self.in_flight:
                self.queue.put_nowait(None)

    def _submit(self, data: bytes) -> None:
        message: pb.ModelInferRequest | None = None
        try:
            message, raw = parse_infer_request(data)
            entry, call = decode_infer_call(message, raw, self.core.models, self.core.shared_memory)
            if self.forwarded:
                forward_headers(call.parameters, self.forwarded, self.frontend.forward_pattern)
        except InferenceError as exc:
            self.queue.put_nowait(stream_flag_bytes(message or pb.ModelInferRequest(), str(exc)))
            return
        except Exception as exc:
            logger.exception("unexpected error decoding a stream request")
            self.queue.put_nowait(stream_flag_bytes(message or pb.ModelInferRequest(), f"internal error: {exc}"))
            return
        decoupled = entry.spec.config.decoupled
        empty_final = call.wants_empty_final_response

        def on_response(infer: InferenceRequest, response: InferenceResponse) -> None:
            if self.closed:
                return
            if response.final:
                self.in_flight.discard(infer)
            try:
                if response.error is not None:
                    self.queue.put_nowait(stream_flag_bytes(message, str(response.error)))
                elif response.final and decoupled and not response.outputs:
                    # A decoupled model's last message only says "done": sent when the client asked for it.
                    if empty_final:
                        self.queue.put_nowait(stream_flag_bytes(message))
                else:
                    if call.shm_outputs is not None:
                        write_outputs(call.shm_outputs, response.outputs)
                    self.queue.put_nowait(
                        stream_response_bytes(
                            entry, call.id, response.outputs, response.final, response.parameters, call.shm_outputs
                        )
                    )
            except InferenceError as exc:
                self.queue.put_nowait(stream_flag_bytes(message, str(exc)))
            except Exception as exc:
                logger.exception("could not encode a stream response of request %r", call.id)
                self.queue.put_nowait(stream_flag_bytes(message, f"could not encode the response: {exc}"))
            if not self.reading and not self.in_flight:
                self.queue.put_nowait(None)

        request = build_request(entry, call, on_response)
        request.reply_spin = False
        request.traceparent = self.traceparent
        try:
            self.core.submit(request)
        except InferenceError as exc:
            self.queue.put_nowait(stream_flag_bytes(message, str(exc)))
            return
        if not request.done:  # a request refused at once (a full queue) was answered inside submit()
            self.in_flight.add(request)

    def close(self) -> None:
        """The call ended (finished, cancelled or the client went away): cancel what is still running."""
        self.closed = True
        for request in self.in_flight:
            self.core.cancel(request)
        self.in_flight.clear()


def _guarded(
    function: Callable[[Any, Context], Awaitable[_R]], check: HeaderCheck | None
) -> Callable[[Any, Context], Awaitable[_R]]:
    """A raw handler (ModelInfer, ModelStreamInfer) behind ``check``: a call without the metadata ends with
    PERMISSION_DENIED before anything of it is read."""
    if check is None:
        return function

    async def guarded(request: Any, context: Context) -> _R:
        try:
            check.check(_metadata_value(context, check.header))
        except PermissionDeniedError as exc:
            await _abort(context, exc)
        return await function(request, context)

    return guarded


def _traceparent(context: Context) -> str:
    return _metadata(context, "traceparent") or ""


def _text_metadata(context: Context) -> Iterator[tuple[str, str]]:
    """The call's metadata with text values (binary ``-bin`` entries are not forwarded as parameters)."""
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            yield key, value


def _metadata_value(context: Context, name: str) -> str | bytes | None:
    """The value of the call's metadata ``name`` as grpc gives it (bytes for a ``-bin`` key), None when absent."""
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


def _metadata(context: Context, name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return str(value)
    return None


async def start_grpc_server(core: CoreApi, config: ServeConfig) -> tuple[GrpcFrontend, int]:
    """Start the gRPC front end of ``core``; returns it and the bound port."""
    frontend = GrpcFrontend(core, config)
    port = await frontend.start()
    return frontend, port
