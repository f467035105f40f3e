"""Benchmark pyserve's clients against tritonclient: sequential small requests, same server, same run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_client.py [--requests 2000] [--rounds 3] [--shape 16] [--libraries]
        [--pytriton] [--json results.json]
    .venv/bin/python benchmarks/bench_client.py --large [--large-mib 64] [--large-repeat 15] [--json results.json]

It starts the pyserve benchmark server (``pyserve_server.py``: the identity model ``identity_fp32``, FP32 ``INPUT0``
of shape ``(-1,)`` echoed as ``OUTPUT0``, ``max_batch_size=64``) and times ``--requests`` sequential calls of one
sample of ``--shape`` floats with each client: pyserve's ``ModelClient`` and ``AsyncioModelClient`` and
tritonclient's sync and asyncio clients, over HTTP and gRPC. The calls are split into ``--rounds`` rounds that visit
the clients in turn, so a change in the machine's load touches all of them alike. It prints p50/p90/p99 latency,
calls per second and the client process's CPU time per call. ``--libraries`` adds the bare libraries the clients
were chosen from, each sending one prebuilt request (http.client, urllib3, httpx where installed, aiohttp, grpcio,
grpc.aio): what a client adds to its wire layer. HTTP is timed before any gRPC channel exists (gRPC's polling
threads take CPU from the rest of the process). With ``--pytriton`` the same clients then call a
PyTriton server (``pytriton_server.py``, from ``benchmarks/.pytriton-venv``): pyserve's clients working against it
is part of what this checks.

``--large`` measures large requests instead: ``--large-mib`` (64) MiB of FP32 per request, sent by ``ModelClient``
over HTTP and gRPC with ``shared_memory=False`` and ``True``, one request at a time, median milliseconds of
``--large-repeat`` calls after one untimed call. Two identity models served by pyserve in this process: one whose
output dimension is fixed (input and output both go into the client's region) and one whose dimension is variable
(only the input can: the client cannot size the output, which comes back over the connection).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc as grpcio
import grpc.aio
import numpy as np
import orjson
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_http_aio
import urllib3
from _common import (
    MODEL_NAME,
    ServerSpec,
    bench_main,
    ensure_pytriton_venv,
    format_table,
    pyserve_spec,
    pytriton_spec,
    running_server,
    write_report,
)

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.client import AsyncioModelClient, ModelClient

try:
    import httpx
except ImportError:  # a candidate measured with --libraries where installed
    httpx = None

Call = Callable[[], Any]
AsyncCall = Callable[[], Awaitable[Any]]
SyncFactory = Callable[[str, str, np.ndarray], tuple[dict[str, Call], list[Callable[[], None]]]]
AsyncFactory = Callable[[str, str, np.ndarray], tuple[dict[str, AsyncCall], list[AsyncCall]]]
HTTP_INFER = f"/v2/models/{MODEL_NAME}/infer"
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="timed calls per client (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls per client first (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds the calls are split into (default 3)")
    parser.add_argument("--shape", type=int, default=16, help="floats per request (default 16)")
    parser.add_argument("--pytriton", action="store_true", help="also call a PyTriton server")
    parser.add_argument(
        "--libraries", action="store_true", help="also time bare HTTP/gRPC libraries sending the same request"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--large", action="store_true", help="time large requests with and without shared memory")
    parser.add_argument("--large-mib", type=float, default=64.0, help="MiB per large request (default 64)")
    parser.add_argument("--large-repeat", type=int, default=15, help="timed large requests per cell (default 15)")
    return parser.parse_args(argv)


def sync_clients(protocol: str, address: str, x: np.ndarray) -> tuple[dict[str, Call], list[Callable[[], None]]]:
    """The blocking clients of one protocol: each one's call (one sample, its output read as numpy), and how to
    close them."""
    library: Any = triton_http if protocol == "http" else triton_grpc
    ours = ModelClient(f"{protocol}://{address}", MODEL_NAME, init_timeout_s=30)
    theirs = library.InferenceServerClient(address)
    infer_input = library.InferInput("INPUT0", [1, x.size], "FP32")
    outputs = [library.InferRequestedOutput("OUTPUT0", binary_data=True)] if protocol == "http" else None
    batch = x[np.newaxis]

    def triton_call() -> Any:
        infer_input.set_data_from_numpy(batch)
        return theirs.infer(MODEL_NAME, [infer_input], outputs=outputs).as_numpy("OUTPUT0")

    label = "HTTP" if protocol == "http" else "gRPC"
    calls = {
        f"pyserve ModelClient {label}": lambda: ours.infer_sample(x)["OUTPUT0"],
        f"tritonclient.{protocol}": triton_call,
    }
    return calls, [ours.close, theirs.close]


def async_clients(protocol: str, address: str, x: np.ndarray) -> tuple[dict[str, AsyncCall], list[AsyncCall]]:
    """The asyncio clients of one protocol, and how to close them (made on the running loop)."""
    library: Any = triton_http_aio if protocol == "http" else triton_grpc_aio
    ours = AsyncioModelClient(f"{protocol}://{address}", MODEL_NAME, init_timeout_s=30)
    theirs = library.InferenceServerClient(address)
    infer_input = library.InferInput("INPUT0", [1, x.size], "FP32")
    batch = x[np.newaxis]

    async def pyserve_call() -> Any:
        return (await ours.infer_sample(x))["OUTPUT0"]

    async def triton_call() -> Any:
        infer_input.set_data_from_numpy(batch)
        return (await theirs.infer(MODEL_NAME, [infer_input])).as_numpy("OUTPUT0")

    label = "HTTP" if protocol == "http" else "gRPC"
    calls: dict[str, AsyncCall] = {
        f"pyserve AsyncioModelClient {label}": pyserve_call,
        f"tritonclient.{protocol}.aio": triton_call,
    }
    return calls, [ours.close, theirs.close]


def kserve_request(x: np.ndarray) -> tuple[bytes, dict[str, str], bytes]:
    """The HTTP body and headers, and the gRPC ModelInfer request, of one sample (for the bare libraries)."""
    from pyserve.frontends.protocol import grpc_service_pb2 as pb

    tensor = {"name": "INPUT0", "shape": [1, x.size], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    header = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    message = pb.ModelInferRequest(model_name=MODEL_NAME)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, x.size])
    message.raw_input_contents.append(x.tobytes())
    return header + x.tobytes(), headers, message.SerializeToString()


def library_clients(protocol: str, address: str, x: np.ndarray) -> tuple[dict[str, Call], list[Callable[[], None]]]:
    """Bare blocking libraries sending the same prebuilt request (httpx only where installed)."""
    body, headers, request = kserve_request(x)
    if protocol == "grpc":
        channel = grpcio.insecure_channel(address)
        infer = channel.unary_unary(GRPC_INFER)
        return {"bare grpcio": lambda: infer(request, timeout=30)}, [channel.close]
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port))
    pool = urllib3.HTTPConnectionPool(host, int(port), maxsize=1)

    def stdlib_call() -> bytes:
        connection.request("POST", HTTP_INFER, body, headers)
        return connection.getresponse().read()

    calls: dict[str, Call] = {
        "bare http.client": stdlib_call,
        "bare urllib3": lambda: pool.urlopen("POST", HTTP_INFER, body=body, headers=headers).data,
    }
    closers: list[Callable[[], None]] = [connection.close, pool.close]
    if httpx is not None:
        client = httpx.Client(base_url=f"http://{address}")
        calls["bare httpx"] = lambda: client.post(HTTP_INFER, content=body, headers=headers).content
        closers.append(client.close)
    return calls, closers


def library_async_clients(protocol: str, address: str, x: np.ndarray) -> tuple[dict[str, AsyncCall], list[AsyncCall]]:
    """Bare asyncio libraries sending the same prebuilt request (made on the running loop)."""
    body, headers, request = kserve_request(x)
    if protocol == "grpc":
        channel = grpcio.aio.insecure_channel(address)
        infer = channel.unary_unary(GRPC_INFER)

        async def grpc_call() -> Any:
            return await infer(request, timeout=30)

        return {"bare grpc.aio": grpc_call}, [channel.close]
    session = aiohttp.ClientSession()

    async def aiohttp_call() -> bytes:
        async with session.post(f"http://{address}{HTTP_INFER}", data=body, headers=headers) as response:
            return await response.read()

    calls: dict[str, AsyncCall] = {"bare aiohttp": aiohttp_call}
    closers: list[AsyncCall] = [session.close]
    if httpx is not None:
        client = httpx.AsyncClient(base_url=f"http://{address}")

        async def httpx_call() -> bytes:
            return (await client.post(HTTP_INFER, content=body, headers=headers)).content

        calls["bare httpx async"] = httpx_call
        closers.append(client.aclose)
    return calls, closers


C = TypeVar("C")
K = TypeVar("K")


def make_clients(
    factories: Sequence[Callable[[str, str, np.ndarray], tuple[dict[str, C], list[K]]]],
    protocol: str,
    address: str,
    x: np.ndarray,
) -> tuple[dict[str, C], list[K]]:
    """Every factory's clients of one protocol, and how to close them all."""
    calls: dict[str, C] = {}
    closers: list[K] = []
    for factory in factories:
        more, more_closers = factory(protocol, address, x)
        calls.update(more)
        closers += more_closers
    return calls, closers


