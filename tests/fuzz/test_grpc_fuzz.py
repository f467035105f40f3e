"""Fuzzing the gRPC front end: hostile messages over one channel to a real server on loopback, as unary calls and
through ModelStreamInfer.

Every call must end within a bound, OK or with INVALID_ARGUMENT / NOT_FOUND (RESOURCE_EXHAUSTED past the size limit,
UNIMPLEMENTED only for what the server does not do) and details that name what is wrong; an accepted infer request
must come back unchanged; a stream answers each of its requests, errors as ``error_message``; afterwards the server
still answers health and a normal request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pyserve import Serve
from pyserve.frontends.protocol import grpc_service_pb2 as pb

from .conftest import FUZZ_CASES, LONG_RUN
from .grpc_cases import GrpcCase, damaged_cases, infer_cases, other_cases, oversized_case

# The long run (PYSERVE_FUZZ_CASES=100000) takes minutes, not the suite's two.
pytestmark = [pytest.mark.fuzz, pytest.mark.integration, pytest.mark.timeout(max(120, FUZZ_CASES // 40))]

SERVICE = "/inference.GRPCInferenceService/"
BATCH = 25  # calls per hypothesis example, in flight together on one channel
ANSWER_TIMEOUT_S = 15.0  # longer than this is a hang
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
# What UNIMPLEMENTED may be about: a valid request for something the server does not do.
UNSUPPORTED = ("decoupled", "model repository", "CUDA", "TENSORS", "opentelemetry", "OpenTelemetry")


def problem(case: GrpcCase, code: grpc.StatusCode, details: str, response: bytes | None) -> str | None:
    """What is wrong with the answer to a case (None: a correct answer)."""
    if code == grpc.StatusCode.OK:
        if not case.may_succeed:
            return "accepted a request that must be refused"
        if case.check is not None and response is not None:
            return case.check(pb.ModelInferResponse.FromString(response))
        return None
    if code == grpc.StatusCode.UNIMPLEMENTED:
        if not any(word in details for word in UNSUPPORTED):
            return "UNIMPLEMENTED for something other than an unsupported feature"
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "larger than max" not in details:
            return "RESOURCE_EXHAUSTED for something other than the message size"
    elif code not in REFUSALS:
        return f"status {code.name}"
    return error_problem(case, details)


def error_problem(case: GrpcCase, details: str) -> str | None:
    if not details.strip():
        return "an error without a message"
    if "internal" in details.lower() or "Traceback" in details:
        return "an internal error"
    if not case.may_fail:
        return "refused a valid request"
    if case.expect and not any(fragment in details for fragment in case.expect):
        return f"the message names none of {case.expect}"
    return None


def fail(case: GrpcCase, trouble: str, answer: str = "") -> None:
    pytest.fail(f"{case.label}: {trouble}\nmessage: {case!r}\nanswer: {answer[:600]}", pytrace=False)


class Channel:
    """One channel to the server; each method takes and returns raw bytes."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        )
        self._methods: dict[str, Any] = {}

    def unary(self, method: str) -> Any:
        if method not in self._methods:
            self._methods[method] = self.channel.unary_unary(SERVICE + method)
        return self._methods[method]

    def stream(self) -> Any:
        return self.channel.stream_stream(SERVICE + "ModelStreamInfer")

    def close(self) -> None:
        self.channel.close()


def call_all(channel: Channel, cases: list[GrpcCase], counts: Counter[str]) -> None:
    """Every case as a unary call, all in flight together; each answer checked."""
    futures = [channel.unary(case.method).future(case.data, timeout=ANSWER_TIMEOUT_S) for case in cases]
    for case, future in zip(cases, futures, strict=True):
        try:
            response = future.result()
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as error:
            response, code, details = None, error.code(), error.details() or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            fail(case, f"no answer within {ANSWER_TIMEOUT_S} s")
        trouble = problem(case, code, details, response)
        if trouble is not None:
            fail(case, trouble, f"{code.name} {details}")
        counts["cases"] += 1
        counts[code.name] += 1


