"""Tests of the KServe v2 HTTP codec (pyserve.frontends.kserve) and the model checks and documents behind it.

Requests are decoded against a ``ModelEntry``, so these tests also cover ``ModelEntry.validate`` (every error a
client can get for a well-formed body that does not match the model), ``metadata()``, ``config_json()`` and
the ``Registry`` lookups.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest

from pyserve.config import DynamicBatcher, ModelConfig, ModelSpec, QueuePolicy, Tensor, TimeoutAction
from pyserve.core.infer_call import InferCall, check_bytes_blob
from pyserve.core.inference import InputTensor, ModelEntry, OutputTensor
from pyserve.core.registry import Registry
from pyserve.dtypes import deserialize_bytes, serialize_bytes
from pyserve.errors import InvalidInputError, ModelAlreadyBoundError, ModelNotFoundError
from pyserve.frontends.kserve import decode_request, encode_response

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "triton-2.51"


def model(
    inputs: list[Tensor],
    outputs: list[Tensor] | None = None,
    max_batch_size: int = 0,
    name: str = "m",
    version: int = 1,
    **config: Any,
) -> ModelEntry:
    """A bound model version as the core holds it."""
    spec = ModelSpec(
        name,
        version,
        tuple(inputs),
        tuple(outputs or [Tensor("OUTPUT0", np.float32)]),
        ModelConfig(max_batch_size=max_batch_size, **config),
    )
    return ModelEntry(spec)


def identity() -> ModelEntry:
    """Triton's identity_fp32 example: one batched FP32 input of variable length."""
    return model([Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))], max_batch_size=64)


def body(doc: dict[str, Any], *binary: bytes) -> tuple[bytes, int | None]:
    """A request body and its Inference-Header-Content-Length (None for pure JSON)."""
    header = json.dumps(doc).encode()
    if not binary:
        return header, None
    return header + b"".join(binary), len(header)


def decode(entry: ModelEntry, doc: dict[str, Any], *binary: bytes) -> InferCall:
    data, header_length = body(doc, *binary)
    return decode_request(data, header_length, entry)


