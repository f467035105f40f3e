"""ModelConfig.execution_timeout_s: a batch that runs too long fails with the reason; a process instance is killed
and replaced, a thread instance serves again once its function returns; other requests are unaffected."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.client import ModelClient
from pyserve.errors import ConfigError, RequestTimeoutError

pytestmark = pytest.mark.integration

X = [Tensor("x", np.float32, (-1,))]
OUT = [Tensor("pid", np.int64, (1,))]


def sleepy(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    time.sleep(float(requests[0].parameters.get("sleep", 0)))
    return [{"pid": np.array([os.getpid()], np.int64)} for _ in requests]


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_a_batch_past_its_execution_timeout_fails_and_the_model_serves_on(worker: str) -> None:
    config = ModelConfig(max_batch_size=0, worker=worker, execution_timeout_s=0.5)
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as server:
        server.bind("sleepy", sleepy, X, OUT, config=config)
        with ModelClient(server.url, "sleepy", inference_timeout_s=30) as client:
            first_pid = int(client.infer_sample(x=np.ones(1, np.float32))["pid"][0])
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError, match=r"execution timeout \(0.5 s"):
                client.infer_sample(x=np.ones(1, np.float32), parameters={"sleep": "3"})
            assert time.monotonic() - started < 2.5  # answered at the timeout, not when the function returned
            # The model serves again: a process instance was replaced (new pid), a thread one after its function.
            deadline = time.monotonic() + 20
            while True:
                try:
                    pid = int(client.infer_sample(x=np.ones(1, np.float32))["pid"][0])
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            if worker == "process":
                assert pid != first_pid
            else:
                assert pid == first_pid == os.getpid()


def test_execution_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="execution_timeout_s"):
        ModelConfig(execution_timeout_s=0)
