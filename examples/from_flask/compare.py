"""Drive the Flask app and its pyserve variants with the same Python client and print them side by side.

    python examples/from_flask/compare.py [--duration 5] [--warmup 1] [--concurrency 1,32] [--apps flask,...]

The apps (``--apps``, default ``flask,pyserve,flask-infer``; the first is the baseline of the ratios):

- ``flask``: ``flask_app.py``, the original (the model runs in each request's thread);
- ``pyserve``: ``pyserve_app.py``, the model bound to pyserve and called over KServe v2;
- ``flask-infer``: ``flask_inprocess_app.py``, the Flask app with its model call swapped for ``server.infer``;
- ``route``: ``routes_app.py``, Flask's ``/predict`` served by pyserve itself (``@server.route``).

Starts them on free loopback ports, checks that all answer the same label and score for the same features, then for
each concurrency measures each app in turn (the others idle): that many threads, each with its own keep-alive
``http.client`` connection, send JSON requests back to back for ``--duration`` seconds after ``--warmup`` seconds,
and decode every JSON answer. Prints throughput, p50 and p99 latency, the mean batch size pyserve formed, and the
ratios to the first app.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
from model import FEATURES, LABELS, predict

HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
JSON_HEADERS = {"Content-Type": "application/json"}
# Many request threads each calling a multi-threaded BLAS oversubscribe the CPUs (OpenBLAS threads spin while they
# wait): one BLAS thread per call is the usual setting for a threaded server, and the default here for both apps.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclasses.dataclass(frozen=True)
class App:
    """One server under test: how to start it, when it is ready, and how to ask it for a prediction."""

    name: str
    script: Path
    port: int
    ready_paths: tuple[str, ...]
    predict_path: str
    encode: Callable[[list[float]], bytes]
    decode: Callable[[bytes], tuple[str, float]]
    stats_path: str | None = None
    stats_port: int | None = None  # where stats_path is served, when not on ``port``
    arguments: tuple[str, ...] = ()  # more command-line arguments for the script


def _flask_body(features: list[float]) -> bytes:
    return json.dumps({"features": features}).encode()


def _flask_answer(body: bytes) -> tuple[str, float]:
    answer = json.loads(body)
    return str(answer["label"]), float(answer["score"])


def _pyserve_body(features: list[float]) -> bytes:
    tensor = {"name": "features", "datatype": "FP32", "shape": [1, len(features)], "data": features}
    return json.dumps({"inputs": [tensor]}).encode()


def _pyserve_answer(body: bytes) -> tuple[str, float]:
    outputs = {output["name"]: output["data"] for output in json.loads(body)["outputs"]}
    return str(outputs["label"][0]), float(outputs["score"][0])


def flask_app(port: int) -> App:
    """The Flask app on ``port``."""
    return App("Flask", HERE / "flask_app.py", port, ("/health",), "/predict", _flask_body, _flask_answer)


def pyserve_app(port: int) -> App:
    """The pyserve app on ``port``."""
    model = "/v2/models/classifier"
    return App(
        "pyserve",
        HERE / "pyserve_app.py",
        port,
        ("/v2/health/ready", f"{model}/ready"),
        f"{model}/infer",
        _pyserve_body,
        _pyserve_answer,
        stats_path=f"{model}/stats",
    )


def flask_inprocess_app(port: int) -> App:
    """The Flask app calling the model through ``Serve.infer``, on ``port``."""
    stats_port = free_port()
    return App(
        "Flask+infer",
        HERE / "flask_inprocess_app.py",
        port,
        ("/health",),
        "/predict",
        _flask_body,
        _flask_answer,
        stats_path="/v2/models/classifier/stats",
        stats_port=stats_port,
        arguments=("--pyserve-port", str(stats_port)),
    )


def routes_app(port: int) -> App:
    """Flask's ``/predict`` served by pyserve's custom routes, on ``port``."""
    stats_port = free_port()
    return App(
        "route",
        HERE / "routes_app.py",
        port,
        ("/health",),
        "/predict",
        _flask_body,
        _flask_answer,
        stats_path="/v2/models/classifier/stats",
        stats_port=stats_port,
        arguments=("--http-port", str(stats_port)),
    )


APPS: dict[str, Callable[[int], App]] = {
    "flask": flask_app,
    "pyserve": pyserve_app,
    "flask-infer": flask_inprocess_app,
    "route": routes_app,
}


# servers --------------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _ready(app: App) -> bool:
    try:
        return all(_get(app.port, path)[0] == 200 for path in app.ready_paths)
    except OSError:
        return False


def blas_environment(threads: int | None) -> dict[str, str]:
    """This process's environment, with the BLAS thread pools of numpy limited to ``threads`` (None: untouched)."""
    env = dict(os.environ)
    if threads is not None:
        for name in BLAS_THREAD_VARIABLES:
            env[name] = str(threads)
    return env


