"""The core process's listeners: the HTTP, gRPC and metrics front ends, started together and closed together.

``start_listeners`` starts each front end on the running loop with the core's ``CoreApi``. A port that cannot be
bound raises ``ServerError`` naming the listener, the address and the system's reason —
``cannot listen for gRPC on 127.0.0.1:8001: Address already in use; ...`` — after closing the listeners already
started; the process's entry point reports that one line to ``Serve``. TLS files that cannot serve
(``ServeConfig.tls_certfile`` ...) raise ``ServerError`` the same way, naming the setting (``pyserve.frontends.tls``).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Awaitable
from typing import TypeVar

from pyserve.config import ServeConfig
from pyserve.core.api import CoreApi
from pyserve.errors import ServerError
from pyserve.frontends.grpc import GrpcFrontend, start_grpc_server
from pyserve.frontends.http import start_http_server
from pyserve.frontends.metrics_endpoint import start_metrics_server

_T = TypeVar("_T")


class Listeners:
    """The front ends of one core and the ports they are bound to."""

    def __init__(self) -> None:
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self._http: asyncio.base_events.Server | None = None
        self._grpc: GrpcFrontend | None = None
        self._metrics: asyncio.base_events.Server | None = None

    async def start(self, core: CoreApi, config: ServeConfig) -> None:
        """Start the front ends of ``core``; if one cannot start, close those already started and raise."""
        try:
            # A front end turned off (ServeConfig.allow_http / allow_grpc / allow_metrics) does not listen: port 0.
            if config.allow_http:
                self._http, self.http_port = await _listen("HTTP", config, "http_port", start_http_server(core, config))
            if config.allow_grpc:
                self._grpc, self.grpc_port = await _listen("gRPC", config, "grpc_port", start_grpc_server(core, config))
            if config.allow_metrics:
                self._metrics, self.metrics_port = await _listen(
                    "metrics", config, "metrics_port", start_metrics_server(core, config)
                )
        except BaseException:
            await self.close()
            raise

    def stop_accepting(self) -> None:
        """Take no new HTTP connections (those open go on: a new request on one is refused by the core)."""
        if self._http is not None:
            self._http.close()
            self._http = None

    async def stop_grpc(self, grace_s: float) -> None:
        """Take no new gRPC calls; those in progress get ``grace_s`` to finish, then are cancelled."""
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
            self._grpc = None

    async def close(self) -> None:
        """Stop accepting connections; gRPC calls in progress are cancelled (which cancels their requests)."""
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._grpc is not None:
            await self._grpc.stop()
            self._grpc = None


async def start_listeners(core: CoreApi, config: ServeConfig) -> Listeners:
    """Start the HTTP, gRPC and metrics front ends of ``core`` on config.host (a port of 0 picks a free one)."""
    listeners = Listeners()
    await listeners.start(core, config)
    return listeners


async def _listen(listener: str, config: ServeConfig, port_field: str, start: Awaitable[_T]) -> _T:
    """Await a front end's start; a port it cannot bind raises ServerError naming the listener, address and cause."""
    try:
        return await start
    except OSError as exc:
        port = getattr(config, port_field)
        code, reason = _bind_failure(config.host, port, exc)
        message = f"cannot listen for {listener} on {config.host}:{port}: {reason}"
        if code == errno.EADDRINUSE:
            option = port_field.replace("_", "-")
            message += (
                f"; another process holds the port: stop it or choose another (--{option}, ServeConfig.{port_field})"
            )
        raise ServerError(message) from exc


def _bind_failure(host: str, port: int, exc: OSError) -> tuple[int | None, str]:
    """The errno and the operating system's words for why host:port could not be bound: 'Address already in use'."""
    if exc.errno is None:
        # gRPC says only "Failed to bind to address"; binding the address ourselves gets the system's reason.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            socket.create_server((host, port), family=family).close()
        except OSError as probe:
            exc = probe
    if exc.errno is None or isinstance(exc, socket.gaierror):
        return None, str(exc)
    return exc.errno, os.strerror(exc.errno)
