"""Ensembles in the core: a registry entry served like a model, and the executor that runs its steps.

An ``EnsembleEntry`` answers metadata, config (``platform: "ensemble"`` with Triton's ``ensemble_scheduling``),
statistics and readiness like any model; requests for it reach ``EnsembleExecutor`` instead of a scheduler. The
executor runs each request's steps as ordinary requests of their models — each through its model's scheduler, so
it is batched with the model's other traffic — starting every step as soon as the tensors it reads exist, so
independent steps run concurrently. Nothing is encoded between steps: a step's outputs stay where its worker put
them (a shared-memory slot of its pool, retained until the ensemble is done with them, or the ZeroMQ frame they
came in) and the next step reads them from there. A failing step ends the request with the step's name and error;
a cancelled request, or one whose deadline passed, stops before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pyserve.core.deadline import deadline_ns
from pyserve.core.infer_call import InferCall, build_request
from pyserve.core.inference import (
    BufferLease,
    InferenceRequest,
    InferenceResponse,
    InputTensor,
    ModelEntry,
    OutputTensor,
)
from pyserve.core.registry import Registry
from pyserve.core.stats import BACKEND, CANCELED, OTHER, REJECTED
from pyserve.core.tracing import child_traceparent
from pyserve.ensemble import EnsembleSpec, check_models
from pyserve.errors import (
    CancelledError,
    ConfigError,
    InferenceError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelNotReadyError,
    OutputMismatchError,
    QueueFullError,
    RequestTimeoutError,
)

logger = logging.getLogger(__name__)

Submit = Callable[[InferenceRequest], None]
Respond = Callable[[InferenceRequest, InferenceResponse], None]
CallLater = Callable[[float, Callable[[], None]], Any]
DeadlockCheck = Callable[[InferenceRequest], "InferenceError | None"]


@dataclass(frozen=True, slots=True)
class _StepPlan:
    label: str
    model: str
    version: int | None
    inputs: tuple[tuple[str, str], ...]  # (model input, ensemble tensor)
    outputs: dict[str, str]  # model output -> ensemble tensor
    requested: tuple[str, ...]  # the model outputs the step asks for
    waits_for: int  # how many tensors produced by other steps it reads


class EnsembleEntry(ModelEntry):
    """An ensemble in the registry. Ready while every composing model is."""

    def __init__(self, ensemble: EnsembleSpec, registry: Registry) -> None:
        super().__init__(ensemble.model_spec())
        self.ensemble = ensemble
        self._registry = registry
        producers = ensemble.producers()
        self.steps: list[_StepPlan] = []
        # produced tensor -> the steps reading it (each step once)
        self.consumers: dict[str, list[int]] = {}
        for index, (step, label) in enumerate(zip(ensemble.steps, ensemble.labels(), strict=True)):
            produced = sorted({t for t in step.inputs.values() if t in producers})
            for tensor in produced:
                self.consumers.setdefault(tensor, []).append(index)
            self.steps.append(
                _StepPlan(
                    label=label,
                    model=step.model,
                    version=step.version,
                    inputs=tuple(step.inputs.items()),
                    outputs=dict(step.outputs),
                    requested=tuple(step.outputs),
                    waits_for=len(produced),
                )
            )
        self.first_steps = [index for index, step in enumerate(self.steps) if not step.waits_for]

    def step_entry(self, index: int) -> ModelEntry:
        """The model a step runs (looked up each time: models may be unloaded). Raises ModelNotFoundError."""
        step = self.steps[index]
        return self._registry.get(step.model, step.version)

    def composing(self) -> list[ModelEntry]:
        """The models the steps run, in step order (those that are bound)."""
        entries = []
        for index in range(len(self.steps)):
            try:
                entries.append(self.step_entry(index))
            except ModelNotFoundError:
                continue
        return entries

    @property
    def ready(self) -> bool:
        """Ready while every step's model is bound and ready."""
        try:
            return all(self.step_entry(index).ready for index in range(len(self.steps)))
        except ModelNotFoundError:
            return False

    def index_entry(self) -> dict[str, Any]:
        """This ensemble in the repository index (no instances of its own)."""
        composing = self.composing()
        missing = [e.name for e in composing if not e.ready]
        if len(composing) < len(self.steps):
            missing.append("(unbound)")
        ready = not missing
        return {
            "name": self.name,
            "version": str(self.version),
            "state": "READY" if ready else "UNAVAILABLE",
            "reason": "" if ready else f"composing model(s) not ready: {', '.join(sorted(set(missing)))}",
        }

    def metadata(self, versions: list[int] | None = None) -> dict[str, Any]:
        """Model metadata, with Triton's platform for ensembles."""
        doc = super().metadata(versions)
        doc["platform"] = "ensemble"
        return doc

    def config_json(self) -> dict[str, Any]:
        """The Triton-shaped config of an ensemble: ``platform: "ensemble"`` and ``ensemble_scheduling.step[]``."""
        doc = super().config_json()
        doc["platform"] = "ensemble"
        doc["backend"] = ""
        for key in ("dynamic_batching", "instance_group"):
            doc.pop(key, None)
        doc["ensemble_scheduling"] = {
            "step": [
                {
                    "model_name": step.model,
                    "model_version": step.version if step.version is not None else -1,
                    "input_map": dict(step.inputs),
                    "output_map": dict(step.outputs),
                    "model_namespace": "",
                }
                for step in self.ensemble.steps
            ]
        }
        return doc


