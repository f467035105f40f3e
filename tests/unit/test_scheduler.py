"""Tests of pyserve.core.scheduler: FIFO dispatch, the dynamic batcher, priorities, queue policies, cancellation,
instances and response ordering, on a fake clock.

The scheduler takes its clock and timer factory as arguments; here the clock is a number the test moves and
timers are recorded so the test fires them, the way Trio's mock clock drives time.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from pyserve.config import DynamicBatcher, ModelConfig, ModelSpec, QueuePolicy, Tensor, TimeoutAction
from pyserve.core.inference import InferenceRequest, InferenceResponse, Instance, ModelEntry, OutputTensor
from pyserve.core.response_orderer import ResponseOrderer
from pyserve.core.scheduler import ModelScheduler, Reject
from pyserve.errors import InferenceError, InvalidInputError, ModelExecutionError, QueueFullError, RequestTimeoutError

US = 1000  # nanoseconds per microsecond


@dataclass
class FakeTimer:
    """A timer the test fires by hand."""

    delay_s: float
    due_ns: int
    callback: Callable[[], None]
    cancelled: bool = False
    fired: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeLoop:
    """A clock in nanoseconds and the timers armed against it."""

    now_ns: int = 0
    timers: list[FakeTimer] = field(default_factory=list)

    def clock(self) -> int:
        return self.now_ns

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(delay_s, self.now_ns + round(delay_s * 1e9), callback)
        self.timers.append(timer)
        return timer

    @property
    def armed(self) -> list[FakeTimer]:
        """Timers neither cancelled nor fired."""
        return [t for t in self.timers if not t.cancelled and not t.fired]

    @property
    def due_us(self) -> list[float]:
        """When the armed timers are due, in microseconds of the clock."""
        return [t.due_ns / US for t in self.armed]

    def advance_us(self, microseconds: int) -> None:
        self.now_ns += microseconds * US

    def fire(self) -> None:
        """Run the one armed timer (as the event loop would once its delay passed)."""
        (timer,) = self.armed
        timer.fired = True
        timer.callback()


class Harness:
    """A scheduler for one model, the dispatches it made, and its instances."""

    def __init__(
        self,
        max_batch_size: int = 0,
        batcher: DynamicBatcher | None = None,
        *,
        ordered: bool = False,
        reject: Reject | None = None,
        **batcher_args: Any,
    ) -> None:
        if batcher is None and batcher_args:
            batcher = DynamicBatcher(**batcher_args)
        config = ModelConfig(max_batch_size=max_batch_size, batcher=batcher)
        spec = ModelSpec("m", 1, (Tensor("x", np.float32),), (Tensor("y", np.float32),), config)
        self.entry = ModelEntry(spec)
        self.loop = FakeLoop()
        self.dispatched: list[tuple[list[str], Instance]] = []
        self.sent: list[InferenceRequest] = []  # every request dispatched, in order
        self.answers: list[tuple[str, InferenceResponse]] = []  # what reached the client, in order
        self.orderer = ResponseOrderer(self._answer) if ordered else None
        self.scheduler = ModelScheduler(
            self.entry, self._dispatch, self.loop.call_later, self.loop.clock, reject=reject, orderer=self.orderer
        )
        self.entry.scheduler = self.scheduler

    def _dispatch(self, batch: list[InferenceRequest], instance: Instance) -> None:
        self.dispatched.append(([r.id for r in batch], instance))
        self.sent.extend(batch)

    def _answer(self, request: InferenceRequest, response: InferenceResponse) -> None:
        self.answers.append((request.id, response))

    def instance(self, index: int = 0) -> Instance:
        """Connect an instance (idle at once)."""
        worker = Instance(identity=f"i{index}".encode(), index=index, kind="thread", pid=1000 + index)
        self.entry.instances.append(worker)
        self.scheduler.add_instance(worker)
        return worker

    def request(
        self, rid: str, rows: int = 1, signature: tuple[Any, ...] = ("x", "FP32", ()), **parameters: Any
    ) -> InferenceRequest:
        """A validated request of ``rows`` rows with the given request parameters (``priority``, ``timeout``)."""
        return InferenceRequest(
            model=self.entry,
            id=rid,
            inputs={},
            parameters=parameters,
            requested_outputs=[],
            rows=rows,
            on_response=self._answer,
            signature=signature,
        )

    def submit(
        self, rid: str, rows: int = 1, signature: tuple[Any, ...] = ("x", "FP32", ()), **parameters: Any
    ) -> InferenceRequest:
        request = self.request(rid, rows, signature, **parameters)
        self.scheduler.submit(request)
        return request

    def respond(self, rid: str, final: bool = True, error: InferenceError | None = None) -> None:
        """An instance answers a dispatched request (through the orderer, as the server does)."""
        (request,) = [r for r in self.sent if r.id == rid]
        response = InferenceResponse([], error, final)
        if self.orderer is not None:
            self.orderer.deliver(request, response)
        else:
            request.on_response(request, response)

    def errors(self) -> list[tuple[str, str]]:
        """The requests answered with an error, and the error's message."""
        return [(rid, str(response.error)) for rid, response in self.answers if response.error is not None]

    def batches(self) -> list[list[str]]:
        """The request ids of each dispatched batch, in order."""
        return [ids for ids, _ in self.dispatched]

    def queued(self) -> list[str]:
        return [r.id for r in self.scheduler.queued_requests()]


