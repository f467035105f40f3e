"""The command lines of ``pyserve bench`` and ``pyserve tune`` (``pyserve.cli`` adds them as subcommands).

Options map onto ``BenchSettings`` and ``TuneSettings``; the handlers run the benchmark or the search, print the
final table on stdout (progress goes to stderr) and write the files asked for. docs/bench.md describes them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pyserve.bench.plot import PLOT_SUFFIXES
from pyserve.bench.progress import Progress
from pyserve.bench.settings import (
    DISTRIBUTIONS,
    BenchSettings,
    LoadLevel,
    levels_of,
    parse_counts,
    parse_duration,
    parse_rates,
    parse_shape,
)
from pyserve.client.tls import ClientTls

if TYPE_CHECKING:
    from pyserve.serve import Serve

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
OUTPUT_SUFFIXES = (".json", ".csv")
DEFAULT_CONCURRENCY = (1, 4, 16, 64)
T = TypeVar("T")


def _argument(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from one of ``settings``' parsers (their ValueError becomes argparse's message)."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise ValueError(f"{text!r}: expected NAME:VALUE")
    return name.strip(), value.strip()


def _path_with(suffixes: Sequence[str]) -> Callable[[str], Path]:
    def parse_path(text: str) -> Path:
        path = Path(text)
        if path.suffix.lower() not in suffixes:
            raise ValueError(f"{text!r}: the file name must end in {' or '.join(suffixes)}")
        return path

    return parse_path


def _kinds(text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    if not kinds or any(kind not in ("thread", "process") for kind in kinds):
        raise ValueError(f"{text!r}: expected thread, process or thread,process")
    return kinds


def _delays(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{text!r}: expected comma-separated microseconds such as 0,100,500") from None
    if not values or any(value < 0 for value in values):
        raise ValueError(f"{text!r}: expected microseconds >= 0 such as 0,100,500")
    return values


def _add_request_options(parser: argparse.ArgumentParser, batch_size: bool) -> None:
    group = parser.add_argument_group("requests")
    if batch_size:
        group.add_argument(
            "-b",
            "--batch-size",
            type=int,
            default=1,
            metavar="N",
            help="rows per request, for a model that batches (1)",
        )
    group.add_argument(
        "--shape",
        action="append",
        type=_argument(parse_shape),
        default=[],
        metavar="NAME:DIMS",
        help="an input's dimensions without the batch dimension, for one the model declares variable: INPUT0:16",
    )
    group.add_argument(
        "--data", metavar="FILE.json", help='inputs from a file (perf_analyzer\'s {"data": [...]}) instead of random'
    )
    group.add_argument("--string-length", type=int, default=16, metavar="N", help="random BYTES length (16)")
    group.add_argument(
        "--header",
        action="append",
        type=_argument(_header),
        default=[],
        metavar="NAME:VALUE",
        help="an HTTP header (gRPC metadata) sent with every request",
    )
    tls = parser.add_argument_group("TLS (for an https:// or grpcs:// server)")
    tls.add_argument(
        "--tls-ca-file", metavar="PEM", help="the certificate authorities to trust (default: the system's)"
    )
    tls.add_argument("--tls-client-cert", metavar="PEM", help="mutual TLS: the client's certificate (chain)")
    tls.add_argument("--tls-client-key", metavar="PEM", help="the private key of --tls-client-cert")


def _add_measurement_options(parser: argparse.ArgumentParser, window: str, warmup: str, duration: str) -> None:
    group = parser.add_argument_group("measurement")
    group.add_argument(
        "--duration",
        type=_argument(parse_duration),
        default=duration,
        metavar="TIME",
        help=f"the longest a step measures, after its warm-up ({duration})",
    )
    group.add_argument(
        "--window", type=_argument(parse_duration), default=window, metavar="TIME", help=f"one measurement ({window})"
    )
    group.add_argument(
        "--warmup",
        type=_argument(parse_duration),
        default=warmup,
        metavar="TIME",
        help=f"load sent before measuring each step, not counted ({warmup})",
    )
    group.add_argument(
        "--stability",
        type=float,
        default=10.0,
        metavar="PERCENT",
        help="a step ends when its last 3 windows agree within this, in throughput and mean latency (10)",
    )
    group.add_argument(
        "--processes", type=int, metavar="N", help="client processes (default: as the load needs, up to half the CPUs)"
    )
    group.add_argument(
        "--timeout", type=_argument(parse_duration), default="60s", metavar="TIME", help="a request's limit (60s)"
    )
    group.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    group.add_argument("--log-level", type=str.upper, choices=_LOG_LEVELS, help="WARNING (default), INFO, DEBUG ...")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """``pyserve bench``'s options."""
    parser.add_argument("model", help="the model to measure")
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:8000",
        help="the server: http://HOST:PORT or grpc://HOST:PORT (default http://127.0.0.1:8000)",
    )
    parser.add_argument("--model-version", metavar="V", help="a version of the model (default: the server's choice)")
    load = parser.add_argument_group("load (one of)")
    load.add_argument(
        "--concurrency",
        type=_argument(parse_counts),
        metavar="N,N,...",
        help="closed loop: requests kept in flight, one step each (default 1,4,16,64)",
    )
    load.add_argument(
        "--request-rate",
        type=_argument(parse_rates),
        metavar="R,R,...",
        help="open loop: requests sent per second whatever the answers, one step each",
    )
    load.add_argument(
        "--distribution", choices=DISTRIBUTIONS, default="constant", help="open loop: intervals (constant)"
    )
    load.add_argument(
        "--max-in-flight", type=int, default=1024, metavar="N", help="open loop: requests in flight at most (1024)"
    )
    _add_request_options(parser, batch_size=True)
    _add_measurement_options(parser, window="1s", warmup="1s", duration="10s")
    output = parser.add_argument_group("results")
    output.add_argument(
        "--output",
        type=_argument(_path_with(OUTPUT_SUFFIXES)),
        metavar="FILE",
        help="write the results: .json (everything) or .csv (one row per step)",
    )
    output.add_argument(
        "--plot",
        type=_argument(_path_with(PLOT_SUFFIXES)),
        metavar="FILE",
        help="write latency against throughput: .html (with the table) or .svg",
    )


