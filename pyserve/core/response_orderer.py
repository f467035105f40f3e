"""Responses released in request arrival order, for models with ``DynamicBatcher.preserve_ordering``.

Batches of one model may finish out of order (several instances, or a decoupled model's partial responses); with
``preserve_ordering`` the client must still see the answers in the order its requests arrived. The model's
scheduler registers each accepted request here; the core passes every response of that model through
``ResponseOrderer.deliver``.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from pyserve.core.inference import InferenceRequest, InferenceResponse, OutputTensor, ResponseCallback

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _Awaited:
    request: InferenceRequest
    held: list[InferenceResponse] = field(default_factory=list)
    finished: bool = False


class ResponseOrderer:
    """Releases one model's responses in request arrival order (``DynamicBatcher.preserve_ordering``).

    Every accepted request is registered in arrival order (``ModelScheduler.submit`` does it); every response then
    goes through ``deliver``. A request's responses (a decoupled model's partial ones too, in their order) are held
    until every earlier request had its final response, then passed to ``send`` in order. Held outputs are copied,
    since their buffers may be reused once ``deliver`` returns. A registered request that will get no further
    response (cancelled before it ran) must be ``forget``-ed, or it holds back everything after it.
    """

    def __init__(self, send: ResponseCallback) -> None:
        self._send = send
        self._order: deque[_Awaited] = deque()
        self._awaited: dict[InferenceRequest, _Awaited] = {}

    def __len__(self) -> int:
        """Requests registered and not yet finished and released."""
        return len(self._order)

    def register(self, request: InferenceRequest) -> None:
        """Give the request its place: after every request registered before it."""
        if request not in self._awaited:
            awaited = _Awaited(request)
            self._order.append(awaited)
            self._awaited[request] = awaited

    def deliver(self, request: InferenceRequest, response: InferenceResponse) -> None:
        """Send the response now if every earlier request is finished, else hold it (unregistered: send now)."""
        awaited = self._awaited.get(request)
        if awaited is None:
            self._emit(request, response)
            return
        if awaited is not self._order[0]:
            awaited.held.append(_detached(response))
            awaited.finished = awaited.finished or response.final
            return
        if response.final:
            awaited.finished = True
            self._order.popleft()
            del self._awaited[request]
        self._emit(request, response)
        if response.final:
            self._release()

    def forget(self, request: InferenceRequest) -> None:
        """The request gets no further response: stop holding later requests for it."""
        awaited = self._awaited.get(request)
        if awaited is None:
            return
        awaited.finished = True
        if awaited is self._order[0]:
            self._release()

    def _release(self) -> None:
        # Pass on what the requests now at the front hold, up to and including the first unfinished one (first in
        # line now, so its later responses go straight through).
        order = self._order
        while order:
            awaited = order[0]
            held, awaited.held = awaited.held, []
            if awaited.finished:
                order.popleft()
                del self._awaited[awaited.request]
            for response in held:
                self._emit(awaited.request, response)
            if not awaited.finished:
                return

    def _emit(self, request: InferenceRequest, response: InferenceResponse) -> None:
        try:
            self._send(request, response)
        except Exception:
            # One failing callback must not hold back the responses of every later request.
            logger.exception("sending a response of request %r failed", request.id)


def _detached(response: InferenceResponse) -> InferenceResponse:
    if not response.outputs:
        return response
    outputs = [
        OutputTensor(out.name, out.datatype, out.shape, memoryview(bytes(out.buffer))) for out in response.outputs
    ]
    return InferenceResponse(outputs, response.error, response.final, response.parameters)
