"""What a benchmark shows and writes: the final table, the errors seen, and the results as JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyserve.bench.plot import COLORS, Chart, Series, write_plot
from pyserve.bench.runner import BenchReport, StepResult
from pyserve.errors import ConfigError

_CSV_LATENCY = ("p50_us", "p90_us", "p95_us", "p99_us", "avg_us", "min_us", "max_us")
_CSV_SERVER = ("request_us", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us", "overhead_us")


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], align_left: int = 1) -> str:
    """A fixed-width table; the first ``align_left`` columns left-aligned, the others right-aligned."""
    lines = [list(header), *(list(row) for row in rows)]
    widths = [max(len(line[index]) for line in lines) for index in range(len(header))]

    def render(line: Sequence[str]) -> str:
        cells = [
            cell.ljust(width) if index < align_left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    rendered = [render(line) for line in lines]
    rendered.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(rendered)


def ms(us: float | None) -> str:
    """Microseconds shown as milliseconds (``-`` for none)."""
    return "-" if us is None else f"{us / 1000:.2f}"


def format_report(report: BenchReport) -> str:
    """The final table: one row per step, then the errors seen and anything to know about the measurement."""
    settings = report.settings
    inputs = ", ".join(f"{name} {dt}{list(shape)}" for name, (dt, shape) in report.inputs.items())
    header_line = (
        f"model '{settings.model}' at {settings.url}: {report.rows_per_request} row(s) per request ({inputs}), "
        f"{report.processes} client process(es)"
    )
    level_name = "concurrency" if settings.mode == "concurrency" else "rate/s"
    header = [level_name, "infer/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "avg ms", "errors"]
    header += ["queue ms", "compute ms", "batch", "stable"]
    rows = [_row(step) for step in report.steps]
    lines = [header_line, "", text_table(header, rows, align_left=0)]
    if any(step.measured.server is None for step in report.steps):
        lines.append("(queue, compute, batch: the server offers no statistics extension)")
    else:
        lines.append("(queue, compute: per request, from the server's statistics; batch: rows per execution)")
    lines += _error_lines(report.steps)
    return "\n".join(lines)


def _row(step: StepResult) -> list[str]:
    latency, server = step.measured.latency, step.measured.server
    level = str(step.level.concurrency) if step.level.concurrency is not None else f"{step.level.request_rate:g}"
    cells = [level, f"{step.throughput:,.1f}"]
    if latency is None:
        cells += ["-"] * 5
    else:
        cells += [ms(latency.p50_us), ms(latency.p90_us), ms(latency.p95_us), ms(latency.p99_us), ms(latency.avg_us)]
    cells.append(str(step.failures))
    if server is None:
        cells += ["-", "-", "-"]
    else:
        rows = server.batch_rows
        cells += [ms(server.queue_us), ms(server.compute_us), "-" if rows is None else f"{rows:.1f}"]
    cells.append("yes" if step.stable else "no")
    return cells


def _error_lines(steps: Sequence[StepResult]) -> list[str]:
    lines: list[str] = []
    for step in steps:
        for message, count in sorted(step.measured.errors.items(), key=lambda item: -item[1]):
            lines.append(f"  {step.level.label()}: {count} x {message}")
    return ["", "errors:", *lines] if lines else []


def write_output(report: BenchReport, path: Path) -> None:
    """Write the results to ``path``: JSON (everything) or CSV (one row per step), by its suffix."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise ConfigError(f"{path}: results are written as .json or .csv, not {suffix or 'a file without suffix'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".json":
        path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        path.write_text(csv_text(report))


def csv_text(report: BenchReport) -> str:
    """The steps as CSV, one row each, latencies in µs."""
    mode = report.settings.mode
    columns = [mode, "throughput_infer_per_s", "requests_per_s", "successes", "failures", *_CSV_LATENCY]
    columns += [f"server_{name}" for name in _CSV_SERVER] + ["server_batch_rows", "stable", "client_cpu"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for step in report.steps:
        doc = step.to_json()
        latency: dict[str, Any] = doc["latency_us"] or {}
        server: dict[str, Any] = doc["server"] or {}
        row: list[Any] = [doc[mode], doc["throughput_infer_per_s"], doc["requests_per_s"]]
        row += [doc["successes"], doc["failures"], *(latency.get(name, "") for name in _CSV_LATENCY)]
        row += [server.get(name, "") for name in _CSV_SERVER]
        row += [server.get("batch_rows", ""), doc["stable"], doc["client_cpu"]]
        writer.writerow(_rounded(value) for value in row)
    return buffer.getvalue()


def _rounded(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def bench_chart(report: BenchReport) -> Chart:
    """Latency (p50, p90, p99) against throughput, one point per step, labelled with its load level."""
    measured = [step for step in report.steps if step.measured.latency is not None]
    labels = [
        f"c={step.level.concurrency}" if step.level.concurrency is not None else f"{step.level.request_rate:g}/s"
        for step in measured
    ]
    series = []
    for color, name in zip(COLORS, ("p50", "p90", "p99"), strict=False):
        points = [(step.throughput, getattr(step.measured.latency, f"{name}_us") / 1000.0) for step in measured]
        series.append(Series(name, points, color, labels=labels if name == "p99" else ()))
    settings = report.settings
    title = f"{settings.model} at {settings.url}: latency against throughput"
    return Chart(title, "throughput (infer/s)", "latency (ms)", series)


def write_bench_plot(report: BenchReport, path: Path) -> None:
    """``--plot``: the chart, and the final table under it."""
    write_plot(path, f"pyserve bench: {report.settings.model}", [bench_chart(report)], format_report(report))