def _bench_settings(
    args: argparse.Namespace, model: str, url: str, levels: tuple[LoadLevel, ...], batch_size: int
) -> BenchSettings:
    return BenchSettings(
        model=model,
        url=url,
        model_version=getattr(args, "model_version", None),
        levels=levels,
        batch_size=batch_size,
        shapes=dict(args.shape),
        data_file=args.data,
        string_length=args.string_length,
        warmup_s=args.warmup,
        window_s=args.window,
        duration_s=args.duration,
        stability=args.stability / 100.0,
        processes=args.processes,
        distribution=getattr(args, "distribution", "constant"),
        max_in_flight=getattr(args, "max_in_flight", 1024),
        request_timeout_s=args.timeout,
        headers=dict(args.header),
        tls=_client_tls(args),
    )


def _client_tls(args: argparse.Namespace) -> ClientTls | None:
    """The ``--tls-*`` options (None when none is given: an https:// URL then trusts the system's authorities)."""
    files = (args.tls_ca_file, args.tls_client_cert, args.tls_client_key)
    return None if files == (None, None, None) else ClientTls(*files)


def _progress(args: argparse.Namespace) -> Progress:
    return Progress(None if args.quiet else sys.stderr)


def run_bench_command(args: argparse.Namespace) -> int:
    """``pyserve bench``: measure, print the table, write ``--output`` and ``--plot``. Status 1 when a step had no
    successful request."""
    from pyserve.bench.report import format_report, write_bench_plot, write_output
    from pyserve.bench.runner import run_bench

    levels = levels_of(args.concurrency or (() if args.request_rate else DEFAULT_CONCURRENCY), args.request_rate or ())
    settings = _bench_settings(args, args.model, args.url, levels, args.batch_size)
    report = run_bench(settings, _progress(args))
    print(format_report(report), flush=True)
    if args.output is not None:
        write_output(report, args.output)
        print(f"results: {args.output}")
    if args.plot is not None:
        write_bench_plot(report, args.plot)
        print(f"plot: {args.plot}")
    failed = [step for step in report.steps if step.measured.successes == 0]
    if failed:
        print(f"pyserve bench: no request succeeded at {failed[0].level.label()}", file=sys.stderr)
        return 1
    return 0


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """``pyserve tune``'s options (besides the model options it shares with ``pyserve serve``)."""
    parser.add_argument(
        "target", help="module:NAME: a pyserve.Serve with the model bound (default NAME: server) or a function"
    )
    parser.add_argument("--model", help="the model to tune, when the Serve binds several")
    parser.add_argument("--slo-p99-ms", type=float, required=True, metavar="MS", help="the p99 latency target")
    search = parser.add_argument_group("search")
    search.add_argument(
        "--max-instances", type=int, default=4, metavar="N", help="instances to try up to, per GPU where there are (4)"
    )
    search.add_argument(
        "--kinds",
        type=_argument(_kinds),
        default=["thread", "process"],
        metavar="KINDS",
        help="worker kinds to try: thread, process or thread,process (both; on GPUs: process)",
    )
    search.add_argument(
        "--queue-delays-us",
        type=_argument(_delays),
        default=[0, 100, 500, 2000],
        metavar="US,US,...",
        help="max queue delays to try, below a quarter of the target (0,100,500,2000)",
    )
    search.add_argument(
        "--no-preferred-sizes", action="store_true", help="do not try preferred batch sizes (half and full)"
    )
    search.add_argument(
        "--budget", type=_argument(parse_duration), default="5m", metavar="TIME", help="the longest to search (5m)"
    )
    search.add_argument(
        "--concurrency",
        type=_argument(parse_counts),
        metavar="N,N,...",
        help="measure these concurrencies on each configuration instead of sweeping for the best",
    )
    search.add_argument(
        "--max-concurrency", type=int, default=1024, metavar="N", help="the sweep's highest concurrency (1024)"
    )
    search.add_argument("--protocol", choices=("http", "grpc"), default="http", help="how requests are sent (http)")
    search.add_argument("--gpus", type=int, metavar="N", help="GPUs to place instances on (default: those visible)")
    _add_request_options(parser, batch_size=False)
    _add_measurement_options(parser, window="1s", warmup="0.5s", duration="5s")
    parser.add_argument(
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="where tune.json, tune.html and the winner's config.pbtxt go (default: tune-MODEL)",
    )


