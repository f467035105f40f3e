"""The ``pyserve`` command: ``pyserve demo``, ``pyserve serve module:server``, ``pyserve serve module:function``.

Server options (``--http-port`` ...) map onto ``ServeConfig`` fields: they are exported as the ``PYSERVE_<FIELD>``
variables ``ServeConfig.from_env()`` (and so ``Serve()``) reads, and replace the fields they name on the config of a
``Serve`` the module made, leaving its other fields as the module set them. docs/cli.md describes the module layouts
``pyserve serve`` accepts.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType, ModuleType
from typing import Any

from pyserve._version import __version__
from pyserve.bench.command import add_bench_arguments, add_tune_arguments, run_bench_command, run_tune_command
from pyserve.config import ModelConfig, ServeConfig, Tensor
from pyserve.core_process import core_starts
from pyserve.dtypes import DATATYPES, datatype_of
from pyserve.errors import ConfigError, PyServeError
from pyserve.serve import Serve
from pyserve.server_config import env_value

logger = logging.getLogger(__name__)

_SERVER_OPTIONS = (
    "host",
    "http_port",
    "grpc_port",
    "metrics_port",
    "log_level",
    "http_header_forward_pattern",
    "grpc_header_forward_pattern",
    "allow_http",
    "allow_grpc",
    "allow_metrics",
    "remote_port",
    "remote_host",
    "remote_advertise",
    "exit_timeout_s",
    "model_load_thread_count",
    "routes_port",
    "dashboard",
    "http_restricted_api",
    "grpc_restricted_protocol",
    "tls_certfile",
    "tls_keyfile",
    "tls_client_ca",
    "tls_endpoints",
)
# tritonserver's model repository options, by ServeConfig field.
_REPOSITORY_OPTIONS = (
    "model_repository",
    "model_control_mode",
    "repository_poll_secs",
    "load_model",
    "strict_model_config",
    "exit_on_error",
    "strict_readiness",
    "repository_hooks",
)
# Options that declare a function's model: argparse destination -> option.
_MODEL_OPTIONS = {
    "inputs": "--input",
    "outputs": "--output",
    "max_batch_size": "--max-batch-size",
    "model_name": "--model-name",
}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_TENSOR_SYNTAX = "NAME:DTYPE[:SHAPE]"
_TENSOR_EXAMPLES = "x:FP32:-1 or image:uint8:224,224,3"


class UsageError(Exception):
    """The command line names something that cannot be served; main() prints it and exits with status 2."""


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (default 127.0.0.1; 0.0.0.0 to listen on all interfaces)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8000; 0 picks a free one)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 8001; 0 picks a free one)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default 8002; 0 picks a free one)")
    parser.add_argument(
        "--routes-port", type=int, help="port of the custom routes, Serve.route (default 8003; 0 picks a free one)"
    )
    parser.add_argument(
        "--dashboard", type=_boolean, metavar="true|false", help="false turns off the status page /dashboard"
    )
    parser.add_argument(
        "--log-level", type=str.upper, choices=_LOG_LEVELS, help="DEBUG, INFO, WARNING (default) or ERROR"
    )
    for front_end in ("http", "grpc", "metrics"):
        parser.add_argument(
            f"--allow-{front_end}",
            type=_boolean,
            metavar="true|false",
            help=f"false turns the {front_end} front end off (tritonserver's flag; default true)",
        )
    for protocol in ("http", "grpc"):
        parser.add_argument(
            f"--{protocol}-header-forward-pattern",
            metavar="REGEX",
            help=f"{protocol.upper()} headers whose name matches become request parameters (tritonserver's flag)",
        )
    parser.add_argument(
        "--exit-timeout-secs",
        dest="exit_timeout_s",
        type=float,
        metavar="N",
        help="on SIGTERM, how long requests in flight may take to finish (tritonserver's flag; default 30)",
    )
    parser.add_argument(
        "--model-load-thread-count",
        type=int,
        metavar="N",
        help="how many models load at once at start (tritonserver's flag; default 4)",
    )
    _add_access_options(parser)
    group = parser.add_argument_group(
        "remote models (RemoteServe / RemoteTriton attach from other processes or hosts; docs/remote.md)"
    )
    group.add_argument(
        "--remote-port",
        type=int,
        metavar="PORT",
        help="open the authenticated tcp port remote models attach to (0 picks a free one); the token comes from "
        "PYSERVE_REMOTE_TOKEN, never from the command line",
    )
    group.add_argument("--remote-host", metavar="HOST", help="the remote port's bind address (default: --host)")
    group.add_argument(
        "--remote-advertise", metavar="tcp://HOST:PORT", help="the address peers are told to use (NAT, containers)"
    )


def _add_access_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("access control and TLS (docs/security.md)")
    for protocol, option, what in (("http", "api", "header"), ("grpc", "protocol", "metadata")):
        group.add_argument(
            f"--{protocol}-restricted-{option}",
            action="append",
            metavar="GROUPS:KEY=VALUE",
            help=f"{protocol.upper()} endpoint groups (comma-separated: health, metadata, inference, shared-memory, "
            f"model-config, model-repository, statistics, trace, logging) that need the {what} KEY: VALUE; "
            "repeatable, one group per entry (tritonserver's flag). The value shows in the process list: "
            f"PYSERVE_{protocol.upper()}_RESTRICTED_{option.upper()} (entries separated by ';') keeps it off it",
        )
    group.add_argument("--tls-certfile", metavar="PEM", help="the server's certificate (chain): serve TLS")
    group.add_argument("--tls-keyfile", metavar="PEM", help="the private key of --tls-certfile")
    group.add_argument(
        "--tls-client-ca", metavar="PEM", help="mutual TLS: clients must present a certificate these CAs signed"
    )
    group.add_argument(
        "--tls-endpoints",
        type=lambda text: tuple(item.strip() for item in text.split(",") if item.strip()),
        metavar="LIST",
        help="the front ends that serve TLS, comma-separated: http, grpc, metrics, routes (default http,grpc,routes)",
    )


def _add_repository_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving a model repository (tritonserver's options; docs/repository.md)")
    group.add_argument("--model-repository", metavar="DIR", help="a Triton-layout model repository to serve")
    group.add_argument(
        "--model-control-mode",
        choices=("none", "explicit", "poll"),
        help="none (default): load every model at start; explicit: load the --load-model ones, the rest on request; "
        "poll: load every model and reload what changes",
    )
    group.add_argument(
        "--repository-poll-secs", type=float, metavar="N", help="how often poll mode looks at the repository (15)"
    )
    group.add_argument(
        "--load-model",
        dest="load_model",
        action="append",
        metavar="NAME",
        help='a model to load at start in explicit mode, once per model; "*" loads every model',
    )
    group.add_argument(
        "--strict-model-config",
        type=_boolean,
        metavar="true|false",
        help="true: every model needs a complete config.pbtxt; false (default): completed from the model file",
    )
    group.add_argument(
        "--exit-on-error",
        type=_boolean,
        metavar="true|false",
        help="true (default): a repository model that fails to load at start fails the start; false: it is "
        "UNAVAILABLE and the others serve",
    )
    group.add_argument(
        "--strict-readiness",
        type=_boolean,
        metavar="true|false",
        help="true (default): not ready while a repository model is UNAVAILABLE; false: ready regardless",
    )
    group.add_argument(
        "--repository-hook",
        dest="repository_hooks",
        action="append",
        metavar="MODULE:FUNCTION",
        help="a load hook, called with each model's directory and config before it loads (docs/repository.md)",
    )


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving a function (module:function)")
    group.add_argument(
        "--input",
        dest="inputs",
        action="append",
        type=_tensor,
        metavar="NAME:DTYPE[:SHAPE]",
        help="an input tensor, once per input. DTYPE is a KServe name (FP32, INT64, BYTES, ...) or a numpy one "
        "(float32, int64, bytes, ...); SHAPE is comma-separated dimensions without the batch dimension, -1 for a "
        "variable one (default -1)",
    )
    group.add_argument(
        "--output",
        dest="outputs",
        action="append",
        type=_tensor,
        metavar="NAME:DTYPE[:SHAPE]",
        help="an output tensor, once per output, in the same form",
    )
    group.add_argument(
        "--max-batch-size",
        type=int,
        metavar="N",
        help="rows one call may get (default 0: no batch dimension); > 0 batches requests dynamically, as @batch wants",
    )
    group.add_argument(
        "--model-name", metavar="NAME", help="the name clients call (default: the function's attribute name)"
    )


def _tensor(text: str) -> Tensor:
    """A ``--input``/``--output`` value: ``NAME:DTYPE[:SHAPE]`` with SHAPE like ``-1`` or ``3,-1``."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {_TENSOR_SYNTAX}, e.g. {_TENSOR_EXAMPLES}")
    name, dtype, shape_text = parts[0], parts[1], parts[2] if len(parts) == 3 else "-1"
    try:
        shape = tuple(int(dim) for dim in shape_text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: shape {shape_text!r} must be comma-separated integers such as -1 or 3,-1"
        ) from None
    try:
        datatype = datatype_of(dtype)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: unknown dtype {dtype!r}; use a KServe name ({', '.join(DATATYPES)}) or a numpy one (float32)"
        ) from None
    try:
        return Tensor(name, datatype, shape)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """The server options given on the command line, by ServeConfig field."""
    keys = _SERVER_OPTIONS + (_REPOSITORY_OPTIONS if hasattr(args, "model_repository") else ())
    options = {key: getattr(args, key) for key in keys if getattr(args, key) is not None}
    for key in ("load_model", "repository_hooks", "http_restricted_api", "grpc_restricted_protocol"):
        if key in options:
            options[key] = tuple(options[key])
    return options


