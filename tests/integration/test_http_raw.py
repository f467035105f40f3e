"""Byte-level HTTP: malformed and unusual requests get a clear 4xx JSON error and the server keeps serving."""

from __future__ import annotations

import gzip
import struct
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from pyserve import Serve, ServeConfig, Tensor

pytestmark = pytest.mark.integration

INFER = "/v2/models/identity_fp32/infer"
GOOD_DOC = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}]}
GOOD_REQUEST = (INFER, orjson.dumps(GOOD_DOC))


def binary_request(doc: Any, binary: bytes, header_length: int | None = None) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps(doc)
    length = len(header) if header_length is None else header_length
    return header + binary, {"Inference-Header-Content-Length": str(length)}


def assert_good_response(response: Any) -> None:
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def assert_error(response: Any, status: int, *fragments: str) -> str:
    assert response.status == status, (response.status, response.body)
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert isinstance(message, str)
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.fixture
def conn(raw_http: Any) -> Iterator[Any]:
    """A connection to the shared server; the test's last act is a good request on it."""
    with raw_http.connect() as connection:
        yield connection
        connection.sendall(raw_http.build_request("POST", *GOOD_REQUEST))
        assert_good_response(connection.read_response())


def exchange(conn: Any, raw_http: Any, path: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
    conn.sendall(raw_http.build_request("POST", path, body, headers))
    return conn.read_response()


def test_truncated_binary_data(conn: Any, raw_http: Any) -> None:
    doc = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 25], "parameters": {"binary_data_size": 100}}]
    }
    body, headers = binary_request(doc, np.zeros(2, np.float32).tobytes())
    assert_error(exchange(conn, raw_http, INFER, body, headers), 400, "binary_data_size 100", "8 bytes")


def test_binary_data_size_not_matching_shape(conn: Any, raw_http: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 8}}]}
    body, headers = binary_request(doc, np.zeros(2, np.float32).tobytes())
    assert_error(exchange(conn, raw_http, INFER, body, headers), 400, "needs 16 bytes, got 8")


def test_trailing_bytes_after_binary_data(conn: Any, raw_http: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}]}
    body, headers = binary_request(doc, np.zeros(3, np.float32).tobytes())
    assert_error(exchange(conn, raw_http, INFER, body, headers), 400, "4 bytes after")


def test_header_length_larger_than_body(conn: Any, raw_http: Any) -> None:
    body = orjson.dumps(GOOD_DOC)
    headers = {"Inference-Header-Content-Length": str(len(body) + 50)}
    assert_error(exchange(conn, raw_http, INFER, body, headers), 400, "Inference-Header-Content-Length", "larger")


def test_header_length_not_a_number(conn: Any, raw_http: Any) -> None:
    headers = {"Inference-Header-Content-Length": "twelve"}
    assert_error(exchange(conn, raw_http, INFER, orjson.dumps(GOOD_DOC), headers), 400, "integer")


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]", b'{"inputs": 3}', b'{"inputs": [{"name": 1}]}'])
def test_invalid_json(conn: Any, raw_http: Any, body: bytes) -> None:
    assert_error(exchange(conn, raw_http, INFER, body), 400)


def test_bytes_with_bad_length_prefix(conn: Any, raw_http: Any) -> None:
    # Two elements declared; the second claims 100 bytes but only 3 follow.
    blob = struct.pack("<I", 2) + b"ok" + struct.pack("<I", 100) + b"abc"
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "parameters": {"binary_data_size": len(blob)}}
        ]
    }
    body, headers = binary_request(doc, blob)
    assert_error(exchange(conn, raw_http, "/v2/models/identity_bytes/infer", body, headers), 400, "BYTES", "100")


def test_bytes_with_too_few_elements(conn: Any, raw_http: Any) -> None:
    blob = struct.pack("<I", 2) + b"ok"
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 3], "parameters": {"binary_data_size": len(blob)}}
        ]
    }
    body, headers = binary_request(doc, blob)
    assert_error(exchange(conn, raw_http, "/v2/models/identity_bytes/infer", body, headers), 400, "1 of 3")


