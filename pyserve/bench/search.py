"""How ``tune`` searches: which load levels measure one configuration, and which configurations to try.

Both are plain functions of what they are told, so the strategy is tested against cost models without a server.

**One configuration** is worth the highest throughput it reaches with p99 within the SLO (and no errors), over
closed-loop concurrency levels. ``sweep`` starts where every instance gets a full batch (instances times max batch
size requests in flight), halves while p99 is over the SLO, doubles while it is within and throughput still grows
by ``min_gain``, then tries once between the last level within the SLO and the first one over it.

**Configurations** are points of a lattice: max batch size (powers of two up to the model's), instance count, worker
kind, max queue delay and preferred batch sizes. ``quick_search`` is a hill climb in the manner of Model Analyzer's
quick search: from the smallest configuration it measures the neighbours (one step along one axis), moves to the
best one if it beats the current one by ``min_gain``, and stops at a configuration no neighbour beats, or when the
budget is spent. Two pairs of axes pay only together, so a step along one is also tried with a step along the
other: more instances with the other worker kind (more threads may gain nothing where more processes do), and a
larger batch with the next queue delay (without a delay, a closed loop's requests come back one by one, the first
goes alone in a batch, and larger batches only lengthen the wait; with one, they fill). ``choose_winner`` takes the
best, and among those within ``min_gain`` of it (measurement noise) the cheapest: fewer instances, threads before
processes, smaller batches, shorter delays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pyserve.bench.candidates import Candidate

# Throughput must grow by this share to count as better (below it, two measurements are the same within noise).
MIN_GAIN = 0.05
# A load level with more failures than this share does not meet the SLO whatever its latency.
MAX_ERROR_RATE = 0.001
Point = tuple[int, int, int, int, int]  # indices: batch size, instances, kind, queue delay, preferred sizes


@dataclasses.dataclass(frozen=True)
class LoadPoint:
    """One concurrency level measured on one configuration."""

    concurrency: int
    throughput: float
    p99_ms: float | None
    p50_ms: float | None = None
    error_rate: float = 0.0
    stable: bool = True

    def meets(self, slo_ms: float) -> bool:
        """Whether p99 is within ``slo_ms`` and (almost) nothing failed."""
        return self.p99_ms is not None and self.p99_ms <= slo_ms and self.error_rate <= MAX_ERROR_RATE

    def to_json(self) -> dict[str, Any]:
        """The level as JSON."""
        return dataclasses.asdict(self)


def best_point(points: Sequence[LoadPoint], slo_ms: float) -> LoadPoint | None:
    """The level with the highest throughput among those meeting the SLO."""
    meeting = [point for point in points if point.meets(slo_ms)]
    return max(meeting, key=lambda point: point.throughput, default=None)


def sweep(
    measure: Callable[[int], LoadPoint],
    start: int,
    slo_ms: float,
    max_concurrency: int,
    min_gain: float = MIN_GAIN,
) -> list[LoadPoint]:
    """Measure concurrency levels of one configuration until its best level within ``slo_ms`` is bracketed."""
    measured: dict[int, LoadPoint] = {}

    def at(concurrency: int) -> LoadPoint:
        if concurrency not in measured:
            measured[concurrency] = measure(concurrency)
        return measured[concurrency]

    level = max(1, min(start, max_concurrency))
    good: int | None = None
    bad: int | None = None
    if at(level).meets(slo_ms):
        good = level
        while good * 2 <= max_concurrency:
            higher = at(good * 2)
            if not higher.meets(slo_ms):
                bad = good * 2
                break
            if higher.throughput < at(good).throughput * (1 + min_gain):
                break  # saturated: more requests in flight only queue
            good *= 2
    else:
        bad = level
        while bad > 1:
            lower = bad // 2
            if at(lower).meets(slo_ms):
                good = lower
                break
            bad = lower
    if good is not None and bad is not None and bad - good > 1:
        at((good + bad) // 2)
    return [measured[level] for level in sorted(measured)]


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """A configuration measured: its load levels, or why it could not be (``error``)."""

    candidate: Candidate
    points: tuple[LoadPoint, ...]
    slo_ms: float
    error: str | None = None

    @property
    def best(self) -> LoadPoint | None:
        """Its best level within the SLO."""
        return best_point(self.points, self.slo_ms)

    @property
    def score(self) -> float:
        """The throughput of its best level within the SLO (0: none met it)."""
        best = self.best
        return 0.0 if best is None else best.throughput


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The axes of the search. ``instance_counts`` are totals (per GPU times the GPUs when ``devices`` are GPUs)."""

    batch_sizes: tuple[int, ...]
    instance_counts: tuple[int, ...]
    kinds: tuple[str, ...]
    queue_delays_us: tuple[int, ...]
    preferred: bool = True
    devices: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
        max_batch_size: int,
        max_instances: int,
        kinds: Sequence[str],
        queue_delays_us: Sequence[int],
        slo_ms: float,
        gpus: int = 0,
        preferred: bool = True,
    ) -> SearchSpace:
        """The space for a model that batches up to ``max_batch_size`` rows (0: not at all), with up to
        ``max_instances`` instances (per GPU where there are ``gpus``: process instances on each), the worker
        ``kinds`` given, and the queue delays below a quarter of the SLO."""
        sizes: list[int] = []
        size = 1
        while size < max_batch_size:
            sizes.append(size)
            size *= 2
        if max_batch_size > 0:
            sizes.append(max_batch_size)
        delays = sorted({0, *(delay for delay in queue_delays_us if 0 < delay < slo_ms * 1000 / 4)})
        per_device = tuple(range(1, max_instances + 1))
        if gpus:
            return cls(
                batch_sizes=tuple(sizes) or (0,),
                instance_counts=tuple(count * gpus for count in per_device),
                kinds=("process",),
                queue_delays_us=tuple(delays),
                preferred=preferred,
                devices=tuple(f"cuda:{index}" for index in range(gpus)),
            )
        return cls(tuple(sizes) or (0,), per_device, tuple(kinds), tuple(delays), preferred)

    @property
    def start(self) -> Point:
        """The smallest configuration."""
        return (0, 0, 0, 0, 0)

    def size(self) -> int:
        """How many distinct configurations the space holds."""
        points = {
            self._canonical((b, i, k, d, p))
            for b in range(len(self.batch_sizes))
            for i in range(len(self.instance_counts))
            for k in range(len(self.kinds))
            for d in range(len(self.queue_delays_us))
            for p in range(2 if self.preferred else 1)
        }
        return len(points)

    def candidate(self, point: Point) -> Candidate:
        """The configuration at ``point``."""
        batch, instances, kind, delay, preferred = self._canonical(point)
        size = self.batch_sizes[batch]
        return Candidate(
            max_batch_size=size,
            instances=self.instance_counts[instances],
            worker=self.kinds[kind],
            max_queue_delay_us=self.queue_delays_us[delay],
            preferred_batch_size=(size // 2, size) if preferred else (),
            devices=self.devices,
        )

    def neighbours(self, point: Point) -> list[Point]:
        """The points one step away, the likeliest gains first (larger batches, more instances)."""
        batch, instances, kind, delay, preferred = point
        moves: list[Point] = [
            (batch + 1, instances, kind, delay, preferred),
            (batch + 1, instances, kind, delay + 1, preferred),
        ]
        moves += [(batch, instances + 1, other, delay, preferred) for other in self._kinds_from(kind)]
        moves += [(batch, instances, other, delay, preferred) for other in self._kinds_from(kind)[1:]]
        moves += [(batch, instances, kind, delay + 1, preferred), (batch, instances, kind, delay, 1 - preferred)]
        moves += [(batch - 1, instances, kind, delay, preferred), (batch, instances - 1, kind, delay, preferred)]
        moves.append((batch, instances, kind, delay - 1, preferred))
        found: list[Point] = []
        for move in moves:
            if self._inside(move):
                canonical = self._canonical(move)
                if canonical != self._canonical(point) and canonical not in found:
                    found.append(canonical)
        return found

    def _kinds_from(self, kind: int) -> list[int]:
        return [kind, *(other for other in range(len(self.kinds)) if other != kind)]

    def _inside(self, point: Point) -> bool:
        batch, instances, kind, delay, preferred = point
        limits = (len(self.batch_sizes), len(self.instance_counts), len(self.kinds), len(self.queue_delays_us))
        inside = all(0 <= index < limit for index, limit in zip((batch, instances, kind, delay), limits, strict=True))
        return inside and preferred in ((0, 1) if self.preferred else (0,))

    def _canonical(self, point: Point) -> Point:
        """Settings that cannot matter are set to their first value: a queue delay or preferred sizes without
        batches of several rows, preferred sizes without a delay to wait out."""
        batch, instances, kind, delay, preferred = point
        if self.batch_sizes[batch] <= 1:
            delay = preferred = 0
        if self.queue_delays_us[delay] == 0:
            preferred = 0
        return (batch, instances, kind, delay, preferred)


def quick_search(
    space: SearchSpace,
    evaluate: Callable[[Candidate], Evaluation],
    has_budget: Callable[[], bool],
    min_gain: float = MIN_GAIN,
) -> list[Evaluation]:
    """Climb from the smallest configuration to one no neighbour beats by ``min_gain`` (or until ``has_budget()``
    says no more); every evaluation, in the order made."""
    evaluations: dict[Point, Evaluation] = {}
    current = space.start
    evaluations[current] = evaluate(space.candidate(current))
    while has_budget():
        for point in space.neighbours(current):
            if point not in evaluations:
                if not has_budget():
                    break
                evaluations[point] = evaluate(space.candidate(point))
        known = [point for point in space.neighbours(current) if point in evaluations]
        best = max(known, key=lambda point: evaluations[point].score, default=current)
        if evaluations[best].score <= evaluations[current].score * (1 + min_gain) or evaluations[best].score == 0:
            break
        current = best
    return list(evaluations.values())


def choose_winner(evaluations: Sequence[Evaluation], min_gain: float = MIN_GAIN) -> Evaluation | None:
    """The best evaluation that met the SLO; ties within ``min_gain`` go to the cheapest configuration."""
    scored = [evaluation for evaluation in evaluations if evaluation.score > 0]
    if not scored:
        return None
    top = max(evaluation.score for evaluation in scored)
    close = [evaluation for evaluation in scored if evaluation.score >= top * (1 - min_gain)]
    return min(close, key=lambda evaluation: evaluation.candidate.cost())


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (throughput, latency) points no other point beats on both (more throughput and less latency), by
    throughput."""
    front: list[tuple[float, float]] = []
    for throughput, latency in sorted(points, key=lambda point: (point[1], -point[0])):
        if not front or throughput > front[-1][0]:
            front.append((throughput, latency))
    return front
