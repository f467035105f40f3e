"""Where one request's time goes: the latency budget of an HTTP infer request, stage by stage.

Run from the repository root::

    .venv/bin/python benchmarks/hop_budget.py [--requests 2000] [--warmup 200] [--floats 16] [--json out.json]

It starts ``pyserve_server.py`` (the identity model ``identity_fp32``, one thread instance, ``@batch``) with the
stage-times switch on (``PYSERVE_STAGE_TIMES``, see ``pyserve/core/stage_times.py``), sends ``--warmup`` and then
``--requests`` sequential requests of ``--floats`` FP32 values as binary tensor data over one keep-alive connection
(a raw socket, concurrency 1), stops the server and reads the stamps it wrote: one line per request, taken with
``time.monotonic_ns()`` in the core and the instance. The client stamps each request too (same clock), so the time
outside the server (client, kernel, the socket read and the HTTP parse) shows beside the server's stages.

It does this twice: with the core's reply spin at its default (``ServeConfig.reply_spin_us``) and with
``PYSERVE_REPLY_SPIN_US=0``, and prints the median and p90 of each interval for both. docs/architecture.md
("Latency budget") has a run's table and what each interval is made of.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    MODEL_NAME,
    BenchError,
    bench_main,
    cpu_busy_fraction,
    format_table,
    pyserve_spec,
    running_server,
)

# (label, from, to): consecutive stages, then the server's total. "client_sent" and "client_received" are the
# client's own stamps, taken right before it sends a request and right after it has read the whole response.
INTERVALS = (
    ("front end: route, decode, build, submit", "complete", "submitted"),
    ("queue + dispatch (batch layout, header)", "submitted", "sent"),
    ("core -> worker hop", "sent", "worker_received"),
    ("worker decode", "worker_received", "worker_decoded"),
    ("user function", "worker_decoded", "worker_returned"),
    ("worker encode + send", "worker_returned", "worker_sent"),
    ("worker -> core hop", "worker_sent", "received"),
    ("core result decode, response encode, write", "received", "written"),
    ("= in the server (complete -> written)", "complete", "written"),
    ("client send -> request complete", "client_sent", "complete"),
    ("response written -> client has read it", "written", "client_received"),
    ("= outside the server (client + kernel)", "", ""),
    ("client round trip", "client_sent", "client_received"),
)
RECV_BYTES = 65536


@dataclasses.dataclass(frozen=True)
class Run:
    """One configuration measured: its name and the environment it adds to the server's."""

    name: str
    env: dict[str, str]


RUNS = (Run("spin on (default)", {}), Run("PYSERVE_REPLY_SPIN_US=0", {"PYSERVE_REPLY_SPIN_US": "0"}))


# the client -------------------------------------------------------------------------------------------------------


