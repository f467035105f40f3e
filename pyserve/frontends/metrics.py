"""The metrics endpoint: ``GET /metrics`` on ``ServeConfig.metrics_port`` (8002), as Triton serves it.

A second listener of the HTTP front end's protocol on the core's loop (no thread, no process of its own), with an
app that answers only ``/metrics``. The page is built when the scrape arrives (``pyserve.core.metrics``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pyserve.config import ServeConfig
from pyserve.core.metrics import CONTENT_TYPE
from pyserve.frontends.http import HttpApp, HttpProtocol, HttpRequest, listen

if TYPE_CHECKING:
    from pyserve.core.server import CoreServer

logger = logging.getLogger(__name__)


class MetricsApp(HttpApp):
    """Answers ``GET /metrics``; everything else is 404 (405 for another method)."""

    def handle(self, conn: HttpProtocol, request: HttpRequest) -> None:
        if request.path.rstrip(b"/") != b"/metrics":
            conn.respond_error(request, 404, f"not found: {request.path.decode('latin-1')}; metrics are at /metrics")
            return
        if request.method != b"GET":
            conn.respond_error(request, 405, "use GET")
            return
        try:
            page = self.core.metrics.render()
        except Exception as exc:
            logger.exception("could not collect metrics")
            conn.respond_error(request, 500, f"could not collect metrics: {exc}")
            return
        conn.respond(request, 200, page, CONTENT_TYPE)


async def start_metrics_server(core: CoreServer, config: ServeConfig) -> tuple[asyncio.base_events.Server, int]:
    """Listen on config.host:metrics_port (0 picks a free port); returns the server and the bound port."""
    return await listen(MetricsApp(core, config), config.host, config.metrics_port, backlog=128)
