"""Tests of pyserve.config: declaring tensors and models, the wire form of a spec, and ServeConfig.from_env."""

from __future__ import annotations

import os
import re

import ml_dtypes
import msgpack
import numpy as np
import pytest

from pyserve.config import (
    DynamicBatcher,
    ModelConfig,
    ModelSpec,
    QueuePolicy,
    ServeConfig,
    Tensor,
    TimeoutAction,
    WorkerKind,
    as_tensors,
    header_pattern,
)
from pyserve.core.infer_call import forward_headers
from pyserve.errors import ConfigError, InvalidInputError


def spec(name: str = "identity", config: ModelConfig | None = None, **kwargs: object) -> ModelSpec:
    """A one-input, one-output model spec."""
    values: dict[str, object] = {
        "version": 1,
        "inputs": (Tensor("INPUT0", np.float32),),
        "outputs": (Tensor("OUTPUT0", np.float32),),
        "config": config or ModelConfig(),
    }
    values.update(kwargs)
    return ModelSpec(name, **values)  # type: ignore[arg-type]


# Tensor ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "datatype"),
    [
        (np.float32, "FP32"),
        (np.dtype(np.float16), "FP16"),
        ("float64", "FP64"),
        (np.int8, "INT8"),
        (np.uint64, "UINT64"),
        (int, "INT64"),
        (float, "FP64"),
        (bool, "BOOL"),
        (np.bool_, "BOOL"),
        (bytes, "BYTES"),
        (object, "BYTES"),
        (str, "BYTES"),
        (np.bytes_, "BYTES"),
        (np.str_, "BYTES"),
        ("bfloat16", "BF16"),
        (ml_dtypes.bfloat16, "BF16"),
        ("BF16", "BF16"),
        ("fp32", "FP32"),
        ("TYPE_STRING", "BYTES"),
        ("TYPE_INT32", "INT32"),
    ],
)
def test_tensor_maps_dtype_to_datatype(dtype: object, datatype: str) -> None:
    tensor = Tensor("x", dtype)
    assert tensor.datatype == datatype
    assert tensor.dtype is dtype  # the declaration keeps what the user wrote


def test_tensor_numpy_dtype_is_what_the_infer_function_sees() -> None:
    assert Tensor("x", np.float32).numpy_dtype == np.dtype(np.float32)
    assert Tensor("x", bytes).numpy_dtype == np.dtype(object)
    assert Tensor("x", "bfloat16").numpy_dtype == np.dtype(ml_dtypes.bfloat16)


def test_tensor_defaults_to_one_variable_dimension() -> None:
    tensor = Tensor("x", np.float32)
    assert tensor.shape == (-1,)
    assert tensor.optional is False


def test_tensor_shape_is_normalised_to_a_tuple_of_ints() -> None:
    assert Tensor("x", np.float32, [2, np.int64(3), -1]).shape == (2, 3, -1)


def test_tensors_with_the_same_datatype_are_equal() -> None:
    assert Tensor("x", np.float32, (3,)) == Tensor("x", "FP32", (3,))
    assert hash(Tensor("x", bytes)) == hash(Tensor("x", "BYTES"))
    assert Tensor("x", np.float32) != Tensor("x", np.float64)
    assert Tensor("x", np.float32) != Tensor("y", np.float32)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (-2,), (4, -5)])
def test_tensor_rejects_bad_dimensions(shape: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError, match=r"tensor 'x': dimension -?\d+ in shape .* must be > 0 or -1"):
        Tensor("x", np.float32, shape)


def test_tensor_rejects_a_shape_that_is_not_a_sequence() -> None:
    with pytest.raises(ConfigError, match="tensor 'x': shape must be a sequence of ints, got 3"):
        Tensor("x", np.float32, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [np.complex64, "float128x", "no-such-type", None, np.dtype("datetime64[s]")])
def test_tensor_rejects_unsupported_dtypes(dtype: object) -> None:
    with pytest.raises(ConfigError, match="dtype"):
        Tensor("x", dtype)


