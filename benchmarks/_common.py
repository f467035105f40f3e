"""Helpers shared by the benchmark drivers (``bench_*.py``) and the servers they start.

Stdlib only: servers import it from PyTriton's virtual environment too. Starting and stopping servers, PyTriton's
environment, perf_analyzer (running it, retrying it, reading its CSV report) and the drivers' ``main`` wrapper are
here; what is here is generic over the model name and inputs, so any benchmark can use it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
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
HTTP_TIMEOUT_S = 10.0
DEFAULT_STABILITY = 10.0  # perf_analyzer's own default for -s
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


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a server log (or a note that there is none)."""
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
                    f"{log_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{spec.name} was not ready within {spec.startup_timeout_s:.0f} s; log tail:\n{log_tail(log_path)}"
                )
            time.sleep(0.2)
        yield f"127.0.0.1:{spec.http_port}"
        if process.poll() is not None:
            raise BenchError(f"{spec.name} exited during the benchmark; log tail:\n{log_tail(log_path)}")
    finally:
        stop_server(process, spec.stop_timeout_s)


# PyTriton environment -----------------------------------------------------------------------------------------------


def _requirement_name(requirement: str) -> str:
    return re.split(r"[=<>!~\[;\s]", requirement.strip(), maxsplit=1)[0].lower()


def ensure_pytriton_venv(venv: Path = PYTRITON_VENV, extra: Sequence[str] = ()) -> Path:
    """Create (once) a virtual environment with PyTriton and ``extra`` requirements; return its python.

    A marker file lists what was installed; the environment is reused when it lists every requirement asked for.
    Installing ``extra`` keeps the earlier lines of other packages, so a driver that asks for less reuses it.
    """
    python = venv / "bin" / "python"
    marker = venv / PYTRITON_MARKER
    wanted = [*PYTRITON_REQUIREMENTS, *extra]
    installed = marker.read_text().splitlines() if python.exists() and marker.exists() else []
    if set(wanted) <= set(installed):
        return python
    print(f"setting up {venv} with {' '.join(wanted)} (once) ...", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=PIP_TIMEOUT_S)
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *wanted],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(f"pip install {' '.join(wanted)} failed:\n{result.stderr[-4000:]}")
    names = {_requirement_name(line) for line in wanted}
    kept = [line for line in installed if _requirement_name(line) not in names]
    marker.write_text("\n".join([*wanted, *kept]))
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


def pyserve_command_spec(
    command: list[str], env: dict[str, str], http_port: int, grpc_port: int, models: Sequence[str]
) -> ServerSpec:
    """A pyserve server started by ``command`` (a script or the CLI), ready once ``models`` are."""
    return ServerSpec(
        "pyserve",
        command,
        env,
        http_port,
        PYSERVE_STARTUP_TIMEOUT_S,
        PYSERVE_STOP_TIMEOUT_S,
        ready_models=tuple(models),
        grpc_port=grpc_port,
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


# servers --------------------------------------------------------------------------------------------------------


def with_server_script(spec: ServerSpec, script: Path, extra_args: Sequence[str], models: Sequence[str]) -> ServerSpec:
    """``spec`` (from ``pyserve_spec``/``pytriton_spec``) running ``script`` instead, ready with ``models``.

    Keeps the interpreter, environment, ports and ``--parent-pid`` of ``spec``: its command is ``[python, script,
    *options]``, and every benchmark server script takes the same port and parent options.
    """
    command = [spec.command[0], str(script), *extra_args, *spec.command[2:]]
    return dataclasses.replace(spec, command=command, ready_models=tuple(models))


# server side ----------------------------------------------------------------------------------------------------


def server_arguments(parser: argparse.ArgumentParser, all_ports: bool = False) -> argparse.Namespace:
    """Parse a benchmark server's command line, with the options every one takes (those ``pyserve_spec`` and
    ``pytriton_spec`` pass: its ports, ``--parent-pid``); ``all_ports`` makes the gRPC and metrics ports required.

    Then arm the process to stop: SIGINT interrupts it even when it was started with SIGINT ignored (from a
    background job), and it is sent SIGTERM once the driver (``--parent-pid``) is gone.
    """
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, default=0, required=all_ports)
    parser.add_argument("--metrics-port", type=int, default=0, required=all_ports)
    parser.add_argument("--parent-pid", type=int, default=0, help="stop when this process is gone")
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.parent_pid:
        watch_parent(args.parent_pid)
    return args