def load_ensemble(wire: dict[str, Any], registry: Registry) -> EnsembleEntry:
    """Check an ensemble sent by ``Serve.bind_ensemble`` against the registry and add it. Raises ConfigError."""
    spec = EnsembleSpec.from_wire(wire)

    def lookup(name: str, version: int | None) -> Any:
        try:
            return registry.get(name, version).spec
        except ModelNotFoundError:
            return None

    if registry.versions(spec.name) and not all(isinstance(e, EnsembleEntry) for e in registry.versions(spec.name)):
        raise ConfigError(f"a model named '{spec.name}' is already bound; an ensemble needs a name of its own")
    check_models(spec, lookup)
    entry = EnsembleEntry(spec, registry)
    registry.add(entry)
    return entry


@dataclass(eq=False)
class _Run:
    """One ensemble request on its way through the steps."""

    request: InferenceRequest
    entry: EnsembleEntry
    deadline_ns: int
    waiting: list[int]  # per step: tensors still missing
    remaining: int  # steps not finished
    tensors: dict[str, InputTensor]  # ensemble tensor -> what the next steps read
    produced: dict[str, OutputTensor] = field(default_factory=dict)
    running: dict[InferenceRequest, int] = field(default_factory=dict)  # step request -> step index
    releases: list[Callable[[], None]] = field(default_factory=list)  # retained step outputs
    timer: Any = None
    finished: bool = False


