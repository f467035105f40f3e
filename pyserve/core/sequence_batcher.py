"""Sequence batching (Triton's sequence batcher): the scheduler of a stateful model.

Every request names its sequence with a correlation ID (``sequence_id``: a non-zero integer or a non-empty string)
and may carry ``sequence_start`` / ``sequence_end``. A sequence is given a slot on one instance at its start and
keeps it until its end, so all its requests run there, one at a time and in arrival order, where its state lives
(the instance keeps it: ``pyserve.worker.sequence_state``). A sequence that finds no free slot waits in the backlog
(``max_backlog_sequences`` bounds it) and takes the first slot that frees, with its queued requests.

Batches are formed per instance, whenever it is idle, from the sequences in its slots, at most one request of each:

- ``direct``: one slot per sequence (``max_batch_size`` per instance); the batch goes as soon as a request is ready,
  or, with ``minimum_slot_utilization``, once that share of the slots has one or the oldest has waited
  ``max_queue_delay_microseconds``;
- ``oldest``: up to ``max_candidate_sequences`` sequences per instance; the oldest ready requests among them form
  the batch as in the dynamic batcher (``max_batch_size``, ``preferred_batch_size``, ``max_queue_delay_microseconds``).

Only requests of one signature share a batch (as in the dynamic batcher), and never two of one correlation ID.

A sequence without a request for ``max_sequence_idle_microseconds`` is released: its slot goes to the backlog, its
instance drops its state (told with its next batch), and a late request of it fails saying so. A sequence whose
instance goes away is lost with its state: its queued and later requests fail with the reason, until it is started
again. A new START for a sequence still going ends it early (Triton logs the conflict the same way): its queued
requests run first, then it starts over in the same slot.

Time and timers are injected, as in ``pyserve.core.scheduler``, so the logic is unit-tested with a fake clock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from pyserve.config import ControlKind, SequenceBatcher, SequenceStrategy
from pyserve.core.inference import InferenceRequest, Instance, ModelEntry, ResponseOrdering
from pyserve.core.scheduler import CallLater, Dispatch, Reject, TimerHandle, answer_with_error
from pyserve.core.sequence_slots import CorrelationId, Lane, Sequence, SequenceReader
from pyserve.core.stats import OTHER
from pyserve.errors import InferenceError, InvalidInputError, QueueFullError, WorkerDiedError
from pyserve.transport.protocol import SEQUENCE_END, SEQUENCE_START

logger = logging.getLogger(__name__)

# How many released or lost sequences are remembered, to tell a late request what became of its sequence.
_REMEMBERED = 4096


class SequenceScheduler:
    """Schedules one stateful model version's requests by sequence (the ``Scheduler`` the core asks of a model).

    ``dispatch``, ``call_later`` and ``clock`` as for ``pyserve.core.scheduler.ModelScheduler``; ``fail(request,
    error)`` answers a request the scheduler gives up after accepting it (its sequence was lost or released); by
    default it is counted as a failure and answered with the error. ``orderer`` releases responses in arrival order
    (the ``oldest`` strategy's ``preserve_ordering``).
    """

    def __init__(
        self,
        entry: ModelEntry,
        dispatch: Dispatch,
        call_later: CallLater,
        clock: Callable[[], int] = time.monotonic_ns,
        *,
        fail: Reject | None = None,
        orderer: ResponseOrdering | None = None,
    ) -> None:
        config = entry.spec.config
        settings = config.sequence_batcher
        if settings is None:
            raise ValueError(f"model '{entry.name}' has no sequence_batcher")
        self.entry = entry
        self.orderer = orderer
        self._settings: SequenceBatcher = settings
        self._dispatch = dispatch
        self._call_later = call_later
        self._clock = clock
        self._fail = fail or self._answer_with_error
        self._max_rows = max(config.max_batch_size, 1)
        self._slots = settings.slots_per_instance(config.max_batch_size)
        self._oldest = settings.strategy is SequenceStrategy.OLDEST
        self._delay_ns = settings.max_queue_delay_microseconds * 1000
        self._preferred = frozenset(settings.preferred_batch_size)
        self._min_ready = math.ceil(settings.minimum_slot_utilization * self._slots - 1e-9)
        self._idle_ns = settings.max_sequence_idle_microseconds * 1000
        self._max_backlog = settings.max_backlog_sequences
        corrid = settings.control(ControlKind.CORRID)
        self._reader = SequenceReader(entry.name, corrid.datatype if corrid is not None else None)
        self._lanes: list[Lane] = []
        self._backlog: deque[Sequence] = deque()
        self._sequences: dict[CorrelationId, Sequence] = {}  # every sequence not yet released
        self._owner: dict[InferenceRequest, Sequence] = {}  # queued request -> its sequence
        self._queued = 0
        # Sequences released or lost, and what to tell a late request of one (most recent last).
        self._gone: OrderedDict[CorrelationId, InferenceError] = OrderedDict()
        self._idle_heap: list[tuple[int, int, Sequence]] = []
        self._tiebreak = itertools.count()
        self._timer: TimerHandle | None = None
        self._timer_due_ns = 0

    # instances -------------------------------------------------------------------------------------------------

    def add_instance(self, instance: Instance) -> None:
        """A newly connected instance: its slots take sequences from the backlog at once."""
        lane = Lane(instance, self._slots)
        self._lanes.append(lane)
        while self._backlog and lane.free:
            self._seat(self._backlog.popleft(), lane)
        self.schedule()

    def remove_instance(self, instance: Instance, error: InferenceError | None = None) -> None:
        """An instance that went away: the sequences it held are lost with their state."""
        lane = self._lane_of(instance)
        if lane is None:
            return
        self._lanes.remove(lane)
        why = str(error) if error is not None else f"instance {instance.index} of model '{self.entry.name}' went away"
        for sequence in lane.slots:
            if sequence is None:
                continue
            lost = WorkerDiedError(
                f"sequence {sequence.correlation_id} of model '{self.entry.name}' was lost with its state: {why}; "
                "start it again (sequence_start)"
            )
            self._forget_sequence(sequence, lost, remember=not sequence.ended)
            for request in sequence.queue:
                self._owner.pop(request, None)
                self._queued -= 1
                self._fail(request, lost)
            sequence.queue.clear()
        self.schedule()

    def instance_done(self, instance: Instance) -> None:
        """An instance finished its batch: its sequences may go on (or end, freeing their slots)."""
        instance.busy = False
        lane = self._lane_of(instance)
        if lane is not None:
            now = self._clock()
            for sequence in lane.running:
                sequence.busy = False
                sequence.last_ns = now
                if sequence.queue:
                    lane.waiting[sequence] = None
                    continue
                if sequence.ended:
                    self._release(sequence)
                else:
                    self._watch_idle(sequence)
            lane.running = []
        self.schedule()

    # requests --------------------------------------------------------------------------------------------------

    def submit(self, request: InferenceRequest) -> None:
        """Queue a request on its sequence and dispatch what can go now.

        Raises InvalidInputError for a request without a valid correlation ID, with more than one row, or that does
        not start a sequence unknown here; WorkerDiedError for a sequence lost with its instance; QueueFullError when
        a new sequence finds no slot and the backlog is full.
        """
        correlation_id, flags = self._reader.read(request)
        sequence = self._sequences.get(correlation_id)
        if sequence is not None and sequence.ended and not flags & SEQUENCE_START:
            sequence = None  # what follows an END must start a new sequence
        if sequence is None:
            if not flags & SEQUENCE_START:
                gone = self._gone.get(correlation_id)
                if gone is not None:
                    if flags & SEQUENCE_END:
                        del self._gone[correlation_id]
                    raise type(gone)(str(gone))
                raise InvalidInputError(
                    f"inference request for sequence {correlation_id} to model '{self.entry.name}' must specify the "
                    "START flag on the first request of the sequence"
                )
            self._gone.pop(correlation_id, None)
            sequence = self._new_sequence(correlation_id)
        elif flags & SEQUENCE_START and not sequence.ended:
            logger.warning(
                "sequence %s for model '%s' has a conflict: the previous sequence did not end before this sequence "
                "start; the previous sequence is terminated early",
                correlation_id,
                self.entry.name,
            )
        now = self._clock()
        request.arrival_ns = now
        request.sequence = [correlation_id, flags, -1]
        sequence.ended = bool(flags & SEQUENCE_END)
        sequence.last_ns = now
        sequence.queue.append(request)
        self._owner[request] = sequence
        self._queued += 1
        lane = sequence.lane
        if lane is not None and not sequence.busy:
            lane.waiting.setdefault(sequence, None)
        if self.orderer is not None:
            self.orderer.register(request)
        # Only an idle instance can take it now (a busy one looks again when done, the backlog when a slot frees).
        if lane is not None and not lane.instance.busy:
            self.schedule()

    def cancel(self, request: InferenceRequest) -> bool:
        """Take a queued request out at once; True if it was queued (False: running, answered or unknown)."""
        sequence = self._owner.pop(request, None)
        if sequence is None:
            return False
        sequence.queue.remove(request)
        self._queued -= 1
        request.cancelled = True
        if self.orderer is not None:
            self.orderer.forget(request)
        if not sequence.queue and not sequence.busy:
            if sequence.lane is not None:
                sequence.lane.waiting.pop(sequence, None)
            if sequence.ended:
                self._release(sequence)  # its END never reaches the instance
            else:
                self._watch_idle(sequence)
            self.schedule()
        return True

    def queued_count(self) -> int:
        """How many requests are queued, in slots and in the backlog (for metrics)."""
        return self._queued

    def sequence_count(self) -> int:
        """How many sequences hold a slot or wait for one."""
        return len(self._backlog) + sum(len(lane.slots) - len(lane.free) for lane in self._lanes)

    def drain(self) -> list[InferenceRequest]:
        """Remove and return every queued request (model unloaded or server stopping); every sequence ends."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = list(self._owner)
        self._owner.clear()
        self._queued = 0
        for sequence in list(self._sequences.values()):
            sequence.queue.clear()
        for lane in self._lanes:
            lane.slots = [None] * self._slots
            lane.free = list(range(self._slots))
            lane.waiting.clear()
            lane.running = []
        self._backlog.clear()
        self._sequences.clear()
        self._idle_heap.clear()
        return pending

    def schedule(self) -> None:
        """Release idle sequences, send a batch to each idle instance that has one due, and arm the timer."""
        now = self._clock()
        self._reap(now)
        due = 0
        for lane in self._lanes:
            if lane.instance.busy or not lane.waiting:
                continue
            lane_due = self._dispatch_lane(lane, now)
            if lane_due and (not due or lane_due < due):
                due = lane_due
        if self._idle_heap and (not due or self._idle_heap[0][0] < due):
            due = self._idle_heap[0][0]
        self._set_timer(due, now)

    # sequences and slots ---------------------------------------------------------------------------------------

    def _new_sequence(self, correlation_id: CorrelationId) -> Sequence:
        lane = max(self._lanes, key=lambda lane: len(lane.free), default=None)
        sequence = Sequence(correlation_id)
        if lane is not None and lane.free:
            self._seat(sequence, lane)
        else:
            limit = self._max_backlog
            if limit is not None and len(self._backlog) >= limit:
                held = sum(len(lane.slots) for lane in self._lanes)
                raise QueueFullError(
                    f"model '{self.entry.name}': every sequence slot is taken ({held} on {len(self._lanes)} "
                    f"instances) and the backlog holds its maximum of {limit} sequences (max_backlog_sequences)"
                )
            self._backlog.append(sequence)
        self._sequences[correlation_id] = sequence
        return sequence

    def _seat(self, sequence: Sequence, lane: Lane) -> None:
        slot = heapq.heappop(lane.free)
        lane.slots[slot] = sequence
        sequence.lane = lane
        sequence.slot = slot
        if sequence.queue and not sequence.busy:
            lane.waiting[sequence] = None

    def _release(self, sequence: Sequence) -> None:
        """A sequence leaves its slot (which goes to the backlog's first); an instance that holds its state without
        having seen it end is told to drop it."""
        if self._sequences.get(sequence.correlation_id) is sequence:
            del self._sequences[sequence.correlation_id]
        lane = sequence.lane
        if lane is None:
            if sequence in self._backlog:
                self._backlog.remove(sequence)
            return
        lane.waiting.pop(sequence, None)
        lane.slots[sequence.slot] = None
        heapq.heappush(lane.free, sequence.slot)
        sequence.lane = None
        if sequence.sent and not sequence.end_sent:
            lane.instance.released_sequences.append(sequence.correlation_id)
        if self._backlog:
            self._seat(self._backlog.popleft(), lane)

    def _forget_sequence(self, sequence: Sequence, why: InferenceError, remember: bool) -> None:
        """A sequence is gone (its instance went away): late requests of it hear ``why``."""
        if self._sequences.get(sequence.correlation_id) is sequence:
            del self._sequences[sequence.correlation_id]
        sequence.lane = None
        if remember:
            self._remember(sequence.correlation_id, why)

    def _remember(self, correlation_id: CorrelationId, why: InferenceError) -> None:
        self._gone[correlation_id] = why
        self._gone.move_to_end(correlation_id)
        while len(self._gone) > _REMEMBERED:
            self._gone.popitem(last=False)

    def _lane_of(self, instance: Instance) -> Lane | None:
        return next((lane for lane in self._lanes if lane.instance is instance), None)

    # idle sequences --------------------------------------------------------------------------------------------

    def _watch_idle(self, sequence: Sequence) -> None:
        if not sequence.in_heap:
            sequence.in_heap = True
            heapq.heappush(self._idle_heap, (sequence.last_ns + self._idle_ns, next(self._tiebreak), sequence))

    def _reap(self, now: int) -> None:
        """Release the sequences idle for longer than max_sequence_idle_microseconds."""
        heap = self._idle_heap
        while heap and heap[0][0] <= now:
            _, _, sequence = heapq.heappop(heap)
            sequence.in_heap = False
            if self._sequences.get(sequence.correlation_id) is not sequence or sequence.ended:
                continue  # released, or ending
            if sequence.busy or sequence.queue:
                continue  # active again: watched anew once idle
            if sequence.last_ns + self._idle_ns > now:
                self._watch_idle(sequence)  # a request came and went since it was pushed
                continue
            idle_us = self._settings.max_sequence_idle_microseconds
            self._remember(
                sequence.correlation_id,
                InvalidInputError(
                    f"inference request for sequence {sequence.correlation_id} to model '{self.entry.name}' must "
                    "specify the START flag on the first request of the sequence: the sequence was released after "
                    f"it stayed idle longer than max_sequence_idle_microseconds ({idle_us})"
                ),
            )
            self._release(sequence)

    # batches ---------------------------------------------------------------------------------------------------

    def _dispatch_lane(self, lane: Lane, now: int) -> int:
        """Send the lane's batch if it is due; else when it will be (0: nothing waits)."""
        picked, due = self._next_batch(lane, now)
        if not picked:
            return due
        batch: list[InferenceRequest] = []
        for sequence in picked:
            request = sequence.queue.popleft()
            del self._owner[request]
            assert request.sequence is not None
            request.sequence[2] = sequence.slot
            sequence.busy = True
            sequence.sent = True
            sequence.end_sent = bool(request.sequence[1] & SEQUENCE_END)
            del lane.waiting[sequence]
            batch.append(request)
        self._queued -= len(batch)
        lane.running = picked
        lane.instance.busy = True
        self._dispatch(batch, lane.instance)
        return 0

    def _next_batch(self, lane: Lane, now: int) -> tuple[list[Sequence], int]:
        waiting = list(lane.waiting)
        if self._oldest:
            waiting.sort(key=lambda sequence: sequence.queue[0].arrival_ns)
        else:
            waiting.sort(key=lambda sequence: sequence.slot)
        oldest = min(waiting, key=lambda sequence: sequence.queue[0].arrival_ns)
        signature = oldest.queue[0].signature
        picked: list[Sequence] = []
        ids: set[CorrelationId] = set()
        others = False  # a request that cannot join this batch waits too
        more = False  # a request that would join does not fit
        for sequence in waiting:
            if sequence.queue[0].signature != signature or sequence.correlation_id in ids:
                others = True
                continue
            if len(picked) == self._max_rows:
                more = True
                break
            picked.append(sequence)
            ids.add(sequence.correlation_id)
        count = len(picked)
        if self._oldest:
            if count < self._max_rows and not more and not others and self._delay_ns and count not in self._preferred:
                due = oldest.queue[0].arrival_ns + self._delay_ns
                if now < due:
                    return [], due
            if more and self._preferred and count not in self._preferred:
                fitting = [size for size in self._preferred if size <= count]
                if fitting:
                    picked = picked[: max(fitting)]
        elif self._min_ready and count < self._min_ready and not others and self._delay_ns:
            due = oldest.queue[0].arrival_ns + self._delay_ns
            if now < due:
                return [], due
        return picked, 0

    # answers and timers ----------------------------------------------------------------------------------------

    def _answer_with_error(self, request: InferenceRequest, error: InferenceError) -> None:
        self.entry.stats.record_failure(OTHER, self._clock() - request.arrival_ns)
        answer_with_error(request, error, self.orderer)

    def _set_timer(self, due: int, now: int) -> None:
        if self._timer is not None:
            if due == self._timer_due_ns:
                return
            self._timer.cancel()
            self._timer = None
        if due:
            self._timer_due_ns = due
            self._timer = self._call_later(max(due - now, 0) / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_due_ns = 0
        self.schedule()

    def stats_snapshot(self) -> dict[str, Any]:
        """Queued requests, sequences and the backlog (for diagnostics)."""
        return {"queued": self._queued, "sequences": self.sequence_count(), "backlog": len(self._backlog)}
