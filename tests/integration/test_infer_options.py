"""Infer request options: requested outputs and their encoding, request id, parameters, compression."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import Serve

pytestmark = pytest.mark.integration

DATA = np.array([[1.0, 2.0, 3.0], [-4.0, 0.5, 8.0]], np.float32)


def fp32_input(name: str = "INPUT0", data: np.ndarray = DATA, binary: bool = True) -> triton_http.InferInput:
    infer_input = triton_http.InferInput(name, list(data.shape), "FP32")
    infer_input.set_data_from_numpy(data, binary_data=binary)
    return infer_input


def output_names(result: triton_http.InferResult) -> list[str]:
    return [output["name"] for output in result.get_response()["outputs"]]


# requested outputs -------------------------------------------------------------------------------------------


def test_all_outputs_when_none_requested(client: triton_http.InferenceServerClient) -> None:
    result = client.infer("multi", [fp32_input()])
    assert sorted(output_names(result)) == ["NEGATED", "PLUS_ONE", "TEXT", "TIMES_TWO"]
    np.testing.assert_array_equal(result.as_numpy("PLUS_ONE"), DATA + 1)
    np.testing.assert_array_equal(result.as_numpy("NEGATED"), -DATA)
    assert result.as_numpy("TEXT").tolist() == [[b"sum=6"], [b"sum=4.5"]]


def test_requested_subset_only(client: triton_http.InferenceServerClient) -> None:
    outputs = [triton_http.InferRequestedOutput("TIMES_TWO"), triton_http.InferRequestedOutput("TEXT")]
    result = client.infer("multi", [fp32_input()], outputs=outputs)
    assert output_names(result) == ["TIMES_TWO", "TEXT"]
    np.testing.assert_array_equal(result.as_numpy("TIMES_TWO"), DATA * 2)
    assert result.as_numpy("PLUS_ONE") is None


def test_binary_or_json_per_output(client: triton_http.InferenceServerClient) -> None:
    outputs = [
        triton_http.InferRequestedOutput("PLUS_ONE", binary_data=False),
        triton_http.InferRequestedOutput("NEGATED", binary_data=True),
        triton_http.InferRequestedOutput("TEXT", binary_data=False),
    ]
    result = client.infer("multi", [fp32_input(binary=False)], outputs=outputs)
    plus_one, negated, text = (result.get_output(name) for name in ("PLUS_ONE", "NEGATED", "TEXT"))
    assert plus_one["data"] == (DATA + 1).reshape(-1).tolist() and "parameters" not in plus_one
    assert negated["parameters"] == {"binary_data_size": DATA.nbytes} and "data" not in negated
    assert text["data"] == ["sum=6", "sum=4.5"]
    np.testing.assert_array_equal(result.as_numpy("NEGATED"), -DATA)


def test_binary_data_output_covers_only_unlisted_outputs(raw_http: Any) -> None:
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 3], "data": DATA.reshape(-1).tolist()}]
    # Nothing listed: every output is binary.
    response = raw_http.infer("multi", {"inputs": inputs, "parameters": {"binary_data_output": True}})
    assert response.status == 200, response.body
    header_length = int(response.headers["inference-header-content-length"])
    header = orjson.loads(response.body[:header_length])
    assert all("binary_data_size" in o["parameters"] for o in header["outputs"])
    assert len(response.body) - header_length == sum(o["parameters"]["binary_data_size"] for o in header["outputs"])
    # A listed output without binary_data stays JSON even with binary_data_output: true.
    doc = {
        "inputs": inputs,
        "outputs": [{"name": "PLUS_ONE"}, {"name": "NEGATED", "parameters": {"binary_data": True}}],
        "parameters": {"binary_data_output": True},
    }
    response = raw_http.infer("multi", doc)
    assert response.status == 200, response.body
    header_length = int(response.headers["inference-header-content-length"])
    outputs = {o["name"]: o for o in orjson.loads(response.body[:header_length])["outputs"]}
    assert sorted(outputs) == ["NEGATED", "PLUS_ONE"]
    assert outputs["PLUS_ONE"]["data"] == (DATA + 1).reshape(-1).tolist()
    assert np.frombuffer(response.body[header_length:], np.float32).tolist() == (-DATA).reshape(-1).tolist()
    # No binary output at all: a plain JSON response without the header-length header.
    response = raw_http.infer("multi", {"inputs": inputs, "outputs": [{"name": "TEXT"}]})
    assert response.status == 200
    assert "inference-header-content-length" not in response.headers
    assert response.headers["content-type"] == "application/json"
    assert response.json()["outputs"] == [
        {"name": "TEXT", "datatype": "BYTES", "shape": [2, 1], "data": ["sum=6", "sum=4.5"]}
    ]


def test_unknown_requested_output_is_refused(client: triton_http.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("multi", [fp32_input()], outputs=[triton_http.InferRequestedOutput("NOPE")])
    assert info.value.status() == "400"
    assert "'NOPE'" in info.value.message()


# request id and parameters ------------------------------------------------------------------------------------


def test_request_id_is_echoed(client: triton_http.InferenceServerClient) -> None:
    result = client.infer("echo_parameters", [fp32_input(data=DATA[0])], request_id="req-\u00e9-42")
    assert result.get_response()["id"] == "req-\u00e9-42"
    assert result.as_numpy("REQUEST_ID").tolist() == ["req-\u00e9-42".encode()]
    result = client.infer("echo_parameters", [fp32_input(data=DATA[0])])
    assert "id" not in result.get_response()


def test_request_parameters_reach_the_model(client: triton_http.InferenceServerClient) -> None:
    parameters = {"temperature": 0.5, "mode": "fast", "flag": True, "n": 3}
    result = client.infer("echo_parameters", [fp32_input(data=DATA[0])], parameters=parameters)
    seen = orjson.loads(result.as_numpy("PARAMETERS")[0])
    # binary_data_output (which tritonclient adds) is the protocol's, not the model's.
    assert seen == parameters
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA[0])


# compression ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("request_algorithm", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_algorithm", [None, "gzip", "deflate"])
def test_compressed_requests_and_responses(
    client: triton_http.InferenceServerClient, request_algorithm: str | None, response_algorithm: str | None
) -> None:
    a = np.arange(64, dtype=np.float32).reshape(2, 32)
    b = np.full((2, 32), 0.25, np.float32)
    result = client.infer(
        "add_sub",
        [fp32_input("INPUT0", a), fp32_input("INPUT1", b, binary=False)],
        outputs=[
            triton_http.InferRequestedOutput("OUTPUT0", binary_data=True),
            triton_http.InferRequestedOutput("OUTPUT1", binary_data=False),
        ],
        request_compression_algorithm=request_algorithm,
        response_compression_algorithm=response_algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_response_is_compressed_only_when_asked(raw_http: Any, algorithm: str) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}]}
    plain = raw_http.infer("identity_fp32", doc)
    assert plain.status == 200 and "content-encoding" not in plain.headers
    response = raw_http.infer("identity_fp32", doc, headers={"Accept-Encoding": algorithm})
    assert response.status == 200
    assert response.headers["content-encoding"] == algorithm
    body = gzip.decompress(response.body) if algorithm == "gzip" else zlib.decompress(response.body)
    assert orjson.loads(body) == orjson.loads(plain.body)


def test_unsupported_content_encoding_is_refused(raw_http: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    response = raw_http.infer("identity_fp32", doc, headers={"Content-Encoding": "br"})
    assert response.status in (400, 415, 501)
    assert "br" in response.json()["error"]
    corrupt = raw_http.request(
        "POST", "/v2/models/identity_fp32/infer", b"not gzip at all", {"Content-Encoding": "gzip"}
    )
    assert corrupt.status == 400
    assert "gzip" in corrupt.json()["error"]


# concurrency -------------------------------------------------------------------------------------------------


def test_async_infer_results_match_their_requests(server: Serve) -> None:
    # Concurrent requests are batched together by the server; each must get back its own rows.
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=8)
    try:
        pending = []
        for i in range(32):
            a = np.full((1 + i % 3, 5), i, np.float32)
            b = np.arange(a.size, dtype=np.float32).reshape(a.shape)
            inputs = [fp32_input("INPUT0", a), fp32_input("INPUT1", b)]
            pending.append((a, b, client.async_infer("add_sub", inputs, request_id=str(i))))
        for i, (a, b, future) in enumerate(pending):
            result = future.get_result(timeout=30)
            assert result.get_response()["id"] == str(i)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        client.close()