def test_element_count_not_matching_shape(conn: Any, raw_http: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0]}]}
    message = assert_error(exchange(conn, raw_http, INFER, orjson.dumps(doc)), 400, "INPUT0")
    assert "4 elements" in message and "3" in message


def test_ragged_json_data(conn: Any, raw_http: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 2], "data": [[1.0, 2.0], [3.0]]}]}
    assert_error(exchange(conn, raw_http, INFER, orjson.dumps(doc)), 400, "INPUT0")


def test_reserved_triton_parameter(conn: Any, raw_http: Any) -> None:
    doc = dict(GOOD_DOC, parameters={"triton_priority_hack": 1})
    assert_error(exchange(conn, raw_http, INFER, orjson.dumps(doc)), 400, "triton_priority_hack", "reserved")
    # A parameter Triton itself defines is allowed.
    allowed = dict(GOOD_DOC, parameters={"triton_enable_empty_final_response": True})
    assert_good_response(exchange(conn, raw_http, INFER, orjson.dumps(allowed)))


def test_raw_binary_request(conn: Any, raw_http: Any) -> None:
    # Inference-Header-Content-Length: 0: the body is the single input's raw bytes, the answer is binary.
    data = np.arange(16, dtype=np.float32)
    response = exchange(conn, raw_http, INFER, data.tobytes(), {"Inference-Header-Content-Length": "0"})
    assert response.status == 200, response.body
    header_length = int(response.headers["inference-header-content-length"])
    header = orjson.loads(response.body[:header_length])
    assert header["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
    ]
    np.testing.assert_array_equal(np.frombuffer(response.body[header_length:], np.float32), data)
    # Not a whole number of elements.
    response = exchange(conn, raw_http, INFER, b"\x00" * 6, {"Inference-Header-Content-Length": "0"})
    assert_error(response, 400, "INPUT0")
    # A model with two inputs cannot take a raw body.
    response = exchange(
        conn, raw_http, "/v2/models/add_sub/infer", data.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    assert_error(response, 400, "exactly one input")


def test_expect_100_continue(raw_http: Any) -> None:
    path, body = GOOD_REQUEST
    with raw_http.connect() as connection:
        head = raw_http.build_request("POST", path, b"", {"Content-Length": str(len(body)), "Expect": "100-continue"})
        connection.sendall(head)
        interim = connection.read_response()
        assert interim.status == 100
        connection.sendall(body)
        assert_good_response(connection.read_response())


def test_empty_expect_header_like_perf_analyzer(conn: Any, raw_http: Any) -> None:
    body = orjson.dumps(GOOD_DOC)
    headers = {"Expect": "", "Inference-Header-Content-Length": str(len(body))}
    assert_good_response(exchange(conn, raw_http, INFER, body, headers))


def test_chunked_body(conn: Any, raw_http: Any) -> None:
    body = orjson.dumps(GOOD_DOC)
    pieces = [body[:10], body[10:11], body[11:]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"
    head = raw_http.build_request("POST", INFER, b"", {"Content-Length": None, "Transfer-Encoding": "chunked"})
    conn.sendall(head + chunked)
    assert_good_response(conn.read_response())


def test_keep_alive_and_pipelining(raw_http: Any) -> None:
    request = raw_http.build_request("POST", *GOOD_REQUEST)
    with raw_http.connect() as connection:
        for _ in range(3):
            connection.sendall(request)
            response = connection.read_response()
            assert_good_response(response)
            assert response.headers.get("connection") != "close"
        # Pipelined: three requests in one write, three answers in order (an error among them).
        bad = raw_http.build_request("POST", INFER, b"{oops")
        health = raw_http.build_request("GET", "/v2/health/live")
        connection.sendall(request + bad + health)
        assert_good_response(connection.read_response())
        assert_error(connection.read_response(), 400)
        assert connection.read_response().status == 200


def test_connection_close_is_honoured(raw_http: Any) -> None:
    path, body = GOOD_REQUEST
    with raw_http.connect() as connection:
        connection.sendall(raw_http.build_request("POST", path, body, {"Connection": "close"}))
        response = connection.read_response()
        assert_good_response(response)
        assert response.headers["connection"] == "close"
        assert connection.is_closed_by_peer()


def test_malformed_http_closes_only_that_connection(raw_http: Any) -> None:
    with raw_http.connect() as connection:
        connection.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        assert_error(connection.read_response(), 400, "malformed")
        assert connection.is_closed_by_peer()
    assert_good_response(raw_http.request("POST", *GOOD_REQUEST))


def test_unknown_paths_and_methods(conn: Any, raw_http: Any) -> None:
    conn.sendall(raw_http.build_request("GET", "/v3/whatever"))
    assert_error(conn.read_response(), 404)
    conn.sendall(raw_http.build_request("GET", INFER))
    assert_error(conn.read_response(), 405)
    conn.sendall(raw_http.build_request("POST", "/v2/models/identity_fp32/nonsense", b"{}"))
    assert_error(conn.read_response(), 404)


def test_client_going_away_cancels_its_queued_request(raw_http: Any, client: Any) -> None:
    def success_count() -> int:
        (stats,) = client.get_inference_statistics("slow")["model_stats"]
        return int(stats["inference_stats"]["success"]["count"])

    def slow_request(sleep_s: float) -> bytes:
        doc = dict(GOOD_DOC, parameters={"sleep_s": sleep_s})
        return raw_http.build_request("POST", "/v2/models/slow/infer", orjson.dumps(doc))

    before = success_count()
    with raw_http.connect() as busy:
        busy.sendall(slow_request(0.4))  # occupies the model's only instance
        time.sleep(0.1)
        with raw_http.connect() as impatient:
            impatient.sendall(slow_request(0.0))  # queued behind it ...
        # ... and its client is gone before the instance is free.
        assert_good_response(busy.read_response())
    assert_good_response(raw_http.request("POST", "/v2/models/slow/infer", orjson.dumps(GOOD_DOC)))
    time.sleep(0.05)
    assert success_count() == before + 2


# limits: a server of its own ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_server() -> Iterator[Serve]:
    """A server accepting request bodies of at most 4 KiB."""
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, max_request_bytes=4096)) as s:
        s.bind(
            "identity_fp32",
            lambda requests: [{"OUTPUT0": r["INPUT0"]} for r in requests],
            inputs=[Tensor("INPUT0", np.float32, (-1,))],
            outputs=[Tensor("OUTPUT0", np.float32, (-1,))],
        )
        yield s


