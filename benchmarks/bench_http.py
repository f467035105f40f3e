"""Benchmark pyserve (and optionally PyTriton) over HTTP with perf_analyzer.

Run from the repository root::

    .venv/bin/python benchmarks/bench_http.py [--pytriton] [--duration-ms 2000] [--shapes 16,262144]
        [--concurrency 1,4,16] [--perf-analyzer PATH] [--json results.json]

For each server (pyserve, then PyTriton with ``--pytriton``) it starts the server in its own process group serving
the identity model ``identity_fp32`` (FP32 ``INPUT0`` of shape ``(-1,)`` echoed as ``OUTPUT0``,
``max_batch_size=64``, dynamic batching with no queue delay, ``@batch``), waits until the model is ready, runs
perf_analyzer over HTTP for every shape x concurrency, and stops the server. Only one server runs at a time, so
they do not compete for CPU. It then prints a table of throughput and p50/p99 latency (with PyTriton: the ratios
pyserve/PyTriton) and optionally writes the results as JSON.

PyTriton runs from its own virtual environment, ``benchmarks/.pytriton-venv``, created on first use with
``nvidia-pytriton==0.7.0`` and numpy.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
MODEL_NAME = "identity_fp32"
PYTRITON_VENV = BENCH_DIR / ".pytriton-venv"
PYTRITON_REQUIREMENTS = ("nvidia-pytriton==0.7.0", "numpy")
PYTRITON_MARKER = ".bench-installed"
DEFAULT_PERF_ANALYZER = REPO_ROOT / ".tools" / "pa" / "perf_analyzer"

PIP_TIMEOUT_S = 1200.0
PYSERVE_STARTUP_TIMEOUT_S = 60.0
PYTRITON_STARTUP_TIMEOUT_S = 240.0
PYSERVE_STOP_TIMEOUT_S = 15.0
PYTRITON_STOP_TIMEOUT_S = 45.0  # Triton waits up to 30 s for models to unload
KILL_WAIT_S = 10.0
HTTP_PROBE_TIMEOUT_S = 2.0
PERF_ANALYZER_SLACK_S = 60.0
DEFAULT_MAX_TRIALS = 10  # perf_analyzer's own default for --max-trials
DEFAULT_RETRY_STABILITY = 25.0
UNSTABLE_MESSAGE = "Failed to obtain stable measurement"


class BenchError(RuntimeError):
    """A server or tool failed in a way that stops the benchmark."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One perf_analyzer result; ``error`` is set (and the numbers are 0) when the measurement failed.

    ``stability_percentage`` is the ``-s`` perf_analyzer ran with (None: its default, 10); ``retried`` marks a
    result that only stabilised on a retry with the relaxed ``--retry-stability`` threshold.
    """

    throughput: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    error: str | None = None
    stability_percentage: float | None = None
    retried: bool = False


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """How to start one server under test."""

    name: str
    command: list[str]
    env: dict[str, str]
    http_port: int
    startup_timeout_s: float
    stop_timeout_s: float
    ready_models: tuple[str, ...] = (MODEL_NAME,)
    grpc_port: int = 0


# ports and processes ----------------------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (all held open together while choosing)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_PROBE_TIMEOUT_S) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to every process left in the server's process group (it is the group's leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def stop_server(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the server, wait up to ``timeout_s``, then SIGKILL its whole process group; never blocks unbounded.

    SIGTERM rather than SIGINT: a server started from a background job inherits SIGINT ignored. An interrupt
    while waiting still kills the group before it propagates.
    """
    try:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                print(f"  server pid {process.pid} did not stop in {timeout_s:.0f} s; killing it", file=sys.stderr)
    finally:
        # Whatever is still in the group (the leader after a timeout or an interrupt, or children it left behind).
        _signal_group(process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(KILL_WAIT_S)


@contextlib.contextmanager
def running_server(spec: ServerSpec, log_path: Path) -> Iterator[str]:
    """Start the server, wait for ``/v2/health/ready`` and ``spec.ready_models`` to be ready; yield ``host:port``.

    The server is stopped (SIGTERM, then SIGKILL of its process group) on every exit path.
    """
    base = f"http://127.0.0.1:{spec.http_port}"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            spec.command,
            env=spec.env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + spec.startup_timeout_s
        probes = (f"{base}/v2/health/ready", *(f"{base}/v2/models/{model}/ready" for model in spec.ready_models))
        while not all(_http_ok(url) for url in probes):
            if process.poll() is not None:
                raise BenchError(
                    f"{spec.name} exited with status {process.returncode} before it was ready; log tail:\n"
                    f"{_log_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{spec.name} was not ready within {spec.startup_timeout_s:.0f} s; log tail:\n{_log_tail(log_path)}"
                )
            time.sleep(0.2)
        yield f"127.0.0.1:{spec.http_port}"
        if process.poll() is not None:
            raise BenchError(f"{spec.name} exited during the benchmark; log tail:\n{_log_tail(log_path)}")
    finally:
        stop_server(process, spec.stop_timeout_s)


# PyTriton environment -----------------------------------------------------------------------------------------------


def ensure_pytriton_venv(venv: Path = PYTRITON_VENV) -> Path:
    """Create (once) a virtual environment with PyTriton; return its python. Cached by a marker file."""
    python = venv / "bin" / "python"
    marker = venv / PYTRITON_MARKER
    wanted = "\n".join(PYTRITON_REQUIREMENTS)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"creating {venv} with {' '.join(PYTRITON_REQUIREMENTS)} (once) ...", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=PIP_TIMEOUT_S)
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *PYTRITON_REQUIREMENTS],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(f"pip install {' '.join(PYTRITON_REQUIREMENTS)} failed:\n{result.stderr[-4000:]}")
    marker.write_text(wanted)
    return python