def interrupt_on_sigterm() -> None:
    """Turn SIGTERM into a ``KeyboardInterrupt`` (PyTriton's ``Triton.serve()`` stops cleanly on that only)."""
    signal.signal(signal.SIGTERM, _sigterm)


def watch_parent(parent_pid: int) -> None:
    """SIGTERM this process once ``parent_pid`` (the benchmark driver) is gone, so no server outlives it."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def cpu_busy_fraction(seconds: float = 1.0) -> float | None:
    """The fraction of all CPUs busy over the next ``seconds`` (from ``/proc/stat``; None where it is missing).

    Measured before a benchmark starts its servers, it tells whether something else is loading the machine.
    """

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as handle:
            values = [int(value) for value in handle.readline().split()[1:9]]
        return values[3] + values[4], sum(values)  # idle + iowait, all

    try:
        idle_before, total_before = sample()
        time.sleep(seconds)
        idle_after, total_after = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total_after - total_before
    return 1.0 - (idle_after - idle_before) / total if total > 0 else None


# statistics -----------------------------------------------------------------------------------------------------


def fetch_json(url: str, timeout_s: float = HTTP_TIMEOUT_S) -> Any:
    """GET ``url`` and decode its JSON body."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def execution_counts(url: str, model: str) -> tuple[int, int]:
    """``(inference_count, execution_count)`` of a model from the statistics extension (Triton and pyserve alike).

    ``url`` is ``host:port``. Their deltas around a run give the mean batch size the server formed: rows per
    execution of the model.
    """
    stats = fetch_json(f"http://{url}/v2/models/{model}/stats")
    inference = execution = 0
    for entry in stats["model_stats"]:
        inference += int(entry["inference_count"])
        execution += int(entry["execution_count"])
    return inference, execution


# perf_analyzer --------------------------------------------------------------------------------------------------


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


@dataclasses.dataclass(frozen=True)
class PerfRun:
    """One perf_analyzer measurement: a model, its input shapes and a concurrency, over ``protocol`` (http|grpc).

    ``shapes`` are perf_analyzer ``--shape`` values (``"INPUT0:16"``); ``window_ms`` is the time window (``-p``);
    ``stability`` perf_analyzer's ``-s`` (None: its default, 10) and ``retry_stability`` the ``-s`` of one retry
    when the measurement does not stabilise (None: no retry). ``explicit_end`` False passes ``--concurrency-range``
    as ``N`` rather than ``N:N`` (``bench_http.py``'s command line, kept so its numbers stay comparable).
    """

    model: str
    shapes: tuple[str, ...]
    concurrency: int
    window_ms: int = 2000
    max_trials: int = DEFAULT_MAX_TRIALS
    stability: float | None = None
    retry_stability: float | None = DEFAULT_RETRY_STABILITY
    protocol: str = "http"
    explicit_end: bool = True

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, model: str, shapes: Sequence[str], concurrency: int, **options: Any
    ) -> PerfRun:
        """The run a driver's command line asks for: its ``--duration-ms`` and ``add_perf_analyzer_options``'s
        options (a ``--retry-stability`` of 0: no retry); ``options`` set the other fields."""
        return cls(
            model,
            tuple(shapes),
            concurrency,
            window_ms=args.duration_ms,
            max_trials=args.max_trials,
            stability=args.stability_percentage,
            retry_stability=args.retry_stability or None,
            **options,
        )

    def command(self, perf_analyzer: str, url: str, csv_path: Path, stability: float | None) -> list[str]:
        """The perf_analyzer command line (synchronous requests, random binary data, time windows)."""
        command = [perf_analyzer, "-m", self.model, "-u", url, "-i", self.protocol]
        for shape in self.shapes:
            command += ["--shape", shape]
        # An explicit end makes perf_analyzer start one thread per concurrent request in synchronous mode.
        end = f":{self.concurrency}" if self.explicit_end else ""
        command += ["--concurrency-range", f"{self.concurrency}{end}"]
        command += ["--measurement-mode", "time_windows", "-p", str(self.window_ms), "-r", str(self.max_trials)]
        command += ["-f", str(csv_path)]
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


