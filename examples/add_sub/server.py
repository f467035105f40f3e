"""Serve add_sub on http://127.0.0.1:8000: ``python examples/add_sub/server.py`` (Ctrl+C stops it)."""

import numpy as np

from pyserve import ModelConfig, Serve, ServeConfig, Tensor, batch


@batch
def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """Element-wise sum and difference of two FP32 batches."""
    return {"sum": a + b, "diff": a - b}


def main() -> None:
    with Serve(ServeConfig.from_env()) as server:
        server.bind(
            "add_sub",
            infer_func=add_sub,
            inputs=[Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
            outputs=[
                Tensor(name="sum", dtype=np.float32, shape=(-1,)),
                Tensor(name="diff", dtype=np.float32, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=64),
        )
        print(f"serving add_sub on {server.url}", flush=True)
        server.serve()


if __name__ == "__main__":
    main()
