"""The ONNX Runtime backend on the CPU, with small models built by onnx.helper at test time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from pyserve.backends import onnxruntime as ort_backend
from pyserve.backends.base import BackendModel, Signature, TensorSignature
from pyserve.backends.open import open_onnx
from pyserve.config import ModelConfig, ModelSpec, Tensor
from pyserve.errors import ConfigError, InvalidInputError
from pyserve.request import Request, RequestBatch

onnx = pytest.importorskip("onnx", reason="onnx is not installed: the ONNX backend tests build models with it")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
helper = onnx.helper
TensorProto = onnx.TensorProto

rng = np.random.default_rng(0)
W1 = rng.standard_normal((4, 8)).astype(np.float32)
B1 = rng.standard_normal(8).astype(np.float32)
W2 = rng.standard_normal((8, 3)).astype(np.float32)
B2 = rng.standard_normal(3).astype(np.float32)


def save(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any], initializers: list[Any] = ()) -> Path:
    """Write a one-graph ONNX model (opset 17) to ``path``."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    """x [N, 4] -> hidden = Relu(x W1 + b1) [N, 8], y = hidden W2 + b2 [N, 3], rows [N, 4]: rows in the call."""
    init = [
        onnx.numpy_helper.from_array(W1, "W1"),
        onnx.numpy_helper.from_array(B1, "B1"),
        onnx.numpy_helper.from_array(W2, "W2"),
        onnx.numpy_helper.from_array(B2, "B2"),
        onnx.numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
        onnx.numpy_helper.from_array(np.array(0, dtype=np.float32), "zero"),
        onnx.numpy_helper.from_array(np.array(1, dtype=np.float32), "one"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["m1"]),
        helper.make_node("Add", ["m1", "B1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "W2"], ["m2"]),
        helper.make_node("Add", ["m2", "B2"], ["y"]),
        # rows: every element is the number of rows the model was called with.
        helper.make_node("Mul", ["x", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "one"], ["ones"]),
        helper.make_node("ReduceSum", ["ones", "axis0"], ["count"], keepdims=1),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Expand", ["count", "shape"], ["rows"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
        helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["N", 8]),
        helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 4]),
    ]
    return save(tmp_path / "model.onnx", nodes, inputs, outputs, init)


def mlp_spec(max_batch_size: int = 8, x_dtype: Any = np.float32, x_shape: tuple[int, ...] = (4,), **params: str) -> Any:
    inputs = [Tensor("x", x_dtype, x_shape if max_batch_size else (-1, *x_shape))]
    outputs = [
        Tensor("y", np.float32, (3,) if max_batch_size else (-1, 3)),
        Tensor("hidden", np.float32, (8,) if max_batch_size else (-1, 8)),
        Tensor("rows", np.float32, (4,) if max_batch_size else (-1, 4)),
    ]
    config = ModelConfig(max_batch_size=max_batch_size, parameters=dict(params))
    return ModelSpec("mlp", 1, tuple(inputs), tuple(outputs), config)


def backend_model(path: Path, spec: ModelSpec, **fields: Any) -> BackendModel:
    return BackendModel(spec=spec, model_file=path, version_dir=path.parent, model_dir=path.parent.parent, **fields)


def loaded(model: BackendModel, device: str = "cpu") -> Any:
    """create() -> a trip through cloudpickle (as to a process instance) -> setup(device)."""
    instance = cloudpickle.loads(cloudpickle.dumps(ort_backend.create(model)))
    instance.setup(device)
    return instance


def expected_mlp(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hidden = np.maximum(x @ W1 + B1, 0)
    return hidden @ W2 + B2, hidden


def test_three_requests_run_as_one_call_and_match_onnxruntime(mlp_file: Path) -> None:
    instance = loaded(backend_model(mlp_file, mlp_spec()))
    xs = [rng.standard_normal((rows, 4)).astype(np.float32) for rows in (1, 2, 3)]
    responses = instance(RequestBatch(Request({"x": x}) for x in xs))
    session = ort.InferenceSession(str(mlp_file), providers=["CPUExecutionProvider"])
    assert len(responses) == 3
    for x, response in zip(xs, responses, strict=True):
        y, hidden = session.run(["y", "hidden"], {"x": x})
        assert set(response) == {"y", "hidden", "rows"}
        np.testing.assert_allclose(response["y"], y, rtol=1e-6)
        np.testing.assert_allclose(response["hidden"], hidden, rtol=1e-6)
        np.testing.assert_allclose(response["y"], expected_mlp(x)[0], rtol=1e-5, atol=1e-5)
        assert np.all(response["rows"] == 6)  # one call saw all six rows


def test_the_servers_contiguous_layout_is_used_as_it_is(mlp_file: Path) -> None:
    instance = loaded(backend_model(mlp_file, mlp_spec()))
    merged = rng.standard_normal((5, 4)).astype(np.float32)
    batch = RequestBatch([Request({"x": merged[:2]}), Request({"x": merged[2:]})])
    batch.merged = {"x": merged}
    first, second = instance(batch)
    np.testing.assert_allclose(np.concatenate([first["y"], second["y"]]), expected_mlp(merged)[0], rtol=1e-5, atol=1e-5)


def test_each_response_holds_the_outputs_its_request_asked_for(mlp_file: Path) -> None:
    instance = loaded(backend_model(mlp_file, mlp_spec()))
    x = np.ones((1, 4), np.float32)
    only_y, everything, only_hidden = instance(
        RequestBatch(
            [
                Request({"x": x}, requested_output_names=("y",)),
                Request({"x": x}),
                Request({"x": x}, requested_output_names=("hidden",)),
            ]
        )
    )
    assert set(only_y) == {"y"}
    assert set(everything) == {"y", "hidden", "rows"}
    assert set(only_hidden) == {"hidden"}
    np.testing.assert_array_equal(only_y["y"], everything["y"])


def test_an_unknown_requested_output_is_an_invalid_input(mlp_file: Path) -> None:
    instance = loaded(backend_model(mlp_file, mlp_spec()))
    with pytest.raises(InvalidInputError, match="nope"):
        instance(RequestBatch([Request({"x": np.ones((1, 4), np.float32)}, requested_output_names=("nope",))]))


def test_without_a_batch_dim_each_request_is_its_own_call(mlp_file: Path) -> None:
    instance = loaded(backend_model(mlp_file, mlp_spec(max_batch_size=0)))
    small, large = instance(
        RequestBatch([Request({"x": np.ones((1, 4), np.float32)}), Request({"x": np.ones((3, 4), np.float32)})])
    )
    assert np.all(small["rows"] == 1)
    assert np.all(large["rows"] == 3)


def test_reshape_feeds_the_models_shape_and_returns_the_configs(tmp_path: Path) -> None:
    path = save(
        tmp_path / "model.onnx",
        [helper.make_node("Add", ["x", "x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 2])],
    )
    spec = ModelSpec(
        "doubler", 1, (Tensor("x", np.float32, (4,)),), (Tensor("y", np.float32, (4,)),), ModelConfig(max_batch_size=4)
    )
    instance = loaded(backend_model(path, spec, reshape={"x": (2, 2), "y": (2, 2)}))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (response,) = instance(RequestBatch([Request({"x": x})]))
    np.testing.assert_array_equal(response["y"], x * 2)


def test_strings_pass_as_bytes(tmp_path: Path) -> None:
    path = save(
        tmp_path / "model.onnx",
        [helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["N", 2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, ["N", 2])],
    )
    spec = ModelSpec("echo", 1, (Tensor("s", bytes, (2,)),), (Tensor("t", bytes, (2,)),), ModelConfig(max_batch_size=4))
    instance = loaded(backend_model(path, spec))
    s = np.array([[b"caf\xc3\xa9", b"b"]], dtype=object)
    (response,) = instance(RequestBatch([Request({"s": s})]))
    assert response["t"].tolist() == [[b"caf\xc3\xa9", b"b"]]
    with pytest.raises(InvalidInputError, match=r"'s'.*UTF-8"):
        instance(RequestBatch([Request({"s": np.array([[b"\xff", b"x"]], dtype=object)})]))


# --- what fails a load ------------------------------------------------------------------------------------------


def test_a_datatype_that_differs_from_the_file_fails_setup_naming_both(mlp_file: Path) -> None:
    instance = ort_backend.create(backend_model(mlp_file, mlp_spec(x_dtype=np.int64)))
    with pytest.raises(ConfigError, match=r"input 'x': the config declares INT64, the model file has FP32"):
        instance.setup("cpu")


def test_a_tensor_the_file_lacks_fails_setup(mlp_file: Path) -> None:
    spec = mlp_spec()
    spec = ModelSpec("mlp", 1, spec.inputs, (*spec.outputs, Tensor("extra", np.float32, (1,))), spec.config)
    with pytest.raises(ConfigError, match=r"output 'extra' is declared in the config but the model file has no such"):
        loaded(backend_model(mlp_file, spec))


def test_a_rank_or_dim_that_differs_from_the_file_fails_setup(mlp_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"input 'x'.*3 dims"):
        loaded(backend_model(mlp_file, mlp_spec(x_shape=(2, 2))))
    with pytest.raises(ConfigError, match=r"input 'x': dim 1 is 5 in the config, 4 in the model file"):
        loaded(backend_model(mlp_file, mlp_spec(x_shape=(5,))))


def test_bf16_tensors_fail_create(mlp_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"tensors \['x'\] are BF16"):
        ort_backend.create(backend_model(mlp_file, mlp_spec(x_dtype="BF16")))


def test_a_missing_model_file_fails_setup_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "1" / "model.onnx"
    instance = ort_backend.create(backend_model(missing, mlp_spec()))  # nothing is opened before setup
    with pytest.raises(ConfigError, match=r"model 'mlp': model file .*1/model.onnx does not exist"):
        instance.setup("cpu")


def test_a_gpu_device_without_the_cuda_provider_is_an_error_not_a_cpu_fallback(mlp_file: Path) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    instance = ort_backend.create(backend_model(mlp_file, mlp_spec()))
    with pytest.raises(ConfigError, match=r"device 'cuda:1' needs onnxruntime's CUDAExecutionProvider"):
        instance.setup("cuda:1")


def test_an_unknown_device_is_refused(mlp_file: Path) -> None:
    with pytest.raises(ConfigError, match="device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu0'"):
        loaded(backend_model(mlp_file, mlp_spec()), device="gpu0")


# --- parameters -------------------------------------------------------------------------------------------------


def test_session_options_come_from_tritons_parameter_names(mlp_file: Path) -> None:
    params = {
        "intra_op_thread_count": "2",
        "inter_op_thread_count": "3",
        "execution_mode": "1",
        "graph_optimization_level": "-1",
        "enable_mem_arena": "0",
        "enable_mem_pattern": "0",
    }
    instance = loaded(backend_model(mlp_file, mlp_spec(**params)))
    options = instance.session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 3
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.enable_cpu_mem_arena is False
    assert options.enable_mem_pattern is False


@pytest.mark.parametrize(
    ("level", "expected"),
    [("0", "ORT_ENABLE_ALL"), ("1", "ORT_ENABLE_EXTENDED"), ("2", "ORT_DISABLE_ALL")],
)
def test_graph_levels_mean_what_tritons_optimization_graph_level_means(
    mlp_file: Path, level: str, expected: str
) -> None:
    instance = loaded(backend_model(mlp_file, mlp_spec(graph_optimization_level=level)))
    level_set = instance.session.get_session_options().graph_optimization_level
    assert level_set == getattr(ort.GraphOptimizationLevel, expected)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("intra_op_thread_count", "many", r"'intra_op_thread_count' must be an integer >= 0, got 'many'"),
        ("graph_optimization_level", "5", r"'graph_optimization_level' must be one of -1, 0, 1, 2, got '5'"),
        ("execution_mode", "2", r"'execution_mode' must be one of 0, 1"),
        ("execution_accelerator", "openvino", r"'execution_accelerator' must be one of cuda, tensorrt"),
        ("precision_mode", "FP8", r"'precision_mode' must be FP32, FP16 or INT8"),
    ],
)
def test_invalid_parameters_fail_create(mlp_file: Path, key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ort_backend.create(backend_model(mlp_file, mlp_spec(**{key: value})))


def test_accelerator_parameters_become_provider_options() -> None:
    config = ort_backend.SessionConfig.from_parameters(
        "m",
        {
            "execution_accelerator": "tensorrt",
            "precision_mode": "FP16",
            "max_workspace_size_bytes": "1073741824",
            "trt_engine_cache_enable": "1",
            "cudnn_conv_algo_search": "1",
            "gpu_mem_limit": "4294967296",
            "my_own_setting": "kept for the model",
        },
    )
    assert config.tensorrt
    assert config.tensorrt_options == {
        "trt_fp16_enable": "True",
        "trt_max_workspace_size": "1073741824",
        "trt_engine_cache_enable": "1",
    }
    assert config.cuda_options == {"cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "4294967296"}


# --- custom operations ------------------------------------------------------------------------------------------


def test_a_custom_op_library_is_registered_before_the_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime_extensions sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python when imported: keep it from the
    # processes later tests start (both calls are undone at the end: the variable is as it was before).
    monkeypatch.setenv("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "")
    monkeypatch.delenv("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
    extensions = pytest.importorskip("onnxruntime_extensions", reason="needs onnxruntime-extensions' op library")
    path = save(
        tmp_path / "model.onnx",
        [helper.make_node("StringUpper", ["s"], ["t"], domain="ai.onnx.contrib")],
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, ["N"])],
    )
    spec = ModelSpec("upper", 1, (Tensor("s", bytes, ()),), (Tensor("t", bytes, ()),), ModelConfig(max_batch_size=4))
    with pytest.raises(ConfigError, match="StringUpper"):
        loaded(backend_model(path, spec))  # without the library the op is unknown
    instance = loaded(backend_model(path, spec, op_libraries=(extensions.get_library_path(),)))
    (response,) = instance(RequestBatch([Request({"s": np.array([b"ab", b"Cd"], dtype=object)})]))
    assert response["t"].tolist() == [b"AB", b"CD"]


def test_a_missing_custom_op_library_fails_setup_naming_it(mlp_file: Path) -> None:
    instance = ort_backend.create(backend_model(mlp_file, mlp_spec(), op_libraries=("/nowhere/libcustom.so",)))
    with pytest.raises(ConfigError, match=r"custom op library /nowhere/libcustom.so does not exist"):
        instance.setup("cpu")


# --- autocomplete and open_onnx ---------------------------------------------------------------------------------


def test_autocomplete_reads_the_graphs_tensors(mlp_file: Path) -> None:
    signature = ort_backend.autocomplete(mlp_file)
    assert signature == Signature(
        inputs=(TensorSignature("x", "FP32", (-1, 4)),),
        outputs=(
            TensorSignature("y", "FP32", (-1, 3)),
            TensorSignature("hidden", "FP32", (-1, 8)),
            TensorSignature("rows", "FP32", (-1, 4)),
        ),
    )
    assert signature.batch_dim


def test_autocomplete_names_kserve_datatypes(tmp_path: Path) -> None:
    path = save(
        tmp_path / "model.onnx",
        [helper.make_node("Identity", ["s"], ["t"]), helper.make_node("Not", ["b"], ["c"])],
        [
            helper.make_tensor_value_info("s", TensorProto.STRING, [2]),
            helper.make_tensor_value_info("b", TensorProto.BOOL, [2]),
        ],
        [
            helper.make_tensor_value_info("t", TensorProto.STRING, [2]),
            helper.make_tensor_value_info("c", TensorProto.BOOL, [2]),
        ],
    )
    signature = ort_backend.autocomplete(path)
    assert signature is not None
    assert [(t.name, t.datatype, t.dims) for t in signature.inputs] == [("s", "BYTES", (2,)), ("b", "BOOL", (2,))]
    assert not signature.batch_dim


def test_open_onnx_applies_session_options_by_their_onnxruntime_names(mlp_file: Path) -> None:
    session = open_onnx(mlp_file, "cpu", intra_op_num_threads=1, log_severity_level=3)
    assert session.get_session_options().intra_op_num_threads == 1
    assert session.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(ConfigError, match="SessionOptions has no option 'threads'"):
        open_onnx(mlp_file, "cpu", threads=1)


def test_the_created_object_is_small_to_pickle(mlp_file: Path) -> None:
    assert len(cloudpickle.dumps(ort_backend.create(backend_model(mlp_file, mlp_spec())))) < 4096
    instance = loaded(backend_model(mlp_file, mlp_spec()))
    # Pickling a set-up instance leaves the session behind; the copy sets itself up again.
    again = cloudpickle.loads(cloudpickle.dumps(instance))
    assert again.session is None
    again.setup("cpu")
    (response,) = again(RequestBatch([Request({"x": np.ones((1, 4), np.float32)})]))
    np.testing.assert_allclose(response["y"], expected_mlp(np.ones((1, 4), np.float32))[0], rtol=1e-5, atol=1e-5)


def test_onnxruntime_can_use_a_gpu_where_its_build_has_the_cuda_provider() -> None:
    assert ort_backend.gpu_capable() is ("CUDAExecutionProvider" in ort.get_available_providers())