def run_tune_command(args: argparse.Namespace, server: Serve) -> int:
    """``pyserve tune`` on ``server`` (a ``Serve`` with the model bound, not started): search, print the table and
    the winner, write the report. Status 1 when no configuration met the target."""
    from pyserve.bench.tune import ModelUnderTune, TuneSettings, run_tune
    from pyserve.bench.tune_report import format_tune, write_tune

    model = ModelUnderTune.from_serve(server, args.model)
    bench = _bench_settings(args, model.name, "http://127.0.0.1:0", levels_of(), 1)
    settings = TuneSettings(
        slo_p99_ms=args.slo_p99_ms,
        bench=bench,
        max_instances=args.max_instances,
        kinds=tuple(args.kinds),
        queue_delays_us=tuple(args.queue_delays_us),
        preferred=not args.no_preferred_sizes,
        budget_s=args.budget,
        concurrency=tuple(args.concurrency or ()),
        max_concurrency=args.max_concurrency,
        protocol=args.protocol,
        gpus=args.gpus,
    )
    report = run_tune(model, settings, _progress(args))
    print(format_tune(report), flush=True)
    directory = args.output_dir or Path(f"tune-{model.name}")
    for path in write_tune(report, directory):
        print(f"wrote {path}")
    return 0 if report.winner is not None else 1