# Without batching -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_batch_size", [0, 8], ids=["no-batch-dimension", "batcher-off"])
def test_without_batching_each_request_is_its_own_batch(max_batch_size: int) -> None:
    harness = Harness(max_batch_size=max_batch_size, batcher=None)
    for rid in "abc":
        harness.submit(rid)
    assert harness.dispatched == []  # no instance yet
    worker = harness.instance()
    assert harness.batches() == [["a"]]
    assert worker.busy
    harness.scheduler.instance_done(worker)
    harness.scheduler.instance_done(worker)
    assert harness.batches() == [["a"], ["b"], ["c"]]
    assert harness.queued() == []
    assert harness.loop.timers == []


def test_submit_stamps_the_arrival_time() -> None:
    harness = Harness()
    harness.loop.now_ns = 1234
    assert harness.submit("a").arrival_ns == 1234


def test_an_idle_instance_takes_a_request_at_once() -> None:
    harness = Harness()
    worker = harness.instance()
    harness.submit("a")
    assert harness.dispatched == [(["a"], worker)]
    assert worker.busy


# Batching without delay -----------------------------------------------------------------------------------------


def test_with_no_delay_everything_queued_goes_in_one_batch() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=0)
    for rid in "abc":
        harness.submit(rid)
    harness.instance()
    assert harness.batches() == [["a", "b", "c"]]
    assert harness.loop.timers == []


def test_batches_count_rows_not_requests() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=0)
    harness.submit("eight", rows=8)
    harness.submit("one")
    worker = harness.instance()
    assert harness.batches() == [["eight"]]
    harness.scheduler.instance_done(worker)
    assert harness.batches() == [["eight"], ["one"]]


def test_rows_over_max_batch_size_split_across_batches() -> None:
    harness = Harness(max_batch_size=4, max_queue_delay_microseconds=0)
    for rid, rows in [("a", 2), ("b", 1), ("c", 2), ("d", 1), ("e", 3)]:
        harness.submit(rid, rows)
    worker = harness.instance()
    harness.scheduler.instance_done(worker)
    harness.scheduler.instance_done(worker)
    # FIFO: 'd' would fit next to 'a' and 'b' but does not jump 'c'
    assert harness.batches() == [["a", "b"], ["c", "d"], ["e"]]


def test_requests_of_different_signatures_are_not_merged_and_stay_in_order() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=0)
    wide = ("x", "FP32", (16,))
    narrow = ("x", "FP32", (4,))
    harness.submit("w1", signature=wide)
    harness.submit("n1", signature=narrow)
    harness.submit("w2", signature=wide)
    harness.submit("n2", signature=narrow)
    harness.submit("n3", signature=narrow)
    worker = harness.instance()
    assert harness.batches() == [["w1", "w2"]]
    assert harness.queued() == ["n1", "n2", "n3"]
    harness.scheduler.instance_done(worker)
    assert harness.batches() == [["w1", "w2"], ["n1", "n2", "n3"]]


# Batching with a queue delay ------------------------------------------------------------------------------------


def test_a_partial_batch_waits_until_the_oldest_request_waited_the_delay() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=100)
    worker = harness.instance()
    harness.submit("a")
    assert harness.dispatched == []
    assert [t.delay_s for t in harness.loop.armed] == [pytest.approx(100e-6)]

    harness.loop.advance_us(40)
    harness.submit("b")
    assert harness.dispatched == []
    # still timed from the oldest request, not from the newest: the timer armed for 'a' stands
    assert harness.loop.due_us == [100]

    harness.loop.advance_us(60)
    harness.loop.fire()
    assert harness.dispatched == [(["a", "b"], worker)]
    assert harness.loop.armed == []


def test_a_timer_that_fires_early_waits_for_the_rest_of_the_delay() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=100)
    harness.instance()
    harness.submit("a")
    harness.loop.advance_us(99)
    harness.loop.fire()
    assert harness.dispatched == []
    assert [t.delay_s for t in harness.loop.armed] == [pytest.approx(1e-6)]
    harness.loop.advance_us(1)
    harness.loop.fire()
    assert harness.batches() == [["a"]]


def test_a_full_batch_goes_without_waiting() -> None:
    harness = Harness(max_batch_size=4, max_queue_delay_microseconds=100)
    harness.instance()
    harness.submit("a", rows=3)
    assert len(harness.loop.armed) == 1
    harness.submit("b", rows=1)
    assert harness.batches() == [["a", "b"]]
    assert harness.loop.armed == []  # the pending timer was cancelled


