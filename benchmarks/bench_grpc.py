"""Benchmark pyserve (and optionally PyTriton) over gRPC with perf_analyzer, and streaming latency.

Run from the repository root::

    .venv/bin/python benchmarks/bench_grpc.py [--pytriton] [--duration-ms 2000] [--shapes 16,262144]
        [--concurrency 1,4,16] [--stream-requests 200] [--perf-analyzer PATH] [--json results.json]

For each server (pyserve, then PyTriton with ``--pytriton``; never both at once) it starts the same servers as
``bench_http.py`` (``identity_fp32``, plus its decoupled twin ``stream_fp32`` answering each request with 32
responses), runs ``perf_analyzer -i grpc`` for every shape x concurrency, then measures streaming: one request at a
time on one ``ModelStreamInfer`` stream with tritonclient, the time to the first response (TTFT) and between
responses (inter-token latency, ITL), p50 and p99. It prints both tables, the ratios pyserve/PyTriton and the
project's gRPC targets.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    MODEL_NAME,
    Measurement,
    PerfRun,
    ServerSpec,
    bench_main,
    ensure_pytriton_venv,
    find_perf_analyzer,
    int_list,
    parse_perf_analyzer_args,
    pyserve_spec,
    pytriton_spec,
    run_perf_analyzer,
    running_server,
    write_report,
)
from bench_http import build_rows, format_table

STREAM_MODEL_NAME = "stream_fp32"
STREAM_TOKENS = 32  # what both servers' stream_fp32 yields per request (pyserve_server.py, pytriton_server.py)
STREAM_WARMUP = 10
STREAM_TIMEOUT_S = 30.0

# The targets for 16 floats, and for 1 MiB (262144 floats) at every concurrency measured.
TARGETS = (
    ((16, 16), "throughput_ratio", ">=", 1.5, "pyserve/PyTriton gRPC throughput, 16 floats, c16"),
    ((16, 1), "p50_ratio", "<=", 0.4, "pyserve/PyTriton gRPC p50, 16 floats, c1"),
)
LARGE_SHAPE = 262144


@dataclasses.dataclass(frozen=True)
class StreamLatency:
    """Streaming latencies in µs: time to first response and between responses, p50 and p99."""

    requests: int = 0
    ttft_p50_us: float = 0.0
    ttft_p99_us: float = 0.0
    itl_p50_us: float = 0.0
    itl_p99_us: float = 0.0
    error: str | None = None


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure_streaming(url: str, requests: int) -> StreamLatency:
    """Send ``requests`` requests one after another on one stream; time every response as it arrives."""
    import tritonclient.grpc as triton_grpc

    arrivals: queue.Queue[tuple[float, Any]] = queue.Queue()
    client = triton_grpc.InferenceServerClient(url)
    client.start_stream(lambda result, error: arrivals.put((time.perf_counter(), error)))
    data = np.zeros((1, 16), np.float32)
    ttft: list[float] = []
    itl: list[float] = []
    try:
        for index in range(STREAM_WARMUP + requests):
            infer_input = triton_grpc.InferInput("INPUT0", list(data.shape), "FP32")
            infer_input.set_data_from_numpy(data)
            sent = time.perf_counter()
            client.async_stream_infer(STREAM_MODEL_NAME, [infer_input], request_id=str(index))
            times = []
            for _ in range(STREAM_TOKENS):
                arrived, error = arrivals.get(timeout=STREAM_TIMEOUT_S)
                if error is not None:
                    return StreamLatency(error=f"stream error: {error}")
                times.append(arrived)
            if index >= STREAM_WARMUP:
                ttft.append((times[0] - sent) * 1e6)
                itl.extend((later - earlier) * 1e6 for earlier, later in itertools.pairwise(times))
    except queue.Empty:
        return StreamLatency(error=f"no response within {STREAM_TIMEOUT_S:.0f} s")
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return StreamLatency(
        requests=requests,
        ttft_p50_us=statistics.median(ttft),
        ttft_p99_us=_percentile(ttft, 0.99),
        itl_p50_us=statistics.median(itl),
        itl_p99_us=_percentile(itl, 0.99),
    )


def run_server(
    spec: ServerSpec, log_path: Path, perf_analyzer: str, args: argparse.Namespace
) -> tuple[dict[tuple[int, int], Measurement], StreamLatency]:
    """Start one server, measure the perf_analyzer matrix over gRPC and streaming latency, stop it."""
    spec = dataclasses.replace(spec, ready_models=(MODEL_NAME, STREAM_MODEL_NAME))
    results: dict[tuple[int, int], Measurement] = {}
    print(f"starting {spec.name} (grpc port {spec.grpc_port}) ...", flush=True)
    started = time.monotonic()
    with running_server(spec, log_path):
        print(f"  ready in {time.monotonic() - started:.1f} s", flush=True)
        url = f"127.0.0.1:{spec.grpc_port}"
        for shape in args.shapes:
            for concurrency in args.concurrency:
                run = PerfRun.from_args(args, MODEL_NAME, [f"INPUT0:{shape}"], concurrency, protocol="grpc")
                m = run_perf_analyzer(perf_analyzer, url, run)
                results[(shape, concurrency)] = m
                if m.error:
                    print(f"  shape {shape:>7} c{concurrency:<3} FAILED: {m.error}", flush=True)
                else:
                    print(
                        f"  shape {shape:>7} c{concurrency:<3} {m.throughput:>10.1f} infer/s  "
                        f"p50 {m.p50_us:>8.0f} us  p99 {m.p99_us:>8.0f} us",
                        flush=True,
                    )
        stream = measure_streaming(url, args.stream_requests) if args.stream_requests else StreamLatency()
        if stream.error:
            print(f"  streaming FAILED: {stream.error}", flush=True)
        elif stream.requests:
            print(
                f"  streaming {STREAM_TOKENS} responses/request: TTFT p50 {stream.ttft_p50_us:.0f} us "
                f"p99 {stream.ttft_p99_us:.0f} us; ITL p50 {stream.itl_p50_us:.0f} us p99 {stream.itl_p99_us:.0f} us",
                flush=True,
            )
    return results, stream


def target_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The issue's gRPC targets, checked against PyTriton from the same run."""
    by_key = {(row["shape"], row["concurrency"]): row for row in rows}
    checks = [*TARGETS]
    for (shape, concurrency), _ in sorted(by_key.items()):
        if shape == LARGE_SHAPE:
            label = f"pyserve/PyTriton gRPC throughput, 1 MiB, c{concurrency}"
            checks.append(((shape, concurrency), "throughput_ratio", ">=", 1.0, label))
    lines = []
    for key, field, op, bound, label in checks:
        row = by_key.get(key)
        value = None if row is None else row.get(field)
        if value is None:
            lines.append(f"target {label} {op} {bound}: not measured")
            continue
        met = value >= bound if op == ">=" else value <= bound
        lines.append(f"target {label} {op} {bound}: {value:.2f} -> {'met' if met else 'NOT met'}")
    return lines