def infer_request(host: str, floats: int) -> bytes:
    """One binary-data KServe infer request for ``identity_fp32`` with ``floats`` FP32 zeros, keep-alive."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, floats],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * floats},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        },
        separators=(",", ":"),
    ).encode()
    body = header + bytes(4 * floats)
    head = (
        f"POST /v2/models/{MODEL_NAME}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def read_response(sock: socket.socket, pending: bytearray) -> None:
    """Read one whole response (status 200 expected) from ``sock``; what follows it stays in ``pending``."""
    while (end := pending.find(b"\r\n\r\n")) < 0:
        chunk = sock.recv(RECV_BYTES)
        if not chunk:
            raise BenchError("the server closed the connection")
        pending += chunk
    head = bytes(pending[:end]).lower()
    if not head.startswith(b"http/1.1 200"):
        raise BenchError(f"unexpected response: {bytes(pending[: end + 200])!r}")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name == b"content-length":
            length = int(value)
    total = end + 4 + length
    while len(pending) < total:
        chunk = sock.recv(RECV_BYTES)
        if not chunk:
            raise BenchError("the server closed the connection")
        pending += chunk
    del pending[:total]


def send_requests(url: str, floats: int, count: int) -> list[tuple[int, int]]:
    """``count`` sequential requests on one connection: (sent, received) ``time.monotonic_ns()`` of each."""
    host, port = url.rsplit(":", 1)
    request = infer_request(url, floats)
    stamps: list[tuple[int, int]] = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending = bytearray()
        for _ in range(count):
            sent = time.monotonic_ns()
            sock.sendall(request)
            read_response(sock, pending)
            stamps.append((sent, time.monotonic_ns()))
    return stamps


# one run ----------------------------------------------------------------------------------------------------------


def measure(run: Run, index: int, requests: int, warmup: int, floats: int, work_dir: Path) -> dict[str, list[float]]:
    """Start the server for ``run`` (the ``index``-th), send the requests, stop it; each interval's values (µs)."""
    stage_file = work_dir / f"stages-{index}.jsonl"
    stage_file.unlink(missing_ok=True)
    spec = pyserve_spec()
    env = {**spec.env, **run.env, "PYSERVE_STAGE_TIMES": str(stage_file)}
    spec = dataclasses.replace(spec, env=env)
    print(f"{run.name}: starting pyserve (http port {spec.http_port}) ...", flush=True)
    with running_server(spec, work_dir / f"server-{index}.log") as url:
        client = send_requests(url, floats, warmup + requests)
    if not stage_file.exists():
        raise BenchError(f"the server wrote no stage times to {stage_file}")
    lines = [json.loads(line) for line in stage_file.read_text().splitlines()]
    if len(lines) != len(client):
        raise BenchError(f"{len(client)} requests sent but {len(lines)} lines of stage times written")
    values: dict[str, list[float]] = {label: [] for label, _, _ in INTERVALS}
    for (sent, received), line in list(zip(client, lines, strict=True))[warmup:]:
        stamps = {**line, "client_sent": sent, "client_received": received}
        for label, start, end in INTERVALS:
            if start:
                values[label].append((stamps[end] - stamps[start]) / 1000)
        outside = (received - sent) - (line["written"] - line["complete"])
        values["= outside the server (client + kernel)"].append(outside / 1000)
    return values


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def report(results: dict[str, dict[str, list[float]]]) -> str:
    """The table: per interval, its median and p90 (µs) in each run."""
    header = ["interval (µs)"]
    for name in results:
        header += [f"{name} p50", "p90"]
    rows = []
    for label, _, _ in INTERVALS:
        row = [label]
        for values in results.values():
            row += [f"{statistics.median(values[label]):.1f}", f"{percentile(values[label], 0.9):.1f}"]
        rows.append(row)
    return format_table(header, rows)


@bench_main
def main(argv: Sequence[str] | None = None) -> int:
    """Measure every run and print the budget."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests measured per run (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="requests sent first and left out (default 200)")
    parser.add_argument("--floats", type=int, default=16, help="FP32 values per request (default 16)")
    parser.add_argument("--json", type=Path, default=None, help="also write each interval's p50/p90 here")
    args = parser.parse_args(argv)
    busy = cpu_busy_fraction()
    if busy is not None:
        print(f"CPU busy before the runs: {busy:.0%} of {os.cpu_count()} CPUs", flush=True)
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="hop-budget-") as tmp:
        for index, run in enumerate(RUNS):
            results[run.name] = measure(run, index, args.requests, args.warmup, args.floats, Path(tmp))
    print(
        f"\n{args.requests} sequential requests of {args.floats} FP32 (binary data), one keep-alive connection, "
        f"model {MODEL_NAME} (thread instance); medians and p90 of each interval, each taken on its own"
    )
    print(report(results))
    if args.json is not None:
        summary: dict[str, Any] = {
            name: {label: {"p50_us": statistics.median(v), "p90_us": percentile(v, 0.9)} for label, v in values.items()}
            for name, values in results.items()
        }
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
