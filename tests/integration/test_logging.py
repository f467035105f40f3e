"""Logging of the core: Triton's log settings over HTTP and gRPC, changed at run time; JSON lines with request ids;
nothing logged per request at the default level. The core writes to the standard error it inherits from this
process, which ``capfd`` reads."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor

pytestmark = pytest.mark.integration

FP32 = [Tensor("INPUT0", np.float32, (-1,))]


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


@contextlib.contextmanager
def json_logging_server() -> Iterator[tuple[Serve, triton_http.InferenceServerClient]]:
    """A server logging JSON lines. Tests start it themselves: only a child process started during the test's call
    phase inherits the standard error that capfd reads."""
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, log_format="json")) as s:
        s.bind("echo", identity, FP32, [Tensor("OUTPUT0", np.float32, (-1,))], ModelConfig(max_batch_size=8))
        client = triton_http.InferenceServerClient(f"127.0.0.1:{s.http_port}", network_timeout=30.0)
        try:
            yield s, client
        finally:
            client.close()


def infer(client: triton_http.InferenceServerClient, request_id: str = "") -> None:
    item = triton_http.InferInput("INPUT0", [1, 2], "FP32")
    item.set_data_from_numpy(np.zeros((1, 2), np.float32))
    client.infer("echo", [item], request_id=request_id)


def logging_settings(client: triton_http.InferenceServerClient, changes: dict[str, Any] | None = None) -> Any:
    if changes is None:
        response = client._get("v2/logging", None, None)
    else:
        response = client._post("v2/logging", orjson.dumps(changes), None, None)
    return response.status_code, orjson.loads(response.read())


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def wait_for_log(capfd: pytest.CaptureFixture[str], predicate: Any, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen += json_lines(capfd.readouterr().err)
        if any(predicate(line) for line in seen):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"no such log line in {seen}")


def test_log_settings_have_tritons_shape() -> None:
    with json_logging_server() as (_, client):
        status, settings = logging_settings(client)
    assert status == 200
    assert settings == {
        "log_file": "",
        "log_info": False,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "json",
    }


def test_nothing_is_logged_per_request_at_the_default_level(capfd: pytest.CaptureFixture[str]) -> None:
    with json_logging_server() as (_, client):
        capfd.readouterr()
        for index in range(20):
            infer(client, f"quiet-{index}")
        time.sleep(0.3)
        assert capfd.readouterr().err == ""


def test_verbose_logging_turned_on_at_run_time_logs_each_request_with_its_id(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with json_logging_server() as (_, client):
        status, settings = logging_settings(client, {"log_verbose_level": 1, "log_info": True})
        assert status == 200 and settings["log_verbose_level"] == 1 and settings["log_info"] is True
        capfd.readouterr()
        infer(client, "req-42")
        lines = wait_for_log(capfd, lambda line: line.get("request_id") == "req-42")
        (line,) = [line for line in lines if line.get("request_id") == "req-42"]
        assert line["level"] == "DEBUG"
        assert line["logger"] == "pyserve.requests"
        assert line["model"] == "echo" and line["version"] == 1
        assert "OK" in line["message"] and line["time"].endswith("Z") and line["pid"] > 0

        status, settings = logging_settings(client, {"log_verbose_level": 0})
        assert settings["log_verbose_level"] == 0
        capfd.readouterr()
        infer(client, "req-43")
        time.sleep(0.3)
        assert not [line for line in json_lines(capfd.readouterr().err) if line.get("request_id") == "req-43"]


def test_bad_log_settings_are_refused_and_change_nothing() -> None:
    with json_logging_server() as (_, client):
        for changes, words in (
            ({"log_info": "yes"}, "log_info must be a boolean"),
            ({"log_verbose_level": -1}, "log_verbose_level must be an integer >= 0"),
            ({"log_format": "xml"}, "log_format must be one of"),
            ({"log_file": "/tmp/elsewhere.log"}, "log_file cannot be changed"),
            ({"log_info": True, "volume": 11}, "unknown log setting"),
        ):
            status, body = logging_settings(client, changes)
            assert status == 400 and words in body["error"], (changes, body)
        assert logging_settings(client)[1]["log_info"] is False


def test_grpc_log_settings() -> None:
    with json_logging_server() as (server, client):
        grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            settings = grpc.get_log_settings(as_json=True)["settings"]
            assert settings["log_warning"] == {"bool_param": True}
            assert settings["log_format"] == {"string_param": "json"}
            updated = grpc.update_log_settings({"log_verbose_level": 2, "log_format": "ISO8601"}, as_json=True)
            assert updated["settings"]["log_verbose_level"] == {"uint32_param": 2}
        finally:
            grpc.close()
        assert logging_settings(client)[1]["log_format"] == "ISO8601"
