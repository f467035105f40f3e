"""Serve the models of ``bench_sequence.py``: one accumulator, kept four ways.

    python benchmarks/sequence_server.py --http-port PORT [--grpc-port PORT] --state-floats 16,16384

For each state size N (FP32 elements) the accumulator adds ``INPUT`` (FP32, shape [1]) to a state of N floats and
answers ``OUTPUT`` (shape [1]: the state's first element), all with ``max_batch_size=64`` and one thread instance:

- ``seq_direct_N``: implicit state (``SequenceState``) with the ``direct`` strategy (64 slots);
- ``seq_oldest_N``: implicit state with the ``oldest`` strategy (64 candidate sequences, no queue delay);
- ``seq_python_N``: ``@sequence(batched=True)``, the state a numpy array kept per sequence by the decorator;
- ``stateless_N``: a plain function with the dynamic batcher, the state an input (``STATE``) and an output
  (``STATE_OUT``): the client ships it to the server and back at every step.

Blocks until SIGINT/SIGTERM, or until ``--parent-pid`` is gone.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from _common import server_arguments
from numpy.typing import NDArray

MAX_BATCH = 64
KINDS = ("seq_direct", "seq_oldest", "seq_python", "stateless")

FloatArray = NDArray[np.float32]


def model_names(sizes: list[int]) -> list[str]:
    """Every model served for these state sizes."""
    return [f"{kind}_{size}" for size in sizes for kind in KINDS]


def add_to_state(INPUT: FloatArray, STATE: FloatArray) -> dict[str, FloatArray]:
    """The accumulator over a batch: the new states, and each one's first element as the answer."""
    total = STATE + INPUT
    return {"OUTPUT": total[:, :1], "STATE_OUT": total}


def add_to_states(inputs: dict[str, FloatArray], states: list[Any]) -> tuple[dict[str, FloatArray], list[Any]]:
    """The same accumulator under ``@sequence(batched=True)``: one state per sequence of the batch."""
    total = np.stack(states) + inputs["INPUT"]
    return {"OUTPUT": total[:, :1]}, list(total)


def serve(http_port: int, grpc_port: int, metrics_port: int, sizes: list[int]) -> None:
    """Bind the four models per state size and serve until interrupted."""
    from pyserve import (
        DynamicBatcher,
        ModelConfig,
        SequenceBatcher,
        SequenceState,
        Serve,
        ServeConfig,
        Tensor,
        batch,
        sequence,
    )

    config = ServeConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    value = [Tensor("INPUT", np.float32, (1,))]
    answer = [Tensor("OUTPUT", np.float32, (1,))]
    with Serve(config) as server:
        for size in sizes:
            state = (SequenceState("STATE", "STATE_OUT", np.float32, (size,)),)
            strategies: dict[str, dict[str, Any]] = {
                "seq_direct": {},
                "seq_oldest": {"strategy": "oldest", "max_candidate_sequences": MAX_BATCH},
            }
            for kind, options in strategies.items():
                server.bind(
                    f"{kind}_{size}",
                    batch(add_to_state),
                    value,
                    answer,
                    ModelConfig(max_batch_size=MAX_BATCH, sequence_batcher=SequenceBatcher(states=state, **options)),
                )
            server.bind(
                f"seq_python_{size}",
                sequence(add_to_states, batched=True, initial_state=lambda size=size: np.zeros(size, np.float32)),
                value,
                answer,
                ModelConfig(max_batch_size=MAX_BATCH, sequence_batcher=SequenceBatcher()),
            )
            server.bind(
                f"stateless_{size}",
                batch(add_to_state),
                [*value, Tensor("STATE", np.float32, (size,))],
                [*answer, Tensor("STATE_OUT", np.float32, (size,))],
                ModelConfig(max_batch_size=MAX_BATCH, batcher=DynamicBatcher(max_queue_delay_microseconds=0)),
            )
        server.serve()


def main() -> None:
    """Parse the options and serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-floats", default="16,16384", help="state sizes, comma separated")
    args = server_arguments(parser)
    sizes = [int(size) for size in args.state_floats.split(",")]
    serve(args.http_port, args.grpc_port, args.metrics_port, sizes)


if __name__ == "__main__":
    main()
