"""Measurement windows: the answers recorded in a span of time, their latency statistics, and when a run of windows
is stable (perf_analyzer's rule: each of the last three within ±stability of their mean, in throughput and in mean
latency)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pyserve.bench.server_stats import ServerCounters, ServerSplit

PERCENTILES = (50, 90, 95, 99)
# Windows a step's result merges, and the fewest that can be stable.
STABLE_WINDOWS = 3


@dataclasses.dataclass(frozen=True)
class Records:
    """Answered requests: start and end times (s, ``time.monotonic``) and error codes (0: success)."""

    starts: np.ndarray
    ends: np.ndarray
    codes: np.ndarray

    @classmethod
    def empty(cls) -> Records:
        """No records."""
        return cls(np.empty(0), np.empty(0), np.empty(0, dtype=np.int64))

    @classmethod
    def concatenate(cls, parts: Sequence[Records]) -> Records:
        """One set of records from several."""
        if not parts:
            return cls.empty()
        return cls(
            np.concatenate([part.starts for part in parts]),
            np.concatenate([part.ends for part in parts]),
            np.concatenate([part.codes for part in parts]),
        )

    def ending_before(self, moment: float) -> tuple[Records, Records]:
        """(the records that ended before ``moment``, the rest)."""
        early = self.ends < moment
        late = ~early
        return (
            Records(self.starts[early], self.ends[early], self.codes[early]),
            Records(self.starts[late], self.ends[late], self.codes[late]),
        )

    def __len__(self) -> int:
        return int(self.ends.size)


@dataclasses.dataclass(frozen=True)
class Collected:
    """What ``collect`` hands over: the records, the busiest client process's CPU use (a fraction of one core), and
    how many open-loop requests went out late (the process could not keep the schedule) or held (max_in_flight
    requests were waiting on the server)."""

    records: Records
    client_cpu: float
    late: int
    held: int


@dataclasses.dataclass(frozen=True)
class LatencyStats:
    """Latency of successful requests (µs)."""

    count: int
    avg_us: float
    std_us: float
    min_us: float
    max_us: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float

    @classmethod
    def of(cls, latencies_s: np.ndarray) -> LatencyStats | None:
        """The statistics of these latencies (seconds); None for none."""
        if latencies_s.size == 0:
            return None
        us = latencies_s * 1e6
        p50, p90, p95, p99 = np.percentile(us, PERCENTILES)
        return cls(
            count=int(us.size),
            avg_us=float(us.mean()),
            std_us=float(us.std()),
            min_us=float(us.min()),
            max_us=float(us.max()),
            p50_us=float(p50),
            p90_us=float(p90),
            p95_us=float(p95),
            p99_us=float(p99),
        )

    def to_json(self) -> dict[str, Any]:
        """Every field, in µs."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Window:
    """What one span of time measured. ``latencies_s`` are those of its successful requests; ``errors`` counts
    failed ones by message; ``client_cpu`` is the busiest client process's share of a core; ``server`` is the
    server's counters read at the window's end (None without the statistics extension)."""

    start: float
    end: float
    latencies_s: np.ndarray
    errors: Mapping[str, int]
    client_cpu: float
    late: int
    held: int
    server: ServerCounters | None

    @property
    def seconds(self) -> float:
        """The window's length."""
        return self.end - self.start

    @property
    def successes(self) -> int:
        """Requests answered successfully in the window."""
        return int(self.latencies_s.size)

    @property
    def failures(self) -> int:
        """Requests answered with an error in the window."""
        return sum(self.errors.values())

    @property
    def requests_per_s(self) -> float:
        """Successful requests a second."""
        return self.successes / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_latency_s(self) -> float | None:
        """Mean latency of the successful requests (None without any)."""
        return float(self.latencies_s.mean()) if self.latencies_s.size else None

    def percentile_us(self, percentile: float) -> float | None:
        """A latency percentile of the window, µs (None without any success)."""
        if not self.latencies_s.size:
            return None
        return float(np.percentile(self.latencies_s, percentile)) * 1e6


def window_of(
    collected: Collected, start: float, end: float, messages: Mapping[int, str], server: ServerCounters | None
) -> Window:
    """The window [start, end) of what was collected at its end (error codes named by ``messages``)."""
    records = collected.records
    ok = records.codes == 0
    latencies = (records.ends - records.starts)[ok]
    failed = Counter(int(code) for code in records.codes[~ok])
    errors = {messages.get(code, f"error {code}"): count for code, count in failed.items()}
    return Window(start, end, latencies, errors, collected.client_cpu, collected.late, collected.held, server)


def is_stable(windows: Sequence[Window], stability: float) -> bool:
    """Whether the last STABLE_WINDOWS windows agree: each one's throughput and mean latency within ±``stability``
    (a fraction) of their mean, and each with some success."""
    if len(windows) < STABLE_WINDOWS:
        return False
    last = windows[-STABLE_WINDOWS:]
    latencies = [window.mean_latency_s for window in last]
    if any(latency is None for latency in latencies):
        return False
    for values in ([window.requests_per_s for window in last], [float(value or 0.0) for value in latencies]):
        mean = sum(values) / len(values)
        if mean <= 0 or any(abs(value - mean) > stability * mean for value in values):
            return False
    return True


@dataclasses.dataclass(frozen=True)
class Merged:
    """Several consecutive windows as one measurement."""

    seconds: float
    successes: int
    errors: Mapping[str, int]
    latency: LatencyStats | None
    client_cpu: float
    late: int
    held: int
    server: ServerSplit | None


def merge(windows: Sequence[Window], server_before: ServerCounters | None) -> Merged:
    """The windows as one: their latencies pooled, errors added; the server's split between ``server_before`` (its
    counters at the first window's start) and the last window's reading."""
    errors: Counter[str] = Counter()
    for window in windows:
        errors.update(window.errors)
    latencies = np.concatenate([window.latencies_s for window in windows]) if windows else np.empty(0)
    server_after = windows[-1].server if windows else None
    server = (
        ServerSplit.between(server_before, server_after)
        if server_before is not None and server_after is not None
        else None
    )
    return Merged(
        seconds=sum(window.seconds for window in windows),
        successes=int(latencies.size),
        errors=dict(errors),
        latency=LatencyStats.of(latencies),
        client_cpu=max((window.client_cpu for window in windows), default=0.0),
        late=sum(window.late for window in windows),
        held=sum(window.held for window in windows),
        server=server,
    )
