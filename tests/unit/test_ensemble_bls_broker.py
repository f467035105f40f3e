"""The core's BLS broker without processes: calls decoded and submitted like front-end requests, replies to the
calling instance, deadlines, and the deadlock rule (a call is refused at once when it could only run on instances
that are themselves waiting on it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, Tensor
from pyserve.config import ModelSpec
from pyserve.core.bls_broker import BlsBroker
from pyserve.core.ensemble_executor import EnsembleExecutor
from pyserve.core.inference import BufferLease, InferenceRequest, InferenceResponse, Instance, ModelEntry, OutputTensor
from pyserve.core.registry import Registry
from pyserve.errors import (
    DeadlockError,
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    RequestTimeoutError,
    UnsupportedError,
)
from pyserve.transport.protocol import BlsCancel, BlsFree, BlsRequest, BlsResponse, Header, TensorDescriptor
from pyserve.transport.shm import ShmReader


def spec(name: str, instances: int = 1, decoupled: bool = False) -> ModelSpec:
    tensor = (Tensor("x", np.float32, (-1,)),)
    return ModelSpec(name, 1, tensor, tensor, ModelConfig(max_batch_size=8, instances=instances, decoupled=decoupled))


@dataclass
class Batch:
    requests: list[InferenceRequest]
    instance: Instance


@dataclass
class Timer:
    delay: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeCore:
    """Registry, instances and a one-line scheduler: a request runs at once on an idle instance, else it queues."""

    registry: Registry = field(default_factory=Registry)
    instances: dict[bytes, tuple[Instance, ModelEntry, str]] = field(default_factory=dict)
    batches: dict[int, Batch] = field(default_factory=dict)
    sent: list[tuple[bytes, Header, list[Any] | None]] = field(default_factory=list)
    cancelled: list[InferenceRequest] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)
    busy: set[Instance] = field(default_factory=set)

    def __post_init__(self) -> None:
        ensembles = EnsembleExecutor(self.submit, self.cancel, lambda request, response: None)
        self.broker = BlsBroker(
            self.registry,
            self.instances,
            self.batches,
            ShmReader(),
            send=lambda identity, header, frames: self.sent.append((identity, header, frames)),
            submit=self.submit,
            cancel=self.cancel,
            ensembles=ensembles,
            call_later=self.call_later,
        )

    def add_model(self, model: ModelSpec) -> list[Instance]:
        entry = ModelEntry(model)
        self.registry.add(entry)
        for index in range(model.config.instances):
            identity = f"{model.name}{index}".encode()
            instance = Instance(identity, index, "thread", 1)
            entry.instances.append(instance)
            self.instances[identity] = (instance, entry, "")
        return entry.instances

    def run(self, instance: Instance, parameters: dict[str, Any] | None = None) -> InferenceRequest:
        """A client request running on ``instance`` (the batch its function is serving)."""
        entry = self.instances[instance.identity][1]
        request = InferenceRequest(entry, "outer", {}, parameters or {}, [], 1, lambda r, s: None, arrival_ns=1)
        self._dispatch(request, instance)
        return request

    def submit(self, request: InferenceRequest) -> None:
        idle = [i for i in request.model.instances if i not in self.busy]
        if idle:
            self._dispatch(request, idle[0])

    def _dispatch(self, request: InferenceRequest, instance: Instance) -> None:
        batch_id = len(self.batches) + 1
        self.batches[batch_id] = Batch([request], instance)
        request.batch_id = instance.batch_id = batch_id
        self.busy.add(instance)

    def cancel(self, request: InferenceRequest) -> None:
        request.cancelled = request.done = True
        self.cancelled.append(request)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        self.timers.append(Timer(delay, callback))
        return self.timers[-1]

    def call(
        self,
        caller: Instance,
        model: str,
        call_id: int = 1,
        *,
        inputs: list[TensorDescriptor] | None = None,
        parameters: dict[str, Any] | None = None,
        timeout_us: int = 0,
    ) -> BlsResponse | None:
        """The caller sends a call (input x: ones, FP32 [1, 2]); returns what the broker answered at once, if
        anything."""
        data = np.ones((1, 2), np.float32)
        inputs = inputs or [["x", "FP32", [1, 2], 0]]
        header = BlsRequest.build(call_id, model, None, inputs, parameters or {}, [], "", False, timeout_us)
        before = len(self.sent)
        self.broker.on_message(caller.identity, header, [memoryview(data.tobytes())])
        replies = [h for identity, h, _ in self.sent[before:] if identity == caller.identity]
        return BlsResponse(replies[-1]) if replies else None

    def last_reply(self) -> BlsResponse:
        """The last message the broker sent, a response to a call."""
        return BlsResponse(self.sent[-1][1])

    def inner(self, call_id: int = 1, caller: Instance | None = None) -> InferenceRequest:
        calls = self.broker._calls  # what the broker submitted
        (call,) = [c for (identity, cid), c in calls.items() if cid == call_id and caller in (None, c.caller)]
        assert call.request is not None
        return call.request


def test_a_call_is_submitted_like_a_request_and_answered_to_its_caller() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    core.add_model(spec("b"))
    core.run(a0)
    assert core.call(a0, "b", parameters={"k": "v"}) is None  # running on b's instance, no answer yet
    inner = core.inner()
    assert inner.model.name == "b" and inner.parameters == {"k": "v"} and inner.batch_id
    assert np.array_equal(inner.inputs["x"].data, np.ones((1, 2), np.float32))
    out = np.full((1, 2), 7, np.float32)
    inner.on_response(inner, InferenceResponse([OutputTensor("x", "FP32", [1, 2], memoryview(out.tobytes()))]))
    identity, header, frames = core.sent[-1]
    assert identity == a0.identity
    reply = BlsResponse(header)
    assert (reply.call_id, reply.outputs, reply.final, reply.lease, reply.error) == (
        1,
        [["x", "FP32", [1, 2], 0]],
        True,
        None,
        None,
    )
    assert frames is not None and bytes(frames[0]) == out.tobytes()
    assert len(core.broker) == 0


def test_outputs_in_shared_memory_travel_as_locations_held_until_the_caller_frees_them() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    core.add_model(spec("b"))
    core.run(a0)
    core.call(a0, "b")
    inner = core.inner()
    freed: list[bool] = []
    lease = BufferLease(lambda: freed.append(True))
    output = OutputTensor("x", "FP32", [1, 2], memoryview(bytes(8)), ["seg-1", 8])
    inner.on_response(inner, InferenceResponse([output], lease=lease))
    lease.drop()  # the core's own hold ends after the callbacks
    reply = core.last_reply()
    assert reply.outputs == [["x", "FP32", [1, 2], ["seg-1", 8]]]
    assert freed == [] and reply.lease is not None
    core.broker.on_message(a0.identity, BlsFree.build(reply.lease), [])
    assert freed == [True]


def test_errors_reach_the_caller_with_their_kind() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    core.add_model(spec("b"))
    core.add_model(spec("streams", decoupled=True))
    core.run(a0)
    reply = core.call(a0, "missing")
    assert reply is not None and isinstance(reply.error, ModelNotFoundError)
    assert str(reply.error) == "Request for unknown model: 'missing' is not found"
    reply = core.call(a0, "streams")
    assert reply is not None and isinstance(reply.error, UnsupportedError)
    assert "call it with pyserve.infer_stream()" in str(reply.error)
    reply = core.call(a0, "b", inputs=[["y", "FP32", [1, 2], 0]])
    assert reply is not None and isinstance(reply.error, InvalidInputError)
    core.call(a0, "b", call_id=9)
    inner = core.inner(9)
    inner.on_response(inner, InferenceResponse([], ModelExecutionError("model 'b' raised")))
    reply = core.last_reply()
    assert (reply.call_id, reply.final) == (9, True)
    assert isinstance(reply.error, ModelExecutionError) and str(reply.error) == "model 'b' raised"


def test_a_model_calling_itself_with_one_instance_fails_at_once() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    core.run(a0)
    reply = core.call(a0, "a")
    assert reply is not None and isinstance(reply.error, DeadlockError)
    assert str(reply.error).startswith("BLS call from model 'a' to model 'a' would deadlock")
    assert "'a' instance 0 waits on 'a'" in str(reply.error)
    assert len(core.cancelled) == 1 and len(core.broker) == 0


def test_recursion_works_while_an_instance_is_free_and_stops_when_none_can_be() -> None:
    core = FakeCore()
    a0, a1 = core.add_model(spec("a", instances=2))
    core.run(a0)
    assert core.call(a0, "a") is None  # runs on a1
    assert core.inner().batch_id and a1 in core.busy
    reply = core.call(a1, "a", call_id=2)  # a1 would wait on a0, which waits on a1
    assert reply is not None and isinstance(reply.error, DeadlockError)


def test_two_models_calling_each_other_from_separate_requests_is_refused_when_the_cycle_closes() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    (b0,) = core.add_model(spec("b"))
    core.run(a0)
    core.run(b0)
    assert core.call(a0, "b") is None  # b0 is busy but not waiting: a0's call just queues
    reply = core.call(b0, "a", call_id=2)
    assert reply is not None and isinstance(reply.error, DeadlockError)
    assert "'a' instance 0 waits on 'b'; 'b' instance 0 waits on 'a'" in str(reply.error)
    assert len(core.broker) == 1  # a0's call stays: it runs once b0's function is done


def test_a_busy_target_that_is_not_waiting_is_no_deadlock() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    (b0,) = core.add_model(spec("b"))
    core.run(b0)
    core.run(a0)
    assert core.call(a0, "b") is None
    assert core.cancelled == []


def test_the_call_gets_what_is_left_of_the_callers_deadline() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    core.add_model(spec("b"))
    outer = core.run(a0, {"timeout": 10**12})  # arrival 1 ns, a deadline far ahead
    core.call(a0, "b")
    inner = core.inner()
    assert inner.deadline_ns == outer.arrival_ns + 10**15
    (timer,) = core.timers
    timer.callback()
    assert isinstance(core.last_reply().error, RequestTimeoutError)
    assert core.cancelled == [inner]


def test_a_call_whose_deadline_already_passed_is_refused() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    core.add_model(spec("b"))
    core.run(a0, {"timeout": 1})  # arrived at 1 ns with 1 µs: long gone
    reply = core.call(a0, "b")
    assert reply is not None and isinstance(reply.error, RequestTimeoutError)


def test_the_callers_own_timeout_applies_when_shorter() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    core.add_model(spec("b"))
    core.run(a0)
    core.call(a0, "b", timeout_us=250_000)
    (timer,) = core.timers
    assert timer.delay == pytest.approx(0.25, abs=0.05)


def test_withdrawn_and_orphaned_calls_are_cancelled() -> None:
    core = FakeCore()
    (a0,) = core.add_model(spec("a"))
    core.add_model(spec("b", instances=2))
    core.run(a0)
    core.call(a0, "b", call_id=1)
    core.call(a0, "b", call_id=2)
    first, second = core.inner(1), core.inner(2)
    core.broker.on_message(a0.identity, BlsCancel.build(1), [])
    assert core.cancelled == [first]
    freed: list[bool] = []
    lease = BufferLease(lambda: freed.append(True))
    output = OutputTensor("x", "FP32", [1, 2], memoryview(bytes(8)), ["seg", 8])
    second.on_response(second, InferenceResponse([output], final=False, lease=lease))
    lease.drop()
    core.broker.instance_gone(a0.identity)  # the caller died: its call and what it held go
    assert core.cancelled == [first, second]
    assert freed == [True]
