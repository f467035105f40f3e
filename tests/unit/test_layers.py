"""pyserve's modules import one way (docs/architecture.md, "Layers"): no import cycles, and each layer imports only
what lies below it.

The graph is read from the source with ``ast``, so every import counts: at module level, inside functions and under
``if TYPE_CHECKING:`` alike (a type-only import is still a dependency of the code that names the type). Generated
protocol stubs (``*_pb2*``) are left out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyserve

PACKAGE_DIR = Path(pyserve.__file__).resolve().parent

# Shared definitions, imported by every layer: they import only each other.
SHARED = frozenset(
    {
        "pyserve.config",
        "pyserve.sequence_config",
        "pyserve.server_config",
        "pyserve.dtypes",
        "pyserve.errors",
        "pyserve.request",
        "pyserve.decorators",
        "pyserve.devices",
        "pyserve.ensemble",
        "pyserve.grouping",
        "pyserve.wrapping",
    }
)

# Layers that may import only the areas listed (besides their own modules). An area is a module or a package with
# everything in it.
MAY_IMPORT_ONLY: dict[str, frozenset[str]] = {
    "pyserve.transport": frozenset({"pyserve.config", "pyserve.dtypes", "pyserve.errors"}),
    "pyserve.telemetry": SHARED,
    "pyserve.worker": SHARED | {"pyserve.transport", "pyserve.telemetry"},
}
# Layers that may import anything below them but never the areas listed.
MUST_NOT_IMPORT: dict[str, frozenset[str]] = {
    "pyserve.core": frozenset(
        {
            "pyserve.frontends",
            "pyserve.worker",
            "pyserve.serve",
            "pyserve.cli",
            "pyserve.core_process",
            "pyserve.inprocess",
            "pyserve.thread_instances",
            "pyserve.client",
            "pyserve.pytriton",
            "pyserve.routes",
        }
    ),
    "pyserve.frontends": frozenset({"pyserve.worker", "pyserve.serve", "pyserve.cli", "pyserve.routes"}),
    # Custom routes and the ASGI app run in the Serve process, above the core and the front ends: Serve holds them,
    # so they reach it only through the interface they are written against, never the module.
    "pyserve.routes": frozenset({"pyserve.serve", "pyserve.cli", "pyserve.worker"}),
    # A repository is read by the core (and Serve.bind_model); backends run in instances and know neither.
    "pyserve.repository": frozenset({"pyserve.core", "pyserve.frontends", "pyserve.serve", "pyserve.cli"}),
    # The clients run anywhere: they speak the wire protocols, and know nothing of the server's insides.
    "pyserve.client": frozenset(
        {
            "pyserve.core",
            "pyserve.worker",
            "pyserve.serve",
            "pyserve.cli",
            "pyserve.repository",
            "pyserve.backends",
            "pyserve.routes",
        }
    ),
    "pyserve.backends": frozenset(
        {"pyserve.core", "pyserve.frontends", "pyserve.repository", "pyserve.serve", "pyserve.cli"}
    ),
}

# Generated message definitions (Triton's ModelConfig, the gRPC messages): data types any layer may use.
PROTOCOL_STUBS = "pyserve.frontends.protocol"

# The front ends reach the core only through the interface they are written against (``CoreApi`` and the views it
# returns) and the request types they build, submit and answer.
FRONTENDS_SEE_OF_CORE = frozenset({"pyserve.core.api", "pyserve.core.inference", "pyserve.core.infer_call"})

# The one module allowed across a line above: the core process's entry point puts the process together, building
# the core and starting the front ends with the core's API. Nothing imports it (test_nothing_imports_the_wiring
# checks), so it cannot close a cycle.
WIRING: dict[str, frozenset[str]] = {"pyserve.core.__main__": frozenset({"pyserve.frontends"})}

Graph = dict[str, set[str]]


# the import graph ------------------------------------------------------------------------------------------------


def import_graph(package_dir: Path) -> Graph:
    """Module name -> the modules of the same package it imports, from the source of every module in it."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    graph: Graph = {}
    for module, path in modules.items():
        # The package a relative import starts from: the module's own for __init__.py, else its parent's.
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # "from pyserve.core import inference" imports the module pyserve.core.inference.
                imported.add(base)
                imported.update(f"{base}.{alias.name}" for alias in node.names)
        graph[module] = {name for name in imported if name in modules and name != module}
    return graph


def _within(module: str, area: str) -> bool:
    return module == area or module.startswith(area + ".")


def _layer(module: str, layers: Iterable[str]) -> str | None:
    return next((layer for layer in layers if _within(module, layer)), None)