class Timings:
    """Per client: the latency of every timed call (s) and the process CPU time they took."""

    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = {}
        self.cpu_s: dict[str, float] = {}

    def add(self, name: str, latencies: list[float], cpu_s: float) -> None:
        self.latencies.setdefault(name, []).extend(latencies)
        self.cpu_s[name] = self.cpu_s.get(name, 0.0) + cpu_s

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for name, values in self.latencies.items():
            ordered = sorted(values)
            out.append(
                {
                    "client": name,
                    "p50_ms": 1e3 * ordered[len(ordered) // 2],
                    "p90_ms": 1e3 * ordered[int(len(ordered) * 0.9)],
                    "p99_ms": 1e3 * ordered[int(len(ordered) * 0.99)],
                    "calls_per_s": len(values) / sum(values),
                    "client_cpu_us_per_call": 1e6 * self.cpu_s[name] / len(values),
                }
            )
        return out


def time_sync(calls: dict[str, Call], args: argparse.Namespace, timings: Timings) -> None:
    """Warm every client up, then time its calls in rounds."""
    for call in calls.values():
        for _ in range(args.warmup):
            call()
    per_round = max(args.requests // args.rounds, 1)
    for _ in range(args.rounds):
        for name, call in calls.items():
            latencies = []
            cpu = time.process_time()
            for _ in range(per_round):
                start = time.perf_counter()
                call()
                latencies.append(time.perf_counter() - start)
            timings.add(name, latencies, time.process_time() - cpu)


async def time_async(
    args: argparse.Namespace,
    factories: list[AsyncFactory],
    protocol: str,
    address: str,
    x: np.ndarray,
    timings: Timings,
) -> None:
    """As ``time_sync``, for the asyncio clients the factories make, one call at a time."""
    calls, closers = make_clients(factories, protocol, address, x)
    try:
        for call in calls.values():
            for _ in range(args.warmup):
                await call()
        per_round = max(args.requests // args.rounds, 1)
        for _ in range(args.rounds):
            for name, call in calls.items():
                latencies = []
                cpu = time.process_time()
                for _ in range(per_round):
                    start = time.perf_counter()
                    await call()
                    latencies.append(time.perf_counter() - start)
                timings.add(name, latencies, time.process_time() - cpu)
    finally:
        for close in closers:
            await close()


def measure(spec: ServerSpec, log: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the server, time every client against it, stop it.

    HTTP clients are timed before any gRPC channel exists: gRPC's polling threads take CPU from whatever else
    runs in the process.
    """
    x = np.arange(args.shape, dtype=np.float32)
    timings = Timings()
    sync_factories: list[SyncFactory] = [sync_clients, *([library_clients] if args.libraries else [])]
    async_factories: list[AsyncFactory] = [async_clients, *([library_async_clients] if args.libraries else [])]
    with running_server(spec, log) as http:
        for protocol, address in (("http", http), ("grpc", f"127.0.0.1:{spec.grpc_port}")):
            calls, closers = make_clients(sync_factories, protocol, address, x)
            try:
                for name, call in calls.items():  # every client computes the right answer before it is timed
                    if not name.startswith("bare"):
                        np.testing.assert_array_equal(np.asarray(call()).reshape(-1), x)
                time_sync(calls, args, timings)
            finally:
                for close in closers:
                    close()
            asyncio.run(time_async(args, async_factories, protocol, address, x, timings))
    return timings.rows()


def table(rows: list[dict[str, Any]]) -> str:
    """The results as text."""
    header = ["client", "p50 ms", "p90 ms", "p99 ms", "calls/s", "client CPU µs/call"]
    cells = [
        [
            row["client"],
            f"{row['p50_ms']:.3f}",
            f"{row['p90_ms']:.3f}",
            f"{row['p99_ms']:.3f}",
            f"{row['calls_per_s']:,.0f}",
            f"{row['client_cpu_us_per_call']:.0f}",
        ]
        for row in rows
    ]
    return format_table(header, cells)


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Each request's INPUT0 as its OUTPUT0."""
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


# The models of --large: name -> (what the client can place in a region, the dimension of INPUT0 and OUTPUT0).
LARGE_MODELS = {
    "identity_fixed": ("input and output in a region", "fixed"),
    "identity_variable": ("input in a region, output sent", "variable"),
}


def measure_large(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Median ms per large request, per model, protocol and shared_memory setting (pyserve served in-process)."""
    count = int(args.large_mib * (1 << 20)) // 4
    data = np.random.default_rng(0).standard_normal(count).astype(np.float32)
    server = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    for model, (_, dimension) in LARGE_MODELS.items():
        dims = (count,) if dimension == "fixed" else (-1,)
        server.bind(
            model,
            identity,
            inputs=[Tensor("INPUT0", np.float32, dims)],
            outputs=[Tensor("OUTPUT0", np.float32, dims)],
            config=ModelConfig(max_batch_size=1),
        )
    rows = []
    with server:
        for model, (placed, _) in LARGE_MODELS.items():
            row: dict[str, Any] = {"model": f"{model} ({placed} with shm)"}
            for protocol, url in (("http", server.url), ("grpc", f"grpc://{server.grpc_address}")):
                for shared in (False, True):
                    with ModelClient(url, model, shared_memory=shared, inference_timeout_s=300) as client:
                        np.testing.assert_array_equal(client.infer_sample(data)["OUTPUT0"], data)
                        times = []
                        for _ in range(args.large_repeat):
                            started = time.perf_counter()
                            client.infer_sample(data)
                            times.append(time.perf_counter() - started)
                    row[f"{protocol}_{'shm' if shared else 'plain'}_ms"] = 1e3 * statistics.median(times)
            rows.append(row)
    return rows


def large_table(rows: list[dict[str, Any]]) -> str:
    """The large-request results as text."""
    header = ["model", "HTTP ms", "HTTP shm ms", "gRPC ms", "gRPC shm ms"]
    keys = ("http_plain_ms", "http_shm_ms", "grpc_plain_ms", "grpc_shm_ms")
    return format_table(header, [[row["model"], *(f"{row[key]:.1f}" for key in keys)] for row in rows])


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 on success."""
    args = parse_args(argv)
    if args.large:
        rows = measure_large(args)
        print()
        print(f"ModelClient, {args.large_mib:g} MiB of FP32 per request, median of {args.large_repeat} calls")
        print(large_table(rows))
        if args.json is not None:
            write_report(args.json, {"large_mib": args.large_mib, "repeat": args.large_repeat, "results": rows})
        return 0
    pytriton_python = ensure_pytriton_venv() if args.pytriton else None
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        work = Path(tmp)
        results["pyserve"] = measure(pyserve_spec(), work / "pyserve.log", args)
        if pytriton_python is not None:
            home = work / "pytriton-home"
            home.mkdir()
            results["PyTriton"] = measure(pytriton_spec(pytriton_python, home), work / "pytriton.log", args)
    for server, rows in results.items():
        print()
        print(f"{server} server, model {MODEL_NAME}, {args.shape} floats, {args.requests} sequential calls per client")
        print(table(rows))
    ours = {row["client"]: row["p50_ms"] for row in results["pyserve"]}
    ratios = [
        f"{protocol}: pyserve/tritonclient p50 {ours[mine] / ours[theirs]:.2f}x"
        for protocol, mine, theirs in (
            ("HTTP", "pyserve ModelClient HTTP", "tritonclient.http"),
            ("gRPC", "pyserve ModelClient gRPC", "tritonclient.grpc"),
            ("HTTP asyncio", "pyserve AsyncioModelClient HTTP", "tritonclient.http.aio"),
            ("gRPC asyncio", "pyserve AsyncioModelClient gRPC", "tritonclient.grpc.aio"),
        )
    ]
    print()
    print("; ".join(ratios))
    if args.json is not None:
        write_report(args.json, {"shape": args.shape, "requests": args.requests, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
