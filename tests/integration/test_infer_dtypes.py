"""Every datatype round-trips through tritonclient, as JSON and as binary tensor data."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

INTEGER_TYPES = {
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
}
# bfloat16's largest finite value, exactly representable in float32 too.
BF16_MAX = float(np.array([0x7F7F0000], dtype=np.uint32).view(np.float32)[0])


def sample(datatype: str) -> np.ndarray:
    """A [2, n] batch of values that stress the datatype's range."""
    if datatype in INTEGER_TYPES:
        info = np.iinfo(INTEGER_TYPES[datatype])
        return np.array([[info.min, 0, 1, info.max], [info.max - 1, 7, info.min + 1, 42]], dtype=info.dtype)
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "FP16":
        info = np.finfo(np.float16)
        return np.array([[0.5, -1.25, info.max, info.tiny], [info.min, 0.0, 3.140625, -0.0009765625]], np.float16)
    if datatype in ("FP32", "FP64"):
        dtype = np.float32 if datatype == "FP32" else np.float64
        info = np.finfo(dtype)
        return np.array([[1.5, -0.1, info.max, info.tiny], [info.min, 0.0, 1e-7, 123456.789]], dtype=dtype)
    if datatype == "BF16":
        # tritonclient carries BF16 as float32 arrays and sends their top two bytes: use exact bf16 values.
        return np.array([[1.0, -2.5, 0.15625, BF16_MAX], [65536.0, -0.0078125, 3.0, -BF16_MAX]], np.float32)
    if datatype == "BYTES":
        return np.array([[b"hello", b"", "\u00fcn\u00efc\u00f8de".encode()], [b"x" * 1000, b"a b", b"{}"]], object)
    raise AssertionError(datatype)


def round_trip(
    client: triton_http.InferenceServerClient, datatype: str, data: np.ndarray, binary: bool
) -> tuple[np.ndarray, dict[str, Any]]:
    infer_input = triton_http.InferInput("INPUT0", list(data.shape), datatype)
    infer_input.set_data_from_numpy(data, binary_data=binary)
    output = triton_http.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(f"identity_{datatype.lower()}", [infer_input], outputs=[output])
    return result.as_numpy("OUTPUT0"), result.get_output("OUTPUT0")


JSON_TYPES = ["BOOL", *INTEGER_TYPES, "FP32", "FP64", "BYTES"]
ALL_TYPES = [*JSON_TYPES, "FP16", "BF16"]


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_json_round_trip(client: triton_http.InferenceServerClient, datatype: str) -> None:
    data = sample(datatype)
    got, described = round_trip(client, datatype, data, binary=False)
    assert "data" in described and "parameters" not in described
    assert described["datatype"] == datatype
    assert described["shape"] == list(data.shape)
    if datatype == "BYTES":
        # tritonclient reads JSON strings back as str.
        expected = np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(data)
        assert got.tolist() == expected.tolist()
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_binary_round_trip(client: triton_http.InferenceServerClient, datatype: str) -> None:
    data = sample(datatype)
    if datatype == "BYTES":
        data = np.concatenate([data, np.array([[b"\x00\xff\xfe", b"\x00", b"\x80" * 3]], object)])
    got, described = round_trip(client, datatype, data, binary=True)
    assert described["datatype"] == datatype
    assert described["shape"] == list(data.shape)
    assert described["parameters"]["binary_data_size"] > 0
    if datatype == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


def test_fp16_and_bf16_are_decoded_as_their_values(client: triton_http.InferenceServerClient) -> None:
    half = np.array([[0.5, -1.25, 1024.0], [65504.0, 0.0, -2.0]], np.float16)
    bf16 = np.array([[1.0, -2.5, 0.15625], [BF16_MAX, 3.0, -0.0078125]], np.float32)
    inputs = [triton_http.InferInput("HALF", list(half.shape), "FP16"), triton_http.InferInput("BF16", [2, 3], "BF16")]
    inputs[0].set_data_from_numpy(half)
    inputs[1].set_data_from_numpy(bf16)
    result = client.infer("cast_fp32", inputs)
    np.testing.assert_array_equal(result.as_numpy("HALF_AS_FP32"), half.astype(np.float32))
    np.testing.assert_array_equal(result.as_numpy("BF16_AS_FP32"), bf16)
    # The server's own bf16 agrees with ml_dtypes' rounding of the same values.
    np.testing.assert_array_equal(bf16.astype(ml_dtypes.bfloat16).astype(np.float32), bf16)


def test_fp16_as_json_is_refused_naming_binary(client: triton_http.InferenceServerClient) -> None:
    infer_input = triton_http.InferInput("INPUT0", [1, 2], "FP16")
    infer_input.set_data_from_numpy(np.array([[1.0, 2.0]], np.float16), binary_data=False)
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_fp16", [infer_input])
    assert info.value.status() == "400"
    assert "FP16" in info.value.message()
    assert "binary" in info.value.message()


def test_bf16_as_json_is_refused(client: triton_http.InferenceServerClient, raw_http: Any) -> None:
    # tritonclient itself refuses to put BF16 in JSON ...
    infer_input = triton_http.InferInput("INPUT0", [1, 2], "BF16")
    with pytest.raises(InferenceServerException, match="binary"):
        infer_input.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32), binary_data=False)
    # ... and the server refuses it from any other client.
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BF16", "shape": [1, 2], "data": [1.0, 2.0]}]}
    response = raw_http.infer("identity_bf16", doc)
    assert response.status == 400
    assert "BF16" in response.json()["error"]
    assert "binary" in response.json()["error"]


def test_bool_travels_as_json_true_false(raw_http: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BOOL", "shape": [1, 3], "data": [True, False, True]}]}
    response = raw_http.infer("identity_bool", doc)
    assert response.status == 200, response.body
    assert b"[true,false,true]" in response.body
    # Numbers are not booleans.
    doc["inputs"][0]["data"] = [1, 0, 1]
    assert raw_http.infer("identity_bool", doc).status == 400


def test_integer_out_of_range_in_json_is_refused(raw_http: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [1, 2], "data": [1, 256]}]}
    response = raw_http.infer("identity_uint8", doc)
    assert response.status == 400
    assert "out of range" in response.json()["error"]


@pytest.mark.parametrize("datatype", ["BYTES", "FP16", "BF16", "INT8", "BOOL"])
def test_tensors_past_the_shared_memory_threshold(client: triton_http.InferenceServerClient, datatype: str) -> None:
    # Over 64 KiB each way, so inputs and outputs travel through the shared-memory pool, not inline.
    rng = np.random.default_rng(7)
    if datatype == "BYTES":
        data = np.array([[rng.bytes(int(n)) for n in rng.integers(0, 2048, 200)] for _ in range(2)], dtype=object)
    elif datatype == "BOOL":
        data = rng.random((2, 70_000)) > 0.5
    elif datatype == "INT8":
        data = rng.integers(-128, 128, (2, 70_000), dtype=np.int8)
    elif datatype == "FP16":
        data = rng.standard_normal((2, 40_000)).astype(np.float16)
    else:
        data = rng.standard_normal((2, 40_000)).astype(ml_dtypes.bfloat16).astype(np.float32)
    got, _ = round_trip(client, datatype, data, binary=True)
    if datatype == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        np.testing.assert_array_equal(got, data)