def one_input(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    return {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}


# JSON inputs ----------------------------------------------------------------------------------------------------


def test_triton_reference_request_decodes() -> None:
    doc = json.loads((REFERENCE / "infer_identity_fp32_request.json").read_text())
    call = decode(identity(), doc)
    tensor = call.inputs["INPUT0"]
    assert tensor.datatype == "FP32"
    assert tensor.shape == [1, 4]
    np.testing.assert_array_equal(tensor.data, np.array([[1.0, 2.0, 3.5, -4.0]], dtype=np.float32))
    assert tensor.data.dtype == np.float32
    assert call.id == ""
    assert call.requested_outputs == []


@pytest.mark.parametrize(
    ("datatype", "values"),
    [
        ("INT8", [-128, 127]),
        ("INT16", [-32768, 32767]),
        ("INT32", [-(2**31), 2**31 - 1]),
        ("INT64", [-(2**63), 2**63 - 1]),
        ("UINT8", [0, 255]),
        ("UINT16", [0, 65535]),
        ("UINT32", [0, 2**32 - 1]),
        ("UINT64", [0, 2**63]),
        ("FP32", [1.5, -2]),
        ("FP64", [1e300, 3]),
        ("BOOL", [True, False]),
    ],
)
def test_json_data_of_every_numeric_datatype(datatype: str, values: list[Any]) -> None:
    entry = model([Tensor("x", datatype, (2,))])
    tensor = decode(entry, one_input("x", datatype, [2], values)).inputs["x"]
    assert tensor.data.dtype == Tensor("x", datatype).numpy_dtype
    assert tensor.data.tolist() == values


@pytest.mark.parametrize(
    ("datatype", "values"),
    [("UINT8", [256, 0]), ("INT8", [-129, 0]), ("UINT32", [-1, 0]), ("INT16", [40000, 0])],
)
def test_json_integers_out_of_range_are_refused(datatype: str, values: list[int]) -> None:
    entry = model([Tensor("x", datatype, (2,))])
    with pytest.raises(InvalidInputError, match=f"input 'x': a value is out of range for {datatype}"):
        decode(entry, one_input("x", datatype, [2], values))


@pytest.mark.parametrize(
    ("datatype", "values", "seen"),
    [
        ("BOOL", [1, 0], "int64"),
        ("BOOL", ["true", "false"], "<U5"),
        ("INT32", [1.5, 2], "float64"),
        ("INT32", [True, False], "bool"),
        ("FP32", [True, False], "bool"),
        ("FP32", ["1.0", "2.0"], "<U3"),
    ],
)
def test_json_data_of_the_wrong_kind_is_refused(datatype: str, values: list[Any], seen: str) -> None:
    entry = model([Tensor("x", datatype, (2,))])
    with pytest.raises(InvalidInputError, match=f"input 'x': data of type {seen} is not valid {datatype}"):
        decode(entry, one_input("x", datatype, [2], values))


def test_nested_and_flat_json_data_give_the_same_tensor() -> None:
    entry = model([Tensor("x", np.int32, (2, 3))])
    flat = decode(entry, one_input("x", "INT32", [2, 3], [1, 2, 3, 4, 5, 6])).inputs["x"]
    nested = decode(entry, one_input("x", "INT32", [2, 3], [[1, 2, 3], [4, 5, 6]])).inputs["x"]
    assert flat.data.shape == nested.data.shape == (2, 3)
    np.testing.assert_array_equal(flat.data, nested.data)


def test_a_scalar_json_value_fills_a_one_element_tensor() -> None:
    entry = model([Tensor("x", np.float64, (1,))])
    assert decode(entry, one_input("x", "FP64", [1], 2.5)).inputs["x"].data.tolist() == [2.5]


def test_ragged_json_data_is_refused() -> None:
    entry = model([Tensor("x", np.int32, (2, 2))])
    with pytest.raises(InvalidInputError, match="input 'x': data is not a regular nested list"):
        decode(entry, one_input("x", "INT32", [2, 2], [[1, 2], [3]]))


@pytest.mark.parametrize("data", [[1, 2, 3], [[1, 2], [3, 4], [5, 6]], []])
def test_element_count_must_match_the_shape(data: list[Any]) -> None:
    entry = model([Tensor("x", np.int32, (2, 2))])
    count = np.asarray(data).size
    with pytest.raises(InvalidInputError, match=rf"input 'x': shape \[2, 2\] has 4 elements but data has {count}"):
        decode(entry, one_input("x", "INT32", [2, 2], data))


def test_bytes_json_data_are_utf8_strings() -> None:
    entry = model([Tensor("text", bytes, (-1,))])
    tensor = decode(entry, one_input("text", "BYTES", [3], ["héllo", "", "日本"])).inputs["text"]
    assert tensor.datatype == "BYTES"
    assert bytes(tensor.data) == serialize_bytes(np.array(["héllo", "", "日本"], dtype=object))
    assert deserialize_bytes(tensor.data, 3).tolist() == ["héllo".encode(), b"", "日本".encode()]


def test_bytes_json_data_may_be_nested() -> None:
    entry = model([Tensor("text", bytes, (2, 2))])
    tensor = decode(entry, one_input("text", "BYTES", [2, 2], [["a", "b"], ["c", "d"]])).inputs["text"]
    assert deserialize_bytes(tensor.data, 4).tolist() == [b"a", b"b", b"c", b"d"]


def test_bytes_json_data_must_be_strings_of_the_right_count() -> None:
    entry = model([Tensor("text", bytes, (-1,))])
    with pytest.raises(InvalidInputError, match="input 'text': BYTES data must be strings, got int"):
        decode(entry, one_input("text", "BYTES", [2], ["a", 1]))
    with pytest.raises(InvalidInputError, match=r"input 'text': shape \[3\] has 3 elements but data has 2"):
        decode(entry, one_input("text", "BYTES", [3], ["a", "b"]))


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_cannot_be_sent_as_json(datatype: str) -> None:
    entry = model([Tensor("h", datatype, (2,))])
    with pytest.raises(InvalidInputError, match=f"input 'h': {datatype} cannot be sent as JSON; use the binary"):
        decode(entry, one_input("h", datatype, [2], [1.0, 2.0]))


# Binary inputs --------------------------------------------------------------------------------------------------


def binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}


