"""The framework backends on GPUs: ONNX Runtime's CUDA and TensorRT providers, torch on cuda:N, TensorRT engines.

Runs only where CUDA is present (skipped with the reason elsewhere); each framework's tests skip when it is missing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from pyserve.backends import onnxruntime as ort_backend
from pyserve.backends import pytorch as torch_backend
from pyserve.backends import tensorrt as trt_backend
from pyserve.backends.base import BackendModel, Signature, TensorSignature
from pyserve.backends.open import open_tensorrt, open_torchscript
from pyserve.config import ModelConfig, ModelSpec, Tensor
from pyserve.errors import ConfigError, InvalidInputError
from pyserve.request import Request, RequestBatch

torch = pytest.importorskip("torch", reason="torch is not installed: the GPU backend tests need it")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]

rng = np.random.default_rng(0)
W1 = rng.standard_normal((4, 8)).astype(np.float32)
B1 = rng.standard_normal(8).astype(np.float32)
W2 = rng.standard_normal((8, 3)).astype(np.float32)
B2 = rng.standard_normal(3).astype(np.float32)
X = [rng.standard_normal((rows, 4)).astype(np.float32) for rows in (1, 2, 3)]


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W1 + B1, 0) @ W2 + B2  # type: ignore[no-any-return]


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    """x [N, 4] -> y = Relu(x W1 + b1) W2 + b2 [N, 3], as ONNX."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed")
    helper = onnx.helper
    init = [onnx.numpy_helper.from_array(a, n) for a, n in ((W1, "W1"), (B1, "B1"), (W2, "W2"), (B2, "B2"))]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["m1"]),
        helper.make_node("Add", ["m1", "B1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["m2"]),
        helper.make_node("Add", ["m2", "B2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])],
        initializer=init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def mlp_model(path: Path, x_dtype: Any = np.float32, **params: str) -> BackendModel:
    spec = ModelSpec(
        "mlp",
        1,
        (Tensor("x", x_dtype, (4,)),),
        (Tensor("y", np.float32, (3,)),),
        ModelConfig(max_batch_size=8, parameters=params),
    )
    return BackendModel(spec=spec, model_file=path, version_dir=path.parent, model_dir=path.parent.parent)


def loaded(backend: Any, model: BackendModel, device: str) -> Any:
    """create() -> a trip through cloudpickle (as to a process instance) -> setup(device)."""
    instance = cloudpickle.loads(cloudpickle.dumps(backend.create(model)))
    instance.setup(device)
    return instance


def assert_serves_the_mlp(instance: Any, tolerance: float = 1e-4) -> None:
    responses = instance(RequestBatch(Request({"x": x}) for x in X))
    for x, response in zip(X, responses, strict=True):
        np.testing.assert_allclose(response["y"], expected(x), rtol=tolerance, atol=tolerance)


def needs_provider(name: str) -> Any:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    if name not in ort.get_available_providers():
        pytest.skip(f"the installed onnxruntime has no {name} (install onnxruntime-gpu)")
    return ort


# --- ONNX Runtime -------------------------------------------------------------------------------------------------


def test_onnx_on_cuda0_runs_on_the_cuda_provider(mlp_file: Path) -> None:
    needs_provider("CUDAExecutionProvider")
    instance = loaded(ort_backend, mlp_model(mlp_file), "cuda:0")
    assert instance.session.get_providers()[0] == "CUDAExecutionProvider"
    assert instance.session.get_provider_options()["CUDAExecutionProvider"]["device_id"] == "0"
    assert_serves_the_mlp(instance)


def test_onnx_with_the_tensorrt_accelerator_puts_the_tensorrt_provider_first(mlp_file: Path, tmp_path: Path) -> None:
    needs_provider("TensorrtExecutionProvider")
    model = mlp_model(mlp_file, execution_accelerator="tensorrt", trt_engine_cache_enable="1")
    model = BackendModel(
        spec=ModelSpec(
            model.spec.name,
            1,
            model.spec.inputs,
            model.spec.outputs,
            ModelConfig(max_batch_size=8, parameters={**model.parameters, "trt_engine_cache_path": str(tmp_path)}),
        ),
        model_file=mlp_file,
        version_dir=mlp_file.parent,
        model_dir=mlp_file.parent.parent,
    )
    try:
        instance = loaded(ort_backend, model, "cuda:0")
    except ConfigError as exc:
        if "could not start" in str(exc):
            pytest.skip(f"TensorRT libraries are missing for onnxruntime: {exc}")
        raise
    assert instance.session.get_providers()[:2] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    assert_serves_the_mlp(instance, tolerance=1e-2)


# --- PyTorch ------------------------------------------------------------------------------------------------------


class Scale(torch.nn.Module):
    """forward(INPUT__0) -> INPUT__0 * weight, with the weight on the module's device."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((4,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def scale_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated upstream, still served
        scripted = torch.jit.script(Scale())
    scripted.save(str(path))
    return path


def scale_model(path: Path) -> BackendModel:
    spec = ModelSpec(
        "scale", 1, (Tensor("INPUT__0", np.float32, (4,)),), (Tensor("OUTPUT__0", np.float32, (4,)),), ModelConfig(8)
    )
    return BackendModel(spec=spec, model_file=path, version_dir=path.parent, model_dir=path.parent.parent)


def test_torch_on_cuda0_loads_the_module_there_and_returns_host_arrays(tmp_path: Path) -> None:
    path = scale_file(tmp_path)
    assert next(open_torchscript(path, "cuda:0").parameters()).device == torch.device("cuda", 0)
    instance = loaded(torch_backend, scale_model(path), "cuda:0")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    read_only = x.copy()
    read_only.flags.writeable = False
    first, second = instance(RequestBatch([Request({"INPUT__0": x}), Request({"INPUT__0": read_only})]))
    np.testing.assert_array_equal(first["OUTPUT__0"], x * 2)
    np.testing.assert_array_equal(second["OUTPUT__0"], x * 2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_instances_run_on_cuda0_and_cuda1(tmp_path: Path, mlp_file: Path) -> None:
    path = scale_file(tmp_path)
    for device in ("cuda:0", "cuda:1"):
        module = open_torchscript(path, device)
        assert next(module.parameters()).device == torch.device(device)
        instance = loaded(torch_backend, scale_model(path), device)
        (response,) = instance(RequestBatch([Request({"INPUT__0": np.ones((1, 4), np.float32)})]))
        assert response["OUTPUT__0"].tolist() == [[2.0] * 4]
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        for index in (0, 1):
            instance = loaded(ort_backend, mlp_model(mlp_file), f"cuda:{index}")
            assert instance.session.get_provider_options()["CUDAExecutionProvider"]["device_id"] == str(index)
            assert_serves_the_mlp(instance)


# --- TensorRT -----------------------------------------------------------------------------------------------------


@pytest.fixture
def plan_file(mlp_file: Path) -> Path:
    """The ONNX MLP built into a TensorRT engine with one profile for 1..8 rows."""
    trt = pytest.importorskip("tensorrt", reason="tensorrt is not installed")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(mlp_file.read_bytes()):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        pytest.fail(f"TensorRT could not parse the ONNX model: {errors}")
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 4), (4, 4), (8, 4))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None, "TensorRT could not build the engine"
    path = mlp_file.with_name("model.plan")
    path.write_bytes(bytes(plan))
    return path


def test_a_tensorrt_plan_serves_batches_of_any_size_in_its_profile(plan_file: Path) -> None:
    instance = loaded(trt_backend, mlp_model(plan_file), "cuda:0")
    assert_serves_the_mlp(instance, tolerance=1e-2)
    with pytest.raises(InvalidInputError, match=r"input 'x': shape \[9, 4\] is outside the engine's"):
        instance(RequestBatch([Request({"x": np.ones((9, 4), np.float32)})]))


def test_a_tensorrt_plan_describes_its_tensors(plan_file: Path) -> None:
    assert trt_backend.autocomplete(plan_file) == Signature(
        inputs=(TensorSignature("x", "FP32", (-1, 4)),), outputs=(TensorSignature("y", "FP32", (-1, 3)),)
    )
    engine = open_tensorrt(plan_file, "cuda:0")
    outputs = engine({"x": X[2]})
    np.testing.assert_allclose(outputs["y"], expected(X[2]), rtol=1e-2, atol=1e-2)


def test_a_tensorrt_plan_with_a_mismatching_config_fails_setup(plan_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"input 'x': the config declares INT32, the model file has FP32"):
        loaded(trt_backend, mlp_model(plan_file, x_dtype=np.int32), "cuda:0")
    with pytest.raises(ConfigError, match="engines run on a GPU"):
        loaded(trt_backend, mlp_model(plan_file), "cpu")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_tensorrt_instances_run_on_cuda0_and_cuda1(plan_file: Path) -> None:
    for device in ("cuda:0", "cuda:1"):
        assert_serves_the_mlp(loaded(trt_backend, mlp_model(plan_file), device), tolerance=1e-2)
