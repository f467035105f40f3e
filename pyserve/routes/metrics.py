"""The custom routes' Prometheus counters, labelled by ``route``: served on the routes port's ``/metrics``.

The routes run in the ``Serve`` process, the core's metrics page in the core process: rather than ship counters
between the two, each process serves what it counts. Prometheus scrapes both (docs/routes.md): the core's metrics
port for the models (the requests a route makes count there like any other), the routes port for the routes. The
text is rendered by the core's renderer (``pyserve.core.metrics_collector.render``), so both pages share one format.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from pyserve.core.metrics_collector import BucketHistogram, render

# Upper bounds of the duration histogram, in milliseconds.
DURATION_BUCKETS_MS = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 10000.0)


class _RouteCounters:
    __slots__ = ("by_code", "duration_ms", "in_flight")

    def __init__(self) -> None:
        self.by_code: dict[int, int] = {}
        self.duration_ms = BucketHistogram(DURATION_BUCKETS_MS)
        self.in_flight = 0


class RouteMetrics:
    """Requests by route template, method and status code; their durations (a histogram, in ms); in flight.

    Updated from the routes' event loop and from the worker threads of sync handlers alike, under one lock held for
    a few additions per request.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, str], _RouteCounters] = {}

    def started(self, route: str, method: str) -> None:
        """A request to ``route`` (its template) began."""
        with self._lock:
            self._counters(route, method).in_flight += 1

    def finished(self, route: str, method: str, status: int, duration_ms: float) -> None:
        """It was answered with ``status`` after ``duration_ms`` (a stream: once it ended)."""
        with self._lock:
            counters = self._counters(route, method)
            counters.in_flight -= 1
            counters.by_code[status] = counters.by_code.get(status, 0) + 1
            counters.duration_ms.observe(duration_ms)

    def count(self, route: str, method: str, status: int) -> int:
        """How many requests to ``route`` were answered with ``status``."""
        with self._lock:
            counters = self._routes.get((route, method))
            return 0 if counters is None else counters.by_code.get(status, 0)

    def render(self) -> bytes:
        """The page (Prometheus text format 0.0.4)."""
        return render(self.collect())

    def collect(self) -> Iterator[Metric]:
        """The families: ``pyserve_route_requests``, ``pyserve_route_request_duration_ms``,
        ``pyserve_route_requests_in_flight``."""
        with self._lock:
            rows = [
                (route, method, dict(c.by_code), c.duration_ms.cumulative(), c.duration_ms.count, c.duration_ms.total,
                 c.in_flight)
                for (route, method), c in sorted(self._routes.items())
            ]  # fmt: skip
        requests = Metric("pyserve_route_requests", "Requests answered by a custom route, by status code", "counter")
        durations = Metric(
            "pyserve_route_request_duration_ms",
            "Duration of custom route requests in milliseconds, until the answer (a stream: its end) was sent",
            "histogram",
        )
        in_flight = Metric("pyserve_route_requests_in_flight", "Custom route requests being answered", "gauge")
        for route, method, by_code, buckets, count, total, active in rows:
            labels = {"route": route, "method": method}
            for code, answered in sorted(by_code.items()):
                requests.add_sample(requests.name, {**labels, "code": str(code)}, answered)
            for bound, observed in buckets:
                durations.add_sample(durations.name + "_bucket", {**labels, "le": bound}, observed)
            durations.add_sample(durations.name + "_count", labels, count)
            durations.add_sample(durations.name + "_sum", labels, total)
            in_flight.add_sample(in_flight.name, labels, active)
        yield requests
        yield durations
        yield in_flight

    def _counters(self, route: str, method: str) -> _RouteCounters:
        counters = self._routes.get((route, method))
        if counters is None:
            counters = self._routes[(route, method)] = _RouteCounters()
        return counters
