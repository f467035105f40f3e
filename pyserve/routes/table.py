"""The routes a ``Serve`` declared with ``Serve.route``: checked when declared, served by ``pyserve.routes.server``.

Nothing here imports Starlette: declaring routes is plain bookkeeping, so ``Serve`` can hold a table without the
routes extra installed until a route is actually declared.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

from pyserve.errors import ConfigError

# The methods a route may take (HEAD is answered for GET routes by Starlette itself).
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Where the routes port serves its own Prometheus counters (pyserve.routes.metrics); no route may take it.
METRICS_PATH = "/metrics"
INSTALL_HINT = "custom routes need Starlette and uvicorn: pip install 'pyserve[routes]'"
# A Starlette path parameter: {name} or {name:convertor}.
_PARAMETER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(str|path|int|float|uuid))?\}")

Handler = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class RouteSpec:
    """One declared route: its path template (Starlette's syntax, ``/items/{item_id:int}``), methods and handler."""

    path: str
    methods: tuple[str, ...]
    handler: Handler

    @property
    def name(self) -> str:
        """The handler's qualified name, for logs."""
        return getattr(self.handler, "__qualname__", repr(self.handler))

    @property
    def is_async(self) -> bool:
        """Whether the handler runs on the routes' event loop (``async def``, sync or generator) rather than in a
        worker thread."""
        return inspect.iscoroutinefunction(self.handler) or inspect.isasyncgenfunction(self.handler)


class RouteTable:
    """The routes declared so far, in order; ``on_added`` (set by the routes server while it runs) hears of each
    route declared after the server started."""

    def __init__(self) -> None:
        self.routes: list[RouteSpec] = []
        self.on_added: Callable[[RouteSpec], None] | None = None

    def __bool__(self) -> bool:
        return bool(self.routes)

    def add(self, path: str, methods: Sequence[str], handler: Handler) -> RouteSpec:
        """Check and record a route; ConfigError names what is wrong."""
        spec = RouteSpec(check_path(path), check_methods(path, methods), check_handler(path, handler))
        for existing in self.routes:
            if existing.path == spec.path:
                both = sorted(set(existing.methods) & set(spec.methods))
                if both:
                    raise ConfigError(
                        f"route {path}: {', '.join(both)} is already served by {existing.name}; declare each "
                        "path and method once"
                    )
        self.routes.append(spec)
        if self.on_added is not None:
            self.on_added(spec)
        return spec


def check_path(path: object) -> str:
    """A route's path template: a string starting with '/', its parameters in Starlette's ``{name[:type]}`` form."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"a route's path must be a string starting with '/', got {path!r}")
    if path.rstrip("/") == METRICS_PATH:
        raise ConfigError(f"route {path}: the routes port serves its own metrics there; choose another path")
    leftover = _PARAMETER.sub("", path)
    if "{" in leftover or "}" in leftover:
        raise ConfigError(
            f"route {path}: a path parameter is written {{name}} or {{name:type}} with type str, path, int, float "
            "or uuid"
        )
    return path


def check_methods(path: str, methods: Sequence[str]) -> tuple[str, ...]:
    """The methods of a route, upper case, each once; ConfigError for an unknown one."""
    if isinstance(methods, str):
        methods = [methods]
    names = tuple(dict.fromkeys(str(method).upper() for method in methods))
    if not names:
        raise ConfigError(f"route {path}: give at least one method, e.g. methods=['POST']")
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise ConfigError(f"route {path}: unknown method(s) {', '.join(unknown)}; expected {', '.join(METHODS)}")
    return names


def check_handler(path: str, handler: object) -> Handler:
    """A route's handler: anything callable with the request."""
    if not callable(handler):
        raise ConfigError(f"route {path}: the handler must be callable, got {type(handler).__name__}")
    return handler
