"""Tests of pyserve.pytriton's surface: PyTriton's module paths and names, its exception names over pyserve's errors,
its decorators (the two written for it: triton_context and group_by_values below @batch), and its place in the
layers (it uses pyserve; nothing in pyserve uses it)."""

from __future__ import annotations

import ast
import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pyserve
from pyserve import decorators as pyserve_decorators
from pyserve import errors
from pyserve.config import DynamicBatcher, ModelConfig, Tensor
from pyserve.pytriton import exceptions
from pyserve.pytriton.client import exceptions as client_exceptions
from pyserve.pytriton.decorators import (
    ConstantPadder,
    batch,
    first_value,
    get_inference_request_batch_size,
    group_by_values,
    sample,
    triton_context,
)
from pyserve.request import ModelContext, Request, reset_current_model, set_current_model

# Every name of PyTriton's user API, by the module PyTriton has it in.
PYTRITON_NAMES = {
    "triton": "Triton TritonConfig",
    "model_config": "DeviceKind DynamicBatcher ModelConfig QueuePolicy Tensor TimeoutAction",
    "decorators": "ConstantPadder TritonContext batch fill_optionals first_value group_by_keys group_by_values "
    "pad_batch sample triton_context",
    "client": "AsyncioDecoupledModelClient AsyncioModelClient DecoupledModelClient FuturesModelClient ModelClient",
    "client.exceptions": "PyTritonClientClosedError PyTritonClientError PyTritonClientInferenceServerError "
    "PyTritonClientInvalidUrlError PyTritonClientModelDoesntSupportBatchingError PyTritonClientModelUnavailableError "
    "PyTritonClientQueueFullError PyTritonClientTimeoutError PyTritonClientUrlParseError PyTritonClientValueError",
    "proxy.types": "Request Requests",
    "exceptions": "PyTritonBadParameterError PyTritonError PyTritonInvalidOperationError PyTritonModelConfigError "
    "PyTritonRuntimeError PyTritonUnrecoverableError PyTritonValidationError",
}


@pytest.mark.parametrize("module", sorted(PYTRITON_NAMES))
def test_pytritons_module_paths_hold_its_names(module: str) -> None:
    imported = importlib.import_module(f"pyserve.pytriton.{module}")
    for name in PYTRITON_NAMES[module].split():
        assert getattr(imported, name).__doc__, f"pyserve.pytriton.{module}.{name}"


def test_the_decorators_are_pyserves_own() -> None:
    for name in ("batch", "sample", "group_by_keys", "fill_optionals", "first_value", "pad_batch", "ConstantPadder"):
        assert getattr(importlib.import_module("pyserve.pytriton.decorators"), name) is getattr(
            pyserve_decorators, name
        )


def test_exception_names_catch_what_pyserve_raises() -> None:
    assert exceptions.PyTritonError is errors.PyServeError
    assert exceptions.PyTritonValidationError is errors.ConfigError
    assert issubclass(exceptions.PyTritonUnrecoverableError, errors.ModelExecutionError)
    assert client_exceptions.PyTritonClientError is errors.PyServeError
    assert issubclass(errors.ClientTimeoutError, client_exceptions.PyTritonClientTimeoutError)
    assert client_exceptions.PyTritonClientModelDoesntSupportBatchingError is errors.UnsupportedError
    assert client_exceptions.PyTritonClientQueueFullError is errors.QueueFullError


# decorators --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def running(name: str = "m", max_batch_size: int = 8, outputs: tuple[Tensor, ...] = ()) -> Iterator[ModelContext]:
    context = ModelContext(
        name=name,
        version=2,
        inputs=(Tensor("k", np.int32, (1,)), Tensor("x", bytes, (-1,), optional=True)),
        outputs=outputs or (Tensor("y", np.float32, (-1,)),),
        config=ModelConfig(max_batch_size=max_batch_size, batcher=DynamicBatcher(max_queue_delay_microseconds=5)),
    )
    token = set_current_model(context)
    try:
        yield context
    finally:
        reset_current_model(token)


