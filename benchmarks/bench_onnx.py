"""Benchmark an ONNX MLP: onnxruntime called directly, pyserve serving it from a repository, and PyTriton.

Run from the repository root::

    .venv/bin/python benchmarks/bench_onnx.py [--no-pytriton] [--duration-ms 2000] [--concurrency 1,16]
        [--protocols http,grpc] [--intra-op-threads 1] [--perf-analyzer PATH] [--json results.json]

The model (``onnx_model.py``): ``INPUT0`` FP32 ``[batch, 512]`` -> 3 x (MatMul + Add + Relu), 512 wide ->
``OUTPUT0``, weights from a fixed seed, written with ``onnx.helper`` into a temporary model repository. In one run:

1. **direct**: one ``onnxruntime.InferenceSession`` (CPU provider, ``intra_op_num_threads`` from
   ``--intra-op-threads``) called in a loop at batch 1 for ``--duration-ms``, after a warm-up: p50, mean and p99
   per ``session.run``;
2. **pyserve**: ``pyserve serve --model-repository`` with ``mlp/config.pbtxt`` (``platform: "onnxruntime_onnx"``,
   ``max_batch_size: 64``, ``dynamic_batching {}``, one ``KIND_CPU`` instance, ``intra_op_thread_count`` the same)
   and ``mlp/1/model.onnx``;
3. **PyTriton** (``--no-pytriton`` skips it): ``onnx_pytriton_server.py``, a ``@batch`` function calling a session
   opened as in 1, ``max_batch_size=64``, dynamic batching;

each server alone, measured with ``perf_analyzer -m mlp --shape INPUT0:512`` (batch 1, synchronous requests) over
every protocol x concurrency. Before measuring, one request to each server must give the direct session's output.
It prints the table and the targets: pyserve's serving overhead at c1 over HTTP (pyserve p50 - direct p50) <= 0.3 ms,
and pyserve/PyTriton throughput at c16 over HTTP >= 2x. The exit status is 1 when any cell failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    BENCH_DIR,
    HTTP_TIMEOUT_S,
    BenchError,
    Check,
    Measurement,
    PerfRun,
    ServerSpec,
    bench_main,
    cpu_busy_fraction,
    ensure_pytriton_venv,
    find_perf_analyzer,
    format_checks,
    format_table,
    free_ports,
    int_list,
    parse_perf_analyzer_args,
    perf_settings,
    pyserve_command_spec,
    pytriton_spec,
    run_perf_analyzer,
    running_server,
    with_server_script,
    write_report,
)
from onnx_model import INPUT_NAME, MODEL_NAME, OUTPUT_NAME, SEED, WIDTH, open_session, write_repository

PROTOCOLS = ("http", "grpc")
WARMUP_CALLS = 200
OVERHEAD_TARGET_MS = 0.3
THROUGHPUT_TARGET = 2.0
BUSY_WARNING = 0.25
# The pyserve command, with the driver-watch every benchmark server has: argv is [pid, *pyserve arguments].
PYSERVE_LAUNCHER = (
    "import sys\n"
    f"sys.path.insert(0, {str(BENCH_DIR)!r})\n"
    "from _common import watch_parent\n"
    "watch_parent(int(sys.argv[1]))\n"
    "from pyserve.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


# direct -------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DirectResult:
    """Per-call times of ``session.run`` at batch 1 in a loop (µs)."""

    calls: int
    p50_us: float
    mean_us: float
    p99_us: float


def measure_direct(model_file: Path, intra_op_threads: int, duration_ms: int) -> DirectResult:
    """Call the session at batch 1 for ``duration_ms`` after ``WARMUP_CALLS`` calls; time each call."""
    session = open_session(model_file, intra_op_threads)
    feeds = {INPUT_NAME: np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)}
    outputs = [OUTPUT_NAME]
    for _ in range(WARMUP_CALLS):
        session.run(outputs, feeds)
    times_ns: list[int] = []
    deadline = time.perf_counter_ns() + duration_ms * 1_000_000
    while True:
        started = time.perf_counter_ns()
        session.run(outputs, feeds)
        ended = time.perf_counter_ns()
        times_ns.append(ended - started)
        if ended >= deadline:
            break
    times_us = np.asarray(times_ns, dtype=np.float64) / 1000
    return DirectResult(
        calls=len(times_ns),
        p50_us=float(np.percentile(times_us, 50)),
        mean_us=float(statistics.fmean(times_us)),
        p99_us=float(np.percentile(times_us, 99)),
    )


def reference_output(model_file: Path, intra_op_threads: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed input row and what the direct session answers for it."""
    session = open_session(model_file, intra_op_threads)
    row = np.random.default_rng(SEED + 1).standard_normal((1, WIDTH)).astype(np.float32)
    (output,) = session.run([OUTPUT_NAME], {INPUT_NAME: row})
    return row, output


