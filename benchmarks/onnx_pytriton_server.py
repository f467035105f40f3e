"""Serve ``bench_onnx.py``'s ONNX MLP with PyTriton 0.7 (run with ``benchmarks/.pytriton-venv/bin/python``).

``python benchmarks/onnx_pytriton_server.py --model PATH/model.onnx --intra-op-threads N --http-port ...``

Binds ``mlp``: a ``@batch`` function that runs the batch through one ``onnxruntime.InferenceSession`` opened with
``onnx_model.open_session`` (the direct loop's options), ``INPUT0``/``OUTPUT0`` FP32 ``(512,)``,
``max_batch_size=64``, dynamic batching with no queue delay, one instance. The statistics endpoint is left
unrestricted (PyTriton 0.7 protects it by default) so perf_analyzer can read it. Blocks until SIGINT/SIGTERM.

Start it with the interpreter's ``LIBDIR`` first in ``LD_LIBRARY_PATH`` (``_common.pytriton_spec`` does), as
``pytriton_server.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from _common import interrupt_on_sigterm, server_arguments
from numpy.typing import NDArray
from onnx_model import INPUT_NAME, MAX_BATCH_SIZE, MODEL_NAME, OUTPUT_NAME, WIDTH, open_session
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig


def main() -> None:
    """Parse the options, open the session and serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the model.onnx to serve")
    parser.add_argument("--intra-op-threads", type=int, required=True, help="SessionOptions.intra_op_num_threads")
    args = server_arguments(parser, all_ports=True)
    interrupt_on_sigterm()
    session = open_session(args.model, args.intra_op_threads)

    @batch
    def infer(INPUT0: NDArray[np.float32]) -> dict[str, NDArray[np.float32]]:
        (output,) = session.run([OUTPUT_NAME], {INPUT_NAME: INPUT0})
        return {OUTPUT_NAME: output}

    config = TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=infer,
            inputs=[Tensor(name=INPUT_NAME, dtype=np.float32, shape=(WIDTH,))],
            outputs=[Tensor(name=OUTPUT_NAME, dtype=np.float32, shape=(WIDTH,))],
            config=ModelConfig(max_batch_size=MAX_BATCH_SIZE, batching=True, batcher=DynamicBatcher()),
        )
        triton.serve()


if __name__ == "__main__":
    main()
