"""Benchmark stateful models: 64 concurrent sequences on the ``direct`` and ``oldest`` strategies, against the
same accumulator written as a plain function that ships its state through the client at every step.

Run from the repository root::

    .venv/bin/python benchmarks/bench_sequence.py [--state-floats 16,16384] [--sequence-length 100] \\
        [--concurrency 64] [--protocol http] [--repeat 3] [--duration-ms 2000] [--perf-analyzer PATH] [--json PATH]

It starts ``sequence_server.py`` (the models are described there) and runs perf_analyzer against each model at
``--concurrency`` concurrent requests: for the sequence models that is as many concurrent sequences (perf_analyzer's
sequence mode: ``--sequence-length`` steps each, START and END flags, a correlation ID per sequence), for the
stateless one as many clients sending ``INPUT`` and the ``STATE`` of N floats and getting ``STATE_OUT`` back. It
prints per model the steps per second, p50 and p99 latency per step, the mean batch the server formed, and each
throughput against the stateless model's at the same state size (what keeping the state in the instance saves).
With ``--repeat N`` the models are measured N times, in turns (a machine's drift then touches them alike), and the
run with the median throughput of each is reported.

Numbers are printed, not asserted: the exit status is 1 only when a measurement failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sequence_server as models
from _common import (
    Measurement,
    PerfRun,
    bench_main,
    cpu_busy_fraction,
    execution_counts,
    find_perf_analyzer,
    format_table,
    int_list,
    parse_perf_analyzer_args,
    perf_settings,
    pyserve_spec,
    run_perf_analyzer,
    running_server,
    with_server_script,
    write_report,
)

SERVER_SCRIPT = Path(models.__file__).resolve()
STRATEGY = {"seq_direct": "direct", "seq_oldest": "oldest", "seq_python": "direct, @sequence", "stateless": "-"}


@dataclasses.dataclass(frozen=True)
class SequenceRun(PerfRun):
    """A perf_analyzer run with more options (the sequence ones)."""

    extra: tuple[str, ...] = ()

    def command(self, perf_analyzer: str, url: str, csv_path: Path, stability: float | None) -> list[str]:
        return [*super().command(perf_analyzer, url, csv_path, stability), *self.extra]


@dataclasses.dataclass(frozen=True)
class Result:
    """One model measured: its state size, perf_analyzer's numbers and the mean batch the server formed."""

    model: str
    kind: str
    state_floats: int
    measurement: Measurement
    mean_batch: float | None


def measure(perf_analyzer: str, url: str, kind: str, size: int, args: argparse.Namespace) -> Result:
    """Run perf_analyzer against one model, reading its statistics around the run for the mean batch."""
    model = f"{kind}_{size}"
    shapes = ["INPUT:1"]
    extra: tuple[str, ...] = ()
    if kind == "stateless":
        shapes.append(f"STATE:{size}")
    else:
        extra = ("--sequence-length", str(args.sequence_length), "--num-of-sequences", str(args.concurrency))
    run = SequenceRun.from_args(args, model, shapes, args.concurrency, protocol=args.protocol, extra=extra)
    http_url = f"127.0.0.1:{args.http_port}"
    before = execution_counts(http_url, model)
    measurement = run_perf_analyzer(perf_analyzer, url, run)
    after = execution_counts(http_url, model)
    executions = after[1] - before[1]
    mean_batch = (after[0] - before[0]) / executions if executions > 0 else None
    result = Result(model, kind, size, measurement, mean_batch)
    m = measurement
    if m.error:
        print(f"  {model:<20} FAILED: {m.error}", flush=True)
    else:
        batch = "-" if mean_batch is None else f"{mean_batch:.1f}"
        print(
            f"  {model:<20} {m.throughput:>9.1f} steps/s  p50 {m.p50_us / 1000:>6.2f} ms  "
            f"p99 {m.p99_us / 1000:>6.2f} ms  mean batch {batch}",
            flush=True,
        )
    return result