@contextlib.contextmanager
def running(apps: Sequence[App], blas_threads: int | None = 1) -> Iterator[None]:
    """Start every app (in its own process group), wait until all are ready; stop them all on exit.

    ``blas_threads`` caps numpy's BLAS threads in both servers alike (see ``BLAS_THREAD_VARIABLES``).
    """
    processes: list[subprocess.Popen[bytes]] = []
    env = blas_environment(blas_threads)
    try:
        for app in apps:
            command = [sys.executable, str(app.script), "--port", str(app.port), *app.arguments]
            processes.append(
                subprocess.Popen(
                    command,
                    cwd=HERE,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for app, process in zip(apps, processes, strict=True):
            while not _ready(app):
                if process.poll() is not None:
                    raise RuntimeError(f"{app.name} exited with status {process.returncode} before it was ready")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{app.name} was not ready within {STARTUP_TIMEOUT_S:.0f} s")
                time.sleep(0.1)
        yield
    finally:
        for process in processes:
            _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL of the whole process group after a timeout."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# client ---------------------------------------------------------------------------------------------------------


def sample_features(count: int, seed: int = 1) -> list[list[float]]:
    """``count`` feature vectors, as the JSON lists a client would send."""
    rng = np.random.default_rng(seed)
    return [[round(float(v), 4) for v in row] for row in rng.normal(0.0, 1.5, (count, FEATURES))]


def predict_once(app: App, features: list[float]) -> tuple[str, float]:
    """One request on a fresh connection: the label and score the app answers."""
    conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", app.predict_path, app.encode(features), JSON_HEADERS)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{app.name} answered {response.status}: {body[:200]!r}")
        return app.decode(body)
    finally:
        conn.close()


def check_same_answers(apps: Sequence[App], count: int = 8) -> None:
    """Both apps answer what the shared model computes locally, for the same features."""
    for features in sample_features(count, seed=2):
        labels, scores = predict(np.array([features], dtype=np.float32))
        for app in apps:
            label, score = predict_once(app, features)
            if label != labels[0] or abs(score - float(scores[0])) > 1e-4:
                raise RuntimeError(f"{app.name} answered {label} {score:.6f}, expected {labels[0]} {scores[0]:.6f}")


@dataclasses.dataclass(frozen=True)
class LoadResult:
    """Requests completed inside the measured window, with their latencies."""

    latencies_s: tuple[float, ...]
    errors: int
    duration_s: float
    mean_batch: float | None = None

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.duration_s

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q)) * 1000 if self.latencies_s else float("nan")


def drive(app: App, concurrency: int, duration_s: float, warmup_s: float) -> LoadResult:
    """``concurrency`` threads send requests back to back; count those that start and end inside the window."""
    bodies = [app.encode(features) for features in sample_features(64)]
    start = time.perf_counter() + warmup_s
    end = start + duration_s
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=REQUEST_TIMEOUT_S)
        sent = index
        try:
            while True:
                body = bodies[sent % len(bodies)]
                sent += 1
                began = time.perf_counter()
                try:
                    conn.request("POST", app.predict_path, body, JSON_HEADERS)
                    response = conn.getresponse()
                    answer = response.read()
                    ok = response.status == 200 and app.decode(answer)[0] in LABELS
                except (OSError, http.client.HTTPException, ValueError, KeyError):
                    ok = False
                    conn.close()  # reconnects on the next request
                finished = time.perf_counter()
                if finished >= end:
                    return
                if began >= start:
                    if ok:
                        latencies[index].append(finished - began)
                    else:
                        errors[index] += 1
        finally:
            conn.close()

    before = _executions(app)
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = _executions(app)
    mean_batch = None
    if before is not None and after is not None and after[1] > before[1]:
        mean_batch = (after[0] - before[0]) / (after[1] - before[1])
    return LoadResult(tuple(x for per_thread in latencies for x in per_thread), sum(errors), duration_s, mean_batch)


