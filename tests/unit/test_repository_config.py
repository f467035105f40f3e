"""Reading a model's config.pbtxt as Triton users write it: every field pyserve maps, instance groups placed on the
visible GPUs, the fields backends read as parameters, the errors (one clear line each), the fields it ignores,
ensembles, the load API's config and file overrides, the config's JSON form, and auto-complete from an ONNX file."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pyserve.backends import Backend, backend, onnxruntime, tensorrt
from pyserve.config import DynamicBatcher, QueuePolicy, Tensor, TimeoutAction, WorkerKind
from pyserve.ensemble import Step
from pyserve.errors import ConfigError
from pyserve.repository import ModelDefinition, read_model
from pyserve.repository.model_config import backend_gpu_capable

TENSORS = """
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""
BATCHING = 'backend: "onnxruntime"\nmax_batch_size: 8\n' + TENSORS


def write_model(root: Path, config: str | None, files: tuple[str, ...] = ("1/model.onnx",), name: str = "m") -> Path:
    model_dir = root / name
    model_dir.mkdir()
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for relative in files:
        (model_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / relative).write_bytes(b"not a real model")
    return model_dir


def gpus(count: int) -> Callable[[], int]:
    """A GPU count for ``read_model``: this many GPUs are visible."""
    return lambda: count


def backends_use_gpus(capable: bool) -> Callable[[Backend], bool]:
    """A ``gpu_capable`` for ``read_model``: every backend can use a GPU here, or none can."""
    return lambda module: capable


def read(tmp_path: Path, config: str | None, files: tuple[str, ...] = ("1/model.onnx",), **kw: Any) -> ModelDefinition:
    """Read the model written from ``config``, on a machine with no GPU unless ``gpu_count`` says otherwise, whose
    backends can use a GPU unless ``gpu_capable`` says otherwise."""
    kw.setdefault("gpu_count", gpus(0))
    kw.setdefault("gpu_capable", backends_use_gpus(True))
    return read_model(write_model(tmp_path, config, files), **kw)


FULL = """
name: "m"
backend: "onnxruntime"
max_batch_size: 16
input [
  { name: "image" data_type: TYPE_UINT8 dims: [ -1, 224, 3 ] reshape: { shape: [ 1, -1, 224, 3 ] } },
  { name: "text" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [ { name: "scores" data_type: TYPE_FP16 dims: [ 1000 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true }
  priority_queue_policy { key: 2 value { max_queue_size: 10 } }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value { string_value: "2" } }
model_transaction_policy { decoupled: true }
response_cache { enable: true }
model_operations { op_library_filename: [ "ops/libcustom.so" ] }
default_model_filename: "net.onnx"
version_policy: { all { } }
"""


def test_every_mapped_field_reaches_the_spec(tmp_path: Path) -> None:
    definition = read(tmp_path, FULL, ("1/net.onnx", "2/net.onnx"))
    model_dir = tmp_path / "m"
    assert definition.name == "m"
    assert definition.backend == "onnxruntime"
    assert definition.model_dir == model_dir
    assert definition.warnings == ()
    assert definition.ensemble is None
    assert sorted(definition.specs) == [1, 2]
    assert definition.model_files == {1: model_dir / "1" / "net.onnx", 2: model_dir / "2" / "net.onnx"}
    assert definition.reshape == {"image": (1, -1, 224, 3)}
    assert definition.op_libraries == (str(model_dir / "ops" / "libcustom.so"),)
    spec = definition.specs[2]
    assert (spec.name, spec.version) == ("m", 2)
    assert spec.inputs == (Tensor("image", "UINT8", (-1, 224, 3)), Tensor("text", "BYTES", (1,), optional=True))
    assert spec.outputs == (Tensor("scores", "FP16", (1000,)),)
    config = spec.config
    assert config.max_batch_size == 16
    assert config.batcher == DynamicBatcher(
        max_queue_delay_microseconds=100,
        preferred_batch_size=(4, 8),
        preserve_ordering=True,
        priority_levels=2,
        default_priority_level=1,
        default_queue_policy=QueuePolicy(TimeoutAction.DELAY, 5000, allow_timeout_override=True),
        priority_queue_policy={2: QueuePolicy(max_queue_size=10)},
    )
    assert (config.instances, config.devices, config.worker) == (2, (), WorkerKind.PROCESS)
    assert config.parameters == {"intra_op_thread_count": "2"}
    assert config.decoupled and config.response_cache


