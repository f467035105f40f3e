"""The custom routes' server: uvicorn in a thread of the ``Serve`` process, on ``ServeConfig.routes_port``.

``ServedRoutes`` is what ``Serve`` holds: the declared routes and, once the server runs with at least one of them,
the uvicorn server. The socket is bound in the caller's thread, so a port in use fails ``Serve.run()`` at once with a
``ServerError``; uvicorn then serves it on an event loop of its own (uvloop when installed) in a daemon thread.
Sync handlers run in Starlette's worker threads, each with its own in-process channel to the core. With
``ServeConfig.tls_certfile`` (and ``routes`` among ``tls_endpoints``) uvicorn serves TLS with the same files as the
core's ports.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyserve.config import ServeConfig
from pyserve.errors import ConfigError, ServerError
from pyserve.routes.table import INSTALL_HINT, Handler, RouteTable

if TYPE_CHECKING:
    from pyserve.routes.app import RoutesState

logger = logging.getLogger(__name__)

# How long stop() lets requests in flight finish (a stream is cut after it).
GRACEFUL_SHUTDOWN_S = 5
_STARTED_POLL_S = 0.005


class ServedRoutes:
    """The routes of one ``Serve``: declared any time, served while the server runs and has routes."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.table = RouteTable()
        self.port = 0
        self.state: RoutesState | None = None
        self._server: Any = None  # uvicorn.Server
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._listening = False  # between listen() and stop(): a route declared meanwhile starts the server
        self._ready = False  # between ready() and stop(): the routes answer (else 503)

    @property
    def serving(self) -> bool:
        """Whether the routes' server is up."""
        return self._thread is not None and self._thread.is_alive()

    def declare(self, path: str, methods: Sequence[str], handler: Handler) -> None:
        """Add a route (checked at once); on a running server it is served at once."""
        if not self.table:
            _check_installed()
        self.table.add(path, methods, handler)
        if self._listening and self._server is None:
            self._start_server()

    def listen(self) -> None:
        """The core runs and its models are loading: serve the routes, if any, answering 503 until ``ready``."""
        self._listening = True
        if self.table and self._server is None:
            self._start_server()

    def ready(self) -> None:
        """``Serve.run()`` loaded every model: answer the routes."""
        self.listen()
        self._ready = True
        if self.state is not None:
            self.state.ready = True

    def stop(self) -> None:
        """Stop answering (503), let requests in flight finish for a while, then close the port."""
        self._listening = self._ready = False
        if self.state is not None:
            self.state.ready = False
        server, thread = self._server, self._thread
        self._server = self._thread = None
        self.table.on_added = None
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(GRACEFUL_SHUTDOWN_S + 5)
            if thread.is_alive():
                logger.warning("the routes' server did not stop within %d s", GRACEFUL_SHUTDOWN_S + 5)
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self.port = 0

    # internals ------------------------------------------------------------------------------------------------

    def _start_server(self) -> None:
        import uvicorn

        from pyserve.routes.app import RoutesState, build_app

        config = self.config
        sock = _bind(config.host, config.routes_port)
        state = RoutesState(config.max_request_bytes, config.debug_errors)
        state.ready = self._ready
        app = build_app(self.table, state, serve_metrics=config.allow_metrics)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_config=None,  # a library leaves logging to the application
                access_log=False,  # a line per request costs more than the request
                lifespan="off",
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                server_header=False,
                **_tls_options(config),
            )
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="pyserve-routes", daemon=True)
        thread.start()
        deadline = time.monotonic() + config.startup_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise ServerError(f"the routes' server on {config.host}:{sock.getsockname()[1]} did not start")
            time.sleep(_STARTED_POLL_S)
        self._server, self._thread, self._socket, self.state = server, thread, sock, state
        self.port = int(sock.getsockname()[1])


def _tls_options(config: ServeConfig) -> dict[str, Any]:
    """uvicorn's TLS settings when ``routes`` is among ``ServeConfig.tls_endpoints`` (docs/security.md)."""
    if not config.uses_tls("routes"):
        return {}
    options: dict[str, Any] = {"ssl_certfile": config.tls_certfile, "ssl_keyfile": config.tls_keyfile}
    if config.tls_client_ca:
        options.update(ssl_ca_certs=config.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServerError(f"could not listen on {host}:{port} for the routes (ServeConfig.routes_port): {exc}") from exc
    return sock


def _check_installed() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