def python_libdir(python: Path) -> str:
    """The ``LIBDIR`` (folder of libpython) of the interpreter behind ``python``."""
    result = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def pytriton_spec(python: Path, pytriton_home: Path) -> ServerSpec:
    """The PyTriton server, with libpython of its interpreter first on LD_LIBRARY_PATH (pyenv builds need it)."""
    http_port, grpc_port, metrics_port = free_ports(3)
    env = dict(os.environ)
    libdir = python_libdir(python)
    if libdir:
        previous = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{libdir}:{previous}" if previous else libdir
    env["PYTRITON_HOME"] = str(pytriton_home)
    env["PYTHONUNBUFFERED"] = "1"
    command = [
        str(python),
        str(BENCH_DIR / "pytriton_server.py"),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
        "--parent-pid",
        str(os.getpid()),
    ]
    return ServerSpec(
        "PyTriton", command, env, http_port, PYTRITON_STARTUP_TIMEOUT_S, PYTRITON_STOP_TIMEOUT_S, grpc_port=grpc_port
    )


def pyserve_spec() -> ServerSpec:
    """The pyserve server, run by this interpreter (the project's venv)."""
    http_port, grpc_port = free_ports(2)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    command = [
        sys.executable,
        str(BENCH_DIR / "pyserve_server.py"),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--parent-pid",
        str(os.getpid()),
    ]
    return ServerSpec(
        "pyserve", command, env, http_port, PYSERVE_STARTUP_TIMEOUT_S, PYSERVE_STOP_TIMEOUT_S, grpc_port=grpc_port
    )


# perf_analyzer ------------------------------------------------------------------------------------------------------


