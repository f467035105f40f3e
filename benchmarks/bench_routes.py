"""A Flask-compatible custom route against the same model over KServe v2, and against the original Flask app.

Run from the repository root::

    .venv/bin/python benchmarks/bench_routes.py [--duration 5] [--warmup 1] [--rounds 2] [--concurrency 1,32]
                                                 [--json PATH]

The three servers of ``examples/from_flask`` (``compare.py``'s apps and client, so the numbers compare with its):

- ``Flask``: ``flask_app.py``, the original: Flask's threaded server runs the model in each request's thread;
- ``route``: ``routes_app.py``, the same ``POST /predict`` JSON served by ``@server.route`` (uvicorn + Starlette in
  the ``Serve`` process), the handler calling the model through ``await server.ainfer``;
- ``pyserve``: ``pyserve_app.py``, the same model called over KServe v2 on pyserve's HTTP port.

The route and KServe serve one model the same way (a thread instance in the ``Serve`` process, dynamic batching);
what differs is the path: KServe requests reach the core directly, a route's request is parsed in the ``Serve``
process and goes to the core and back through the in-process API (one more process hop) before its instance runs.
Each cell is ``--rounds`` runs of ``--duration`` seconds, the apps taking turns, latencies pooled.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, bench_main, write_report

sys.path.insert(0, str(REPO_ROOT / "examples" / "from_flask"))

import compare  # examples/from_flask, put on the path above

APPS = ("flask", "route", "pyserve")


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each run (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per cell, the apps taking turns (default 2)")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated concurrencies (default 1,32)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    concurrencies = [int(part) for part in args.concurrency.split(",")]
    apps = [compare.APPS[name](compare.free_port()) for name in APPS]
    results: dict[tuple[int, str], compare.LoadResult] = {}
    with compare.running(apps):
        compare.check_same_answers(apps)
        for concurrency in concurrencies:
            runs: dict[str, list[compare.LoadResult]] = {app.name: [] for app in apps}
            for _ in range(args.rounds):
                for app in apps:
                    runs[app.name].append(compare.drive(app, concurrency, args.duration, args.warmup))
            for name, measured in runs.items():
                results[(concurrency, name)] = _pooled(measured)
                result = results[(concurrency, name)]
                print(
                    f"  {name:<8} c{concurrency:<3} {result.throughput:>8.0f} req/s  p50 {result.percentile_ms(50):.2f}"
                    f" ms  p99 {result.percentile_ms(99):.2f} ms  errors {result.errors}",
                    flush=True,
                )
    names = [app.name for app in apps]
    print()
    print(f"{args.rounds} x {args.duration:g} s per cell; one client process (compare.py's), JSON both ways")
    print(compare.format_report(results, concurrencies, names))
    for concurrency in concurrencies:
        route, kserve = results[(concurrency, "route")], results[(concurrency, "pyserve")]
        hop_ms = route.percentile_ms(50) - kserve.percentile_ms(50)
        print(
            f"c{concurrency}: the route answers at {route.throughput / kserve.throughput:.2f}x KServe's throughput, "
            f"its p50 {hop_ms:+.2f} ms"
        )
    if args.json:
        report: dict[str, Any] = {
            f"c{concurrency}/{name}": {
                "throughput": result.throughput,
                "p50_ms": result.percentile_ms(50),
                "p99_ms": result.percentile_ms(99),
                "mean_batch": result.mean_batch,
                "errors": result.errors,
            }
            for (concurrency, name), result in results.items()
        }
        write_report(args.json, report)
    return 1 if any(result.errors for result in results.values()) else 0


def _pooled(runs: list[compare.LoadResult]) -> compare.LoadResult:
    batches = [run.mean_batch for run in runs if run.mean_batch is not None]
    return compare.LoadResult(
        latencies_s=tuple(latency for run in runs for latency in run.latencies_s),
        errors=sum(run.errors for run in runs),
        duration_s=sum(run.duration_s for run in runs),
        mean_batch=sum(batches) / len(batches) if batches else None,
    )


if __name__ == "__main__":
    sys.exit(main())