@pytest.mark.parametrize("name", [3, b"x", ["x"]])
def test_tensor_rejects_names_that_are_not_strings(name: object) -> None:
    with pytest.raises(ConfigError, match="tensor name must be a string"):
        Tensor(name, np.float32)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", None])
def test_a_tensor_may_leave_its_name_to_bind(name: str | None) -> None:
    tensor = Tensor(name, np.float32, (2,))  # type: ignore[arg-type]
    assert tensor.name == ""
    assert Tensor(dtype=np.float32, shape=(2,)) == tensor


def test_a_tensor_needs_a_dtype() -> None:
    with pytest.raises(ConfigError, match="tensor 'x': dtype is required"):
        Tensor("x")
    with pytest.raises(ConfigError, match="unnamed tensor: dtype is required"):
        Tensor(shape=(3,))


def test_as_tensors_accepts_a_single_tensor_or_a_sequence() -> None:
    x = Tensor("x", np.float32)
    assert as_tensors(x, "inputs") == (x,)
    assert as_tensors([x], "inputs") == (x,)
    with pytest.raises(ConfigError, match="inputs must be a list of Tensor, got 5"):
        as_tensors(5, "inputs")  # type: ignore[arg-type]


def test_as_tensors_names_unnamed_tensors_by_their_place() -> None:
    inputs = as_tensors([Tensor(dtype=np.float32), Tensor("mask", bool), Tensor(dtype=bytes, shape=(1,))], "inputs")
    assert [t.name for t in inputs] == ["INPUT_1", "mask", "INPUT_3"]
    assert inputs[2] == Tensor("INPUT_3", bytes, (1,))
    outputs = as_tensors([Tensor(dtype=np.int64), Tensor(dtype=np.int64)], "outputs")
    assert [t.name for t in outputs] == ["OUTPUT_1", "OUTPUT_2"]


def test_a_spec_built_by_hand_needs_named_tensors() -> None:
    with pytest.raises(ConfigError, match=r"model 'identity': input .* has no name"):
        spec(inputs=(Tensor(dtype=np.float32),))
    with pytest.raises(ConfigError, match=r"duplicate input names \['INPUT_1'\]"):
        spec(inputs=as_tensors([Tensor(dtype=np.float32), Tensor("INPUT_1", np.float32)], "inputs"))


# ModelConfig, DynamicBatcher, QueuePolicy -----------------------------------------------------------------------


def test_model_config_defaults_have_no_batching() -> None:
    config = ModelConfig()
    assert config.max_batch_size == 0
    assert config.batcher == DynamicBatcher()
    assert config.dynamic_batching is False
    assert config.worker is WorkerKind.THREAD


def test_dynamic_batching_needs_a_batcher_and_a_batch_dimension() -> None:
    assert ModelConfig(max_batch_size=8).dynamic_batching is True
    assert ModelConfig(max_batch_size=8, batcher=None).dynamic_batching is False


def test_batching_false_means_no_batch_dimension_and_no_batcher() -> None:
    config = ModelConfig(batching=False)
    assert (config.max_batch_size, config.batcher, config.dynamic_batching) == (0, None, False)
    assert ModelConfig(batching=False, batcher=None, decoupled=True).decoupled
    # batching=True (the default) leaves it to max_batch_size.
    assert ModelConfig(batching=True, max_batch_size=16).dynamic_batching
    assert not ModelConfig(batching=True).dynamic_batching


def test_batching_false_refuses_what_contradicts_it() -> None:
    with pytest.raises(ConfigError, match=r"batching=False means max_batch_size 0 .* got max_batch_size 8"):
        ModelConfig(batching=False, max_batch_size=8)
    with pytest.raises(ConfigError, match="batching=False means no dynamic batcher"):
        ModelConfig(batching=False, batcher=DynamicBatcher(max_queue_delay_microseconds=100))


