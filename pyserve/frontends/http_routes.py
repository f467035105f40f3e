"""The HTTP API's routes: each path template, the methods it takes, the ``HttpApp`` method that answers it and the
restricted group it belongs to.

One table, ``ROUTES``, serves both the router and the API's description: docs/openapi.yaml documents exactly these
paths and methods (tests/unit/test_openapi.py checks it both ways). A template writes its parameters as OpenAPI does,
``{name}``; a parameter takes one path segment, percent-decoded. A literal segment wins over a parameter:
``/v2/models/stats`` is the statistics of every model, not the metadata of a model named "stats".

Each route names its group of tritonserver's ``--http-restricted-api`` (``ServeConfig.http_restricted_api``; see
``restricted``): a request to a route of a restricted group needs the group's header, checked before anything else
(403 without it, also for a method the route does not take, as Triton answers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple
from urllib.parse import unquote

from pyserve.frontends.http_connection import HttpProtocol, HttpRequest
from pyserve.frontends.restricted import HeaderCheck
from pyserve.frontends.shared_memory import CUDA, SYSTEM

# What a route's handler is called with: the connection, the request and the path's parameters.
Handler = Callable[[HttpProtocol, HttpRequest, dict[str, str]], None]


class Route(NamedTuple):
    """One path of the API: its methods, its template, the name of the ``HttpApp`` method answering it, its
    restricted group (``server_config.RESTRICTED_GROUPS``), and parameters the route itself fixes (``kind`` of the
    shared-memory routes)."""

    methods: tuple[str, ...]
    template: str
    handler: str
    group: str
    fixed: tuple[tuple[str, str], ...] = ()


def _model_routes(prefix: str) -> tuple[Route, ...]:
    return (
        Route(("GET",), prefix, "model_metadata", "metadata"),
        Route(("GET",), f"{prefix}/config", "model_config", "model-config"),
        Route(("GET",), f"{prefix}/ready", "model_ready", "health"),
        Route(("GET",), f"{prefix}/stats", "model_stats", "statistics"),
        Route(("POST",), f"{prefix}/infer", "infer", "inference"),
        Route(("POST",), f"{prefix}/generate", "generate", "inference"),
        Route(("POST",), f"{prefix}/generate_stream", "generate_stream", "inference"),
    )


def _shared_memory_routes(segment: str, kind: str) -> tuple[Route, ...]:
    fixed = (("kind", kind),)
    group = "shared-memory"
    return (
        Route(("GET",), f"/v2/{segment}/status", "shm_status", group, fixed),
        Route(("GET",), f"/v2/{segment}/region/{{region}}/status", "shm_status", group, fixed),
        Route(("POST",), f"/v2/{segment}/region/{{region}}/register", "shm_register", group, fixed),
        Route(("POST",), f"/v2/{segment}/unregister", "shm_unregister", group, fixed),
        Route(("POST",), f"/v2/{segment}/region/{{region}}/unregister", "shm_unregister", group, fixed),
    )


ROUTES: tuple[Route, ...] = (
    # The status page (pyserve.frontends.dashboard); 404 with ServeConfig.dashboard off. It shows the statistics.
    Route(("GET",), "/", "dashboard_redirect", "statistics"),
    Route(("GET",), "/dashboard", "dashboard_page", "statistics"),
    Route(("GET",), "/dashboard/data", "dashboard_data", "statistics"),
    Route(("GET",), "/v2", "server_metadata", "metadata"),
    Route(("GET",), "/v2/health/live", "health_live", "health"),
    Route(("GET",), "/v2/health/ready", "health_ready", "health"),
    Route(("GET",), "/v2/models/stats", "all_model_stats", "statistics"),
    *_model_routes("/v2/models/{model}"),
    *_model_routes("/v2/models/{model}/versions/{version}"),
    Route(("GET", "POST"), "/v2/models/{model}/trace/setting", "model_trace_setting", "trace"),
    Route(("GET", "POST"), "/v2/trace/setting", "trace_setting", "trace"),
    Route(("GET", "POST"), "/v2/logging", "log_settings", "logging"),
    Route(("POST",), "/v2/repository/index", "repository_index", "model-repository"),
    Route(("POST",), "/v2/repository/models/{model}/load", "repository_load", "model-repository"),
    Route(("POST",), "/v2/repository/models/{model}/unload", "repository_unload", "model-repository"),
    *_shared_memory_routes("systemsharedmemory", SYSTEM),
    *_shared_memory_routes("cudasharedmemory", CUDA),
    # Where RemoteServe attaches: server information (RemoteServe also takes the tcp:// address itself).
    Route(("GET",), "/v2/pyserve/remote", "remote_address", "metadata"),
)


class BoundRoute:
    """A route compiled for matching, its handler bound to an app."""

    __slots__ = ("check", "handler", "literals", "methods", "parameters", "route", "wrong_method")

    def __init__(self, route: Route, handler: Handler, check: HeaderCheck | None = None) -> None:
        self.route = route
        self.handler = handler
        # The header the route's group needs (None: not restricted).
        self.check = check
        self.methods = tuple(method.encode() for method in route.methods)
        self.wrong_method = f"use {' or '.join(route.methods)} for {route.template}"
        parts = route.template.strip("/").split("/")
        # (position, text) of each literal segment, and (position, name) of each parameter.
        self.literals = tuple((i, part) for i, part in enumerate(parts) if not part.startswith("{"))
        self.parameters = tuple((i, part[1:-1]) for i, part in enumerate(parts) if part.startswith("{"))

    def matches(self, segments: list[str]) -> bool:
        """Whether each literal segment of the template is the path's."""
        return all(segments[i] == text for i, text in self.literals)

    def arguments(self, segments: list[str]) -> dict[str, str]:
        """The path's parameters (percent-decoded) and the route's fixed ones."""
        values = {name: unquote(segments[i]) for i, name in self.parameters}
        values.update(self.route.fixed)
        return values


class Router:
    """Finds a path's route among ``routes``, each handler the method of ``app`` the route names, each restricted
    group's routes with the group's check of ``checks``."""

    def __init__(
        self, app: object, routes: tuple[Route, ...] = ROUTES, checks: Mapping[str, HeaderCheck] | None = None
    ) -> None:
        # By segment count and last segment (most routes end in a literal), then by segment count alone for routes
        # ending in a parameter; more literal segments first, so a literal wins over a parameter.
        self._by_end: dict[tuple[int, str], list[BoundRoute]] = {}
        self._by_count: dict[int, list[BoundRoute]] = {}
        for route in routes:
            bound = BoundRoute(route, getattr(app, route.handler), (checks or {}).get(route.group))
            count = len(route.template.strip("/").split("/"))
            last = route.template.rsplit("/", 1)[-1]
            if last.startswith("{"):
                self._by_count.setdefault(count, []).append(bound)
            else:
                self._by_end.setdefault((count, last), []).append(bound)
        for candidates in (*self._by_end.values(), *self._by_count.values()):
            candidates.sort(key=lambda bound: -len(bound.literals))

    def match(self, segments: list[str]) -> BoundRoute | None:
        """The route of a path split into segments, or None (404)."""
        count = len(segments)
        for candidates in (self._by_end.get((count, segments[-1])), self._by_count.get(count)):
            if candidates:
                for bound in candidates:
                    if bound.matches(segments):
                        return bound
        return None
