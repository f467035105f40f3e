"""PyTriton's ``TritonConfig`` (tritonserver's command-line flags, ``PYTRITON_TRITON_CONFIG_*`` variables), and how
its fields map onto pyserve's ``ServeConfig``.

Fields with a pyserve meaning are mapped (``to_serve_config``): addresses and ports, ``allow_http`` / ``allow_grpc``
/ ``allow_metrics``, ``log_verbose`` / ``log_info`` / ``log_format``, the header forward patterns, the restricted
API, the model repository and its control mode, the response cache size (``cache_config`` ``local,size=N`` or
``response_cache_byte_size``), latency metrics (``metrics_config``) and tracing (``trace_config`` ``level``,
``rate``, ``file``). Fields that only mean something to the Triton binary (its thread counts, memory pools, backend
and cache directories, keep-alive settings, SageMaker and Vertex AI endpoints, ...) are accepted, and one warning
names those that were set. ``http_restricted_api`` / ``grpc_restricted_protocol`` restrict endpoint groups as
tritonserver does; ``grpc_use_ssl`` (with ``grpc_server_cert``, ``grpc_server_key``, and for ``grpc_use_ssl_mutual``
``grpc_root_cert``) serves gRPC over TLS, HTTP staying plain as in tritonserver.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import typing
from collections.abc import Callable
from typing import Any

from pyserve.config import ServeConfig, parse_bool
from pyserve.errors import ConfigError

logger = logging.getLogger(__name__)

_ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"
_LIST_ITEM = re.compile(r"^(.+?)_(\d+)$")


@dataclasses.dataclass(kw_only=True)
class TritonConfig:
    """tritonserver's settings as PyTriton takes them: every field is optional (None: the server's default).

    The fields are tritonserver's flags with ``_`` for ``-`` (``http_header_forward_pattern`` is
    ``--http-header-forward-pattern``); the module docstring says which pyserve honours.
    """

    model_repository: pathlib.Path | None = None
    id: str | None = None
    log_verbose: int | None = None
    log_info: bool | None = None
    log_warning: bool | None = None
    log_error: bool | None = None
    log_format: str | None = None
    log_file: pathlib.Path | None = None
    exit_timeout_secs: int | None = None
    exit_on_error: bool | None = None
    strict_readiness: bool | None = None
    strict_model_config: bool | None = None
    disable_auto_complete_config: bool | None = None
    model_control_mode: str | None = None
    repository_poll_secs: int | None = None
    load_model: list[str] | None = None
    allow_http: bool | None = None
    http_address: str | None = None
    http_port: int | None = None
    reuse_http_port: bool | None = None
    http_header_forward_pattern: str | None = None
    http_thread_count: int | None = None
    http_restricted_api: str | None = None
    allow_grpc: bool | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    reuse_grpc_port: bool | None = None
    grpc_header_forward_pattern: str | None = None
    grpc_infer_allocation_pool_size: int | None = None
    grpc_use_ssl: bool | None = None
    grpc_use_ssl_mutual: bool | None = None
    grpc_server_cert: pathlib.Path | None = None
    grpc_server_key: pathlib.Path | None = None
    grpc_root_cert: pathlib.Path | None = None
    grpc_infer_response_compression_level: str | None = None
    grpc_keepalive_time: int | None = None
    grpc_keepalive_timeout: int | None = None
    grpc_keepalive_permit_without_calls: bool | None = None
    grpc_http2_max_pings_without_data: int | None = None
    grpc_http2_min_recv_ping_interval_without_data: int | None = None
    grpc_http2_max_ping_strikes: int | None = None
    grpc_restricted_protocol: str | None = None
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None
    allow_sagemaker: bool | None = None
    sagemaker_port: int | None = None
    sagemaker_safe_port_range: str | None = None
    sagemaker_thread_count: int | None = None
    allow_vertex_ai: bool | None = None
    vertex_ai_port: int | None = None
    vertex_ai_thread_count: int | None = None
    vertex_ai_default_model: str | None = None
    metrics_config: list[str] | None = None
    trace_config: list[str] | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    response_cache_byte_size: int | None = None
    buffer_manager_thread_count: int | None = None
    pinned_memory_pool_byte_size: int | None = None
    cuda_memory_pool_byte_size: list[str] | None = None
    min_supported_compute_capability: float | None = None
    backend_directory: pathlib.Path | None = None
    backend_config: list[str] | None = None
    allow_soft_placement: bool | None = None
    gpu_memory_fraction: float | None = None
    tensorflow_version: int | None = None

    def __post_init__(self) -> None:
        if self.allow_http is False and self.allow_grpc is False:
            raise ConfigError("TritonConfig: the HTTP or the gRPC endpoint has to be allowed")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TritonConfig:
        """A config from a dict of field values (strings are converted to the field's type; a list field takes a
        comma-separated string); unknown names are ignored with a warning."""
        hints = typing.get_type_hints(cls)
        unknown = sorted(name for name in config if name not in hints)
        if unknown:
            logger.warning("TritonConfig: ignoring unknown fields %s", ", ".join(unknown))
        return cls(**{name: _convert(name, hints[name], value) for name, value in config.items() if name in hints})

    @classmethod
    def from_env(cls) -> TritonConfig:
        """A config from ``PYTRITON_TRITON_CONFIG_<FIELD>`` variables (``..._<FIELD>_<N>`` for list items)."""
        values: dict[str, Any] = {}
        items: dict[str, dict[int, str]] = {}
        for name, value in os.environ.items():
            if not name.startswith(_ENV_PREFIX):
                continue
            key = name[len(_ENV_PREFIX) :].lower()
            item = _LIST_ITEM.match(key)
            if item and item.group(1) in _list_fields():
                items.setdefault(item.group(1), {})[int(item.group(2))] = value
            else:
                values[key] = value
        for key, indexed in items.items():
            values[key] = [indexed[index] for index in sorted(indexed)]
        return cls.from_dict(values)

    def merged_over(self, base: TritonConfig) -> TritonConfig:
        """This config's set fields over ``base``'s (PyTriton: explicit config, then environment, then defaults)."""
        return dataclasses.replace(base, **{k: v for k, v in dataclasses.asdict(self).items() if v is not None})


def _list_fields() -> set[str]:
    hints = typing.get_type_hints(TritonConfig)
    return {name for name, hint in hints.items() if any(typing.get_origin(a) is list for a in typing.get_args(hint))}


def _convert(name: str, hint: Any, value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return list(value) if isinstance(value, tuple) else value
    kind = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    try:
        if typing.get_origin(kind) is list:
            return [item.strip() for item in value.split(",") if item.strip()]
        if kind is bool:
            return parse_bool(value)
        return kind(value)
    except ValueError:
        raise ConfigError(f"TritonConfig.{name}: cannot read {value!r} as {kind.__name__}") from None


# --- onto ServeConfig -----------------------------------------------------------------------------------------

# Fields mapped onto ServeConfig (the rest are only tritonserver's).
_MAPPED = frozenset(
    {
        "model_repository", "log_verbose", "log_info", "log_format", "strict_model_config",
        "disable_auto_complete_config", "model_control_mode", "repository_poll_secs", "load_model",
        "allow_http", "http_address", "http_port", "http_header_forward_pattern", "http_restricted_api",
        "allow_grpc", "grpc_address", "grpc_port", "grpc_header_forward_pattern", "grpc_restricted_protocol",
        "grpc_use_ssl", "grpc_use_ssl_mutual", "grpc_server_cert", "grpc_server_key", "grpc_root_cert",
        "allow_metrics", "metrics_port", "metrics_address",
        "metrics_config", "trace_config", "cache_config", "response_cache_byte_size",
        "exit_on_error", "strict_readiness", "exit_timeout_secs",
    }
)  # fmt: skip
_SAME_NAME = (
    "model_control_mode", "repository_poll_secs", "strict_model_config", "log_format", "exit_on_error",
    "strict_readiness",
)  # fmt: skip
_PORTS = {"http": "http_port", "grpc": "grpc_port", "metrics": "metrics_port"}


def to_serve_config(config: TritonConfig) -> ServeConfig:
    """The ``ServeConfig`` (over ``PYSERVE_*`` variables and defaults) that serves as ``config`` asks."""
    set_fields = {name: value for name, value in dataclasses.asdict(config).items() if value is not None}
    ignored = sorted(set(set_fields) - _MAPPED)
    if ignored:
        logger.warning("TritonConfig fields that only tritonserver uses are ignored by pyserve: %s", ", ".join(ignored))
    values: dict[str, Any] = {name: set_fields[name] for name in _SAME_NAME if name in set_fields}
    if config.model_repository is not None:
        values["model_repository"] = os.fspath(config.model_repository)
    if config.load_model:
        values["load_model"] = tuple(config.load_model)
    if config.exit_timeout_secs is not None:
        values["exit_timeout_s"] = float(config.exit_timeout_secs)
    if config.disable_auto_complete_config:
        values["strict_model_config"] = True
    if config.log_verbose:
        values["log_level"] = "DEBUG"
    elif config.log_info:
        values["log_level"] = "INFO"
    values.update(_addresses(config))
    for kind, field in _PORTS.items():
        if getattr(config, f"allow_{kind}") is False:
            values[f"allow_{kind}"] = False
        elif getattr(config, field) is not None:
            values[field] = getattr(config, field)
    for protocol in ("http", "grpc"):
        pattern = getattr(config, f"{protocol}_header_forward_pattern")
        if pattern is not None:
            values[f"{protocol}_header_forward_pattern"] = pattern
    if config.http_restricted_api is not None:
        values["http_restricted_api"] = (config.http_restricted_api,)
    if config.grpc_restricted_protocol is not None:
        values["grpc_restricted_protocol"] = (config.grpc_restricted_protocol,)
    values.update(_grpc_tls(config))
    values.update(_observability(config))
    return ServeConfig.from_env(**values)


def _grpc_tls(config: TritonConfig) -> dict[str, Any]:
    """tritonserver's gRPC TLS flags as ServeConfig's TLS fields, for the gRPC port only."""
    if not (config.grpc_use_ssl or config.grpc_use_ssl_mutual):
        return {}
    if config.grpc_server_cert is None or config.grpc_server_key is None:
        raise ConfigError("TritonConfig.grpc_use_ssl needs grpc_server_cert and grpc_server_key")
    values: dict[str, Any] = {
        "tls_certfile": os.fspath(config.grpc_server_cert),
        "tls_keyfile": os.fspath(config.grpc_server_key),
        "tls_endpoints": ("grpc",),
    }
    if config.grpc_use_ssl_mutual:
        if config.grpc_root_cert is None:
            raise ConfigError("TritonConfig.grpc_use_ssl_mutual needs grpc_root_cert, the clients' certificates' CA")
        values["tls_client_ca"] = os.fspath(config.grpc_root_cert)
    return values


def _addresses(config: TritonConfig) -> dict[str, Any]:
    addresses = {config.http_address, config.grpc_address, config.metrics_address} - {None}
    if len(addresses) > 1:
        raise ConfigError(
            f"TritonConfig: pyserve binds HTTP, gRPC and metrics to one address, got {sorted(map(str, addresses))}"
        )
    return {"host": addresses.pop()} if addresses else {}


def _observability(config: TritonConfig) -> dict[str, Any]:
    """ServeConfig fields from metrics_config, trace_config, cache_config and response_cache_byte_size."""
    values: dict[str, Any] = {}
    ignored: list[str] = []
    metrics = {"summary_latencies": "metrics_summaries", "histogram_latencies": "metrics_histograms"}
    for setting in config.metrics_config or ():
        key, _, value = setting.partition("=")
        if key.strip() in metrics:
            values[metrics[key.strip()]] = parse_bool(value)
        else:
            ignored.append(f"metrics_config {setting!r}")
    traces: dict[str, tuple[str, Callable[[str], Any]]] = {
        "level": ("trace_level", str.upper),
        "rate": ("trace_rate", int),
        "file": ("trace_file", str),
    }
    for setting in config.trace_config or ():
        # "<setting>=<value>", or "<mode>,<setting>=<value>" for Triton's own mode.
        mode, _, rest = setting.rpartition(",")
        key, _, value = rest.partition("=")
        if mode in ("", "triton") and key.strip() in traces:
            field, convert = traces[key.strip()]
            values[field] = convert(value.strip())
        else:
            ignored.append(f"trace_config {setting!r}")
    if config.response_cache_byte_size is not None:
        values["response_cache_bytes"] = config.response_cache_byte_size
    for setting in config.cache_config or ():
        name, _, rest = setting.partition(",")
        key, _, value = rest.partition("=")
        if name.strip() == "local" and key.strip() == "size":
            values["response_cache_bytes"] = int(value)
        else:
            ignored.append(f"cache_config {setting!r}")
    if ignored:
        logger.warning("TritonConfig settings pyserve has no use for are ignored: %s", ", ".join(ignored))
    return values
