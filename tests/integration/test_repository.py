"""A Triton-layout model repository served for real: load at start, explicit load/unload/reload, poll, failures.

Models are built at test time (ONNX graphs with onnx.helper, pyserve-form model.py files) and called with
tritonclient over HTTP and gRPC; results are compared with the same computation done directly.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import ModelConfig, Serve, ServeConfig
from pyserve.errors import ServerError

from .repository_models import (
    FREE_PORTS,
    MLP_CONFIG,
    add_onnx_model,
    add_python_model,
    mlp_reference,
    write_onnx_mlp,
)

pytest.importorskip("onnx", reason="the [onnx] extra (onnx, onnxruntime) is not installed")
pytest.importorskip("onnxruntime", reason="the [onnx] extra (onnx, onnxruntime) is not installed")

PIPE_CONFIG = """
name: "pipe"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling {
  step [
    { model_name: "mlp" model_version: -1
      input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "h" } },
    { model_name: "plus" model_version: -1
      input_map { key: "INPUT0" value: "h" } output_map { key: "OUTPUT0" value: "Y" } }
  ]
}
"""


def http_infer(
    client: triton_http.InferenceServerClient, model: str, x: np.ndarray, name: str = "INPUT0", out: str = "OUTPUT0"
) -> np.ndarray:
    tensor = triton_http.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model, [tensor])
    return np.asarray(result.as_numpy(out))


def grpc_infer(client: triton_grpc.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    tensor = triton_grpc.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return np.asarray(client.infer(model, [tensor]).as_numpy("OUTPUT0"))


def index_by_name(client: triton_http.InferenceServerClient) -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = {}
    for row in client.get_model_repository_index():
        rows.setdefault(row["name"], []).append(row)
    return rows


# a repository loaded at start ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("repository")
    add_onnx_model(repository, "mlp", seed=1)
    add_onnx_model(repository, "mlp_auto", seed=2, config=False)  # completed from the file
    add_python_model(repository, "plus", offset=1.0)
    (repository / "pipe").mkdir()
    (repository / "pipe" / "config.pbtxt").write_text(PIPE_CONFIG)
    (repository / "pipe" / "1").mkdir()
    # Broken models beside the good ones.
    broken = repository / "broken_config"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken_config"\nmax_batch_size: eight\n')
    corrupt = add_onnx_model(repository, "corrupt", seed=3)
    (corrupt / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    mismatch = add_onnx_model(repository, "mismatch", seed=4)
    (mismatch / "config.pbtxt").write_text(
        MLP_CONFIG.format(name="mismatch").replace("TYPE_FP32 dims: [ 4 ]", "TYPE_INT32 dims: [ 4 ]")
    )
    checksum = add_onnx_model(repository, "bad_checksum", seed=5)
    with (checksum / "config.pbtxt").open("a") as handle:
        handle.write(
            'model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx" '
            'value: "0123456789abcdef0123456789abcdef" } } ] }\n'
        )
    good_checksum = add_onnx_model(repository, "good_checksum", seed=6)
    digest = hashlib.md5((good_checksum / "1" / "model.onnx").read_bytes()).hexdigest()
    with (good_checksum / "config.pbtxt").open("a") as handle:
        handle.write(
            'model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx" '
            f'value: "{digest}" }} }} ] }}\n'
        )
    return repository


@pytest.fixture(scope="module")
def repository_server(mixed_repository: Path) -> Iterator[Serve]:
    # exit_on_error off: the broken models are UNAVAILABLE and the others serve.
    with Serve(ServeConfig(**FREE_PORTS, exit_on_error=False), model_repository=mixed_repository) as server:
        yield server


def test_repository_models_answer_as_the_model_run_directly(repository_server: Serve) -> None:
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    http = triton_http.InferenceServerClient(repository_server.url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(repository_server.grpc_address)
    try:
        np.testing.assert_allclose(http_infer(http, "mlp", x), mlp_reference(x, 1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grpc_infer(grpc, "mlp", x), mlp_reference(x, 1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(http_infer(http, "mlp_auto", x), mlp_reference(x, 2), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(http_infer(http, "good_checksum", x), mlp_reference(x, 6), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grpc_infer(grpc, "plus", x[:, :3]), x[:, :3] + 1.0)
        # The ensemble declared in config.pbtxt: mlp, then plus.
        y = http_infer(http, "pipe", x, name="X", out="Y")
        np.testing.assert_allclose(y, mlp_reference(x, 1) + 1.0, rtol=1e-5, atol=1e-6)
        # Batching on: concurrent requests of one row each are answered row by row.
        batched = triton_http.InferenceServerClient(repository_server.url.removeprefix("http://"), concurrency=8)
        try:
            pending = []
            for i in range(8):
                tensor = triton_http.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(x[i % 2 : i % 2 + 1])
                pending.append((i % 2, batched.async_infer("mlp", [tensor])))
            for row, call in pending:
                got = call.get_result(timeout=30).as_numpy("OUTPUT0")
                np.testing.assert_allclose(got, mlp_reference(x[row : row + 1], 1), rtol=1e-5, atol=1e-6)
        finally:
            batched.close()
    finally:
        http.close()
        grpc.close()


def test_auto_complete_fills_the_config_from_the_model_file(repository_server: Serve) -> None:
    http = triton_http.InferenceServerClient(repository_server.url.removeprefix("http://"))
    try:
        config = http.get_model_config("mlp_auto")
        assert config["max_batch_size"] == 4  # Triton's default-max-batch-size
        assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] == [
            ("INPUT0", "TYPE_FP32", [4])
        ]
        assert [t["name"] for t in config["output"]] == ["OUTPUT0"]
        assert http.get_model_config("mlp")["platform"] == "onnxruntime_onnx"
    finally:
        http.close()


def test_models_that_cannot_load_are_unavailable_with_the_reason(repository_server: Serve) -> None:
    http = triton_http.InferenceServerClient(repository_server.url.removeprefix("http://"))
    try:
        rows = index_by_name(http)
        for name in ("mlp", "mlp_auto", "plus", "pipe", "good_checksum"):
            assert [row["state"] for row in rows[name]] == ["READY"], rows[name]
        reasons = {name: rows[name][0] for name in ("broken_config", "corrupt", "mismatch", "bad_checksum")}
        for name, row in reasons.items():
            assert row["state"] == "UNAVAILABLE" and row["reason"], (name, row)
        assert "max_batch_size" in reasons["broken_config"]["reason"]
        assert "INT32" in reasons["mismatch"]["reason"] or "int32" in reasons["mismatch"]["reason"].lower()
        assert "model.onnx" in reasons["bad_checksum"]["reason"]
        assert not http.is_model_ready("corrupt")
        with pytest.raises(InferenceServerException):
            http_infer(http, "corrupt", np.zeros((1, 4), np.float32))
        assert http.is_server_live()
        assert not http.is_server_ready()  # strict readiness: some of the repository's models are unavailable
        request = urllib.request.Request(
            f"{repository_server.url}/v2/repository/index", data=b'{"ready": true}', method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            ready = {row["name"] for row in json.loads(response.read())}
        assert ready == {"mlp", "mlp_auto", "plus", "pipe", "good_checksum"}
    finally:
        http.close()


# explicit model control ---------------------------------------------------------------------------------------


def test_explicit_mode_loads_unloads_and_reloads_on_request(tmp_path: Path) -> None:
    add_onnx_model(tmp_path, "mlp", seed=1)
    add_python_model(tmp_path, "plus", offset=1.0)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text(
        'backend: "python"\nsequence_batching { iterative_sequence: true }\n'
    )
    config = ServeConfig(**FREE_PORTS, model_control_mode="explicit", load_model=("mlp",))
    x = np.ones((1, 4), np.float32)
    with Serve(config, model_repository=tmp_path) as server:
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        grpc = triton_grpc.InferenceServerClient(server.grpc_address)
        try:
            assert http.is_model_ready("mlp") and not http.is_model_ready("plus")
            assert index_by_name(http)["plus"] == [{"name": "plus"}]  # in the repository, never loaded
            http.load_model("plus")
            np.testing.assert_allclose(http_infer(http, "plus", x), x + 1.0)
            grpc.unload_model("plus")
            assert not http.is_model_ready("plus")
            assert http.is_server_ready()  # unloaded on request: strict readiness does not count it
            assert index_by_name(http)["plus"][0]["state"] == "UNAVAILABLE"
            assert index_by_name(http)["plus"][0]["reason"] == "unloaded"
            # A reload picks up the new file; the old copy served until the new one was ready.
            write_onnx_mlp(tmp_path / "mlp" / "1" / "model.onnx", seed=7)
            grpc.load_model("mlp")
            np.testing.assert_allclose(http_infer(http, "mlp", x), mlp_reference(x, 7), rtol=1e-5, atol=1e-6)
            # A model sent in the load request: its config as JSON and its file.
            model_file = tmp_path / "sent.onnx"
            write_onnx_mlp(model_file, seed=8)
            sent_config = {
                "name": "sent",
                "backend": "onnxruntime",
                "max_batch_size": 8,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
            }
            http.load_model(
                "sent", config=json.dumps(sent_config), files={"file:1/model.onnx": model_file.read_bytes()}
            )
            np.testing.assert_allclose(http_infer(http, "sent", x), mlp_reference(x, 8), rtol=1e-5, atol=1e-6)
            with pytest.raises(InferenceServerException) as info:
                http.load_model("broken")
            assert "iterative_sequence" in str(info.value)
            assert not http.is_server_ready()  # 'broken' is UNAVAILABLE: strict readiness
            with pytest.raises(InferenceServerException) as info:
                grpc.load_model("not_there")
            assert "not_there" in str(info.value)
            assert "not_there" not in index_by_name(http)  # not in the repository: no state kept
            assert http.is_model_ready("mlp")  # the failures left the others alone
            http.unload_model("broken")
            assert http.is_server_ready()
        finally:
            http.close()
            grpc.close()


def test_a_model_that_fails_at_start_fails_the_start(tmp_path: Path) -> None:
    """exit_on_error (tritonserver's default): the start fails naming the model and why; nothing is left running."""
    add_python_model(tmp_path, "plus", offset=1.0)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: -3\n')
    server = Serve(ServeConfig(**FREE_PORTS), model_repository=tmp_path)
    with pytest.raises(ServerError, match=r"exit_on_error.*failed to load 'broken'.*no version directory") as info:
        server.run()
    assert "plus" not in str(info.value)
    assert not server.is_running


def test_without_strict_readiness_a_failed_model_leaves_the_server_ready(tmp_path: Path) -> None:
    add_python_model(tmp_path, "plus", offset=1.0)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: -3\n')
    config = ServeConfig(**FREE_PORTS, exit_on_error=False, strict_readiness=False)
    with Serve(config, model_repository=tmp_path) as server:
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            assert http.is_server_ready() and http.is_model_ready("plus") and not http.is_model_ready("broken")
        finally:
            http.close()


def test_load_requests_are_refused_outside_explicit_mode(tmp_path: Path) -> None:
    add_python_model(tmp_path, "plus", offset=1.0)
    with Serve(ServeConfig(**FREE_PORTS), model_repository=tmp_path) as server:
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            with pytest.raises(InferenceServerException) as info:
                http.unload_model("plus")
            assert "explicit" in str(info.value)
            assert http.is_model_ready("plus")
        finally:
            http.close()


# poll -------------------------------------------------------------------------------------------------------------


def test_poll_mode_swaps_in_new_versions_under_load_without_failing_a_request(tmp_path: Path) -> None:
    latest_one = "version_policy { latest { num_versions: 1 } }\n"
    add_python_model(tmp_path, "plus", offset=1.0, version=1, policy=latest_one)
    config = ServeConfig(**FREE_PORTS, model_control_mode="poll", repository_poll_secs=0.3)
    with Serve(config, model_repository=tmp_path) as server:
        failures: list[str] = []
        seen: set[float] = set()
        stop = threading.Event()

        def hammer() -> None:
            client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
            x = np.zeros((1, 2), np.float32)
            deadline = time.monotonic() + 60
            try:
                while not stop.is_set() and time.monotonic() < deadline:
                    try:
                        seen.add(float(http_infer(client, "plus", x)[0, 0]))
                    except InferenceServerException as exc:
                        failures.append(str(exc))
            finally:
                client.close()

        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            _wait_for(lambda: 1.0 in seen, "version 1 answers")
            add_python_model(tmp_path, "plus", offset=2.0, version=2, policy=latest_one)  # a new version
            _wait_for(lambda: 2.0 in seen, "version 2 answers")
            time.sleep(0.2)
            seen.clear()
            # The same version changed in place: reloaded beside the old copy, then swapped.
            (tmp_path / "plus" / "2" / "model.py").write_text(
                (tmp_path / "plus" / "2" / "model.py").read_text().replace("2.0", "3.0")
            )
            _wait_for(lambda: 3.0 in seen, "the changed version 2 answers")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert not failures, failures[:3]
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            versions = [row.get("version") for row in index_by_name(http)["plus"] if row.get("state") == "READY"]
            assert versions == ["2"]
        finally:
            http.close()


def _wait_for(condition: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting until {what}")


# a model file bound from Python ----------------------------------------------------------------------------------


def test_bind_model_serves_an_onnx_file_beside_functions(tmp_path: Path) -> None:
    model_file = tmp_path / "mlp.onnx"
    write_onnx_mlp(model_file, seed=9)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    with Serve(ServeConfig(**FREE_PORTS)) as server:
        server.bind_model("mlp", model_file)
        server.bind_model("mlp_one", model_file, config=ModelConfig(max_batch_size=0, batcher=None))
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            np.testing.assert_allclose(http_infer(http, "mlp", x), mlp_reference(x, 9), rtol=1e-5, atol=1e-6)
            assert http.get_model_config("mlp")["max_batch_size"] == 4
            np.testing.assert_allclose(http_infer(http, "mlp_one", x), mlp_reference(x, 9), rtol=1e-5, atol=1e-6)
        finally:
            http.close()
