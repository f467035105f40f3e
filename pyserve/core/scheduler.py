"""Per-model scheduling: a FIFO queue, the dynamic batcher, and dispatch to idle instances.

Batches count rows (a request of batch 8 is 8 rows), up to ``max_batch_size``. Only requests with the same
signature (input names, datatypes and non-batch dimensions) share a batch, so the worker can lay their rows out
contiguously. A batch goes at once when it is full or at a preferred size, when the delay is 0, or when more
requests are queued than fit (requests of another signature never fit); otherwise it waits until the oldest
request has waited ``max_queue_delay_microseconds``. Time and timers are injected so the logic is unit-tested
with a fake clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from pyserve.core.inference import InferenceRequest
from pyserve.core.registry import Instance, ModelEntry


class TimerHandle(Protocol):
    """What a timer factory returns (asyncio.TimerHandle fits)."""

    def cancel(self) -> None: ...


Dispatch = Callable[[list[InferenceRequest], Instance], None]
CallLater = Callable[[float, Callable[[], None]], TimerHandle]


class ModelScheduler:
    """Queues one model version's requests and hands batches to its idle instances."""

    def __init__(
        self,
        entry: ModelEntry,
        dispatch: Dispatch,
        call_later: CallLater,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.entry = entry
        self._dispatch = dispatch
        self._call_later = call_later
        self._clock = clock
        self.queue: deque[InferenceRequest] = deque()
        self._idle: deque[Instance] = deque()
        self._timer: TimerHandle | None = None
        config = entry.spec.config
        batcher = config.batcher if config.dynamic_batching else None
        self._batching = batcher is not None
        self._max_rows = max(config.max_batch_size, 1)
        self._delay_ns = batcher.max_queue_delay_microseconds * 1000 if batcher else 0
        self._preferred = sorted(batcher.preferred_batch_size) if batcher else []

    # instances -------------------------------------------------------------------------------------------------

    def add_instance(self, instance: Instance) -> None:
        """A newly connected instance: idle, so it may take queued work at once."""
        self._idle.append(instance)
        self.schedule()

    def remove_instance(self, instance: Instance) -> None:
        """An instance that went away."""
        if instance in self._idle:
            self._idle.remove(instance)

    def instance_done(self, instance: Instance) -> None:
        """An instance finished its batch and is idle again."""
        instance.busy = False
        self._idle.append(instance)
        self.schedule()

    # requests --------------------------------------------------------------------------------------------------

    def submit(self, request: InferenceRequest) -> None:
        """Queue a request and dispatch what can go now."""
        request.arrival_ns = self._clock()
        self.queue.append(request)
        if self._idle:
            self.schedule()

    def schedule(self) -> None:
        """Dispatch batches while instances are idle and a batch is due."""
        while self._idle and self.queue:
            batch = self._next_batch()
            if batch is None:
                return
            instance = self._idle.popleft()
            instance.busy = True
            self._dispatch(batch, instance)

    def drain(self) -> list[InferenceRequest]:
        """Remove and return every queued request (model unloaded or server stopping)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = list(self.queue)
        self.queue.clear()
        return pending

    def _next_batch(self) -> list[InferenceRequest] | None:
        queue = self.queue
        while queue and queue[0].cancelled:
            queue.popleft()
        if not queue:
            return None
        if not self._batching:
            return [queue.popleft()]
        head = queue[0]
        signature = head.signature
        rows = 0
        picked: list[InferenceRequest] = []
        more_waiting = False  # a request of this signature does not fit
        others_waiting = False  # a request of another signature can never join this batch
        for request in queue:
            if request.cancelled:
                continue
            if request.signature != signature:
                others_waiting = True
                continue
            if rows + request.rows > self._max_rows:
                more_waiting = True
                break
            picked.append(request)
            rows += request.rows
        # Waiting would hold up requests that cannot join this batch (as Triton sends a pending batch at once
        # when the next request's shape does not match it).
        if rows < self._max_rows and not more_waiting and not others_waiting and self._delay_ns:
            deadline = head.arrival_ns + self._delay_ns
            now = self._clock()
            if rows not in self._preferred and now < deadline:
                self._arm_timer(deadline - now)
                return None
        if more_waiting and self._preferred and rows not in self._preferred:
            picked = self._trim_to_preferred(picked)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._remove(picked)
        return picked

    def _trim_to_preferred(self, picked: list[InferenceRequest]) -> list[InferenceRequest]:
        # More is queued than fits: send the largest preferred size the rows reach exactly, else all picked.
        best: int | None = None
        total = 0
        for count, request in enumerate(picked, start=1):
            total += request.rows
            if total in self._preferred:
                best = count
        return picked[:best] if best is not None else picked

    def _remove(self, picked: list[InferenceRequest]) -> None:
        queue = self.queue
        if all(queue[i] is request for i, request in enumerate(picked)):
            for _ in picked:
                queue.popleft()
            return
        chosen = {id(r) for r in picked}
        kept = [r for r in queue if id(r) not in chosen and not r.cancelled]
        queue.clear()
        queue.extend(kept)

    def _arm_timer(self, wait_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._call_later(wait_ns / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.schedule()

    def stats_snapshot(self) -> dict[str, Any]:
        """Queue depth and idle instances (for diagnostics)."""
        return {"queued": len(self.queue), "idle_instances": len(self._idle)}