def test_a_preferred_batch_size_goes_without_waiting() -> None:
    harness = Harness(max_batch_size=16, max_queue_delay_microseconds=1000, preferred_batch_size=(2, 8))
    harness.instance()
    harness.submit("a")
    assert harness.dispatched == []
    harness.submit("b")
    assert harness.batches() == [["a", "b"]]
    assert harness.loop.armed == []


def test_a_request_that_does_not_fit_sends_the_batch_at_once() -> None:
    harness = Harness(max_batch_size=4, max_queue_delay_microseconds=100)
    worker = harness.instance()
    harness.submit("a", rows=3)
    harness.submit("b", rows=2)  # would overflow: 'a' goes alone, no point waiting
    assert harness.batches() == [["a"]]
    harness.scheduler.instance_done(worker)
    assert harness.batches() == [["a"]]  # 'b' waits for its own delay
    assert [t.delay_s for t in harness.loop.armed] == [pytest.approx(100e-6)]


def test_more_queued_than_fits_is_trimmed_to_a_preferred_size() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=100, preferred_batch_size=(4,))
    for rid, rows in [("a", 3), ("b", 1), ("c", 2), ("d", 3)]:
        harness.submit(rid, rows)
    worker = harness.instance()
    # a+b+c is 6 rows and d does not fit: send the preferred 4 rows (a+b), not 6
    assert harness.batches() == [["a", "b"]]
    assert harness.queued() == ["c", "d"]
    harness.loop.advance_us(100)
    harness.scheduler.instance_done(worker)
    assert harness.batches() == [["a", "b"], ["c", "d"]]


def test_trimming_keeps_everything_when_no_preferred_size_is_reached() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=100, preferred_batch_size=(4,))
    for rid, rows in [("a", 3), ("b", 2), ("c", 2), ("d", 3)]:
        harness.submit(rid, rows)
    harness.instance()
    assert harness.batches() == [["a", "b", "c"]]


def test_queued_requests_past_their_delay_go_when_an_instance_frees_up() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=100)
    busy = harness.instance()
    harness.submit("a", rows=8)
    harness.submit("b")
    assert harness.loop.armed == []  # no idle instance: nothing to time yet
    harness.loop.advance_us(500)
    harness.scheduler.instance_done(busy)
    assert harness.batches() == [["a"], ["b"]]


# Cancelled requests ---------------------------------------------------------------------------------------------


def test_cancelled_requests_are_skipped_without_batching() -> None:
    harness = Harness()
    harness.submit("a").cancelled = True
    harness.submit("b")
    harness.instance()
    assert harness.batches() == [["b"]]
    assert harness.queued() == []


def test_cancelled_requests_are_left_out_of_batches() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=0)
    harness.submit("a")
    harness.submit("b").cancelled = True
    harness.submit("c")
    harness.submit("d", signature=("other",))
    harness.instance()
    assert harness.batches() == [["a", "c"]]
    assert harness.queued() == ["d"]


def test_a_cancelled_oldest_request_does_not_hold_the_delay() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=100)
    harness.instance()
    first = harness.submit("a")
    harness.loop.advance_us(50)
    harness.submit("b")
    first.cancelled = True
    harness.loop.advance_us(50)
    harness.loop.fire()
    assert harness.dispatched == []  # 'b' has waited 50 us of its 100
    assert [t.delay_s for t in harness.loop.armed] == [pytest.approx(50e-6)]


def test_a_timer_with_only_cancelled_requests_left_dispatches_nothing() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=100)
    harness.instance()
    harness.submit("a").cancelled = True
    harness.loop.advance_us(100)
    harness.loop.fire()
    assert harness.dispatched == []
    assert harness.queued() == []


# Instances ------------------------------------------------------------------------------------------------------


def test_two_instances_take_two_due_batches() -> None:
    harness = Harness(max_batch_size=2, max_queue_delay_microseconds=100)
    first = harness.instance(0)
    second = harness.instance(1)
    for rid in "abcd":
        harness.submit(rid)
    assert harness.dispatched == [(["a", "b"], first), (["c", "d"], second)]
    assert first.busy
    assert second.busy


def test_a_request_of_another_signature_sends_the_waiting_batch_at_once() -> None:
    harness = Harness(max_batch_size=4, max_queue_delay_microseconds=100)
    first = harness.instance(0)
    second = harness.instance(1)
    harness.submit("a", signature=("x", "FP32", (2,)))
    assert harness.dispatched == []
    harness.submit("b", signature=("x", "FP32", (3,)))  # can never join 'a': no point holding 'a' back
    assert harness.dispatched == [(["a"], first)]
    assert [t.delay_s for t in harness.loop.armed] == [pytest.approx(100e-6)]
    harness.loop.advance_us(100)
    harness.loop.fire()
    assert harness.dispatched == [(["a"], first), (["b"], second)]