def test_binary_inputs_are_views_of_the_body() -> None:
    entry = model([Tensor("a", np.float32, (2,)), Tensor("b", np.int64, (1,)), Tensor("h", np.float16, (2,))])
    a = np.array([1.5, -2.0], dtype=np.float32).tobytes()
    b = np.array([7], dtype=np.int64).tobytes()
    h = np.array([0.5, 4.0], dtype=np.float16).tobytes()
    doc = {
        "inputs": [
            binary_input("a", "FP32", [2], len(a)),
            binary_input("b", "INT64", [1], len(b)),
            binary_input("h", "FP16", [2], len(h)),
        ]
    }
    data, header_length = body(doc, a, b, h)
    call = decode_request(data, header_length, entry)
    assert call.inputs["a"].data.tolist() == [1.5, -2.0]
    assert call.inputs["b"].data.tolist() == [7]
    assert call.inputs["h"].data.tolist() == [0.5, 4.0]
    assert np.shares_memory(call.inputs["a"].data, np.frombuffer(data, dtype=np.uint8))


def test_binary_bf16_and_bytes_inputs() -> None:
    entry = model([Tensor("e", "bfloat16", (2,)), Tensor("t", bytes, (2,))])
    e = np.array([1.0, -0.5], dtype=ml_dtypes.bfloat16).tobytes()
    t = serialize_bytes(np.array([b"ab", b""], dtype=object))
    doc = {"inputs": [binary_input("e", "BF16", [2], len(e)), binary_input("t", "BYTES", [2], len(t))]}
    call = decode(entry, doc, e, t)
    assert call.inputs["e"].data.astype(np.float32).tolist() == [1.0, -0.5]
    assert bytes(call.inputs["t"].data) == t


def test_binary_size_must_match_the_shape() -> None:
    entry = model([Tensor("a", np.float32, (2,))])
    doc = {"inputs": [binary_input("a", "FP32", [2], 4)]}
    with pytest.raises(InvalidInputError, match=r"input 'a': shape \[2\] of FP32 needs 8 bytes, got 4"):
        decode(entry, doc, b"\x00" * 4)


def test_binary_data_size_past_the_end_of_the_body_is_refused() -> None:
    entry = model([Tensor("a", np.float32, (2,))])
    doc = {"inputs": [binary_input("a", "FP32", [2], 8)]}
    with pytest.raises(InvalidInputError, match="input 'a': binary_data_size 8 exceeds the 4 bytes left in the body"):
        decode(entry, doc, b"\x00" * 4)


@pytest.mark.parametrize("size", [-1, "8", 1.5, True])
def test_binary_data_size_must_be_a_non_negative_integer(size: Any) -> None:
    entry = model([Tensor("a", np.float32, (2,))])
    doc = {"inputs": [binary_input("a", "FP32", [2], size)]}
    with pytest.raises(InvalidInputError, match="input 'a': binary_data_size must be a non-negative integer"):
        decode(entry, doc, b"\x00" * 8)


def test_both_data_and_binary_data_size_is_refused() -> None:
    entry = model([Tensor("a", np.float32, (2,))])
    doc = {"inputs": [{**binary_input("a", "FP32", [2], 8), "data": [1, 2]}]}
    with pytest.raises(InvalidInputError, match="input 'a' has both 'data' and binary_data_size"):
        decode(entry, doc, b"\x00" * 8)


def test_header_length_larger_than_the_body_is_refused() -> None:
    data, _ = body(one_input("INPUT0", "FP32", [1, 1], [1.0]))
    with pytest.raises(InvalidInputError, match=f"Inference-Header-Content-Length {len(data) + 1} is larger"):
        decode_request(data, len(data) + 1, identity())


def test_negative_header_length_is_refused_as_negative() -> None:
    data, _ = body(one_input("INPUT0", "FP32", [1, 1], [1.0]))
    with pytest.raises(InvalidInputError, match="Inference-Header-Content-Length -1 is negative"):
        decode_request(data, -1, identity())


def test_trailing_bytes_after_the_binary_inputs_are_refused() -> None:
    entry = model([Tensor("a", np.float32, (1,))])
    doc = {"inputs": [binary_input("a", "FP32", [1], 4)]}
    with pytest.raises(InvalidInputError, match="the request body has 3 bytes after the binary data of its inputs"):
        decode(entry, doc, b"\x00" * 4, b"xyz")


def test_a_header_length_equal_to_the_body_means_no_binary_data() -> None:
    data, _ = body(one_input("INPUT0", "FP32", [1, 2], [1.0, 2.0]))
    call = decode_request(data, len(data), identity())
    assert call.inputs["INPUT0"].shape == [1, 2]