def test_body_over_the_limit_is_413(small_server: Serve, raw_http_for: Any) -> None:
    http = raw_http_for(small_server.http_port)
    big = np.zeros(2048, np.float32)
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [2048], "parameters": {"binary_data_size": big.nbytes}}
        ]
    }
    body, headers = binary_request(doc, big.tobytes())
    with http.connect() as connection:
        connection.sendall(http.build_request("POST", INFER, body, headers))
        assert_error(connection.read_response(), 413, "4096")
        # Refused from its Content-Length: the server closes the connection without waiting for the body.
        assert connection.is_closed_by_peer()
    with http.connect() as connection:
        # Chunked, so the size is only known while reading (and the connection stays open).
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        head = http.build_request(
            "POST", INFER, b"", {**headers, "Content-Length": None, "Transfer-Encoding": "chunked"}
        )
        connection.sendall(head + chunked)
        assert_error(connection.read_response(), 413, "4096")
    # A client waiting for 100 Continue hears 413 at once instead.
    with http.connect() as connection:
        head = http.build_request(
            "POST", INFER, b"", {**headers, "Content-Length": str(len(body)), "Expect": "100-continue"}
        )
        connection.sendall(head)
        assert_error(connection.read_response(), 413, "4096")
    # Compressed small, inflated over the limit.
    bomb = gzip.compress(body)
    assert len(bomb) < 4096
    response = http.request("POST", INFER, bomb, {**headers, "Content-Encoding": "gzip"})
    assert_error(response, 413, "4096")
    small = np.arange(8, dtype=np.float32)
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [8], "data": small.tolist()}]}
    response = http.request("POST", INFER, orjson.dumps(doc))
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == small.tolist()