def _demo(args: argparse.Namespace) -> int:
    from pyserve.demo import bind_demo_models, usage_text

    server = Serve(ServeConfig.from_env())
    names = bind_demo_models(server)
    server.run()
    print(usage_text(server, names), flush=True)
    server.serve()
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.target is None:
        if args.model_repository is None:
            raise UsageError("name what to serve: module:NAME, or --model-repository DIR (see docs/cli.md)")
        model_options = [option for key, option in _MODEL_OPTIONS.items() if getattr(args, key) is not None]
        if model_options:
            raise UsageError(f"{' '.join(model_options)}: only for serving a function (module:function)")
        Serve(ServeConfig.from_env(**_server_options(args))).serve()
        return 0
    module_name, _, attribute = args.target.partition(":")
    # A module beside the caller imports as `pyserve serve app:server`, as with `python -m`.
    sys.path.insert(0, os.getcwd())
    starts_before = core_starts()
    module = _import(module_name)
    if core_starts() > starts_before:
        return _serve_started_on_import(module)
    attribute = attribute or "server"
    if not hasattr(module, attribute):
        raise UsageError(
            f"module '{module_name}' has no attribute '{attribute}'; name a Serve or a function: "
            f"pyserve serve {module_name}:NAME (see docs/cli.md)"
        )
    target = getattr(module, attribute)
    model_options = [option for key, option in _MODEL_OPTIONS.items() if getattr(args, key) is not None]
    if isinstance(target, Serve):
        if model_options:
            raise UsageError(
                f"{' '.join(model_options)}: only for serving a function, but {module_name}:{attribute} is a Serve "
                "with its models bound; bind them there, or name a function"
            )
        server = target
        server.config = dataclasses.replace(server.config, **_server_options(args))
    elif callable(target):
        server = _function_server(target, f"{module_name}:{attribute}", attribute, args)
    else:
        raise UsageError(
            f"{module_name}:{attribute} is {type(target).__name__} {target!r}, "
            "not a pyserve.Serve or a function to serve"
        )
    server.serve()
    return 0