def import_cycles(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Each group of modules that import each other in a cycle (a strongly connected component, found with
    Tarjan's algorithm), as one closed path through it and every module of the group."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [
        f"{' -> '.join(_closed_path(graph, component))} (the cycle joins {', '.join(sorted(component))})"
        for component in components
    ]


def _closed_path(graph: Mapping[str, Iterable[str]], component: set[str]) -> list[str]:
    # A shortest way back to the first module of the component, through the component (breadth first).
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for module in frontier:
            for target in sorted(graph[module]):
                if target not in component:
                    continue
                if target == start:
                    path = [module]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in came_from:
                    came_from[target] = module
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {sorted(component)}")


def layer_violations(graph: Graph) -> list[str]:
    """Every import that breaks a layer rule, as ``importer -> imported (the rule)``."""
    found: list[str] = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if source in SHARED and target not in SHARED:
                found.append(f"{source} -> {target} (a shared definition imports only other shared definitions)")
            layer = _layer(source, MAY_IMPORT_ONLY)
            if layer is not None and not _within(target, layer):
                allowed = MAY_IMPORT_ONLY[layer]
                if not any(_within(target, area) for area in allowed):
                    found.append(f"{source} -> {target} ({layer} may import only {', '.join(sorted(allowed))})")
            layer = _layer(source, MUST_NOT_IMPORT)
            if layer is not None and not _within(target, PROTOCOL_STUBS):
                for area in sorted(MUST_NOT_IMPORT[layer] - WIRING.get(source, frozenset())):
                    if _within(target, area):
                        found.append(f"{source} -> {target} ({layer} never imports {area})")
            if (
                _within(source, "pyserve.frontends")
                and _within(target, "pyserve.core")
                and target not in FRONTENDS_SEE_OF_CORE
            ):
                allowed = ", ".join(sorted(FRONTENDS_SEE_OF_CORE))
                found.append(f"{source} -> {target} (pyserve.frontends reaches the core only through {allowed})")
    return found


def _edge_list(lines: Iterable[str]) -> str:
    return "\n  " + "\n  ".join(lines)


# pyserve's layers ------------------------------------------------------------------------------------------------


def test_pyserve_has_no_import_cycles() -> None:
    cycles = import_cycles(import_graph(PACKAGE_DIR))
    assert not cycles, "import cycles (module -> a module it imports):" + _edge_list(cycles)


def test_each_layer_imports_only_what_lies_below_it() -> None:
    violations = layer_violations(import_graph(PACKAGE_DIR))
    assert not violations, "imports against the layers:" + _edge_list(violations)


def test_nothing_imports_the_wiring() -> None:
    graph = import_graph(PACKAGE_DIR)
    importers = sorted(
        f"{source} -> {target}" for source, targets in graph.items() for target in targets & WIRING.keys()
    )
    assert not importers, "the process's wiring is imported:" + _edge_list(importers)


# the checks themselves -------------------------------------------------------------------------------------------


def _write_package(root: Path, files: Mapping[str, str]) -> Path:
    for name, source in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "pkg"


def test_the_graph_counts_every_kind_of_import(tmp_path: Path) -> None:
    package = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "top.py": "import pkg.low\n",
            "low.py": "",
            "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import Thing\n",
            "lazy.py": "def f():\n    from pkg import low\n    return low\n",
            "sub/__init__.py": "from . import leaf\n",
            "sub/leaf.py": "from ..low import x\nfrom .. import top\n",
            "stub_pb2.py": "import pkg.top\n",
        },
    )
    assert import_graph(package) == {
        "pkg": set(),
        "pkg.top": {"pkg.low"},
        "pkg.low": set(),
        "pkg.typed": {"pkg.top"},
        "pkg.lazy": {"pkg", "pkg.low"},
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": {"pkg.low", "pkg", "pkg.top"},
    }


def test_a_cycle_is_reported_as_a_closed_path() -> None:
    graph: Graph = {"a": {"b", "d"}, "b": {"a", "c"}, "c": {"a"}, "d": set()}
    assert import_cycles(graph) == ["a -> b -> a (the cycle joins a, b, c)"]


def test_a_layer_violation_names_the_edge_and_the_rule() -> None:
    graph: Graph = {
        "pyserve.worker.instance": {"pyserve.core.tracing", "pyserve.telemetry.spans", "pyserve.errors"},
        "pyserve.core.ensemble_executor": {"pyserve.frontends.common"},
        "pyserve.errors": {"pyserve.transport.shm"},
    }
    assert layer_violations(graph) == [
        "pyserve.core.ensemble_executor -> pyserve.frontends.common (pyserve.core never imports pyserve.frontends)",
        "pyserve.errors -> pyserve.transport.shm (a shared definition imports only other shared definitions)",
        "pyserve.worker.instance -> pyserve.core.tracing (pyserve.worker may import only pyserve.config, "
        "pyserve.decorators, pyserve.devices, pyserve.dtypes, pyserve.ensemble, pyserve.errors, pyserve.grouping, "
        "pyserve.request, pyserve.sequence_config, pyserve.server_config, pyserve.telemetry, pyserve.transport, "
        "pyserve.wrapping)",
    ]


def test_front_ends_see_only_the_core_api_and_only_the_wiring_imports_them() -> None:
    graph: Graph = {
        "pyserve.frontends.http": {"pyserve.core.api", "pyserve.core.inference", "pyserve.core.server"},
        "pyserve.core.__main__": {"pyserve.core.server", "pyserve.frontends.listeners"},
        "pyserve.core.server": {"pyserve.frontends.http"},
    }
    assert layer_violations(graph) == [
        "pyserve.core.server -> pyserve.frontends.http (pyserve.core never imports pyserve.frontends)",
        "pyserve.frontends.http -> pyserve.core.server (pyserve.frontends reaches the core only through "
        "pyserve.core.api, pyserve.core.infer_call, pyserve.core.inference)",
    ]