# Malformed requests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "failed to parse the request JSON"),
        (b"", "failed to parse the request JSON"),
        (b"[1, 2]", "the request JSON must be an object"),
        (b"{}", "the request JSON must have an 'inputs' list"),
        (b'{"inputs": {}}', "the request JSON must have an 'inputs' list"),
        (b'{"id": 5, "inputs": []}', "request 'id' must be a string, got int"),
        (b'{"inputs": [], "parameters": []}', "request 'parameters' must be an object"),
        (b'{"inputs": [5]}', "each input must be a JSON object"),
        (b'{"inputs": [{"datatype": "FP32"}]}', "each input must have a string 'name'"),
        (b'{"inputs": [], "outputs": {}}', "'outputs' must be a list"),
        (b'{"inputs": [], "outputs": [{"nom": "x"}]}', "each requested output must be an object with a 'name'"),
    ],
)
def test_malformed_documents_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        decode_request(raw, None, identity())


def test_missing_data_is_refused() -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1]}]}
    with pytest.raises(InvalidInputError, match="input 'INPUT0' has neither 'data' nor a binary_data_size parameter"):
        decode(identity(), doc)


@pytest.mark.parametrize("datatype", ["FLOAT32", "fp32", "TYPE_FP32", None, 3])
def test_unknown_datatype_is_refused(datatype: Any) -> None:
    with pytest.raises(InvalidInputError, match=f"input 'INPUT0': unknown datatype {datatype!r}; expected one of"):
        decode(identity(), one_input("INPUT0", datatype, [1, 1], [1.0]))


@pytest.mark.parametrize("shape", [[1, -1], [-1], "1,1", [1.0, 1], [True, 1], None])
def test_shape_must_be_non_negative_integers(shape: Any) -> None:
    with pytest.raises(InvalidInputError, match="input 'INPUT0': 'shape' must be a list of non-negative integers"):
        decode(identity(), one_input("INPUT0", "FP32", shape, [1.0]))


def test_an_input_given_twice_is_refused() -> None:
    item = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}
    with pytest.raises(InvalidInputError, match="input 'INPUT0' appears more than once"):
        decode(identity(), {"inputs": [item, item]})


def test_reserved_triton_parameters_are_refused() -> None:
    doc = {**one_input("INPUT0", "FP32", [1, 1], [1.0]), "parameters": {"triton_secret": 1}}
    with pytest.raises(InvalidInputError, match="parameter 'triton_secret' is reserved"):
        decode(identity(), doc)


def test_parameters_reach_the_model_except_protocol_ones() -> None:
    parameters = {"triton_enable_empty_final_response": True, "binary_data_output": True, "temperature": 0.5}
    call = decode(identity(), {**one_input("INPUT0", "FP32", [1, 1], [1.0]), "id": "r1", "parameters": parameters})
    assert call.id == "r1"
    assert call.parameters == {"triton_enable_empty_final_response": True, "temperature": 0.5}
    assert call.binary_default is True


def test_classification_outputs_are_refused() -> None:
    doc = {
        **one_input("INPUT0", "FP32", [1, 1], [1.0]),
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}],
    }
    with pytest.raises(InvalidInputError, match="output 'OUTPUT0': the classification extension is not supported"):
        decode(identity(), doc)


def test_requested_outputs_and_their_binary_flags() -> None:
    entry = identity()
    doc = {
        **one_input("INPUT0", "FP32", [1, 1], [1.0]),
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    call = decode(entry, doc)
    assert call.requested_outputs == ["OUTPUT0"]
    assert call.binary_outputs == {"OUTPUT0": True}


# Raw binary requests (Inference-Header-Content-Length: 0) ----------------------------------------------------


def test_raw_body_is_the_only_input_with_its_variable_dimension_inferred() -> None:
    raw = np.arange(6, dtype=np.float32).tobytes()
    call = decode_request(raw, 0, identity())
    tensor = call.inputs["INPUT0"]
    assert tensor.shape == [1, 6]
    assert tensor.data.tolist() == [list(range(6))]
    assert call.binary_default is True  # a raw request gets a raw-friendly (binary) answer


def test_raw_body_without_a_batch_dimension() -> None:
    entry = model([Tensor("x", np.int16, (2, -1))])
    call = decode_request(np.arange(6, dtype=np.int16).tobytes(), 0, entry)
    assert call.inputs["x"].shape == [2, 3]


def test_raw_body_of_a_fixed_shape_must_have_its_exact_size() -> None:
    entry = model([Tensor("x", np.float32, (2,))])
    assert decode_request(b"\x00" * 8, 0, entry).inputs["x"].shape == [2]
    with pytest.raises(InvalidInputError, match="input 'x': 4 raw bytes are not a whole number of FP32 elements"):
        decode_request(b"\x00" * 4, 0, model([Tensor("x", np.float32, (3,))]))
    with pytest.raises(InvalidInputError, match=r"input 'x': shape \[2\] of FP32 needs 8 bytes, got 16"):
        decode_request(b"\x00" * 16, 0, entry)


def test_raw_body_not_a_whole_number_of_elements_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="input 'INPUT0': 6 raw bytes are not a whole number of FP32"):
        decode_request(b"\x00" * 6, 0, identity())


