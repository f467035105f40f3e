"""Fuzzing the HTTP front end: hostile requests over keep-alive connections to a real server on loopback.

Every answer must come within a bound and be 200 or a 4xx whose message names what is wrong (501 only for what the
server does not do); an accepted infer request must come back unchanged; the connection must stay open unless the
request broke HTTP itself; afterwards the server still answers health and a normal request.
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pyserve import Serve

from .conftest import FUZZ_CASES, LONG_RUN
from .http_cases import HttpCase, Response, http_request, infer_cases, oversized_cases, raw_cases, route_cases

# The long run (PYSERVE_FUZZ_CASES=100000) takes minutes, not the suite's two.
pytestmark = [pytest.mark.fuzz, pytest.mark.integration, pytest.mark.timeout(max(120, FUZZ_CASES // 40))]

BATCH = 25  # cases per hypothesis example, pipelined on one connection
ANSWER_TIMEOUT_S = 15.0  # longer than this is a hang
# What a 501 may be about: a valid request for something the server does not do.
UNSUPPORTED = ("decoupled", "model repository", "TENSORS", "CUDA", "opentelemetry", "OpenTelemetry")


class Connection:
    """One keep-alive connection to the server: send any bytes, read the responses in order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
        self.reader = self.sock.makefile("rb")

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def read_response(self) -> Response | None:
        """The next final response, or None when the server closed the connection first."""
        while True:
            status_line = self.reader.readline()
            if not status_line:
                return None
            version, status, *_ = status_line.decode("latin-1").split(" ", 2)
            assert version == "HTTP/1.1", status_line
            headers: dict[str, str] = {}
            while True:
                line = self.reader.readline().decode("latin-1").rstrip("\r\n")
                if not line:
                    break
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if int(status) >= 200:
                return Response(int(status), headers, self._body(headers))

    def _body(self, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding") == "chunked":
            chunks = []
            while True:
                size = int(self.reader.readline().strip(), 16)
                chunks.append(self.reader.read(size + 2)[:size])
                if not size:
                    return b"".join(chunks)
        length = int(headers.get("content-length", "0"))
        body = self.reader.read(length)
        assert len(body) == length, f"response body cut short: {len(body)} of {length} bytes"
        return body


def problem(case: HttpCase, response: Response) -> str | None:
    """What is wrong with the answer to a case (None: a correct answer)."""
    status = response.status
    if status == 200:
        if not case.may_succeed:
            return "accepted a request that must be refused"
        return case.check(response) if case.check is not None else None
    if status == 302 and case.may_succeed and response.headers.get("location"):
        return None  # GET / redirects to the status page
    if not (400 <= status < 500 or status == 501):
        return f"status {status}"
    if not response.body and status == 400 and case.request.split(b" HTTP/1.1", 1)[0].endswith((b"/ready", b"/live")):
        return None  # not ready: Triton's empty 400
    if response.headers.get("content-type") != "application/json":
        return f"an error that is not JSON: {response.headers.get('content-type')}"
    message = orjson.loads(response.body).get("error")
    if not isinstance(message, str) or not message.strip():
        return "an error without a message"
    if status == 501 and not any(word in message for word in UNSUPPORTED):
        return "501 for something other than an unsupported feature"
    if not case.may_fail:
        return "refused a valid request"
    if case.expect and not any(fragment in message for fragment in case.expect):
        return f"the message names none of {case.expect}"
    return None


def fail(case: HttpCase, trouble: str, response: Response | None = None) -> None:
    request = case.request if len(case.request) < 2000 else case.request[:2000] + b"..."
    answer = "" if response is None else f"\nanswer: {response.status} {response.body[:2000]!r}"
    pytest.fail(f"{case.label}: {trouble}\nrequest: {request!r}{answer}", pytrace=False)


def exchange(port: int, cases: list[HttpCase], counts: Counter[str]) -> None:
    """Send the cases pipelined on one connection; check each answer in order."""
    conn = Connection(port)
    try:
        conn.sock.sendall(b"".join(case.request for case in cases))
        for case in cases:
            try:
                response = conn.read_response()
            except TimeoutError:
                fail(case, f"no answer within {ANSWER_TIMEOUT_S} s")
            if response is None:
                fail(case, "the server closed the connection instead of answering")
            assert response is not None
            trouble = problem(case, response)
            if trouble is not None:
                fail(case, trouble, response)
            if response.headers.get("connection") == "close":
                fail(case, "the server closed a connection whose request was well-formed HTTP", response)
            counts["cases"] += 1
            counts[f"status {response.status}"] += 1
    finally:
        conn.close()


def exchange_alone(port: int, case: HttpCase, counts: Counter[str]) -> None:
    """Send one case on a connection of its own, then say we are done sending: whatever answers come must be
    correct, and the server must close the connection within the bound."""
    conn = Connection(port)
    answered = False
    try:
        try:
            conn.sock.sendall(case.request)
            conn.sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all
        while True:
            try:
                response = conn.read_response()
            except TimeoutError:
                fail(case, f"the connection stayed open {ANSWER_TIMEOUT_S} s after the client finished")
            except (ConnectionResetError, ValueError):
                break
            if response is None:
                break
            trouble = problem(case, response)
            if trouble is not None:
                fail(case, trouble, response)
            counts[f"status {response.status}"] += 1
            answered = True
        if not answered and not case.may_succeed:
            fail(case, "no answer to a request that must be refused")
        counts["cases"] += 1
    finally:
        conn.close()


def fuzz_settings(examples: int) -> Any:
    return settings(
        max_examples=max(1, examples),
        deadline=None,
        database=None,
        derandomize=not LONG_RUN,
        suppress_health_check=list(HealthCheck),
        # No shrinking: a failure names its request, which stands alone, and shrinking against a live server is slow.
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
    )


def assert_still_serving(port: int) -> None:
    conn = Connection(port)
    try:
        conn.sock.sendall(http_request("GET", "/v2/health/ready"))
        response = conn.read_response()
        assert response is not None and response.status == 200
        doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2.0]}]}
        conn.sock.sendall(http_request("POST", "/v2/models/identity_fp32/infer", orjson.dumps(doc)))
        response = conn.read_response()
        assert response is not None and response.status == 200, response
        assert orjson.loads(response.body)["outputs"][0]["data"] == [1.5, -2.0]
    finally:
        conn.close()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    print(
        f"\n{request.node.name}: {counts['cases']} cases; " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    )


