"""pyserve.client against a PyTriton server (Triton's own C++ front ends): the clients speak Triton's protocol, not
only pyserve's.

Slow (Triton takes ~10-30 s to start) and optional: it runs with ``-m slow`` where ``benchmarks/.pytriton-venv``
exists (``benchmarks/bench_http.py --pytriton`` makes it) and is skipped otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pyserve.client import AsyncioModelClient, DecoupledModelClient, ModelClient
from pyserve.errors import InvalidInputError, ModelNotFoundError

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PYTRITON_PYTHON = BENCHMARKS / ".pytriton-venv" / "bin" / "python"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not PYTRITON_PYTHON.exists(), reason="no benchmarks/.pytriton-venv"),
]


@pytest.fixture(scope="module")
def pytriton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A PyTriton server of identity_fp32 and stream_fp32 (benchmarks/pytriton_server.py): (HTTP, gRPC) urls."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCHMARKS))
    home = tmp_path_factory.mktemp("pytriton-home")
    spec = _common.pytriton_spec(PYTRITON_PYTHON, home)
    spec = dataclasses.replace(spec, ready_models=("identity_fp32", "stream_fp32"))
    with _common.running_server(spec, home / "server.log") as http:
        yield f"http://{http}", f"grpc://127.0.0.1:{spec.grpc_port}"


@pytest.mark.parametrize("protocol", (0, 1), ids=("http", "grpc"))
def test_infer_against_pytriton(pytriton: tuple[str, str], protocol: int) -> None:
    url = pytriton[protocol]
    x = np.arange(16, dtype=np.float32)
    with ModelClient(url, "identity_fp32", init_timeout_s=30) as client:
        np.testing.assert_array_equal(client.infer_sample(x)["OUTPUT0"], x)
        np.testing.assert_array_equal(client.infer_batch(np.stack([x, x + 1]))["OUTPUT0"][1], x + 1)
        assert client.model_config.max_batch_size == 64
        with pytest.raises(InvalidInputError):
            client.infer_sample(x.astype(np.int64))
    with ModelClient(url, "no_such_model", init_timeout_s=30) as client, pytest.raises(ModelNotFoundError):
        client.infer_sample(x)

    async def run() -> np.ndarray:
        async with AsyncioModelClient(url, "identity_fp32", init_timeout_s=30) as client:
            return (await client.infer_sample(x))["OUTPUT0"]

    np.testing.assert_array_equal(asyncio.run(run()), x)


@pytest.mark.parametrize("protocol", (0, 1), ids=("http", "grpc"))
def test_stream_against_pytriton(pytriton: tuple[str, str], protocol: int) -> None:
    x = np.arange(4, dtype=np.float32)
    with DecoupledModelClient(pytriton[protocol], "stream_fp32", init_timeout_s=30) as client:
        responses = list(client.infer_sample(x))
    assert len(responses) == 32
    np.testing.assert_array_equal(responses[-1]["OUTPUT0"], x)


@pytest.mark.parametrize("protocol", (0, 1), ids=("http", "grpc"))
def test_shared_memory_against_pytriton(pytriton: tuple[str, str], protocol: int) -> None:
    # identity_fp32's dimension is variable: the inputs go through a region, the output comes back in the response.
    batch = np.arange(2 << 16, dtype=np.float32).reshape(2, -1)  # 512 KiB
    with ModelClient(pytriton[protocol], "identity_fp32", shared_memory=True, init_timeout_s=30) as client:
        for _ in range(2):
            np.testing.assert_array_equal(client.infer_batch(batch)["OUTPUT0"], batch)
        assert len(glob.glob(f"/dev/shm/pyserve-client-{os.getpid()}-*")) == 1
    assert glob.glob(f"/dev/shm/pyserve-client-{os.getpid()}-*") == []
