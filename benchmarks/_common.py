"""Helpers shared by the benchmark drivers (``bench_*.py``) and the servers they start.

Stdlib only: servers import it from PyTriton's virtual environment too. Starting and stopping servers, PyTriton's
environment and perf_analyzer's CSV report are ``bench_http.py``'s and are imported from there; what is here is
generic over the model name and inputs, so any benchmark can use it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_http import UNSTABLE_MESSAGE, Measurement, ServerSpec, parse_perf_csv

HTTP_TIMEOUT_S = 10.0
PERF_ANALYZER_SLACK_S = 60.0
DEFAULT_STABILITY = 10.0  # perf_analyzer's own default for -s


# servers --------------------------------------------------------------------------------------------------------


def with_server_script(spec: ServerSpec, script: Path, extra_args: Sequence[str], models: Sequence[str]) -> ServerSpec:
    """``spec`` (from ``bench_http.pyserve_spec``/``pytriton_spec``) running ``script`` instead, ready with ``models``.

    Keeps the interpreter, environment, ports and ``--parent-pid`` of ``spec``: its command is ``[python, script,
    *options]``, and every benchmark server script takes the same port and parent options.
    """
    command = [spec.command[0], str(script), *extra_args, *spec.command[2:]]
    return dataclasses.replace(spec, command=command, ready_models=tuple(models))


# server side ----------------------------------------------------------------------------------------------------


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


@dataclasses.dataclass(frozen=True)
class PerfRun:
    """One perf_analyzer measurement: a model, its input shapes and a concurrency, over ``protocol`` (http|grpc).

    ``shapes`` are perf_analyzer ``--shape`` values (``"INPUT0:16"``); ``window_ms`` is the time window (``-p``);
    ``stability`` perf_analyzer's ``-s`` (None: its default, 10) and ``retry_stability`` the ``-s`` of one retry
    when the measurement does not stabilise (None: no retry).
    """

    model: str
    shapes: tuple[str, ...]
    concurrency: int
    window_ms: int = 2000
    max_trials: int = 10
    stability: float | None = None
    retry_stability: float | None = 25.0
    protocol: str = "http"

    def command(self, perf_analyzer: str, url: str, csv_path: Path, stability: float | None) -> list[str]:
        """The perf_analyzer command line (synchronous requests, random binary data, time windows)."""
        command = [perf_analyzer, "-m", self.model, "-u", url, "-i", self.protocol]
        for shape in self.shapes:
            command += ["--shape", shape]
        # An explicit end makes perf_analyzer start one thread per concurrent request in synchronous mode.
        command += ["--concurrency-range", f"{self.concurrency}:{self.concurrency}"]
        command += ["--measurement-mode", "time_windows", "-p", str(self.window_ms), "-r", str(self.max_trials)]
        command += ["-f", str(csv_path)]
        if stability is not None:
            command += ["-s", f"{stability:g}"]
        return command


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


def run_perf_analyzer(perf_analyzer: str, url: str, run: PerfRun) -> Measurement:
    """Measure ``run`` against ``url`` (``host:port``); retry once with ``retry_stability`` if it did not stabilise."""
    first = _perf_analyzer_once(perf_analyzer, url, run, run.stability)
    current = run.stability if run.stability is not None else DEFAULT_STABILITY
    relaxed = run.retry_stability
    if first.error is None or UNSTABLE_MESSAGE not in first.error or relaxed is None or relaxed <= current:
        return first
    return dataclasses.replace(_perf_analyzer_once(perf_analyzer, url, run, relaxed), retried=True)


# report ---------------------------------------------------------------------------------------------------------


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
