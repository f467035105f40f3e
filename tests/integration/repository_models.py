"""Model repositories for the repository tests, built at test time: small ONNX graphs, pyserve-form model.py files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

FREE_PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}


def mlp_weights(seed: int, width_in: int = 4, width_out: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The weights and bias of a one-layer MLP (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((width_in, width_out)).astype(np.float32), rng.standard_normal(width_out).astype(
        np.float32
    )


def mlp_reference(x: np.ndarray, seed: int) -> np.ndarray:
    """What the MLP of ``write_onnx_mlp(seed=seed)`` computes, in numpy."""
    weights, bias = mlp_weights(seed)
    return np.asarray(np.maximum(x @ weights + bias, 0.0), dtype=np.float32)


def write_onnx_mlp(path: Path, seed: int = 0, input_type: int | None = None) -> None:
    """``OUTPUT0 = relu(INPUT0 @ W + b)``, INPUT0 [batch, 4] float32 (or ``input_type``), OUTPUT0 [batch, 3]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights, bias = mlp_weights(seed)
    elem = TensorProto.FLOAT if input_type is None else input_type
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT0", "W"], ["mm"]),
            helper.make_node("Add", ["mm", "B"], ["biased"]),
            helper.make_node("Relu", ["biased"], ["OUTPUT0"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("INPUT0", elem, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


MLP_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def add_onnx_model(repository: Path, name: str, seed: int = 0, version: int = 1, config: bool = True) -> Path:
    """An ONNX MLP model directory (with config.pbtxt unless ``config`` is False)."""
    model_dir = repository / name
    write_onnx_mlp(model_dir / str(version) / "model.onnx", seed)
    if config:
        (model_dir / "config.pbtxt").write_text(MLP_CONFIG.format(name=name))
    return model_dir


PLUS_MODEL = """
import numpy as np
from pyserve import batch

@batch
def infer_func(INPUT0):
    return {{"OUTPUT0": INPUT0 + np.float32({offset})}}
"""

PLUS_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
"""


def add_python_model(repository: Path, name: str, offset: float, version: int = 1, policy: str = "") -> Path:
    """A pyserve-form model.py adding ``offset`` to INPUT0 (config.pbtxt with the version policy given)."""
    model_dir = repository / name
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.py").write_text(textwrap.dedent(PLUS_MODEL.format(offset=offset)))
    (model_dir / "config.pbtxt").write_text(PLUS_CONFIG + policy)
    return model_dir
