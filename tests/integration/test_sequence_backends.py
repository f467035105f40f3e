"""Stateful ONNX and TorchScript models from a repository: ``sequence_batching`` with a START control input and an
implicit state (Triton's accumulator: ``ACC_OUT = ACC * (1 - START) + INPUT``), the control and state tensors fed to
the model file by the instance, the state kept there between requests — driven by tritonclient over HTTP and gRPC."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import Serve, ServeConfig
from pyserve.errors import ServerError

pytest.importorskip("onnxruntime", reason="ONNX Runtime is not installed: pip install -e '.[onnx]'")
onnx = pytest.importorskip("onnx", reason="onnx is not installed: pip install -e '.[onnx]'")

pytestmark = pytest.mark.integration

FREE_PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}

CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
  state [ {{ input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }} }} ]
}}
"""


def write_accumulator(folder: Path, name: str, batching: bool, with_state: bool = True) -> None:
    """The model: ``ACC_OUT = ACC * (1 - START) + INPUT`` (int32), OUTPUT the same; without ``with_state`` a file
    that lacks the state tensors the config names."""
    from onnx import TensorProto, helper, numpy_helper

    dims: list[int | str] = ["batch", 1] if batching else [1]
    nodes = [
        helper.make_node("Sub", ["ONE", "START"], ["keep"]),
        helper.make_node("Mul", ["ACC", "keep"], ["kept"]),
        helper.make_node("Add", ["kept", "INPUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
    ]
    inputs = ["INPUT", "START", "ACC"]
    outputs = ["OUTPUT", "ACC_OUT"]
    if not with_state:
        nodes = [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])]
        inputs, outputs = ["INPUT"], ["OUTPUT"]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.INT32, dims) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.INT32, dims) for n in outputs],
        initializer=[numpy_helper.from_array(np.array([1], np.int32), "ONE")] if with_state else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (folder / name / "1").mkdir(parents=True)
    onnx.save(model, str(folder / name / "1" / "model.onnx"))
    (folder / name / "config.pbtxt").write_text(config_text(name, batching, "onnxruntime"))


def config_text(name: str, batching: bool, backend: str) -> str:
    return CONFIG.format(name=name, max_batch_size=8 if batching else 0, backend=backend)


TORCH_ACCUMULATOR = """
from typing import Dict

import torch


class Accumulator(torch.nn.Module):
    def forward(self, INPUT: torch.Tensor, START: torch.Tensor, ACC: torch.Tensor) -> Dict[str, torch.Tensor]:
        total = ACC * (1 - START) + INPUT
        return {"OUTPUT": total, "ACC_OUT": total}
"""


def write_torch_accumulator(folder: Path, name: str, batching: bool) -> None:
    """The same model in TorchScript: forward() takes the control and state inputs by name, returns a dict."""
    import importlib.util
    import sys

    torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[torch]'")
    source = folder / "torch_accumulator.py"
    source.write_text(TORCH_ACCUMULATOR)  # torch.jit.script reads the class's source from a file
    spec = importlib.util.spec_from_file_location("torch_accumulator", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_accumulator"] = module
    spec.loader.exec_module(module)
    (folder / name / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated; Triton still serves it
        torch.jit.script(module.Accumulator()).save(str(folder / name / "1" / "model.pt"))
    source.unlink()
    (folder / name / "config.pbtxt").write_text(config_text(name, batching, "pytorch"))


def send(client: object, module: object, name: str, value: int, sequence: int | str, **flags: bool) -> int:
    tensor = module.InferInput("INPUT", [1, 1] if name == "acc_batched" else [1], "INT32")  # type: ignore[attr-defined]
    shape = (1, 1) if name == "acc_batched" else (1,)
    tensor.set_data_from_numpy(np.full(shape, value, np.int32))
    result = client.infer(name, [tensor], sequence_id=sequence, **flags)  # type: ignore[attr-defined]
    return int(result.as_numpy("OUTPUT").reshape(-1)[0])


@pytest.mark.parametrize("backend", ["onnxruntime", "pytorch"])
@pytest.mark.parametrize("name", ["acc_batched", "acc_unbatched"])
def test_an_accumulator_model_file_keeps_its_state_per_sequence(tmp_path: Path, name: str, backend: str) -> None:
    if backend == "pytorch":
        write_torch_accumulator(tmp_path, name, batching=name == "acc_batched")
    else:
        write_accumulator(tmp_path, name, batching=name == "acc_batched")
    with Serve(ServeConfig(**FREE_PORTS), model_repository=tmp_path) as server:
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        grpc = triton_grpc.InferenceServerClient(server.grpc_address)
        try:
            # Two sequences interleaved (two instances: the unbatched model has a slot on each), one over each
            # protocol; an int and a string correlation id.
            assert send(http, triton_http, name, 5, 11, sequence_start=True) == 5
            assert send(grpc, triton_grpc, name, 100, "s-2", sequence_start=True) == 100
            assert send(http, triton_http, name, 3, 11) == 8
            assert send(grpc, triton_grpc, name, 1, "s-2") == 101
            assert send(http, triton_http, name, 2, 11, sequence_end=True) == 10
            # A new sequence on the same id starts from zero: START is fed, and the state was dropped at the end.
            assert send(grpc, triton_grpc, name, 7, 11, sequence_start=True) == 7
            total = 7
            for step in range(1, 51):
                total += step
                assert send(http, triton_http, name, step, 11) == total
            assert send(grpc, triton_grpc, name, 0, "s-2", sequence_end=True) == 101
            with pytest.raises(InferenceServerException, match="correlation ID"):
                send(http, triton_http, name, 1, 0)  # a stateful model wants a sequence id
        finally:
            http.close()
            grpc.close()


def test_a_model_file_without_the_state_tensors_fails_to_load(tmp_path: Path) -> None:
    write_accumulator(tmp_path, "acc_batched", batching=True, with_state=False)
    with pytest.raises(ServerError, match=r"input 'START' is declared in the config but the model file has no such"):
        Serve(ServeConfig(**FREE_PORTS), model_repository=tmp_path).run()
