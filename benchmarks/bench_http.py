"""Benchmark pyserve (and optionally PyTriton) over HTTP with perf_analyzer.

Run from the repository root::

    .venv/bin/python benchmarks/bench_http.py [--pytriton] [--floor] [--duration-ms 2000] [--shapes 16,262144]
        [--concurrency 1,4,16] [--perf-analyzer PATH] [--json results.json]

For each server (pyserve, then PyTriton with ``--pytriton``) it starts the server in its own process group serving
the identity model ``identity_fp32`` (FP32 ``INPUT0`` of shape ``(-1,)`` echoed as ``OUTPUT0``,
``max_batch_size=64``, dynamic batching with no queue delay, ``@batch``), waits until the model is ready, runs
perf_analyzer over HTTP for every shape x concurrency, and stops the server. Only one server runs at a time, so
they do not compete for CPU. It then prints a table of throughput and p50/p99 latency (with PyTriton: the ratios
pyserve/PyTriton) and optionally writes the results as JSON.

With ``--floor`` it first measures ``http_floor_server.py``, a bare httptools + uvloop KServe echo with no model and
no worker hop: the floor pyserve's latency is compared with (what pyserve adds over the front end alone).

PyTriton runs from its own virtual environment, ``benchmarks/.pytriton-venv``, created on first use with
``nvidia-pytriton==0.7.0`` and numpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    BENCH_DIR,
    MODEL_NAME,
    Measurement,
    PerfRun,
    ServerSpec,
    bench_main,
    ensure_pytriton_venv,
    find_perf_analyzer,
    int_list,
    parse_perf_analyzer_args,
    perf_settings,
    pyserve_spec,
    pytriton_spec,
    run_perf_analyzer,
    running_server,
    with_server_script,
    write_report,
)
from _common import format_table as text_table

# perf_analyzer ------------------------------------------------------------------------------------------------------


def measure(perf_analyzer: str, url: str, shape: int, concurrency: int, args: argparse.Namespace) -> Measurement:
    """Measure one cell; if perf_analyzer cannot stabilise, retry once with ``--retry-stability`` as ``-s``."""
    run = PerfRun.from_args(args, MODEL_NAME, [f"INPUT0:{shape}"], concurrency, explicit_end=False)

    def announce(relaxed: float) -> None:
        print(f"  shape {shape:>7} c{concurrency:<3} unstable; retrying with -s {relaxed:g}", flush=True)

    return run_perf_analyzer(perf_analyzer, url, run, on_retry=announce)


def run_matrix(
    spec: ServerSpec, log_path: Path, perf_analyzer: str, args: argparse.Namespace
) -> dict[tuple[int, int], Measurement]:
    """Start the server, measure every shape x concurrency against it, stop it."""
    results: dict[tuple[int, int], Measurement] = {}
    print(f"starting {spec.name} (http port {spec.http_port}) ...", flush=True)
    started = time.monotonic()
    with running_server(spec, log_path) as url:
        print(f"  ready in {time.monotonic() - started:.1f} s", flush=True)
        for shape in args.shapes:
            for concurrency in args.concurrency:
                m = measure(perf_analyzer, url, shape, concurrency, args)
                results[(shape, concurrency)] = m
                if m.error:
                    print(f"  shape {shape:>7} c{concurrency:<3} FAILED: {m.error}", flush=True)
                else:
                    print(
                        f"  shape {shape:>7} c{concurrency:<3} {m.throughput:>10.1f} infer/s  "
                        f"p50 {m.p50_us:>8.0f} us  p99 {m.p99_us:>8.0f} us",
                        flush=True,
                    )
    return results


# report -------------------------------------------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if numerator > 0 and denominator > 0 else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec) + "x"


def build_rows(
    shapes: Sequence[int],
    concurrencies: Sequence[int],
    pyserve: dict[tuple[int, int], Measurement],
    pytriton: dict[tuple[int, int], Measurement] | None,
    floor: dict[tuple[int, int], Measurement] | None = None,
) -> list[dict[str, Any]]:
    """One JSON-able row per shape x concurrency, with ratios to PyTriton and to the floor when they were measured."""
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        for concurrency in concurrencies:
            ours = pyserve[(shape, concurrency)]
            row: dict[str, Any] = {
                "shape": shape,
                "concurrency": concurrency,
                "pyserve": dataclasses.asdict(ours),
            }
            if pytriton is not None:
                theirs = pytriton[(shape, concurrency)]
                row["pytriton"] = dataclasses.asdict(theirs)
                row["throughput_ratio"] = _ratio(ours.throughput, theirs.throughput)
                row["p50_ratio"] = _ratio(ours.p50_us, theirs.p50_us)
            if floor is not None:
                bare = floor[(shape, concurrency)]
                row["floor"] = dataclasses.asdict(bare)
                row["floor_p50_ratio"] = _ratio(ours.p50_us, bare.p50_us)
                row["floor_throughput_ratio"] = _ratio(ours.throughput, bare.throughput)
            rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]], with_pytriton: bool, with_floor: bool = False) -> str:
    """A fixed-width text table of the rows; latencies in ms."""
    header = ["shape", "conc", "pyserve inf/s", "p50 ms", "p99 ms"]
    if with_pytriton:
        header += ["PyTriton inf/s", "p50 ms", "p99 ms", "thr ratio", "p50 ratio"]
    if with_floor:
        header += ["floor inf/s", "p50 ms", "p99 ms", "p50 / floor"]
    lines: list[list[str]] = []

    def cells(m: dict[str, Any]) -> list[str]:
        if m["error"]:
            return ["FAILED", "-", "-"]
        mark = "*" if m["retried"] else ""
        return [f"{m['throughput']:.1f}{mark}", f"{m['p50_us'] / 1000:.3f}", f"{m['p99_us'] / 1000:.3f}"]

    for row in rows:
        line = [str(row["shape"]), str(row["concurrency"]), *cells(row["pyserve"])]
        if with_pytriton:
            line += cells(row["pytriton"])
            line += [_fmt(row["throughput_ratio"], ".2f"), _fmt(row["p50_ratio"], ".2f")]
        if with_floor:
            line += [*cells(row["floor"]), _fmt(row["floor_p50_ratio"], ".2f")]
        lines.append(line)
    return text_table(header, lines, align_left=0)


def target_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The project's targets (16 floats over HTTP) against PyTriton and the bare floor, where both were measured."""
    by_key = {(row["shape"], row["concurrency"]): row for row in rows}
    checks = (
        ((16, 16), "throughput_ratio", ">=", 3.0, "pyserve/PyTriton throughput, 16 floats, c16"),
        ((16, 1), "p50_ratio", "<=", 0.2, "pyserve/PyTriton p50, 16 floats, c1"),
        ((16, 1), "floor_p50_ratio", "<=", 3.0, "pyserve/bare-floor p50, 16 floats, c1"),
    )
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


