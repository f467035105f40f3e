"""What ``pyserve tune`` shows and writes: the table of every configuration tried, the winner as a ``ModelConfig``
line and a ``config.pbtxt``, and a page with the Pareto front of throughput against p99 latency."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyserve.bench.candidates import config_pbtxt, model_config_line
from pyserve.bench.plot import COLORS, Chart, Series, write_plot
from pyserve.bench.report import ms, text_table
from pyserve.bench.search import pareto_front
from pyserve.bench.tune import Trial, TuneReport

REPORT_JSON = "tune.json"
REPORT_HTML = "tune.html"
CONFIG_PBTXT = "config.pbtxt"


def format_tune(report: TuneReport) -> str:
    """The table of configurations, then the winner and how the search ended."""
    settings = report.settings
    header = ["#", "batch", "preferred", "delay us", "instances", "kind", "conc", "infer/s", "p50 ms", "p99 ms", "SLO"]
    rows = [_row(trial, report.winner) for trial in report.trials]
    lines = [
        f"model '{report.model.name}', p99 target {settings.slo_p99_ms:g} ms ({settings.protocol.upper()}); "
        "each row is the configuration's best load level within the target",
        "",
        text_table(header, rows, align_left=1),
        "",
        f"tried {len(report.trials)} of {report.space.size()} configurations in {report.elapsed_s:.0f} s "
        f"({report.stopped})",
    ]
    lines += [
        f"  config {trial.number} failed: {trial.evaluation.error}" for trial in report.trials if trial.evaluation.error
    ]
    winner = report.winner
    if winner is None or winner.model_config is None:
        lines.append(f"no configuration kept p99 within {settings.slo_p99_ms:g} ms")
        return "\n".join(lines)
    best = winner.evaluation.best
    assert best is not None
    lines += [
        "",
        f"winner: config {winner.number} ({winner.evaluation.candidate.label()}): {best.throughput:,.1f} infer/s at "
        f"concurrency {best.concurrency}, p99 {best.p99_ms:.2f} ms",
        f"  {model_config_line(winner.model_config)}",
    ]
    return "\n".join(lines)


def _row(trial: Trial, winner: Trial | None) -> list[str]:
    candidate = trial.evaluation.candidate
    best = trial.evaluation.best
    mark = "*" if winner is not None and trial.number == winner.number else ""
    cells = [
        f"{trial.number}{mark}",
        str(candidate.max_batch_size),
        ",".join(map(str, candidate.preferred_batch_size)) or "-",
        str(candidate.max_queue_delay_us),
        str(candidate.instances),
        candidate.worker,
    ]
    if trial.evaluation.error is not None:
        return [*cells, "-", "-", "-", "-", "failed"]
    if best is None:
        slowest = min(trial.evaluation.points, key=lambda point: point.concurrency, default=None)
        p99 = None if slowest is None or slowest.p99_ms is None else slowest.p99_ms * 1000
        return [*cells, "-", "-", "-", ms(p99), "over"]
    return [
        *cells,
        str(best.concurrency),
        f"{best.throughput:,.1f}",
        ms(None if best.p50_ms is None else best.p50_ms * 1000),
        ms(None if best.p99_ms is None else best.p99_ms * 1000),
        "met",
    ]


def tune_chart(report: TuneReport) -> Chart:
    """p99 against throughput: every load level measured, the Pareto front, the winner and the target."""
    points = [
        (point.throughput, point.p99_ms)
        for trial in report.trials
        for point in trial.evaluation.points
        if point.p99_ms is not None
    ]
    front = pareto_front(points)
    series = [
        Series("every load level", points, "#9a9a9a", line=False, marker_radius=3.0),
        Series("Pareto front", front, COLORS[0]),
    ]
    winner = report.winner
    best = None if winner is None else winner.evaluation.best
    if winner is not None and best is not None and best.p99_ms is not None:
        label = f"config {winner.number}"
        series.append(Series("winner", [(best.throughput, best.p99_ms)], COLORS[3], labels=[label], marker_radius=6))
    target = report.settings.slo_p99_ms
    title = f"{report.model.name}: p99 latency against throughput, {len(report.trials)} configurations"
    return Chart(title, "throughput (infer/s)", "p99 latency (ms)", series, [(target, f"target {target:g} ms")])


def tune_json(report: TuneReport) -> dict[str, Any]:
    """The report as JSON: settings, every trial with its load levels, the winner."""
    settings = report.settings
    winner = report.winner
    model = report.model
    space = report.space
    return {
        "model": model.name,
        "slo_p99_ms": settings.slo_p99_ms,
        "protocol": settings.protocol,
        "budget_s": settings.budget_s,
        "elapsed_s": report.elapsed_s,
        "stopped": report.stopped,
        "space": {
            "batch_sizes": list(space.batch_sizes),
            "instance_counts": list(space.instance_counts),
            "kinds": list(space.kinds),
            "queue_delays_us": list(space.queue_delays_us),
            "preferred_batch_sizes": space.preferred,
            "devices": list(space.devices),
            "configurations": space.size(),
        },
        "trials": [
            {
                "number": trial.number,
                "candidate": trial.evaluation.candidate.to_json(),
                "model_config": None if trial.model_config is None else model_config_line(trial.model_config),
                "score_infer_per_s": trial.evaluation.score,
                "best": None if trial.evaluation.best is None else trial.evaluation.best.to_json(),
                "points": [point.to_json() for point in trial.evaluation.points],
                "error": trial.evaluation.error,
                "seconds": trial.seconds,
            }
            for trial in report.trials
        ],
        "winner": None if winner is None else winner.number,
        "winner_model_config": None
        if winner is None or winner.model_config is None
        else model_config_line(winner.model_config),
    }


def write_tune(report: TuneReport, directory: Path) -> list[Path]:
    """Write ``tune.json``, ``tune.html`` and (with a winner) ``config.pbtxt`` into ``directory``; their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / REPORT_JSON, directory / REPORT_HTML]
    written[0].write_text(json.dumps(tune_json(report), indent=2) + "\n")
    text = format_tune(report)
    winner = report.winner
    if winner is not None and winner.model_config is not None:
        model = report.model
        pbtxt = config_pbtxt(model.name, model.inputs, model.outputs, winner.model_config)
        (directory / CONFIG_PBTXT).write_text(pbtxt)
        written.append(directory / CONFIG_PBTXT)
        text += f"\n\n{CONFIG_PBTXT}:\n{pbtxt}"
    write_plot(written[1], f"pyserve tune: {report.model.name}", [tune_chart(report)], text)
    return written