class EnsembleExecutor:
    """Runs ensemble requests: ``submit`` starts one, ``cancel`` stops one whose client went away.

    ``submit_step`` queues a step's request with its model (the core's ``submit``), ``cancel_step`` withdraws one
    and ``respond`` answers the ensemble request. ``deadlock_check``, when set, is asked about every step
    submitted; an error it returns fails the step (BLS callers may be waiting on the ensemble).
    """

    def __init__(
        self, submit_step: Submit, cancel_step: Submit, respond: Respond, call_later: CallLater | None = None
    ) -> None:
        self._submit_step = submit_step
        self._cancel_step = cancel_step
        self._respond = respond
        self._call_later = call_later
        self._runs: dict[InferenceRequest, _Run] = {}
        self.deadlock_check: DeadlockCheck | None = None

    def __len__(self) -> int:
        """Ensemble requests in flight."""
        return len(self._runs)

    def submit(self, request: InferenceRequest) -> None:
        """Start an ensemble request (already validated against the ensemble's tensors)."""
        entry = request.model
        assert isinstance(entry, EnsembleEntry)
        if not entry.ready:
            raise ModelNotReadyError(f"ensemble '{entry.name}' version {entry.version} is not ready: {_why(entry)}")
        request.arrival_ns = time.monotonic_ns()
        deadline = deadline_ns(request)
        run = _Run(
            request=request,
            entry=entry,
            deadline_ns=deadline,
            waiting=[step.waits_for for step in entry.steps],
            remaining=len(entry.steps),
            tensors=dict(request.inputs),
        )
        self._runs[request] = run
        if deadline:
            call_later = self._call_later or asyncio.get_running_loop().call_later
            run.timer = call_later(max(deadline - request.arrival_ns, 0) / 1e9, partial(self._on_deadline, run))
        self._start(run, entry.first_steps)

    def cancel(self, request: InferenceRequest) -> None:
        """The client went away: withdraw the running steps, answer nothing."""
        run = self._runs.get(request)
        if run is not None:
            self._end(run)

    def children(self, request: InferenceRequest) -> list[InferenceRequest]:
        """The step requests an ensemble request is waiting on now."""
        run = self._runs.get(request)
        return list(run.running) if run is not None else []

    # steps ------------------------------------------------------------------------------------------------------

    def _start(self, run: _Run, indexes: list[int]) -> None:
        for index in indexes:
            if run.finished:
                return
            self._start_step(run, index)

    def _start_step(self, run: _Run, index: int) -> None:
        step = run.entry.steps[index]
        if run.deadline_ns and time.monotonic_ns() >= run.deadline_ns:
            self._fail(run, RequestTimeoutError(f"{self._where(run, index)}: the request's deadline passed before it"))
            return
        request = run.request
        step_request: InferenceRequest | None = None
        try:
            entry = run.entry.step_entry(index)
            inputs = {name: run.tensors[tensor] for name, tensor in step.inputs if tensor in run.tensors}
            requested = list(step.requested)
            entry.validate(inputs, requested)
            call = InferCall(request.id, inputs, dict(request.parameters), requested)
            step_request = build_request(entry, call, partial(self._on_step_response, run, index))
            step_request.reply_spin = run.request.reply_spin
            step_request.deadline_ns = run.deadline_ns
            step_request.traceparent = child_traceparent(request)  # a traced run's steps join its trace
            run.running[step_request] = index
            self._submit_step(step_request)
        except InferenceError as exc:  # refused: the step never ran
            if step_request is not None:
                run.running.pop(step_request, None)
            if not run.finished:
                self._fail_step(run, index, exc)
            return
        if self.deadlock_check is not None and not step_request.done:
            error = self.deadlock_check(step_request)
            if error is not None and run.running.pop(step_request, None) is not None:
                self._cancel_step(step_request)
                self._fail_step(run, index, error)

    def _on_step_response(
        self, run: _Run, index: int, step_request: InferenceRequest, response: InferenceResponse
    ) -> None:
        if run.finished or not response.final:
            return  # a finished run keeps nothing; steps are never decoupled
        run.running.pop(step_request, None)
        if response.error is not None:
            self._fail_step(run, index, response.error)
            return
        step = run.entry.steps[index]
        got = {output.name for output in response.outputs}
        missing = [name for name in step.requested if name not in got]
        if missing:
            self._fail_step(run, index, OutputMismatchError(f"the model did not return output(s) {missing}"))
            return
        run.releases.append(response.retain())
        ready: list[int] = []
        consumers = run.entry.consumers
        for output in response.outputs:
            tensor = step.outputs.get(output.name)
            if tensor is None:
                continue
            run.produced[tensor] = output
            if tensor in consumers:
                run.tensors[tensor] = _as_input(output)
                for consumer in consumers[tensor]:
                    run.waiting[consumer] -= 1
                    if not run.waiting[consumer]:
                        ready.append(consumer)
        run.remaining -= 1
        if not run.remaining:
            self._succeed(run)
        else:
            self._start(run, ready)

    # the end of a run -------------------------------------------------------------------------------------------

    def _succeed(self, run: _Run) -> None:
        request = run.request
        wanted = request.requested_outputs or [t.name for t in run.entry.spec.outputs]
        outputs = []
        for name in wanted:
            output = run.produced[name]
            outputs.append(OutputTensor(name, output.datatype, output.shape, output.buffer, output.shm))
        releases = run.releases
        run.releases = []
        lease = BufferLease(partial(_release_all, releases))
        self._end(run)
        stats = run.entry.stats
        now = time.monotonic_ns()
        # Queue and compute times are the composing models' own (in their statistics); the ensemble counts its
        # requests, rows and end-to-end durations.
        stats.record_execution(request.rows, 1, 0, 0, 0)
        stats.queue.add(0)
        stats.success.add(now - request.arrival_ns)
        try:
            self._respond(request, InferenceResponse(outputs, lease=lease))
        finally:
            lease.drop()

    def _fail_step(self, run: _Run, index: int, error: InferenceError) -> None:
        self._fail(run, type(error)(f"{self._where(run, index)} failed: {error}"))

    def _fail(self, run: _Run, error: InferenceError) -> None:
        if run.finished:
            return
        self._end(run)
        stats = run.entry.stats
        stats.record_failed_execution()
        stats.record_failure(_failure_reason(error), time.monotonic_ns() - run.request.arrival_ns)
        self._respond(run.request, InferenceResponse([], error))

    def _end(self, run: _Run) -> None:
        """Stop a run: withdraw its running steps, let go of what it retained, forget it."""
        if run.finished:
            return
        run.finished = True
        self._runs.pop(run.request, None)
        if run.timer is not None:
            run.timer.cancel()
            run.timer = None
        running = list(run.running)
        run.running.clear()
        for step_request in running:
            self._cancel_step(step_request)
        releases = run.releases
        run.releases = []
        _release_all(releases)

    def _on_deadline(self, run: _Run) -> None:
        run.timer = None
        if run.finished:
            return
        labels = [f"'{run.entry.steps[i].label}'" for i in sorted(run.running.values())]
        during = f" while step {', '.join(labels)} ran" if labels else ""
        self._fail(run, RequestTimeoutError(f"ensemble '{run.entry.name}': the request's deadline passed{during}"))

    @staticmethod
    def _where(run: _Run, index: int) -> str:
        step = run.entry.steps[index]
        return f"ensemble '{run.entry.name}' step '{step.label}' (model '{step.model}')"


def _as_input(output: OutputTensor) -> InputTensor:
    """A step's output as the next step's input, in place: a numpy view of its buffer (BYTES stay encoded)."""
    if output.datatype == "BYTES":
        return InputTensor(output.datatype, list(output.shape), output.buffer)
    return InputTensor(output.datatype, list(output.shape), output.to_numpy())


def _failure_reason(error: InferenceError) -> str:
    if isinstance(error, (RequestTimeoutError, QueueFullError)):
        return REJECTED
    if isinstance(error, CancelledError):
        return CANCELED
    if isinstance(error, ModelExecutionError):
        return BACKEND
    return OTHER


def _release_all(releases: list[Callable[[], None]]) -> None:
    for release in releases:
        release()


def _why(entry: EnsembleEntry) -> str:
    return entry.index_entry()["reason"] or "composing models are not ready"