def perf_analyzer_command(
    perf_analyzer: str,
    url: str,
    shape: int,
    concurrency: int,
    args: argparse.Namespace,
    csv_path: Path,
    stability: float | None,
) -> list[str]:
    """The perf_analyzer command line for one measurement."""
    command = [
        perf_analyzer,
        "-m",
        MODEL_NAME,
        "-u",
        url,
        "-i",
        "http",
        "--shape",
        f"INPUT0:{shape}",
        "--concurrency-range",
        str(concurrency),
        "--measurement-mode",
        "time_windows",
        "-p",
        str(args.duration_ms),
        "-r",
        str(args.max_trials),
        "-f",
        str(csv_path),
    ]
    if stability is not None:
        command += ["-s", f"{stability:g}"]
    return command


def parse_perf_csv(csv_path: Path, concurrency: int) -> Measurement:
    """Read throughput, p50 and p99 (µs) for ``concurrency`` from a perf_analyzer ``-f`` CSV report."""
    with csv_path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        if row.get("Concurrency", "").strip() == str(concurrency):
            try:
                return Measurement(
                    throughput=float(row["Inferences/Second"]),
                    p50_us=float(row["p50 latency"]),
                    p99_us=float(row["p99 latency"]),
                )
            except (KeyError, ValueError) as exc:
                return Measurement(error=f"unexpected CSV row {row}: {exc!r}")
    return Measurement(error=f"no row for concurrency {concurrency} in {csv_path}")


def measure_once(
    perf_analyzer: str, url: str, shape: int, concurrency: int, args: argparse.Namespace, stability: float | None
) -> Measurement:
    """Run perf_analyzer once (bounded by a timeout) and parse its CSV report."""
    with tempfile.TemporaryDirectory(prefix="bench-pa-") as tmp:
        csv_path = Path(tmp) / "report.csv"
        command = perf_analyzer_command(perf_analyzer, url, shape, concurrency, args, csv_path, stability)
        timeout_s = args.duration_ms / 1000 * (args.max_trials + 3) + PERF_ANALYZER_SLACK_S
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return Measurement(error=f"perf_analyzer timed out after {timeout_s:.0f} s", stability_percentage=stability)
        if result.returncode != 0 or not csv_path.exists():
            output = (result.stdout + result.stderr).strip().splitlines()
            error = f"perf_analyzer exit {result.returncode}: {' | '.join(output[-3:])}"
            return Measurement(error=error, stability_percentage=stability)
        return dataclasses.replace(parse_perf_csv(csv_path, concurrency), stability_percentage=stability)


def measure(perf_analyzer: str, url: str, shape: int, concurrency: int, args: argparse.Namespace) -> Measurement:
    """Measure one cell; if perf_analyzer cannot stabilise, retry once with ``--retry-stability`` as ``-s``."""
    first = measure_once(perf_analyzer, url, shape, concurrency, args, args.stability_percentage)
    current = args.stability_percentage if args.stability_percentage is not None else 10.0
    relaxed = args.retry_stability
    if first.error is None or UNSTABLE_MESSAGE not in first.error or relaxed is None or relaxed <= current:
        return first
    print(f"  shape {shape:>7} c{concurrency:<3} unstable; retrying with -s {relaxed:g}", flush=True)
    return dataclasses.replace(measure_once(perf_analyzer, url, shape, concurrency, args, relaxed), retried=True)


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
) -> list[dict[str, Any]]:
    """One JSON-able row per shape x concurrency, with ratios when PyTriton was measured."""
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
            rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]], with_pytriton: bool) -> str:
    """A fixed-width text table of the rows; latencies in ms."""
    header = ["shape", "conc", "pyserve inf/s", "p50 ms", "p99 ms"]
    if with_pytriton:
        header += ["PyTriton inf/s", "p50 ms", "p99 ms", "thr ratio", "p50 ratio"]
    lines: list[list[str]] = [header]

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
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(text)


