"""A request's way through the core: in (``submit``), out early (``cancel``), and its answers back (``respond``).

Every request enters through ``RequestFlow.submit``, whoever made it: a front end, a BLS call or an ensemble step.
An ensemble's request goes to the ensemble executor; a cached answer is given at once; the rest queue at their
model's scheduler, which hands them to ``BatchesInFlight`` in batches. Whatever answers a request later — a batch
result, a queue timeout, an unloaded model, the shutdown — answers through ``respond``, which keeps the model's
response order (``preserve_ordering``) and calls the request's callback.

Tracing and per-request logs wrap a request's callback in ``submit`` when they are on, so a request they follow is
closed when it is answered; ``cancel`` and a refused ``submit`` close it here, since no answer follows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pyserve.core.cache import ResponseCache
from pyserve.core.ensemble_executor import EnsembleEntry, EnsembleExecutor
from pyserve.core.inference import InferenceRequest, InferenceResponse
from pyserve.core.logs import LogSettings
from pyserve.core.stats import CANCELED, REJECTED
from pyserve.core.tracing import Tracing
from pyserve.errors import CancelledError, InferenceError, ModelNotReadyError, QueueFullError

logger = logging.getLogger(__name__)


class RequestFlow:
    """Submits and cancels requests; ``ensembles`` runs the ensemble requests among them.

    ``cancel_running(request)`` is told of a cancelled request that is no longer queued: it may be running in a
    batch, whose instance should stop working on it.
    """

    def __init__(
        self,
        tracing: Tracing,
        logs: LogSettings,
        cache: ResponseCache | None,
        cancel_running: Callable[[InferenceRequest], None],
    ) -> None:
        self._tracing = tracing
        self._logs = logs
        self._cache = cache
        self._cancel_running = cancel_running
        self.ensembles = EnsembleExecutor(self.submit, self.cancel, respond)

    def submit(self, request: InferenceRequest) -> None:
        """Queue a validated request on its model's scheduler (an ensemble's goes to the ensemble executor).

        Raises the request's InferenceError when it is refused at once (it then gets no response)."""
        entry = request.model
        if request.stamps is not None:  # ServeConfig.stage_times
            request.stamps.append(time.monotonic_ns())
        if self._tracing.active:
            self._tracing.begin(request)
        if self._logs.log_requests:
            self._logs.watch(request)
        try:
            if isinstance(entry, EnsembleEntry):
                self.ensembles.submit(request)
                return
            if not entry.ready or entry.scheduler is None:
                raise ModelNotReadyError(f"model '{entry.name}' version {entry.version} is not ready")
            # A cache hit is answered here and never reaches a worker.
            if entry.response_cache and self._cache is not None and self._cache.answer(request, respond):
                return
            entry.scheduler.submit(request)
        except InferenceError as exc:
            if isinstance(exc, QueueFullError):
                entry.stats.record_failure(REJECTED, 0)
            self._ended_unanswered(request, exc)
            raise

    def cancel(self, request: InferenceRequest) -> None:
        """The client went away: a queued request is dropped; a running one gets its cancel flag set."""
        if request.cancelled or request.done:
            return
        request.cancelled = True
        request.done = True
        self._ended_unanswered(request, CancelledError("the request was cancelled"))
        if isinstance(request.model, EnsembleEntry):
            self.ensembles.cancel(request)
            return
        scheduler = request.model.scheduler
        if scheduler is not None:
            if scheduler.cancel(request):
                request.model.stats.record_failure(CANCELED, time.monotonic_ns() - request.arrival_ns)
                return
            if scheduler.orderer is not None:
                scheduler.orderer.forget(request)
        self._cancel_running(request)

    def _ended_unanswered(self, request: InferenceRequest, error: InferenceError) -> None:
        # A request refused by submit() or cancelled gets no response through its callback: close its trace and
        # request log here.
        if request.trace is not None:
            self._tracing.end(request, error)
        if self._logs.log_requests:
            self._logs.finished(request, error, request.arrival_ns or time.monotonic_ns())


# answers -----------------------------------------------------------------------------------------------------------


def respond(request: InferenceRequest, response: InferenceResponse) -> None:
    """Answer a request (once more, for a decoupled model's partial responses), in its model's response order.

    Nothing reaches a request after its final response; a cancelled request's answer becomes CancelledError."""
    if request.done:
        return
    if response.final:
        request.done = True
    if request.cancelled and response.error is None:
        response = InferenceResponse([], CancelledError("the request was cancelled"))
    scheduler = request.model.scheduler
    if scheduler is not None and scheduler.orderer is not None:
        scheduler.orderer.deliver(request, response)
    else:
        deliver(request, response)


def deliver(request: InferenceRequest, response: InferenceResponse) -> None:
    """Call the request's callback now (what the response orderer calls, in order)."""
    try:
        request.on_response(request, response)
    except Exception:
        logger.exception("response callback of request %r failed", request.id)


def fail(request: InferenceRequest, error: InferenceError) -> None:
    """Answer a request with an error."""
    respond(request, InferenceResponse([], error))


def reject(request: InferenceRequest, error: InferenceError) -> None:
    """The scheduler refused a queued request (its timeout expired): a failure of the model, answered with it."""
    request.model.stats.record_failure(REJECTED, time.monotonic_ns() - request.arrival_ns)
    fail(request, error)
