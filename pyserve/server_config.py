"""Server-wide settings: ``ServeConfig`` and the ``PYSERVE_<FIELD>`` environment variables that map onto it.

Re-exported by ``pyserve.config``, the one place configuration is imported from.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from pyserve.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """Server-wide settings. Every field can be overridden by the environment variable ``PYSERVE_<FIELD>``.

    Ports of 0 pick a free port; the chosen ports are on ``Serve.http_port`` etc. once running. ``allow_http``,
    ``allow_grpc`` and ``allow_metrics`` (tritonserver's ``--allow-http`` ...) turn a front end off: it does not listen
    and its port stays 0; at least one of HTTP and gRPC must be on.

    Observability (docs/monitoring.md): ``metrics_summaries`` adds Triton's latency summaries (quantiles over
    the last minute) and ``metrics_histograms`` the latency histograms, both observed per request;
    ``response_cache_bytes`` bounds the response cache shared by models bound with ``response_cache=True``
    (0 turns it off); ``trace_level`` (OFF or TIMESTAMPS), ``trace_rate`` (trace one request in N) and
    ``trace_file`` (spans as JSON lines, beside the OTEL_* exporter) set up OpenTelemetry tracing;
    ``log_format`` is ``default``, ``ISO8601`` or ``json``.

    Errors (docs/binding.md): when a model function raises, the server logs the traceback and the client gets the
    exception's type and message; ``debug_errors`` (``PYSERVE_DEBUG_ERRORS=1``) sends the traceback too, which
    shows the server's file paths and source lines, so keep it off where clients are not trusted.

    Model repository (docs/repository.md): ``model_repository`` names a Triton-layout directory whose models are
    served beside the bound ones; ``model_control_mode`` is tritonserver's ``none`` (load all at start), ``explicit``
    (load the ``load_model`` names at start, ``*`` for all, the rest through the load/unload requests) or ``poll``
    (reload what changed every ``repository_poll_secs``); ``strict_model_config`` False completes a missing or partial
    config.pbtxt from the model file; ``repository_hooks`` names load hooks as ``module:function``.

    Latency (docs/architecture.md): after sending a batch to an instance, the core polls for its reply for up to
    ``reply_spin_us`` microseconds before sleeping (only while batches are in flight: an idle server does not spin);
    0 turns it off, trading some latency at low concurrency for less CPU. ``worker_spin_us`` does the same on the
    other side: a process instance that finished a batch polls for the next one that long before sleeping (0, the
    default, sleeps at once; thread instances never spin, they share the interpreter lock): at concurrency 1 it saves
    the wake-up of the instance (~90 µs p50), at the price of CPU and of p99 where cores are few. ``stage_times``
    (``PYSERVE_STAGE_TIMES=/path/file.jsonl``) is a debug switch: the core appends one JSON line per HTTP infer
    request to that file, with when it passed each stage in the core and its instance (``pyserve.core.stage_times``,
    ``benchmarks/hop_budget.py``); empty (the default) turns it off.

    Shared memory (docs/shared-memory.md): ``restricted_api`` is tritonserver's ``--http-restricted-api`` /
    ``--grpc-restricted-protocol`` value, ``shared-memory:<key>=<value>``: the shared-memory endpoints (register,
    unregister, status) then need the HTTP header ``<key>: <value>`` (gRPC: the metadata
    ``triton-grpc-protocol-<key>``), else 403 / PERMISSION_DENIED. Empty (the default): not restricted.

    Headers as parameters (docs/binding.md): ``http_header_forward_pattern`` and ``grpc_header_forward_pattern`` are
    tritonserver's ``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``: a regular expression
    searched, case-insensitively, in the name of each HTTP header (gRPC metadata key) of an infer request; each
    that matches becomes a string request parameter named as the header, in lower case (``req.parameters``). A
    leading ``(?-i)`` makes the match case-sensitive. Empty (the default): nothing is forwarded.
    """

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_level: str = "WARNING"
    max_request_bytes: int = 1 << 30
    shm_threshold_bytes: int = 64 * 1024
    shm_pool_bytes: int = 1 << 30
    transport: str = "ipc"
    startup_timeout_s: float = 30.0
    model_load_timeout_s: float = 300.0
    metrics_summaries: bool = False
    metrics_histograms: bool = False
    response_cache_bytes: int = 0
    trace_level: str = "OFF"
    trace_rate: int = 1000
    trace_file: str = ""
    log_format: str = "default"
    debug_errors: bool = False
    reply_spin_us: int = 400
    worker_spin_us: int = 0
    stage_times: str = ""
    model_repository: str = ""
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    load_model: tuple[str, ...] = ()
    strict_model_config: bool = False
    repository_hooks: tuple[str, ...] = ()
    restricted_api: str = ""
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True

    def __post_init__(self) -> None:
        if not (self.allow_http or self.allow_grpc):
            raise ConfigError("allow_http and allow_grpc are both off: a server needs HTTP or gRPC to be called")
        for name in ("load_model", "repository_hooks"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        if self.model_control_mode not in ("none", "explicit", "poll"):
            raise ConfigError(
                f"model_control_mode must be 'none', 'explicit' or 'poll', got {self.model_control_mode!r}"
            )
        if self.repository_poll_secs <= 0:
            raise ConfigError(f"repository_poll_secs must be > 0, got {self.repository_poll_secs}")
        if self.load_model and self.model_control_mode != "explicit":
            raise ConfigError("load_model names the models to load at start in model_control_mode 'explicit' only")
        if self.transport not in ("ipc", "tcp"):
            raise ConfigError(f"transport must be 'ipc' or 'tcp', got {self.transport!r}")
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be in 0..65535, got {port}")
        if self.max_request_bytes <= 0:
            raise ConfigError("max_request_bytes must be > 0")
        if self.response_cache_bytes < 0:
            raise ConfigError(f"response_cache_bytes must be >= 0, got {self.response_cache_bytes}")
        if self.trace_level not in ("OFF", "TIMESTAMPS"):
            raise ConfigError(f"trace_level must be 'OFF' or 'TIMESTAMPS', got {self.trace_level!r}")
        if self.trace_rate < 1:
            raise ConfigError(f"trace_rate must be >= 1, got {self.trace_rate}")
        if self.worker_spin_us < 0:
            raise ConfigError(f"worker_spin_us must be >= 0, got {self.worker_spin_us}")
        if self.reply_spin_us < 0:
            raise ConfigError(f"reply_spin_us must be >= 0, got {self.reply_spin_us}")
        if self.log_format not in ("default", "ISO8601", "json"):
            raise ConfigError(f"log_format must be 'default', 'ISO8601' or 'json', got {self.log_format!r}")
        self.shared_memory_restriction()  # raises ConfigError on a malformed restricted_api
        for name in ("http_header_forward_pattern", "grpc_header_forward_pattern"):
            header_pattern(getattr(self, name), name)  # raises ConfigError on a malformed pattern

    def shared_memory_restriction(self) -> tuple[str, str] | None:
        """``(header, value)`` the shared-memory endpoints require (``restricted_api``), or None when open."""
        if not self.restricted_api:
            return None
        apis, _, setting = self.restricted_api.partition(":")
        key, _, value = setting.partition("=")
        names = [name.strip() for name in apis.split(",")]
        if not key.strip() or not value or not all(names):
            raise ConfigError(
                f"restricted_api must be '<apis>:<key>=<value>' (as tritonserver's --http-restricted-api), "
                f"got {self.restricted_api!r}"
            )
        unsupported = [name for name in names if name != "shared-memory"]
        if unsupported:
            raise ConfigError(f"restricted_api: only 'shared-memory' can be restricted, got {', '.join(unsupported)}")
        return key.strip().lower(), value

    @classmethod
    def from_env(cls, **overrides: Any) -> ServeConfig:
        """Defaults, then ``PYSERVE_<FIELD>`` variables, then explicit overrides."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = os.environ.get(f"PYSERVE_{field.name.upper()}")
            if raw is not None:
                kind: type[Any] = type(field.default)
                try:
                    if kind is tuple:  # a comma-separated list
                        values[field.name] = tuple(item.strip() for item in raw.split(",") if item.strip())
                    else:
                        values[field.name] = parse_bool(raw) if kind is bool else kind(raw)
                except ValueError as exc:
                    raise ConfigError(f"PYSERVE_{field.name.upper()}={raw!r}: expected {kind.__name__}") from exc
        values.update(overrides)
        return cls(**values)


def header_pattern(pattern: str, field: str = "header forward pattern") -> re.Pattern[str] | None:
    """The compiled ``*_header_forward_pattern`` (None when empty): case-insensitive, as Triton matches header
    names, unless it starts with ``(?-i)``."""
    if not pattern:
        return None
    flags: int = re.IGNORECASE
    if pattern.startswith("(?-i)"):
        # RE2's way of turning case-insensitivity off for the whole pattern; Python's re has no global form of it.
        pattern, flags = pattern[len("(?-i)") :], 0
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise ConfigError(f"{field}: invalid regular expression {pattern!r}: {exc}") from None


def parse_bool(raw: str) -> bool:
    """A flag's word as a bool: 1/true/yes/on or 0/false/no/off/empty (any case); ValueError otherwise."""
    # bool("false") is True: environment flags need their words read.
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)