def test_raw_body_cannot_infer_two_variable_dimensions() -> None:
    entry = model([Tensor("x", np.float32, (-1, -1))])
    with pytest.raises(InvalidInputError, match="input 'x': a raw binary request cannot infer shape"):
        decode_request(b"\x00" * 8, 0, entry)


def test_raw_body_needs_a_single_input_model() -> None:
    entry = model([Tensor("a", np.float32), Tensor("b", np.float32)])
    with pytest.raises(InvalidInputError, match="needs a model with exactly one input; model 'm' has 2"):
        decode_request(b"\x00" * 8, 0, entry)


# Model validation (ModelEntry.validate) -----------------------------------------------------------------------


def tensor(datatype: str, shape: list[int]) -> InputTensor:
    """A decoded input of zeros."""
    np_type = Tensor("t", datatype).numpy_dtype
    return InputTensor(datatype, shape, np.zeros(shape, dtype=np_type))


def batched() -> ModelEntry:
    """A batching model with a fixed-dim input, a variable one and an optional one."""
    return model(
        [
            Tensor("image", np.float32, (2, 3)),
            Tensor("ids", np.int64, (-1,)),
            Tensor("mask", bool, (-1,), optional=True),
        ],
        [Tensor("scores", np.float32, (4,)), Tensor("label", np.int64, (1,))],
        max_batch_size=8,
    )


def test_validate_returns_the_batch_size() -> None:
    entry = batched()
    rows = entry.validate({"image": tensor("FP32", [5, 2, 3]), "ids": tensor("INT64", [5, 7])}, ["label"])
    assert rows == 5


def test_validate_of_a_model_without_batching_counts_one_row() -> None:
    entry = model([Tensor("x", np.float32, (2, -1))])
    assert entry.validate({"x": tensor("FP32", [2, 9])}, []) == 1


def test_optional_inputs_may_be_absent_or_present() -> None:
    entry = batched()
    inputs = {"image": tensor("FP32", [1, 2, 3]), "ids": tensor("INT64", [1, 4])}
    assert entry.validate(inputs, []) == 1
    assert entry.validate({**inputs, "mask": tensor("BOOL", [1, 4])}, []) == 1


def test_unknown_input_is_named() -> None:
    entry = batched()
    inputs = {"image": tensor("FP32", [1, 2, 3]), "ids": tensor("INT64", [1, 4]), "extra": tensor("FP32", [1])}
    with pytest.raises(InvalidInputError, match=r"unexpected inference input 'extra' for model 'm'; expected inputs"):
        entry.validate(inputs, [])


def test_missing_required_input_is_named() -> None:
    with pytest.raises(InvalidInputError, match=r"missing required input\(s\) \['ids'\] for model 'm'"):
        batched().validate({"image": tensor("FP32", [1, 2, 3])}, [])


def test_wrong_datatype_is_named() -> None:
    inputs = {"image": tensor("FP64", [1, 2, 3]), "ids": tensor("INT64", [1, 4])}
    with pytest.raises(InvalidInputError, match="input 'image': expected datatype FP32, got FP64"):
        batched().validate(inputs, [])


def test_wrong_rank_is_named() -> None:
    inputs = {"image": tensor("FP32", [2, 3]), "ids": tensor("INT64", [1, 4])}
    with pytest.raises(
        InvalidInputError, match=r"input 'image': expected shape \[-1,2,3\] \(batch dimension first\), got \[2, 3\]"
    ):
        batched().validate(inputs, [])
    with pytest.raises(InvalidInputError, match=r"input 'x': expected shape \[2\], got \[1, 2\]"):
        model([Tensor("x", np.float32, (2,))]).validate({"x": tensor("FP32", [1, 2])}, [])


