"""Per-model scheduling: priority queues with their queue policies, the dynamic batcher, and dispatch to instances.

Batches count rows (a request of batch 8 is 8 rows), up to ``max_batch_size``. Only requests with the same
signature (input names, datatypes and non-batch dimensions) share a batch, so the worker can lay their rows out
contiguously. A batch goes at once when it is full or at a preferred size, when the delay is 0, or when more
requests are queued than fit (requests of another signature never fit); otherwise it waits until the oldest
request in it has waited ``max_queue_delay_microseconds``.

With dynamic batching the scheduler keeps one queue per priority level (Triton's semantics): a batch starts with
the oldest request of the highest-priority level that has one and is filled, in priority order, with the requests
of the same signature from that level and the levels below. Priority is strict: lower levels only run when the
levels above them have nothing queued, or to fill a batch. Each level applies its ``QueuePolicy``: a bound on
queued requests and a timeout; a request whose timeout expired while queued is rejected or, with
``TimeoutAction.DELAY``, moved behind the unexpired requests of its level. Without dynamic batching (``max_batch_size``
0 or no batcher) the queue is a plain FIFO: request priorities and timeouts are not looked at.

``cancel`` takes a queued request out at once. An ``orderer`` (``pyserve.core.response_orderer``), when given, hears
of every accepted request, so it can release a model's responses in arrival order (``preserve_ordering``).

Time and timers are injected so the logic is unit-tested with a fake clock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from pyserve.config import QueuePolicy, TimeoutAction
from pyserve.core.inference import InferenceRequest, InferenceResponse, Instance, ModelEntry, ResponseOrdering
from pyserve.errors import InferenceError, InvalidInputError, QueueFullError, RequestTimeoutError

logger = logging.getLogger(__name__)


class TimerHandle(Protocol):
    """What a timer factory returns (asyncio.TimerHandle fits)."""

    def cancel(self) -> None: ...


Dispatch = Callable[[list[InferenceRequest], Instance], None]
CallLater = Callable[[float, Callable[[], None]], TimerHandle]
Reject = Callable[[InferenceRequest, InferenceError], None]


class _Level:
    """The queue of one priority level: unexpired requests in arrival order, then the delayed ones."""

    __slots__ = ("deadlines", "delayed", "heap", "number", "policy", "queue")

    def __init__(self, number: int, policy: QueuePolicy) -> None:
        self.number = number  # 1 is the highest priority; 0 when the model has no priority levels
        self.policy = policy
        self.queue: deque[InferenceRequest] = deque()
        self.delayed: deque[InferenceRequest] = deque()  # expired under TimeoutAction.DELAY; they expire no more
        # Queued requests with a timeout still running, and a heap of (deadline, tiebreak, request) over them that
        # may hold stale entries of requests that left the queue (skipped when popped, compacted when many).
        self.deadlines: dict[InferenceRequest, int] = {}
        self.heap: list[tuple[int, int, InferenceRequest]] = []

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)

    def __iter__(self) -> Iterator[InferenceRequest]:
        return itertools.chain(self.queue, self.delayed)

    def earliest_deadline(self) -> int:
        """The first deadline of a request still queued here; 0 when none."""
        heap, deadlines = self.heap, self.deadlines
        while heap:
            deadline, _, request = heap[0]
            if deadlines.get(request) == deadline:
                return deadline
            heapq.heappop(heap)
        return 0

    def forget_deadlines(self, requests: Iterable[InferenceRequest]) -> None:
        deadlines = self.deadlines
        if not deadlines:
            self.heap.clear()  # every entry left is stale
            return
        for request in requests:
            deadlines.pop(request, None)
        if len(self.heap) > 2 * len(deadlines) + 64:
            self.heap = [item for item in self.heap if deadlines.get(item[2]) == item[0]]
            heapq.heapify(self.heap)


class ModelScheduler:
    """Queues one model version's requests and hands batches to its idle instances.

    ``dispatch(batch, instance)`` sends a batch; ``call_later(seconds, callback)`` arms a timer (the event loop's);
    ``reject(request, error)`` answers a request the scheduler refuses after accepting it (its timeout expired;
    by default: marked done and answered with the error, through the orderer if any); ``orderer``, when given, is
    told of every accepted request in arrival order (``preserve_ordering``).
    """

    def __init__(
        self,
        entry: ModelEntry,
        dispatch: Dispatch,
        call_later: CallLater,
        clock: Callable[[], int] = time.monotonic_ns,
        *,
        reject: Reject | None = None,
        orderer: ResponseOrdering | None = None,
    ) -> None:
        self.entry = entry
        self.orderer = orderer
        self._dispatch = dispatch
        self._call_later = call_later
        self._clock = clock
        self._reject = reject or self._answer_with_error
        self._idle: deque[Instance] = deque()
        self._timer: TimerHandle | None = None
        self._timer_due_ns = 0
        self._tiebreak = itertools.count()
        config = entry.spec.config
        batcher = config.batcher if config.dynamic_batching else None
        self._batching = batcher is not None
        self._max_rows = max(config.max_batch_size, 1)
        self._delay_ns = batcher.max_queue_delay_microseconds * 1000 if batcher else 0
        self._preferred = frozenset(batcher.preferred_batch_size) if batcher else frozenset()
        if batcher is None or not batcher.priority_levels:
            self._levels = [_Level(0, batcher.default_queue_policy if batcher else QueuePolicy())]
            self._default_level = self._levels[0]
        else:
            self._levels = [
                _Level(n, batcher.priority_queue_policy.get(n, batcher.default_queue_policy))
                for n in range(1, batcher.priority_levels + 1)
            ]
            self._default_level = self._levels[batcher.default_priority_level - 1]
        self._priorities = batcher is not None and batcher.priority_levels > 0
        self._timed_levels = [
            level
            for level in self._levels
            if level.policy.default_timeout_microseconds or level.policy.allow_timeout_override
        ]
        self._rejecting_levels = [
            level for level in self._timed_levels if level.policy.timeout_action is TimeoutAction.REJECT
        ]

    # instances -------------------------------------------------------------------------------------------------

    def add_instance(self, instance: Instance) -> None:
        """A newly connected instance: idle, so it may take queued work at once."""
        self._idle.append(instance)
        self.schedule()

    def remove_instance(self, instance: Instance, error: InferenceError | None = None) -> None:
        """An instance that went away (``error``, why, is not needed here: its batch fails in ``BatchesInFlight``)."""
        if instance in self._idle:
            self._idle.remove(instance)

    def instance_done(self, instance: Instance) -> None:
        """An instance finished its batch and is idle again."""
        instance.busy = False
        self._idle.append(instance)
        self.schedule()

    # requests --------------------------------------------------------------------------------------------------

    def submit(self, request: InferenceRequest) -> None:
        """Queue a request and dispatch what can go now.

        Raises InvalidInputError for a ``priority`` or ``timeout`` parameter the model cannot take, and
        QueueFullError when the request's priority level already holds its ``max_queue_size`` requests.
        """
        level = self._level_of(request) if self._priorities else self._default_level
        timeout_ns = self._timeout_ns(request, level.policy) if self._timed_levels else 0
        now = self._clock()
        if self._timed_levels:
            self._reject_all(self._expire(now))
        max_size = level.policy.max_queue_size
        if max_size and len(level) >= max_size:
            self._drop_cancelled(level)
            if len(level) >= max_size:
                where = f" at priority level {level.number}" if level.number else ""
                raise QueueFullError(
                    f"model '{self.entry.name}' version {self.entry.version}: request exceeds maximum queue size "
                    f"{max_size}{where}"
                )
        request.arrival_ns = now
        level.queue.append(request)
        if timeout_ns:
            deadline = now + timeout_ns
            level.deadlines[request] = deadline
            heapq.heappush(level.heap, (deadline, next(self._tiebreak), request))
        if self.orderer is not None:
            self.orderer.register(request)
        if self._idle:
            self.schedule()
        elif timeout_ns:
            self._set_timer(0, now)

    def cancel(self, request: InferenceRequest) -> bool:
        """Take a queued request out of its queue at once; True if it was queued.

        The request is marked cancelled and never dispatched. False means it was not queued (running, answered or
        unknown): its instance may still answer it.
        """
        for level in self._levels:
            for queue in (level.queue, level.delayed):
                try:
                    queue.remove(request)
                except ValueError:
                    continue
                level.forget_deadlines((request,))
                request.cancelled = True
                if self.orderer is not None:
                    self.orderer.forget(request)
                return True
        return False

    def queued_count(self) -> int:
        """How many requests are queued (for metrics)."""
        return sum(len(level) for level in self._levels)

    def queued_requests(self) -> list[InferenceRequest]:
        """The queued requests in the order they are considered: by priority level, then arrival, delayed last."""
        return [request for level in self._levels for request in level]

    def schedule(self) -> None:
        """Apply timeouts, dispatch batches while instances are idle and a batch is due, and arm the timer."""
        now = self._clock()
        rejected = self._expire(now) if self._timed_levels else []
        batch_due_ns = 0
        while self._idle:
            batch, batch_due_ns = self._next_batch(now)
            if batch is None:
                break
            instance = self._idle.popleft()
            instance.busy = True
            self._dispatch(batch, instance)
        self._set_timer(batch_due_ns, now)
        self._reject_all(rejected)

    def drain(self) -> list[InferenceRequest]:
        """Remove and return every queued request (model unloaded or server stopping)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = self.queued_requests()
        for level in self._levels:
            level.queue.clear()
            level.delayed.clear()
            level.deadlines.clear()
            level.heap.clear()
        return pending

    def stats_snapshot(self) -> dict[str, Any]:
        """Queue depth and idle instances (for diagnostics)."""
        return {"queued": self.queued_count(), "idle_instances": len(self._idle)}

    # request parameters ----------------------------------------------------------------------------------------

    def _level_of(self, request: InferenceRequest) -> _Level:
        value = request.parameters.get("priority", 0)
        count = len(self._levels)
        if type(value) is not int or not 0 <= value <= count:
            raise InvalidInputError(
                f"model '{self.entry.name}': priority {value!r} is out of range: expected 1..{count} "
                f"(1 is the highest), or 0 for the default level {self._default_level.number}"
            )
        return self._levels[value - 1] if value else self._default_level

    def _timeout_ns(self, request: InferenceRequest, policy: QueuePolicy) -> int:
        timeout_us = policy.default_timeout_microseconds
        if policy.allow_timeout_override:
            value = request.parameters.get("timeout")
            if value is not None:
                if type(value) is not int or value < 0:
                    raise InvalidInputError(
                        f"model '{self.entry.name}': timeout {value!r} must be a whole number of microseconds >= 0"
                    )
                # As in Triton, a request may shorten the level's timeout but not lengthen it (0 = no timeout).
                if value and (not timeout_us or value < timeout_us):
                    timeout_us = value
        return timeout_us * 1000

    # timeouts --------------------------------------------------------------------------------------------------

    def _expire(self, now: int) -> list[InferenceRequest]:
        """Apply the timeout action to requests whose deadline has come (deadline <= now); returns those to reject."""
        rejected: list[InferenceRequest] = []
        for level in self._timed_levels:
            heap, deadlines = level.heap, level.deadlines
            expired: set[InferenceRequest] = set()
            while heap and heap[0][0] <= now:
                deadline, _, request = heapq.heappop(heap)
                if deadlines.get(request) == deadline:
                    del deadlines[request]
                    expired.add(request)
            if not expired:
                continue
            kept: deque[InferenceRequest] = deque()
            for request in level.queue:
                if request not in expired:
                    kept.append(request)
                elif request.cancelled:
                    self._forget(request)
                elif level.policy.timeout_action is TimeoutAction.DELAY:
                    level.delayed.append(request)
                else:
                    rejected.append(request)
            level.queue = kept
        return rejected

    def _reject_all(self, requests: list[InferenceRequest]) -> None:
        for request in requests:
            self._reject(request, RequestTimeoutError("Request timeout expired"))

    def _answer_with_error(self, request: InferenceRequest, error: InferenceError) -> None:
        answer_with_error(request, error, self.orderer)

    def _set_timer(self, batch_due_ns: int, now: int) -> None:
        # One timer, for the earlier of the pending batch's delay and the first deadline of a request to reject.
        due = batch_due_ns
        for level in self._rejecting_levels:
            deadline = level.earliest_deadline()
            if deadline and (not due or deadline < due):
                due = deadline
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
        self.schedule()

    # batches ---------------------------------------------------------------------------------------------------

    def _next_batch(self, now: int) -> tuple[list[InferenceRequest] | None, int]:
        """The batch to send now, or None and when the pending batch is due (0: nothing queued)."""
        first = self._first()
        if first is None:
            return None, 0
        head, start = first
        if not self._batching:
            level = self._levels[start]
            (level.queue if level.queue and level.queue[0] is head else level.delayed).popleft()
            level.forget_deadlines((head,))
            return [head], 0
        signature = head.signature
        max_rows = self._max_rows
        rows = 0
        picked: list[InferenceRequest] = []
        more_waiting = False  # a request of this signature does not fit
        others_waiting = False  # a request of another signature can never join this batch
        for level in self._levels[start:]:
            for request in level:
                if request.cancelled:
                    continue
                if request.signature != signature:
                    others_waiting = True
                    continue
                if rows + request.rows > max_rows:
                    more_waiting = True
                    break
                picked.append(request)
                rows += request.rows
            if more_waiting:
                break
        # Waiting would hold up requests that cannot join this batch (as Triton sends a pending batch at once
        # when the next request's shape does not match it).
        if (
            rows < max_rows
            and not more_waiting
            and not others_waiting
            and self._delay_ns
            and rows not in self._preferred
        ):
            due = min(request.arrival_ns for request in picked) + self._delay_ns
            if now < due:
                return None, due
        if more_waiting and self._preferred and rows not in self._preferred:
            picked = self._trim_to_preferred(picked)
        self._take(picked, start)
        return picked, 0

    def _first(self) -> tuple[InferenceRequest, int] | None:
        """The request a batch starts with and the index of its level, dropping cancelled ones met first."""
        for index, level in enumerate(self._levels):
            for queue in (level.queue, level.delayed):
                while queue and queue[0].cancelled:
                    request = queue.popleft()
                    level.forget_deadlines((request,))
                    self._forget(request)
                if queue:
                    return queue[0], index
        return None

    def _trim_to_preferred(self, picked: list[InferenceRequest]) -> list[InferenceRequest]:
        # More is queued than fits: send the largest preferred size the rows reach exactly, else all picked.
        best: int | None = None
        total = 0
        for count, request in enumerate(picked, start=1):
            total += request.rows
            if total in self._preferred:
                best = count
        return picked[:best] if best is not None else picked

    def _take(self, picked: list[InferenceRequest], start: int) -> None:
        """Remove a batch from the queues (levels from ``start`` on), dropping the cancelled requests passed over."""
        level = self._levels[start]
        queue = level.queue
        if len(picked) <= len(queue) and all(a is b for a, b in zip(queue, picked, strict=False)):
            for _ in picked:
                queue.popleft()
            level.forget_deadlines(picked)
            return
        chosen = set(picked)
        dropped: list[InferenceRequest] = []
        left = len(picked)
        for level in self._levels[start:]:
            if not left:
                break
            for name in ("queue", "delayed"):
                kept: deque[InferenceRequest] = deque()
                for request in getattr(level, name):
                    if request in chosen:
                        left -= 1
                    elif request.cancelled:
                        dropped.append(request)
                        self._forget(request)
                    else:
                        kept.append(request)
                setattr(level, name, kept)
            level.forget_deadlines(itertools.chain(chosen, dropped))

    def _drop_cancelled(self, level: _Level) -> None:
        for name in ("queue", "delayed"):
            kept: deque[InferenceRequest] = deque()
            for request in getattr(level, name):
                if request.cancelled:
                    level.deadlines.pop(request, None)
                    self._forget(request)
                else:
                    kept.append(request)
            setattr(level, name, kept)

    def _forget(self, request: InferenceRequest) -> None:
        # A request cancelled by flag while queued leaves without a response.
        if self.orderer is not None:
            self.orderer.forget(request)


def answer_with_error(request: InferenceRequest, error: InferenceError, orderer: ResponseOrdering | None) -> None:
    """A scheduler's own final error answer to a request (where no ``reject`` was given), in the model's order."""
    request.done = True
    response = InferenceResponse([], error)
    if orderer is not None:
        orderer.deliver(request, response)
        return
    try:
        request.on_response(request, response)
    except Exception:  # one failing callback must not stop the scheduler
        logger.exception("response callback of request %r failed", request.id)
