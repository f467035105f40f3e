"""Tests of pyserve.core.sequence_batcher: sequences, slots and the backlog, both strategies, idle release, lost
instances and Triton's errors, on a fake clock (the same way tests/unit/test_scheduler.py drives the dynamic
batcher)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from pyserve.config import ModelConfig, ModelSpec, SequenceBatcher, SequenceControl, Tensor
from pyserve.core.inference import InferenceRequest, InferenceResponse, Instance, ModelEntry
from pyserve.core.response_orderer import ResponseOrderer
from pyserve.core.sequence_batcher import SequenceScheduler
from pyserve.errors import InvalidInputError, QueueFullError, WorkerDiedError

US = 1000  # nanoseconds per microsecond


@dataclass
class FakeTimer:
    due_ns: int
    callback: Callable[[], None]
    cancelled: bool = False
    fired: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeLoop:
    now_ns: int = 0
    timers: list[FakeTimer] = field(default_factory=list)

    def clock(self) -> int:
        return self.now_ns

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.now_ns + round(delay_s * 1e9), callback)
        self.timers.append(timer)
        return timer

    @property
    def armed(self) -> list[FakeTimer]:
        return [t for t in self.timers if not t.cancelled and not t.fired]

    def advance_us(self, microseconds: int) -> None:
        """Move the clock and fire the timers that came due (as the event loop would)."""
        self.now_ns += microseconds * US
        while True:
            due = [t for t in self.armed if t.due_ns <= self.now_ns]
            if not due:
                return
            due[0].fired = True
            due[0].callback()


class Harness:
    """A sequence scheduler for one model, what it dispatched and what reached the clients."""

    def __init__(self, max_batch_size: int = 4, ordered: bool = False, **settings: Any) -> None:
        config = ModelConfig(max_batch_size=max_batch_size, sequence_batcher=SequenceBatcher(**settings))
        spec = ModelSpec("acc", 1, (Tensor("INPUT", np.int32, (1,)),), (Tensor("OUTPUT", np.int32, (1,)),), config)
        self.entry = ModelEntry(spec)
        self.loop = FakeLoop()
        self.dispatched: list[tuple[list[str], Instance]] = []
        self.sent: list[InferenceRequest] = []
        self.answers: list[tuple[str, InferenceResponse]] = []
        orderer = ResponseOrderer(self._answer) if ordered else None
        self.scheduler = SequenceScheduler(
            self.entry, self._dispatch, self.loop.call_later, self.loop.clock, orderer=orderer
        )
        self.entry.scheduler = self.scheduler
        self.workers: list[Instance] = []

    def _dispatch(self, batch: list[InferenceRequest], instance: Instance) -> None:
        self.dispatched.append(([r.id for r in batch], instance))
        self.sent.extend(batch)

    def _answer(self, request: InferenceRequest, response: InferenceResponse) -> None:
        self.answers.append((request.id, response))

    def instance(self) -> Instance:
        worker = Instance(identity=f"i{len(self.workers)}".encode(), index=len(self.workers), kind="thread", pid=1)
        self.workers.append(worker)
        self.entry.instances.append(worker)
        self.scheduler.add_instance(worker)
        return worker

    def request(self, rid: str, rows: int = 1, signature: tuple[Any, ...] = ("s",), **parameters: Any) -> Any:
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

    def step(self, rid: str, sequence_id: Any, start: bool = False, end: bool = False, **more: Any) -> Any:
        """Submit one request of a sequence."""
        request = self.request(rid, sequence_id=sequence_id, sequence_start=start, sequence_end=end, **more)
        self.scheduler.submit(request)
        return request

    def done(self, worker: Instance | None = None) -> None:
        self.scheduler.instance_done(worker or self.workers[0])

    def batches(self) -> list[list[str]]:
        return [ids for ids, _ in self.dispatched]

    def errors(self) -> list[tuple[str, str]]:
        return [(rid, str(response.error)) for rid, response in self.answers if response.error is not None]


# the request's sequence parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({}, "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": 0}, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": ""}, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": True}, "sequence_id must be an integer or a string, got True"),
        ({"sequence_id": 1.5}, "sequence_id must be an integer or a string, got 1.5"),
        ({"sequence_id": -3}, "sequence_id -3 is out of range"),
        ({"sequence_id": 2**64}, "out of range"),
        ({"sequence_id": "x" * 129}, "longer than 128 bytes"),
        ({"sequence_id": 5, "sequence_start": 1}, "sequence_start must be a boolean, got 1"),
        ({"sequence_id": 5, "sequence_end": "yes"}, "sequence_end must be a boolean"),
    ],
)
def test_a_request_without_a_valid_correlation_id_is_refused(parameters: dict[str, Any], message: str) -> None:
    harness = Harness()
    harness.instance()
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(")):
        harness.scheduler.submit(harness.request("a", **parameters))
    assert harness.dispatched == []


def test_a_request_of_more_than_one_row_is_refused_as_triton_does() -> None:
    harness = Harness()
    harness.instance()
    with pytest.raises(InvalidInputError, match="must specify batch-size 1 due to requirements of sequence batcher"):
        harness.scheduler.submit(harness.request("a", rows=2, sequence_id=1, sequence_start=True))


def test_a_sequence_must_begin_with_start() -> None:
    harness = Harness()
    harness.instance()
    with pytest.raises(InvalidInputError) as caught:
        harness.step("a", 1000)
    assert str(caught.value) == (
        "inference request for sequence 1000 to model 'acc' must specify the START flag on the first request of the "
        "sequence"
    )
    # After its END, a sequence is unknown again.
    harness.step("b", 7, start=True, end=True)
    with pytest.raises(InvalidInputError, match=r"sequence 7 .* must specify the START flag"):
        harness.step("c", 7)


def test_a_numeric_corrid_control_refuses_string_ids() -> None:
    harness = Harness(control_inputs=(SequenceControl("CORRID", "CORRID", np.int32),))
    harness.instance()
    with pytest.raises(InvalidInputError, match=r"takes integer correlation IDs .*INT32.*'abc'"):
        harness.step("a", "abc", start=True)
    with pytest.raises(InvalidInputError, match="does not fit the model's CORRID control"):
        harness.step("b", 2**40, start=True)
    harness.step("c", 2**31 - 1, start=True)
    assert harness.batches() == [["c"]]


# direct: one slot per sequence -------------------------------------------------------------------------------------


def test_requests_carry_their_correlation_id_flags_and_slot() -> None:
    harness = Harness()
    harness.instance()
    first = harness.step("a", 1000, start=True)
    assert first.sequence == [1000, 1, 0]
    assert first.arrival_ns == 0
    harness.done()
    last = harness.step("b", 1000, end=True)
    assert last.sequence == [1000, 2, 0]
    one_shot = harness.request("c", sequence_id="s", sequence_start=True, sequence_end=True)
    harness.done()
    harness.scheduler.submit(one_shot)
    assert one_shot.sequence == ["s", 3, 0]


def test_a_batch_holds_at_most_one_request_per_sequence_and_keeps_each_in_order() -> None:
    harness = Harness(max_batch_size=4)
    worker = harness.instance()
    harness.step("a1", "a", start=True)  # goes at once: the instance was idle
    harness.step("a2", "a")
    harness.step("b1", "b", start=True)
    harness.step("c1", "c", start=True)
    harness.step("b2", "b", end=True)
    assert harness.batches() == [["a1"]]
    harness.done(worker)
    assert harness.batches()[-1] == ["a2", "b1", "c1"]  # by slot: a is slot 0, b 1, c 2
    harness.done(worker)
    assert harness.batches()[-1] == ["b2"]
    assert [r.sequence[2] for r in harness.sent if r.sequence] == [0, 0, 1, 2, 1]


def test_sequences_spread_over_instances_and_stick_to_theirs() -> None:
    harness = Harness(max_batch_size=2)
    first, second = harness.instance(), harness.instance()
    harness.step("a1", "a", start=True)
    harness.step("b1", "b", start=True)
    assert harness.dispatched == [(["a1"], first), (["b1"], second)]
    harness.step("a2", "a")
    harness.step("b2", "b")
    harness.done(second)
    assert harness.dispatched[-1] == (["b2"], second)
    harness.done(first)
    assert harness.dispatched[-1] == (["a2"], first)


def test_sequences_past_the_slots_wait_in_the_backlog_for_one() -> None:
    harness = Harness(max_batch_size=1)
    worker = harness.instance()
    harness.step("a1", "a", start=True)
    harness.step("b1", "b", start=True)
    harness.step("b2", "b", end=True)
    assert harness.scheduler.queued_count() == 2
    harness.done(worker)
    assert harness.batches() == [["a1"]]  # b waits: a still holds the only slot
    harness.step("a2", "a", end=True)
    assert harness.batches() == [["a1"], ["a2"]]
    harness.done(worker)
    assert harness.batches()[-2:] == [["a2"], ["b1"]]
    harness.done(worker)
    assert harness.batches()[-1] == ["b2"]
    assert harness.scheduler.queued_count() == 0


def test_a_bounded_backlog_refuses_sequences_past_it() -> None:
    harness = Harness(max_batch_size=1, max_backlog_sequences=1)
    harness.instance()
    harness.step("a1", "a", start=True)
    harness.step("b1", "b", start=True)
    with pytest.raises(QueueFullError, match=r"every sequence slot is taken \(1 on 1 instances\).*maximum of 1"):
        harness.step("c1", "c", start=True)


def test_direct_waits_for_minimum_slot_utilization_up_to_the_delay() -> None:
    harness = Harness(max_batch_size=4, minimum_slot_utilization=0.5, max_queue_delay_microseconds=100)
    worker = harness.instance()
    harness.step("a1", "a", start=True)
    assert harness.batches() == []  # 1 of 4 slots ready: under half
    harness.loop.advance_us(50)
    harness.step("b1", "b", start=True)
    assert harness.batches() == [["a1", "b1"]]  # 2 of 4: half
    harness.done(worker)
    harness.step("a2", "a")
    harness.loop.advance_us(99)
    assert len(harness.batches()) == 1
    harness.loop.advance_us(1)
    assert harness.batches()[-1] == ["a2"]  # the delay ran out


def test_requests_of_another_signature_wait_for_the_next_batch() -> None:
    harness = Harness(max_batch_size=4)
    worker = harness.instance()
    harness.step("a1", "a", start=True)
    harness.loop.advance_us(1)
    harness.scheduler.submit(harness.request("b1", signature=("t",), sequence_id="b", sequence_start=True))
    harness.loop.advance_us(1)
    harness.step("c1", "c", start=True)
    harness.step("a2", "a")
    harness.done(worker)
    assert harness.batches()[-1] == ["b1"]  # the oldest request decides the batch's signature
    harness.done(worker)
    assert harness.batches()[-1] == ["a2", "c1"]  # by slot


# oldest: dynamic batching across sequences -------------------------------------------------------------------------


def test_oldest_batches_the_oldest_ready_requests_with_its_delay_and_preferred_sizes() -> None:
    harness = Harness(
        max_batch_size=4,
        strategy="oldest",
        max_candidate_sequences=8,
        max_queue_delay_microseconds=100,
        preferred_batch_size=(2,),
    )
    worker = harness.instance()
    harness.step("a1", "a", start=True)
    assert harness.batches() == []  # waits for more, up to 100 µs
    harness.loop.advance_us(10)
    harness.step("b1", "b", start=True)
    assert harness.batches() == [["a1", "b1"]]  # a preferred size
    for name in "cdefg":
        harness.loop.advance_us(1)
        harness.step(f"{name}1", name, start=True)
    harness.done(worker)
    # Five ready, four fit: the largest preferred size they reach (2), oldest first.
    assert harness.batches()[-1] == ["c1", "d1"]
    harness.done(worker)
    assert harness.batches()[-1] == ["c1", "d1"]  # three ready, neither full nor preferred: they wait
    harness.loop.advance_us(100)
    assert harness.batches()[-1] == ["e1", "f1", "g1"]  # e's delay ran out


def test_oldest_candidates_default_to_max_batch_size_per_instance() -> None:
    harness = Harness(max_batch_size=2, strategy="oldest")
    harness.instance()
    for name in "abc":
        harness.step(f"{name}1", name, start=True)
    # a runs, b waits in the second candidate slot, c in the backlog.
    assert harness.scheduler.stats_snapshot() == {"queued": 2, "sequences": 3, "backlog": 1}


def test_oldest_with_preserve_ordering_answers_in_arrival_order() -> None:
    harness = Harness(max_batch_size=1, strategy="oldest", max_candidate_sequences=2, ordered=True)
    first = harness.instance()
    second = harness.instance()
    a = harness.step("a1", "a", start=True)
    b = harness.step("b1", "b", start=True)
    assert [ids for ids, _ in harness.dispatched] == [["a1"], ["b1"]]
    assert harness.scheduler.orderer is not None
    harness.scheduler.orderer.deliver(b, InferenceResponse([]))
    assert harness.answers == []
    harness.scheduler.orderer.deliver(a, InferenceResponse([]))
    assert [rid for rid, _ in harness.answers] == ["a1", "b1"]
    harness.done(first)
    harness.done(second)


# restarts, cancels, drain ------------------------------------------------------------------------------------------


def test_a_new_start_for_a_sequence_still_going_restarts_it_in_its_slot(caplog: pytest.LogCaptureFixture) -> None:
    harness = Harness()
    worker = harness.instance()
    harness.step("a1", 9, start=True)
    harness.step("a2", 9)
    with caplog.at_level(logging.WARNING):
        restart = harness.step("b1", 9, start=True)
    assert "sequence 9 for model 'acc' has a conflict" in caplog.text
    harness.done(worker)
    harness.done(worker)
    assert harness.batches() == [["a1"], ["a2"], ["b1"]]
    assert restart.sequence == [9, 1, 0]


def test_a_start_right_after_an_end_reuses_the_sequence_and_keeps_the_order() -> None:
    harness = Harness(max_batch_size=4)
    worker = harness.instance()
    harness.step("a1", 5, start=True)
    harness.step("a2", 5, end=True)
    harness.step("b1", 5, start=True)  # the same ID again, before the END ran
    harness.done(worker)
    harness.done(worker)
    # Never two requests of one ID in a batch, and the new sequence runs after the old one ended.
    assert harness.batches() == [["a1"], ["a2"], ["b1"]]


def test_a_cancelled_request_leaves_its_queue() -> None:
    harness = Harness(max_batch_size=1)
    worker = harness.instance()
    harness.step("a1", "a", start=True)
    second = harness.step("a2", "a")
    assert harness.scheduler.cancel(second)
    assert second.cancelled
    assert not harness.scheduler.cancel(second)
    assert not harness.scheduler.cancel(harness.sent[0])  # running: not queued
    harness.done(worker)
    assert harness.batches() == [["a1"]]


def test_a_cancelled_end_releases_the_slot_and_tells_the_instance() -> None:
    harness = Harness(max_batch_size=1)
    worker = harness.instance()
    harness.step("a1", "a", start=True)
    end = harness.step("a2", "a", end=True)
    harness.step("b1", "b", start=True)  # in the backlog
    harness.scheduler.cancel(end)
    harness.done(worker)
    assert harness.batches() == [["a1"], ["b1"]]
    assert harness.dispatched[-1][1].released_sequences == ["a"]


def test_drain_returns_every_queued_request() -> None:
    harness = Harness(max_batch_size=1)
    harness.instance()
    harness.step("a1", "a", start=True)
    harness.step("a2", "a")
    harness.step("b1", "b", start=True)
    assert sorted(r.id for r in harness.scheduler.drain()) == ["a2", "b1"]
    assert harness.scheduler.queued_count() == 0
    harness.done()
    with pytest.raises(InvalidInputError, match="START"):
        harness.step("a3", "a")


# idle sequences ----------------------------------------------------------------------------------------------------


def test_an_idle_sequence_is_released_and_its_late_request_told_why() -> None:
    harness = Harness(max_batch_size=1, max_sequence_idle_microseconds=1000)
    worker = harness.instance()
    harness.step("a1", "a", start=True)
    harness.loop.advance_us(5000)  # running: not idle
    harness.step("b1", "b", start=True)  # in the backlog
    harness.done(worker)
    assert harness.batches() == [["a1"]]
    harness.loop.advance_us(999)
    harness.step("a2", "a")  # in time: its idle clock starts again
    harness.done(worker)
    harness.loop.advance_us(1000)
    assert harness.batches() == [["a1"], ["a2"], ["b1"]]  # a was released, b took its slot
    assert worker.released_sequences == ["a"]  # told with the next batch (BatchesInFlight.dispatch takes them)
    assert harness.sent[-1].sequence == ["b", 1, 0]
    with pytest.raises(InvalidInputError) as caught:
        harness.step("a3", "a")
    assert "sequence a to model 'acc' must specify the START flag" in str(caught.value)
    assert "released after it stayed idle longer than max_sequence_idle_microseconds (1000)" in str(caught.value)
    harness.done(worker)
    harness.step("b2", "b", end=True)
    harness.step("a4", "a", start=True)  # a new sequence of the same ID, in the backlog until b ends
    harness.done(worker)
    assert harness.batches()[-2:] == [["b2"], ["a4"]]


def test_the_instance_hears_of_a_released_sequence_with_its_next_batch() -> None:
    harness = Harness(max_batch_size=2, max_sequence_idle_microseconds=1000)
    worker = harness.instance()
    harness.step("a1", "a", start=True)
    harness.done(worker)
    harness.loop.advance_us(1500)
    assert worker.released_sequences == ["a"]
    assert harness.loop.armed == []  # nothing left to watch


# instances that go away --------------------------------------------------------------------------------------------


def test_the_sequences_of_a_lost_instance_fail_with_the_reason_and_can_start_again() -> None:
    harness = Harness(max_batch_size=2)
    first, second = harness.instance(), harness.instance()
    harness.step("a1", "a", start=True)  # on first
    harness.step("b1", "b", start=True)  # on second
    harness.step("a2", "a")
    harness.scheduler.remove_instance(first, WorkerDiedError("instance 0 of model 'acc' (pid 9) died: SIGKILL"))
    lost = (
        "sequence a of model 'acc' was lost with its state: instance 0 of model 'acc' (pid 9) died: SIGKILL; start it "
        "again (sequence_start)"
    )
    assert harness.errors() == [("a2", lost)]
    assert harness.entry.stats.fail.count == 1
    with pytest.raises(WorkerDiedError) as caught:
        harness.step("a3", "a")
    assert str(caught.value) == lost
    harness.step("b2", "b")  # the other sequence goes on
    harness.done(second)
    assert harness.dispatched[-1] == (["b2"], second)
    harness.step("a4", "a", start=True)  # started again: on the surviving instance
    harness.done(second)
    assert harness.dispatched[-1] == (["a4"], second)
