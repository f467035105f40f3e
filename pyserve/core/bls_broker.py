"""BLS in the core: requests that model functions make to other models, over their instance's own socket.

A worker sends a ``BlsRequest`` (``pyserve.transport.protocol``: the model, its inputs inline or in the worker's pool
like a result, parameters, outputs, whether it streams, its own timeout); the broker validates it as a front end
would, builds an ordinary request and submits it, so it is scheduled and batched with the model's other traffic.
Each response goes back to the caller as a ``BlsResponse``: outputs, or the error. Outputs that sit in a worker's
shared-memory slot travel as their location: the broker retains the response under a lease, which the caller hands
back with ``BlsFree`` once it has copied them. ``BlsCancel`` withdraws a call the caller no longer waits for.
The same messages come from the Serve process for ``Serve.infer`` (a local caller, on a socket of its own): it
holds no instance while it waits, so it has no outer deadline and takes no part in deadlocks.

Deadlines: a call gets what is left of the deadline of the batch its caller is running (see ``deadline``), or the
caller's own ``timeout`` if shorter; when it passes, the caller hears ``RequestTimeoutError`` and the call is
withdrawn.

Deadlocks: an instance waiting on a call cannot serve anything else. The broker keeps the wait-for graph (which
instance waits on which request; a request is queued at a model, running on an instance, or an ensemble waiting on
its steps) and refuses, at once, a call that would close a knot in it: a set of waiting instances none of which can
ever be freed because everything they wait on needs one of them. A model calling itself with one instance is the
simplest case; two models calling each other, or recursion deeper than the model's instances, are others. The
caller gets ``DeadlockError``; nothing hangs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from pyserve.core.deadline import batch_deadline_ns, earliest
from pyserve.core.ensemble_executor import EnsembleEntry, EnsembleExecutor
from pyserve.core.infer_call import InferCall, build_request, check_parameter_names, tensor_from_binary
from pyserve.core.inference import InferenceRequest, InferenceResponse, InputTensor, Instance, ModelEntry
from pyserve.core.registry import Registry
from pyserve.core.remote_peers import is_remote
from pyserve.dtypes import DATATYPES
from pyserve.errors import (
    DeadlockError,
    InferenceError,
    InvalidInputError,
    ModelNotReadyError,
    RequestTimeoutError,
    UnsupportedError,
)
from pyserve.transport.messages import read_buffer
from pyserve.transport.protocol import (
    BlsCancel,
    BlsFree,
    BlsRequest,
    BlsResponse,
    Header,
    MessageKind,
    TensorDescriptor,
    kind_of,
)
from pyserve.transport.shm import ShmReader

Send = Callable[[bytes, Header, "list[Any] | None"], None]
Submit = Callable[[InferenceRequest], None]
CallLater = Callable[[float, Callable[[], None]], Any]


class RunningBatch(Protocol):
    """What the broker reads of a dispatched batch (the core's PendingBatch)."""

    requests: list[InferenceRequest]
    instance: Instance


@dataclass(eq=False)
class _Call:
    identity: bytes
    call_id: int
    caller: Instance | None  # None: a local caller (Serve.infer), which holds no instance while it waits
    caller_model: str
    request: InferenceRequest | None = None
    timer: Any = None
    done: bool = False


class BlsBroker:
    """Serves the BLS calls of every instance connected to the core."""

    def __init__(
        self,
        registry: Registry,
        instances: Mapping[bytes, tuple[Instance, ModelEntry, str]],
        batches: Mapping[int, RunningBatch],
        reader: ShmReader,
        *,
        send: Send,
        submit: Submit,
        cancel: Submit,
        ensembles: EnsembleExecutor,
        call_later: CallLater | None = None,
    ) -> None:
        self._registry = registry
        self._instances = instances
        self._batches = batches
        self._reader = reader
        self._send = send
        self._submit = submit
        self._cancel = cancel
        self._ensembles = ensembles
        self._call_later = call_later
        self._calls: dict[tuple[bytes, int], _Call] = {}
        # Sockets of the Serve process that made calls (Serve.infer): answered like instances, never deadlocked.
        self._local_callers: set[bytes] = set()
        # The server is draining (graceful shutdown): calls from instances still run (the requests in flight need
        # them), new calls from the Serve process (Serve.infer) are refused like any new request.
        self.draining = False
        self._leases: dict[tuple[bytes, int], Callable[[], None]] = {}
        self._next_lease = 0
        ensembles.deadlock_check = self.check_step

    def __len__(self) -> int:
        """Calls in flight."""
        return len(self._calls)

    def on_message(self, identity: bytes, header: Header, frames: list[Any]) -> None:
        """A ``bls``, ``bls_cancel`` or ``bls_free`` message from an instance."""
        kind = kind_of(header)
        if kind == MessageKind.BLS_REQUEST:
            self._on_call(identity, BlsRequest(header), frames)
        elif kind == MessageKind.BLS_CANCEL:
            call = self._calls.get((identity, BlsCancel(header).call_id))
            if call is not None:
                self._withdraw(call)
        elif kind == MessageKind.BLS_FREE:
            release = self._leases.pop((identity, BlsFree(header).lease), None)
            if release is not None:
                release()

    def instance_gone(self, identity: bytes) -> None:
        """An instance disconnected or died: withdraw its calls, let go of what it had not freed."""
        for key in [key for key in self._calls if key[0] == identity]:
            self._withdraw(self._calls[key])
        for key in [key for key in self._leases if key[0] == identity]:
            self._leases.pop(key)()

    # calls ------------------------------------------------------------------------------------------------------

    def _on_call(self, identity: bytes, message: BlsRequest, frames: list[Any]) -> None:
        known = self._instances.get(identity)
        if known is None:
            # Not an instance: a local caller in the Serve process (Serve.infer), answered the same way.
            self._local_callers.add(identity)
            call = _Call(identity, message.call_id, None, "")
            if self.draining:
                self._send_error(call, ModelNotReadyError("the server is shutting down: it takes no new requests"))
                return
        else:
            call = _Call(identity, message.call_id, known[0], known[1].name)
        caller = call.caller
        now = time.monotonic_ns()
        try:
            entry = self._registry.get(message.model, message.version)
            if entry.spec.config.decoupled and not message.stream:
                raise UnsupportedError(
                    f"model '{entry.name}' is decoupled (streaming): call it with pyserve.infer_stream()"
                )
            inputs = self._inputs(message.inputs, frames)
            parameters = message.parameters
            check_parameter_names(parameters)
            requested = message.outputs
            entry.validate(inputs, requested)
            batch = self._batches.get(caller.batch_id) if caller is not None else None
            outer = batch_deadline_ns(batch.requests) if batch is not None else 0
            timeout_us = message.timeout_us
            own = now + timeout_us * 1000 if timeout_us else 0
            deadline = earliest(outer, own)
            if deadline and deadline <= now:
                raise RequestTimeoutError(
                    f"BLS call to model '{entry.name}': the deadline of the request that made it has passed"
                )
            request = build_request(
                entry, InferCall(message.request_id, inputs, parameters, requested), partial(self._on_response, call)
            )
        except InferenceError as exc:
            self._send_error(call, exc)
            return
        request.deadline_ns = deadline
        call.request = request
        self._calls[(identity, call.call_id)] = call
        try:
            self._submit(request)
        except InferenceError as exc:
            self._finish(call)
            self._send_error(call, exc)
            return
        if call.done:
            return  # answered at once
        blocked = self._deadlocked() if caller is not None else set()
        if caller in blocked:
            error = DeadlockError(
                f"BLS call from model '{call.caller_model}' to model '{entry.name}' would deadlock: it can only "
                "run on an instance that is itself waiting, directly or through other calls, for this call to "
                f"finish ({self._describe(blocked)}). Give the models in that cycle more instances, or do not call "
                "back into them."
            )
            self._withdraw(call)
            self._send_error(call, error)
            return
        if deadline:
            call_later = self._call_later or asyncio.get_running_loop().call_later
            call.timer = call_later(max(deadline - now, 0) / 1e9, partial(self._on_deadline, call))

    def _inputs(self, descriptors: list[TensorDescriptor], frames: list[Any]) -> dict[str, InputTensor]:
        inputs: dict[str, InputTensor] = {}
        for name, datatype, shape, loc in descriptors:
            if name in inputs:
                raise InvalidInputError(f"input '{name}' appears more than once")
            if datatype not in DATATYPES:
                raise InvalidInputError(f"input '{name}': unknown datatype {datatype!r}")
            inputs[name] = tensor_from_binary(name, datatype, list(shape), read_buffer(loc, frames, self._reader))
        return inputs

    def _on_response(self, call: _Call, request: InferenceRequest, response: InferenceResponse) -> None:
        if call.done:
            return
        if response.final:
            self._finish(call)
        if response.error is not None:
            self._send_error(call, response.error)
            return
        if not self._reachable(call):
            return
        descriptors: list[TensorDescriptor] = []
        frames: list[Any] = []
        in_shm = False
        # A remote caller cannot read this host's segments: its outputs go in the frames.
        inline = is_remote(call.identity)
        for output in response.outputs:
            if output.shm is not None and not inline:
                loc: Any = output.shm
                in_shm = True
            else:
                frames.append(output.buffer)
                loc = len(frames) - 1
            descriptors.append([output.name, output.datatype, output.shape, loc])
        lease = None
        if in_shm:
            # The caller reads the slots in place and frees them with bls_free once it has its copy.
            self._next_lease += 1
            lease = self._next_lease
            self._leases[(call.identity, lease)] = response.retain()
        self._send(call.identity, BlsResponse.build(call.call_id, descriptors, response.final, lease), frames)

    def _on_deadline(self, call: _Call) -> None:
        call.timer = None
        if call.done or call.request is None:
            return
        model = call.request.model.name
        self._withdraw(call)
        self._send_error(
            call,
            RequestTimeoutError(
                f"BLS call to model '{model}' did not finish before its deadline (what was left of the deadline of "
                "the request that made it, or its own timeout)"
            ),
        )

    def _finish(self, call: _Call) -> None:
        call.done = True
        self._calls.pop((call.identity, call.call_id), None)
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None

    def _withdraw(self, call: _Call) -> None:
        if call.done:
            return
        self._finish(call)
        if call.request is not None:
            self._cancel(call.request)

    def _send_error(self, call: _Call, error: InferenceError) -> None:
        if self._reachable(call):
            self._send(call.identity, BlsResponse.build_error(call.call_id, error), None)

    def _reachable(self, call: _Call) -> bool:
        return call.identity in self._instances or call.identity in self._local_callers

    # deadlocks --------------------------------------------------------------------------------------------------

    def check_step(self, request: InferenceRequest) -> InferenceError | None:
        """Whether an ensemble step just submitted can never run because BLS callers hold what it needs."""
        if not self._calls:
            return None
        blocked = self._deadlocked()
        if blocked and self._stuck(request, blocked):
            return DeadlockError(
                f"model '{request.model.name}' can never take this step: every instance that could run it is "
                f"waiting, directly or through other calls, for the ensemble to finish ({self._describe(blocked)})"
            )
        return None

    def _deadlocked(self) -> set[Instance]:
        """The instances waiting on calls that can never finish (the greatest set closed under "stuck")."""
        waits: dict[Instance, list[InferenceRequest]] = {}
        for call in self._calls.values():
            if call.caller is not None and call.request is not None and not call.done:
                waits.setdefault(call.caller, []).append(call.request)
        blocked = set(waits)
        changed = True
        while changed and blocked:
            changed = False
            for instance in list(blocked):
                if not any(self._stuck(request, blocked) for request in waits[instance]):
                    blocked.discard(instance)
                    changed = True
        return blocked

    def _stuck(self, request: InferenceRequest, blocked: set[Instance]) -> bool:
        """Whether ``request`` can only progress through an instance in ``blocked``."""
        if request.done:
            return False
        if isinstance(request.model, EnsembleEntry):
            return any(self._stuck(step, blocked) for step in self._ensembles.children(request))
        if request.batch_id:
            batch = self._batches.get(request.batch_id)
            return batch is not None and batch.instance in blocked
        instances = request.model.instances
        return bool(instances) and all(instance in blocked for instance in instances)

    def _describe(self, blocked: set[Instance]) -> str:
        waits = sorted(
            {
                f"'{call.caller_model}' instance {call.caller.index} waits on '{call.request.model.name}'"
                for call in self._calls.values()
                if call.caller is not None and call.caller in blocked and call.request is not None and not call.done
            }
        )
        return "; ".join(waits)
