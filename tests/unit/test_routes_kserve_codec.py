"""The ASGI app's KServe v2 codec: infer bodies to numpy and back, JSON and binary."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest

from pyserve.dtypes import serialize_bytes
from pyserve.errors import InvalidInputError, UnsupportedError
from pyserve.routes.kserve_codec import decode_request, encode_response


def _body(*inputs: dict[str, object], **extra: object) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


def test_json_inputs_become_arrays_of_their_datatype_and_shape() -> None:
    decoded = decode_request(
        _body(
            {"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4.5]]},
            {"name": "b", "datatype": "INT64", "shape": [1], "data": 7},
            {"name": "c", "datatype": "BYTES", "shape": [2], "data": ["x", "yz"]},
            {"name": "d", "datatype": "BOOL", "shape": [1, 1], "data": [True]},
            id="r1",
            parameters={"binary_data_output": True, "priority": 2},
            outputs=[{"name": "y", "parameters": {"binary_data": False}}],
        ),
        None,
    )
    np.testing.assert_array_equal(decoded.inputs["a"], np.array([[1, 2], [3, 4.5]], np.float32))
    assert decoded.inputs["a"].dtype == np.float32
    assert decoded.inputs["b"].dtype == np.int64 and decoded.inputs["b"].tolist() == [7]
    assert decoded.inputs["c"].tolist() == [b"x", b"yz"]
    assert decoded.inputs["d"].dtype == np.bool_
    assert (decoded.request_id, decoded.parameters, decoded.outputs) == ("r1", {"priority": 2}, ["y"])
    assert decoded.binary_default and decoded.binary_outputs == {"y": False}


def test_binary_inputs_follow_the_json_header() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    text = serialize_bytes(np.array([b"hi", b"there"], dtype=object))
    header = _body(
        {"name": "a", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": a.nbytes}},
        {"name": "t", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(text)}},
    )
    decoded = decode_request(header + a.tobytes() + text, len(header))
    np.testing.assert_array_equal(decoded.inputs["a"], a)
    assert decoded.inputs["t"].tolist() == [b"hi", b"there"]


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"[1]", None, "must be an object"),
        (b"{nope", None, "failed to parse"),
        (b"{}", None, "must have an 'inputs' list"),
        (_body({"name": "a", "datatype": "FP33", "shape": [1], "data": [1]}), None, "unknown datatype 'FP33'"),
        (_body({"name": "a", "datatype": "FP32", "shape": [2], "data": [1]}), None, "has 2 elements but data has 1"),
        (_body({"name": "a", "datatype": "INT32", "shape": [1], "data": [1.5]}), None, "not all INT32 values"),
        (_body({"name": "a", "datatype": "UINT8", "shape": [1], "data": [300]}), None, "out of range for UINT8"),
        (_body({"name": "a", "datatype": "FP32", "shape": [-1], "data": [1]}), None, "non-negative integers"),
        (_body({"name": "a", "datatype": "FP32", "shape": [1]}), None, "neither 'data' nor"),
        (
            _body({"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 4}}) + b"1234",
            len(_body({"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 4}})),
            "needs 8 bytes, got 4",
        ),
        (_body({"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}) + b"xx", 5000, "must be in 1.."),
    ],
)
def test_malformed_requests_are_invalid_input(body: bytes, header_length: int | None, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        decode_request(body, header_length)


def test_shared_memory_is_left_to_pyserves_own_port() -> None:
    raw = {"name": "a", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_region": "r"}}
    with pytest.raises(UnsupportedError, match="shared memory"):
        decode_request(_body(raw), None)


def test_outputs_go_as_json_or_binary_as_asked() -> None:
    request = decode_request(_body({"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}, id="7"), None)
    outputs = {
        "y": np.array([[1.5, math.nan]], np.float32),
        "t": np.array([b"ok"], dtype=object),
    }
    body, header_length = encode_response("m", "2", request, outputs)
    assert header_length is None
    assert body.decode() == (
        '{"model_name":"m","model_version":"2","id":"7","outputs":['
        '{"name":"y","datatype":"FP32","shape":[1,2],"data":[1.5, NaN]},'
        '{"name":"t","datatype":"BYTES","shape":[1],"data":["ok"]}]}'
    )
    request.binary_default = True
    body, header_length = encode_response("m", None, request, {"y": np.arange(3, dtype=np.int32)})
    assert header_length is not None
    doc = orjson.loads(body[:header_length])
    assert doc["outputs"] == [{"name": "y", "datatype": "INT32", "shape": [3], "parameters": {"binary_data_size": 12}}]
    assert "model_version" not in doc
    np.testing.assert_array_equal(np.frombuffer(body[header_length:], np.int32), np.arange(3))


def test_bytes_that_are_not_utf8_cannot_go_as_json() -> None:
    request = decode_request(_body({"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}), None)
    with pytest.raises(InvalidInputError, match="request it as binary data"):
        encode_response("m", None, request, {"t": np.array([b"\xff"], dtype=object)})
