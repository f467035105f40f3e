"""The PyTorch backend on the CPU: TorchScript and torch.export models saved to tmp_path at test time."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from pyserve.backends import pytorch as torch_backend
from pyserve.backends.base import BackendModel
from pyserve.backends.open import open_torchscript
from pyserve.config import ModelConfig, ModelSpec, Tensor
from pyserve.dtypes import BF16
from pyserve.errors import ConfigError, OutputMismatchError
from pyserve.request import Request, RequestBatch

torch = pytest.importorskip("torch", reason="torch is not installed")


class Affine(torch.nn.Module):
    """forward(x [N, 3], y [N, 2]) -> (x W + b + y [N, 2], rows [N, 1]: the rows of the call)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.full((x.shape[0], 1), x.shape[0], dtype=torch.int64)
        return self.linear(x) + y, rows


class Named(torch.nn.Module):
    """forward(x) -> {"double": 2x, "total": sum over dim 1}."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"double": x * 2, "total": x.sum(dim=1, keepdim=True)}


class InPlace(torch.nn.Module):
    """Writes to its input, as some models do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1)


def script(module: Any, path: Path) -> Path:
    """Save ``module`` as TorchScript (deprecated upstream, still what Triton's pytorch backend serves)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(module).save(str(path))
    return path


def backend_model(path: Path, spec: ModelSpec, **fields: Any) -> BackendModel:
    return BackendModel(spec=spec, model_file=path, version_dir=path.parent, model_dir=path.parent.parent, **fields)


def spec(inputs: list[Tensor], outputs: list[Tensor], max_batch_size: int = 8, **params: str) -> ModelSpec:
    return ModelSpec("torch_model", 1, tuple(inputs), tuple(outputs), ModelConfig(max_batch_size, parameters=params))


AFFINE_INDEXED = spec(
    [Tensor("INPUT__0", np.float32, (3,)), Tensor("INPUT__1", np.float32, (2,))],
    [Tensor("OUTPUT__0", np.float32, (2,)), Tensor("OUTPUT__1", np.int64, (1,))],
)


def loaded(model: BackendModel, device: str = "cpu") -> Any:
    """create() -> a trip through cloudpickle (as to a process instance) -> setup(device)."""
    instance = cloudpickle.loads(cloudpickle.dumps(torch_backend.create(model)))
    instance.setup(device)
    return instance


def affine_requests(*rows: int) -> tuple[list[np.ndarray], list[np.ndarray], RequestBatch]:
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((n, 3)).astype(np.float32) for n in rows]
    ys = [rng.standard_normal((n, 2)).astype(np.float32) for n in rows]
    batch = RequestBatch(Request({"INPUT__0": x, "INPUT__1": y}) for x, y in zip(xs, ys, strict=True))
    return xs, ys, batch


def test_indexed_names_map_by_position_and_three_requests_make_one_call(tmp_path: Path) -> None:
    module = Affine().eval()
    instance = loaded(backend_model(script(module, tmp_path / "model.pt"), AFFINE_INDEXED))
    xs, ys, batch = affine_requests(1, 2, 3)
    responses = instance(batch)
    assert len(responses) == 3
    for x, y, response in zip(xs, ys, responses, strict=True):
        with torch.no_grad():
            expected = module(torch.from_numpy(x), torch.from_numpy(y))[0].numpy()
        np.testing.assert_allclose(response["OUTPUT__0"], expected, rtol=1e-6)
        assert response["OUTPUT__0"].dtype == np.float32
        assert response["OUTPUT__1"].tolist() == [[6]] * len(x)  # one call saw all six rows


def test_inputs_map_by_forward_argument_names_and_outputs_by_dict_keys(tmp_path: Path) -> None:
    path = script(Named(), tmp_path / "model.pt")
    model_spec = spec(
        [Tensor("x", np.float32, (2,))], [Tensor("double", np.float32, (2,)), Tensor("total", "FP32", (1,))]
    )
    instance = loaded(backend_model(path, model_spec))
    x = np.array([[1, 2], [3, 4]], np.float32)
    only_total, both = instance(
        RequestBatch([Request({"x": x[:1]}, requested_output_names=("total",)), Request({"x": x[1:]})])
    )
    assert set(only_total) == {"total"}
    np.testing.assert_array_equal(only_total["total"], [[3]])
    np.testing.assert_array_equal(both["double"], [[6, 8]])


def test_a_torch_export_program_is_served_in_place_of_a_missing_model_pt(tmp_path: Path) -> None:
    module = Affine().eval()
    batch_dim = torch.export.Dim("batch")
    program = torch.export.export(
        module, (torch.randn(2, 3), torch.randn(2, 2)), dynamic_shapes=({0: batch_dim}, {0: batch_dim})
    )
    torch.export.save(program, str(tmp_path / "model.pt2"))
    model_spec = spec(
        [Tensor("x", np.float32, (3,)), Tensor("y", np.float32, (2,))],
        [Tensor("OUTPUT__0", np.float32, (2,)), Tensor("OUTPUT__1", np.int64, (1,))],
    )
    instance = loaded(backend_model(tmp_path / "model.pt", model_spec))
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    (response,) = instance(RequestBatch([Request({"x": x, "y": y})]))
    with torch.no_grad():
        expected = module(torch.from_numpy(x), torch.from_numpy(y))[0].numpy()
    np.testing.assert_allclose(response["OUTPUT__0"], expected, rtol=1e-6)


def test_without_a_batch_dim_each_request_is_its_own_call(tmp_path: Path) -> None:
    model_spec = spec(
        [Tensor("INPUT__0", np.float32, (-1, 3)), Tensor("INPUT__1", np.float32, (-1, 2))],
        [Tensor("OUTPUT__0", np.float32, (-1, 2)), Tensor("OUTPUT__1", np.int64, (-1, 1))],
        max_batch_size=0,
    )
    instance = loaded(backend_model(script(Affine(), tmp_path / "model.pt"), model_spec))
    responses = instance(affine_requests(1, 3)[2])
    assert [r["OUTPUT__1"].ravel().tolist() for r in responses] == [[1], [3, 3, 3]]


def test_reshape_applies_to_inputs_and_outputs(tmp_path: Path) -> None:
    path = script(Named(), tmp_path / "model.pt")
    model_spec = spec([Tensor("x", np.float32, (4,))], [Tensor("double", np.float32, (4,))])
    instance = loaded(backend_model(path, model_spec, reshape={"x": (2, 2), "double": (2, 2)}))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (response,) = instance(RequestBatch([Request({"x": x})]))
    np.testing.assert_array_equal(response["double"], x * 2)


def test_bf16_tensors_pass_both_ways(tmp_path: Path) -> None:
    path = script(Named(), tmp_path / "model.pt")
    instance = loaded(backend_model(path, spec([Tensor("x", "BF16", (2,))], [Tensor("double", "BF16", (2,))])))
    x = np.array([[1.5, -2.0]], dtype=BF16)
    (response,) = instance(RequestBatch([Request({"x": x})]))
    assert response["double"].dtype == BF16
    assert response["double"].astype(np.float32).tolist() == [[3.0, -4.0]]


def test_a_model_writing_to_its_input_never_writes_read_only_server_memory(tmp_path: Path) -> None:
    path = script(InPlace(), tmp_path / "model.pt")
    instance = loaded(backend_model(path, spec([Tensor("x", np.float32, (2,))], [Tensor("y", np.float32, (2,))])))
    x = np.zeros((1, 2), np.float32)
    x.flags.writeable = False
    (response,) = instance(RequestBatch([Request({"x": x})]))
    assert response["y"].tolist() == [[1, 1]]
    assert x.tolist() == [[0, 0]]


def test_parameters_set_torch_threads(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        loaded(
            backend_model(script(Affine(), tmp_path / "model.pt"), spec(*_affine_tensors(), INTRA_OP_THREAD_COUNT="1"))
        )
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match="'INTRA_OP_THREAD_COUNT' must be an integer >= 1, got 'all'"):
        loaded(backend_model(tmp_path / "model.pt", spec(*_affine_tensors(), INTRA_OP_THREAD_COUNT="all")))


def _affine_tensors() -> tuple[list[Tensor], list[Tensor]]:
    return list(AFFINE_INDEXED.inputs), list(AFFINE_INDEXED.outputs)


# --- what fails a load or a call --------------------------------------------------------------------------------


def test_bytes_tensors_fail_create(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tensors \['text'\] are BYTES"):
        torch_backend.create(backend_model(tmp_path / "model.pt", spec([Tensor("text", bytes)], [Tensor("y", "FP32")])))


def test_an_input_that_is_neither_indexed_nor_a_forward_argument_fails_setup(tmp_path: Path) -> None:
    path = script(Named(), tmp_path / "model.pt")
    with pytest.raises(ConfigError, match=r"inputs \['image'\] are neither forward\(\) arguments \(x\)"):
        loaded(backend_model(path, spec([Tensor("image", np.float32, (2,))], [Tensor("double", np.float32, (2,))])))


def test_an_output_forward_does_not_return_fails_the_call(tmp_path: Path) -> None:
    path = script(Named(), tmp_path / "model.pt")
    model_spec = spec([Tensor("x", np.float32, (2,))], [Tensor("triple", np.float32, (2,))])
    instance = loaded(backend_model(path, model_spec))
    with pytest.raises(OutputMismatchError, match=r"output 'triple'.*a dict with keys \['double', 'total'\]"):
        instance(RequestBatch([Request({"x": np.ones((1, 2), np.float32)})]))


def test_a_missing_model_file_fails_setup_naming_it(tmp_path: Path) -> None:
    instance = torch_backend.create(backend_model(tmp_path / "model.pt", AFFINE_INDEXED))
    with pytest.raises(ConfigError, match=r"model 'torch_model': model file .*model.pt does not exist"):
        instance.setup("cpu")


def test_a_missing_custom_op_library_fails_setup_naming_it(tmp_path: Path) -> None:
    path = script(Affine(), tmp_path / "model.pt")
    instance = torch_backend.create(backend_model(path, AFFINE_INDEXED, op_libraries=("/nowhere/libops.so",)))
    with pytest.raises(ConfigError, match=r"custom op library /nowhere/libops\.so does not exist"):
        instance.setup("cpu")


def test_a_gpu_device_torch_does_not_see_fails_setup(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    path = script(Affine(), tmp_path / "model.pt")
    with pytest.raises(ConfigError, match=r"device 'cuda:0': torch .* sees no CUDA GPU"):
        loaded(backend_model(path, AFFINE_INDEXED), device="cuda:0")


def test_autocomplete_has_nothing_to_read() -> None:
    assert torch_backend.autocomplete(Path("model.pt")) is None


def test_open_torchscript_loads_a_module_for_a_bound_class(tmp_path: Path) -> None:
    module = open_torchscript(script(Named(), tmp_path / "model.pt"), "cpu")
    assert not module.training
    assert module(torch.ones(1, 2))["double"].tolist() == [[2.0, 2.0]]


def test_torch_can_use_a_gpu_where_cuda_is_available() -> None:
    assert torch_backend.gpu_capable() is torch.cuda.is_available()
