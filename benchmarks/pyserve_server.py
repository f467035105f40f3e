"""Serve the benchmark's identity model with pyserve: ``python benchmarks/pyserve_server.py --http-port PORT``.

The model is ``identity_fp32``: input ``INPUT0`` (FP32, shape ``(-1,)``) returned as ``OUTPUT0``, with
``max_batch_size=64`` and the default dynamic batcher (no queue delay). ``stream_fp32`` is its decoupled twin for
the streaming benchmark: it answers each request with ``STREAM_TOKENS`` responses, each its input, as fast as it can.
Blocks until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import numpy as np
from _common import server_arguments
from numpy.typing import NDArray

from pyserve import ModelConfig, Serve, ServeConfig, Tensor, batch

MODEL_NAME = "identity_fp32"
STREAM_MODEL_NAME = "stream_fp32"
STREAM_TOKENS = 32


@batch
def identity(INPUT0: NDArray[np.float32]) -> dict[str, NDArray[np.float32]]:
    """Return the input batch unchanged."""
    return {"OUTPUT0": INPUT0}


@batch
def stream(INPUT0: NDArray[np.float32]) -> Iterator[dict[str, NDArray[np.float32]]]:
    """Answer with STREAM_TOKENS responses, each the input batch."""
    for _ in range(STREAM_TOKENS):
        yield {"OUTPUT0": INPUT0}


def main() -> None:
    """Parse the ports and serve until interrupted."""
    args = server_arguments(argparse.ArgumentParser(description=__doc__))
    # PYSERVE_<FIELD> variables apply (hop_budget.py sets PYSERVE_STAGE_TIMES and PYSERVE_REPLY_SPIN_US).
    config = ServeConfig.from_env(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    with Serve(config) as server:
        server.bind(
            MODEL_NAME,
            infer_func=identity,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=64),
        )
        server.bind(
            STREAM_MODEL_NAME,
            infer_func=stream,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=64, decoupled=True),
        )
        server.serve()


if __name__ == "__main__":
    main()