def median_run(runs: list[Result]) -> Result:
    """The run with the median throughput (a failed run counts as the lowest); the first failure if all failed."""
    ordered = sorted(runs, key=lambda r: -1.0 if r.measurement.error else r.measurement.throughput)
    return ordered[len(ordered) // 2]


def table(results: list[Result]) -> str:
    """The results, with each model's throughput against the stateless model's at the same state size."""
    stateless = {r.state_floats: r.measurement.throughput for r in results if r.kind == "stateless"}
    rows = []
    for r in results:
        m = r.measurement
        if m.error:
            rows.append([r.model, STRATEGY[r.kind], str(r.state_floats), "FAILED", "", "", "", ""])
            continue
        base = stateless.get(r.state_floats) or 0
        ratio = f"{m.throughput / base:.2f}x" if base else "-"
        rows.append(
            [
                r.model,
                STRATEGY[r.kind],
                str(r.state_floats),
                f"{m.throughput:.0f}",
                f"{m.p50_us / 1000:.2f}",
                f"{m.p99_us / 1000:.2f}",
                "-" if r.mean_batch is None else f"{r.mean_batch:.1f}",
                ratio,
            ]
        )
    header = ["model", "strategy", "state floats", "steps/s", "p50 ms", "p99 ms", "mean batch", "vs stateless"]
    return format_table(header, rows, align_left=2)


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-floats", type=int_list, default=[16, 16384], help="state sizes (FP32 elements)")
    parser.add_argument("--sequence-length", type=int, default=100, help="steps per sequence")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent sequences (and stateless clients)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--repeat", type=int, default=1, help="measure each model this many times, in turns")
    parser.add_argument("--duration-ms", type=int, default=2000, help="perf_analyzer measurement window")
    args = parse_perf_analyzer_args(parser, argv)
    perf_analyzer = find_perf_analyzer(args.perf_analyzer)
    sizes: list[int] = args.state_floats
    spec = with_server_script(
        pyserve_spec(), SERVER_SCRIPT, ["--state-floats", ",".join(map(str, sizes))], models.model_names(sizes)
    )
    args.http_port = spec.http_port
    busy = cpu_busy_fraction()
    print(f"CPU busy before the runs: {'unknown' if busy is None else f'{busy:.0%}'}", flush=True)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bench-sequence-") as tmp:
        print("starting pyserve ...", flush=True)
        started = time.monotonic()
        with running_server(spec, Path(tmp) / "server.log") as http_url:
            print(f"  ready in {time.monotonic() - started:.1f} s", flush=True)
            url = http_url if args.protocol == "http" else f"127.0.0.1:{spec.grpc_port}"
            runs: dict[str, list[Result]] = {}
            for _ in range(max(args.repeat, 1)):
                for size in sizes:
                    for kind in models.KINDS:
                        result = measure(perf_analyzer, url, kind, size, args)
                        runs.setdefault(result.model, []).append(result)
            results = [median_run(model_runs) for model_runs in runs.values()]
    print()
    print(
        f"{args.concurrency} concurrent sequences of {args.sequence_length} steps, {args.protocol}, "
        f"max_batch_size {models.MAX_BATCH}, one thread instance; median of {max(args.repeat, 1)} run(s)"
    )
    print(table(results))
    if args.json is not None:
        report: dict[str, Any] = {
            "settings": {
                **perf_settings(args, perf_analyzer),
                "state_floats": sizes,
                "sequence_length": args.sequence_length,
                "concurrency": args.concurrency,
                "protocol": args.protocol,
                "repeat": args.repeat,
            },
            "results": [
                {
                    "model": r.model,
                    "state_floats": r.state_floats,
                    "mean_batch": r.mean_batch,
                    **dataclasses.asdict(r.measurement),
                }
                for r in results
            ],
        }
        write_report(args.json, report)
    return 1 if any(r.measurement.error for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
