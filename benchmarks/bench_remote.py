"""What a remote model costs: the same identity model as a thread instance, a process instance, a remote model and a
Ray instance.

Run from the repository root::

    .venv/bin/python benchmarks/bench_remote.py [--requests 1000] [--rounds 3] [--large-mib 16] [--json PATH]

One server opens a remote port; a child process attaches the identity model with ``RemoteServe`` over it (tcp on
loopback, CURVE-encrypted, tensors inline). The server also serves the same function as a thread instance and as
a process instance (ipc, shared memory above 64 KiB). pyserve's ``ModelClient`` calls each in interleaved rounds:
sequential small requests (16 floats; p50 and p99) and large ones (``--large-mib``; MB/s through the round trip),
and the table shows each against the process instance. With Ray installed (``[ray]``), the same function also runs
as a Ray instance (an actor on a local Ray, started by the server; ``--no-ray`` leaves it out).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from _common import bench_main, format_table, write_report

from pyserve import ModelConfig, Serve, ServeConfig, Tensor, batch
from pyserve.client import ModelClient

TOKEN = "bench-remote-token-0123456789abcdef"
INPUTS = [Tensor("INPUT0", np.float32, (-1,))]
OUTPUTS = [Tensor("OUTPUT0", np.float32, (-1,))]

PEER = textwrap.dedent(
    """
    import numpy as np
    import sys
    from pyserve import ModelConfig, RemoteServe, Tensor, batch

    @batch
    def identity(INPUT0):
        return {"OUTPUT0": INPUT0}

    remote = RemoteServe(sys.argv[1], token=sys.argv[2])
    remote.bind("remote", identity, [Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))],
                config=ModelConfig(max_batch_size=64))
    remote.run()
    print("attached", flush=True)
    remote.serve()
    """
)


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


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="small calls per model (default 1000)")
    parser.add_argument("--large", type=int, default=20, help="large calls per model (default 20)")
    parser.add_argument("--large-mib", type=int, default=16, help="MiB per large request (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds the calls are split into (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--no-ray", action="store_true", help="leave the Ray instance out")
    args = parser.parse_args(argv)
    config = ServeConfig(http_port=0, grpc_port=0, metrics_port=0, remote_port=0, remote_token=TOKEN)
    small = np.ones(16, np.float32)
    large = np.ones((1, args.large_mib * (1 << 20) // 4), np.float32)
    models: tuple[str, ...] = ("thread", "process", "remote")
    if not args.no_ray and importlib.util.find_spec("ray") is not None:
        models += ("ray",)
    with Serve(config) as server:
        server.bind("thread", identity, INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=64))
        server.bind("process", identity, INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=64, worker="process"))
        if "ray" in models:
            server.bind("ray", identity, INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=64, worker="ray"))
        peer = subprocess.Popen(
            [sys.executable, "-c", PEER, server.url, TOKEN], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
        )
        try:
            assert peer.stdout is not None and peer.stdout.readline().strip() == "attached"
            clients = {name: ModelClient(server.url, name) for name in models}
            small_times: dict[str, list[float]] = {name: [] for name in models}
            large_times: dict[str, list[float]] = {name: [] for name in models}
            for client in clients.values():
                timed(lambda c=client: c.infer_sample(INPUT0=small), 100)
                timed(lambda c=client: c.infer_batch(INPUT0=large), 2)
            for _ in range(args.rounds):
                for name, client in clients.items():
                    small_times[name] += timed(
                        lambda c=client: c.infer_sample(INPUT0=small), args.requests // args.rounds
                    )
                    large_times[name] += timed(
                        lambda c=client: c.infer_batch(INPUT0=large), max(1, args.large // args.rounds)
                    )
            for client in clients.values():
                client.close()
        finally:
            peer.terminate()
            peer.wait(15)
    reference_p50 = percentile(small_times["process"], 0.5)
    reference_rate = large.nbytes / percentile(large_times["process"], 0.5)
    rows = []
    report = []
    for name in models:
        p50, p99 = percentile(small_times[name], 0.5), percentile(small_times[name], 0.99)
        rate = large.nbytes / percentile(large_times[name], 0.5)
        rows.append(
            [
                name,
                f"{p50 * 1e3:.3f}",
                f"{p99 * 1e3:.3f}",
                f"{p50 / reference_p50:.2f}x",
                f"{rate / 1e6:.0f}",
                f"{rate / reference_rate:.2f}x",
            ]
        )
        report.append({"instance": name, "p50_us": p50 * 1e6, "p99_us": p99 * 1e6, "large_bytes_per_s": rate})
    print(f"small: 16 floats, {args.requests} sequential calls; large: {args.large_mib} MiB, {args.large} calls")
    print(
        format_table(
            ["instance", "p50 ms", "p99 ms", "p50 / process", f"{args.large_mib} MiB MB/s", "MB/s / process"], rows
        )
    )
    if args.json is not None:
        write_report(args.json, {"large_mib": args.large_mib, "rows": report})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
