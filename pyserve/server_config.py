"""Server-wide settings: ``ServeConfig`` and the ``PYSERVE_<FIELD>`` environment variables that map onto it.

Re-exported by ``pyserve.config``, the one place configuration is imported from.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from typing import Any

from pyserve.errors import ConfigError

# The groups of endpoints tritonserver's --http-restricted-api / --grpc-restricted-protocol restrict (Triton 2.51).
RESTRICTED_GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
# The front ends that can serve TLS (ServeConfig.tls_endpoints).
TLS_ENDPOINTS = ("http", "grpc", "metrics", "routes")
_RESTRICTION_FIELDS = ("http_restricted_api", "grpc_restricted_protocol")
# A PYSERVE_<FIELD> list is comma-separated, except where an item holds commas itself.
_ENV_SEPARATORS = dict.fromkeys(_RESTRICTION_FIELDS, ";")
# Serve hands its core process the whole ServeConfig, as JSON, in this variable (not on argv: it holds secrets).
CORE_CONFIG_ENV = "PYSERVE_CORE_CONFIG"
# A header name is an HTTP token; its value what both HTTP and gRPC metadata carry (';' separates env entries).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\x21-\x3a\x3c-\x7e](?:[\x20-\x3a\x3c-\x7e]*[\x21-\x3a\x3c-\x7e])?")


@dataclasses.dataclass(frozen=True)
class Restriction:
    """The header a restricted group of endpoints needs: its name (lower case) and its value (never in a repr)."""

    header: str
    value: str = dataclasses.field(repr=False)


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
    config.pbtxt from the model file; ``repository_hooks`` names load hooks as ``module:function``. As tritonserver's
    flags of the same names: ``exit_on_error`` (True) fails the start when a model of the repository loaded at start
    cannot be loaded (False: it is UNAVAILABLE with the reason and the others serve); ``strict_readiness`` (True)
    keeps ``/v2/health/ready`` false while a repository model is UNAVAILABLE for any reason but an unload request
    (False: ready once the server and its bound models are).

    Latency (docs/architecture.md): after sending a batch to an instance, the core polls for its reply for up to
    ``reply_spin_us`` microseconds before sleeping (only while batches are in flight: an idle server does not spin);
    0 turns it off, trading some latency at low concurrency for less CPU. ``worker_spin_us`` does the same on the
    other side: a process instance that finished a batch polls for the next one that long before sleeping (0, the
    default, sleeps at once; thread instances never spin, they share the interpreter lock): at concurrency 1 it saves
    the wake-up of the instance (~90 µs p50), at the price of CPU and of p99 where cores are few. ``stage_times``
    (``PYSERVE_STAGE_TIMES=/path/file.jsonl``) is a debug switch: the core appends one JSON line per HTTP infer
    request to that file, with when it passed each stage in the core and its instance (``pyserve.core.stage_times``,
    ``benchmarks/hop_budget.py``); empty (the default) turns it off.

    Access control (docs/security.md): ``http_restricted_api`` and ``grpc_restricted_protocol`` are tritonserver's
    ``--http-restricted-api`` / ``--grpc-restricted-protocol``, one entry per group of endpoints sharing a header:
    ``<group>[,<group>...]:<key>=<value>`` with the groups of ``RESTRICTED_GROUPS`` (health, metadata, inference,
    shared-memory, model-config, model-repository, statistics, trace, logging). A request to a restricted endpoint
    without the HTTP header ``<key>: <value>`` (gRPC: the metadata ``triton-grpc-protocol-<key>``) is refused with
    403 / PERMISSION_DENIED; the value is compared in constant time and never logged or shown. Their
    ``PYSERVE_<FIELD>`` variables separate entries with ``;`` (a group list holds commas). ``restricted_api``, the
    older spelling, takes one ``shared-memory:<key>=<value>`` entry for both protocols (docs/shared-memory.md).

    TLS (docs/security.md): ``tls_certfile`` and ``tls_keyfile`` (PEM) make the front ends of ``tls_endpoints``
    (``http``, ``grpc`` and ``routes`` by default; ``metrics`` too when listed) serve TLS only; ``tls_client_ca``
    (PEM CA certificates) turns on mutual TLS there: a client must present a certificate one of them signed.

    Headers as parameters (docs/binding.md): ``http_header_forward_pattern`` and ``grpc_header_forward_pattern`` are
    tritonserver's ``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``: a regular expression
    searched, case-insensitively, in the name of each HTTP header (gRPC metadata key) of an infer request; each
    that matches becomes a string request parameter named as the header, in lower case (``req.parameters``). A
    leading ``(?-i)`` makes the match case-sensitive. Empty (the default): nothing is forwarded.

    Hostile clients (docs/security.md): ``http_header_timeout_s`` bounds how long an HTTP request's headers may take
    to arrive (from the connection's opening or the request's first byte) and how long a half-sent body may pause;
    past it the server answers 408 and closes the connection (0 turns it off).

    Front doors (docs/routes.md, docs/dashboard.md): ``routes_port`` is where the custom routes of ``Serve.route``
    are served (uvicorn in the ``Serve`` process; 0 picks a free port; nothing listens while no route is declared).
    ``dashboard`` False turns off the status page the HTTP port serves at ``/dashboard``.

    Loading: the models bound before ``run()`` and the repository's models loaded at start load
    ``model_load_thread_count`` at a time (tritonserver's ``--model-load-thread-count``, 4): their processes start
    and their ``setup()`` runs side by side. ``model_load_timeout_s`` bounds one model's load.

    Shutdown: on SIGTERM (or ``Serve.stop()``) the server takes no new requests (503 / UNAVAILABLE, not ready) and
    lets those in flight finish for up to ``exit_timeout_s`` (tritonserver's ``--exit-timeout-secs``, 30 s), then
    fails what is left and exits.

    Remote models (docs/remote.md): ``remote_port`` (-1, the default: off; 0: a free port) opens a tcp socket on
    ``remote_host`` (default: ``host``) where ``RemoteServe`` / ``RemoteTriton`` in other processes or hosts attach
    models whose functions they run themselves. Peers authenticate with ``remote_token`` (at least 16 characters;
    ``PYSERVE_REMOTE_TOKEN``), and the traffic is encrypted (ZeroMQ CURVE); the token is never logged, shown or
    passed on a command line. ``remote_advertise`` is the ``tcp://host:port`` peers are told to use (behind NAT or in
    a container), default the bound address. A peer silent for ``remote_peer_timeout_s`` (it pings every second)
    is gone: its models are unloaded and their requests fail.
    """

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_level: str = "WARNING"
    max_request_bytes: int = 1 << 30
    http_header_timeout_s: float = 30.0
    shm_threshold_bytes: int = 64 * 1024
    shm_pool_bytes: int = 1 << 30
    transport: str = "ipc"
    startup_timeout_s: float = 30.0
    model_load_timeout_s: float = 300.0
    model_load_thread_count: int = 4
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
    exit_on_error: bool = True
    strict_readiness: bool = True
    strict_model_config: bool = False
    repository_hooks: tuple[str, ...] = ()
    restricted_api: str = dataclasses.field(default="", repr=False)
    http_restricted_api: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    grpc_restricted_protocol: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_client_ca: str = ""
    tls_endpoints: tuple[str, ...] = ("http", "grpc", "routes")
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    remote_port: int = -1
    remote_host: str = ""
    remote_token: str = dataclasses.field(default="", repr=False)
    remote_advertise: str = ""
    remote_peer_timeout_s: float = 10.0
    exit_timeout_s: float = 30.0
    routes_port: int = 8003
    dashboard: bool = True

    def __post_init__(self) -> None:
        if not (self.allow_http or self.allow_grpc):
            raise ConfigError("allow_http and allow_grpc are both off: a server needs HTTP or gRPC to be called")
        for name in ("load_model", "repository_hooks", *_RESTRICTION_FIELDS, "tls_endpoints"):
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
        if not -1 <= self.remote_port <= 65535:
            raise ConfigError(f"remote_port must be -1 (off) or in 0..65535, got {self.remote_port}")
        if self.model_load_thread_count < 1:
            raise ConfigError(f"model_load_thread_count must be >= 1, got {self.model_load_thread_count}")
        if self.exit_timeout_s < 0:
            raise ConfigError(f"exit_timeout_s must be >= 0, got {self.exit_timeout_s}")
        if self.remote_peer_timeout_s < 2:
            raise ConfigError(
                f"remote_peer_timeout_s must be >= 2 (peers ping every second), got {self.remote_peer_timeout_s}"
            )
        if self.remote_port >= 0 and not self.remote_token:
            raise ConfigError(
                "remote_port is set but remote_token is empty: remote peers must authenticate (set "
                "ServeConfig.remote_token or PYSERVE_REMOTE_TOKEN)"
            )
        for name in ("http_port", "grpc_port", "metrics_port", "routes_port"):
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
        self.http_restrictions()  # these raise ConfigError on a malformed or conflicting restriction
        self.grpc_restrictions()
        self._check_tls()
        for name in ("http_header_forward_pattern", "grpc_header_forward_pattern"):
            header_pattern(getattr(self, name), name)  # raises ConfigError on a malformed pattern

    def shared_memory_restriction(self) -> tuple[str, str] | None:
        """``(header, value)`` the shared-memory endpoints require by ``restricted_api``, or None when it is empty."""
        if not self.restricted_api:
            return None
        restrictions = parse_restrictions((self.restricted_api,), "restricted_api")
        unsupported = [group for group in restrictions if group != "shared-memory"]
        if unsupported:
            raise ConfigError(f"restricted_api: only 'shared-memory' can be restricted, got {', '.join(unsupported)}")
        restriction = restrictions["shared-memory"]
        return restriction.header, restriction.value

    def http_restrictions(self) -> dict[str, Restriction]:
        """The HTTP endpoint groups that need a header, by group: ``http_restricted_api`` and ``restricted_api``."""
        return self._restrictions("http_restricted_api")

    def grpc_restrictions(self) -> dict[str, Restriction]:
        """The gRPC endpoint groups that need metadata, by group (the key without its ``triton-grpc-protocol-``
        prefix): ``grpc_restricted_protocol`` and ``restricted_api``."""
        return self._restrictions("grpc_restricted_protocol")

    def _restrictions(self, field: str) -> dict[str, Restriction]:
        restrictions = parse_restrictions(getattr(self, field), field)
        shared_memory = self.shared_memory_restriction()
        if shared_memory is not None:
            if "shared-memory" in restrictions:
                raise ConfigError(f"shared-memory is restricted by both restricted_api and {field}: keep one")
            restrictions["shared-memory"] = Restriction(*shared_memory)
        return restrictions

    def uses_tls(self, endpoint: str) -> bool:
        """Whether the front end ``endpoint`` (one of ``TLS_ENDPOINTS``) serves TLS."""
        return bool(self.tls_certfile) and endpoint in self.tls_endpoints

    def _check_tls(self) -> None:
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ConfigError("tls_certfile and tls_keyfile go together: give both (PEM files) to serve TLS")
        if self.tls_client_ca and not self.tls_certfile:
            raise ConfigError("tls_client_ca (mutual TLS) needs the server's own tls_certfile and tls_keyfile")
        for endpoint in self.tls_endpoints:
            if endpoint not in TLS_ENDPOINTS:
                raise ConfigError(f"tls_endpoints: unknown {endpoint!r}; choose from {', '.join(TLS_ENDPOINTS)}")
        if self.tls_certfile and not self.tls_endpoints:
            raise ConfigError("tls_certfile is set but tls_endpoints is empty: name the front ends that serve TLS")

    @classmethod
    def from_env(cls, **overrides: Any) -> ServeConfig:
        """Defaults, then ``PYSERVE_<FIELD>`` variables, then explicit overrides."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = os.environ.get(f"PYSERVE_{field.name.upper()}")
            if raw is not None:
                kind: type[Any] = type(field.default)
                try:
                    if kind is tuple:  # a list, comma-separated (restrictions: ';'-separated)
                        separator = _ENV_SEPARATORS.get(field.name, ",")
                        values[field.name] = tuple(item.strip() for item in raw.split(separator) if item.strip())
                    else:
                        values[field.name] = parse_bool(raw) if kind is bool else kind(raw)
                except ValueError as exc:
                    raise ConfigError(f"PYSERVE_{field.name.upper()}={raw!r}: expected {kind.__name__}") from exc
        values.update(overrides)
        return cls(**values)


def env_value(field: str, value: Any) -> str:
    """``value`` of the ServeConfig field ``field`` as its ``PYSERVE_<FIELD>`` variable writes it."""
    if isinstance(value, (tuple, list)):
        return _ENV_SEPARATORS.get(field, ",").join(value)
    return str(value)


def parse_restrictions(entries: Iterable[str], field: str) -> dict[str, Restriction]:
    """``{group: Restriction}`` from entries ``<group>[,<group>...]:<key>=<value>`` (tritonserver's format; the value
    is what follows the first ``=``). A group may be in one entry only. A ConfigError names ``field`` and never the
    value."""
    restrictions: dict[str, Restriction] = {}
    for entry in entries:
        groups_text, colon, setting = entry.partition(":")
        key, equals, value = setting.partition("=")
        key = key.strip()
        groups = [group.strip() for group in groups_text.split(",")]
        if not (colon and equals and key and value and all(groups)):
            # Never the value: at most the groups and the key.
            shown = f"'{groups_text}:{key}=...'" if equals else f"'{groups_text}:...'" if colon else "no ':'"
            raise ConfigError(
                f"{field}: each entry must be '<apis>:<key>=<value>' (as tritonserver's --http-restricted-api and "
                f"--grpc-restricted-protocol), got {shown}"
            )
        if not _HEADER_NAME.fullmatch(key):
            raise ConfigError(f"{field}: {key!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~)")
        if not _HEADER_VALUE.fullmatch(value):
            raise ConfigError(
                f"{field}: the value for '{key}' must be printable ASCII (no ';', no space at either end), as HTTP "
                "headers and gRPC metadata carry it"
            )
        for group in groups:
            if group not in RESTRICTED_GROUPS:
                raise ConfigError(
                    f"{field}: unknown restricted API group '{group}'; the groups are {', '.join(RESTRICTED_GROUPS)}"
                )
            if group in restrictions:
                raise ConfigError(f"{field}: group '{group}' is in more than one entry; each group takes one header")
            restrictions[group] = Restriction(key.lower(), value)
    return restrictions


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
