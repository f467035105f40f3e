"""Benchmark pyserve's dynamic batcher and instances (and optionally PyTriton's batcher) with perf_analyzer.

Run from the repository root::

    .venv/bin/python benchmarks/bench_batching.py [--pytriton] [--quick] [--perf-analyzer PATH] [--json PATH]

It starts ``batching_server.py`` (pyserve, then PyTriton with ``--pytriton``; never both at once) and measures:

1. batching efficiency: ``cost_model`` (20 ms + 0.5 ms per row, ``max_batch_size=32``, no queue delay) at
   concurrency 64, against the throughput that cost model allows one instance (32 rows per 36 ms); the mean batch
   size the server formed (inference_count / execution_count of its statistics, as a delta around the run);
2. parallel instances: a pure-Python CPU-bound model (no batching) with 1 and 2 process instances, and with 1 and
   2 thread instances for contrast, at concurrency 8;
3. the batcher's own overhead: p50 latency at concurrency 1 of an identity model with the default
   ``DynamicBatcher()`` against the same model with ``batcher=None``, in alternating repetitions;
4. with ``--pytriton``: the cost model under PyTriton's dynamic batcher with the same settings.

Ratios and targets are printed, not asserted: the exit status is 1 only when a measurement failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import batching_server as models
from _common import (
    BenchError,
    Check,
    Measurement,
    PerfRun,
    ServerSpec,
    bench_main,
    cpu_busy_fraction,
    ensure_pytriton_venv,
    execution_counts,
    find_perf_analyzer,
    format_checks,
    format_table,
    pyserve_spec,
    pytriton_spec,
    run_perf_analyzer,
    running_server,
    with_server_script,
    write_report,
)

SERVER_SCRIPT = Path(models.__file__).resolve()
INPUT_SHAPE = "INPUT0:16"
BATCHING_CONCURRENCY = 64
INSTANCES_CONCURRENCY = 8
LOOP_TARGET_MS = 4.0
EFFICIENCY_TARGET = 0.90
INSTANCES_TARGET = 1.6
OVERHEAD_TARGET = 1.10
BUSY_WARNING = 0.15  # CPU busy before start above which the numbers are suspect


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long to measure: perf_analyzer windows (ms) and the number of overhead repetitions."""

    window_ms: int
    batching_window_ms: int  # longer: a window holds few batches of 36 ms
    overhead_window_ms: int
    overhead_reps: int


FULL = Plan(window_ms=2000, batching_window_ms=4000, overhead_window_ms=1000, overhead_reps=5)
QUICK = Plan(window_ms=1000, batching_window_ms=2000, overhead_window_ms=500, overhead_reps=2)


@dataclasses.dataclass(frozen=True)
class Result:
    """One perf_analyzer run against one model, with the mean batch size the server formed during it."""

    server: str
    model: str
    concurrency: int
    measurement: Measurement
    mean_batch: float | None

    @property
    def ok(self) -> bool:
        return self.measurement.error is None


def ideal_throughput() -> float:
    """Rows/s one instance of the cost model can do at best: full batches back to back."""
    batch = models.COST_MODEL_MAX_BATCH
    return batch / (models.FIXED_COST_S + models.PER_ROW_COST_S * batch)


def calibrate_loop_iterations(target_ms: float) -> int:
    """Loop iterations that take about ``target_ms`` of CPU in this interpreter (best of a few runs)."""
    probe = 50_000
    best = min(_timed(models.burn, probe) for _ in range(5))
    return max(1, round(probe * target_ms / 1000 / best))


def _timed(function: Any, argument: int) -> float:
    started = time.perf_counter()
    function(argument)
    return time.perf_counter() - started


def measure(server: str, perf_analyzer: str, url: str, run: PerfRun) -> Result:
    """Run perf_analyzer once; read the model's statistics before and after for the mean batch size."""
    before = _counts(server, url, run.model)
    measurement = run_perf_analyzer(perf_analyzer, url, run)
    after = _counts(server, url, run.model)
    executions = after[1] - before[1]
    mean_batch = (after[0] - before[0]) / executions if executions > 0 else None
    result = Result(server, run.model, run.concurrency, measurement, mean_batch)
    _print_result(result)
    return result