def rows(**inputs: Any) -> list[Request]:
    return [Request({name: np.asarray(value) for name, value in inputs.items()})]


def test_triton_context_describes_the_running_model() -> None:
    @batch
    @triton_context
    def infer(k: np.ndarray, triton_context: Any, **_: Any) -> dict[str, np.ndarray]:
        config = triton_context.model_configs[infer]
        assert (config.model_name, config.model_version, config.max_batch_size, config.batching) == ("m", 2, 8, True)
        assert [(t.name, t.shape, t.dtype, t.optional) for t in config.inputs] == [
            ("k", (1,), np.int32, False),
            ("x", (-1,), np.bytes_, True),
        ]
        assert config.batcher.max_queue_delay_microseconds == 5
        return {"y": k.astype(np.float32)}

    with running():
        (out,) = infer(rows(k=[[3]]))
    assert out["y"].tolist() == [[3.0]]
    with pytest.raises(LookupError):
        infer(rows(k=[[3]]))


def test_group_by_values_below_batch_calls_once_per_value_and_keeps_row_order() -> None:
    calls = []

    @batch
    @group_by_values("k")
    def infer(k: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(k.ravel().tolist())
        return {"y": x * k}

    with running():
        (out,) = infer(rows(k=[[2], [3], [2]], x=[[1.0], [1.0], [5.0]]))
    assert calls == [[2, 2], [3]]
    assert out["y"].tolist() == [[2.0], [3.0], [10.0]]


def test_group_by_values_pad_fn_pads_the_groups_outputs_to_one_shape() -> None:
    @batch
    @group_by_values("k", pad_fn=ConstantPadder(-1))
    def infer(k: np.ndarray) -> tuple[np.ndarray]:
        width = int(k[0, 0])
        return (np.full((len(k), width), width, dtype=np.int32),)

    with running(outputs=(Tensor("y", np.int32, (-1,)),)):
        (out,) = infer(rows(k=[[1], [3]]))
    assert out["y"].tolist() == [[1, -1, -1], [3, 3, 3]]


def test_group_by_values_below_batch_of_a_generator() -> None:
    @batch
    @group_by_values("k")
    def infer(k: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
        yield {"y": k * 1.0}
        yield {"y": k * 2.0}

    with running():
        streamed = [response["y"].ravel().tolist() for (response,) in infer(rows(k=[[1], [2]]))]
    assert streamed == [[1.0, 2.0], [2.0, 4.0]]


def test_first_value_and_sample_in_pytritons_placements() -> None:
    @first_value("k")
    def per_request(requests: list[Request]) -> list[dict[str, Any]]:
        return [{"y": np.array([float(request["k"])])} for request in requests]

    @sample
    def one(k: np.ndarray) -> list[np.ndarray]:
        return [k * 2.0]

    with running():
        assert per_request(rows(k=[[4], [4]]))[0]["y"].tolist() == [4.0]
        assert one(rows(k=[[4]]))[0]["y"].tolist() == [[8.0]]
    assert get_inference_request_batch_size({"k": np.zeros((5, 1))}) == 5


# layers -------------------------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_pyserve_pytriton_is_on_the_users_side() -> None:
    package = Path(pyserve.__file__).parent
    users = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "pytriton" not in path.relative_to(package).parts
        and any(name.startswith("pyserve.pytriton") for name in _imports(path))
    ]
    assert users == [], "nothing in pyserve may import pyserve.pytriton"
    allowed = ("pyserve.pytriton", "pyserve.serve", "pyserve.config", "pyserve.decorators", "pyserve.grouping")
    allowed += ("pyserve.remote", "pyserve.client", "pyserve.errors", "pyserve.request", "pyserve.wrapping")
    reached = {
        name for path in (package / "pytriton").rglob("*.py") for name in _imports(path) if name.startswith("pyserve")
    }
    assert sorted(name for name in reached if not name.startswith(allowed)) == []
