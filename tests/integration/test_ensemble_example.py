"""``examples/pipeline``: its models bound on a server answer its client, through the ensemble and step by step."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http

from pyserve import Serve, ServeConfig

pytestmark = pytest.mark.integration

PIPELINE = Path(__file__).resolve().parents[2] / "examples" / "pipeline"


@pytest.fixture(scope="module")
def models() -> Iterator[ModuleType]:
    sys.path.insert(0, str(PIPELINE))
    sys.modules.pop("models", None)
    try:
        yield importlib.import_module("models")
    finally:
        sys.path.remove(str(PIPELINE))
        sys.modules.pop("models", None)


@pytest.fixture(scope="module")
def server(models: ModuleType) -> Iterator[Serve]:
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as s:
        models.bind_pipeline(s)
        yield s


@pytest.mark.timeout(60)
def test_the_client_prints_a_label_per_text(server: Serve) -> None:
    run = subprocess.run(
        [sys.executable, str(PIPELINE / "client.py"), "--url", f"127.0.0.1:{server.http_port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["positive", "negative", "neutral"], run.stdout


def test_the_ensemble_answers_as_its_steps_called_one_by_one(server: Serve) -> None:
    def call(client: triton_http.InferenceServerClient, model: str, name: str, value: np.ndarray) -> dict[str, Any]:
        tensor = triton_http.InferInput(name, list(value.shape), "BYTES" if value.dtype == object else "FP32")
        tensor.set_data_from_numpy(value)
        result = client.infer(model, [tensor])
        return {output["name"]: result.as_numpy(output["name"]) for output in result.get_response()["outputs"]}

    text = np.array([[b"what a great and wonderful film"], [b"dull"]], dtype=object)
    with triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}") as client:
        ensemble = call(client, "sentiment", "TEXT", text)
        counts = call(client, "tokenize", "text", text)["counts"]
        logits = call(client, "score", "counts", counts)["logits"]
        chained = call(client, "label", "logits", logits)
    assert ensemble["LABEL"].tolist() == chained["label"].tolist() == [[b"positive"], [b"negative"]]
    np.testing.assert_allclose(ensemble["CONFIDENCE"], chained["confidence"])