# CLI ----------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pytriton", action="store_true", help="also benchmark PyTriton 0.7.0 and print ratios")
    parser.add_argument(
        "--floor", action="store_true", help="also measure the bare httptools server (no model, no hop) as the floor"
    )
    parser.add_argument(
        "--duration-ms", type=int, default=2000, help="perf_analyzer measurement window (-p), ms (default 2000)"
    )
    parser.add_argument("--shapes", type=int_list, default=[16, 262144], help="INPUT0 lengths (default 16,262144)")
    parser.add_argument("--concurrency", type=int_list, default=[1, 4, 16], help="concurrencies (default 1,4,16)")
    args = parse_perf_analyzer_args(parser, argv)
    return args


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 1 on failure, 130 on interrupt."""
    args = parse_args(argv)
    perf_analyzer = find_perf_analyzer(args.perf_analyzer)
    pytriton_python = ensure_pytriton_venv() if args.pytriton else None
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        floor = None
        if args.floor:
            floor_spec = with_server_script(pyserve_spec(), BENCH_DIR / "http_floor_server.py", [], [MODEL_NAME])
            floor_spec = dataclasses.replace(floor_spec, name="bare httptools floor")
            floor = run_matrix(floor_spec, work / "floor.log", perf_analyzer, args)
        pyserve = run_matrix(pyserve_spec(), work / "pyserve.log", perf_analyzer, args)
        pytriton = None
        if pytriton_python is not None:
            home = work / "pytriton-home"
            home.mkdir()
            pytriton = run_matrix(pytriton_spec(pytriton_python, home), work / "pytriton.log", perf_analyzer, args)
        elapsed = time.monotonic() - started

    rows = build_rows(args.shapes, args.concurrency, pyserve, pytriton, floor)
    print()
    print(
        f"perf_analyzer over HTTP, model {MODEL_NAME}, measurement window {args.duration_ms} ms, "
        f"time_windows mode; total {elapsed:.0f} s"
    )
    print(format_table(rows, pytriton is not None, floor is not None))
    if any(m.error is None and m.retried for results in (pyserve, pytriton or {}) for m in results.values()):
        threshold = args.stability_percentage or 10
        print(f"* unstable at -s {threshold:g}; measured on a retry with perf_analyzer -s {args.retry_stability:g}")
    if pytriton is not None or floor is not None:
        print()
        print("\n".join(target_lines(rows)))
    if args.json is not None:
        report = {
            "model": MODEL_NAME,
            "protocol": "http",
            **perf_settings(args, perf_analyzer),
            "rows": rows,
        }
        write_report(args.json, report)
    failed = any(m.error for results in (pyserve, pytriton or {}, floor or {}) for m in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