def _counts(server: str, url: str, model: str) -> tuple[int, int]:
    try:
        return execution_counts(url, model)
    except (OSError, ValueError, KeyError) as exc:
        raise BenchError(f"{server}: statistics of '{model}' unreadable: {exc!r}") from exc


def _print_result(result: Result) -> None:
    m = result.measurement
    where = f"  {result.server:<8} {result.model:<20} c{result.concurrency:<3}"
    if m.error:
        print(f"{where} FAILED: {m.error}", flush=True)
        return
    batch = "-" if result.mean_batch is None else f"{result.mean_batch:.1f}"
    print(
        f"{where} {m.throughput:>9.1f} infer/s  p50 {m.p50_us / 1000:>7.2f} ms  p99 {m.p99_us / 1000:>7.2f} ms  "
        f"mean batch {batch}",
        flush=True,
    )


def run_pyserve(perf_analyzer: str, plan: Plan, loop_iterations: int, log_path: Path) -> list[Result]:
    """Start pyserve with every model and run the batching, instances and overhead measurements."""
    spec = with_server_script(
        pyserve_spec(),
        SERVER_SCRIPT,
        ["--backend", "pyserve", "--loop-iterations", str(loop_iterations)],
        models.PYSERVE_MODELS,
    )
    results: list[Result] = []
    with _started(spec, log_path) as url:
        results.append(measure("pyserve", perf_analyzer, url, _cost_run(plan)))
        for worker in ("process", "thread"):
            for instances in (1, 2):
                run = PerfRun(
                    f"cpu_loop_{worker}_{instances}", (INPUT_SHAPE,), INSTANCES_CONCURRENCY, window_ms=plan.window_ms
                )
                results.append(measure("pyserve", perf_analyzer, url, run))
        for rep in range(plan.overhead_reps):
            # Alternate which goes first, so a drift in the machine's speed does not favour either.
            order = models.IDENTITY_MODELS if rep % 2 == 0 else models.IDENTITY_MODELS[::-1]
            for model in order:
                run = PerfRun(model, (INPUT_SHAPE,), 1, window_ms=plan.overhead_window_ms)
                results.append(measure("pyserve", perf_analyzer, url, run))
    return results


def run_pytriton(perf_analyzer: str, plan: Plan, log_path: Path, home: Path) -> list[Result]:
    """Start PyTriton with the cost model and run the batching measurement."""
    python = ensure_pytriton_venv()
    spec = with_server_script(
        pytriton_spec(python, home), SERVER_SCRIPT, ["--backend", "pytriton"], models.PYTRITON_MODELS
    )
    with _started(spec, log_path) as url:
        return [measure("PyTriton", perf_analyzer, url, _cost_run(plan))]


def _cost_run(plan: Plan) -> PerfRun:
    return PerfRun(models.COST_MODEL, (INPUT_SHAPE,), BATCHING_CONCURRENCY, window_ms=plan.batching_window_ms)


@contextlib.contextmanager
def _started(spec: ServerSpec, log_path: Path) -> Iterator[str]:
    """``running_server`` with a line on start-up time."""
    print(f"starting {spec.name} (http port {spec.http_port}) ...", flush=True)
    started = time.monotonic()
    with running_server(spec, log_path) as url:
        print(f"  ready in {time.monotonic() - started:.1f} s", flush=True)
        yield url


# report ---------------------------------------------------------------------------------------------------------


def _find(results: Sequence[Result], server: str, model: str) -> list[Result]:
    return [r for r in results if r.server == server and r.model == model]


def _failed(label: str, result: Result | None, target: str = "-") -> Check:
    error = "not measured" if result is None else f"FAILED ({result.measurement.error})"
    return Check(label, error[:60], target, None)


