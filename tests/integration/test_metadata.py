"""Server and model metadata, model config, health, readiness, repository index and statistics."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http

import pyserve
from pyserve import Serve

pytestmark = pytest.mark.integration


def reference(repo_root: Path, name: str) -> Any:
    """A response captured from Triton 2.51 (copied from shared/reference/triton-2.51/ into tests/data/)."""
    return json.loads((repo_root / "tests" / "data" / "triton-2.51" / name).read_text())


def test_health(client: triton_http.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()


def test_server_metadata(client: triton_http.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "pyserve"
    assert metadata["version"] == pyserve.__version__
    assert {"binary_tensor_data", "parameters", "statistics", "model_configuration"} <= set(metadata["extensions"])


def test_model_metadata(client: triton_http.InferenceServerClient, repo_root: Path) -> None:
    metadata = client.get_model_metadata("add_sub")
    assert metadata == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "python",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [-1, -1]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, -1]},
        ],
    }
    # Same keys and nesting as Triton's own answer.
    triton = reference(repo_root, "v2_models_identity_fp32.json")
    ours = client.get_model_metadata("identity_fp32", model_version="1")
    assert set(ours) == set(triton)
    assert set(ours["inputs"][0]) == set(triton["inputs"][0])
    assert client.get_model_metadata("no_batch")["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [2, 3]}]


def test_model_config_matches_triton_shape(client: triton_http.InferenceServerClient, repo_root: Path) -> None:
    config = client.get_model_config("add_sub")
    triton = reference(repo_root, "v2_models_add_sub_config.json")
    assert set(triton) <= set(config)
    assert config["name"] == "add_sub"
    assert config["platform"] == "" and config["backend"] == "python"
    assert config["max_batch_size"] == 64
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [-1]),
        ("INPUT1", "TYPE_FP32", [-1]),
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [-1]),
        ("OUTPUT1", "TYPE_FP32", [-1]),
    ]
    assert set(config["input"][0]) == set(triton["input"][0])
    assert set(config["output"][0]) == set(triton["output"][0])
    assert config["dynamic_batching"] == triton["dynamic_batching"] | {
        "preferred_batch_size": [64],
        "max_queue_delay_microseconds": 100,
    }
    assert config["instance_group"] == [
        {
            "name": "add_sub_0",
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]
    assert config["model_transaction_policy"] == {"decoupled": False}


def test_model_config_without_batching(client: triton_http.InferenceServerClient) -> None:
    config = client.get_model_config("no_batch")
    assert config["max_batch_size"] == 0
    assert "dynamic_batching" not in config
    assert config["input"][0]["data_type"] == "TYPE_INT32"
    assert config["input"][0]["dims"] == [2, 3]


def test_model_config_datatype_names(client: triton_http.InferenceServerClient) -> None:
    assert client.get_model_config("identity_bytes")["input"][0]["data_type"] == "TYPE_STRING"
    assert client.get_model_config("identity_bf16")["output"][0]["data_type"] == "TYPE_BF16"
    assert client.get_model_config("identity_bool")["input"][0]["data_type"] == "TYPE_BOOL"
    optional = client.get_model_config("optional")["input"]
    assert [(i["name"], i["optional"]) for i in optional] == [("INPUT0", False), ("INPUT1", True)]


def test_model_ready(client: triton_http.InferenceServerClient, raw_http: Any) -> None:
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", model_version="1")
    assert not client.is_model_ready("no_such_model")
    assert raw_http.request("GET", "/v2/models/add_sub/ready").status == 200
    assert raw_http.request("GET", "/v2/models/no_such_model/ready").status == 404
    assert raw_http.request("GET", "/v2/models/add_sub/versions/9/ready").status == 404


def test_repository_index(client: triton_http.InferenceServerClient, server: Serve) -> None:
    index = client.get_model_repository_index()
    by_name = {entry["name"]: entry for entry in index}
    for name in ("add_sub", "no_batch", "identity_bf16", "multi", "echo_parameters"):
        assert by_name[name] == {
            "name": name,
            "version": "1",
            "state": "READY",
            "reason": "",
            "instances": {"configured": 1, "live": 1},
        }
    assert [entry["name"] for entry in index] == sorted(by_name)


def test_statistics_count_requests_and_rows(client: triton_http.InferenceServerClient) -> None:
    def stats() -> dict[str, Any]:
        (entry,) = client.get_inference_statistics("stats_identity")["model_stats"]
        return entry

    before = stats()
    assert before["inference_count"] == 0 and before["execution_count"] == 0
    requests, rows = 5, 3
    for i in range(requests):
        data = np.full((rows, 4), i, np.float32)
        infer_input = triton_http.InferInput("INPUT0", [rows, 4], "FP32")
        infer_input.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("stats_identity", [infer_input]).as_numpy("OUTPUT0"), data)
    deadline = time.monotonic() + 2
    after = stats()
    while after["inference_stats"]["success"]["count"] < requests and time.monotonic() < deadline:
        time.sleep(0.01)
        after = stats()
    assert after["name"] == "stats_identity" and after["version"] == "1"
    inference = after["inference_stats"]
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[key]["count"] == requests, key
        assert inference[key]["ns"] > 0, key
    assert inference["fail"] == {"count": 0, "ns": 0}
    # Sequential requests run one per execution; inference_count counts rows.
    assert after["inference_count"] == requests * rows
    assert after["execution_count"] == requests
    assert after["last_inference"] > 0
    (per_size,) = after["batch_stats"]
    assert per_size["batch_size"] == rows
    assert per_size["compute_infer"]["count"] == requests
    # The whole-server document lists every model.
    names = {entry["name"] for entry in client.get_inference_statistics()["model_stats"]}
    assert {"stats_identity", "add_sub", "identity_bytes"} <= names


def test_statistics_count_failures(client: triton_http.InferenceServerClient) -> None:
    (before,) = client.get_inference_statistics("raises")["model_stats"]
    infer_input = triton_http.InferInput("INPUT0", [1, 2], "FP32")
    infer_input.set_data_from_numpy(np.array([[-1.0, 1.0]], np.float32))
    with pytest.raises(triton_http.InferenceServerException):
        client.infer("raises", [infer_input])
    (after,) = client.get_inference_statistics("raises")["model_stats"]
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["fail"]["count"] == old["fail"]["count"] + 1
    assert after["execution_count"] == before["execution_count"] + 1
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[key]["count"] == old[key]["count"], key
    assert after["inference_count"] == before["inference_count"]
