"""The ``pyserve`` command: ``pyserve demo``, ``pyserve serve module:obj``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from pyserve._version import __version__
from pyserve.config import ServeConfig
from pyserve.serve import Serve

_SERVER_OPTIONS = ("host", "http_port", "grpc_port", "metrics_port", "log_level")


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (default 127.0.0.1; 0.0.0.0 to listen on all interfaces)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8000; 0 picks a free one)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 8001; 0 picks a free one)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default 8002; 0 picks a free one)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING (default) or ERROR")


def _serve_config(args: argparse.Namespace) -> ServeConfig:
    overrides = {key: getattr(args, key) for key in _SERVER_OPTIONS if getattr(args, key) is not None}
    return ServeConfig.from_env(**overrides)


def _demo(args: argparse.Namespace) -> int:
    from pyserve.demo import bind_demo_models, usage_text

    server = Serve(_serve_config(args))
    names = bind_demo_models(server)
    server.run()
    grpc_address = f"{server.config.host}:{server.grpc_port}" if server.grpc_port else ""
    print(usage_text(server.url, names, grpc_address), flush=True)
    server.serve()
    return 0


def _serve(args: argparse.Namespace) -> int:
    module_name, _, attribute = args.target.partition(":")
    sys.path.insert(0, ".")
    module = importlib.import_module(module_name)
    target = getattr(module, attribute or "server", None)
    if not isinstance(target, Serve):
        print(f"pyserve: {args.target} is not a pyserve.Serve object", file=sys.stderr)
        return 2
    if any(getattr(args, key) is not None for key in _SERVER_OPTIONS):
        target.config = _serve_config(args)
    target.run()
    print(f"pyserve is serving on {target.url}", flush=True)
    target.serve()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyserve`` command."""
    parser = argparse.ArgumentParser(prog="pyserve", description="Serve Python functions over KServe v2 / Triton.")
    parser.add_argument("--version", action="version", version=f"pyserve {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="serve the embedded demo models (identity, add_sub, mlp)")
    _add_server_options(demo)
    demo.set_defaults(handler=_demo)
    serve = commands.add_parser("serve", help="serve the Serve object of a module, e.g. `pyserve serve app:server`")
    serve.add_argument("target", help="module:attribute naming a pyserve.Serve with models bound")
    _add_server_options(serve)
    serve.set_defaults(handler=_serve)
    args = parser.parse_args(argv)
    logging.basicConfig(level=(args.log_level or "WARNING").upper(), format="%(levelname)s %(name)s: %(message)s")
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
