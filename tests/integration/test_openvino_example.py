"""``examples/openvino``: its server started for real on free ports answers what numpy computes, batched or not."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import tritonclient.http as triton_http

from .cli_process import SERVING_LINE, RunningCommand, clean_environment

pytestmark = pytest.mark.integration

OPENVINO = Path(__file__).resolve().parents[2] / "examples" / "openvino"


@pytest.fixture(scope="module")
def model() -> Iterator[ModuleType]:
    """``examples/openvino/model.py``, imported the way the example runs (its folder first on sys.path)."""
    pytest.importorskip("openvino", reason="examples/openvino needs OpenVINO: pip install -e '.[openvino]'")
    sys.path.insert(0, str(OPENVINO))
    sys.modules.pop("model", None)
    try:
        yield importlib.import_module("model")
    finally:
        sys.path.remove(str(OPENVINO))
        sys.modules.pop("model", None)


@pytest.fixture(scope="module")
def http_url(model: ModuleType) -> Iterator[str]:
    """``python server.py`` with every listener on a free port; its HTTP address once it serves."""
    env = clean_environment(PYSERVE_HTTP_PORT="0", PYSERVE_GRPC_PORT="0", PYSERVE_METRICS_PORT="0")
    with RunningCommand([sys.executable, "server.py"], OPENVINO, env) as server:
        http_port = server.wait_for(SERVING_LINE, timeout=60).group(1)
        yield f"127.0.0.1:{http_port}"
        server.terminate()
        assert server.finish() == 0, server.output


def infer(url: str, features: np.ndarray) -> dict[str, np.ndarray]:
    tensor = triton_http.InferInput("features", list(features.shape), "FP32")
    tensor.set_data_from_numpy(features)
    with triton_http.InferenceServerClient(url) as client:
        result = client.infer("classifier", [tensor])
    return {name: result.as_numpy(name) for name in ("logits", "probabilities")}


@pytest.mark.timeout(60)
def test_the_client_prints_a_class_per_row_and_matches_numpy(http_url: str) -> None:
    run = subprocess.run(
        [sys.executable, "client.py", "--url", http_url, "--rows", "3"],
        cwd=OPENVINO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert [line.split(":")[0] for line in run.stdout.splitlines()[:3]] == ["row 0", "row 1", "row 2"], run.stdout


@pytest.mark.timeout(60)
def test_concurrent_requests_batched_together_answer_as_numpy(model: ModuleType, http_url: str) -> None:
    rng = np.random.default_rng(7)
    requests = [rng.standard_normal((rows, model.FEATURES)).astype(np.float32) for rows in (1, 5, 1, 16, 2) * 4]
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda features: infer(http_url, features), requests))
    for features, answer in zip(requests, answers, strict=True):
        expected = model.reference(features)
        for name in ("logits", "probabilities"):
            assert answer[name].shape == (len(features), model.CLASSES), name
            np.testing.assert_allclose(answer[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)