def test_a_batching_model_without_dynamic_batching_is_not_batched(tmp_path: Path) -> None:
    config = read(tmp_path, BATCHING).specs[1].config
    assert config.max_batch_size == 8
    assert config.batcher is None


def test_platform_names_the_backend(tmp_path: Path) -> None:
    definition = read(tmp_path, BATCHING.replace('backend: "onnxruntime"', 'platform: "onnxruntime_onnx"'))
    assert definition.backend == "onnxruntime"
    assert (definition.config_json["backend"], definition.config_json["platform"]) == (
        "onnxruntime",
        "onnxruntime_onnx",
    )


@pytest.mark.parametrize(
    ("groups", "visible", "instances", "devices"),
    [
        (
            "[ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] }, { kind: KIND_CPU } ]",
            2,
            5,
            ("cuda:0",) * 2 + ("cuda:1",) * 2 + ("cpu",),
        ),
        ("[ { kind: KIND_GPU } ]", 2, 2, ("cuda:0", "cuda:1")),  # no gpus: every visible GPU, as in Triton
        ("[ { count: 2 kind: KIND_GPU } ]", 3, 6, ("cuda:0",) * 2 + ("cuda:1",) * 2 + ("cuda:2",) * 2),
        ("[ { count: 3 gpus: [ 1 ] } ]", 2, 3, ("cuda:1",) * 3),  # KIND_AUTO: on the GPUs listed when visible,
        ("[ { count: 3 gpus: [ 1 ] } ]", 1, 3, ()),  # else on the CPU
        ("[ { count: 2 } ]", 2, 4, ("cuda:0",) * 2 + ("cuda:1",) * 2),  # KIND_AUTO: every GPU when there is one,
        ("[ { count: 2 kind: KIND_CPU }, { kind: KIND_MODEL }, { } ]", 0, 4, ()),  # else the CPU
    ],
)
def test_instance_groups_place_instances(
    tmp_path: Path, groups: str, visible: int, instances: int, devices: tuple[str, ...]
) -> None:
    config = read(tmp_path, f"{BATCHING}instance_group {groups}", gpu_count=gpus(visible)).specs[1].config
    assert (config.instances, config.devices) == (instances, devices)


def test_without_instance_groups_a_model_runs_once_on_each_gpu_or_on_the_cpu(tmp_path: Path) -> None:
    definition = read(tmp_path, BATCHING, gpu_count=gpus(2))
    assert definition.specs[1].config.devices == ("cuda:0", "cuda:1")
    (group,) = definition.config_json["instance_group"]
    assert (group["kind"], group["count"], group["gpus"]) == ("KIND_GPU", 1, [0, 1])  # what /config answers
    shutil.rmtree(tmp_path / "m")
    assert read(tmp_path, BATCHING, gpu_count=gpus(0)).specs[1].config.devices == ()


def test_gpus_are_counted_once_and_only_where_a_group_leaves_them_open(tmp_path: Path) -> None:
    counted: list[int] = []

    def two_gpus() -> int:
        counted.append(2)
        return 2

    read(
        tmp_path, BATCHING + "instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 1 ] } ]", gpu_count=two_gpus
    )
    assert counted == []
    shutil.rmtree(tmp_path / "m")
    read(tmp_path, BATCHING + "instance_group [ { kind: KIND_GPU }, { }, { gpus: [ 0 ] } ]", gpu_count=two_gpus)
    assert counted == [2]


def test_kind_auto_stays_on_the_cpu_where_the_backend_cannot_use_the_gpus(tmp_path: Path) -> None:
    definition = read(tmp_path, BATCHING, gpu_count=gpus(2), gpu_capable=backends_use_gpus(False))
    assert definition.specs[1].config.devices == ()
    (group,) = definition.config_json["instance_group"]
    assert (group["kind"], group["gpus"]) == ("KIND_CPU", [])