def batching_checks(results: Sequence[Result], server: str) -> list[Check]:
    """Throughput against the cost model's ideal, mean batch size, latencies. The target is pyserve's only."""
    found = _find(results, server, models.COST_MODEL)
    ideal = ideal_throughput()
    label = f"{server}: batching throughput (c{BATCHING_CONCURRENCY})"
    has_target = server == "pyserve"
    target = (
        f">= {EFFICIENCY_TARGET * ideal:.0f} rows/s ({EFFICIENCY_TARGET:.0%} of {ideal:.0f})" if has_target else "-"
    )
    if not found or not found[0].ok:
        return [_failed(label, found[0] if found else None, target)]
    result = found[0]
    m = result.measurement
    efficiency = m.throughput / ideal
    batch = "-" if result.mean_batch is None else f"{result.mean_batch:.1f}"
    return [
        Check(
            label,
            f"{m.throughput:.0f} rows/s ({efficiency:.1%} of {ideal:.0f})",
            target,
            efficiency >= EFFICIENCY_TARGET if has_target else None,
        ),
        Check(f"{server}: mean batch size", f"{batch} of {models.COST_MODEL_MAX_BATCH}"),
        Check(f"{server}: p50 / p99 latency", f"{m.p50_us / 1000:.1f} / {m.p99_us / 1000:.1f} ms"),
    ]


def instance_checks(results: Sequence[Result]) -> list[Check]:
    """2 instances against 1, for process workers (with a target) and thread workers (for contrast)."""
    checks = []
    for worker, target, bound in (("process", f">= {INSTANCES_TARGET:.1f}x", INSTANCES_TARGET), ("thread", "-", None)):
        label = f"pyserve: 2 {worker} / 1 {worker} instance throughput (c{INSTANCES_CONCURRENCY})"
        one = _find(results, "pyserve", f"cpu_loop_{worker}_1")
        two = _find(results, "pyserve", f"cpu_loop_{worker}_2")
        if not (one and two and one[0].ok and two[0].ok):
            bad = next((r[0] for r in (one, two) if r and not r[0].ok), None)
            checks.append(_failed(label, bad, target))
            continue
        single, double = one[0].measurement.throughput, two[0].measurement.throughput
        ratio = double / single
        value = f"{ratio:.2f}x ({double:.0f} vs {single:.0f} infer/s)"
        checks.append(Check(label, value, target, None if bound is None else ratio >= bound))
    return checks


def overhead_pairs(results: Sequence[Result]) -> list[tuple[float, float]]:
    """(p50 with the batcher, p50 without) in µs for each repetition where both runs succeeded."""
    with_batcher, without = (_find(results, "pyserve", model) for model in models.IDENTITY_MODELS)
    return [
        (a.measurement.p50_us, b.measurement.p50_us)
        for a, b in zip(with_batcher, without, strict=False)
        if a.ok and b.ok and b.measurement.p50_us > 0
    ]


def overhead_checks(results: Sequence[Result]) -> list[Check]:
    """p50 with the batcher against without it, at concurrency 1: the median of the repetitions' ratios.

    Each repetition runs the two models back to back, so a ratio within a repetition is not moved by a slow drift
    of the machine, and the median ignores a repetition disturbed by something else running.
    """
    label = "pyserve: p50 batcher / no batcher (c1)"
    target = f"<= {OVERHEAD_TARGET:.2f}x"
    pairs = overhead_pairs(results)
    if not pairs:
        failed = next((r for r in results if r.model in models.IDENTITY_MODELS and not r.ok), None)
        return [_failed(label, failed, target)]
    ratio = statistics.median(a / b for a, b in pairs)
    with_batcher = statistics.median(a for a, _ in pairs) / 1000
    without = statistics.median(b for _, b in pairs) / 1000
    value = f"{ratio:.3f}x (p50 {with_batcher:.3f} / {without:.3f} ms, median of {len(pairs)} pairs)"
    return [Check(label, value, target, ratio <= OVERHEAD_TARGET)]


