"""What Python's gRPC stack alone can carry here: a bare grpc.aio ModelInfer echo (no model, no worker hop).

Run from the repository root: ``.venv/bin/python benchmarks/grpc_ceiling.py [--concurrency 1,16] [--shape 16]``.
It serves just enough of ``inference.GRPCInferenceService`` for perf_analyzer (metadata, config, ready, an infer
that echoes its raw input) with pyserve's generated stubs on uvloop, measures it with perf_analyzer over gRPC,
then measures pyserve's gRPC identity model the same way, and prints both with the ratio: the share of the
ceiling pyserve reaches. Compare with bench_grpc.py's PyTriton column to see whether a target is reachable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from _common import (
    MODEL_NAME,
    BenchError,
    PerfRun,
    bench_main,
    find_perf_analyzer,
    free_ports,
    log_tail,
    pyserve_spec,
    run_perf_analyzer,
    running_server,
)


async def serve_echo(port: int) -> None:
    """The bare servicer: every RPC perf_analyzer needs, nothing else."""
    import grpc
    from google.protobuf import json_format

    from pyserve.frontends.protocol import grpc_service_pb2 as pb

    config = {
        "name": MODEL_NAME,
        "max_batch_size": 64,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    metadata = pb.ModelMetadataResponse(
        name=MODEL_NAME,
        versions=["1"],
        platform="python",
        inputs=[pb.ModelMetadataResponse.TensorMetadata(name="INPUT0", datatype="FP32", shape=[-1, -1])],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(name="OUTPUT0", datatype="FP32", shape=[-1, -1])],
    )
    config_response = pb.ModelConfigResponse()
    json_format.ParseDict({"config": config}, config_response)

    async def infer(request: pb.ModelInferRequest, context: object) -> pb.ModelInferResponse:
        tensor = request.inputs[0]
        return pb.ModelInferResponse(
            model_name=request.model_name,
            model_version="1",
            outputs=[pb.ModelInferResponse.InferOutputTensor(name="OUTPUT0", datatype="FP32", shape=tensor.shape)],
            raw_output_contents=[request.raw_input_contents[0]],
        )

    def unary(handler: object, request_type: type, response_type: type) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=request_type.FromString, response_serializer=response_type.SerializeToString
        )

    def constant(response: object) -> object:
        async def handler(request: object, context: object) -> object:
            return response

        return handler

    handlers = {
        "ServerLive": unary(constant(pb.ServerLiveResponse(live=True)), pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": unary(
            constant(pb.ServerReadyResponse(ready=True)), pb.ServerReadyRequest, pb.ServerReadyResponse
        ),
        "ModelReady": unary(constant(pb.ModelReadyResponse(ready=True)), pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ModelMetadata": unary(constant(metadata), pb.ModelMetadataRequest, pb.ModelMetadataResponse),
        "ServerMetadata": unary(
            constant(pb.ServerMetadataResponse(name="echo", version="0")),
            pb.ServerMetadataRequest,
            pb.ServerMetadataResponse,
        ),
        "ModelStatistics": unary(
            constant(pb.ModelStatisticsResponse()), pb.ModelStatisticsRequest, pb.ModelStatisticsResponse
        ),
        "ModelConfig": unary(constant(config_response), pb.ModelConfigRequest, pb.ModelConfigResponse),
        "ModelInfer": unary(infer, pb.ModelInferRequest, pb.ModelInferResponse),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


@contextlib.contextmanager
def echo_server(port: int, log_path: Path) -> Iterator[None]:
    """The echo server in a child process (this script with --serve-echo), stopped on exit."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, __file__, "--serve-echo", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(Exception):
                if client.is_model_ready(MODEL_NAME):
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise BenchError(f"the echo server did not start; log tail:\n{log_tail(log_path)}")
            time.sleep(0.1)
        client.close()
        yield
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# CPU accounting (--cpu) -----------------------------------------------------------------------------------------

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command line, CPU seconds used so far) of every process."""
    found: dict[int, tuple[int, str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry)] = (int(fields[1]), cmdline, (int(fields[11]) + int(fields[12])) * _TICK_S)
    return found


def _role(cmdline: str) -> str:
    if "pyserve.core" in cmdline:
        return "core process"
    if "pyserve.worker" in cmdline:
        return "worker process"
    if "perf_analyzer" in cmdline:
        return "perf_analyzer"
    return "server process"


class CpuMeter:
    """CPU seconds used by a process tree (by role) and by perf_analyzer between ``start()`` and ``stop()``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker  # a string in the server's command line (its port)
        self._before: dict[int, tuple[int, str, float]] = {}

    def _tree(self) -> dict[int, tuple[int, str, float]]:
        processes = _processes()
        roots = {pid for pid, (_, cmd, _) in processes.items() if self.marker in cmd and "perf_analyzer" not in cmd}
        tree = set(roots)
        grew = True
        while grew:
            grew = False
            for pid, (parent, _, _) in processes.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        return {pid: processes[pid] for pid in tree}

    def start(self) -> None:
        self._before = self._tree()
        self._children = resource.getrusage(resource.RUSAGE_CHILDREN)

    def stop(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for pid, (_, cmdline, cpu) in self._tree().items():
            base = self._before.get(pid, (0, "", 0.0))[2]
            used[_role(cmdline)] = used.get(_role(cmdline), 0.0) + cpu - base
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        used["perf_analyzer"] = (
            children.ru_utime + children.ru_stime - self._children.ru_utime - self._children.ru_stime
        )
        return used


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--shape", type=int, default=16)
    parser.add_argument("--duration-ms", type=int, default=2000)
    parser.add_argument("--perf-analyzer", default=None)
    parser.add_argument(
        "--cpu", action="store_true", help="also report CPU time per request by process (core, worker, perf_analyzer)"
    )
    parser.add_argument("--serve-echo", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_echo is not None:
        import uvloop

        uvloop.run(serve_echo(args.serve_echo))
        return 0
    perf_analyzer = find_perf_analyzer(args.perf_analyzer)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    results: dict[str, dict[int, tuple[float, float]]] = {}

    def measure(name: str, url: str, log_path: Path) -> None:
        # A failed run must stop the benchmark with its reason and the server's log, never yield a ratio of zeros.
        results[name] = {}
        for concurrency in concurrencies:
            run = PerfRun(
                MODEL_NAME, (f"INPUT0:{args.shape}",), concurrency, window_ms=args.duration_ms, protocol="grpc"
            )
            meter = CpuMeter(url.rpartition(":")[2])
            meter.start()
            started = time.monotonic()
            m = run_perf_analyzer(perf_analyzer, url, run)
            elapsed = time.monotonic() - started
            if args.cpu and m.error is None and m.throughput > 0:
                # perf_analyzer runs its windows back to back at the measured rate: requests ~ rate x wall time.
                requests = m.throughput * elapsed
                used = meter.stop()
                per_request = ", ".join(f"{role} {1e6 * cpu / requests:.0f}" for role, cpu in sorted(used.items()))
                print(f"  {name} c{concurrency}: CPU us per request: {per_request}", flush=True)
            if m.error is not None or m.throughput <= 0:
                raise BenchError(
                    f"{name} c{concurrency}: the measurement failed: {m.error or 'no throughput measured'}\n"
                    f"server log tail ({log_path}):\n{log_tail(log_path)}"
                )
            results[name][concurrency] = (m.throughput, m.p50_us)
            print(f"  {name} c{concurrency}: {m.throughput:.0f} infer/s, p50 {m.p50_us:.0f} us", flush=True)

    with tempfile.TemporaryDirectory(prefix="grpc-ceiling-") as tmp:
        (port,) = free_ports(1)
        echo_log = Path(tmp) / "echo.log"
        with echo_server(port, echo_log):
            measure("bare grpc.aio echo", f"127.0.0.1:{port}", echo_log)
        spec = pyserve_spec()
        pyserve_log = Path(tmp) / "pyserve.log"
        with running_server(spec, pyserve_log):
            measure("pyserve", f"127.0.0.1:{spec.grpc_port}", pyserve_log)
    print(f"\ngRPC, {args.shape} floats: pyserve as a share of the bare grpc.aio echo")
    for concurrency in concurrencies:
        bare, ours = results["bare grpc.aio echo"][concurrency], results["pyserve"][concurrency]
        print(
            f"  c{concurrency:<3} echo {bare[0]:>8.0f}/s p50 {bare[1]:>6.0f} us | pyserve {ours[0]:>8.0f}/s "
            f"p50 {ours[1]:>6.0f} us | {ours[0] / bare[0]:.2f}x of the ceiling"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
