"""What an ensemble saves over calling its steps one by one from a client, in the same run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_ensemble.py [--duration-s 4] [--rounds 3] [--concurrency 1,16] [--json PATH]

It starts ``ensemble_server.py`` (the sentiment pipeline of ``examples/pipeline``: ``tokenize`` → ``score`` →
``label``, and the ensemble ``sentiment`` chaining them in the server) and drives it with the same Python client
(tritonclient over HTTP, binary tensors) in two ways, alternating, at each concurrency:

- **ensemble**: one request to ``sentiment`` per text;
- **chained**: ``tokenize``, then ``score`` on its output, then ``label`` on that — three round trips per text.

Each way keeps ``C`` pipelines in flight (threads spread over up to 4 client processes, so the client's GIL does not
cap concurrency 16), for ``--duration-s`` per round, ``--rounds`` rounds each in alternating order. It reports
pipelines/s and p50/p99 latency of a whole pipeline (medians over the rounds), the ensemble's gain (p50 saved, in ms
and as a ratio; throughput ratio) and whether the target is met: the ensemble faster (lower p50 and higher
throughput) at every concurrency. With perf_analyzer available it also measures the ensemble with it (zero errors
expected) for the server-side view. Targets are printed, not asserted: the exit status is 1 only when a measurement
failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ensemble_server
from _common import (
    BenchError,
    Check,
    PerfRun,
    bench_main,
    find_perf_analyzer,
    format_checks,
    format_table,
    pyserve_spec,
    run_perf_analyzer,
    running_server,
    with_server_script,
)

SERVER_SCRIPT = Path(ensemble_server.__file__).resolve()
ENSEMBLE = "sentiment"
MAX_CLIENT_PROCESSES = 4
TEXTS = (
    b"I love this, what a wonderful day",
    b"This was boring and awful, the worst film in years",
    b"The train leaves at nine from platform two",
    b"Not bad at all, quite nice actually",
)
MODES = ("ensemble", "chained")


@dataclasses.dataclass(frozen=True)
class Round:
    """One timed run of one mode at one concurrency: every pipeline's latency (s) and the wall time."""

    mode: str
    concurrency: int
    latencies: list[float]
    seconds: float
    errors: int

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


# client side (runs in the client processes) ------------------------------------------------------------------------


def _pipeline(client: Any, mode: str, text: Any) -> Any:
    import numpy as np
    import tritonclient.http as httpclient

    def tensor(name: str, value: Any, datatype: str) -> Any:
        inferred = httpclient.InferInput(name, list(value.shape), datatype)
        inferred.set_data_from_numpy(value)
        return inferred

    if mode == "ensemble":
        return client.infer(ENSEMBLE, [tensor("TEXT", text, "BYTES")]).as_numpy("LABEL")
    counts = client.infer("tokenize", [tensor("text", text, "BYTES")]).as_numpy("counts")
    logits = client.infer("score", [tensor("counts", counts.astype(np.float32), "FP32")]).as_numpy("logits")
    return client.infer("label", [tensor("logits", logits, "FP32")]).as_numpy("label")


def drive(url: str, mode: str, threads: int, start_at: float, duration_s: float) -> tuple[list[float], int]:
    """Run ``threads`` pipelines back to back each from ``start_at`` (time.time) for ``duration_s``."""
    import numpy as np
    import tritonclient.http as httpclient

    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def loop(index: int) -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60.0)
        text = np.array([[TEXTS[index % len(TEXTS)]]], dtype=object)
        mine: list[float] = []
        time.sleep(max(0.0, start_at - time.time()))
        end = time.perf_counter() + duration_s
        while True:
            started = time.perf_counter()
            if started >= end:
                break
            try:
                _pipeline(client, mode, text)
            except Exception:
                with lock:
                    errors[0] += 1
                continue
            mine.append(time.perf_counter() - started)
        client.close()
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return latencies, errors[0]


def check_same_answers(url: str) -> None:
    """Both ways give the same labels (a wrong pipeline would make the comparison meaningless)."""
    import numpy as np
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    for value in TEXTS:
        text = np.array([[value]], dtype=object)
        ensemble, chained = (_pipeline(client, mode, text).tolist() for mode in MODES)
        if ensemble != chained:
            raise BenchError(f"ensemble and chained calls disagree on {value!r}: {ensemble} vs {chained}")
    client.close()


# driver ------------------------------------------------------------------------------------------------------------


def measure(pool: concurrent.futures.Executor, url: str, mode: str, concurrency: int, duration_s: float) -> Round:
    processes = min(concurrency, MAX_CLIENT_PROCESSES)
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    start_at = time.time() + 1.0  # every process has started its threads by then
    futures = [pool.submit(drive, url, mode, threads, start_at, duration_s) for threads in shares]
    latencies: list[float] = []
    errors = 0
    for future in futures:
        mine, failed = future.result(timeout=duration_s + 120)
        latencies.extend(mine)
        errors += failed
    result = Round(mode, concurrency, latencies, duration_s, errors)
    p50_ms, p99_ms = result.percentile(0.5) * 1e3, result.percentile(0.99) * 1e3
    print(
        f"  {mode:<8} c{concurrency:<3} {result.throughput:>8.1f} pipelines/s  p50 {p50_ms:>6.2f} ms  "
        f"p99 {p99_ms:>6.2f} ms  errors {errors}",
        flush=True,
    )
    return result