def test_dynamic_batcher_takes_none_for_its_defaults() -> None:
    # PyTriton's DynamicBatcher leaves these None.
    batcher = DynamicBatcher(preferred_batch_size=None, default_queue_policy=None, priority_queue_policy=None)  # type: ignore[arg-type]
    assert batcher == DynamicBatcher()
    assert DynamicBatcher(preferred_batch_size=[4, 8]).preferred_batch_size == (4, 8)  # type: ignore[arg-type]


def test_model_config_rejects_negative_max_batch_size() -> None:
    with pytest.raises(ConfigError, match="max_batch_size must be >= 0, got -1"):
        ModelConfig(max_batch_size=-1)


def test_model_config_rejects_preferred_batch_size_above_max() -> None:
    with pytest.raises(ConfigError, match=r"preferred_batch_size \[16\] exceeds max_batch_size 8"):
        ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=(4, 16)))


@pytest.mark.parametrize("instances", [0, -1])
def test_model_config_rejects_fewer_than_one_instance(instances: int) -> None:
    with pytest.raises(ConfigError, match=f"instances must be >= 1, got {instances}"):
        ModelConfig(instances=instances)


def test_model_config_takes_worker_kind_by_name() -> None:
    assert ModelConfig(worker="process").worker is WorkerKind.PROCESS  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="worker must be one of 'thread', 'process', 'ray', got 'gpu'"):
        ModelConfig(worker="gpu")  # type: ignore[arg-type]


def test_dynamic_batcher_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="max_queue_delay_microseconds must be >= 0"):
        DynamicBatcher(max_queue_delay_microseconds=-1)
    with pytest.raises(ConfigError, match="preferred_batch_size must be positive"):
        DynamicBatcher(preferred_batch_size=(4, 0))
    with pytest.raises(ConfigError, match="priority_levels must be >= 0"):
        DynamicBatcher(priority_levels=-1)


@pytest.mark.parametrize("default", [0, 4])
def test_dynamic_batcher_default_priority_level_must_be_a_level(default: int) -> None:
    with pytest.raises(ConfigError, match=rf"default_priority_level {default} must be in 1\.\.3"):
        DynamicBatcher(priority_levels=3, default_priority_level=default)
    assert DynamicBatcher(priority_levels=3, default_priority_level=3).default_priority_level == 3


@pytest.mark.parametrize(("levels", "level"), [(2, 3), (2, 0), (0, 1)])
def test_dynamic_batcher_priority_queue_policy_levels_must_exist(levels: int, level: int) -> None:
    with pytest.raises(ConfigError, match=f"priority_queue_policy level {level} is outside 1..{levels}"):
        DynamicBatcher(
            priority_levels=levels,
            default_priority_level=min(levels, 1),
            priority_queue_policy={level: QueuePolicy()},
        )


def test_queue_policy_takes_timeout_action_by_name_and_rejects_negatives() -> None:
    assert QueuePolicy(timeout_action="DELAY").timeout_action is TimeoutAction.DELAY  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout_action must be one of 'REJECT', 'DELAY', got 'DROP'"):
        QueuePolicy(timeout_action="DROP")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be >= 0"):
        QueuePolicy(default_timeout_microseconds=-1)
    with pytest.raises(ConfigError, match="must be >= 0"):
        QueuePolicy(max_queue_size=-1)


# ModelSpec ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["identity", "a", "Model_1.v2-final", "_private", "9lives", "x" * 128])
def test_model_spec_accepts_valid_names(name: str) -> None:
    assert spec(name).name == name


