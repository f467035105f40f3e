"""Benchmark the OpenVINO example: the compiled model called directly, and ``examples/openvino/server.py`` over HTTP.

Run from the repository root (OpenVINO installed: ``pip install -e '.[openvino]'``)::

    .venv/bin/python benchmarks/bench_openvino.py [--duration-ms 2000] [--concurrency 1,16] [--perf-analyzer PATH]
        [--json results.json]

The model is the example's (``examples/openvino/model.py``): ``features`` FP32 ``[batch, 256]`` -> 512 Relu -> 10
logits -> softmax, compiled for the CPU with the example's settings (latency hint, FP32). In one run:

1. **direct**: ``compiled({"features": x})`` in a loop in this process for ``--duration-ms`` after a warm-up, at
   batch 1 (p50 per call, calls/s) and at batch 16 (rows/s: what one call per 16 rows could give);
2. **pyserve**: the example's ``server.py`` (one thread instance, ``max_batch_size=64``, dynamic batching), measured
   with ``perf_analyzer -m classifier --shape features:256`` over HTTP (batch 1, synchronous requests) at each
   concurrency, with the rows per model execution the server formed (from its statistics).

Before measuring, one request must answer the direct call's output. The exit status is 1 when any cell failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    BENCH_DIR,
    HTTP_TIMEOUT_S,
    REPO_ROOT,
    BenchError,
    Measurement,
    PerfRun,
    ServerSpec,
    bench_main,
    cpu_busy_fraction,
    execution_counts,
    find_perf_analyzer,
    format_table,
    free_ports,
    int_list,
    pyserve_command_spec,
    run_perf_analyzer,
    running_server,
)

EXAMPLE_DIR = REPO_ROOT / "examples" / "openvino"
sys.path.insert(0, str(EXAMPLE_DIR))

from model import FEATURES, MODEL_NAME, compile_model  # noqa: E402  (the example's folder is on sys.path above)

WARMUP_CALLS = 200
DIRECT_BATCH = 16
BUSY_WARNING = 0.25
# ``python examples/openvino/server.py`` with the driver-watch every benchmark server has: argv is [pid].
SERVER_LAUNCHER = (
    "import runpy, sys\n"
    f"sys.path[:0] = [{str(BENCH_DIR)!r}, {str(EXAMPLE_DIR)!r}]\n"
    "from _common import watch_parent\n"
    "watch_parent(int(sys.argv[1]))\n"
    f"runpy.run_path({str(EXAMPLE_DIR / 'server.py')!r}, run_name='__main__')\n"
)


@dataclasses.dataclass(frozen=True)
class DirectResult:
    """Per-call times of the compiled model at one batch size, in a loop."""

    batch: int
    calls: int
    p50_us: float
    rows_per_s: float


def measure_direct(compiled: Callable[[dict[str, np.ndarray]], Any], batch: int, duration_ms: int) -> DirectResult:
    """Call the model at ``batch`` rows for ``duration_ms`` after ``WARMUP_CALLS`` calls; time each call."""
    feeds = {"features": np.random.default_rng(1).standard_normal((batch, FEATURES)).astype(np.float32)}
    for _ in range(WARMUP_CALLS):
        compiled(feeds)
    times_ns: list[int] = []
    first = time.perf_counter_ns()
    deadline = first + duration_ms * 1_000_000
    while True:
        started = time.perf_counter_ns()
        compiled(feeds)
        ended = time.perf_counter_ns()
        times_ns.append(ended - started)
        if ended >= deadline:
            break
    elapsed_s = (ended - first) / 1e9
    p50_us = float(np.percentile(np.asarray(times_ns, dtype=np.float64), 50)) / 1000
    return DirectResult(batch, len(times_ns), p50_us, len(times_ns) * batch / elapsed_s)


def check_served_output(url: str, compiled: Callable[[dict[str, np.ndarray]], Any]) -> None:
    """One KServe JSON request; BenchError unless the server answers what the direct call does."""
    row = np.random.default_rng(2).standard_normal((1, FEATURES)).astype(np.float32)
    expected = np.asarray(compiled({"features": row})["probabilities"])
    body = {"inputs": [{"name": "features", "shape": [1, FEATURES], "datatype": "FP32", "data": row.ravel().tolist()}]}
    request = urllib.request.Request(
        f"http://{url}/v2/models/{MODEL_NAME}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        outputs = {output["name"]: output for output in json.loads(response.read())["outputs"]}
    got = np.asarray(outputs["probabilities"]["data"], dtype=np.float32).reshape(expected.shape)
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-6):
        raise BenchError(f"served 'probabilities' differ from the direct call's by {np.abs(got - expected).max():g}")


def server_spec() -> ServerSpec:
    """The example's ``server.py`` on free ports (``PYSERVE_*_PORT``), stopping itself when this driver is gone."""
    http_port, grpc_port, metrics_port = free_ports(3)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYSERVE_")}
    env |= {"PYTHONUNBUFFERED": "1", "PYSERVE_HTTP_PORT": str(http_port)}
    env |= {"PYSERVE_GRPC_PORT": str(grpc_port), "PYSERVE_METRICS_PORT": str(metrics_port)}
    command = [sys.executable, "-c", SERVER_LAUNCHER, str(os.getpid())]
    return pyserve_command_spec(command, env, http_port, grpc_port, (MODEL_NAME,))


