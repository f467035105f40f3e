"""Serve add_sub on http://127.0.0.1:8000: ``python examples/add_sub/server.py`` (Ctrl+C stops it).

The README's Quickstart as a script. ``serve()`` prints where it serves (HTTP, gRPC and metrics addresses); the
``PYSERVE_*`` environment variables (``PYSERVE_HTTP_PORT=9000``) change the ports.
"""

import numpy as np

from pyserve import ModelConfig, Serve, Tensor, batch


@batch
def add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> dict[str, np.ndarray]:
    """Element-wise sum and difference of two FP32 batches."""
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def main() -> None:
    with Serve() as server:
        server.bind(
            "add_sub",
            infer_func=add_sub,
            inputs=[Tensor("INPUT0", np.float32, shape=(-1,)), Tensor("INPUT1", np.float32, shape=(-1,))],
            outputs=[Tensor("OUTPUT0", np.float32, shape=(-1,)), Tensor("OUTPUT1", np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=64),
        )
        server.serve()


if __name__ == "__main__":
    main()
