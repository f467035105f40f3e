"""Tests of pyserve.core.scheduler: FIFO dispatch, the dynamic batcher and instances, on a fake clock.

The scheduler takes its clock and timer factory as arguments; here the clock is a number the test moves and
timers are recorded so the test fires them, the way Trio's mock clock drives time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from pyserve.config import DynamicBatcher, ModelConfig, ModelSpec, Tensor
from pyserve.core.inference import InferenceRequest
from pyserve.core.registry import Instance, ModelEntry
from pyserve.core.scheduler import ModelScheduler

US = 1000  # nanoseconds per microsecond


@dataclass
class FakeTimer:
    """A timer the test fires by hand."""

    delay_s: float
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
        timer = FakeTimer(delay_s, callback)
        self.timers.append(timer)
        return timer

    @property
    def armed(self) -> list[FakeTimer]:
        """Timers neither cancelled nor fired."""
        return [t for t in self.timers if not t.cancelled and not t.fired]

    def advance_us(self, microseconds: int) -> None:
        self.now_ns += microseconds * US

    def fire(self) -> None:
        """Run the one armed timer (as the event loop would once its delay passed)."""
        (timer,) = self.armed
        timer.fired = True
        timer.callback()


class Harness:
    """A scheduler for one model, the dispatches it made, and its instances."""

    def __init__(self, max_batch_size: int = 0, batcher: DynamicBatcher | None = None, **batcher_args: Any) -> None:
        if batcher is None and batcher_args:
            batcher = DynamicBatcher(**batcher_args)
        config = ModelConfig(max_batch_size=max_batch_size, batcher=batcher)
        spec = ModelSpec("m", 1, (Tensor("x", np.float32),), (Tensor("y", np.float32),), config)
        self.entry = ModelEntry(spec)
        self.loop = FakeLoop()
        self.dispatched: list[tuple[list[str], Instance]] = []
        self.scheduler = ModelScheduler(self.entry, self._dispatch, self.loop.call_later, self.loop.clock)
        self.entry.scheduler = self.scheduler
        self._count = 0

    def _dispatch(self, batch: list[InferenceRequest], instance: Instance) -> None:
        self.dispatched.append(([r.id for r in batch], instance))

    def instance(self, index: int = 0) -> Instance:
        """Connect an instance (idle at once)."""
        worker = Instance(identity=f"i{index}".encode(), index=index, kind="thread", pid=1000 + index)
        self.entry.instances.append(worker)
        self.scheduler.add_instance(worker)
        return worker

    def request(self, rid: str, rows: int = 1, signature: tuple[Any, ...] = ("x", "FP32", ())) -> InferenceRequest:
        """A validated request of ``rows`` rows."""
        return InferenceRequest(
            model=self.entry,
            id=rid,
            inputs={},
            parameters={},
            requested_outputs=[],
            rows=rows,
            on_response=lambda request, response: None,
            signature=signature,
        )

    def submit(self, rid: str, rows: int = 1, signature: tuple[Any, ...] = ("x", "FP32", ())) -> InferenceRequest:
        request = self.request(rid, rows, signature)
        self.scheduler.submit(request)
        return request

    def batches(self) -> list[list[str]]:
        """The request ids of each dispatched batch, in order."""
        return [ids for ids, _ in self.dispatched]

    def queued(self) -> list[str]:
        return [r.id for r in self.scheduler.queue]


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
    # still timed from the oldest request, not from the newest
    assert [t.delay_s for t in harness.loop.armed] == [pytest.approx(60e-6)]

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