def test_a_full_batch_is_not_held_up_behind_a_partial_one() -> None:
    harness = Harness(max_batch_size=2, max_queue_delay_microseconds=100)
    first = harness.instance(0)
    second = harness.instance(1)
    harness.submit("narrow", signature=("x", "FP32", (2,)))
    harness.submit("w1", signature=("x", "FP32", (3,)))
    harness.submit("w2", signature=("x", "FP32", (3,)))
    assert harness.dispatched == [(["narrow"], first), (["w1", "w2"], second)]


def test_instance_done_makes_it_idle_and_dispatches_queued_work() -> None:
    harness = Harness(max_batch_size=4, max_queue_delay_microseconds=0)
    worker = harness.instance()
    harness.submit("a")
    harness.submit("b")
    harness.submit("c")
    assert harness.batches() == [["a"]]
    harness.scheduler.instance_done(worker)
    assert harness.batches() == [["a"], ["b", "c"]]
    assert worker.busy
    harness.scheduler.instance_done(worker)
    assert not worker.busy
    assert harness.scheduler.stats_snapshot() == {"queued": 0, "idle_instances": 1}


def test_a_removed_instance_gets_no_more_work() -> None:
    harness = Harness()
    first = harness.instance(0)
    second = harness.instance(1)
    harness.scheduler.remove_instance(first)
    harness.submit("a")
    harness.submit("b")
    assert harness.dispatched == [(["a"], second)]
    assert harness.queued() == ["b"]
    harness.scheduler.remove_instance(second)  # busy: only forgotten, nothing to undo
    assert harness.scheduler.stats_snapshot() == {"queued": 1, "idle_instances": 0}


def test_drain_returns_the_queue_and_cancels_the_timer() -> None:
    harness = Harness(max_batch_size=8, max_queue_delay_microseconds=100)
    harness.instance()
    a = harness.submit("a")
    b = harness.submit("b")
    (timer,) = harness.loop.armed
    assert harness.scheduler.drain() == [a, b]
    assert timer.cancelled
    assert harness.queued() == []
    assert harness.scheduler.drain() == []


def test_queued_count_counts_every_level() -> None:
    harness = Harness(max_batch_size=8, priority_levels=2, default_priority_level=2)
    harness.submit("a", priority=1)
    harness.submit("b")
    harness.submit("c", priority=2)
    assert harness.scheduler.queued_count() == 3
    assert harness.queued() == ["a", "b", "c"]


# Priorities -----------------------------------------------------------------------------------------------------


def prioritized(**batcher_args: Any) -> Harness:
    """One row per batch, so the dispatch order is the scheduling order; three levels, 2 the default."""
    args: dict[str, Any] = {"priority_levels": 3, "default_priority_level": 2, **batcher_args}
    return Harness(max_batch_size=1, **args)


def test_higher_priority_requests_go_first() -> None:
    harness = prioritized()
    worker = harness.instance()
    harness.submit("busy")
    harness.submit("low", priority=3)
    harness.submit("default")
    harness.submit("high", priority=1)
    harness.submit("high2", priority=1)
    for _ in range(4):
        harness.scheduler.instance_done(worker)
    assert harness.batches() == [["busy"], ["high"], ["high2"], ["default"], ["low"]]


def test_priority_zero_or_absent_uses_the_default_level() -> None:
    harness = prioritized()
    harness.submit("absent")
    harness.submit("zero", priority=0)
    harness.submit("level2", priority=2)
    harness.submit("level1", priority=1)
    assert harness.queued() == ["level1", "absent", "zero", "level2"]


@pytest.mark.parametrize("priority", [4, -1, "1", 1.0, True, None])
def test_a_priority_outside_the_levels_is_refused(priority: Any) -> None:
    harness = prioritized()
    with pytest.raises(
        InvalidInputError, match=rf"priority {re.escape(repr(priority))} is out of range: expected 1\.\.3"
    ):
        harness.submit("a", priority=priority)
    assert harness.queued() == []


@pytest.mark.parametrize(
    ("max_batch_size", "batcher"), [(8, DynamicBatcher()), (0, DynamicBatcher()), (8, None)], ids=str
)
def test_priority_is_not_looked_at_without_priority_levels_or_batching(
    max_batch_size: int, batcher: DynamicBatcher | None
) -> None:
    harness = Harness(max_batch_size=max_batch_size, batcher=batcher)
    harness.submit("a", priority=7)
    harness.submit("b", priority="urgent")
    assert harness.queued() == ["a", "b"]


def test_strict_priority_a_lower_level_waits_while_a_higher_one_has_requests() -> None:
    harness = prioritized()
    worker = harness.instance()
    harness.submit("busy")
    harness.submit("low", priority=3)
    for rid in ("h1", "h2", "h3"):
        harness.submit(rid, priority=1)
        harness.scheduler.instance_done(worker)
    assert harness.batches() == [["busy"], ["h1"], ["h2"], ["h3"]]
    harness.scheduler.instance_done(worker)
    assert harness.batches()[-1] == ["low"]


