"""The response cache: identical requests to a model bound with ``ModelConfig(response_cache=True)`` are answered
from memory, without reaching a worker.

A request's key hashes what decides its outputs: the model and version, each input's name, datatype, shape and
bytes, the requested outputs, and the request parameters other than scheduling ones (``priority``, ``timeout``).
The value is a copy of the successful response's outputs (taken out of shared memory). Entries are evicted least
recently used first so the cache holds at most ``ServeConfig.response_cache_bytes``. Failed and cancelled responses
are never stored, and a decoupled model cannot enable the cache (the core refuses to load it).

The core calls ``answer`` before scheduling a request: a hit is answered there and then; a miss gets its response
stored on the way back to the client. Statistics follow Triton: a hit counts as a success with no queue time and
no execution (``cache_hit`` = lookup time); a miss counts ``cache_miss`` = lookup + insertion time.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from pyserve.core.inference import InferenceRequest, InferenceResponse, OutputTensor

logger = logging.getLogger(__name__)

# Parameters that only steer scheduling: the same inputs give the same outputs whatever their values.
SCHEDULING_PARAMETERS = frozenset({"priority", "timeout"})
# Bookkeeping charged per entry and per output on top of the output bytes, so tiny responses cannot grow the
# cache without bound.
_ENTRY_OVERHEAD_BYTES = 128
_OUTPUT_OVERHEAD_BYTES = 64


@dataclass(slots=True)
class CachedResponse:
    """A stored response: output descriptors with their own copy of the bytes."""

    outputs: list[tuple[str, str, list[int], bytes]]
    parameters: dict[str, Any]
    nbytes: int

    def response(self) -> InferenceResponse:
        """A fresh response over the stored bytes."""
        outputs = [
            OutputTensor(name, datatype, list(shape), memoryview(data)) for name, datatype, shape, data in self.outputs
        ]
        return InferenceResponse(outputs, parameters=dict(self.parameters))


def request_key(request: InferenceRequest) -> bytes:
    """The cache key of a request (a 16-byte BLAKE2b digest)."""
    digest = hashlib.blake2b(digest_size=16)
    entry = request.model
    digest.update(f"{entry.name}\0{entry.version}\0".encode())
    for name in sorted(request.inputs):
        tensor = request.inputs[name]
        digest.update(f"{name}\0{tensor.datatype}\0{tensor.shape}\0{tensor.nbytes}\0".encode())
        digest.update(tensor.buffer())
    digest.update(orjson.dumps(sorted(request.requested_outputs)))
    parameters = {k: v for k, v in request.parameters.items() if k not in SCHEDULING_PARAMETERS}
    # Parameters the client sends are JSON values, so they always serialise; sorted keys make the order irrelevant.
    digest.update(orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))
    return digest.digest()


class ResponseCache:
    """An LRU map from request key to stored response, bounded in bytes; shared by every cached model."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes) -> CachedResponse | None:
        """The stored response of a key (now the most recently used), or None."""
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
        return cached

    def insert(self, key: bytes, response: InferenceResponse) -> bool:
        """Store a copy of a successful response; False when it is larger than the whole cache."""
        outputs = [(out.name, out.datatype, list(out.shape), bytes(out.buffer)) for out in response.outputs]
        nbytes = _ENTRY_OVERHEAD_BYTES + sum(len(data) + _OUTPUT_OVERHEAD_BYTES for *_, data in outputs)
        if nbytes > self.max_bytes:
            return False
        previous = self._entries.pop(key, None)
        if previous is not None:
            self.nbytes -= previous.nbytes
        while self._entries and self.nbytes + nbytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes
            self.evictions += 1
        self._entries[key] = CachedResponse(outputs, dict(response.parameters), nbytes)
        self.nbytes += nbytes
        return True

    def answer(self, request: InferenceRequest, respond: Any) -> bool:
        """Answer ``request`` from the cache through ``respond(request, response)`` and return True, or arrange for
        its successful response to be stored and return False (the caller schedules it)."""
        started = time.monotonic_ns()
        key = request_key(request)
        cached = self.lookup(key)
        stats = request.model.stats
        if cached is not None:
            response = cached.response()
            looked_up = time.monotonic_ns()
            request.arrival_ns = started
            scheduler = request.model.scheduler
            if scheduler is not None and scheduler.orderer is not None:
                scheduler.orderer.register(request)  # behind the requests that arrived before it
            respond(request, response)
            stats.record_cache_hit(looked_up - started, time.monotonic_ns() - started)
            return True
        lookup_ns = time.monotonic_ns() - started
        on_response = request.on_response

        def store_then_send(infer: InferenceRequest, response: InferenceResponse) -> None:
            if response.final and response.error is None and not infer.cancelled:
                inserting = time.monotonic_ns()
                self.insert(key, response)
                stats.record_cache_miss(lookup_ns + time.monotonic_ns() - inserting)
            on_response(infer, response)

        request.on_response = store_then_send
        return False

    def metrics(self) -> list[tuple[str, str, str, float]]:
        """(name, help, type, value) of the cache's own gauges and counters."""
        return [
            ("pyserve_response_cache_entries", "Responses held by the response cache", "gauge", len(self._entries)),
            ("pyserve_response_cache_bytes", "Bytes held by the response cache", "gauge", self.nbytes),
            (
                "pyserve_response_cache_limit_bytes",
                "Size limit of the response cache, in bytes",
                "gauge",
                self.max_bytes,
            ),
            (
                "pyserve_response_cache_evictions",
                "Responses evicted from the response cache to make room",
                "counter",
                self.evictions,
            ),
        ]
