"""pyserve.bench.search: tune's strategy against cost models, without a server.

A simulated model takes ``a + b * rows`` per batch. With ``c`` requests in flight on ``k`` instances of max batch
size ``B``, each instance runs batches of ``min(B, c / k)`` rows; past ``k * B`` in flight, requests queue for whole
batch rounds. That is the cost model the integration test (tests/integration/test_bench_tune.py) serves for real.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from pyserve.bench.candidates import Candidate
from pyserve.bench.search import (
    Evaluation,
    LoadPoint,
    SearchSpace,
    choose_winner,
    pareto_front,
    quick_search,
    sweep,
)
from pyserve.config import ModelConfig


class CostModel:
    """Latency and throughput of a candidate at a concurrency, from ``a + b * rows`` per batch (ms).

    ``threads_share_a_core``: thread instances take turns (CPU-bound Python under the interpreter lock).
    ``closed_loop_without_delay``: as a real server behaves without a queue delay: the requests of a finished batch
    come back one by one, the first goes alone and the rest wait for it, so batches alternate between 1 and the rest.
    """

    def __init__(
        self, a_ms: float, b_ms: float, threads_share_a_core: bool = False, closed_loop_without_delay: bool = False
    ) -> None:
        self.a_ms, self.b_ms = a_ms, b_ms
        self.threads_share_a_core = threads_share_a_core
        self.closed_loop_without_delay = closed_loop_without_delay

    def service_ms(self, rows: int) -> float:
        return self.a_ms + self.b_ms * rows

    def measure(self, candidate: Candidate, concurrency: int) -> LoadPoint:
        instances = candidate.instances
        if self.threads_share_a_core and candidate.worker == "thread":
            instances = 1
        size = max(candidate.max_batch_size, 1)
        rows = min(size, math.ceil(concurrency / instances))
        rounds = math.ceil(concurrency / (instances * size))
        if self.closed_loop_without_delay and candidate.max_queue_delay_us == 0 and rows > 1:
            cycle_ms = self.service_ms(1) + self.service_ms(rows - 1)
        else:
            cycle_ms = self.service_ms(rows) + candidate.max_queue_delay_us / 1000 * (rows < size)
        latency_ms = rounds * cycle_ms
        return LoadPoint(concurrency, concurrency / latency_ms * 1000, latency_ms, latency_ms)

    def evaluate(self, slo_ms: float, max_concurrency: int = 1024) -> Callable[[Candidate], Evaluation]:
        def evaluate(candidate: Candidate) -> Evaluation:
            start = max(candidate.max_batch_size, 1) * candidate.instances
            points = sweep(lambda c: self.measure(candidate, c), start, slo_ms, max_concurrency)
            return Evaluation(candidate, tuple(points), slo_ms)

        return evaluate


def every_point(space: SearchSpace) -> list[Candidate]:
    return list(
        {
            space.candidate((b, i, k, d, p))
            for b in range(len(space.batch_sizes))
            for i in range(len(space.instance_counts))
            for k in range(len(space.kinds))
            for d in range(len(space.queue_delays_us))
            for p in range(2 if space.preferred else 1)
        }
    )


def test_the_sweep_brackets_the_best_level_within_the_target() -> None:
    model = CostModel(20, 5)
    candidate = Candidate(max_batch_size=8, instances=2)
    points = sweep(lambda c: model.measure(candidate, c), 16, 75.0, 1024)
    # 16 in flight fill both instances' batches of 8 (60 ms); 32 queue a second round (120 ms); 24 is tried between.
    assert [point.concurrency for point in points] == [16, 24, 32]
    best = max((point for point in points if point.meets(75.0)), key=lambda point: point.throughput)
    assert best.concurrency == 16 and best.throughput == pytest.approx(16 / 60 * 1000)


def test_the_sweep_halves_until_within_the_target() -> None:
    model = CostModel(20, 5)
    candidate = Candidate(max_batch_size=16, instances=1)
    points = sweep(lambda c: model.measure(candidate, c), 16, 75.0, 1024)
    assert [point.concurrency for point in points] == [8, 12, 16]
    assert [point.meets(75.0) for point in points] == [True, False, False]


def test_the_sweep_stops_growing_once_throughput_does() -> None:
    candidate = Candidate(max_batch_size=0, instances=1)

    def saturated(concurrency: int) -> LoadPoint:
        return LoadPoint(concurrency, 100.0, 1.0)  # one request at a time, latency far below the target

    assert [point.concurrency for point in sweep(saturated, 1, 1000.0, 1024)] == [1, 2]
    assert candidate.label() == "no batching, 1 thread instance"


def test_a_level_with_errors_does_not_meet_the_target() -> None:
    assert LoadPoint(4, 100.0, 5.0).meets(10.0)
    assert not LoadPoint(4, 100.0, 5.0, error_rate=0.01).meets(10.0)
    assert not LoadPoint(4, 100.0, None).meets(10.0)


def test_the_space_has_powers_of_two_and_delays_below_a_quarter_of_the_target() -> None:
    space = SearchSpace.build(24, 3, ("thread", "process"), (0, 100, 5000, 20000), slo_ms=40.0)
    assert space.batch_sizes == (1, 2, 4, 8, 16, 24)
    assert space.instance_counts == (1, 2, 3)
    assert space.queue_delays_us == (0, 100, 5000)
    assert SearchSpace.build(0, 2, ("thread",), (0, 100), 40.0).batch_sizes == (0,)


def test_on_gpus_instances_are_processes_on_every_gpu() -> None:
    space = SearchSpace.build(8, 2, ("thread", "process"), (0,), 40.0, gpus=2)
    assert space.kinds == ("process",)
    assert space.instance_counts == (2, 4)
    candidate = space.candidate((3, 1, 0, 0, 0))
    assert candidate == Candidate(8, 4, "process", 0, (), ("cuda:0", "cuda:1"))
    assert candidate.model_config(ModelConfig(max_batch_size=8)).devices == ("cuda:0", "cuda:1")


def test_neighbours_skip_settings_that_cannot_matter() -> None:
    space = SearchSpace.build(8, 2, ("thread", "process"), (0, 500), 40.0)
    # Batches of one row: no queue delay or preferred sizes to try; a larger batch also with the next delay.
    assert space.neighbours((0, 0, 0, 0, 0)) == [
        *((1, 0, 0, 0, 0), (1, 0, 0, 1, 0)),  # batch 2, without and with a delay
        *((0, 1, 0, 0, 0), (0, 1, 1, 0, 0)),  # two instances, threads or processes
        (0, 0, 1, 0, 0),  # a process instead of a thread
    ]
    # No delay: no preferred sizes; an instance step is tried with both kinds.
    assert (2, 0, 0, 1, 0) in space.neighbours((2, 0, 0, 0, 0))
    assert all(point[4] == 0 for point in space.neighbours((2, 0, 0, 0, 0)))
    assert (2, 0, 0, 1, 1) in space.neighbours((2, 0, 0, 1, 0))
    assert space.candidate((2, 0, 0, 1, 1)).preferred_batch_size == (2, 4)
    assert space.size() == len(every_point(space))


@pytest.mark.parametrize("kinds", [("thread",), ("thread", "process")])
def test_quick_search_finds_what_the_cost_model_predicts_in_a_fraction_of_the_space(kinds: tuple[str, ...]) -> None:
    # The integration test's model: 20 ms + 5 ms a row, p99 within 75 ms.
    model = CostModel(a_ms=20, b_ms=5)
    space = SearchSpace.build(16, 2, kinds, (0, 500, 2000), slo_ms=75.0)
    evaluate = model.evaluate(75.0)
    predicted = choose_winner([evaluate(candidate) for candidate in every_point(space)])
    assert predicted is not None
    # Batches of 8 take 60 ms and fit, 12 or 16 take 80-100 ms and do not; two instances double the throughput.
    assert predicted.candidate == Candidate(max_batch_size=8, instances=2)
    evaluations = quick_search(space, evaluate, lambda: True)
    winner = choose_winner(evaluations)
    assert winner is not None and winner.candidate == predicted.candidate
    assert winner.score == pytest.approx(16 / 60 * 1000)
    assert len(evaluations) <= space.size() // 2


def test_quick_search_crosses_to_a_queue_delay_where_larger_batches_need_one() -> None:
    # Without a delay, batches of 8 alternate with batches of 1 and gain nothing over 4: only both together pay.
    model = CostModel(a_ms=20, b_ms=5, closed_loop_without_delay=True)
    space = SearchSpace.build(16, 2, ("thread",), (0, 2000), slo_ms=75.0, preferred=False)
    evaluate = model.evaluate(75.0)
    predicted = choose_winner([evaluate(candidate) for candidate in every_point(space)])
    assert predicted is not None and predicted.candidate == Candidate(8, 2, max_queue_delay_us=2000)
    evaluations = quick_search(space, evaluate, lambda: True)
    winner = choose_winner(evaluations)
    assert winner is not None and winner.candidate == predicted.candidate
    assert len(evaluations) < space.size()


def test_quick_search_tries_processes_where_more_threads_gain_nothing() -> None:
    model = CostModel(a_ms=5, b_ms=1, threads_share_a_core=True)
    space = SearchSpace.build(4, 3, ("thread", "process"), (0,), slo_ms=20.0)
    winner = choose_winner(quick_search(space, model.evaluate(20.0), lambda: True))
    assert winner is not None
    assert (winner.candidate.worker, winner.candidate.instances, winner.candidate.max_batch_size) == ("process", 3, 4)


def test_quick_search_stops_when_the_budget_is_spent() -> None:
    model = CostModel(a_ms=20, b_ms=5)
    space = SearchSpace.build(16, 4, ("thread", "process"), (0, 2000), slo_ms=75.0)
    allowed = iter([True, True, True, False])
    evaluations = quick_search(space, model.evaluate(75.0), lambda: next(allowed, False))
    assert 1 < len(evaluations) <= 4


def test_ties_within_noise_go_to_the_cheaper_configuration() -> None:
    def scored(candidate: Candidate, throughput: float) -> Evaluation:
        return Evaluation(candidate, (LoadPoint(8, throughput, 10.0),), 20.0)

    evaluations = [
        scored(Candidate(32, 2), 1000.0),
        scored(Candidate(16, 2), 980.0),
        scored(Candidate(16, 2, "process"), 1010.0),
        scored(Candidate(8, 2), 900.0),
        Evaluation(Candidate(64, 4), (LoadPoint(8, 5000.0, 30.0),), 20.0),  # over the target
    ]
    winner = choose_winner(evaluations)
    assert winner is not None and winner.candidate == Candidate(16, 2)
    assert choose_winner([evaluations[-1]]) is None


def test_the_pareto_front_keeps_points_no_other_beats() -> None:
    points = [(100.0, 5.0), (200.0, 8.0), (150.0, 9.0), (300.0, 20.0), (250.0, 25.0), (90.0, 4.0)]
    assert pareto_front(points) == [(90.0, 4.0), (100.0, 5.0), (200.0, 8.0), (300.0, 20.0)]
