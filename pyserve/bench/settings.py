"""What one benchmark measures: the server and model, the load steps, the request data and how long to measure.

``BenchSettings`` is the one source of truth; the command line (``command``) and ``tune`` fill it in. The parsers
here read the command line's values (``10s``, ``1,4,16``, ``INPUT0:3,224``) and say what is wrong with one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence

from pyserve.client.tls import ClientTls
from pyserve.errors import ConfigError

DISTRIBUTIONS = ("constant", "poisson")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
# A client process keeps up with about this many requests in flight, or requests per second, before a second one
# pays for itself (docs/bench.md, "The load generator").
CONCURRENCY_PER_PROCESS = 64
RATE_PER_PROCESS = 4000.0


@dataclasses.dataclass(frozen=True)
class LoadLevel:
    """One step of a benchmark: ``concurrency`` requests always in flight (closed loop: each sends its next request
    when its answer comes) or ``request_rate`` requests a second whatever the answers (open loop)."""

    concurrency: int | None = None
    request_rate: float | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ConfigError("a load level is a concurrency or a request rate, not both or neither")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and not (self.request_rate > 0 and math.isfinite(self.request_rate)):
            raise ConfigError(f"request rate must be > 0 requests/s, got {self.request_rate}")

    @property
    def mode(self) -> str:
        """``concurrency`` or ``request_rate``."""
        return "concurrency" if self.concurrency is not None else "request_rate"

    @property
    def value(self) -> float:
        """The concurrency or the rate."""
        return float(self.concurrency) if self.concurrency is not None else float(self.request_rate or 0.0)

    def label(self) -> str:
        """``concurrency 16`` or ``rate 250/s``."""
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        return f"rate {self.request_rate:g}/s"

    def split(self, parts: int) -> list[LoadLevel | None]:
        """This level shared among ``parts`` client processes (None: that process stays idle)."""
        if self.request_rate is not None:
            return [LoadLevel(request_rate=self.request_rate / parts) for _ in range(parts)]
        concurrency = self.concurrency or 0
        shares = [concurrency // parts + (1 if index < concurrency % parts else 0) for index in range(parts)]
        return [LoadLevel(concurrency=share) if share else None for share in shares]


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """A benchmark of one model: where, which load steps, which requests, and how each step is measured.

    Each step warms up for ``warmup_s``, then measures windows of ``window_s`` until the last three agree within
    ``stability`` (a fraction: 0.1 is perf_analyzer's 10 %) on throughput and mean latency, or ``duration_s`` of
    windows have passed; the result merges the last three windows. ``processes`` client processes share the load
    (None: as many as the load needs, at most half the CPUs). ``tls``: whom to trust (and the client's certificate)
    for an ``https://`` or ``grpcs://`` server (None: the system's authorities).
    """

    model: str
    url: str = "http://127.0.0.1:8000"
    model_version: str | None = None
    levels: tuple[LoadLevel, ...] = (LoadLevel(concurrency=1),)
    batch_size: int = 1
    shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    data_file: str | None = None
    string_length: int = 16
    warmup_s: float = 1.0
    window_s: float = 1.0
    duration_s: float = 10.0
    stability: float = 0.1
    processes: int | None = None
    distribution: str = "constant"
    max_in_flight: int = 1024
    request_timeout_s: float = 60.0
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    seed: int = 0
    tls: ClientTls | None = None

    def __post_init__(self) -> None:
        if not self.levels:
            raise ConfigError("give at least one load level (--concurrency or --request-rate)")
        if len({level.mode for level in self.levels}) > 1:
            raise ConfigError("a benchmark steps through concurrencies or request rates, not both")
        for name in ("batch_size", "string_length", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_s < 0:
            raise ConfigError(f"warm-up must be >= 0 s, got {self.warmup_s}")
        for name in ("window_s", "duration_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.duration_s < self.window_s:
            raise ConfigError(f"the duration ({self.duration_s:g} s) is shorter than one window ({self.window_s:g} s)")
        if not 0 < self.stability <= 10:
            raise ConfigError(f"stability must be a fraction in (0, 10], got {self.stability}")
        if self.processes is not None and self.processes < 1:
            raise ConfigError(f"processes must be >= 1, got {self.processes}")
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {self.distribution!r}")
        object.__setattr__(self, "shapes", {name: tuple(dims) for name, dims in self.shapes.items()})

    @property
    def mode(self) -> str:
        """``concurrency`` or ``request_rate``."""
        return self.levels[0].mode

    def client_processes(self) -> int:
        """How many client processes share the load: ``processes``, or as many as the heaviest step needs (one per
        CONCURRENCY_PER_PROCESS requests in flight or RATE_PER_PROCESS requests/s), at most half the CPUs."""
        if self.processes is not None:
            return self.processes
        heaviest = max(level.value for level in self.levels)
        per_process = CONCURRENCY_PER_PROCESS if self.mode == "concurrency" else RATE_PER_PROCESS
        return max(1, min(math.ceil(heaviest / per_process), (os.cpu_count() or 1) // 2))


# command-line values ---------------------------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds from ``10s``, ``500ms``, ``5m``, ``1h`` or a plain number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration: use a number with ms, s, m or h, such as 10s or 500ms")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


def parse_counts(text: str) -> list[int]:
    """Positive integers from ``1,4,16``."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{text!r}: expected comma-separated integers such as 1,4,16") from None
    if not values or any(value < 1 for value in values):
        raise ValueError(f"{text!r}: expected integers >= 1 such as 1,4,16")
    return values


def parse_rates(text: str) -> list[float]:
    """Positive numbers from ``100,250.5``."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{text!r}: expected comma-separated numbers such as 100,200,400") from None
    if not values or any(not (value > 0 and math.isfinite(value)) for value in values):
        raise ValueError(f"{text!r}: expected numbers > 0 such as 100,200,400")
    return values


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:DIMS`` (perf_analyzer's ``--shape``): an input's dimensions without the batch dimension, ``3,224``."""
    name, colon, dims_text = text.rpartition(":")
    if not colon or not name or not dims_text:
        raise ValueError(f"{text!r}: expected NAME:DIMS such as INPUT0:16 or image:224,224,3")
    try:
        dims = tuple(int(dim) for dim in dims_text.split(","))
    except ValueError:
        raise ValueError(f"{text!r}: dimensions {dims_text!r} must be comma-separated integers") from None
    if any(dim < 1 for dim in dims):
        raise ValueError(f"{text!r}: every dimension must be >= 1")
    return name, dims


def levels_of(concurrency: Sequence[int] = (), request_rate: Sequence[float] = ()) -> tuple[LoadLevel, ...]:
    """The load steps of ``--concurrency`` or ``--request-rate`` (concurrency 1 when neither is given)."""
    if concurrency and request_rate:
        raise ConfigError("give --concurrency or --request-rate, not both")
    if request_rate:
        return tuple(LoadLevel(request_rate=rate) for rate in request_rate)
    return tuple(LoadLevel(concurrency=count) for count in concurrency or (1,))
