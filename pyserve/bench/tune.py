"""``pyserve tune``: start the model with one candidate configuration after another, measure each, keep the best.

The model comes from a ``Serve`` with it bound (the module ``pyserve serve`` would serve, or a function bound from
the command line): each candidate is a fresh ``Serve`` on free loopback ports with only that model, bound with the
model's own function, tensors and ``ModelConfig`` but the candidate's batching and instance settings. The same
client processes measure every candidate (``runner.measure_step``); ``search`` decides what to try and which wins.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from typing import Any

from pyserve.bench.candidates import Candidate
from pyserve.bench.generator import LoadGenerator
from pyserve.bench.inputs import request_inputs
from pyserve.bench.progress import Progress
from pyserve.bench.runner import measure_step, target_of
from pyserve.bench.search import Evaluation, LoadPoint, SearchSpace, choose_winner, quick_search, sweep
from pyserve.bench.server_calls import ServerCalls
from pyserve.bench.settings import CONCURRENCY_PER_PROCESS, BenchSettings, LoadLevel
from pyserve.config import ModelConfig, ServeConfig, Tensor, WorkerKind
from pyserve.devices import visible_gpu_count
from pyserve.errors import ConfigError, PyServeError
from pyserve.serve import Serve

DEFAULT_QUEUE_DELAYS_US = (0, 100, 500, 2000)


@dataclasses.dataclass(frozen=True)
class ModelUnderTune:
    """A bound model, as tune binds it again with each candidate configuration."""

    name: str
    version: int
    function: Callable[..., Any]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    config: ModelConfig
    strict: bool
    serve_config: ServeConfig

    @classmethod
    def from_serve(cls, server: Serve, model: str | None) -> ModelUnderTune:
        """Model ``model`` of a ``Serve`` that has not started (the only one bound when None)."""
        bound = server.bindings()
        names = sorted({entry.spec.name for entry in bound})
        if not bound:
            raise ConfigError("the Serve has no model bound with bind(): nothing to tune")
        if model is None:
            if len(names) > 1:
                raise ConfigError(f"the Serve binds several models ({', '.join(names)}): name one with --model")
            model = names[0]
        chosen = [entry for entry in bound if entry.spec.name == model]
        if not chosen:
            raise ConfigError(f"the Serve binds no model '{model}' (it binds {', '.join(names)})")
        entry = max(chosen, key=lambda item: item.spec.version)
        spec = entry.spec
        if spec.config.decoupled:
            raise ConfigError(f"model '{model}' is decoupled (it streams): tune measures models that answer once")
        if len({id(function) for function in entry.functions}) > 1:
            raise ConfigError(
                f"model '{model}' is bound with one callable per instance: tune tries other instance counts, so "
                "bind one callable (or a class, instantiated per instance)"
            )
        return cls(
            spec.name,
            spec.version,
            entry.functions[0],
            spec.inputs,
            spec.outputs,
            spec.config,
            spec.strict,
            server.config,
        )

    def serve(self, config: ModelConfig) -> Serve:
        """A running server with only this model, bound with ``config``, on free loopback ports."""
        serve_config = dataclasses.replace(
            self.serve_config,
            host="127.0.0.1",
            http_port=0,
            grpc_port=0,
            metrics_port=0,
            allow_http=True,
            allow_grpc=True,
            allow_metrics=False,
            model_repository="",
        )
        server = Serve(serve_config)
        server.bind(self.name, self.function, self.inputs, self.outputs, config, self.version, self.strict)
        try:
            server.run()
        except BaseException:
            server.stop()
            raise
        return server


@dataclasses.dataclass(frozen=True)
class TuneSettings:
    """What tune looks for and how long it may look. ``bench`` says how each load level is measured (its ``model``
    and ``url`` are set per candidate); ``concurrency`` fixes the load levels instead of the sweep; ``gpus`` None
    counts the visible GPUs."""

    slo_p99_ms: float
    bench: BenchSettings
    max_instances: int = 4
    kinds: tuple[str, ...] = (WorkerKind.THREAD.value, WorkerKind.PROCESS.value)
    queue_delays_us: tuple[int, ...] = DEFAULT_QUEUE_DELAYS_US
    preferred: bool = True
    budget_s: float = 300.0
    concurrency: tuple[int, ...] = ()
    max_concurrency: int = 1024
    protocol: str = "http"
    gpus: int | None = None

    def __post_init__(self) -> None:
        if not self.slo_p99_ms > 0:
            raise ConfigError(f"the p99 target must be > 0 ms, got {self.slo_p99_ms}")
        if self.max_instances < 1 or self.max_concurrency < 1:
            raise ConfigError("max instances and max concurrency must be >= 1")
        if not self.budget_s > 0:
            raise ConfigError(f"the budget must be > 0 s, got {self.budget_s}")
        unknown = [kind for kind in self.kinds if kind not in {kind.value for kind in WorkerKind}]
        if unknown or not self.kinds:
            raise ConfigError(f"worker kinds are thread and process, got {', '.join(self.kinds) or 'none'}")
        if self.protocol not in ("http", "grpc"):
            raise ConfigError(f"protocol must be http or grpc, got {self.protocol!r}")
        if any(delay < 0 for delay in self.queue_delays_us):
            raise ConfigError("queue delays must be >= 0 us")


@dataclasses.dataclass(frozen=True)
class Trial:
    """One configuration tried: its evaluation, the ``ModelConfig`` it was, and how long it took."""

    number: int
    evaluation: Evaluation
    model_config: ModelConfig | None
    seconds: float


@dataclasses.dataclass(frozen=True)
class TuneReport:
    """Everything tune tried and what won (None: nothing met the SLO)."""

    model: ModelUnderTune
    settings: TuneSettings
    space: SearchSpace
    trials: tuple[Trial, ...]
    winner: Trial | None
    elapsed_s: float
    stopped: str


def run_tune(model: ModelUnderTune, settings: TuneSettings, progress: Progress | None = None) -> TuneReport:
    """Search ``model``'s configurations for the highest throughput with p99 within the SLO."""
    progress = progress or Progress()
    began = time.monotonic()
    deadline = began + settings.budget_s
    gpus = visible_gpu_count() if settings.gpus is None else settings.gpus
    space = SearchSpace.build(
        model.config.max_batch_size,
        settings.max_instances,
        settings.kinds,
        settings.queue_delays_us,
        settings.slo_p99_ms,
        gpus,
        settings.preferred,
    )
    trials: list[Trial] = []
    processes = settings.bench.processes or max(
        1, min(math.ceil(settings.max_concurrency / CONCURRENCY_PER_PROCESS), (os.cpu_count() or 1) // 2)
    )
    stopped = "no neighbour did better"
    with LoadGenerator(processes) as generator:
        evaluator = _Evaluator(model, settings, generator, progress, trials)

        def has_budget() -> bool:
            nonlocal stopped
            if time.monotonic() + evaluator.typical_s() < deadline:
                return True
            stopped = "budget spent"
            return False

        try:
            quick_search(space, evaluator.evaluate, has_budget)
        except KeyboardInterrupt:
            stopped = "interrupted"
            progress.note("interrupted: reporting the configurations measured so far")
    by_evaluation = {id(trial.evaluation): trial for trial in trials}
    winner_evaluation = choose_winner([trial.evaluation for trial in trials])
    winner = None if winner_evaluation is None else by_evaluation[id(winner_evaluation)]
    return TuneReport(model, settings, space, tuple(trials), winner, time.monotonic() - began, stopped)


class _Evaluator:
    """Measures candidates one after another with the same client processes."""

    def __init__(
        self,
        model: ModelUnderTune,
        settings: TuneSettings,
        generator: LoadGenerator,
        progress: Progress,
        trials: list[Trial],
    ) -> None:
        self._model = model
        self._settings = settings
        self._generator = generator
        self._progress = progress
        self._trials = trials
        self._requests: list[dict[str, Any]] | None = None

    def typical_s(self) -> float:
        """How long a candidate has taken (the longest so far; 0 before the first)."""
        return max((trial.seconds for trial in self._trials), default=0.0)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        started = time.monotonic()
        number = len(self._trials) + 1
        slo = self._settings.slo_p99_ms
        self._progress.note(f"config {number}: {candidate.label()}")
        config: ModelConfig | None = None
        try:
            config = candidate.model_config(self._model.config)
            evaluation = Evaluation(candidate, tuple(self._measure(number, candidate, config)), slo)
        except PyServeError as exc:
            evaluation = Evaluation(candidate, (), slo, error=str(exc))
            self._progress.note(f"  config {number} failed: {exc}")
        best = evaluation.best
        if best is not None:
            self._progress.note(
                f"  config {number}: {best.throughput:,.1f} infer/s at concurrency {best.concurrency} "
                f"(p99 {best.p99_ms:.2f} ms)"
            )
        elif evaluation.error is None:
            self._progress.note(f"  config {number}: no load level kept p99 within {slo:g} ms")
        self._trials.append(Trial(number, evaluation, config, time.monotonic() - started))
        return evaluation

    def _measure(self, number: int, candidate: Candidate, config: ModelConfig) -> list[LoadPoint]:
        settings = self._settings
        server = self._model.serve(config)
        try:
            url = server.url if settings.protocol == "http" else server.grpc_url
            # A TLS URL without settings trusts the system's authorities (parse_url); a plain one takes none.
            tls = settings.bench.tls if url.startswith(("https:", "grpcs:")) else None
            bench = dataclasses.replace(settings.bench, url=url, model=self._model.name, model_version=None, tls=tls)
            with ServerCalls(url, self._model.name, tls=tls) as calls:
                if self._requests is None:
                    self._requests = request_inputs(calls.describe(), bench)
                self._generator.target(target_of(bench, self._requests))
                steps = 0

                def measure(concurrency: int) -> LoadPoint:
                    nonlocal steps
                    steps += 1
                    level = LoadLevel(concurrency=concurrency)
                    self._progress.step(steps, None, level, context=f"config {number} ")
                    result = measure_step(self._generator, calls, level, bench, 1, self._progress)
                    latency = result.measured.latency
                    answered = result.measured.successes + result.failures
                    return LoadPoint(
                        concurrency=concurrency,
                        throughput=result.throughput,
                        p99_ms=None if latency is None else latency.p99_us / 1000,
                        p50_ms=None if latency is None else latency.p50_us / 1000,
                        error_rate=result.failures / answered if answered else 1.0,
                        stable=result.stable,
                    )

                if settings.concurrency:
                    return [measure(level) for level in settings.concurrency]
                capacity = max(candidate.max_batch_size, 1) * candidate.instances
                return sweep(measure, capacity, settings.slo_p99_ms, settings.max_concurrency)
        finally:
            server.stop()