def _import(module_name: str) -> ModuleType:
    """Import the user's module; a module that is not there is a UsageError, not a traceback."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the module named on the command line; one that module imports and lacks keeps its traceback.
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise
        raise UsageError(f"cannot import '{module_name}': {exc} (run pyserve from the folder that holds it)") from None


def _serve_started_on_import(module: ModuleType) -> int:
    """The module started a Serve while it was imported (the Quickstart layout): serve that one, never another."""
    running = [value for value in vars(module).values() if isinstance(value, Serve) and value.is_running]
    if not running:
        # `with Serve() as s: ...; s.serve()` at module level: it served, was stopped by a signal, and is done.
        logger.info("%s served while it was imported and has stopped", module.__name__)
        return 0
    # `server = Serve().run()` at module level: it is up; block on it as `pyserve serve` blocks on any server.
    running[0].serve()
    return 0


def _function_server(function: Callable[..., Any], target: str, attribute: str, args: argparse.Namespace) -> Serve:
    """A Serve with ``function`` bound as one model, its tensors from --input/--output."""
    missing = [option for option, given in (("--input", args.inputs), ("--output", args.outputs)) if not given]
    if missing:
        kind = "class" if isinstance(function, type) else "function"
        raise UsageError(
            f"{target} is a {kind}, so pyserve needs its tensors, and no {' or '.join(missing)} was given: "
            f"pass --input {_TENSOR_SYNTAX} for each input and --output {_TENSOR_SYNTAX} for each output, e.g. "
            f"pyserve serve {target} --input x:FP32:-1 --output y:FP32:-1 (see docs/cli.md)"
        )
    server = Serve(ServeConfig.from_env())
    config = ModelConfig() if args.max_batch_size is None else ModelConfig(max_batch_size=args.max_batch_size)
    server.bind(args.model_name or attribute, function, inputs=args.inputs, outputs=args.outputs, config=config)
    return server


def _tune(args: argparse.Namespace) -> int:
    """``pyserve tune module:NAME``: a module's Serve, or a function bound as ``pyserve serve`` binds it."""
    module_name, _, attribute = args.target.partition(":")
    sys.path.insert(0, os.getcwd())
    starts_before = core_starts()
    module = _import(module_name)
    if core_starts() > starts_before:
        raise UsageError(
            f"'{module_name}' started a server while it was imported; tune starts the model itself with each "
            "configuration: give it a module that binds without serving (docs/cli.md, layouts 1 and 2)"
        )
    attribute = attribute or "server"
    target = getattr(module, attribute, None)
    model_options = [option for key, option in _MODEL_OPTIONS.items() if getattr(args, key) is not None]
    if isinstance(target, Serve):
        if model_options:
            raise UsageError(f"{' '.join(model_options)}: only for tuning a function; {args.target} is a Serve")
        return run_tune_command(args, target)
    if callable(target):
        return run_tune_command(args, _function_server(target, f"{module_name}:{attribute}", attribute, args))
    raise UsageError(f"{module_name}:{attribute} is not a pyserve.Serve or a function to tune (see docs/bench.md)")


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyserve", description="Serve Python functions over KServe v2 / Triton.")
    parser.add_argument("--version", action="version", version=f"pyserve {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="serve the embedded demo models (identity, add_sub, mlp)")
    _add_server_options(demo)
    demo.set_defaults(handler=_demo)
    serve = commands.add_parser(
        "serve",
        help="serve a module's Serve object or one function: `pyserve serve app:server`, "
        "`pyserve serve app:predict --input x:FP32:-1 --output y:FP32:-1`",
        description="Serve module:NAME, where NAME is a pyserve.Serve with models bound (default: server) or a "
        "function, served as one model with the tensors --input/--output declare. A module that serves when "
        "imported (the Quickstart layout) is served as it is. --model-repository DIR serves a Triton model "
        "repository, alone or beside the module's models. See docs/cli.md.",
    )
    serve.add_argument("target", nargs="?", help="module:NAME, a pyserve.Serve (default NAME: server) or a function")
    _add_server_options(serve)
    _add_repository_options(serve)
    _add_model_options(serve)
    serve.set_defaults(handler=_serve)
    bench = commands.add_parser(
        "bench",
        help="measure a model on a running KServe v2 server: throughput, latency percentiles, server-side split",
        description="Measure MODEL on a running server (pyserve, Triton, PyTriton: any KServe v2 server) at each "
        "--concurrency (closed loop) or --request-rate (open loop), from several client processes. See docs/bench.md.",
    )
    add_bench_arguments(bench)
    bench.set_defaults(handler=run_bench_command, **dict.fromkeys(_SERVER_OPTIONS))
    tune = commands.add_parser(
        "tune",
        help="find the configuration with the highest throughput whose p99 meets a target: "
        "`pyserve tune app:server --model m --slo-p99-ms 20`",
        description="Start module:NAME's model (a pyserve.Serve's, or a function's with --input/--output) with one "
        "candidate ModelConfig after another, measure each, and report the best whose p99 meets --slo-p99-ms, as a "
        "ModelConfig line and a config.pbtxt. See docs/bench.md.",
    )
    add_tune_arguments(tune)
    _add_model_options(tune)
    tune.set_defaults(handler=_tune, **dict.fromkeys(_SERVER_OPTIONS))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyserve`` command; returns its exit status."""
    args = _parser().parse_args(argv)
    level = logging.getLevelName(args.log_level or "WARNING")
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "serve" and level <= logging.WARNING:
        # Serve announces where it serves at INFO; `serve` shows that line unless asked for errors only.
        logging.getLogger("pyserve.serve").setLevel(min(level, logging.INFO))
    # Exported too, for a module that makes its ``Serve()`` itself (ServeConfig reads PYSERVE_<FIELD>).
    for key, value in _server_options(args).items():
        os.environ[f"PYSERVE_{key.upper()}"] = env_value(key, value)
    # SIGTERM stops like Ctrl+C, also before Serve.serve() installs its own handlers (while a module imports), and
    # even when started in the background, which inherits SIGINT ignored.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop_on_signal)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 0
    except UsageError as exc:
        print(f"pyserve: error: {exc}", file=sys.stderr)
        return 2
    except PyServeError as exc:
        # pyserve's own errors say what is wrong in one line; a traceback would only bury it.
        print(f"pyserve: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
