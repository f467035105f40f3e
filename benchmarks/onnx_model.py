"""The ONNX MLP of ``bench_onnx.py``: the model file, its repository entry and the session every contender runs.

``INPUT0`` (FP32, ``[batch, 512]``) -> 3 x (MatMul + Add + Relu), 512 wide -> ``OUTPUT0`` (FP32, ``[batch, 512]``),
weights drawn from a fixed seed. ``open_session`` is how the direct loop and PyTriton open it, with the same
session options the repository config gives pyserve (``intra_op_thread_count``); the CPU provider in all three.

Imported from PyTriton's virtual environment too (``onnx_pytriton_server.py``), where only numpy and onnxruntime
are installed: ``onnx`` is imported only by ``write_model``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

MODEL_NAME = "mlp"
INPUT_NAME = "INPUT0"
OUTPUT_NAME = "OUTPUT0"
WIDTH = 512
LAYERS = 3
SEED = 20261130
MAX_BATCH_SIZE = 64
OPSET = 17

CONFIG_TEMPLATE = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "{input}" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ {width} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value {{ string_value: "{intra_op_threads}" }} }}
"""


def write_model(path: Path, seed: int = SEED) -> Path:
    """Build the MLP with ``onnx.helper`` and save it at ``path``; the same seed gives the same weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes = []
    initializers = []
    previous = INPUT_NAME
    for layer in range(LAYERS):
        # He initialisation keeps the activations of the 3 Relu layers in a sane range.
        weight = (rng.standard_normal((WIDTH, WIDTH)) * np.sqrt(2.0 / WIDTH)).astype(np.float32)
        bias = (rng.standard_normal(WIDTH) * 0.01).astype(np.float32)
        initializers += [numpy_helper.from_array(weight, f"W{layer}"), numpy_helper.from_array(bias, f"B{layer}")]
        output = OUTPUT_NAME if layer == LAYERS - 1 else f"relu{layer}"
        nodes += [
            helper.make_node("MatMul", [previous, f"W{layer}"], [f"matmul{layer}"]),
            helper.make_node("Add", [f"matmul{layer}", f"B{layer}"], [f"add{layer}"]),
            helper.make_node("Relu", [f"add{layer}"], [output]),
        ]
        previous = output
    graph = helper.make_graph(
        nodes,
        MODEL_NAME,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_repository(root: Path, intra_op_threads: int, seed: int = SEED) -> Path:
    """A Triton-layout repository at ``root`` with the MLP as ``mlp`` version 1; returns the ``model.onnx`` path."""
    model_dir = root / MODEL_NAME
    model_file = write_model(model_dir / "1" / "model.onnx", seed)
    config = CONFIG_TEMPLATE.format(
        name=MODEL_NAME,
        max_batch_size=MAX_BATCH_SIZE,
        input=INPUT_NAME,
        output=OUTPUT_NAME,
        width=WIDTH,
        intra_op_threads=intra_op_threads,
    )
    (model_dir / "config.pbtxt").write_text(config)
    return model_file


def open_session(model_file: Path, intra_op_threads: int) -> Any:
    """An ``onnxruntime.InferenceSession`` on the CPU provider with ``intra_op_num_threads`` (0: onnxruntime picks).

    Every other option is onnxruntime's default, as in pyserve's backend when the config sets only
    ``intra_op_thread_count`` (it sets the graph optimisation level explicitly, to the default: all).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