def test_fixed_dimension_mismatch_is_named() -> None:
    inputs = {"image": tensor("FP32", [1, 3, 2]), "ids": tensor("INT64", [1, 4])}
    with pytest.raises(InvalidInputError, match=r"input 'image': expected shape \[-1,2,3\], got \[1, 3, 2\]"):
        batched().validate(inputs, [])
    with pytest.raises(InvalidInputError, match=r"input 'x': expected shape \[2,-1\], got \[3, 5\]"):
        model([Tensor("x", np.float32, (2, -1))]).validate({"x": tensor("FP32", [3, 5])}, [])


def test_batch_over_max_batch_size_is_refused() -> None:
    inputs = {"image": tensor("FP32", [9, 2, 3]), "ids": tensor("INT64", [9, 4])}
    with pytest.raises(InvalidInputError, match="model 'm': batch size 9 exceeds max_batch_size 8"):
        batched().validate(inputs, [])


def test_empty_batch_is_refused() -> None:
    inputs = {"image": tensor("FP32", [0, 2, 3]), "ids": tensor("INT64", [0, 4])}
    with pytest.raises(InvalidInputError, match="model 'm': batch size must be at least 1, got 0"):
        batched().validate(inputs, [])


def test_inputs_must_agree_on_the_batch_size() -> None:
    inputs = {"image": tensor("FP32", [2, 2, 3]), "ids": tensor("INT64", [3, 4])}
    with pytest.raises(
        InvalidInputError, match="input 'ids': batch size 3 differs from the other inputs' batch size 2"
    ):
        batched().validate(inputs, [])


def test_unknown_requested_output_is_named() -> None:
    inputs = {"image": tensor("FP32", [1, 2, 3]), "ids": tensor("INT64", [1, 4])}
    with pytest.raises(InvalidInputError, match="unexpected inference output 'probs' for model 'm'; expected outputs"):
        batched().validate(inputs, ["label", "probs"])


def test_decode_runs_model_validation() -> None:
    with pytest.raises(InvalidInputError, match=r"input 'INPUT0': expected shape \[-1,-1\]"):
        decode(identity(), one_input("INPUT0", "FP32", [4], [1, 2, 3, 4]))
    with pytest.raises(InvalidInputError, match="unexpected inference output 'nope'"):
        decode(identity(), {**one_input("INPUT0", "FP32", [1, 1], [1.0]), "outputs": [{"name": "nope"}]})


# Responses ------------------------------------------------------------------------------------------------------


def output(name: str, array: np.ndarray, datatype: str) -> OutputTensor:
    """An output as a worker returns it."""
    raw = serialize_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
    return OutputTensor(name, datatype, list(array.shape), memoryview(raw))


def two_outputs() -> ModelEntry:
    return model([Tensor("x", np.float32)], [Tensor("y", np.float32), Tensor("t", bytes)])


def test_triton_reference_response_encodes_byte_for_byte() -> None:
    entry = model(
        [Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))], 64, name="identity_fp32"
    )
    call = InferCall("", {}, {}, [])
    outputs = [output("OUTPUT0", np.array([[1.0, 2.0, 3.5, -4.0]], dtype=np.float32), "FP32")]
    header, parts = encode_response(entry, call, outputs)
    assert header == (REFERENCE / "infer_identity_fp32_response.json").read_bytes().strip()
    assert parts == []


def test_encode_response_as_json_by_default() -> None:
    entry = two_outputs()
    call = InferCall("req-7", {}, {}, [])
    outputs = [
        output("y", np.array([[0.5, 1.0]], dtype=np.float32), "FP32"),
        output("t", np.array(["héllo", "x"], dtype=object), "BYTES"),
    ]
    header, parts = encode_response(entry, call, outputs, {"sequence_end": True})
    assert orjson.loads(header) == {
        "model_name": "m",
        "model_version": "1",
        "id": "req-7",
        "parameters": {"sequence_end": True},
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.0]},
            {"name": "t", "datatype": "BYTES", "shape": [2], "data": ["héllo", "x"]},
        ],
    }
    assert parts == []