def test_kind_gpu_with_a_backend_that_cannot_use_a_gpu_fails_the_load_saying_what_to_install(tmp_path: Path) -> None:
    config = BATCHING + "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]"
    with pytest.raises(ConfigError) as caught:
        read(tmp_path, config, gpu_count=gpus(1), gpu_capable=backends_use_gpus(False))
    assert str(caught.value) == (
        "model 'm': instance_group 'm_0' asks for KIND_GPU, but backend 'onnxruntime' cannot use a GPU here (the "
        "installed onnxruntime has no CUDAExecutionProvider); install onnxruntime-gpu in place of onnxruntime: "
        'pip uninstall onnxruntime && pip install "pyserve[onnx-gpu]"'
    )


def test_the_backend_is_asked_about_gpus_once_and_only_where_a_group_could_use_them(tmp_path: Path) -> None:
    asked: list[str] = []

    def capable(module: Backend) -> bool:
        asked.append(module.NAME)
        return True

    read(tmp_path, BATCHING + "instance_group [ { kind: KIND_CPU }, { } ]", gpu_count=gpus(0), gpu_capable=capable)
    assert asked == []  # no GPU visible: KIND_AUTO is the CPU whatever the backend
    shutil.rmtree(tmp_path / "m")
    groups = "instance_group [ { kind: KIND_GPU }, { }, { kind: KIND_GPU gpus: [ 0 ] } ]"
    read(tmp_path, BATCHING + groups, gpu_count=gpus(2), gpu_capable=capable)
    assert asked == ["onnxruntime"]


def test_a_backend_module_that_does_not_say_can_use_a_gpu() -> None:
    assert backend_gpu_capable(backend("python")) is True  # its functions choose their own device
    assert backend_gpu_capable(onnxruntime) is onnxruntime.gpu_capable()


def onnxruntime_has_cuda() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(onnxruntime_has_cuda(), reason="onnxruntime-gpu is installed: ONNX models can use the GPUs here")
def test_with_the_cpu_onnxruntime_an_onnx_model_stays_on_the_cpu_of_a_gpu_machine(tmp_path: Path) -> None:
    definition = read_model(write_model(tmp_path, BATCHING), gpu_count=gpus(2))
    assert definition.specs[1].config.devices == ()
    shutil.rmtree(tmp_path / "m")
    model_dir = write_model(tmp_path, BATCHING + "instance_group [ { kind: KIND_GPU } ]")
    with pytest.raises(ConfigError, match=r"backend 'onnxruntime' cannot use a GPU here .*pyserve\[onnx-gpu\]"):
        read_model(model_dir, gpu_count=gpus(2))


def test_the_version_policy_selects_the_specs(tmp_path: Path) -> None:
    files = ("1/model.onnx", "2/model.onnx", "3/model.onnx", "04/model.onnx")
    assert sorted(read(tmp_path, BATCHING, files).specs) == [3]
    shutil.rmtree(tmp_path / "m")
    definition = read(tmp_path, BATCHING + "version_policy { latest { num_versions: 2 } }", files)
    assert sorted(definition.specs) == sorted(definition.model_files) == [2, 3]