def test_a_batch_is_filled_from_lower_levels_in_priority_order() -> None:
    harness = Harness(max_batch_size=4, priority_levels=3, default_priority_level=3)
    worker = harness.instance()
    harness.submit("busy", rows=4)
    narrow = ("x", "FP32", (2,))
    harness.submit("l3", priority=3)
    harness.submit("l2-narrow", priority=2, signature=narrow)
    harness.submit("l2", priority=2)
    harness.submit("l1", priority=1)
    harness.submit("l3b", priority=3)
    harness.submit("l3c", priority=3)
    harness.scheduler.instance_done(worker)
    # led by level 1, then level 2 and level 3 in arrival order; the narrow request cannot join
    assert harness.batches()[-1] == ["l1", "l2", "l3", "l3b"]
    assert harness.queued() == ["l2-narrow", "l3c"]
    harness.scheduler.instance_done(worker)
    assert harness.batches()[-1] == ["l2-narrow"]


def test_rows_that_do_not_fit_stop_the_filling_at_the_first_level_that_overflows() -> None:
    harness = Harness(max_batch_size=4, priority_levels=2, default_priority_level=2)
    worker = harness.instance()
    harness.submit("busy", rows=4)
    harness.submit("low-big", rows=3, priority=2)
    harness.submit("low-small", priority=2)
    harness.submit("high", rows=2, priority=1)
    harness.scheduler.instance_done(worker)
    # 'low-small' would fit but does not jump 'low-big', which arrived before it at its level
    assert harness.batches()[-1] == ["high"]


def test_a_partial_high_priority_batch_does_not_wait_while_another_signature_is_queued_below() -> None:
    harness = Harness(max_batch_size=4, max_queue_delay_microseconds=100, priority_levels=2, default_priority_level=2)
    first = harness.instance(0)
    second = harness.instance(1)
    harness.submit("high", priority=1, signature=("x", "FP32", (2,)))
    assert harness.dispatched == []
    harness.submit("low", priority=2, signature=("x", "FP32", (3,)))
    assert harness.dispatched == [(["high"], first)]
    harness.loop.advance_us(100)
    harness.loop.fire()
    assert harness.dispatched == [(["high"], first), (["low"], second)]


def test_the_delay_runs_from_the_oldest_request_of_the_batch_whatever_its_level() -> None:
    harness = Harness(max_batch_size=4, max_queue_delay_microseconds=100, priority_levels=2, default_priority_level=2)
    harness.instance()
    harness.submit("low")
    harness.loop.advance_us(60)
    harness.submit("high", priority=1)
    assert harness.loop.due_us == [100]
    harness.loop.advance_us(40)
    harness.loop.fire()
    assert harness.batches() == [["high", "low"]]


# Queue policies: max_queue_size -------------------------------------------------------------------------------


def test_a_full_level_refuses_requests_and_other_levels_still_take_them() -> None:
    harness = prioritized(
        default_queue_policy=QueuePolicy(max_queue_size=2), priority_queue_policy={1: QueuePolicy(max_queue_size=1)}
    )
    harness.submit("h1", priority=1)
    with pytest.raises(QueueFullError, match=r"exceeds maximum queue size 1 at priority level 1"):
        harness.submit("h2", priority=1)
    harness.submit("d1")
    harness.submit("d2")
    with pytest.raises(QueueFullError, match=r"exceeds maximum queue size 2 at priority level 2"):
        harness.submit("d3")
    harness.submit("l1", priority=3)  # level 3 has the default policy, and a queue of its own
    assert harness.queued() == ["h1", "d1", "d2", "l1"]
    worker = harness.instance()
    harness.scheduler.instance_done(worker)
    assert harness.batches() == [["h1"], ["d1"]]
    harness.submit("h2", priority=1)  # room again
    harness.submit("d3")


def test_max_queue_size_without_priority_levels() -> None:
    harness = Harness(max_batch_size=4, default_queue_policy=QueuePolicy(max_queue_size=1))
    harness.submit("a")
    with pytest.raises(QueueFullError, match=r"^model 'm' version 1: request exceeds maximum queue size 1$"):
        harness.submit("b")


def test_cancelled_requests_leave_room_in_a_full_queue() -> None:
    harness = Harness(max_batch_size=4, default_queue_policy=QueuePolicy(max_queue_size=2))
    first = harness.submit("a")
    harness.submit("b").cancelled = True  # cancelled by flag: dropped when room is needed
    assert harness.scheduler.cancel(first)
    harness.submit("c")
    harness.submit("d")
    assert harness.queued() == ["c", "d"]


# Queue policies: timeouts -------------------------------------------------------------------------------------


