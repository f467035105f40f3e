"""The stage-times debug switch (``PYSERVE_STAGE_TIMES``): one JSON line per HTTP infer request, its stamps taken
across the core and the instance (thread or process) in the order the request passed the stages."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.core.stage_times import STAGES

pytestmark = pytest.mark.integration

INPUTS = [Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))]
OUTPUTS = [Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))]
REQUESTS_PER_MODEL = 3


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def infer(client: triton_http.InferenceServerClient, model: str, values: np.ndarray) -> np.ndarray:
    tensor = triton_http.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=True)
    result = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    assert result is not None
    return result


def test_each_http_infer_request_leaves_one_line_of_ordered_stamps(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "stages.jsonl"
    # Set before Serve(): its config, the core process and the instances it starts all read it.
    monkeypatch.setenv("PYSERVE_STAGE_TIMES", str(path))
    config = ServeConfig.from_env(http_port=0, grpc_port=0, metrics_port=0)
    assert config.stage_times == str(path)
    with Serve(config) as serve:
        serve.bind("in_thread", identity, INPUTS, OUTPUTS, ModelConfig(max_batch_size=8))
        serve.bind("in_process", identity, INPUTS, OUTPUTS, ModelConfig(max_batch_size=8, worker="process"))
        with triton_http.InferenceServerClient(f"127.0.0.1:{serve.http_port}", network_timeout=30.0) as client:
            assert client.is_server_ready()  # not an infer request: no line
            for model in ("in_thread", "in_process"):
                for index in range(REQUESTS_PER_MODEL):
                    values = np.full((1, 16), index, dtype=np.float32)
                    np.testing.assert_array_equal(infer(client, model, values), values)
    # Lines are buffered in the core and written when it stops.
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert len(lines) == 2 * REQUESTS_PER_MODEL
    for line in lines:
        assert list(line) == list(STAGES)
        stamps = list(line.values())
        assert stamps == sorted(stamps), line
    # Requests were sent one at a time: each is written before the next is complete.
    for before, after in itertools.pairwise(lines):
        assert before["written"] <= after["complete"]
