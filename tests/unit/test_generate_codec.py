"""The generate extension's JSON mapping: request keys to inputs or parameters, outputs to keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from pyserve.config import ModelConfig, ModelSpec, Tensor
from pyserve.core.infer_call import InferCall
from pyserve.core.inference import ModelEntry, OutputTensor
from pyserve.dtypes import serialize_bytes
from pyserve.errors import InvalidInputError
from pyserve.frontends.kserve import decode_generate_request, encode_generate_response


def model(inputs: list[Tensor], max_batch_size: int = 0) -> ModelEntry:
    spec = ModelSpec("gen", 2, tuple(inputs), (Tensor("text_output", bytes, (1,)),), ModelConfig(max_batch_size))
    return ModelEntry(spec)


def decode(entry: ModelEntry, doc: Any) -> InferCall:
    return decode_generate_request(orjson.dumps(doc), entry)


def test_keys_naming_inputs_are_inputs_the_rest_parameters() -> None:
    entry = model([Tensor("text_input", bytes, (1,)), Tensor("max_tokens", np.int32, (1,))], max_batch_size=4)
    call = decode(entry, {"text_input": "hi", "max_tokens": 5, "stream": False, "parameters": {"temperature": 0.5}})
    assert set(call.inputs) == {"text_input", "max_tokens"}
    assert call.inputs["text_input"].shape == [1, 1]
    assert bytes(call.inputs["text_input"].data) == serialize_bytes(np.array([b"hi"], object))
    assert call.inputs["max_tokens"].data.tolist() == [[5]]
    assert call.parameters == {"stream": False, "temperature": 0.5}
    # A key of the nested parameters object that names an input is that input, as in Triton.
    call = decode(entry, {"text_input": "a", "parameters": {"max_tokens": 3}})
    assert call.inputs["max_tokens"].data.tolist() == [[3]] and call.parameters == {}


@pytest.mark.parametrize(
    ("dims", "batching", "value", "shape"),
    [
        ((-1,), False, [1, 2, 3], [3]),
        ((-1,), True, [1, 2, 3], [1, 3]),
        ((1,), True, [1, 2, 3], [3, 1]),  # the batch dimension takes what the fixed ones leave
        ((2, -1), False, [1, 2, 3, 4], [2, 2]),
        ((-1,), False, 7, [1]),
    ],
)
def test_shapes_are_filled_in_from_the_model(
    dims: tuple[int, ...], batching: bool, value: Any, shape: list[int]
) -> None:
    entry = model([Tensor("x", np.int64, dims)], max_batch_size=8 if batching else 0)
    assert decode(entry, {"x": value}).inputs["x"].shape == shape


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"x": [1, 2, 3]}, "do not fit"),
        ({"x": [[1, 2]]}, "flat list"),
        ({"x": [1, 2], "opt": [1]}, "string, number or boolean"),
        ({"x": [1, 2], "triton_mine": 1}, "reserved"),
        ({"parameters": {"p": 1}}, "missing required input"),
        ([1, 2], "must be an object"),
    ],
)
def test_bad_generate_requests(doc: Any, match: str) -> None:
    entry = model([Tensor("x", np.int64, (2,))])
    with pytest.raises(InvalidInputError, match=match):
        decode(entry, doc)


def test_response_outputs_are_keys_one_element_as_scalar() -> None:
    entry = model([Tensor("x", np.int64, (-1,))])
    text = serialize_bytes(np.array([b"hello"], object))
    outputs = [
        OutputTensor("text_output", "BYTES", [1, 1], memoryview(text)),
        OutputTensor("logits", "FP32", [1, 2], memoryview(np.array([0.5, 1.5], np.float32).tobytes())),
    ]
    doc = orjson.loads(encode_generate_response(entry, InferCall("", {}, {}, []), outputs, {"done": True}))
    assert doc == {
        "model_name": "gen",
        "model_version": "2",
        "done": True,
        "text_output": "hello",
        "logits": [0.5, 1.5],
    }