def test_infer_and_route_requests(fuzz_server: Serve, report: Counter[str]) -> None:
    """Infer requests (valid ones checked value by value, mutated ones refused with a reason) and every other route,
    pipelined on keep-alive connections."""
    port = fuzz_server.http_port
    target = FUZZ_CASES * 9 // 10

    @fuzz_settings(-(-target // BATCH))
    @given(
        st.lists(st.one_of(infer_cases(), infer_cases(), infer_cases(), route_cases()), min_size=BATCH, max_size=BATCH)
    )
    def run(cases: list[HttpCase]) -> None:
        exchange(port, cases, report)

    run()
    assert report["cases"] >= target
    assert report["status 200"] > 0
    assert_still_serving(port)


def test_raw_bytes_and_oversized_requests(fuzz_server: Serve, report: Counter[str]) -> None:
    """Bytes that are not (quite) HTTP, and heads and bodies over the limits, each on a connection of its own."""
    port = fuzz_server.http_port
    target = max(20, FUZZ_CASES // 10)

    @fuzz_settings(target)
    @given(st.one_of(raw_cases(), raw_cases(), raw_cases(), raw_cases(), raw_cases(), raw_cases(), oversized_cases()))
    def run(case: HttpCase) -> None:
        exchange_alone(port, case, report)

    run()
    assert report["cases"] >= target
    assert_still_serving(port)
