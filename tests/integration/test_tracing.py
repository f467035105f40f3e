"""OpenTelemetry tracing on a real server: the span tree of a request across the core and its workers, the client's
W3C traceparent, and Triton's trace settings over HTTP and gRPC.

The core and process workers write their spans to ``ServeConfig.trace_file`` (JSON lines); the model functions here
run in this process (thread instances), where spans they start go to an in-memory exporter, so the test sees the
whole tree: client span → InferRequest → queue, compute → the function's own span.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tritonclient.utils import InferenceServerException

from pyserve import ModelConfig, Request, Serve, ServeConfig, Step, Tensor

pytestmark = pytest.mark.integration

FP32 = [Tensor("INPUT0", np.float32, (-1,))]
FP32_OUT = [Tensor("OUTPUT0", np.float32, (-1,))]
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"

# The functions' own spans: a provider of this test's, as a user would set one up.
user_spans = InMemorySpanExporter()
user_provider = TracerProvider()
user_provider.add_span_processor(SimpleSpanProcessor(user_spans))
user_tracer = user_provider.get_tracer("user-model")


def identity_with_a_span(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    with user_tracer.start_as_current_span("user-work"):
        return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def pid_of_worker(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": np.full(request["INPUT0"].shape, os.getpid(), np.float32)} for request in requests]


def plus_one(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"] + 1} for request in requests]


def fails(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    raise ValueError("no answer today")


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces") / "spans.jsonl"


@pytest.fixture(scope="module")
def server(trace_file: Path) -> Iterator[Serve]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_TRACES_EXPORTER", "none")  # the trace file only: nothing to send anywhere
        config = ServeConfig(
            http_port=0, grpc_port=0, metrics_port=0, trace_level="TIMESTAMPS", trace_rate=1, trace_file=str(trace_file)
        )
        s = Serve(config)
        s.bind("traced", identity_with_a_span, FP32, FP32_OUT, ModelConfig(max_batch_size=8))
        s.bind("in_process", pid_of_worker, FP32, FP32_OUT, ModelConfig(max_batch_size=8, worker="process"))
        s.bind("settings", plus_one, FP32, FP32_OUT, ModelConfig(max_batch_size=8))
        s.bind("fails", fails, FP32, FP32_OUT, ModelConfig(max_batch_size=8))
        s.bind("first", plus_one, FP32, FP32_OUT, ModelConfig(max_batch_size=8))
        s.bind("second", plus_one, FP32, FP32_OUT, ModelConfig(max_batch_size=8))
        s.bind_ensemble(
            "pipeline",
            [
                Step("first", inputs={"INPUT0": "INPUT0"}, outputs={"OUTPUT0": "middle"}),
                Step("second", inputs={"INPUT0": "middle"}, outputs={"OUTPUT0": "OUTPUT0"}),
            ],
            FP32,
            FP32_OUT,
            max_batch_size=8,
        )
        try:
            s.run()
            yield s
        finally:
            s.stop()


@pytest.fixture(scope="module")
def client(server: Serve) -> Iterator[triton_http.InferenceServerClient]:
    c = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30.0)
    yield c
    c.close()


def infer(client: triton_http.InferenceServerClient, model: str, **kwargs: Any) -> np.ndarray:
    item = triton_http.InferInput("INPUT0", [1, 2], "FP32")
    item.set_data_from_numpy(np.array([[1, 2]], np.float32))
    return client.infer(model, [item], **kwargs).as_numpy("OUTPUT0")


def spans(trace_file: Path) -> list[dict[str, Any]]:
    if not trace_file.exists():
        return []
    return [json.loads(line) for line in trace_file.read_text().splitlines() if line]


def trace_of(trace_file: Path, trace_id: str, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The spans of one trace, once ``count`` of them are written (workers write theirs as their spans end)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [s for s in spans(trace_file) if s["context"]["trace_id"] == "0x" + trace_id]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def by_name(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {span["name"]: span for span in found}


def span_id(span: dict[str, Any]) -> str:
    return str(span["context"]["span_id"])


def request_spans_of(trace_file: Path, model: str) -> list[dict[str, Any]]:
    return [
        s for s in spans(trace_file) if s["name"] == "InferRequest" and s["attributes"]["triton.model_name"] == model
    ]


# the span tree ---------------------------------------------------------------------------------------------------


def test_a_request_is_traced_under_the_clients_traceparent(
    client: triton_http.InferenceServerClient, trace_file: Path
) -> None:
    user_spans.clear()
    infer(client, "traced", headers={"traceparent": TRACEPARENT}, request_id="req-7")
    tree = by_name(trace_of(trace_file, CLIENT_TRACE, 3))
    assert set(tree) == {"InferRequest", "queue", "compute"}
    request = tree["InferRequest"]
    assert request["parent_id"] == "0x" + CLIENT_SPAN  # the client's span is the parent
    assert request["kind"] == "SpanKind.SERVER"
    assert request["attributes"]["triton.model_name"] == "traced"
    assert request["attributes"]["pyserve.request_id"] == "req-7"
    assert request["status"]["status_code"] == "UNSET"
    assert tree["queue"]["parent_id"] == span_id(request)
    assert tree["compute"]["parent_id"] == span_id(request)
    assert tree["compute"]["attributes"]["pyserve.batch_requests"] == 1
    assert request["resource"]["attributes"]["service.name"] == "pyserve"
    # the function's own span (this process, in-memory exporter) nests under the worker's compute span
    (work,) = user_spans.get_finished_spans()
    assert work.name == "user-work"
    assert work.parent is not None
    assert f"0x{work.parent.span_id:016x}" == span_id(tree["compute"])
    assert f"{work.context.trace_id:032x}" == CLIENT_TRACE


def test_a_request_without_traceparent_starts_its_own_trace(
    client: triton_http.InferenceServerClient, trace_file: Path
) -> None:
    before = len(request_spans_of(trace_file, "traced"))
    infer(client, "traced")
    deadline = time.monotonic() + 10
    while len(request_spans_of(trace_file, "traced")) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    newest = request_spans_of(trace_file, "traced")[-1]
    assert newest["parent_id"] is None
    trace_id = newest["context"]["trace_id"][2:]
    assert by_name(trace_of(trace_file, trace_id, 3)).keys() == {"InferRequest", "queue", "compute"}


def test_the_compute_span_of_a_process_instance_joins_the_trace(
    client: triton_http.InferenceServerClient, trace_file: Path
) -> None:
    trace_id = "11111111111111111111111111111111"
    pid = int(infer(client, "in_process", headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"})[0, 0])
    assert pid != os.getpid()
    tree = by_name(trace_of(trace_file, trace_id, 3))
    assert tree["compute"]["parent_id"] == span_id(tree["InferRequest"])
    assert tree["compute"]["attributes"]["process.pid"] == pid


def test_grpc_requests_take_the_traceparent_metadata(server: Serve, trace_file: Path) -> None:
    trace_id = "22222222222222222222222222222222"
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        item = triton_grpc.InferInput("INPUT0", [1, 2], "FP32")
        item.set_data_from_numpy(np.zeros((1, 2), np.float32))
        grpc.infer("traced", [item], headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"})
    finally:
        grpc.close()
    tree = by_name(trace_of(trace_file, trace_id, 3))
    assert tree["InferRequest"]["parent_id"] == "0x" + CLIENT_SPAN


def test_each_ensemble_step_is_a_child_of_the_ensemble_request(
    client: triton_http.InferenceServerClient, trace_file: Path
) -> None:
    trace_id = "33333333333333333333333333333333"
    np.testing.assert_array_equal(
        infer(client, "pipeline", headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}), [[3, 4]]
    )
    found = trace_of(trace_file, trace_id, 7)  # the ensemble's request + two steps x (request, queue, compute)
    requests = {s["attributes"]["triton.model_name"]: s for s in found if s["name"] == "InferRequest"}
    assert set(requests) == {"pipeline", "first", "second"}
    assert requests["pipeline"]["parent_id"] == "0x" + CLIENT_SPAN
    for step in ("first", "second"):
        assert requests[step]["parent_id"] == span_id(requests["pipeline"])
        children = {s["name"] for s in found if s["parent_id"] == span_id(requests[step])}
        assert children == {"queue", "compute"}


def test_a_failed_request_has_an_error_status(client: triton_http.InferenceServerClient, trace_file: Path) -> None:
    trace_id = "44444444444444444444444444444444"
    item = triton_http.InferInput("INPUT0", [1, 2], "FP32")
    item.set_data_from_numpy(np.zeros((1, 2), np.float32))
    with pytest.raises(InferenceServerException, match="no answer today"):
        client.infer("fails", [item], headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"})
    tree = by_name(trace_of(trace_file, trace_id, 3))
    assert tree["InferRequest"]["status"]["status_code"] == "ERROR"
    assert "ModelExecutionError" in tree["InferRequest"]["status"]["description"]
    assert tree["compute"]["status"]["status_code"] == "ERROR"


# trace settings --------------------------------------------------------------------------------------------------


def post(client: triton_http.InferenceServerClient, path: str, doc: dict[str, Any]) -> Any:
    response = client._post(path, orjson.dumps(doc), None, None)
    return response.status_code, orjson.loads(response.read())


def test_trace_settings_have_tritons_shape(client: triton_http.InferenceServerClient, trace_file: Path) -> None:
    settings = client.get_trace_settings()
    assert settings == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(trace_file),
        "trace_mode": "opentelemetry",
    }
    assert client.get_trace_settings(model_name="settings") == settings


def test_model_settings_override_the_servers_and_clear_with_null(
    client: triton_http.InferenceServerClient, trace_file: Path
) -> None:
    updated = client.update_trace_settings(model_name="settings", settings={"trace_level": ["OFF"]})
    assert updated["trace_level"] == ["OFF"]
    assert client.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]  # the server's are unchanged
    before = len(request_spans_of(trace_file, "settings"))
    infer(client, "settings")
    infer(client, "traced")  # still traced
    time.sleep(0.3)
    assert len(request_spans_of(trace_file, "settings")) == before
    cleared = client.update_trace_settings(model_name="settings", settings={"trace_level": None})
    assert cleared["trace_level"] == ["TIMESTAMPS"]


def test_trace_rate_and_count_choose_which_requests_are_traced(
    client: triton_http.InferenceServerClient, trace_file: Path
) -> None:
    client.update_trace_settings(model_name="settings", settings={"trace_rate": "2", "trace_count": "2"})
    try:
        before = len(request_spans_of(trace_file, "settings"))
        for _ in range(8):
            infer(client, "settings")
        deadline = time.monotonic() + 5
        while len(request_spans_of(trace_file, "settings")) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        # one in two is sampled, and only two traces were allowed
        assert len(request_spans_of(trace_file, "settings")) == before + 2
        assert client.get_trace_settings(model_name="settings")["trace_count"] == "0"
    finally:
        client.update_trace_settings(model_name="settings", settings={"trace_rate": None, "trace_count": None})


def test_bad_trace_settings_are_refused(client: triton_http.InferenceServerClient) -> None:
    for doc, status, words in (
        ({"trace_rate": "often"}, 400, "trace_rate must be an integer"),
        ({"trace_level": ["LOUD"]}, 400, "unknown trace_level"),
        ({"trace_level": ["TENSORS"]}, 501, "TENSORS is not supported"),
        ({"trace_file": "/elsewhere"}, 400, "cannot be changed at run time"),
        ({"colour": "blue"}, 400, "unknown trace setting"),
    ):
        code, body = post(client, "v2/trace/setting", doc)
        assert code == status and words in body["error"], (doc, body)
    code, _ = post(client, "v2/models/no_such_model/trace/setting", {"trace_rate": "1"})
    assert code == 404
    assert client.get_trace_settings()["trace_rate"] == "1"  # nothing changed


def test_grpc_trace_settings(server: Serve) -> None:
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        got = grpc.get_trace_settings(model_name="settings", as_json=True)["settings"]
        assert got["trace_level"]["value"] == ["TIMESTAMPS"]
        updated = grpc.update_trace_settings(model_name="settings", settings={"trace_rate": "5"}, as_json=True)
        assert updated["settings"]["trace_rate"]["value"] == ["5"]
        cleared = grpc.update_trace_settings(model_name="settings", settings={"trace_rate": None}, as_json=True)
        assert cleared["settings"]["trace_rate"]["value"] == ["1"]
    finally:
        grpc.close()


def test_nothing_is_traced_with_tracing_off(tmp_path: Path) -> None:
    quiet = tmp_path / "quiet.jsonl"
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, trace_file=str(quiet))) as s:
        s.bind("plain", plus_one, FP32, FP32_OUT, ModelConfig(max_batch_size=8))
        c = triton_http.InferenceServerClient(f"127.0.0.1:{s.http_port}")
        try:
            assert c.get_trace_settings()["trace_level"] == ["OFF"]
            infer(c, "plain", headers={"traceparent": TRACEPARENT})
        finally:
            c.close()
    assert not quiet.exists()
