"""Hostile input over HTTP, the cases a fuzzer reaches seldom: data JSON cannot carry (BYTES that are not UTF-8,
NaN and infinities), zero-size tensors on every path, impossible shapes, slow and idle connections (slowloris),
oversized heads, hundreds of connections at once. docs/security.md describes the limits tested here."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.dtypes import serialize_bytes

from .conftest import RawHttp

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_S = 1.0
MAX_REQUEST_BYTES = 100_000
# How late past the timeout a connection may still be closed: a loaded machine delays the server's timer.
SLACK_S = 4.0
NON_FINITE = [np.nan, np.inf, -np.inf, 1.5]
NOT_UTF8 = [b"\xff\xfe", b"ok"]


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def specials(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Outputs JSON cannot carry as they are: NaN and infinities, bytes that are not UTF-8."""
    return [
        {
            "FP32": np.array([NON_FINITE], np.float32),
            "FP64": np.array([NON_FINITE], np.float64),
            "TEXT": np.array([NOT_UTF8], dtype=object),
        }
        for _ in requests
    ]


def empty(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Outputs of no elements, whatever the input."""
    return [{"FP32": np.zeros((1, 0), np.float32), "TEXT": np.empty((1, 0), dtype=object)} for _ in requests]


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    config = ServeConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        max_request_bytes=MAX_REQUEST_BYTES,
        http_header_timeout_s=HEADER_TIMEOUT_S,
    )
    batching = ModelConfig(max_batch_size=8)
    with Serve(config) as s:
        for name, dtype in (("fp32", np.float32), ("fp64", np.float64), ("bytes", bytes)):
            s.bind(
                f"identity_{name}",
                identity,
                inputs=[Tensor("INPUT0", dtype, (-1,))],
                outputs=[Tensor("OUTPUT0", dtype, (-1,))],
                config=batching,
            )
        single = [Tensor("INPUT0", np.float32, (-1,))]
        s.bind(
            "specials",
            specials,
            inputs=single,
            outputs=[Tensor("FP32", np.float32, (4,)), Tensor("FP64", np.float64, (4,)), Tensor("TEXT", bytes, (2,))],
            config=batching,
        )
        s.bind(
            "empty",
            empty,
            inputs=single,
            outputs=[Tensor("FP32", np.float32, (-1,)), Tensor("TEXT", bytes, (-1,))],
            config=batching,
        )
        yield s


@pytest.fixture(scope="module")
def http(server: Serve) -> RawHttp:
    return RawHttp(server.http_port)


@pytest.fixture(scope="module")
def client(server: Serve) -> Iterator[triton_http.InferenceServerClient]:
    with triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0) as c:
        yield c


def fp32_doc(values: list[float]) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}]}


def error_of(response: Any, status: int = 400) -> str:
    assert response.status == status, (response.status, response.body)
    message: str = response.json()["error"]
    return message


# data JSON cannot carry -----------------------------------------------------------------------------------------


def test_bytes_that_are_not_utf8_are_refused_as_json_never_altered(http: RawHttp) -> None:
    message = error_of(http.infer("specials", fp32_doc([1.0])))
    assert "output 'TEXT'" in message and "UTF-8" in message and '"binary_data": true' in message
    # As binary data they come back byte for byte.
    doc = {**fp32_doc([1.0]), "outputs": [{"name": "TEXT", "parameters": {"binary_data": True}}]}
    response = http.infer("specials", doc)
    assert response.status == 200
    header_length = int(response.headers["inference-header-content-length"])
    assert response.body[header_length:] == serialize_bytes(np.array(NOT_UTF8, dtype=object))


def test_bytes_that_are_utf8_come_back_as_json_unchanged(http: RawHttp) -> None:
    texts = ["", "a\x00b", "ünïcödé 😀", '"quoted" \\ back'.replace(" ", "\n")]
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, len(texts)], "data": texts}]}
    response = http.infer("identity_bytes", doc)
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == texts


def test_the_generate_extension_refuses_bytes_that_are_not_utf8(http: RawHttp) -> None:
    response = http.request("POST", "/v2/models/specials/generate", orjson.dumps({"INPUT0": [1.0]}))
    assert "output 'TEXT'" in error_of(response)


def test_nan_and_infinities_go_out_as_triton_writes_them(http: RawHttp, client: Any) -> None:
    response = http.infer("specials", {**fp32_doc([1.0]), "outputs": [{"name": "FP32"}, {"name": "FP64"}]})
    assert response.status == 200
    assert b'"data":[NaN,Infinity,-Infinity,1.5]' in response.body  # never null
    # tritonclient reads them back (Python's json reads the tokens).
    result = client.infer(
        "specials",
        [_fp32_input([1.0])],
        outputs=[triton_http.InferRequestedOutput(name, binary_data=False) for name in ("FP32", "FP64")],
    )
    for name, dtype in (("FP32", np.float32), ("FP64", np.float64)):
        np.testing.assert_array_equal(result.as_numpy(name), np.array([NON_FINITE], dtype))


def test_nan_and_infinities_come_in_as_triton_reads_them(client: Any) -> None:
    values = np.array([[np.nan, np.inf, -np.inf, -0.0, 1e-45]], np.float32)
    infer_input = triton_http.InferInput("INPUT0", list(values.shape), "FP32")
    infer_input.set_data_from_numpy(values, binary_data=False)  # tritonclient writes NaN, Infinity, -Infinity
    result = client.infer("identity_fp32", [infer_input])
    assert result.as_numpy("OUTPUT0").tobytes() == values.tobytes()


def test_a_generate_response_writes_nan_as_a_token(http: RawHttp) -> None:
    response = http.request("POST", "/v2/models/identity_fp64/generate", b'{"INPUT0": NaN}')
    assert response.status == 200, response.body
    assert json.loads(response.body)["OUTPUT0"] != json.loads(response.body)["OUTPUT0"]  # NaN
    assert b'"OUTPUT0":NaN' in response.body


def test_a_json_number_past_the_datatype_is_refused_not_made_infinite(http: RawHttp) -> None:
    assert "out of range for FP32" in error_of(http.infer("identity_fp32", fp32_doc([1.0, 1e300])))


def _fp32_input(values: list[float]) -> Any:
    infer_input = triton_http.InferInput("INPUT0", [1, len(values)], "FP32")
    infer_input.set_data_from_numpy(np.array([values], np.float32))
    return infer_input


# zero-size tensors ----------------------------------------------------------------------------------------------


def test_zero_size_tensors_on_every_http_path(http: RawHttp) -> None:
    def outputs(response: Any) -> list[dict[str, Any]]:
        assert response.status == 200, response.body
        length = int(response.headers.get("inference-header-content-length", len(response.body)))
        doc: list[dict[str, Any]] = orjson.loads(response.body[:length])["outputs"]
        return doc

    for datatype, model in (("FP32", "identity_fp32"), ("BYTES", "identity_bytes")):
        as_json = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, 0], "data": []}]}
        assert outputs(http.infer(model, as_json)) == [
            {"name": "OUTPUT0", "datatype": datatype, "shape": [1, 0], "data": []}
        ]
        binary = {
            "inputs": [
                {"name": "INPUT0", "datatype": datatype, "shape": [2, 0], "parameters": {"binary_data_size": 0}}
            ],
            "parameters": {"binary_data_output": True},
        }
        response = http.infer(
            model, binary, headers={"Inference-Header-Content-Length": str(len(orjson.dumps(binary)))}
        )
        assert outputs(response)[0]["shape"] == [2, 0]
        assert outputs(response)[0]["parameters"] == {"binary_data_size": 0}
    # The raw binary form (Inference-Header-Content-Length: 0) of no bytes: one row of no elements.
    raw = http.request("POST", "/v2/models/identity_fp32/infer", b"", {"Inference-Header-Content-Length": "0"})
    assert outputs(raw)[0]["shape"] == [1, 0]
    # A model's own empty outputs, as JSON and as binary data.
    assert [o["data"] for o in outputs(http.infer("empty", fp32_doc([1.0])))] == [[], []]
    doc = {**fp32_doc([]), "parameters": {"binary_data_output": True}}
    assert [o["parameters"] for o in outputs(http.infer("empty", doc))] == [{"binary_data_size": 0}] * 2


def test_shapes_no_array_can_have_are_refused(http: RawHttp) -> None:
    too_large = '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,0,4611686018427387904],"data":[]}]}'
    message = error_of(http.request("POST", "/v2/models/identity_fp32/infer", too_large.encode()))
    assert "input 'INPUT0'" in message and "too large" in message
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1] + [0] * 40, "data": []}]}
    assert "41 dimensions" in error_of(http.infer("identity_fp32", doc))


# compressed bodies ----------------------------------------------------------------------------------------------


def test_compressed_bodies_are_read_whole_or_refused(http: RawHttp) -> None:
    body = orjson.dumps(fp32_doc([1.0, 2.0]))
    path = "/v2/models/identity_fp32/infer"
    gzip_header = {"Content-Encoding": "gzip"}
    two_members = gzip.compress(body[:10]) + gzip.compress(body[10:])
    assert http.request("POST", path, two_members, gzip_header).status == 200
    cut = gzip.compress(body)[:-12]
    assert "ends within its data" in error_of(http.request("POST", path, cut, gzip_header))
    trailing = gzip.compress(body) + b"junk"
    assert "decompress" in error_of(http.request("POST", path, trailing, gzip_header))
    assert "unsupported Content-Encoding 'br'" in error_of(http.request("POST", path, body, {"Content-Encoding": "br"}))


# slow, idle and oversized connections --------------------------------------------------------------------------


def read_all(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (or ``limit_s`` passes); how long that took."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    except ConnectionResetError:
        pass
    return data, time.monotonic() - start


def test_headers_sent_slowly_are_cut_off_while_others_are_served(server: Serve, http: RawHttp) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port)) as slow:
        slow.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        answered = None
        while time.monotonic() - start < HEADER_TIMEOUT_S + 2 * SLACK_S:
            try:
                slow.sendall(b"X")  # one byte of a header at a time: never done
            except (BrokenPipeError, ConnectionResetError):
                break
            # Meanwhile the server answers everyone else.
            assert http.infer("identity_fp32", fp32_doc([1.0])).status == 200
            slow.settimeout(0.2)
            try:
                answered = slow.recv(65536)
                break
            except TimeoutError:
                continue
        elapsed = time.monotonic() - start
        assert answered is not None and answered.startswith(b"HTTP/1.1 408 "), answered
        assert b"did not arrive within 1 s" in answered
        assert elapsed < HEADER_TIMEOUT_S + SLACK_S


def test_a_connection_that_sends_nothing_is_closed(server: Serve) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port)) as idle:
        data, elapsed = read_all(idle, HEADER_TIMEOUT_S + 2 * SLACK_S)
    assert data == b""  # nobody asked anything: closed without an answer
    assert HEADER_TIMEOUT_S * 0.9 < elapsed < HEADER_TIMEOUT_S + SLACK_S


def test_a_body_that_stalls_is_cut_off_but_a_slow_steady_one_is_not(server: Serve, http: RawHttp) -> None:
    body = orjson.dumps(fp32_doc([1.0, 2.0]))
    head = RawHttp.build_request("POST", "/v2/models/identity_fp32/infer", b"", {"Content-Length": str(len(body))})
    with socket.create_connection(("127.0.0.1", server.http_port)) as stalled:
        stalled.sendall(head + body[:10])
        data, elapsed = read_all(stalled, HEADER_TIMEOUT_S + 2 * SLACK_S)
    assert data.startswith(b"HTTP/1.1 408 ") and b"body stalled" in data
    assert elapsed < HEADER_TIMEOUT_S + SLACK_S
    # Pauses shorter than the timeout, adding up to more than it, are fine.
    with http.connect() as steady:
        steady.sendall(head)
        piece = len(body) // 5 + 1
        for start in range(0, len(body), piece):
            time.sleep(HEADER_TIMEOUT_S / 3)
            steady.sendall(body[start : start + piece])
        assert steady.read_response().status == 200


def test_a_keep_alive_connection_may_idle_between_requests(http: RawHttp) -> None:
    request = RawHttp.build_request("GET", "/v2/health/ready")
    with http.connect() as conn:
        conn.sendall(request)
        assert conn.read_response().status == 200
        time.sleep(2 * HEADER_TIMEOUT_S)
        conn.sendall(request)
        assert conn.read_response().status == 200


def test_heads_past_the_limit_are_431_however_they_arrive(server: Serve, http: RawHttp) -> None:
    request = RawHttp.build_request("GET", "/v2/health/ready", headers={"X-Big": "a" * 70_000})
    with http.connect() as whole:
        whole.sendall(request)
        assert "exceed the limit of 65536 bytes" in error_of(whole.read_response(), 431)
        assert whole.is_closed_by_peer()
    with http.connect() as pieces:
        for start in range(0, len(request), 4096):
            try:
                pieces.sendall(request[start : start + 4096])
            except (BrokenPipeError, ConnectionResetError):
                break
        assert pieces.read_response().status == 431
    assert http.request("GET", "/v2/health/ready").status == 200


def test_an_endless_chunked_body_is_cut_off_at_the_limit(server: Serve) -> None:
    head = RawHttp.build_request(
        "POST", "/v2/models/identity_fp32/infer", b"", {"Content-Length": None, "Transfer-Encoding": "chunked"}
    )
    chunk = b"%x\r\n%s\r\n" % (10_000, b" " * 10_000)
    with socket.create_connection(("127.0.0.1", server.http_port)) as conn:
        conn.sendall(head)
        sent = 0
        conn.settimeout(0.05)
        answer = b""
        while sent < 50 * MAX_REQUEST_BYTES and not answer:
            conn.sendall(chunk)
            sent += len(chunk)
            try:
                answer = conn.recv(65536)
            except TimeoutError:
                continue
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert sent < 3 * MAX_REQUEST_BYTES


# many connections -----------------------------------------------------------------------------------------------


def test_hundreds_of_connections_at_once_are_all_answered(server: Serve) -> None:
    connections = 300

    async def one(index: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
        body = orjson.dumps(fp32_doc([float(index)]))
        writer.write(RawHttp.build_request("POST", "/v2/models/identity_fp32/infer", body))
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := await reader.readline()) != b"\r\n":
            name, _, value = line.decode().partition(":")
            headers[name.lower()] = value.strip()
        answer = orjson.loads(await reader.readexactly(int(headers["content-length"])))
        assert answer["outputs"][0]["data"] == [float(index)]
        writer.close()
        return status

    async def all_at_once() -> list[int]:
        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(connections))), 60)

    assert asyncio.run(all_at_once()) == [200] * connections


def test_the_server_still_serves_after_all_this(client: Any) -> None:
    assert client.is_server_ready()
    result = client.infer("identity_fp32", [_fp32_input([1.0, 2.0])])
    assert result.as_numpy("OUTPUT0").tolist() == [[1.0, 2.0]]


def test_tritonclient_hears_an_error_for_bytes_json_cannot_carry(client: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            "specials", [_fp32_input([1.0])], outputs=[triton_http.InferRequestedOutput("TEXT", binary_data=False)]
        )
    assert info.value.status() == "400" and "output 'TEXT'" in info.value.message()