def test_binary_data_output_default_makes_every_output_binary() -> None:
    entry = two_outputs()
    call = InferCall("", {}, {}, [], binary_default=True)
    y = np.array([1.0, 2.0], dtype=np.float32)
    outputs = [output("y", y, "FP32"), output("t", np.array([b"ab"], dtype=object), "BYTES")]
    header, parts = encode_response(entry, call, outputs)
    doc = orjson.loads(header)
    assert [o["parameters"] for o in doc["outputs"]] == [{"binary_data_size": 8}, {"binary_data_size": 6}]
    assert all("data" not in o for o in doc["outputs"])
    assert b"".join(bytes(p) for p in parts) == y.tobytes() + struct.pack("<I", 2) + b"ab"


def test_binary_or_json_is_chosen_per_requested_output() -> None:
    entry = two_outputs()
    # Listed without binary_data, 't' stays JSON even though binary_data_output is set.
    call = InferCall("", {}, {}, ["y", "t"], {"y": True, "t": False}, binary_default=True)
    outputs = [output("y", np.array([3.0], dtype=np.float32), "FP32"), output("t", np.array([b"z"]), "BYTES")]
    header, parts = encode_response(entry, call, outputs)
    doc = orjson.loads(header)
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 4}
    assert doc["outputs"][1]["data"] == ["z"]
    assert [bytes(p) for p in parts] == [np.float32(3.0).tobytes()]


@pytest.mark.parametrize(
    ("datatype", "array", "data"),
    [
        ("BOOL", np.array([True, False]), [True, False]),
        ("FP16", np.array([0.5, 2.0], dtype=np.float16), [0.5, 2.0]),
        ("BF16", np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16), [1.5, -2.0]),
        ("UINT64", np.array([2**64 - 1], dtype=np.uint64), [2**64 - 1]),
        ("INT8", np.array([[-1, 2], [3, 4]], dtype=np.int8), [-1, 2, 3, 4]),
    ],
)
def test_json_outputs_of_every_kind_are_flat_lists(datatype: str, array: np.ndarray, data: list[Any]) -> None:
    entry = model([Tensor("x", np.float32)], [Tensor("y", datatype)])
    header, _ = encode_response(entry, InferCall("", {}, {}, []), [output("y", array, datatype)])
    (described,) = orjson.loads(header)["outputs"]
    assert described["data"] == data
    assert described["shape"] == list(array.shape)


# check_bytes_blob -----------------------------------------------------------------------------------------------


def test_check_bytes_blob_accepts_exact_blobs() -> None:
    check_bytes_blob("t", memoryview(serialize_bytes(np.array([b"a", b"", b"xyz"], dtype=object))), 3)
    check_bytes_blob("t", memoryview(b""), 0)


@pytest.mark.parametrize(
    ("blob", "count", "message"),
    [
        (b"\x01\x00\x00\x00a\x02\x00", 2, "input 't': BYTES data ends after 1 of 2 elements (no room for a length"),
        (b"\x05\x00\x00\x00ab", 1, "input 't': BYTES element 0 declares 5 bytes but only 2 remain"),
        (b"\x01\x00\x00\x00a!!", 1, "input 't': BYTES data has 2 bytes after its 1 elements"),
    ],
)
def test_check_bytes_blob_names_what_is_wrong(blob: bytes, count: int, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(")):
        check_bytes_blob("t", memoryview(blob), count)


def test_binary_bytes_input_with_a_bad_blob_is_refused() -> None:
    entry = model([Tensor("t", bytes, (2,))])
    blob = serialize_bytes(np.array([b"a"], dtype=object))
    doc = {"inputs": [binary_input("t", "BYTES", [2], len(blob))]}
    with pytest.raises(InvalidInputError, match="input 't': BYTES data ends after 1 of 2 elements"):
        decode(entry, doc, blob)


# Model documents and the registry -----------------------------------------------------------------------------


def test_metadata_shapes_have_a_batch_dimension_when_batching() -> None:
    doc = json.loads((REFERENCE / "v2_models_identity_fp32.json").read_text())
    entry = model(
        [Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))], 64, name="identity_fp32"
    )
    assert entry.metadata() == doc
    unbatched = model([Tensor("x", bytes, (3,))], [Tensor("y", np.int8, (2, 2))])
    assert unbatched.metadata()["inputs"] == [{"name": "x", "datatype": "BYTES", "shape": [3]}]
    assert unbatched.metadata()["outputs"] == [{"name": "y", "datatype": "INT8", "shape": [2, 2]}]