def target_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The project's targets (16 floats over HTTP) checked against PyTriton, when both cells were measured."""
    by_key = {(row["shape"], row["concurrency"]): row for row in rows}
    checks = (
        ((16, 16), "throughput_ratio", ">=", 3.0, "pyserve/PyTriton throughput, 16 floats, c16"),
        ((16, 1), "p50_ratio", "<=", 0.25, "pyserve/PyTriton p50, 16 floats, c1"),
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


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pytriton", action="store_true", help="also benchmark PyTriton 0.7.0 and print ratios")
    parser.add_argument(
        "--duration-ms", type=int, default=2000, help="perf_analyzer measurement window (-p), ms (default 2000)"
    )
    parser.add_argument("--shapes", type=_int_list, default=[16, 262144], help="INPUT0 lengths (default 16,262144)")
    parser.add_argument("--concurrency", type=_int_list, default=[1, 4, 16], help="concurrencies (default 1,4,16)")
    parser.add_argument(
        "--max-trials", type=int, default=DEFAULT_MAX_TRIALS, help="perf_analyzer -r: windows before giving up"
    )
    parser.add_argument(
        "--stability-percentage", type=float, default=None, help="perf_analyzer -s (default: its own, 10)"
    )
    parser.add_argument(
        "--retry-stability",
        type=float,
        default=DEFAULT_RETRY_STABILITY,
        help=f"-s for one retry of a cell that did not stabilise (default {DEFAULT_RETRY_STABILITY:g}; 0: no retry)",
    )
    parser.add_argument("--perf-analyzer", default=None, help=f"perf_analyzer binary (default {DEFAULT_PERF_ANALYZER})")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.duration_ms <= 0 or args.max_trials <= 0:
        parser.error("--duration-ms and --max-trials must be positive")
    return args


def find_perf_analyzer(explicit: str | None) -> str:
    """The perf_analyzer to use: the option, else the repo's .tools copy, else PATH."""
    candidates = [explicit] if explicit else [str(DEFAULT_PERF_ANALYZER), shutil.which("perf_analyzer")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BenchError(
        f"perf_analyzer not found (tried {[c for c in candidates if c]}); install it with "
        "/work/shared/tools/install-perf-analyzer.sh DIR and pass --perf-analyzer DIR/perf_analyzer"
    )


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 1 on failure, 130 on interrupt."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)  # so a SIGTERM also unwinds through the servers' cleanup
    try:
        perf_analyzer = find_perf_analyzer(args.perf_analyzer)
        pytriton_python = ensure_pytriton_venv() if args.pytriton else None
        with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
            work = Path(tmp)
            started = time.monotonic()
            pyserve = run_matrix(pyserve_spec(), work / "pyserve.log", perf_analyzer, args)
            pytriton = None
            if pytriton_python is not None:
                home = work / "pytriton-home"
                home.mkdir()
                pytriton = run_matrix(pytriton_spec(pytriton_python, home), work / "pytriton.log", perf_analyzer, args)
            elapsed = time.monotonic() - started
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        return 130

    rows = build_rows(args.shapes, args.concurrency, pyserve, pytriton)
    print()
    print(
        f"perf_analyzer over HTTP, model {MODEL_NAME}, measurement window {args.duration_ms} ms, "
        f"time_windows mode; total {elapsed:.0f} s"
    )
    print(format_table(rows, pytriton is not None))
    if any(m.error is None and m.retried for results in (pyserve, pytriton or {}) for m in results.values()):
        threshold = args.stability_percentage or 10
        print(f"* unstable at -s {threshold:g}; measured on a retry with perf_analyzer -s {args.retry_stability:g}")
    if pytriton is not None:
        print()
        print("\n".join(target_lines(rows)))
    if args.json is not None:
        report = {
            "model": MODEL_NAME,
            "protocol": "http",
            "duration_ms": args.duration_ms,
            "max_trials": args.max_trials,
            "stability_percentage": args.stability_percentage,
            "retry_stability": args.retry_stability,
            "perf_analyzer": perf_analyzer,
            "cpu_count": os.cpu_count(),
            "rows": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    failed = any(m.error for results in (pyserve, pytriton or {}) for m in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
