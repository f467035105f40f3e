"""Shared memory (Triton's extension): what its copies cost, and a round trip with and without it.

Run from the repository root::

    .venv/bin/python benchmarks/bench_shared_memory.py [--sizes-mib 1,16,64] [--repeat 15]

1. **Mappings** (no server): per size, the median time to copy between two mappings already faulted in (what the core
   does through a region it mapped at registration), to read through a fresh mapping of the object (what an instance
   does with a client's object, or with a pool slot of 16 MiB and more), and to write through a fresh shared mapping
   (what an instance writing outputs into a client's object would do). docs/shared-memory.md ("Copies") rests on these.
2. **Round trips**: an identity model served by pyserve, one request at a time from tritonclient over HTTP and gRPC,
   the tensor sent as binary data / raw contents, or left in system shared-memory regions (input and output). Median
   milliseconds per request.
"""

from __future__ import annotations

import argparse
import importlib
import mmap
import os
import statistics
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor

SHM_DIR = "/dev/shm"


def median_ms(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def mappings(sizes: list[int], repeat: int) -> None:
    print(f"{'size':>8} {'warm copy':>10} {'fresh read':>11} {'fresh write':>12}   (ms, median)")
    for size in sizes:
        path = os.path.join(SHM_DIR, f"bench-shm-{uuid.uuid4().hex[:8]}")
        with open(path, "wb") as handle:
            handle.truncate(size)
        try:
            warm, fresh_read, fresh_write = mapping_costs(path, size, repeat)
        finally:
            os.unlink(path)
        print(f"{size >> 20:>5} MiB {warm:>10.2f} {fresh_read:>11.2f} {fresh_write:>12.2f}")


def mapping_costs(path: str, size: int, repeat: int) -> tuple[float, float, float]:
    """Median ms: a copy between warm mappings, a read and a write through a mapping made for the one use."""
    fd = os.open(path, os.O_RDWR)
    try:
        base = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    region = np.frombuffer(base, np.uint8)
    region[:] = 1
    warm = np.ones(size, np.uint8)

    def fresh(write: bool) -> None:
        fd = os.open(path, os.O_RDWR if write else os.O_RDONLY)
        try:
            mapping = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        view = np.frombuffer(mapping, np.uint8)
        if write:
            np.copyto(view, warm)
        else:
            np.copyto(warm, view)
        del view
        mapping.close()

    try:
        return (
            median_ms(lambda: np.copyto(warm, region), repeat),
            median_ms(lambda: fresh(False), repeat),
            median_ms(lambda: fresh(True), repeat),
        )
    finally:
        region = np.empty(0, np.uint8)  # drop the view so the mapping can close
        base.close()


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


def round_trips(sizes: list[int], repeat: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tritonclient's shared_memory imports the deprecated pkg_resources
        shm = importlib.import_module("tritonclient.utils.shared_memory")
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    server.bind(
        "identity",
        identity,
        inputs=[Tensor("INPUT0", np.float32, (-1,))],
        outputs=[Tensor("OUTPUT0", np.float32, (-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    print(
        f"\n{'size':>8} {'HTTP binary':>12} {'HTTP shm':>9} {'gRPC raw':>9} {'gRPC shm':>9}   (ms per request, median)"
    )
    with server:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=120)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        for size in sizes:
            data = np.ones((1, size // 4), np.float32)
            token = uuid.uuid4().hex[:8]
            regions = [
                shm.create_shared_memory_region(f"{kind}-{token}", f"/bench-{kind}-{token}", size)
                for kind in ("in", "out")
            ]
            shm.set_shared_memory_region(regions[0], [data])
            for kind in ("in", "out"):
                http.register_system_shared_memory(f"{kind}-{token}", f"/bench-{kind}-{token}", size)
            cells = []
            for module, client in ((httpclient, http), (grpcclient, grpc)):
                plain = module.InferInput("INPUT0", list(data.shape), "FP32")
                plain.set_data_from_numpy(data)
                placed = module.InferInput("INPUT0", list(data.shape), "FP32")
                placed.set_shared_memory(f"in-{token}", size)
                output = module.InferRequestedOutput("OUTPUT0")
                output.set_shared_memory(f"out-{token}", size)
                cells.append(median_ms(lambda c=client, i=plain: c.infer("identity", [i]), repeat))
                cells.append(
                    median_ms(lambda c=client, i=placed, o=output: c.infer("identity", [i], outputs=[o]), repeat)
                )
            print(f"{size >> 20:>5} MiB {cells[0]:>12.2f} {cells[1]:>9.2f} {cells[2]:>9.2f} {cells[3]:>9.2f}")
            http.unregister_system_shared_memory()
            for region in regions:
                shm.destroy_shared_memory_region(region)
        http.close()
        grpc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", default="1,16,64", help="tensor sizes in MiB (default 1,16,64)")
    parser.add_argument("--repeat", type=int, default=15, help="measurements per cell (default 15)")
    args = parser.parse_args()
    sizes = [int(float(mib) * (1 << 20)) for mib in args.sizes_mib.split(",")]
    mappings(sizes, args.repeat)
    round_trips(sizes, args.repeat)


if __name__ == "__main__":
    main()
