"""Ensembles without processes: the graph checks, the checks against models, the Triton config, and the executor
driven by hand (fake submit, fake timers), as the core drives it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, Step, Tensor
from pyserve.config import ModelSpec
from pyserve.core.ensemble_executor import EnsembleExecutor, load_ensemble
from pyserve.core.infer_call import InferCall, build_request
from pyserve.core.inference import (
    BufferLease,
    InferenceRequest,
    InferenceResponse,
    InputTensor,
    Instance,
    ModelEntry,
    OutputTensor,
)
from pyserve.core.registry import Registry
from pyserve.ensemble import EnsembleSpec, check_models, spec_lookup
from pyserve.errors import (
    ConfigError,
    InvalidInputError,
    ModelExecutionError,
    ModelNotReadyError,
    RequestTimeoutError,
)


def fp32(name: str, shape: tuple[int, ...] = (-1,), optional: bool = False) -> Tensor:
    return Tensor(name, np.float32, shape, optional)


def model(name: str, inputs: list[Tensor], outputs: list[Tensor], **config: Any) -> ModelSpec:
    return ModelSpec(name, 1, tuple(inputs), tuple(outputs), ModelConfig(**{"max_batch_size": 8, **config}))


TOKENIZE = model("tokenize", [fp32("text")], [fp32("ids")])
CLASSIFY = model("classify", [fp32("ids")], [fp32("logits")])
LABEL = model("label", [fp32("logits")], [fp32("label")])
ADD = model("add", [fp32("a"), fp32("b")], [fp32("sum")])
MODELS = spec_lookup([TOKENIZE, CLASSIFY, LABEL, ADD])


def linear(**overrides: Any) -> EnsembleSpec:
    fields: dict[str, Any] = {
        "name": "pipeline",
        "version": 1,
        "inputs": (fp32("TEXT"),),
        "outputs": (fp32("LABEL"),),
        "steps": (
            Step("tokenize", {"text": "TEXT"}, {"ids": "ids"}),
            Step("classify", {"ids": "ids"}, {"logits": "logits"}),
            Step("label", {"logits": "logits"}, {"label": "LABEL"}),
        ),
        "max_batch_size": 8,
    }
    fields.update(overrides)
    return EnsembleSpec(**fields)


def diamond() -> EnsembleSpec:
    return EnsembleSpec(
        "diamond",
        1,
        (fp32("IN"),),
        (fp32("OUT"),),
        (
            Step("tokenize", {"text": "IN"}, {"ids": "left"}, name="left"),
            Step("classify", {"ids": "IN"}, {"logits": "right"}, name="right"),
            Step("add", {"a": "left", "b": "right"}, {"sum": "OUT"}, name="join"),
        ),
        max_batch_size=8,
    )


# the graph on its own ---------------------------------------------------------------------------------------------


def test_a_linear_pipeline_is_a_valid_graph_and_round_trips_over_the_wire() -> None:
    spec = linear()
    assert EnsembleSpec.from_wire(spec.to_wire()) == spec
    assert spec.labels() == ["tokenize", "classify", "label"]
    assert spec.producers() == {"ids": 0, "logits": 1, "LABEL": 2}
    check_models(spec, MODELS)


def test_a_step_maps_model_tensor_names_to_ensemble_tensor_names() -> None:
    step = Step("tokenize", inputs={"text": "TEXT"}, outputs={"ids": "ids"})
    assert step.inputs == {"text": "TEXT"}
    assert step.version is None
    with pytest.raises(ConfigError, match="at least one output"):
        Step("tokenize", {"text": "TEXT"}, {})
    with pytest.raises(ConfigError, match="same ensemble tensor"):
        Step("add", {"a": "A"}, {"sum": "X", "other": "X"})
    with pytest.raises(ConfigError, match="version"):
        Step("tokenize", {"text": "TEXT"}, {"ids": "ids"}, version=0)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            (Step("tokenize", {"text": "TEXT"}, {"ids": "TEXT"}),),
            "step 'tokenize' writes tensor 'TEXT', which is an input of the ensemble",
        ),
        (
            (
                Step("tokenize", {"text": "TEXT"}, {"ids": "LABEL"}),
                Step("classify", {"ids": "TEXT"}, {"logits": "LABEL"}),
            ),
            "tensor 'LABEL' is produced by both step 'tokenize' and step 'classify'",
        ),
        (
            (Step("tokenize", {"text": "nowhere"}, {"ids": "LABEL"}),),
            "step 'tokenize' input 'text' reads tensor 'nowhere', which is neither an ensemble input nor produced",
        ),
        (
            (Step("tokenize", {"text": "TEXT"}, {"ids": "ids"}),),
            "output 'LABEL' is not produced by any step",
        ),
    ],
)
def test_graph_mistakes_are_refused_with_the_step_and_tensor_named(steps: tuple[Step, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        linear(steps=steps)


def test_an_unused_ensemble_input_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"input\(s\) \['EXTRA'\] are not read by any step"):
        linear(inputs=(fp32("TEXT"), fp32("EXTRA")))


def test_a_cycle_is_refused_with_its_path() -> None:
    steps = (
        Step("tokenize", {"text": "TEXT"}, {"ids": "a"}),
        Step("add", {"a": "a", "b": "c"}, {"sum": "b"}, name="first"),
        Step("classify", {"ids": "b"}, {"logits": "c"}, name="second"),
        Step("label", {"logits": "b"}, {"label": "LABEL"}),
    )
    with pytest.raises(ConfigError, match=r"steps form a cycle: '(first|second)' -> '(first|second)' -> '\1'"):
        linear(steps=steps)


def test_unnamed_steps_of_a_repeated_model_are_labelled_by_position() -> None:
    steps = (
        Step("classify", {"ids": "TEXT"}, {"logits": "x"}),
        Step("classify", {"ids": "x"}, {"logits": "LABEL"}),
    )
    assert linear(steps=steps).labels() == ["classify#0", "classify#1"]
    with pytest.raises(ConfigError, match="duplicate step names"):
        linear(
            steps=(
                Step("classify", {"ids": "TEXT"}, {"logits": "x"}, name="s"),
                Step("label", {"logits": "x"}, {"label": "LABEL"}, name="s"),
            )
        )


def test_the_ensemble_name_and_tensors_are_checked_like_a_model() -> None:
    with pytest.raises(ConfigError, match="invalid model name"):
        linear(name="bad name")
    with pytest.raises(ConfigError, match="max_batch_size"):
        linear(max_batch_size=-1)
    with pytest.raises(ConfigError, match="at least one step"):
        linear(steps=())


# the graph against its models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("models", "steps", "message"),
    [
        ([CLASSIFY, LABEL], None, r"step 'tokenize': model 'tokenize' is not bound; bind the models of an ensemble"),
        (
            [model("tokenize", [fp32("text")], [fp32("ids")], decoupled=True), CLASSIFY, LABEL],
            None,
            "model 'tokenize' is decoupled",
        ),
        (
            [model("tokenize", [fp32("text")], [fp32("ids")], max_batch_size=4), CLASSIFY, LABEL],
            None,
            "model 'tokenize' takes batches of at most 4 rows, fewer than the ensemble's max_batch_size 8",
        ),
        (
            [model("tokenize", [fp32("text"), fp32("lang")], [fp32("ids")]), CLASSIFY, LABEL],
            None,
            "required input 'lang' of model 'tokenize' is not mapped",
        ),
        (
            [TOKENIZE, CLASSIFY, LABEL],
            (
                Step("tokenize", {"txt": "TEXT"}, {"ids": "ids"}),
                Step("classify", {"ids": "ids"}, {"logits": "logits"}),
                Step("label", {"logits": "logits"}, {"label": "LABEL"}),
            ),
            r"model 'tokenize' has no input 'txt' \(inputs: \['text'\]\)",
        ),
        (
            [TOKENIZE, CLASSIFY, LABEL],
            (
                Step("tokenize", {"text": "TEXT"}, {"tokens": "ids"}),
                Step("classify", {"ids": "ids"}, {"logits": "logits"}),
                Step("label", {"logits": "logits"}, {"label": "LABEL"}),
            ),
            r"model 'tokenize' has no output 'tokens' \(outputs: \['ids'\]\)",
        ),
        (
            [model("tokenize", [fp32("text")], [Tensor("ids", np.int64, (-1,))]), CLASSIFY, LABEL],
            None,
            "tensor 'ids' is INT64 from step 'tokenize' output 'ids' but step 'classify' input 'ids' expects FP32",
        ),
        (
            [
                model("tokenize", [fp32("text")], [fp32("ids", (16,))]),
                model("classify", [fp32("ids", (8,))], [fp32("logits")]),
                LABEL,
            ],
            None,
            r"tensor 'ids' has shape \[-1, 16\] from step 'tokenize' output 'ids', which does not fit shape \[-1, 8\]",
        ),
        (
            [TOKENIZE, CLASSIFY, model("label", [fp32("logits")], [Tensor("label", bytes, (1,))])],
            None,
            "tensor 'LABEL' is BYTES from step 'label' output 'label' but ensemble output 'LABEL' expects FP32",
        ),
    ],
)
def test_model_mismatches_are_refused_with_a_clear_message(
    models: list[ModelSpec], steps: tuple[Step, ...] | None, message: str
) -> None:
    spec = linear() if steps is None else linear(steps=steps)
    with pytest.raises(ConfigError, match=message):
        check_models(spec, spec_lookup(models))


def test_shapes_compare_with_the_batch_dimension_spelled_out() -> None:
    # A non-batching ensemble declares the batch dimension itself; -1 fits any size.
    spec = linear(inputs=(fp32("TEXT", (-1, -1)),), outputs=(fp32("LABEL", (-1, 1)),), max_batch_size=0)
    check_models(spec, MODELS)
    with pytest.raises(ConfigError, match="does not fit"):
        check_models(linear(inputs=(fp32("TEXT", (-1,)),), max_batch_size=0), MODELS)


def test_an_optional_ensemble_input_may_only_feed_optional_model_inputs() -> None:
    with pytest.raises(ConfigError, match="optional ensemble input 'TEXT' feeds step 'tokenize' input 'text'"):
        check_models(linear(inputs=(fp32("TEXT", optional=True),)), MODELS)


def test_a_pinned_version_must_exist() -> None:
    steps = (
        Step("tokenize", {"text": "TEXT"}, {"ids": "ids"}, version=2),
        Step("classify", {"ids": "ids"}, {"logits": "logits"}),
        Step("label", {"logits": "logits"}, {"label": "LABEL"}),
    )
    with pytest.raises(ConfigError, match="version 2 of model 'tokenize' is not bound"):
        check_models(linear(steps=steps), MODELS)


# the registry entry ---------------------------------------------------------------------------------------------------


def registry_with(*specs: ModelSpec, live: bool = True) -> Registry:
    registry = Registry()
    for index, spec in enumerate(specs):
        entry = ModelEntry(spec)
        if live:
            entry.instances.append(Instance(f"w{index}".encode(), 0, "thread", 1))
        registry.add(entry)
    return registry


def test_the_entry_serves_triton_shaped_metadata_and_config() -> None:
    registry = registry_with(TOKENIZE, CLASSIFY, LABEL)
    entry = load_ensemble(linear().to_wire(), registry)
    assert registry.get("pipeline") is entry
    assert entry.ready
    assert entry.metadata()["platform"] == "ensemble"
    config = entry.config_json()
    assert config["platform"] == "ensemble"
    assert config["max_batch_size"] == 8
    assert "instance_group" not in config and "dynamic_batching" not in config
    assert config["ensemble_scheduling"]["step"][0] == {
        "model_name": "tokenize",
        "model_version": -1,
        "input_map": {"text": "TEXT"},
        "output_map": {"ids": "ids"},
        "model_namespace": "",
    }
    assert entry.index_entry()["state"] == "READY"


def test_the_ensemble_is_ready_only_while_every_composing_model_is() -> None:
    registry = registry_with(TOKENIZE, CLASSIFY, LABEL)
    entry = load_ensemble(linear().to_wire(), registry)
    registry.get("classify").instances.clear()
    assert not entry.ready
    assert entry.index_entry()["reason"] == "composing model(s) not ready: classify"
    registry.remove("label", 1)
    assert not entry.ready


def test_the_core_checks_again_against_what_it_serves() -> None:
    with pytest.raises(ConfigError, match="model 'label' is not bound"):
        load_ensemble(linear().to_wire(), registry_with(TOKENIZE, CLASSIFY))
    with pytest.raises(ConfigError, match="a model named 'tokenize' is already bound"):
        load_ensemble(linear(name="tokenize").to_wire(), registry_with(TOKENIZE, CLASSIFY, LABEL))


# the executor ---------------------------------------------------------------------------------------------------------


class FakeTimer:
    def __init__(self, delay: float, callback: Callable[[], None]) -> None:
        self.delay = delay
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Harness:
    """The core around an executor: step requests are collected, answered by the test."""

    def __init__(self, spec: EnsembleSpec, *models: ModelSpec) -> None:
        self.registry = registry_with(*models)
        self.entry = load_ensemble(spec.to_wire(), self.registry)
        self.steps: list[InferenceRequest] = []
        self.cancelled: list[InferenceRequest] = []
        self.responses: list[InferenceResponse] = []
        self.timers: list[FakeTimer] = []
        self.on_response: Callable[[InferenceResponse], None] = self.responses.append
        self.executor = EnsembleExecutor(self.steps.append, self.cancel, self.respond, self.call_later)

    def cancel(self, request: InferenceRequest) -> None:
        request.cancelled = request.done = True
        self.cancelled.append(request)

    def respond(self, request: InferenceRequest, response: InferenceResponse) -> None:
        request.done = request.done or response.final
        self.on_response(response)

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(delay, callback)
        self.timers.append(timer)
        return timer

    def submit(self, value: np.ndarray, parameters: dict[str, Any] | None = None) -> InferenceRequest:
        inputs = {self.entry.spec.inputs[0].name: InputTensor("FP32", list(value.shape), value)}
        call = InferCall("r1", inputs, parameters or {}, [])
        self.entry.validate(inputs, [])
        request = build_request(self.entry, call, lambda request, response: self.respond(request, response))
        self.executor.submit(request)
        return request

    def step(self, model: str) -> InferenceRequest:
        (request,) = [r for r in self.steps if r.model.name == model and not r.done]
        return request

    @staticmethod
    def answer(request: InferenceRequest, outputs: dict[str, np.ndarray], lease: BufferLease | None = None) -> None:
        tensors = [
            OutputTensor(name, "FP32", list(value.shape), memoryview(value.tobytes()))
            for name, value in outputs.items()
        ]
        request.done = True
        request.on_response(request, InferenceResponse(tensors, lease=lease))


def test_a_diamond_runs_both_branches_at_once_then_joins_them() -> None:
    harness = Harness(diamond(), TOKENIZE, CLASSIFY, ADD)
    x = np.array([[1, 2]], np.float32)
    harness.submit(x)
    assert sorted(r.model.name for r in harness.steps) == ["classify", "tokenize"]  # both branches, no waiting
    left, right = harness.step("tokenize"), harness.step("classify")
    assert left.rows == 1 and left.signature
    assert np.array_equal(left.inputs["text"].data, x)
    harness.answer(left, {"ids": x * 2})
    assert len(harness.steps) == 2  # the join waits for its other input
    harness.answer(right, {"logits": x + 1})
    join = harness.step("add")
    # The join reads both branches' outputs in place: views of their buffers, not re-encoded copies.
    assert np.array_equal(join.inputs["a"].data, x * 2)
    assert np.array_equal(join.inputs["b"].data, x + 1)
    harness.answer(join, {"sum": x * 3 + 1})
    (response,) = harness.responses
    assert response.error is None
    (output,) = response.outputs
    assert output.name == "OUT"
    assert np.array_equal(output.to_numpy(), x * 3 + 1)
    stats = harness.entry.stats
    assert (stats.inference_count, stats.execution_count, stats.success.count) == (1, 1, 1)
    assert len(harness.executor) == 0


def test_a_failing_step_ends_the_request_with_its_name_and_error_and_withdraws_the_others() -> None:
    harness = Harness(diamond(), TOKENIZE, CLASSIFY, ADD)
    harness.submit(np.ones((1, 2), np.float32))
    left, right = harness.step("tokenize"), harness.step("classify")
    left.on_response(left, InferenceResponse([], ModelExecutionError("model 'tokenize' raised ValueError: bad")))
    (response,) = harness.responses
    assert isinstance(response.error, ModelExecutionError)
    assert str(response.error) == (
        "ensemble 'diamond' step 'left' (model 'tokenize') failed: model 'tokenize' raised ValueError: bad"
    )
    assert harness.cancelled == [right]
    harness.answer(right, {"logits": np.ones((1, 2), np.float32)})  # a late answer changes nothing
    assert len(harness.responses) == 1
    assert harness.entry.stats.fail.count == 1


def test_a_step_that_does_not_fit_its_model_at_run_time_fails_with_the_step_named() -> None:
    narrow = model("classify", [fp32("ids", (2,))], [fp32("logits", (2,))])
    spec = linear(inputs=(fp32("TEXT", (-1,)),))
    harness = Harness(spec, TOKENIZE, narrow, LABEL)
    harness.submit(np.ones((1, 3), np.float32))
    harness.answer(harness.step("tokenize"), {"ids": np.ones((1, 3), np.float32)})
    (response,) = harness.responses
    assert isinstance(response.error, InvalidInputError)
    assert "ensemble 'pipeline' step 'classify' (model 'classify') failed: input 'ids'" in str(response.error)


def test_a_cancelled_request_withdraws_its_steps_and_answers_nothing() -> None:
    harness = Harness(linear(), TOKENIZE, CLASSIFY, LABEL)
    request = harness.submit(np.ones((1, 2), np.float32))
    first = harness.step("tokenize")
    harness.executor.cancel(request)
    assert harness.cancelled == [first]
    harness.answer(first, {"ids": np.ones((1, 2), np.float32)})
    assert len(harness.steps) == 1  # stopped before the next step
    assert harness.responses == []


def test_the_deadline_is_passed_to_each_step_and_ends_the_request_when_it_passes() -> None:
    harness = Harness(linear(), TOKENIZE, CLASSIFY, LABEL)
    request = harness.submit(np.ones((1, 2), np.float32), {"timeout": 50_000})
    (timer,) = harness.timers
    assert timer.delay == pytest.approx(0.05, abs=0.01)
    first = harness.step("tokenize")
    assert first.deadline_ns == request.arrival_ns + 50_000_000
    timer.callback()
    (response,) = harness.responses
    assert isinstance(response.error, RequestTimeoutError)
    assert str(response.error) == "ensemble 'pipeline': the request's deadline passed while step 'tokenize' ran"
    assert harness.cancelled == [first]


def test_a_bad_timeout_parameter_is_refused() -> None:
    harness = Harness(linear(), TOKENIZE, CLASSIFY, LABEL)
    with pytest.raises(InvalidInputError, match="timeout 'soon' must be a whole number"):
        harness.submit(np.ones((1, 2), np.float32), {"timeout": "soon"})


def test_an_ensemble_whose_models_are_not_ready_refuses_requests() -> None:
    harness = Harness(linear(), TOKENIZE, CLASSIFY, LABEL)
    harness.registry.get("label").instances.clear()
    with pytest.raises(ModelNotReadyError, match="ensemble 'pipeline' version 1 is not ready: composing model"):
        harness.submit(np.ones((1, 2), np.float32))


def test_intermediate_tensors_keep_their_shared_memory_until_the_ensemble_is_answered() -> None:
    harness = Harness(linear(), TOKENIZE, CLASSIFY, LABEL)
    harness.submit(np.ones((1, 2), np.float32))
    freed: list[str] = []
    leases = {name: BufferLease(lambda name=name: freed.append(name)) for name in ("tokenize", "classify", "label")}
    for name, output in (("tokenize", "ids"), ("classify", "logits"), ("label", "label")):
        harness.answer(harness.step(name), {output: np.ones((1, 2), np.float32)}, leases[name])
        leases[name].drop()  # the core lets go once the callback returned: only the ensemble holds it now
        assert freed == [] or name == "label"
    assert sorted(freed) == ["classify", "label", "tokenize"]  # all let go once the response was delivered


def test_a_consumer_of_the_ensemble_response_can_retain_it_in_turn() -> None:
    harness = Harness(linear(), TOKENIZE, CLASSIFY, LABEL)
    harness.submit(np.ones((1, 2), np.float32))
    freed: list[str] = []
    kept: list[Callable[[], None]] = []
    harness.on_response = lambda response: kept.append(response.retain())
    for name, output in (("tokenize", "ids"), ("classify", "logits"), ("label", "label")):
        lease = BufferLease(lambda name=name: freed.append(name))
        harness.answer(harness.step(name), {output: np.ones((1, 2), np.float32)}, lease)
        lease.drop()
    assert freed == []
    kept[0]()
    kept[0]()  # a second release does nothing
    assert sorted(freed) == ["classify", "label", "tokenize"]


def test_buffer_lease_releases_once_when_the_last_holder_lets_go() -> None:
    released: list[int] = []
    lease = BufferLease(lambda: released.append(1))
    first, second = lease.acquire(), lease.acquire()
    lease.drop()
    first()
    assert released == []
    second()
    assert released == [1]
    response = InferenceResponse([])
    response.retain()()  # a response without a lease: nothing to hold
