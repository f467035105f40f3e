"""Small requests from the server's own process: ``Serve.infer`` against pyserve's HTTP client and tritonclient.

Run from the repository root::

    .venv/bin/python benchmarks/bench_inprocess.py [--requests 2000] [--rounds 3] [--shape 16] [--json PATH]

One process starts a ``Serve`` with the identity model (``@batch``, ``max_batch_size=64``) twice over: served by a
thread instance (the function runs in this process) and by a process instance. For each, it times ``--requests``
sequential calls of one sample of ``--shape`` floats through ``Serve.infer`` (no network), pyserve's
``ModelClient`` over HTTP and tritonclient's HTTP client, the calls split into ``--rounds`` rounds that visit the
three in turn, and prints p50/p99 and the ratio in-process / HTTP client (issue #12's target: ≤ 0.5).

It also times the floor of any call that passes through the core: a bare ZeroMQ DEALER/ROUTER round trip between
two processes (a child that echoes), once and twice over. ``Serve.infer`` needs two such round trips (caller → core
→ instance and back), whichever process the instance lives in.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tritonclient.http as triton_http
import zmq
from _common import bench_main, format_table, write_report

from pyserve import ModelConfig, Serve, ServeConfig, Tensor, batch
from pyserve.client import ModelClient

MODEL = "identity_fp32"


@batch
def identity(INPUT0: np.ndarray) -> dict[str, np.ndarray]:
    """Return the input batch unchanged."""
    return {"OUTPUT0": INPUT0}


def timed(call: Callable[[], object], count: int) -> list[float]:
    """Seconds per call, ``count`` calls."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def echo(address: str) -> None:
    """Echo every message on a ROUTER socket until one says ``stop`` (the child of ``zmq_round_trips``)."""
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.bind(address)
    while True:
        message = socket.recv_multipart()
        socket.send_multipart(message)
        if message[-1] == b"stop":
            break
    socket.close(linger=0)


def zmq_round_trips(args: argparse.Namespace, tmp_dir: str) -> dict[str, list[float]]:
    """Per-call times of one and of two bare ZeroMQ round trips to another process (the hops' floor)."""
    address = f"ipc://{tmp_dir}/echo"
    child = multiprocessing.get_context("spawn").Process(target=echo, args=(address,), daemon=True)
    child.start()
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(address)
    payload = np.ones(args.shape, np.float32).tobytes()

    def round_trips(count: int) -> None:
        for _ in range(count):
            socket.send(payload)
            socket.recv()

    try:
        timed(lambda: round_trips(1), args.warmup)
        return {
            "ZeroMQ round trip x1": timed(lambda: round_trips(1), args.requests),
            "ZeroMQ round trip x2": timed(lambda: round_trips(2), args.requests),
        }
    finally:
        socket.send(b"stop")
        socket.recv()
        socket.close(linger=0)
        child.join(timeout=10)


def measure(worker: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Per-call times of each way to call, against a server whose instance is a ``worker``."""
    x = np.ones(args.shape, np.float32)
    batch_x = x[np.newaxis]
    config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0)
    with Serve(config) as server:
        server.bind(
            MODEL,
            identity,
            inputs=[Tensor("INPUT0", np.float32, (-1,))],
            outputs=[Tensor("OUTPUT0", np.float32, (-1,))],
            config=ModelConfig(max_batch_size=64, worker=worker),
        )
        address = server.url.removeprefix("http://")
        triton = triton_http.InferenceServerClient(address)
        with ModelClient(server.url, MODEL) as client:

            def tritonclient_call() -> object:
                tensor = triton_http.InferInput("INPUT0", [1, args.shape], "FP32")
                tensor.set_data_from_numpy(batch_x)
                return triton.infer(MODEL, [tensor]).as_numpy("OUTPUT0")

            calls: dict[str, Callable[[], object]] = {
                "Serve.infer": lambda: server.infer(MODEL, {"INPUT0": batch_x}),
                "ModelClient HTTP": lambda: client.infer_sample(INPUT0=x),
                "tritonclient HTTP": tritonclient_call,
            }
            results: dict[str, list[float]] = {name: [] for name in calls}
            for call in calls.values():
                timed(call, args.warmup)
            per_round = max(1, args.requests // args.rounds)
            for _ in range(args.rounds):
                for name, call in calls.items():
                    results[name] += timed(call, per_round)
        triton.close()
    return results


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="timed calls per way (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls per way first (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds the calls are split into (default 3)")
    parser.add_argument("--shape", type=int, default=16, help="floats per request (default 16)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    rows = []
    report = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        floor = zmq_round_trips(args, tmp_dir)
    for worker in ("thread", "process"):
        results = measure(worker, args)
        http_p50 = percentile(results["ModelClient HTTP"], 0.5)
        for name, times in {**results, **floor}.items():
            p50, p99 = percentile(times, 0.5), percentile(times, 0.99)
            rows.append([worker, name, f"{p50 * 1e3:.3f}", f"{p99 * 1e3:.3f}", f"{p50 / http_p50:.2f}x"])
            report.append({"instance": worker, "way": name, "p50_us": p50 * 1e6, "p99_us": p99 * 1e6})
    print(f"{args.shape} floats, {args.requests} sequential calls per way, {args.rounds} rounds")
    print(format_table(["instance", "way", "p50 ms", "p99 ms", "p50 / ModelClient HTTP"], rows, align_left=2))
    if args.json is not None:
        write_report(args.json, {"shape": args.shape, "requests": args.requests, "rows": report})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