@pytest.mark.parametrize(
    ("config", "files", "message"),
    [
        (BATCHING + "\n  bogus_field: 1", None, 'config.pbtxt line 7 column 3: .* has no field named "bogus_field"'),
        (BATCHING.replace("TYPE_FP32", "TYPE_FLOAT", 1), None, "line 4 column 32: .*has no value named TYPE_FLOAT"),
        (
            'name: "other"\n' + BATCHING,
            None,
            "the config names the model 'other'; the name must equal the directory's",
        ),
        (BATCHING.replace("onnxruntime", "tensorflow"), None, "backend 'tensorflow' is not served by pyserve"),
        (BATCHING + 'platform: "tensorrt_plan"', None, "backend 'onnxruntime' does not serve platform 'tensorrt_plan'"),
        (BATCHING + "sequence_batching { iterative_sequence: true }", None, "iterative_sequence .* is not supported"),
        (BATCHING, ("1/other.onnx",), "version 1 has no model file 1/model.onnx"),
        (BATCHING, ("weights/model.onnx",), "no version directory"),
        (BATCHING.replace("data_type: TYPE_FP32 ", "", 1), None, "input 'x' has no data_type"),
        (BATCHING.replace("dims: [ 3 ]", "dims: [ 0 ]", 1), None, r"dimension 0 in shape \(0,\)"),
        (BATCHING + "dynamic_batching { preferred_batch_size: [ 32 ] }", None, "exceeds max_batch_size 8"),
        (BATCHING + "dynamic_batching { priority_levels: 2 }", None, "default_priority_level 0 must be in 1..2"),
        (BATCHING + "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]", None, "of kind KIND_CPU lists gpus"),
        (
            BATCHING + "instance_group [ { kind: KIND_GPU } ]",
            None,
            "^model 'm': instance_group asks for KIND_GPU but no GPU is visible$",
        ),
        ('backend: "onnxruntime"\nmax_batch_size: 8\n', None, "cannot read the tensors of model.onnx to complete"),
        ("max_batch_size: 8\n" + TENSORS, ("1/weights.bin",), "neither backend nor platform is configured"),
    ],
)
def test_a_bad_config_is_one_clear_error(
    tmp_path: Path, config: str, files: tuple[str, ...] | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        read(tmp_path, config, files or ("1/model.onnx",))
    assert str(caught.value).startswith("model 'm': ")
    assert "\n" not in str(caught.value)


def test_a_missing_model_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model 'm': directory .* does not exist"):
        read_model(tmp_path / "m")


def test_strict_mode_needs_a_config(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"model 'm': no config.pbtxt in .* \(a strict model config must be written out\)"
    ):
        read(tmp_path, None, strict=True)


def test_fields_pyserve_ignores_are_reported_once_each(tmp_path: Path) -> None:
    config = (
        BATCHING.replace(
            "dims: [ 3 ] } ]\noutput", "dims: [ 3 ] allow_ragged_batch: true format: FORMAT_NHWC } ]\noutput"
        )
        + "optimization { cuda { graphs: true } }\n"
        + 'model_warmup [ { name: "w" batch_size: 1 } ]\n'
        + 'metric_tags { key: "team" value: "vision" }\n'
        + "instance_group [ { count: 1 rate_limiter { priority: 1 } }, { rate_limiter { priority: 2 } } ]\n"
    )
    definition = read(tmp_path, config)
    ignored = ["input.format", "input.allow_ragged_batch", "optimization.cuda", "instance_group.rate_limiter"]
    ignored += ["metric_tags", "model_warmup"]
    assert sorted(definition.warnings) == sorted(
        f"model 'm': field '{field}' is set but is not supported by pyserve and is ignored" for field in ignored
    )
    assert definition.specs[1].config.instances == 2


# fields backends read as parameters ------------------------------------------------------------------------------

ONNX_OPTIMIZATION = """
optimization {
  graph { level: 1 }
  execution_accelerators {
    gpu_execution_accelerator [ {
      name: "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "trt_engine_cache_enable" value: "1" }
    } ]
    cpu_execution_accelerator [ { name: "openvino" } ]
  }
  input_pinned_memory { enable: false }
}
"""


def test_onnxruntime_reads_the_optimization_block_as_its_parameters(tmp_path: Path) -> None:
    definition = read(tmp_path, BATCHING + ONNX_OPTIMIZATION)
    parameters = definition.specs[1].config.parameters
    assert parameters == {
        "graph_optimization_level": "1",
        "execution_accelerator": "tensorrt",
        "precision_mode": "FP16",
        "trt_engine_cache_enable": "1",
    }
    assert definition.warnings == (
        "model 'm': field 'optimization.input_pinned_memory' is set but is not supported by pyserve and is ignored",
        "model 'm': cpu_execution_accelerator 'openvino' is not supported by pyserve and is ignored: the model runs "
        "on ONNX Runtime's CPU provider",
    )
    session = onnxruntime.SessionConfig.from_parameters("m", parameters)  # the names the backend reads
    assert (session.graph_level, session.tensorrt) == (1, True)
    assert session.tensorrt_options == {"trt_engine_cache_enable": "1", "trt_fp16_enable": "True"}


def test_the_cuda_accelerator_alone_keeps_onnxruntime_on_cuda(tmp_path: Path) -> None:
    accelerator = '{ name: "cuda" parameters { key: "cudnn_conv_algo_search" value: "1" } }'
    optimization = f"optimization {{ execution_accelerators {{ gpu_execution_accelerator [ {accelerator} ] }} }}"
    parameters = read(tmp_path, BATCHING + optimization).specs[1].config.parameters
    assert parameters == {"execution_accelerator": "cuda", "cudnn_conv_algo_search": "1"}


def test_tensorrt_reads_the_instance_group_profile_as_its_parameter(tmp_path: Path) -> None:
    config = BATCHING.replace("onnxruntime", "tensorrt") + 'instance_group [ { kind: KIND_GPU profile: [ "1" ] } ]'
    definition = read(tmp_path, config + ONNX_OPTIMIZATION, ("1/model.plan",), gpu_count=gpus(1))
    assert definition.specs[1].config.parameters == {"optimization_profile": "1"}
    assert definition.warnings == (
        "model 'm': field 'optimization' is set but is not supported by pyserve and is ignored",
    )
    assert tensorrt.create(definition.backend_model(1, None)).profile == 1


@pytest.mark.parametrize(
    ("backend", "files", "ignored"),
    [
        ("pytorch", ("1/model.pt",), ["instance_group.profile", "optimization"]),
        ("onnxruntime", ("1/model.onnx",), ["instance_group.profile"]),
    ],
)
def test_other_backends_map_nothing_and_report_the_fields(
    tmp_path: Path, backend: str, files: tuple[str, ...], ignored: list[str]
) -> None:
    optimization = "optimization { graph { level: 1 } }" if backend == "pytorch" else ""
    config = BATCHING.replace("onnxruntime", backend) + 'instance_group [ { profile: [ "0" ] } ]' + optimization
    definition = read(tmp_path, config, files)
    assert definition.specs[1].config.parameters == {}
    assert definition.warnings == tuple(
        f"model 'm': field '{field}' is set but is not supported by pyserve and is ignored" for field in ignored
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            BATCHING + 'parameters { key: "graph_optimization_level" value { string_value: "2" } }'
            "optimization { graph { level: 1 } }",
            "parameter 'graph_optimization_level' is '2', but optimization.graph.level sets it to '1'",
        ),
        (
            BATCHING + 'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "x" } ] } }',
            "gpu_execution_accelerator 'x' is not one of the onnxruntime backend's \\(tensorrt, cuda\\)",
        ),
        (
            BATCHING.replace("onnxruntime", "tensorrt")
            + 'instance_group [ { kind: KIND_CPU profile: [ "0" ] }, { kind: KIND_CPU profile: [ "1" ] } ]',
            r"instance_group profiles \['0', '1'\]: pyserve's TensorRT backend runs one optimization profile",
        ),
    ],
)
def test_a_field_a_backend_cannot_take_is_one_clear_error(tmp_path: Path, config: str, message: str) -> None:
    files = ("1/model.plan",) if "tensorrt" in config else ("1/model.onnx",)
    with pytest.raises(ConfigError, match=f"^model 'm': {message}"):
        read(tmp_path, config, files)