def comparison_checks(results: Sequence[Result]) -> list[Check]:
    """pyserve against PyTriton on the cost model (reported, no target)."""
    ours, theirs = _find(results, "pyserve", models.COST_MODEL), _find(results, "PyTriton", models.COST_MODEL)
    if not (ours and theirs and ours[0].ok and theirs[0].ok):
        return []
    a, b = ours[0].measurement, theirs[0].measurement
    return [
        Check("pyserve/PyTriton batching throughput", f"{a.throughput / b.throughput:.2f}x"),
        Check("pyserve/PyTriton batching p50", f"{a.p50_us / b.p50_us:.2f}x"),
    ]


def all_checks(results: Sequence[Result], with_pytriton: bool) -> list[Check]:
    """Every line of the summary table, in the order of the issue."""
    checks = batching_checks(results, "pyserve")
    checks += instance_checks(results)
    checks += overhead_checks(results)
    if with_pytriton:
        checks += batching_checks(results, "PyTriton")
        checks += comparison_checks(results)
    return checks


def runs_table(results: Sequence[Result]) -> str:
    """Every perf_analyzer run, as measured."""
    rows = []
    for r in results:
        m = r.measurement
        mark = "*" if m.retried else ""
        if m.error:
            numbers = ["FAILED", "-", "-"]
        else:
            numbers = [f"{m.throughput:.1f}{mark}", f"{m.p50_us / 1000:.3f}", f"{m.p99_us / 1000:.3f}"]
        batch = "-" if r.mean_batch is None else f"{r.mean_batch:.2f}"
        rows.append([r.server, r.model, str(r.concurrency), *numbers, batch])
    return format_table(["server", "model", "conc", "infer/s", "p50 ms", "p99 ms", "mean batch"], rows, align_left=2)


# CLI ------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pytriton", action="store_true", help="also run the cost model under PyTriton 0.7.0")
    parser.add_argument("--quick", action="store_true", help="short windows and 2 overhead repetitions (a smoke run)")
    parser.add_argument("--perf-analyzer", default=None, help="perf_analyzer binary (default .tools/pa/perf_analyzer)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    return parser.parse_args(argv)


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every measurement succeeded, 1 otherwise, 130 on interrupt."""
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    started = time.monotonic()
    perf_analyzer = find_perf_analyzer(args.perf_analyzer)
    if args.pytriton:
        ensure_pytriton_venv()
    busy = cpu_busy_fraction()
    if busy is not None and busy > BUSY_WARNING:
        print(f"warning: {busy:.0%} of the CPUs were busy before the servers started; numbers will be low")
    iterations = calibrate_loop_iterations(LOOP_TARGET_MS)
    loop_ms = min(_timed(models.burn, iterations) for _ in range(3)) * 1000
    print(f"CPU-bound model: {iterations} loop iterations per request (~{loop_ms:.1f} ms here)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        work = Path(tmp)
        results = run_pyserve(perf_analyzer, plan, iterations, work / "pyserve.log")
        if args.pytriton:
            home = work / "pytriton-home"
            home.mkdir()
            results += run_pytriton(perf_analyzer, plan, work / "pytriton.log", home)
    elapsed = time.monotonic() - started

    checks = all_checks(results, args.pytriton)
    print()
    print(
        f"perf_analyzer over HTTP, {'quick' if args.quick else 'full'} run, {os.cpu_count()} CPUs "
        f"({'?' if busy is None else format(busy, '.0%')} busy before start), total {elapsed:.0f} s"
    )
    print(runs_table(results))
    if any(r.measurement.retried for r in results):
        print("* did not stabilise at perf_analyzer's -s 10; measured on a retry with -s 25")
    print()
    print(format_checks(checks))
    if args.json is not None:
        report = {
            "plan": dataclasses.asdict(plan),
            "cpu_count": os.cpu_count(),
            "cpu_busy_before_start": busy,
            "loop_iterations": iterations,
            "ideal_rows_per_s": ideal_throughput(),
            "runs": [{**dataclasses.asdict(r), "measurement": dataclasses.asdict(r.measurement)} for r in results],
            "checks": [{**dataclasses.asdict(c), "verdict": c.verdict} for c in checks],
        }
        write_report(args.json, report)
    return 1 if any(not r.ok for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
