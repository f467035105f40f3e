"""Serve the benchmark's identity model with PyTriton 0.7 (run with ``benchmarks/.pytriton-venv/bin/python``).

Same models as ``pyserve_server.py``: ``identity_fp32``, ``INPUT0`` FP32 ``(-1,)`` returned as ``OUTPUT0``,
``max_batch_size=64``, dynamic batching with no queue delay, ``@batch``; and its decoupled twin ``stream_fp32``.
The statistics endpoint is left unrestricted (PyTriton 0.7 protects it by default) so perf_analyzer can read it.
Blocks until SIGINT/SIGTERM.

Under a pyenv Python, start this with the interpreter's ``LIBDIR`` first in ``LD_LIBRARY_PATH`` (bench_http.py
does): Triton's Python stub otherwise loads another libpython and model loading fails.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import numpy as np
from _common import interrupt_on_sigterm, server_arguments
from numpy.typing import NDArray
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

MODEL_NAME = "identity_fp32"
STREAM_MODEL_NAME = "stream_fp32"
STREAM_TOKENS = 32


@batch
def identity(INPUT0: NDArray[np.float32]) -> dict[str, NDArray[np.float32]]:
    """Return the input batch unchanged."""
    return {"OUTPUT0": INPUT0}


@batch
def stream(INPUT0: NDArray[np.float32]) -> Iterator[dict[str, NDArray[np.float32]]]:
    """Answer with STREAM_TOKENS responses, each the input batch (a decoupled model)."""
    for _ in range(STREAM_TOKENS):
        yield {"OUTPUT0": INPUT0}


def main() -> None:
    """Parse the ports and serve until interrupted."""
    args = server_arguments(argparse.ArgumentParser(description=__doc__), all_ports=True)
    interrupt_on_sigterm()
    config = TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=identity,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=64, batching=True, batcher=DynamicBatcher()),
        )
        triton.bind(
            model_name=STREAM_MODEL_NAME,
            infer_func=stream,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=64, batching=True, batcher=DynamicBatcher(), decoupled=True),
        )
        triton.serve()


if __name__ == "__main__":
    main()