def stream_table(streams: dict[str, StreamLatency]) -> str:
    """TTFT / ITL per server, in ms."""
    lines = [["server", "requests", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"]]
    for name, s in streams.items():
        if s.error:
            lines.append([name, "FAILED", "-", "-", "-", "-"])
            continue
        values = (s.ttft_p50_us, s.ttft_p99_us, s.itl_p50_us, s.itl_p99_us)
        lines.append([name, str(s.requests), *(f"{v / 1000:.3f}" for v in values)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(text)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pytriton", action="store_true", help="also benchmark PyTriton 0.7.0 and print ratios")
    parser.add_argument("--duration-ms", type=int, default=2000, help="perf_analyzer window (-p), ms (default 2000)")
    parser.add_argument("--shapes", type=int_list, default=[16, LARGE_SHAPE], help="INPUT0 lengths")
    parser.add_argument("--concurrency", type=int_list, default=[1, 4, 16], help="concurrencies (default 1,4,16)")
    parser.add_argument(
        "--stream-requests", type=int, default=200, help="streaming requests timed per server (0: skip; default 200)"
    )
    args = parse_perf_analyzer_args(parser, argv)
    if args.stream_requests < 0:
        parser.error("--stream-requests must be >= 0")
    return args


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 1 on failure, 130 on interrupt."""
    args = parse_args(argv)
    streams: dict[str, StreamLatency] = {}
    perf_analyzer = find_perf_analyzer(args.perf_analyzer)
    pytriton_python = ensure_pytriton_venv() if args.pytriton else None
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        pyserve, streams["pyserve"] = run_server(pyserve_spec(), work / "pyserve.log", perf_analyzer, args)
        pytriton = None
        if pytriton_python is not None:
            home = work / "pytriton-home"
            home.mkdir()
            spec = pytriton_spec(pytriton_python, home)
            pytriton, streams["PyTriton"] = run_server(spec, work / "pytriton.log", perf_analyzer, args)
        elapsed = time.monotonic() - started

    rows = build_rows(args.shapes, args.concurrency, pyserve, pytriton)
    print()
    print(
        f"perf_analyzer over gRPC, model {MODEL_NAME}, measurement window {args.duration_ms} ms, "
        f"time_windows mode; total {elapsed:.0f} s"
    )
    print(format_table(rows, pytriton is not None))
    if any(m.error is None and m.retried for results in (pyserve, pytriton or {}) for m in results.values()):
        print(f"* unstable at the default -s; measured on a retry with perf_analyzer -s {args.retry_stability:g}")
    if args.stream_requests:
        print()
        print(f"streaming ({STREAM_MODEL_NAME}: {STREAM_TOKENS} responses per request, one request at a time)")
        print(stream_table(streams))
    if pytriton is not None:
        print()
        print("\n".join(target_lines(rows)))
    if args.json is not None:
        report = {
            "model": MODEL_NAME,
            "protocol": "grpc",
            "duration_ms": args.duration_ms,
            "max_trials": args.max_trials,
            "perf_analyzer": perf_analyzer,
            "cpu_count": os.cpu_count(),
            "rows": rows,
            "streaming": {name: dataclasses.asdict(s) for name, s in streams.items()},
        }
        write_report(args.json, report)
    failed = any(m.error for results in (pyserve, pytriton or {}) for m in results.values())
    failed = failed or any(s.error for s in streams.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