def test_a_request_is_rejected_once_it_waited_its_timeout_exactly() -> None:
    harness = Harness(max_batch_size=4, default_queue_policy=QueuePolicy(default_timeout_microseconds=100))
    request = harness.submit("a")
    assert harness.loop.due_us == [100]  # armed although no instance is there to time a batch
    harness.loop.now_ns = 100 * US - 1
    harness.loop.fire()  # a timer firing a nanosecond early rejects nothing and re-arms
    assert harness.answers == []
    assert harness.queued() == ["a"]
    assert [t.delay_s for t in harness.loop.armed] == [pytest.approx(1e-9)]
    harness.loop.now_ns = 100 * US
    harness.loop.fire()
    assert harness.errors() == [("a", "Request timeout expired")]
    ((_, response),) = harness.answers
    assert isinstance(response.error, RequestTimeoutError)
    assert response.final
    assert request.done
    assert harness.queued() == []
    assert harness.loop.armed == []


def test_an_expired_request_is_rejected_when_a_batch_is_formed_before_its_timer_fires() -> None:
    harness = Harness(max_batch_size=1, default_queue_policy=QueuePolicy(default_timeout_microseconds=100))
    worker = harness.instance()
    harness.submit("busy")
    harness.submit("a")
    harness.loop.advance_us(50)
    harness.submit("b")
    harness.loop.advance_us(50)
    harness.scheduler.instance_done(worker)  # 'a' waited 100 us: rejected; 'b' runs
    assert harness.batches() == [["busy"], ["b"]]
    assert harness.errors() == [("a", "Request timeout expired")]


def test_one_timer_is_armed_for_the_earliest_deadline() -> None:
    policy = QueuePolicy(default_timeout_microseconds=1000, allow_timeout_override=True)
    harness = Harness(max_batch_size=4, default_queue_policy=policy)
    harness.submit("a", timeout=500)
    harness.submit("b", timeout=200)
    harness.submit("c")  # the default 1000 us
    assert harness.loop.due_us == [200]
    harness.loop.advance_us(200)
    harness.loop.fire()
    assert harness.errors() == [("b", "Request timeout expired")]
    assert harness.loop.due_us == [500]
    harness.loop.advance_us(300)
    harness.loop.fire()
    assert harness.loop.due_us == [1000]
    harness.loop.advance_us(500)
    harness.loop.fire()
    assert [rid for rid, _ in harness.errors()] == ["b", "a", "c"]
    assert harness.loop.armed == []


def test_the_timer_covers_both_the_batch_delay_and_the_first_deadline() -> None:
    policy = QueuePolicy(default_timeout_microseconds=50)
    harness = Harness(max_batch_size=4, max_queue_delay_microseconds=100, default_queue_policy=policy)
    harness.instance()
    harness.submit("a")
    assert harness.loop.due_us == [50]  # the timeout comes before the batch delay
    harness.loop.advance_us(50)
    harness.loop.fire()
    assert harness.errors() == [("a", "Request timeout expired")]
    assert harness.dispatched == []
    assert harness.loop.armed == []


def test_a_request_dispatched_in_time_is_not_rejected_later() -> None:
    harness = Harness(max_batch_size=4, default_queue_policy=QueuePolicy(default_timeout_microseconds=100))
    harness.submit("a")
    harness.instance()
    assert harness.batches() == [["a"]]
    assert harness.loop.armed == []
    harness.loop.advance_us(500)
    harness.scheduler.schedule()
    assert harness.answers == []


@pytest.mark.parametrize(
    ("default_us", "requested_us", "expected_us"),
    [(0, 300, 300), (1000, 300, 300), (200, 300, 200), (200, 0, 200), (0, 0, None)],
    ids=["no-default", "shorter", "longer-ignored", "zero-keeps-default", "none"],
)
def test_a_request_timeout_may_shorten_the_default_when_overriding_is_allowed(
    default_us: int, requested_us: int, expected_us: int | None
) -> None:
    policy = QueuePolicy(default_timeout_microseconds=default_us, allow_timeout_override=True)
    harness = Harness(max_batch_size=4, default_queue_policy=policy)
    harness.submit("a", timeout=requested_us)
    assert harness.loop.due_us == ([] if expected_us is None else [expected_us])


def test_a_request_timeout_is_ignored_unless_overriding_is_allowed() -> None:
    harness = Harness(max_batch_size=4, default_queue_policy=QueuePolicy(default_timeout_microseconds=1000))
    harness.submit("a", timeout=10)
    harness.submit("b", timeout="soon")  # not even looked at
    assert harness.loop.due_us == [1000]
    plain = Harness(max_batch_size=4)
    plain.submit("a", timeout=10)
    plain.loop.advance_us(1_000_000)
    plain.instance()
    assert plain.batches() == [["a"]]
    assert plain.answers == []


@pytest.mark.parametrize("timeout", [-1, "100", 1.5, True])
def test_an_invalid_request_timeout_is_refused_when_overriding_is_allowed(timeout: Any) -> None:
    harness = Harness(max_batch_size=4, default_queue_policy=QueuePolicy(allow_timeout_override=True))
    with pytest.raises(InvalidInputError, match=rf"timeout {re.escape(repr(timeout))} must be a whole number"):
        harness.submit("a", timeout=timeout)
    assert harness.queued() == []