@pytest.mark.parametrize("name", ["", "-dash", ".dot", "has space", "slash/name", "x" * 129, "é"])
def test_model_spec_rejects_invalid_names(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid model name"):
        spec(name)


@pytest.mark.parametrize("version", [0, -1, "1", 1.0, True])
def test_model_spec_rejects_bad_versions(version: object) -> None:
    with pytest.raises(ConfigError, match="model 'identity': version must be an integer >= 1"):
        spec(version=version)


def test_model_spec_rejects_duplicate_tensor_names() -> None:
    with pytest.raises(ConfigError, match=r"model 'm': duplicate input names \['a'\]"):
        spec("m", inputs=(Tensor("a", np.float32), Tensor("b", np.float32), Tensor("a", np.int32)))
    with pytest.raises(ConfigError, match=r"model 'm': duplicate output names \['y'\]"):
        spec("m", outputs=(Tensor("y", np.float32), Tensor("y", np.float32)))


def test_model_spec_needs_inputs_and_outputs_that_are_tensors() -> None:
    with pytest.raises(ConfigError, match="model 'm': at least one input is required"):
        spec("m", inputs=())
    with pytest.raises(ConfigError, match="model 'm': at least one output is required"):
        spec("m", outputs=())
    with pytest.raises(ConfigError, match="model 'm': inputs must be Tensor objects"):
        spec("m", inputs=("INPUT0",))


def test_model_spec_wire_round_trip_keeps_everything() -> None:
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=100,
        preferred_batch_size=(4, 8),
        preserve_ordering=True,
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=QueuePolicy(TimeoutAction.DELAY, 500, True, 10),
        priority_queue_policy={1: QueuePolicy(max_queue_size=3), 2: QueuePolicy(TimeoutAction.REJECT, 7)},
    )
    original = ModelSpec(
        "full",
        3,
        inputs=(Tensor("text", bytes, (1,)), Tensor("mask", bool, (-1, 4), optional=True)),
        outputs=(Tensor("score", np.float16, (2,)), Tensor("emb", "bfloat16", (-1,))),
        config=ModelConfig(
            max_batch_size=8,
            batcher=batcher,
            decoupled=True,
            instances=2,
            devices=("cuda:0", "cuda:1"),
            worker=WorkerKind.PROCESS,
            response_cache=True,
            parameters={"k": "v"},
        ),
        strict=True,
    )
    wire = original.to_wire()
    assert wire["batcher"]["priority_queue_policy"] == {"1": ["REJECT", 0, False, 3], "2": ["REJECT", 7, False, 0]}
    rebuilt = ModelSpec.from_wire(wire)
    assert rebuilt == original
    assert rebuilt.config.batcher == batcher
    assert rebuilt.to_wire() == wire


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(),
        ModelConfig(max_batch_size=4, batcher=None),
        ModelConfig(max_batch_size=4),
        ModelConfig(batching=False),
    ],
    ids=["no-batch-dim", "batcher-off", "default-batcher", "batching-false"],
)
def test_model_spec_wire_round_trip_of_simple_configs(config: ModelConfig) -> None:
    original = spec(config=config)
    rebuilt = ModelSpec.from_wire(original.to_wire())
    assert rebuilt == original
    assert rebuilt.config.dynamic_batching == config.dynamic_batching


def test_model_spec_wire_form_survives_msgpack() -> None:
    batcher = DynamicBatcher(priority_levels=1, default_priority_level=1, priority_queue_policy={1: QueuePolicy()})
    original = spec(config=ModelConfig(max_batch_size=4, batcher=batcher))
    packed = msgpack.packb(original.to_wire(), use_bin_type=True)
    assert ModelSpec.from_wire(msgpack.unpackb(packed, raw=False)) == original