def summarize(rounds: list[Round], concurrency: int, mode: str) -> dict[str, float]:
    mine = [r for r in rounds if r.concurrency == concurrency and r.mode == mode]
    return {
        "throughput": statistics.median(r.throughput for r in mine),
        "p50_ms": statistics.median(r.percentile(0.5) for r in mine) * 1e3,
        "p99_ms": statistics.median(r.percentile(0.99) for r in mine) * 1e3,
        "errors": sum(r.errors for r in mine),
    }


def _perf_analyzer(explicit: str | None) -> str | None:
    try:
        return find_perf_analyzer(explicit)
    except BenchError as exc:
        print(f"skipping perf_analyzer: {exc}", flush=True)
        return None


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=4.0, help="length of one round (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per way and concurrency (default 3)")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated (default 1,16)")
    parser.add_argument("--perf-analyzer", default=None, help="perf_analyzer binary (default: .tools/pa)")
    parser.add_argument("--no-perf-analyzer", action="store_true", help="skip the perf_analyzer run")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    spec = with_server_script(pyserve_spec(), SERVER_SCRIPT, [], ensemble_server.MODELS)
    rounds: list[Round] = []
    perf: dict[int, Any] = {}
    failed = False
    context = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory(prefix="bench-ensemble-") as tmp,
        concurrent.futures.ProcessPoolExecutor(MAX_CLIENT_PROCESSES, mp_context=context) as pool,
        running_server(spec, Path(tmp) / "server.log") as url,
    ):
        check_same_answers(url)
        print(f"pyserve at {url}: warming up", flush=True)
        for mode in MODES:
            measure(pool, url, mode, max(levels), 1.0)
        for concurrency in levels:
            for index in range(args.rounds):
                for mode in MODES if index % 2 == 0 else MODES[::-1]:
                    rounds.append(measure(pool, url, mode, concurrency, args.duration_s))
        perf_analyzer = None if args.no_perf_analyzer else _perf_analyzer(args.perf_analyzer)
        if perf_analyzer is not None:
            for concurrency in levels:
                run = PerfRun(ENSEMBLE, ("TEXT:1",), concurrency, window_ms=2000, stability=25.0)
                perf[concurrency] = run_perf_analyzer(perf_analyzer, url, run)
                failed = failed or perf[concurrency].error is not None
    rows: list[list[str]] = []
    checks: list[Check] = []
    results: dict[str, Any] = {"rounds": args.rounds, "duration_s": args.duration_s, "levels": {}}
    for concurrency in levels:
        ensemble, chained = (summarize(rounds, concurrency, mode) for mode in MODES)
        failed = failed or bool(ensemble["errors"] or chained["errors"])
        for mode, numbers in (("ensemble", ensemble), ("chained", chained)):
            rows.append(
                [
                    f"c{concurrency}",
                    mode,
                    f"{numbers['throughput']:.1f}",
                    f"{numbers['p50_ms']:.2f}",
                    f"{numbers['p99_ms']:.2f}",
                    str(int(numbers["errors"])),
                ]
            )
        saved = chained["p50_ms"] - ensemble["p50_ms"]
        speedup = chained["p50_ms"] / ensemble["p50_ms"] if ensemble["p50_ms"] else 0.0
        gain = ensemble["throughput"] / chained["throughput"] if chained["throughput"] else 0.0
        checks.append(
            Check(
                f"c{concurrency}: ensemble vs chained, p50",
                f"{ensemble['p50_ms']:.2f} vs {chained['p50_ms']:.2f} ms: {saved:.2f} ms saved ({speedup:.2f}x)",
                "ensemble lower",
                saved > 0,
            )
        )
        checks.append(
            Check(
                f"c{concurrency}: ensemble vs chained, throughput",
                f"{ensemble['throughput']:.0f} vs {chained['throughput']:.0f} pipelines/s ({gain:.2f}x)",
                "ensemble higher",
                gain > 1,
            )
        )
        level: dict[str, Any] = {"ensemble": ensemble, "chained": chained, "p50_saved_ms": saved}
        level["p50_ratio"] = speedup
        level["throughput_ratio"] = gain
        measured = perf.get(concurrency)
        if measured is not None:
            level["perf_analyzer"] = dataclasses.asdict(measured)
            value = (
                f"FAILED: {measured.error}"
                if measured.error
                else f"{measured.throughput:.0f} infer/s, p50 {measured.p50_us / 1000:.2f} ms"
            )
            checks.append(
                Check(f"c{concurrency}: perf_analyzer on the ensemble", value, "no errors", not measured.error)
            )
        results["levels"][str(concurrency)] = level
    print()
    header = ["concurrency", "way", "pipelines/s", "p50 ms", "p99 ms", "errors"]
    print(format_table(header, rows, align_left=2))
    print()
    print(format_checks(checks))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