def check_served_output(name: str, url: str, row: np.ndarray, expected: np.ndarray) -> None:
    """One KServe JSON request to ``url``; BenchError unless the server answers the direct session's output."""
    body = {
        "inputs": [{"name": INPUT_NAME, "shape": list(row.shape), "datatype": "FP32", "data": row.ravel().tolist()}]
    }
    request = urllib.request.Request(
        f"http://{url}/v2/models/{MODEL_NAME}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        answer = json.loads(response.read())
    outputs = {output["name"]: output for output in answer["outputs"]}
    got = np.asarray(outputs[OUTPUT_NAME]["data"], dtype=np.float32).reshape(expected.shape)
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
        worst = float(np.max(np.abs(got - expected)))
        raise BenchError(f"{name}: output '{OUTPUT_NAME}' differs from the direct session's (max |diff| {worst:g})")


# servers ------------------------------------------------------------------------------------------------------------


def pyserve_repository_spec(repository: Path) -> ServerSpec:
    """``pyserve serve --model-repository`` on free ports, stopping itself when this driver is gone."""
    http_port, grpc_port, metrics_port = free_ports(3)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-c", PYSERVE_LAUNCHER, str(os.getpid()), "serve"]
    command += ["--model-repository", str(repository), "--http-port", str(http_port)]
    command += ["--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    return pyserve_command_spec(command, env, http_port, grpc_port, (MODEL_NAME,))


def pytriton_onnx_spec(python: Path, home: Path, model_file: Path, intra_op_threads: int) -> ServerSpec:
    """``onnx_pytriton_server.py`` from PyTriton's environment, serving ``model_file``."""
    extra = ["--model", str(model_file), "--intra-op-threads", str(intra_op_threads)]
    return with_server_script(pytriton_spec(python, home), BENCH_DIR / "onnx_pytriton_server.py", extra, [MODEL_NAME])


Cells = dict[tuple[str, int], Measurement]


def run_server(
    spec: ServerSpec,
    log_path: Path,
    perf_analyzer: str,
    reference: tuple[np.ndarray, np.ndarray],
    args: argparse.Namespace,
) -> Cells:
    """Start the server, check its answer, measure every protocol x concurrency, stop it."""
    cells: Cells = {}
    print(f"starting {spec.name} (http port {spec.http_port}, grpc port {spec.grpc_port}) ...", flush=True)
    started = time.monotonic()
    with running_server(spec, log_path) as http_url:
        print(f"  ready in {time.monotonic() - started:.1f} s", flush=True)
        check_served_output(spec.name, http_url, *reference)
        for protocol in args.protocols:
            url = http_url if protocol == "http" else f"127.0.0.1:{spec.grpc_port}"
            for concurrency in args.concurrency:
                run = PerfRun.from_args(args, MODEL_NAME, [f"{INPUT_NAME}:{WIDTH}"], concurrency, protocol=protocol)
                label = f"  {protocol:<4} c{concurrency:<3}"

                def announce(relaxed: float, label: str = label) -> None:
                    print(f"{label} unstable; retrying with -s {relaxed:g}", flush=True)

                m = run_perf_analyzer(perf_analyzer, url, run, on_retry=announce)
                cells[(protocol, concurrency)] = m
                if m.error:
                    print(f"{label} FAILED: {m.error}", flush=True)
                else:
                    print(
                        f"{label} {m.throughput:>10.1f} infer/s  p50 {m.p50_us:>8.0f} us  p99 {m.p99_us:>8.0f} us",
                        flush=True,
                    )
    return cells


# report -------------------------------------------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if numerator > 0 and denominator > 0 else None


def build_rows(
    args: argparse.Namespace, direct: DirectResult, pyserve: Cells, pytriton: Cells | None
) -> list[dict[str, Any]]:
    """One JSON-able row per protocol x concurrency: both servers, their ratios and pyserve's overhead at c1."""
    rows: list[dict[str, Any]] = []
    for protocol in args.protocols:
        for concurrency in args.concurrency:
            ours = pyserve[(protocol, concurrency)]
            row: dict[str, Any] = {
                "protocol": protocol,
                "concurrency": concurrency,
                "pyserve": dataclasses.asdict(ours),
                "pyserve_overhead_us": ours.p50_us - direct.p50_us if concurrency == 1 and not ours.error else None,
            }
            if pytriton is not None:
                theirs = pytriton[(protocol, concurrency)]
                row["pytriton"] = dataclasses.asdict(theirs)
                row["pytriton_overhead_us"] = (
                    theirs.p50_us - direct.p50_us if concurrency == 1 and not theirs.error else None
                )
                row["throughput_ratio"] = _ratio(ours.throughput, theirs.throughput)
                row["p50_ratio"] = _ratio(ours.p50_us, theirs.p50_us)
            rows.append(row)
    return rows


def _cells(m: dict[str, Any]) -> list[str]:
    if m["error"]:
        return ["FAILED", "-", "-"]
    mark = "*" if m["retried"] else ""
    return [f"{m['throughput']:.1f}{mark}", f"{m['p50_us'] / 1000:.3f}", f"{m['p99_us'] / 1000:.3f}"]


def _ms(value_us: float | None) -> str:
    return "-" if value_us is None else f"{value_us / 1000:.3f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render_table(rows: Sequence[dict[str, Any]], with_pytriton: bool) -> str:
    """The side-by-side table; latencies in ms, overhead = p50 - direct p50 (c1 only)."""
    header = ["protocol", "conc", "pyserve inf/s", "p50 ms", "p99 ms", "overhead ms"]
    if with_pytriton:
        header += ["PyTriton inf/s", "p50 ms", "p99 ms", "overhead ms", "thr ratio", "p50 ratio"]
    lines = []
    for row in rows:
        line = [row["protocol"], str(row["concurrency"]), *_cells(row["pyserve"]), _ms(row["pyserve_overhead_us"])]
        if with_pytriton:
            line += [*_cells(row["pytriton"]), _ms(row["pytriton_overhead_us"])]
            line += [_times(row["throughput_ratio"]), _times(row["p50_ratio"])]
        lines.append(line)
    return format_table(header, lines, align_left=1)


def build_checks(rows: Sequence[dict[str, Any]], direct: DirectResult) -> list[Check]:
    """The targets, over HTTP; the same figures over gRPC are reported without a target."""
    by_key = {(row["protocol"], row["concurrency"]): row for row in rows}
    checks = []
    for protocol in PROTOCOLS:
        with_target = protocol == "http"
        label = f"pyserve overhead at c1, {protocol}: p50 - direct p50"
        target = f"<= {OVERHEAD_TARGET_MS} ms"
        row = by_key.get((protocol, 1))
        overhead = None if row is None else row["pyserve_overhead_us"]
        if row is not None and overhead is not None:
            value = f"{overhead / 1000:.3f} ms ({row['pyserve']['p50_us'] / 1000:.3f} - {direct.p50_us / 1000:.3f})"
            met = overhead / 1000 <= OVERHEAD_TARGET_MS
            checks.append(Check(label, value, target, met) if with_target else Check(label, value))
        elif with_target:
            checks.append(Check(label, "not measured", target))
        label = f"throughput pyserve/PyTriton at c16, {protocol}"
        target = f">= {THROUGHPUT_TARGET:g}x"
        row = by_key.get((protocol, 16))
        ratio = None if row is None else row.get("throughput_ratio")
        if row is not None and ratio is not None:
            value = f"{ratio:.2f}x ({row['pyserve']['throughput']:.0f} vs {row['pytriton']['throughput']:.0f} inf/s)"
            met = ratio >= THROUGHPUT_TARGET
            checks.append(Check(label, value, target, met) if with_target else Check(label, value))
        elif with_target:
            checks.append(Check(label, "not measured", target))
    return checks


# CLI ----------------------------------------------------------------------------------------------------------------


def protocol_list(text: str) -> list[str]:
    """An argparse type: comma-separated protocols out of http, grpc."""
    values = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not values or any(v not in PROTOCOLS for v in values):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(PROTOCOLS)}, got {text!r}")
    return list(dict.fromkeys(values))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pytriton",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also benchmark PyTriton 0.7.0 and print ratios (default: yes)",
    )
    parser.add_argument(
        "--duration-ms",
        type=int,
        default=2000,
        help="perf_analyzer measurement window (-p), and the direct loop's duration, ms (default 2000)",
    )
    parser.add_argument("--concurrency", type=int_list, default=[1, 16], help="concurrencies (default 1,16)")
    parser.add_argument("--protocols", type=protocol_list, default=list(PROTOCOLS), help="default http,grpc")
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=1,
        help="onnxruntime intra_op_num_threads for all three (default 1; 0: onnxruntime picks, one per core)",
    )
    args = parse_perf_analyzer_args(parser, argv)
    if args.intra_op_threads < 0:
        parser.error("--intra-op-threads must be >= 0")
    return args


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 1 on failure, 130 on interrupt."""
    args = parse_args(argv)
    perf_analyzer = find_perf_analyzer(args.perf_analyzer)
    ort_version = importlib.metadata.version("onnxruntime")
    # The same onnxruntime in PyTriton's environment as here, so all three run the same kernels.
    pytriton_python = ensure_pytriton_venv(extra=[f"onnxruntime=={ort_version}"]) if args.pytriton else None
    busy = cpu_busy_fraction()
    if busy is not None and busy > BUSY_WARNING:
        print(f"warning: the CPUs were {busy:.0%} busy before the benchmark started; expect noisy numbers")
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        model_file = write_repository(work / "repo", args.intra_op_threads)
        reference = reference_output(model_file, args.intra_op_threads)
        print(f"direct: session.run at batch 1 for {args.duration_ms} ms ...", flush=True)
        direct = measure_direct(model_file, args.intra_op_threads, args.duration_ms)
        print(
            f"  {direct.calls} calls  p50 {direct.p50_us:.0f} us  mean {direct.mean_us:.0f} us  "
            f"p99 {direct.p99_us:.0f} us",
            flush=True,
        )
        pyserve = run_server(
            pyserve_repository_spec(work / "repo"), work / "pyserve.log", perf_analyzer, reference, args
        )
        pytriton = None
        if pytriton_python is not None:
            home = work / "pytriton-home"
            home.mkdir()
            spec = pytriton_onnx_spec(pytriton_python, home, model_file, args.intra_op_threads)
            pytriton = run_server(spec, work / "pytriton.log", perf_analyzer, reference, args)
        elapsed = time.monotonic() - started

    rows = build_rows(args, direct, pyserve, pytriton)
    checks = build_checks(rows, direct)
    threads = args.intra_op_threads or "onnxruntime's default"
    print()
    print(
        f"ONNX MLP {MODEL_NAME} (3 x 512, FP32), onnxruntime {ort_version} CPU, intra_op_num_threads {threads}; "
        f"batch 1; measurement window {args.duration_ms} ms; total {elapsed:.0f} s"
    )
    print(
        f"direct session.run: p50 {direct.p50_us / 1000:.3f} ms, mean {direct.mean_us / 1000:.3f} ms, "
        f"p99 {direct.p99_us / 1000:.3f} ms ({direct.calls} calls)"
    )
    print(render_table(rows, pytriton is not None))
    if any(m.error is None and m.retried for cells in (pyserve, pytriton or {}) for m in cells.values()):
        threshold = args.stability_percentage or 10
        print(f"* unstable at -s {threshold:g}; measured on a retry with perf_analyzer -s {args.retry_stability:g}")
    print()
    print(format_checks(checks))
    if args.json is not None:
        report = {
            "model": MODEL_NAME,
            "onnxruntime": ort_version,
            "intra_op_threads": args.intra_op_threads,
            **perf_settings(args, perf_analyzer),
            "direct": dataclasses.asdict(direct),
            "rows": rows,
            "checks": [dataclasses.asdict(check) | {"verdict": check.verdict} for check in checks],
        }
        write_report(args.json, report)
    failed = any(m.error for cells in (pyserve, pytriton or {}) for m in cells.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