def _perf_analyzer_once(perf_analyzer: str, url: str, run: PerfRun, stability: float | None) -> Measurement:
    with tempfile.TemporaryDirectory(prefix="bench-pa-") as tmp:
        csv_path = Path(tmp) / "report.csv"
        command = run.command(perf_analyzer, url, csv_path, stability)
        timeout_s = run.window_ms / 1000 * (run.max_trials + 3) + PERF_ANALYZER_SLACK_S
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return Measurement(error=f"perf_analyzer timed out after {timeout_s:.0f} s", stability_percentage=stability)
        if result.returncode != 0 or not csv_path.exists():
            output = (result.stdout + result.stderr).strip().splitlines()
            error = f"perf_analyzer exit {result.returncode}: {' | '.join(output[-3:])}"
            return Measurement(error=error, stability_percentage=stability)
        return dataclasses.replace(parse_perf_csv(csv_path, run.concurrency), stability_percentage=stability)


def run_perf_analyzer(
    perf_analyzer: str, url: str, run: PerfRun, on_retry: Callable[[float], None] | None = None
) -> Measurement:
    """Measure ``run`` against ``url`` (``host:port``); retry once with ``retry_stability`` if it did not stabilise.

    ``on_retry`` is called with the relaxed ``-s`` just before the retry.
    """
    first = _perf_analyzer_once(perf_analyzer, url, run, run.stability)
    current = run.stability if run.stability is not None else DEFAULT_STABILITY
    relaxed = run.retry_stability
    if first.error is None or UNSTABLE_MESSAGE not in first.error or relaxed is None or relaxed <= current:
        return first
    if on_retry is not None:
        on_retry(relaxed)
    return dataclasses.replace(_perf_analyzer_once(perf_analyzer, url, run, relaxed), retried=True)


# report ---------------------------------------------------------------------------------------------------------


def perf_settings(args: argparse.Namespace, perf_analyzer: str) -> dict[str, Any]:
    """How perf_analyzer measured, for a JSON report: the window and the options ``parse_perf_analyzer_args``
    reads, the binary, and the machine's CPU count."""
    return {
        "duration_ms": args.duration_ms,
        "max_trials": args.max_trials,
        "stability_percentage": args.stability_percentage,
        "retry_stability": args.retry_stability,
        "perf_analyzer": perf_analyzer,
        "cpu_count": os.cpu_count(),
    }


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write a driver's results as JSON to ``path`` (``--json``) and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of a results table: what was measured, its value, the target and whether it was met.

    ``met`` is None for numbers reported without a target (or when the measurement failed, with ``value`` saying so).
    """

    label: str
    value: str
    target: str = "-"
    met: bool | None = None

    @property
    def verdict(self) -> str:
        """'met', 'NOT met' or '-'."""
        return "-" if self.met is None else ("met" if self.met else "NOT met")


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], align_left: int = 1) -> str:
    """A fixed-width text table; the first ``align_left`` columns are left-aligned, the rest right-aligned."""
    lines = [list(header), *(list(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def render(line: Sequence[str]) -> str:
        cells = [
            cell.ljust(width) if i < align_left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    text = [render(line) for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(text)


def format_checks(checks: Sequence[Check]) -> str:
    """The table of measurements with their targets and verdicts."""
    rows = [[c.label, c.value, c.target, c.verdict] for c in checks]
    return format_table(["measurement", "value", "target", "result"], rows, align_left=4)


# CLI --------------------------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated positive integers."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_perf_analyzer_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line of a driver that measures with perf_analyzer, adding to its ``parser`` (which has
    ``--duration-ms``) the options ``PerfRun.from_args`` reads and the JSON report: ``--max-trials``,
    ``--stability-percentage``, ``--retry-stability``, ``--perf-analyzer``, ``--json``."""
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


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def bench_main(main: Callable[[Sequence[str] | None], int]) -> Callable[[Sequence[str] | None], int]:
    """Decorate a driver's ``main``: 1 with the message on a ``BenchError``, 130 on an interrupt.

    A SIGTERM is turned into a ``KeyboardInterrupt`` too, so it also unwinds through the servers' cleanup.
    """

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        signal.signal(signal.SIGTERM, _sigterm)
        try:
            return main(argv)
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted; servers stopped", file=sys.stderr)
            return 130

    return wrapper