# ensembles ------------------------------------------------------------------------------------------------------

ENSEMBLE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "tokenize"
      model_version: -1
      input_map { key: "text" value: "TEXT" }
      output_map { key: "ids" value: "ids" }
    },
    {
      model_name: "classify"
      model_version: 2
      input_map { key: "ids" value: "ids" }
      output_map { key: "label" value: "LABEL" }
    }
  ]
}
"""


def test_an_ensemble_config_becomes_an_ensemble_spec(tmp_path: Path) -> None:
    definition = read(tmp_path, ENSEMBLE + "instance_group [ { count: 2 } ]", ("1/.keep", "3/.keep"))
    assert definition.backend == "ensemble"
    assert definition.specs == definition.model_files == {}
    assert definition.warnings == (
        "model 'm': field 'instance_group' is set but is not supported by pyserve and is ignored",
    )
    spec = definition.ensemble
    assert spec is not None
    assert (spec.name, spec.version, spec.max_batch_size) == ("m", 3, 8)
    assert spec.inputs == (Tensor("TEXT", "BYTES", (1,)),)
    assert spec.outputs == (Tensor("LABEL", "INT64", (1,)),)
    assert spec.steps == (
        Step("tokenize", {"text": "TEXT"}, {"ids": "ids"}, version=None),
        Step("classify", {"ids": "ids"}, {"label": "LABEL"}, version=2),
    )
    assert definition.config_json["platform"] == "ensemble"
    assert definition.config_json["ensemble_scheduling"]["step"][1]["model_version"] == 2
    with pytest.raises(ConfigError, match=r"model 'm' is an ensemble: it has no backend model"):
        definition.backend_model(3, None)


def test_an_ensemble_with_a_broken_graph_names_the_ensemble(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^ensemble 'm': output 'LABEL' is not produced by any step"):
        read(tmp_path, ENSEMBLE.replace('value: "LABEL"', 'value: "other"'), ("1/.keep",))


def test_the_config_json_has_tritons_shape(tmp_path: Path) -> None:
    document = read(tmp_path, BATCHING + "dynamic_batching { max_queue_delay_microseconds: 100 }").config_json
    assert list(document) == [
        "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input", "output",
        "batch_input", "batch_output", "optimization", "dynamic_batching", "instance_group",
        "default_model_filename", "cc_model_filenames", "metric_tags", "parameters", "model_warmup",
    ]  # fmt: skip
    assert document["version_policy"] == {"latest": {"num_versions": 1}}
    assert document["input"] == [
        {
            "name": "x",
            "data_type": "TYPE_FP32",
            "format": "FORMAT_NONE",
            "dims": [3],
            "is_shape_tensor": False,
            "allow_ragged_batch": False,
            "optional": False,
            "is_non_linear_format_io": False,
        }
    ]
    assert document["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert document["dynamic_batching"]["priority_queue_policy"] == {}
    assert document["optimization"]["input_pinned_memory"] == {"enable": True}
    (group,) = document["instance_group"]  # Triton's default group, its fields written out as the input's are
    assert (group["name"], group["kind"], group["count"], group["gpus"], group["profile"]) == (
        "m_0",
        "KIND_CPU",
        1,
        [],
        [],
    )
    assert document["default_model_filename"] == "model.onnx"


def test_a_config_override_replaces_the_config_file(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, BATCHING)
    first = read_model(model_dir)
    override = dict(first.config_json, max_batch_size=2)
    definition = read_model(model_dir, config_override=json.dumps(override))
    assert definition.specs[1].config.max_batch_size == 2
    assert definition.specs[1].inputs == first.specs[1].inputs
    assert definition.config_json == override
    with pytest.raises(ConfigError, match=r"model 'm': the config override is not a valid model config: .*nope"):
        read_model(model_dir, config_override='{"nope": 1}')


def test_a_file_override_is_read_from_a_fresh_directory(tmp_path: Path) -> None:
    files = {"config.pbtxt": BATCHING.encode(), "2/model.onnx": b"weights"}
    definition = read_model(tmp_path / "m", files=files)  # the name comes from the path; nothing is read there
    try:
        assert definition.name == "m"
        assert definition.model_dir.parent != tmp_path
        assert definition.model_files == {2: definition.model_dir / "2" / "model.onnx"}
        assert definition.model_files[2].read_bytes() == b"weights"
    finally:
        shutil.rmtree(definition.model_dir)


def test_a_file_override_that_fails_to_read_leaves_no_directory_behind(tmp_path: Path) -> None:
    before = set(Path(tempfile.gettempdir()).glob("pyserve-model-*"))
    with pytest.raises(ConfigError, match=r"model 'm': version 1 has no model file 1/model.onnx"):
        read_model(tmp_path / "m", files={"config.pbtxt": BATCHING.encode(), "1/weights.bin": b"weights"})
    assert set(Path(tempfile.gettempdir()).glob("pyserve-model-*")) == before


def test_backend_model_carries_a_version_and_its_files(tmp_path: Path) -> None:
    definition = read(tmp_path, BATCHING + 'input [ { name: "z" data_type: TYPE_INT32 dims: [ 1 ] reshape { } } ]')
    model = definition.backend_model(1, tmp_path)
    assert model.spec == definition.specs[1]
    assert (model.model_file, model.version_dir) == (tmp_path / "m" / "1" / "model.onnx", tmp_path / "m" / "1")
    assert (model.model_dir, model.repository) == (tmp_path / "m", tmp_path)
    assert model.reshape == {"z": ()}
    assert model.config_json == definition.config_json
    with pytest.raises(ConfigError, match=r"model 'm': version 2 is not selected \(versions: \[1\]\)"):
        definition.backend_model(2, tmp_path)


# auto-complete from the model file ------------------------------------------------------------------------------


def onnx_model(path: Path, batch: Any) -> None:
    """An identity model whose x and y are FP32 [batch, 3]."""
    onnx = pytest.importorskip("onnx", reason="auto-complete tests build an ONNX file with onnx")
    pytest.importorskip("pyserve.backends.onnxruntime", reason="the onnxruntime backend reads the file")
    helper = onnx.helper
    tensors = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [batch, 3]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", tensors[:1], tensors[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def test_without_a_config_a_batching_onnx_model_is_completed(tmp_path: Path) -> None:
    onnx_model(tmp_path / "m" / "1" / "model.onnx", "N")
    definition = read_model(tmp_path / "m")
    spec = definition.specs[1]
    assert definition.backend == "onnxruntime"
    assert spec.inputs == (Tensor("x", "FP32", (3,)),)
    assert spec.outputs == (Tensor("y", "FP32", (3,)),)
    assert spec.config.max_batch_size == 4  # Triton's default-max-batch-size
    assert spec.config.batcher == DynamicBatcher()
    assert definition.config_json["dynamic_batching"]["preferred_batch_size"] == []
    assert definition.config_json["platform"] == "onnxruntime_onnx"


def test_a_model_with_a_fixed_first_dimension_does_not_batch(tmp_path: Path) -> None:
    onnx_model(tmp_path / "m" / "1" / "model.onnx", 2)
    spec = read_model(tmp_path / "m").specs[1]
    assert spec.config.max_batch_size == 0
    assert spec.inputs == (Tensor("x", "FP32", (2, 3)),)


def test_a_config_that_spells_out_the_batch_dimension_does_not_batch(tmp_path: Path) -> None:
    onnx_model(tmp_path / "m" / "1" / "model.onnx", "N")
    (tmp_path / "m" / "config.pbtxt").write_text('input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]')
    spec = read_model(tmp_path / "m").specs[1]
    assert spec.config.max_batch_size == 0
    assert spec.inputs == (Tensor("x", "FP32", (-1, 3)),)
    assert spec.outputs == (Tensor("y", "FP32", (-1, 3)),)


def test_a_partial_config_keeps_its_settings_and_gains_the_tensors(tmp_path: Path) -> None:
    onnx_model(tmp_path / "m" / "1" / "model.onnx", "N")
    (tmp_path / "m" / "config.pbtxt").write_text("max_batch_size: 16\ninstance_group [ { count: 2 } ]")
    config = read_model(tmp_path / "m").specs[1].config
    assert (config.max_batch_size, config.batcher, config.instances) == (16, None, 2)


def test_strict_mode_does_not_complete(tmp_path: Path) -> None:
    onnx_model(tmp_path / "m" / "1" / "model.onnx", "N")
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 4')
    with pytest.raises(ConfigError, match=r"model 'm': no input is declared"):
        read_model(tmp_path / "m", strict=True)
    assert read_model(tmp_path / "m").specs[1].inputs == (Tensor("x", "FP32", (3,)),)


PYSERVE_MODEL_PY = """
import numpy as np
from pyserve import DynamicBatcher, ModelConfig, QueuePolicy, Tensor

