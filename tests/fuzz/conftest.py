"""The fuzz suite's server: identity models of every kind of tensor, so a request that is accepted must come back
unchanged, and small limits, so hostile sizes are cheap to send.

``PYSERVE_FUZZ_CASES`` sets how many cases each front end gets (default: a short run that fits the default suite);
the long run is ``PYSERVE_FUZZ_CASES=100000 bash scripts/test.sh -m fuzz tests/fuzz``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor

from .models import DATATYPES, DTYPES, FIXED_MODEL, FIXED_SHAPE, MAX_BATCH, MAX_REQUEST_BYTES, model_of

# How many cases each front end gets; the short default keeps the default suite fast.
FUZZ_CASES = int(os.environ.get("PYSERVE_FUZZ_CASES", "1000"))
# A long run explores new cases each time; the short default run is the same every time.
LONG_RUN = "PYSERVE_FUZZ_CASES" in os.environ
HEADER_TIMEOUT_S = 3.0


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def pair(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"], "OUTPUT1": request["INPUT1"]} for request in requests]


@pytest.fixture(scope="session")
def fuzz_server() -> Iterator[Serve]:
    """A server of identity models: one per datatype (batching), one without batching, one with two inputs."""
    config = ServeConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        max_request_bytes=MAX_REQUEST_BYTES,
        http_header_timeout_s=HEADER_TIMEOUT_S,
    )
    s = Serve(config)
    batching = ModelConfig(max_batch_size=MAX_BATCH)
    for datatype in DATATYPES:
        dtype = DTYPES[datatype]
        s.bind(
            model_of(datatype),
            identity,
            inputs=[Tensor("INPUT0", dtype, (-1,))],
            outputs=[Tensor("OUTPUT0", dtype, (-1,))],
            config=batching,
        )
    s.bind(
        FIXED_MODEL,
        identity,
        inputs=[Tensor("INPUT0", np.int32, FIXED_SHAPE)],
        outputs=[Tensor("OUTPUT0", np.int32, FIXED_SHAPE)],
        config=ModelConfig(max_batch_size=0),
    )
    s.bind(
        "pair",
        pair,
        inputs=[Tensor("INPUT0", np.float32, (-1,)), Tensor("INPUT1", bytes, (1,))],
        outputs=[Tensor("OUTPUT0", np.float32, (-1,)), Tensor("OUTPUT1", bytes, (1,))],
        config=batching,
    )
    try:
        s.run()
        yield s
    finally:
        s.stop()
