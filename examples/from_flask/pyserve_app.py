"""The same model bound to pyserve: ``python examples/from_flask/pyserve_app.py [--port 8000]``.

The Flask route's body becomes ``classify``, a ``@batch`` function: pyserve turns each request's JSON into a
``features`` tensor, merges concurrent requests into one batch of rows, calls ``classify`` once for the batch and
splits its outputs back per request. Call it over KServe v2::

    curl -s -X POST http://127.0.0.1:8000/v2/models/classifier/infer -H 'Content-Type: application/json' \\
      -d '{"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 256], "data": [0.1, ...]}]}'
"""

from __future__ import annotations

import argparse

import numpy as np
from model import FEATURES, predict

from pyserve import DynamicBatcher, ModelConfig, Serve, ServeConfig, Tensor, batch

MODEL_NAME = "classifier"
MAX_BATCH_SIZE = 64


@batch
def classify(features: np.ndarray) -> dict[str, np.ndarray]:
    """The route body for a whole batch: ``features`` ``(rows, 256)`` -> ``label`` and ``score``, ``(rows, 1)`` each.

    JSON parsing and validation moved into the server (the declared input below); pre-processing, the model and
    post-processing are the very functions the Flask route calls.
    """
    labels, scores = predict(features)
    return {
        "label": np.array([[label.encode()] for label in labels], dtype=object),
        "score": scores.reshape(-1, 1),
    }


def bind(server: Serve) -> None:
    """Bind ``classify`` as the ``classifier`` model, with dynamic batching of up to 64 rows."""
    server.bind(
        MODEL_NAME,
        infer_func=classify,
        inputs=[Tensor(name="features", dtype=np.float32, shape=(FEATURES,))],
        outputs=[Tensor(name="label", dtype=bytes, shape=(1,)), Tensor(name="score", dtype=np.float32, shape=(1,))],
        # No queue delay: a batch is whatever queued while the previous one ran, so a lone request waits for nothing.
        config=ModelConfig(max_batch_size=MAX_BATCH_SIZE, batcher=DynamicBatcher(max_queue_delay_microseconds=0)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    # Only HTTP is used here; the other front ends take any free port.
    config = ServeConfig.from_env(host=args.host, http_port=args.port, grpc_port=0, metrics_port=0)
    with Serve(config) as server:
        bind(server)
        print(f"serving {MODEL_NAME} on {server.url}", flush=True)
        server.serve()


if __name__ == "__main__":
    main()
