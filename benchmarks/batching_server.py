"""Serve the models of ``bench_batching.py`` with pyserve or PyTriton (the same functions for both).

    python benchmarks/batching_server.py --backend pyserve --http-port PORT [--loop-iterations N]
    benchmarks/.pytriton-venv/bin/python benchmarks/batching_server.py --backend pytriton --http-port PORT \\
        --grpc-port PORT --metrics-port PORT

Models (FP32 ``INPUT0`` of shape ``(-1,)`` returned as ``OUTPUT0`` by all of them):

- ``cost_model``: sleeps ``FIXED_COST_S + PER_ROW_COST_S * rows`` per batch, a cost model of a batched
  accelerator call; ``max_batch_size=32``, dynamic batching with no queue delay. Both backends.
- ``cpu_loop_{process,thread}_{1,2}``: pure-Python loop of ``--loop-iterations`` steps per request (holds the
  GIL), no batching (``max_batch_size=0``), 1 or 2 instances in worker processes or threads. pyserve only.
- ``identity_batcher`` / ``identity_no_batcher``: ``max_batch_size=64`` with the default ``DynamicBatcher()`` /
  with ``batcher=None``. pyserve only.

Blocks until SIGINT/SIGTERM, or until ``--parent-pid`` is gone.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import interrupt_on_sigterm, server_arguments
from numpy.typing import NDArray

COST_MODEL = "cost_model"
COST_MODEL_MAX_BATCH = 32
FIXED_COST_S = 0.020
PER_ROW_COST_S = 0.0005
IDENTITY_MAX_BATCH = 64
DEFAULT_LOOP_ITERATIONS = 100_000
IDENTITY_MODELS = ("identity_batcher", "identity_no_batcher")
PYSERVE_MODELS = (
    COST_MODEL,
    "cpu_loop_process_1",
    "cpu_loop_process_2",
    "cpu_loop_thread_1",
    "cpu_loop_thread_2",
    *IDENTITY_MODELS,
)
PYTRITON_MODELS = (COST_MODEL,)

FloatArray = NDArray[np.float32]


def cost_model(INPUT0: FloatArray) -> dict[str, FloatArray]:
    """Take as long as a batch of ``len(INPUT0)`` rows costs: a fixed part plus a part per row."""
    time.sleep(FIXED_COST_S + PER_ROW_COST_S * len(INPUT0))
    return {"OUTPUT0": INPUT0}


def identity(INPUT0: FloatArray) -> dict[str, FloatArray]:
    """Return the input batch unchanged."""
    return {"OUTPUT0": INPUT0}


def burn(iterations: int) -> int:
    """A pure-Python loop: CPU work that never releases the GIL."""
    total = 0
    for step in range(iterations):
        total += step * step
    return total


def make_cpu_loop(iterations: int) -> Callable[[list[Any]], list[dict[str, FloatArray]]]:
    """An unbatched model that runs ``burn(iterations)`` once per request (a closure, so it pickles by value)."""

    def cpu_loop(requests: list[Any]) -> list[dict[str, FloatArray]]:
        outputs = []
        for request in requests:
            burn(iterations)
            outputs.append({"OUTPUT0": request.data["INPUT0"]})
        return outputs

    return cpu_loop


def serve_pyserve(http_port: int, grpc_port: int, metrics_port: int, loop_iterations: int) -> None:
    """Bind every benchmark model in pyserve and serve until interrupted."""
    from pyserve import DynamicBatcher, ModelConfig, Serve, ServeConfig, Tensor, batch

    inputs = [Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))]
    outputs = [Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))]
    cpu_loop = make_cpu_loop(loop_iterations)
    config = ServeConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    with Serve(config) as server:
        server.bind(
            COST_MODEL,
            batch(cost_model),
            inputs,
            outputs,
            ModelConfig(max_batch_size=COST_MODEL_MAX_BATCH, batcher=DynamicBatcher(max_queue_delay_microseconds=0)),
        )
        for worker in ("process", "thread"):
            for instances in (1, 2):
                unbatched = ModelConfig(max_batch_size=0, instances=instances, worker=worker)
                server.bind(f"cpu_loop_{worker}_{instances}", cpu_loop, inputs, outputs, unbatched)
        server.bind(
            "identity_batcher", batch(identity), inputs, outputs, ModelConfig(max_batch_size=IDENTITY_MAX_BATCH)
        )
        server.bind(
            "identity_no_batcher",
            batch(identity),
            inputs,
            outputs,
            ModelConfig(max_batch_size=IDENTITY_MAX_BATCH, batcher=None),
        )
        server.serve()


def serve_pytriton(http_port: int, grpc_port: int, metrics_port: int) -> None:
    """Bind the cost model in PyTriton (its dynamic batcher, same settings) and serve until interrupted."""
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    interrupt_on_sigterm()
    config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    # The statistics endpoint is restricted by default in 0.7; perf_analyzer and the driver read it.
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        triton.bind(
            model_name=COST_MODEL,
            infer_func=batch(cost_model),
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(
                max_batch_size=COST_MODEL_MAX_BATCH,
                batching=True,
                batcher=DynamicBatcher(max_queue_delay_microseconds=0),
            ),
        )
        triton.serve()


def main() -> None:
    """Parse the options and serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("pyserve", "pytriton"), required=True)
    parser.add_argument("--loop-iterations", type=int, default=DEFAULT_LOOP_ITERATIONS)
    args = server_arguments(parser)
    if args.backend == "pyserve":
        serve_pyserve(args.http_port, args.grpc_port, args.metrics_port, args.loop_iterations)
    else:
        serve_pytriton(args.http_port, args.grpc_port, args.metrics_port)


if __name__ == "__main__":
    main()