inputs = [Tensor("a", np.float32, (-1,))]
outputs = [Tensor("b", np.float32, (-1,))]
config = ModelConfig(
    max_batch_size=8,
    batcher=DynamicBatcher(
        max_queue_delay_microseconds=50,
        priority_levels=2,
        default_priority_level=1,
        priority_queue_policy={2: QueuePolicy("DELAY", max_queue_size=3)},
    ),
    decoupled=True,
)

def infer_func(requests):
    return [{"b": r.data["a"]} for r in requests]
"""
TRITON_MODEL_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""


def python_model(root: Path, source: str, config: str | None = None) -> Path:
    pytest.importorskip("pyserve.backends.python_loader", reason="the Python backend reads what a model.py declares")
    model_dir = write_model(root, config, ())
    (model_dir / "1").mkdir()
    (model_dir / "1" / "model.py").write_text(source)
    return model_dir


def test_a_model_py_in_pyserves_form_completes_the_config(tmp_path: Path) -> None:
    definition = read_model(python_model(tmp_path, PYSERVE_MODEL_PY))
    spec = definition.specs[1]
    assert definition.backend == "python"
    assert (spec.inputs, spec.outputs) == ((Tensor("a", "FP32", (-1,)),), (Tensor("b", "FP32", (-1,)),))
    assert (spec.config.max_batch_size, spec.config.decoupled) == (8, True)
    assert spec.config.batcher == DynamicBatcher(
        max_queue_delay_microseconds=50,
        priority_levels=2,
        default_priority_level=1,
        priority_queue_policy={2: QueuePolicy(TimeoutAction.DELAY, max_queue_size=3)},
    )
    assert definition.config_json["model_transaction_policy"] == {"decoupled": True}


def test_a_triton_python_model_completes_the_config_with_auto_complete_config(tmp_path: Path) -> None:
    config = 'backend: "python"\nparameters { key: "k" value { string_value: "v" } }'
    spec = read_model(python_model(tmp_path, TRITON_MODEL_PY, config)).specs[1]
    assert (spec.inputs, spec.outputs) == ((Tensor("IN", "BYTES", (1,)),), (Tensor("OUT", "INT32", (2,)),))
    assert (spec.config.max_batch_size, spec.config.batcher) == (4, DynamicBatcher())
    assert spec.config.parameters == {"k": "v"}


def test_auto_complete_imports_a_model_py_in_a_child_process_not_in_the_caller(tmp_path: Path) -> None:
    # read_model runs in the core; the model's code must run elsewhere.
    source = 'import os, pathlib\npathlib.Path(__file__).with_name("imported_by").write_text(str(os.getpid()))\n'
    model_dir = python_model(tmp_path, source + PYSERVE_MODEL_PY)
    spec = read_model(model_dir).specs[1]
    assert spec.inputs == (Tensor("a", "FP32", (-1,)),)
    importer = int((model_dir / "1" / "imported_by").read_text())
    assert importer != os.getpid()


def test_a_model_py_that_fails_to_import_fails_auto_complete_with_its_message(tmp_path: Path) -> None:
    model_dir = python_model(tmp_path, "raise RuntimeError('no GPU here')\n")
    with pytest.raises(
        ConfigError, match=r"^model 'm': model file '.*model.py' could not be imported: RuntimeError: no"
    ):
        read_model(model_dir)


def test_a_model_py_that_declares_nothing_needs_a_config(tmp_path: Path) -> None:
    model_dir = python_model(tmp_path, "def infer_func(requests):\n    return []\n")
    with pytest.raises(ConfigError, match=r"model 'm': no input is declared, and none could be read"):
        read_model(model_dir)
