"""The example's model: a small MLP classifier written as an ONNX graph with ``onnx.helper``, run by OpenVINO.

``features`` (FP32, ``[batch, 256]``) -> MatMul + Add + Relu (512 wide) -> MatMul + Add -> ``logits`` (FP32,
``[batch, 10]``) -> Softmax -> ``probabilities``. The weights come from a fixed seed, so ``reference`` (numpy alone)
computes what the server must answer. Nothing is downloaded and no file is written: OpenVINO reads the ONNX bytes.

``OpenVinoClassifier`` is the bound class: pyserve makes one per instance, in that instance, and calls
``setup(device)`` there before the first batch; ``bind_classifier(server)`` binds it with dynamic batching.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyserve import ModelConfig, Serve, Tensor, batch

MODEL_NAME = "classifier"
FEATURES = 256
HIDDEN = 512
CLASSES = 10
SEED = 20261130
MAX_BATCH_SIZE = 64
OPSET = 17
# FP32 inference: on CPUs with AVX512-BF16 or AMX, OpenVINO's default precision hint is bf16, which is faster but
# differs from numpy by ~1e-2. "bf16" here trades that accuracy for speed.
COMPILE_CONFIG = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}


def weights(seed: int = SEED) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (weight, bias) of each layer; the same seed gives the same weights."""
    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in ((FEATURES, HIDDEN), (HIDDEN, CLASSES)):
        weight = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        layers.append((weight, bias))
    return layers


def onnx_bytes(seed: int = SEED) -> bytes:
    """The serialized ONNX model, built with ``onnx.helper`` (the batch dimension is symbolic)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    (w0, b0), (w1, b1) = weights(seed)
    initializers = [numpy_helper.from_array(array, name) for array, name in ((w0, "W0"), (b0, "B0"), (w1, "W1"))]
    initializers.append(numpy_helper.from_array(b1, "B1"))
    nodes = [
        helper.make_node("MatMul", ["features", "W0"], ["matmul0"]),
        helper.make_node("Add", ["matmul0", "B0"], ["add0"]),
        helper.make_node("Relu", ["add0"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "W1"], ["matmul1"]),
        helper.make_node("Add", ["matmul1", "B1"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        MODEL_NAME,
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", FEATURES])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", CLASSES]),
        ],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    serialized: bytes = model.SerializeToString()
    return serialized


def reference(features: np.ndarray, seed: int = SEED) -> dict[str, np.ndarray]:
    """What the model computes, in numpy."""
    (w0, b0), (w1, b1) = weights(seed)
    logits = np.maximum(features @ w0 + b0, 0) @ w1 + b1
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return {"logits": logits, "probabilities": exp / exp.sum(axis=-1, keepdims=True)}


def compile_model(device: str = "cpu") -> Any:
    """The model compiled by OpenVINO for pyserve's ``device``; only ``"cpu"`` has an OpenVINO device here.

    OpenVINO's ``GPU`` plugin drives Intel GPUs, not the CUDA devices pyserve places instances on, so a ``cuda``
    device is refused rather than silently run on the CPU.
    """
    import openvino as ov

    if device != "cpu":
        raise ValueError(f"OpenVINO example: device {device!r} is not supported, use 'cpu'")
    core = ov.Core()
    return core.compile_model(core.read_model(onnx_bytes(), b""), "CPU", COMPILE_CONFIG)


class OpenVinoClassifier:
    """The bound class: compiles the model in ``setup`` and runs one OpenVINO call per batch."""

    def setup(self, device: str) -> None:
        """Compile the model on the instance's device (pyserve calls this in the instance, before any batch)."""
        self.compiled = compile_model(device)

    @batch
    def __call__(self, features: np.ndarray) -> dict[str, np.ndarray]:
        # One call for the whole batch; OpenVINO returns fresh arrays (share_outputs=False), safe to hand back.
        result = self.compiled({"features": features})
        return {"logits": result["logits"], "probabilities": result["probabilities"]}


def bind_classifier(server: Serve) -> None:
    """Bind ``classifier``: requests waiting together are merged into one OpenVINO call of up to 64 rows."""
    server.bind(
        MODEL_NAME,
        OpenVinoClassifier,  # the class, not an instance: each instance makes and sets up its own
        inputs=[Tensor("features", np.float32, (FEATURES,))],
        outputs=[Tensor("logits", np.float32, (CLASSES,)), Tensor("probabilities", np.float32, (CLASSES,))],
        config=ModelConfig(max_batch_size=MAX_BATCH_SIZE),  # dynamic batching is on for batching models
    )
