"""Serve the sentiment pipeline of ``examples/pipeline`` for ``bench_ensemble.py``.

    python benchmarks/ensemble_server.py --http-port PORT [--grpc-port PORT] [--parent-pid PID]

Models ``tokenize``, ``score`` and ``label`` (each a ``@batch`` function, ``max_batch_size=64``, the default dynamic
batcher) and the ensemble ``sentiment`` that chains them in the server. Blocks until SIGINT/SIGTERM, or until
``--parent-pid`` is gone.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from _common import server_arguments

from pyserve import Serve, ServeConfig

PIPELINE_DIR = Path(__file__).resolve().parent.parent / "examples" / "pipeline"
MODELS = ("sentiment", "tokenize", "score", "label")


def main() -> None:
    args = server_arguments(argparse.ArgumentParser(description=__doc__))
    sys.path.insert(0, str(PIPELINE_DIR))
    models = importlib.import_module("models")
    config = ServeConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    with Serve(config) as server:
        models.bind_pipeline(server)
        server.serve()


if __name__ == "__main__":
    main()