@pytest.mark.parametrize("max_batch_size", [0, 8], ids=["no-batch-dimension", "batcher-off"])
def test_without_dynamic_batching_the_queue_is_plain_fifo(max_batch_size: int) -> None:
    # (Queue policies on a max_batch_size=0 model are refused by ModelConfig; see test_config.)
    harness = Harness(max_batch_size=max_batch_size, batcher=None)
    harness.submit("a", timeout=1)
    harness.submit("b")
    harness.loop.advance_us(100)
    assert harness.loop.armed == []
    harness.instance()
    assert harness.batches() == [["a"]]
    assert harness.answers == []


def test_requests_that_expire_under_delay_go_behind_the_others_of_their_level() -> None:
    delay = QueuePolicy(TimeoutAction.DELAY, default_timeout_microseconds=100)
    harness = prioritized(priority_queue_policy={2: delay})
    worker = harness.instance()
    harness.submit("busy")
    harness.submit("a")
    harness.loop.advance_us(50)
    harness.submit("b")
    harness.submit("low", priority=3)
    assert harness.loop.armed == []  # delaying needs no timer: it is applied when the next batch is formed
    harness.loop.advance_us(60)  # 'a' expired (110 us), 'b' has not (60 us)
    for _ in range(3):
        harness.scheduler.instance_done(worker)
    # 'a' goes behind 'b', but still before the lower level; it is never rejected
    assert harness.batches() == [["busy"], ["b"], ["a"], ["low"]]
    assert harness.answers == []


def test_delayed_requests_still_join_batches_and_count_against_the_queue_size() -> None:
    delay = QueuePolicy(TimeoutAction.DELAY, default_timeout_microseconds=100, max_queue_size=2)
    harness = Harness(max_batch_size=4, default_queue_policy=delay)
    harness.submit("a")
    harness.loop.advance_us(100)
    harness.submit("b")
    assert harness.queued() == ["b", "a"]
    with pytest.raises(QueueFullError):
        harness.submit("c")
    harness.instance()
    assert harness.batches() == [["b", "a"]]


def test_a_custom_reject_callback_gets_the_request_and_the_error() -> None:
    rejected: list[tuple[str, InferenceError]] = []
    harness = Harness(
        max_batch_size=4,
        default_queue_policy=QueuePolicy(default_timeout_microseconds=10),
        reject=lambda request, error: rejected.append((request.id, error)),
    )
    request = harness.submit("a")
    harness.loop.advance_us(10)
    harness.loop.fire()
    ((rid, error),) = rejected
    assert rid == "a"
    assert isinstance(error, RequestTimeoutError)
    assert not request.done  # marking it answered is the callback's business
    assert harness.answers == []


# Cancellation ---------------------------------------------------------------------------------------------------


def test_cancel_takes_a_queued_request_out_at_once() -> None:
    harness = prioritized()
    a = harness.submit("a", priority=1)
    b = harness.submit("b")
    assert harness.scheduler.cancel(b)
    assert b.cancelled
    assert harness.queued() == ["a"]
    assert harness.scheduler.queued_count() == 1
    assert not harness.scheduler.cancel(b)  # no longer queued
    worker = harness.instance()
    assert harness.batches() == [["a"]]
    assert not harness.scheduler.cancel(a)  # running: its instance answers it
    harness.scheduler.instance_done(worker)
    assert harness.batches() == [["a"]]


def test_a_cancelled_request_is_never_rejected_for_its_timeout() -> None:
    harness = Harness(max_batch_size=4, default_queue_policy=QueuePolicy(default_timeout_microseconds=100))
    request = harness.submit("a")
    assert harness.scheduler.cancel(request)
    harness.loop.advance_us(100)
    for timer in harness.loop.armed:
        timer.fired = True
        timer.callback()
    assert harness.answers == []
    assert harness.loop.armed == []


def test_cancel_finds_delayed_requests() -> None:
    delay = QueuePolicy(TimeoutAction.DELAY, default_timeout_microseconds=10)
    harness = Harness(max_batch_size=4, default_queue_policy=delay)
    request = harness.submit("a")
    harness.loop.advance_us(10)
    harness.submit("b")  # applies the delay to 'a'
    assert harness.queued() == ["b", "a"]
    assert harness.scheduler.cancel(request)
    assert harness.queued() == ["b"]


# Response ordering ----------------------------------------------------------------------------------------------


def test_responses_are_released_in_arrival_order_across_instances() -> None:
    harness = Harness(max_batch_size=1, preserve_ordering=True, ordered=True)
    harness.instance(0)
    harness.instance(1)
    harness.submit("a")
    harness.submit("b")
    harness.respond("b")  # the second instance finished first: held
    assert harness.answers == []
    harness.respond("a")
    assert [rid for rid, _ in harness.answers] == ["a", "b"]
    assert harness.orderer is not None and len(harness.orderer) == 0


