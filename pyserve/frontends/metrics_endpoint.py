"""The metrics endpoint: ``GET /metrics`` on ``ServeConfig.metrics_port`` (8002), as Triton serves it.

A second listener of the HTTP front end's connection protocol on the core's loop (no thread, no process of its
own), with an app that answers only ``/metrics``. The page is built when the scrape arrives
(``CoreApi.metrics_page``, from ``pyserve.core.metrics_collector``). It is not restricted (tritonserver's restricted
groups have no metrics group) and serves plain HTTP unless ``metrics`` is among ``ServeConfig.tls_endpoints``.
"""

from __future__ import annotations

import asyncio
import logging

from pyserve.config import ServeConfig
from pyserve.core.api import METRICS_CONTENT_TYPE, CoreApi
from pyserve.core.inference import InferenceRequest
from pyserve.frontends.http_connection import HttpProtocol, HttpRequest, listen
from pyserve.frontends.tls import server_ssl_context

logger = logging.getLogger(__name__)


class MetricsApp:
    """Answers ``GET /metrics``; everything else is 404 (405 for another method)."""

    def __init__(self, core: CoreApi, config: ServeConfig) -> None:
        self.core = core
        self.max_body = config.max_request_bytes

    def handle(self, conn: HttpProtocol, request: HttpRequest) -> None:
        """Answer one request with the metrics page, or 404/405."""
        if request.path.rstrip(b"/") != b"/metrics":
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}; metrics are at /metrics")
            return
        if request.method != b"GET":
            conn.respond_error(request, 405, "use GET")
            return
        try:
            page = self.core.metrics_page()
        except Exception as exc:
            logger.exception("could not collect metrics")
            conn.respond_error(request, 500, f"could not collect metrics: {exc}")
            return
        conn.respond(request, 200, page, METRICS_CONTENT_TYPE)

    def cancel(self, request: InferenceRequest) -> None:
        """Nothing to cancel: the page is answered at once."""


async def start_metrics_server(core: CoreApi, config: ServeConfig) -> tuple[asyncio.base_events.Server, int]:
    """Listen on config.host:metrics_port (0 picks a free port; TLS when ``metrics`` is among
    ``tls_endpoints``); returns the server and the bound port."""
    return await listen(
        MetricsApp(core, config),
        config.host,
        config.metrics_port,
        backlog=128,
        header_timeout_s=config.http_header_timeout_s,
        tls=server_ssl_context(config) if config.uses_tls("metrics") else None,
    )