# ServeConfig ----------------------------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment without PYSERVE_ variables."""
    for key in list(os.environ):
        if key.startswith("PYSERVE_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_serve_config_from_env_uses_defaults_without_variables(clean_env: pytest.MonkeyPatch) -> None:
    assert ServeConfig.from_env() == ServeConfig()


def test_serve_config_from_env_reads_pyserve_variables(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PYSERVE_HTTP_PORT", "9000")
    clean_env.setenv("PYSERVE_HOST", "0.0.0.0")
    clean_env.setenv("PYSERVE_STARTUP_TIMEOUT_S", "2.5")
    clean_env.setenv("PYSERVE_TRANSPORT", "tcp")
    config = ServeConfig.from_env()
    assert config.http_port == 9000
    assert config.host == "0.0.0.0"
    assert config.startup_timeout_s == 2.5
    assert config.transport == "tcp"
    assert config.grpc_port == 8001


def test_serve_config_explicit_overrides_win_over_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PYSERVE_HTTP_PORT", "9000")
    assert ServeConfig.from_env(http_port=0).http_port == 0


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PYSERVE_HTTP_PORT", "eighty", "PYSERVE_HTTP_PORT='eighty': expected int"),
        ("PYSERVE_STARTUP_TIMEOUT_S", "soon", "PYSERVE_STARTUP_TIMEOUT_S='soon': expected float"),
        ("PYSERVE_METRICS_PORT", "70000", "metrics_port must be in 0..65535, got 70000"),
        ("PYSERVE_TRANSPORT", "udp", "transport must be 'ipc' or 'tcp', got 'udp'"),
        ("PYSERVE_MAX_REQUEST_BYTES", "0", "max_request_bytes must be > 0"),
    ],
)
def test_serve_config_from_env_rejects_bad_values(
    clean_env: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    clean_env.setenv(variable, value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServeConfig.from_env()


def test_batcher_settings_on_a_model_without_batch_dimension_are_refused() -> None:
    with pytest.raises(ConfigError, match="max_batch_size=0"):
        ModelConfig(max_batch_size=0, batcher=DynamicBatcher(max_queue_delay_microseconds=100))
    with pytest.raises(ConfigError, match="max_batch_size=0"):
        ModelConfig(batcher=DynamicBatcher(priority_levels=2, default_priority_level=1))
    # The defaults, or no batcher at all, are fine.
    assert not ModelConfig().dynamic_batching
    assert not ModelConfig(max_batch_size=0, batcher=None).dynamic_batching


def test_restricted_api_is_tritonservers_format() -> None:
    assert ServeConfig().shared_memory_restriction() is None
    restricted = ServeConfig(restricted_api="shared-memory:Admin-Key=s3cret=x")
    assert restricted.shared_memory_restriction() == ("admin-key", "s3cret=x")
    with pytest.raises(ConfigError, match="'<apis>:<key>=<value>'"):
        ServeConfig(restricted_api="shared-memory")
    with pytest.raises(ConfigError, match="only 'shared-memory' can be restricted, got model-repository"):
        ServeConfig(restricted_api="shared-memory,model-repository:k=v")


def test_header_forward_patterns_are_regular_expressions() -> None:
    config = ServeConfig(http_header_forward_pattern="header.*", grpc_header_forward_pattern="(?-i)x-.*")
    assert config.http_header_forward_pattern == "header.*"
    pattern = header_pattern(config.http_header_forward_pattern)
    assert pattern is not None and pattern.search("Header_Divisor") and pattern.search("my-header")
    strict = header_pattern(config.grpc_header_forward_pattern)
    assert strict is not None and strict.search("x-trace") and not strict.search("X-Trace")
    assert header_pattern("") is None
    with pytest.raises(ConfigError, match=r"http_header_forward_pattern: invalid regular expression '\(unclosed'"):
        ServeConfig(http_header_forward_pattern="(unclosed")


def test_header_forward_pattern_from_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PYSERVE_GRPC_HEADER_FORWARD_PATTERN", "tenant")
    assert ServeConfig.from_env().grpc_header_forward_pattern == "tenant"


def test_matching_headers_become_string_parameters_in_lower_case() -> None:
    parameters: dict[str, object] = {"header_a": 1, "keep": True}
    headers = [("Header_A", "x"), ("HEADER_B", "y"), ("content-type", "application/json")]
    forward_headers(parameters, headers, header_pattern("header_.*"))
    assert parameters == {"header_a": "x", "keep": True, "header_b": "y"}
    untouched: dict[str, object] = {}
    forward_headers(untouched, headers, header_pattern("(?-i)header_.*"))
    forward_headers(untouched, headers, None)
    assert untouched == {}
    with pytest.raises(InvalidInputError, match="parameter 'triton_x' is reserved"):
        forward_headers({}, [("triton_x", "1")], header_pattern("triton"))