def test_partial_responses_of_a_decoupled_model_are_held_in_order_too() -> None:
    harness = Harness(max_batch_size=1, ordered=True)
    for index in range(2):
        harness.instance(index)
    harness.submit("a")
    harness.submit("b")
    harness.respond("b", final=False)
    harness.respond("b", final=False)
    harness.respond("a", final=False)  # first in line: goes at once
    assert [(rid, r.final) for rid, r in harness.answers] == [("a", False)]
    harness.respond("a")
    harness.respond("b")
    assert [(rid, r.final) for rid, r in harness.answers] == [
        ("a", False),
        ("a", True),
        ("b", False),
        ("b", False),
        ("b", True),
    ]


def test_a_request_first_in_line_streams_its_responses_straight_through() -> None:
    harness = Harness(max_batch_size=1, ordered=True)
    for index in range(2):
        harness.instance(index)
    harness.submit("a")
    harness.submit("b")
    harness.respond("a")
    harness.respond("b", final=False)
    assert [(rid, r.final) for rid, r in harness.answers] == [("a", True), ("b", False)]


def test_errors_are_ordered_like_any_response() -> None:
    harness = Harness(max_batch_size=1, ordered=True)
    for index in range(3):
        harness.instance(index)
    for rid in "abc":
        harness.submit(rid)
    harness.respond("c", error=ModelExecutionError("boom"))
    harness.respond("b")
    assert harness.answers == []
    harness.respond("a", error=ModelExecutionError("bang"))
    assert [(rid, str(r.error) if r.error else None) for rid, r in harness.answers] == [
        ("a", "bang"),
        ("b", None),
        ("c", "boom"),
    ]


def test_a_timeout_rejection_waits_for_the_requests_before_it() -> None:
    harness = Harness(
        max_batch_size=1, ordered=True, default_queue_policy=QueuePolicy(default_timeout_microseconds=100)
    )
    harness.instance()
    harness.submit("a")
    harness.submit("b")
    harness.loop.advance_us(100)
    harness.loop.fire()
    assert harness.answers == []  # 'b' was rejected but 'a' is still running
    harness.respond("a")
    assert [(rid, str(r.error) if r.error else None) for rid, r in harness.answers] == [
        ("a", None),
        ("b", "Request timeout expired"),
    ]


def test_a_cancelled_queued_request_does_not_hold_back_later_ones() -> None:
    harness = Harness(max_batch_size=1, ordered=True)
    first = harness.instance(0)
    harness.submit("a")
    b = harness.submit("b")
    harness.submit("c")
    harness.submit("d").cancelled = True  # cancelled by flag: dropped when met
    assert harness.scheduler.cancel(b)
    harness.respond("a")
    harness.scheduler.instance_done(first)
    harness.respond("c")
    harness.scheduler.instance_done(first)
    assert [rid for rid, _ in harness.answers] == ["a", "c"]
    assert harness.orderer is not None and len(harness.orderer) == 0


def test_held_outputs_are_copied_since_their_buffers_are_reused() -> None:
    sent: list[tuple[str, InferenceResponse]] = []
    orderer = ResponseOrderer(lambda request, response: sent.append((request.id, response)))
    harness = Harness()
    first, second = harness.request("a"), harness.request("b")
    orderer.register(first)
    orderer.register(second)
    buffer = bytearray(b"\x01\x02")
    orderer.deliver(second, InferenceResponse([OutputTensor("y", "UINT8", [2], memoryview(buffer))]))
    buffer[:] = b"\x09\x09"  # the shared-memory slot is reused once deliver returned
    orderer.deliver(first, InferenceResponse([]))
    assert [rid for rid, _ in sent] == ["a", "b"]
    assert bytes(sent[1][1].outputs[0].buffer) == b"\x01\x02"


def test_unregistered_requests_pass_straight_through() -> None:
    sent: list[str] = []
    orderer = ResponseOrderer(lambda request, response: sent.append(request.id))
    harness = Harness()
    orderer.register(harness.request("a"))
    orderer.deliver(harness.request("x"), InferenceResponse([]))
    assert sent == ["x"]


def test_a_failing_send_does_not_hold_back_later_responses(caplog: pytest.LogCaptureFixture) -> None:
    sent: list[str] = []

    def send(request: InferenceRequest, response: InferenceResponse) -> None:
        if request.id == "a":
            raise RuntimeError("client gone")
        sent.append(request.id)

    orderer = ResponseOrderer(send)
    harness = Harness()
    a, b = harness.request("a"), harness.request("b")
    orderer.register(a)
    orderer.register(b)
    orderer.deliver(b, InferenceResponse([]))
    with caplog.at_level(logging.ERROR, logger="pyserve.core.response_orderer"):
        orderer.deliver(a, InferenceResponse([]))
    assert sent == ["b"]
    assert "sending a response of request 'a' failed" in caplog.text
