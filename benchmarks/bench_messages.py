"""Micro-benchmark of the per-batch messages: an infer batch and its result, built and packed, unpacked and read.

The batch has one request with one FP32 [1, 16] input, sent inline; its result one output. Each step does what its
sender or receiver does in ``pyserve/core/batches.py`` and ``pyserve/worker/instance.py``, without the sockets.

    .venv/bin/python benchmarks/bench_messages.py [--number 200000] [--repeat 9]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

from pyserve.transport.messages import pack_header, unpack_header
from pyserve.transport.protocol import BatchResult, InferBatch, kind_of


class _Request:
    """The fields of a core request that an infer batch carries."""

    id = "1"
    parameters: dict[str, Any] = {}
    requested_outputs: list[str] = []
    rows = 1


BATCH = [_Request()]
BLOCKS: list[Any] = [["INPUT0", "FP32", [1, 16], 0, 0]]
OUTPUTS: list[Any] = [[["OUTPUT0", "FP32", [1, 16], 0]]]


def infer_build() -> bytes:
    """The core dispatches a batch."""
    requests = [[r.id, r.parameters, r.requested_outputs, r.rows] for r in BATCH]
    return pack_header(InferBatch.build(7, requests, BLOCKS, None))


INFER_FRAME = infer_build()


def infer_read() -> tuple[Any, ...]:
    """The instance reads it."""
    header = unpack_header(INFER_FRAME)
    kind = kind_of(header)
    batch = InferBatch(header)
    return kind, batch.batch_id, batch.requests, batch.blocks, batch.trace


def result_build() -> bytes:
    """The instance answers."""
    return pack_header(BatchResult.build_final(7, OUTPUTS, [], [1000, 2000, 3000]))


RESULT_FRAME = result_build()


def result_read() -> tuple[Any, ...]:
    """The core reads the answer."""
    header = unpack_header(RESULT_FRAME)
    kind = kind_of(header)
    result = BatchResult(header)
    return kind, result.batch_id, result.final, result.error, result.outputs, result.slots, result.timings


STEPS: dict[str, Callable[[], object]] = {
    "infer build+pack": infer_build,
    "infer unpack+read": infer_read,
    "result build+pack": result_build,
    "result unpack+read": result_read,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=9, help="timings per step (the best is shown)")
    args = parser.parse_args()
    total = 0.0
    for name, step in STEPS.items():
        best = min(timeit.repeat(step, number=args.number, repeat=args.repeat)) / args.number * 1e9
        total += best
        print(f"{name:20s} {best:6.0f} ns")
    print(f"{'round trip':20s} {total:6.0f} ns")


if __name__ == "__main__":
    main()