def test_config_json_has_tritons_keys_plus_the_transaction_policy() -> None:
    reference = json.loads((REFERENCE / "v2_models_identity_fp32_config.json").read_text())
    entry = model(
        [Tensor("INPUT0", np.float32, (-1,))],
        [Tensor("OUTPUT0", np.float32, (-1,))],
        64,
        name="identity_fp32",
        batcher=DynamicBatcher(max_queue_delay_microseconds=100, preferred_batch_size=(64,)),
    )
    doc = entry.config_json()
    assert set(doc) == set(reference) | {"model_transaction_policy"}
    assert doc["model_transaction_policy"] == {"decoupled": False}
    for key in ("input", "output"):
        assert doc[key] == reference[key]
    for key in ("version_policy", "optimization", "dynamic_batching", "instance_group", "batch_input"):
        assert doc[key] == reference[key]


def test_config_json_has_dynamic_batching_only_when_batching() -> None:
    def config_of(**config: Any) -> dict[str, Any]:
        return model([Tensor("x", np.float32)], **config).config_json()

    assert "dynamic_batching" not in config_of(max_batch_size=0)
    assert "dynamic_batching" not in config_of(max_batch_size=8, batcher=None)
    assert "dynamic_batching" in config_of(max_batch_size=8)


def test_config_json_of_a_fully_configured_model() -> None:
    batcher = DynamicBatcher(
        priority_levels=2,
        default_priority_level=1,
        default_queue_policy=QueuePolicy(TimeoutAction.DELAY, 100),
        priority_queue_policy={2: QueuePolicy(max_queue_size=4)},
    )
    entry = model(
        [Tensor("text", bytes, (1,), optional=True)],
        max_batch_size=4,
        batcher=batcher,
        decoupled=True,
        instances=3,
        devices=("cuda:1",),
        parameters={"k": "v"},
    )
    doc = entry.config_json()
    assert doc["input"][0]["data_type"] == "TYPE_STRING"
    assert doc["input"][0]["optional"] is True
    assert doc["dynamic_batching"]["default_queue_policy"] == {
        "timeout_action": "DELAY",
        "default_timeout_microseconds": 100,
        "allow_timeout_override": False,
        "max_queue_size": 0,
    }
    assert doc["dynamic_batching"]["priority_queue_policy"]["2"]["max_queue_size"] == 4
    assert doc["instance_group"][0]["kind"] == "KIND_GPU"
    assert doc["instance_group"][0]["gpus"] == [1]
    assert doc["instance_group"][0]["count"] == 3
    assert doc["parameters"] == {"k": {"string_value": "v"}}
    assert doc["model_transaction_policy"] == {"decoupled": True}


def test_registry_gets_a_version_or_the_latest() -> None:
    registry = Registry()
    v1 = model([Tensor("x", np.float32)], name="m", version=1)
    v3 = model([Tensor("x", np.float32)], name="m", version=3)
    registry.add(v3)
    registry.add(v1)
    assert registry.get("m") is v3
    assert registry.get("m", "") is v3
    assert registry.get("m", 1) is v1
    assert registry.get("m", "1") is v1
    assert registry.versions("m") == [v1, v3]
    assert registry.entries() == [v1, v3]


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("nope", None, "Request for unknown model: 'nope' is not found"),
        ("m", 2, "Request for unknown model: 'm' version 2 is not found"),
        ("m", "latest", "Request for unknown model: 'm' version 'latest' is not found"),
    ],
)
def test_registry_unknown_models_and_versions(name: str, version: Any, message: str) -> None:
    registry = Registry()
    registry.add(model([Tensor("x", np.float32)], name="m"))
    with pytest.raises(ModelNotFoundError, match=message):
        registry.get(name, version)


def test_registry_refuses_a_duplicate_and_forgets_removed_models() -> None:
    registry = Registry()
    entry = model([Tensor("x", np.float32)], name="m")
    registry.add(entry)
    with pytest.raises(ModelAlreadyBoundError, match="model 'm' version 1 is already bound"):
        registry.add(model([Tensor("x", np.float32)], name="m"))
    assert registry.remove("m", 1) is entry
    assert registry.remove("m", 1) is None
    assert registry.entries() == []
    with pytest.raises(ModelNotFoundError):
        registry.get("m")
