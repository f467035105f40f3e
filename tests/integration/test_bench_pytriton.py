"""``pyserve bench`` against PyTriton (Triton's own C++ front ends and statistics): it measures any KServe v2 server.

Slow (Triton takes ~10-30 s to start) and optional: it runs with ``-m slow`` where ``benchmarks/.pytriton-venv``
exists (``benchmarks/bench_http.py --pytriton`` makes it) and is skipped otherwise.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyserve.bench.progress import Progress
from pyserve.bench.runner import run_bench
from pyserve.bench.settings import BenchSettings, levels_of

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PYTRITON_PYTHON = BENCHMARKS / ".pytriton-venv" / "bin" / "python"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not PYTRITON_PYTHON.exists(), reason="no benchmarks/.pytriton-venv"),
]


@pytest.fixture(scope="module")
def pytriton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A PyTriton server of identity_fp32 (benchmarks/pytriton_server.py): (HTTP, gRPC) urls."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCHMARKS))
    home = tmp_path_factory.mktemp("pytriton-home")
    spec = dataclasses.replace(_common.pytriton_spec(PYTRITON_PYTHON, home), ready_models=("identity_fp32",))
    with _common.running_server(spec, home / "server.log") as http:
        yield f"http://{http}", f"grpc://127.0.0.1:{spec.grpc_port}"


@pytest.mark.parametrize("protocol", (0, 1), ids=("http", "grpc"))
def test_bench_measures_pytriton(pytriton: tuple[str, str], protocol: int) -> None:
    settings = BenchSettings(
        model="identity_fp32", url=pytriton[protocol], levels=levels_of([1, 4]), shapes={"INPUT0": (16,)},
        warmup_s=0.5, window_s=0.5, duration_s=3.0,
    )  # fmt: skip
    report = run_bench(settings, Progress(None))
    assert report.model.max_batch_size == 64
    for step in report.steps:
        assert step.failures == 0 and step.throughput > 50
        # Triton's statistics extension gives the same server-side split as pyserve's.
        server = step.measured.server
        assert server is not None and server.requests > 0 and server.compute_infer_us > 0
