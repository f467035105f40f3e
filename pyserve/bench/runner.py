"""A benchmark run: the model described, requests built, and each load step measured window by window.

``run_bench`` does it all for ``pyserve bench``; ``measure_step`` measures one load level against whatever server
the generator targets, which is what ``tune`` calls for each candidate configuration.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from pyserve.bench.generator import LoadGenerator
from pyserve.bench.inputs import request_inputs
from pyserve.bench.progress import Progress
from pyserve.bench.server_calls import ServerCalls
from pyserve.bench.server_stats import ServerCounters
from pyserve.bench.settings import BenchSettings, LoadLevel
from pyserve.bench.windows import STABLE_WINDOWS, Merged, Window, is_stable, merge, window_of
from pyserve.bench.worker import Target
from pyserve.client.model import InferRequest, RemoteModelConfig, parse_url, wire_datatype

# Above this share of a core, a client process may be what limits the load.
BUSY_CLIENT = 0.85
# Above this share of open-loop requests sent late, the generator did not keep the rate.
LATE_SHARE = 0.1


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One load level measured: the last (up to three) windows merged."""

    level: LoadLevel
    rows_per_request: int
    measured: Merged
    stable: bool
    windows: int

    @property
    def requests_per_s(self) -> float:
        """Successful requests a second."""
        return self.measured.successes / self.measured.seconds if self.measured.seconds > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Inferences a second: successful requests times the rows each carries (perf_analyzer's infer/sec)."""
        return self.requests_per_s * self.rows_per_request

    @property
    def failures(self) -> int:
        """Requests answered with an error."""
        return sum(self.measured.errors.values())

    @property
    def p99_ms(self) -> float | None:
        """The 99th-percentile latency in ms (None without any success)."""
        latency = self.measured.latency
        return None if latency is None else latency.p99_us / 1000.0

    @property
    def outside_server_us(self) -> float | None:
        """Mean latency the server did not count: the network and the client (µs; None without statistics)."""
        latency, server = self.measured.latency, self.measured.server
        if latency is None or server is None:
            return None
        return max(latency.avg_us - server.request_us, 0.0)

    def to_json(self) -> dict[str, Any]:
        """The step as the JSON report holds it (latencies in µs)."""
        measured = self.measured
        answered = measured.successes + self.failures
        return {
            self.level.mode: self.level.concurrency if self.level.concurrency is not None else self.level.request_rate,
            "throughput_infer_per_s": self.throughput,
            "requests_per_s": self.requests_per_s,
            "successes": measured.successes,
            "failures": self.failures,
            "error_rate": self.failures / answered if answered else 0.0,
            "errors": dict(measured.errors),
            "latency_us": None if measured.latency is None else measured.latency.to_json(),
            "server": None if measured.server is None else measured.server.to_json(),
            "outside_server_us": self.outside_server_us,
            "stable": self.stable,
            "windows": self.windows,
            "measured_s": measured.seconds,
            "client_cpu": measured.client_cpu,
            "late_sends": measured.late,
            "held_sends": measured.held,
        }

    def summary(self) -> str:
        """One line: throughput and latency."""
        latency = self.measured.latency
        text = f"{self.throughput:,.1f} infer/s"
        if latency is not None:
            text += f", p50 {latency.p50_us / 1000:.2f} ms, p99 {latency.p99_us / 1000:.2f} ms"
        if self.failures:
            text += f", {self.failures} errors"
        return text + ("" if self.stable else " (not stable)")


@dataclasses.dataclass(frozen=True)
class BenchReport:
    """A whole benchmark: what was measured, how, and each step's result."""

    settings: BenchSettings
    model: RemoteModelConfig
    inputs: dict[str, tuple[str, tuple[int, ...]]]
    rows_per_request: int
    processes: int
    steps: tuple[StepResult, ...]

    @property
    def protocol(self) -> str:
        """``http`` or ``grpc``."""
        return parse_url(self.settings.url, self.settings.tls).scheme

    def to_json(self) -> dict[str, Any]:
        """The report as JSON: settings, model, and one entry per step."""
        settings = self.settings
        return {
            "model": settings.model,
            "model_version": settings.model_version,
            "url": settings.url,
            "protocol": self.protocol,
            "mode": settings.mode,
            "max_batch_size": self.model.max_batch_size,
            "rows_per_request": self.rows_per_request,
            "inputs": {name: {"datatype": dt, "shape": list(shape)} for name, (dt, shape) in self.inputs.items()},
            "client_processes": self.processes,
            "warmup_s": settings.warmup_s,
            "window_s": settings.window_s,
            "duration_s": settings.duration_s,
            "stability": settings.stability,
            "distribution": settings.distribution if settings.mode == "request_rate" else None,
            "steps": [step.to_json() for step in self.steps],
        }


def run_bench(settings: BenchSettings, progress: Progress | None = None) -> BenchReport:
    """Measure every load level of ``settings`` in turn."""
    progress = progress or Progress()
    with ServerCalls(settings.url, settings.model, settings.model_version, settings.headers, settings.tls) as calls:
        config = calls.describe()
        requests = request_inputs(config, settings)
        rows = settings.batch_size if config.batching else 1
        processes = settings.client_processes()
        with LoadGenerator(processes) as generator:
            generator.target(target_of(settings, requests))
            steps = []
            for index, level in enumerate(settings.levels, start=1):
                progress.step(index, len(settings.levels), level)
                steps.append(measure_step(generator, calls, level, settings, rows, progress))
    inputs = {name: (wire_datatype(name, array), tuple(array.shape)) for name, array in requests[0].items()}
    return BenchReport(settings, config, inputs, rows, processes, tuple(steps))


def target_of(settings: BenchSettings, requests: list[dict[str, Any]]) -> Target:
    """What the client processes send: ``requests`` for ``settings``'s server and model."""
    return Target(
        url=settings.url,
        tls=settings.tls,
        requests=[InferRequest(settings.model, settings.model_version, inputs) for inputs in requests],
        headers=dict(settings.headers),
        request_timeout_s=settings.request_timeout_s,
        max_in_flight=settings.max_in_flight,
        distribution=settings.distribution,
        seed=settings.seed,
    )


def measure_step(
    generator: LoadGenerator,
    calls: ServerCalls,
    level: LoadLevel,
    settings: BenchSettings,
    rows_per_request: int,
    progress: Progress,
) -> StepResult:
    """Run ``level`` on the generator's target: warm up, then windows until stable or out of time; the load stops
    before this returns."""
    limit = max(STABLE_WINDOWS, math.floor(settings.duration_s / settings.window_s + 1e-9))
    generator.start(level)
    try:
        start = time.monotonic() + settings.warmup_s
        generator.collect(start)
        readings: list[ServerCounters | None] = [_counters(calls)]
        windows: list[Window] = []
        stable = False
        while not stable and len(windows) < limit:
            end = start + settings.window_s
            collected = generator.collect(end)
            counters = _counters(calls)
            window = window_of(collected, start, end, generator.messages(), counters)
            windows.append(window)
            readings.append(counters)
            stable = is_stable(windows, settings.stability)
            progress.window(len(windows), limit, window, rows_per_request, stable)
            start = end
    finally:
        generator.idle()
    last = windows[-STABLE_WINDOWS:]
    result = StepResult(level, rows_per_request, merge(last, readings[-len(last) - 1]), stable, len(windows))
    progress.step_done(result.summary())
    _warn(result, progress)
    return result


def _counters(calls: ServerCalls) -> ServerCounters | None:
    stats = calls.statistics()
    return None if stats is None else ServerCounters.from_document(stats)


def _warn(result: StepResult, progress: Progress) -> None:
    measured = result.measured
    if measured.client_cpu > BUSY_CLIENT:
        progress.note(
            f"  note: a client process was busy {measured.client_cpu:.0%} of a core: the load generator may have "
            "limited this step (add --processes, or run it on another machine)"
        )
    sent = measured.successes + result.failures
    if result.level.request_rate is None or not sent:
        return
    if measured.held / sent > LATE_SHARE:
        progress.note(
            f"  note: {measured.held / sent:.0%} of the requests waited for one of --max-in-flight slots: the server "
            "did not keep up with the rate, so the rate sent was lower"
        )
    if measured.late / sent > LATE_SHARE:
        progress.note(
            f"  note: {measured.late / sent:.0%} of the requests went out more than 2 ms late: the client processes "
            "did not keep the schedule (a busy machine, or too few: add --processes)"
        )