def stream_all(channel: Channel, cases: list[GrpcCase], counts: Counter[str]) -> None:
    """The cases as the requests of one ModelStreamInfer call: each gets one answer, errors as error_message."""
    call = channel.stream()(iter([case.data for case in cases]), timeout=ANSWER_TIMEOUT_S)
    try:
        responses = [pb.ModelStreamInferResponse.FromString(data) for data in call]
    except grpc.RpcError as error:
        pytest.fail(f"the stream ended with {error.code().name} {error.details()}\nmessages: {cases!r}", pytrace=False)
    if len(responses) != len(cases):
        pytest.fail(f"{len(cases)} requests, {len(responses)} answers\nmessages: {cases!r}", pytrace=False)
    by_id = {case.id: case for case in cases if case.id}
    if len(by_id) == len([case for case in cases if case.id]):
        for response in responses:
            case = by_id.get(response.infer_response.id)
            if case is None:
                continue
            if response.error_message:
                trouble = error_problem(case, response.error_message)
            elif not case.may_succeed:
                trouble = "accepted a request that must be refused"
            else:
                trouble = case.check(response.infer_response) if case.check is not None else None
            if trouble is not None:
                fail(case, trouble, response.error_message)
    for response in responses:
        counts["error" if response.error_message else "OK"] += 1
    counts["cases"] += len(cases)


def fuzz_settings(examples: int) -> Any:
    return settings(
        max_examples=max(1, examples),
        deadline=None,
        database=None,
        derandomize=not LONG_RUN,
        suppress_health_check=list(HealthCheck),
        # No shrinking: a failure names its message, which stands alone, and shrinking against a live server is slow.
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
    )


def assert_still_serving(channel: Channel) -> None:
    ready = pb.ServerReadyResponse.FromString(channel.unary("ServerReady")(b"", timeout=10))
    assert ready.ready
    message = pb.ModelInferRequest(model_name="identity_fp32")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    message.raw_input_contents.append(np.array([1.5, -2.0], np.float32).tobytes())
    response = pb.ModelInferResponse.FromString(channel.unary("ModelInfer")(message.SerializeToString(), timeout=10))
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.5, -2.0]


@pytest.fixture
def channel(fuzz_server: Serve) -> Iterator[Channel]:
    channel = Channel(fuzz_server.grpc_port)
    yield channel
    assert_still_serving(channel)
    channel.close()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    tally = ", ".join(f"{key}: {value}" for key, value in sorted(counts.items()))
    print(f"\n{request.node.name}: {counts['cases']} cases; {tally}")


def test_unary_calls(channel: Channel, report: Counter[str]) -> None:
    """ModelInfer with valid, mutated and damaged messages, and every other RPC with odd ones, BATCH at a time."""
    target = FUZZ_CASES // 2

    @fuzz_settings(-(-target // BATCH))
    @given(
        st.lists(
            st.one_of(infer_cases(), infer_cases(), infer_cases(), damaged_cases(), other_cases()),
            min_size=BATCH,
            max_size=BATCH,
        )
    )
    def run(cases: list[GrpcCase]) -> None:
        call_all(channel, cases, report)

    run()
    call_all(channel, [oversized_case()], report)
    assert report["cases"] >= target
    assert report["OK"] > 0 and report["RESOURCE_EXHAUSTED"] == 1


def test_streams(channel: Channel, report: Counter[str]) -> None:
    """ModelStreamInfer: BATCH valid, mutated and damaged requests a stream; every one answered."""
    target = FUZZ_CASES - FUZZ_CASES // 2

    @st.composite
    def streams(draw: st.DrawFn) -> list[GrpcCase]:
        # Unique ids, so that answers can be matched to their requests.
        return [
            draw(st.one_of(infer_cases(f"fuzz-{i}"), infer_cases(f"fuzz-{i}"), damaged_cases())) for i in range(BATCH)
        ]

    @fuzz_settings(-(-target // BATCH))
    @given(streams())
    def run(cases: list[GrpcCase]) -> None:
        stream_all(channel, cases, report)

    run()
    assert report["cases"] >= target
    assert report["OK"] > 0
