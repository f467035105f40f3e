"""The floor for pyserve over HTTP: a bare httptools + uvloop KServe server with no model and no worker hop.

``python benchmarks/http_floor_server.py --http-port PORT [--parent-pid PID]`` serves just enough of the KServe v2
HTTP protocol for perf_analyzer (health, model metadata, config, statistics, and an infer that echoes ``INPUT0``
as ``OUTPUT0`` in the binary tensor extension or JSON). It parses and answers in the same way pyserve's front end
does (httptools callbacks, orjson headers, zero-copy slices of the body), so the difference between the two is
what pyserve adds: scheduling, the hop to the worker and back, encoding the worker's answer.
Blocks until SIGINT/SIGTERM (or until the parent process is gone).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from typing import Any

import httptools
import orjson
import uvloop
from _common import MODEL_NAME, watch_parent

_METADATA = orjson.dumps(
    {
        "name": MODEL_NAME,
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}],
    }
)
_CONFIG = orjson.dumps(
    {
        "name": MODEL_NAME,
        "platform": "",
        "backend": "python",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 64,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "dynamic_batching": {},
    }
)
_STAT_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
_answered = 0


def _statistics() -> bytes:
    # perf_analyzer reads the model's statistics around each window; the floor counts its answers and no durations.
    counted = {"count": _answered, "ns": 0}
    zero = {"count": 0, "ns": 0}
    stats = {key: zero if key in ("fail", "cache_hit", "cache_miss") else counted for key in _STAT_KEYS}
    entry = {
        "name": MODEL_NAME,
        "version": "1",
        # perf_analyzer without -x takes the version inferred last: it must be set once anything was answered.
        "last_inference": int(time.time() * 1000) if _answered else 0,
        "inference_count": _answered,
        "execution_count": _answered,
        "inference_stats": stats,
        "response_stats": {},
        "batch_stats": [],
        "memory_usage": [],
    }
    return orjson.dumps({"model_stats": [entry]})


_SERVER = orjson.dumps({"name": "floor", "version": "0", "extensions": ["binary_tensor_data", "statistics"]})
_EMPTY = b""


class FloorProtocol(asyncio.Protocol):
    """One connection: httptools parses, each complete request is answered at once."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = bytearray()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        path = self.url.split(b"?", 1)[0]
        if path.endswith(b"/infer"):
            self._infer()
        elif path.endswith(b"/config"):
            self._send(200, _CONFIG)
        elif path.endswith(b"/stats"):
            self._send(200, _statistics())
        elif path.endswith(b"/ready") or path.endswith(b"/live"):
            self._send(200, _EMPTY)
        elif path in (b"/v2", b"/v2/"):
            self._send(200, _SERVER)
        elif path == b"/v2/models/" + MODEL_NAME.encode() or path.endswith(b"/versions/1"):
            self._send(200, _METADATA)
        else:
            self._send(404, orjson.dumps({"error": f"unknown path {path.decode(errors='replace')}"}))

    def _infer(self) -> None:
        global _answered
        _answered += 1
        body = memoryview(self.body)
        header_length = self.headers.get(b"inference-header-content-length")
        if header_length is None:
            request = orjson.loads(body)
            tensor = request["inputs"][0]
            answer = {
                "model_name": MODEL_NAME,
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": tensor["shape"], "data": tensor["data"]}],
            }
            self._send(200, orjson.dumps(answer))
            return
        split = int(header_length)
        request = orjson.loads(body[:split])
        tensor = request["inputs"][0]
        nbytes = tensor["parameters"]["binary_data_size"]
        answer = {
            "model_name": MODEL_NAME,
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "datatype": "FP32",
                    "shape": tensor["shape"],
                    "parameters": {"binary_data_size": nbytes},
                }
            ],
        }
        head = orjson.dumps(answer)
        self._send(200, head, body[split : split + nbytes], binary_header=len(head))

    def _send(self, status: int, payload: bytes, extra: Any = _EMPTY, binary_header: int | None = None) -> None:
        assert self.transport is not None
        length = len(payload) + len(extra)
        lines = b"HTTP/1.1 %d %s\r\ncontent-length: %d\r\n" % (status, b"OK" if status == 200 else b"Error", length)
        if binary_header is not None:
            lines += (
                b"content-type: application/octet-stream\r\ninference-header-content-length: %d\r\n" % binary_header
            )
        else:
            lines += b"content-type: application/json\r\n"
        self.transport.writelines((lines + b"\r\n", payload, extra))


async def serve(port: int) -> None:
    """Serve until SIGINT/SIGTERM (``watch_parent`` sends SIGTERM when the benchmark driver is gone)."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopped.set)
    server = await loop.create_server(FloorProtocol, "127.0.0.1", port, reuse_address=True)
    await stopped.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, default=0, help="ignored (benchmark servers share one command line)")
    parser.add_argument("--parent-pid", type=int, default=0)
    args = parser.parse_args()
    if args.parent_pid:
        watch_parent(args.parent_pid)
    uvloop.run(serve(args.http_port))


if __name__ == "__main__":
    main()