def measure_served(
    perf_analyzer: str, compiled: Callable[[dict[str, np.ndarray]], Any], log: Path, args: argparse.Namespace
) -> list[tuple[int, Measurement, float | None]]:
    """Start the server, check its answer, measure each concurrency over HTTP (with rows per execution), stop it."""
    cells = []
    with running_server(server_spec(), log) as url:
        check_served_output(url, compiled)
        for concurrency in args.concurrency:
            run = PerfRun(MODEL_NAME, (f"features:{FEATURES}",), concurrency, window_ms=args.duration_ms)
            rows_before, executions_before = execution_counts(url, MODEL_NAME)
            m = run_perf_analyzer(perf_analyzer, url, run)
            rows_after, executions_after = execution_counts(url, MODEL_NAME)
            executions = executions_after - executions_before
            rows_per_execution = (rows_after - rows_before) / executions if executions else None
            cells.append((concurrency, m, rows_per_execution))
            status = m.error or f"{m.throughput:.0f} infer/s, p50 {m.p50_us / 1000:.3f} ms"
            print(f"  http c{concurrency}: {status}", flush=True)
    return cells


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--duration-ms", type=int, default=2000, help="perf_analyzer window (-p) and direct loop duration, ms"
    )
    parser.add_argument("--concurrency", type=int_list, default=[1, 16], help="concurrencies (default 1,16)")
    parser.add_argument("--perf-analyzer", default=None, help="perf_analyzer binary (default: .tools/pa, PATH)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.duration_ms <= 0:
        parser.error("--duration-ms must be positive")
    return args


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 1 on failure, 130 on interrupt."""
    args = parse_args(argv)
    perf_analyzer = find_perf_analyzer(args.perf_analyzer)
    busy = cpu_busy_fraction()
    if busy is not None and busy > BUSY_WARNING:
        print(f"warning: the CPUs were {busy:.0%} busy before the benchmark started; expect noisy numbers")
    compiled = compile_model("cpu")
    direct = []
    for batch in (1, DIRECT_BATCH):
        print(f"direct: compiled model at batch {batch} for {args.duration_ms} ms ...", flush=True)
        direct.append(measure_direct(compiled, batch, args.duration_ms))
    print("pyserve: examples/openvino/server.py over HTTP ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-openvino-") as tmp:
        served = measure_served(perf_analyzer, compiled, Path(tmp) / "server.log", args)

    version = importlib.metadata.version("openvino")
    print()
    print(f"OpenVINO {version} CPU, {MODEL_NAME} ({FEATURES} -> 512 -> 10, FP32), {os.cpu_count()} CPUs")
    lines = [[f"direct, batch {d.batch}", f"{d.rows_per_s:.0f}", f"{d.p50_us / 1000:.3f}", "-"] for d in direct]
    for concurrency, m, rows in served:
        cells = ["FAILED", "-"] if m.error else [f"{m.throughput:.0f}", f"{m.p50_us / 1000:.3f}"]
        lines.append([f"pyserve HTTP, c{concurrency}", *cells, "-" if rows is None else f"{rows:.1f}"])
    print(format_table(["contender", "rows/s", "p50 ms", "rows/execution"], lines, align_left=1))
    if args.json is not None:
        report = {
            "openvino": version,
            "cpu_count": os.cpu_count(),
            "duration_ms": args.duration_ms,
            "direct": [dataclasses.asdict(d) for d in direct],
            "served": [
                {"concurrency": c, **dataclasses.asdict(m), "rows_per_execution": rows} for c, m, rows in served
            ],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if any(m.error for _, m, _ in served) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
