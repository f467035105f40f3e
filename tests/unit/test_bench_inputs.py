"""pyserve.bench.inputs: the requests a benchmark sends, from the model's declared inputs or a data file."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyserve.bench.inputs import random_array, request_inputs
from pyserve.bench.settings import BenchSettings
from pyserve.client.model import RemoteModelConfig
from pyserve.config import Tensor
from pyserve.errors import ConfigError


def model(max_batch_size: int = 8, *inputs: Tensor, decoupled: bool = False) -> RemoteModelConfig:
    declared = inputs or (Tensor("x", np.float32, (-1,)), Tensor("n", np.int64, (2,)))
    return RemoteModelConfig("m", None, max_batch_size, decoupled, declared, (Tensor("y", np.float32, (-1,)),), {})


def settings(**fields: Any) -> BenchSettings:
    return BenchSettings(model="m", **fields)


def test_random_requests_take_the_declared_shapes_with_rows_first() -> None:
    (request,) = request_inputs(model(), settings(shapes={"x": (16,)}, batch_size=4))
    assert request["x"].shape == (4, 16) and request["x"].dtype == np.float32
    assert request["n"].shape == (4, 2) and request["n"].dtype == np.int64
    assert ((request["x"] >= 0) & (request["x"] < 1)).all()


def test_a_model_without_batching_gets_its_shape_as_declared() -> None:
    (request,) = request_inputs(model(0, Tensor("x", np.float32, (3, 2))), settings())
    assert request["x"].shape == (3, 2)
    with pytest.raises(ConfigError, match=r"does not batch .*--batch-size must be 1, got 2"):
        request_inputs(model(0, Tensor("x", np.float32, (3,))), settings(batch_size=2))


def test_a_variable_dimension_needs_its_shape() -> None:
    with pytest.raises(ConfigError, match=r"input 'x' .* variable dimension .* --shape x:16"):
        request_inputs(model(), settings())
    with pytest.raises(ConfigError, match=r"--shape n:3 does not fit input 'n' .* declared \[2\]"):
        request_inputs(model(), settings(shapes={"x": (4,), "n": (3,)}))
    with pytest.raises(ConfigError, match="--shape names 'z', not an input of model 'm' \\(its inputs: x, n\\)"):
        request_inputs(model(), settings(shapes={"z": (4,)}))


def test_optional_inputs_are_left_out_unless_shaped() -> None:
    declared = (Tensor("a", np.float32, (2,)), Tensor("b", np.float32, (-1,), optional=True))
    assert set(request_inputs(model(4, *declared), settings())[0]) == {"a"}
    assert set(request_inputs(model(4, *declared), settings(shapes={"b": (5,)}))[0]) == {"a", "b"}


def test_random_values_of_every_datatype() -> None:
    rng = np.random.default_rng(0)
    for datatype in ("BOOL", "UINT8", "INT16", "INT64", "FP16", "FP32", "FP64", "BF16"):
        array = random_array(datatype, (2, 3), rng, 8)
        assert array.shape == (2, 3), datatype
    strings = random_array("BYTES", (2, 2), rng, 5)
    assert strings.dtype == object and all(isinstance(s, bytes) and len(s) == 5 for s in strings.reshape(-1))


def test_decoupled_models_are_refused() -> None:
    with pytest.raises(ConfigError, match="decoupled"):
        request_inputs(model(8, Tensor("x", np.float32, (2,)), decoupled=True), settings())


def write(tmp_path: Path, doc: Any) -> str:
    path = tmp_path / "data.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_data_file_gives_one_request_per_sample(tmp_path: Path) -> None:
    raw = np.array([1.5, 2.5], dtype=np.float32)
    data = {
        "data": [
            {"x": [1, 2, 3], "n": [7, 8]},
            {"x": {"content": [[1, 2], [3, 4]], "shape": [4]}, "n": {"b64": base64.b64encode(raw.tobytes()).decode()}},
        ]
    }
    declared = (Tensor("x", np.float32, (-1,)), Tensor("n", np.float32, (2,)))
    first, second = request_inputs(model(0, *declared), settings(data_file=write(tmp_path, data)))
    np.testing.assert_array_equal(first["x"], [1, 2, 3])
    assert first["x"].dtype == np.float32
    np.testing.assert_array_equal(second["x"], [1, 2, 3, 4])
    np.testing.assert_array_equal(second["n"], raw)


def test_batched_requests_take_consecutive_samples_as_rows(tmp_path: Path) -> None:
    data = {"data": [{"x": [index, index]} for index in range(3)]}
    requests = request_inputs(
        model(8, Tensor("x", np.int32, (2,))), settings(data_file=write(tmp_path, data), batch_size=2)
    )
    assert [request["x"][:, 0].tolist() for request in requests] == [[0, 1], [1, 2], [2, 0]]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2], r'expected \{"data": \[sample, \.\.\.\]\}'),
        ({"data": [{"z": [1]}]}, "sample 0: 'z' is not an input of model 'm'"),
        ({"data": [{}]}, "sample 0: input 'x' is missing"),
        ({"data": [{"x": [1, 2, 3]}]}, r"3 values do not make shape \[2\]"),
        ({"data": [{"x": ["a", "b"]}]}, "values are not INT32"),
        ({"data": [[{"x": [1, 2]}]]}, "sequences are not supported"),
    ],
)
def test_a_bad_data_file_names_the_sample_and_input(tmp_path: Path, doc: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        request_inputs(model(0, Tensor("x", np.int32, (2,))), settings(data_file=write(tmp_path, doc)))


def test_a_missing_data_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        request_inputs(model(), settings(data_file=str(tmp_path / "none.json")))