def _executions(app: App) -> tuple[int, int] | None:
    """(inference_count, execution_count) from pyserve's statistics; None for Flask."""
    if app.stats_path is None:
        return None
    status, body = _get(app.stats_port or app.port, app.stats_path)
    stats = json.loads(body)["model_stats"][0] if status == 200 else None
    return None if stats is None else (int(stats["inference_count"]), int(stats["execution_count"]))


# report ---------------------------------------------------------------------------------------------------------


def format_report(
    results: dict[tuple[int, str], LoadResult], concurrencies: Sequence[int], names: Sequence[str]
) -> str:
    """One row per concurrency and app: throughput, p50, p99, mean batch, and the ratios to the first app."""
    header = ["conc", "app", "req/s", "p50 ms", "p99 ms", "mean batch", f"req/s vs {names[0]}", f"p99 vs {names[0]}"]
    rows = [header]
    for concurrency in concurrencies:
        base = results[(concurrency, names[0])]
        for name in names:
            result = results[(concurrency, name)]
            rows.append(
                [
                    str(concurrency),
                    name,
                    f"{result.throughput:.0f}",
                    f"{result.percentile_ms(50):.2f}",
                    f"{result.percentile_ms(99):.2f}",
                    "-" if result.mean_batch is None else f"{result.mean_batch:.1f}",
                    f"{result.throughput / base.throughput:.2f}x" if base.throughput else "-",
                    f"{result.percentile_ms(99) / base.percentile_ms(99):.2f}x" if base.latencies_s else "-",
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines = [f"| {line} |" for line in lines]
    lines.insert(1, "|" + "|".join("-" * (width + 1) + ":" for width in widths) + "|")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell (default 1)")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated concurrencies (default 1,32)")
    parser.add_argument(
        "--apps",
        default="flask,pyserve,flask-infer",
        help=f"comma-separated apps among {', '.join(APPS)}; the first is the ratios' baseline "
        "(default flask,pyserve,flask-infer)",
    )
    parser.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="numpy BLAS threads in both servers (default 1; 0: leave the environment as it is)",
    )
    args = parser.parse_args(argv)
    concurrencies = [int(part) for part in args.concurrency.split(",")]
    unknown = [name for name in args.apps.split(",") if name not in APPS]
    if unknown:
        parser.error(f"unknown app(s) {', '.join(unknown)}; choose among {', '.join(APPS)}")
    apps = [APPS[name](free_port()) for name in args.apps.split(",")]
    results: dict[tuple[int, str], LoadResult] = {}
    with running(apps, args.blas_threads or None):
        check_same_answers(apps)
        print("the apps answer the same labels and scores", flush=True)
        for concurrency in concurrencies:
            for app in apps:
                result = drive(app, concurrency, args.duration, args.warmup)
                results[(concurrency, app.name)] = result
                print(
                    f"  {app.name:<12} c{concurrency:<3} {result.throughput:>8.0f} req/s  "
                    f"p50 {result.percentile_ms(50):>7.2f} ms  p99 {result.percentile_ms(99):>7.2f} ms  "
                    f"errors {result.errors}",
                    flush=True,
                )
    print()
    print(
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; {args.duration:g} s per cell after "
        f"{args.warmup:g} s warm-up; one client process: threads with keep-alive http.client, JSON both ways; "
        f"BLAS threads per server: {args.blas_threads or 'default'}"
    )
    print(format_report(results, concurrencies, [app.name for app in apps]))
    return 1 if any(result.errors for result in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
