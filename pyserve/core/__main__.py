"""Entry point of the core process: ``python -m pyserve.core --config JSON --router ADDR --shm-prefix P``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any

import orjson

from pyserve.config import ServeConfig
from pyserve.core.server import serve_core
from pyserve.errors import ServerError
from pyserve.telemetry.logging_setup import configure_logging

logger = logging.getLogger("pyserve.core")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m pyserve.core")
    parser.add_argument("--config", required=True, help="ServeConfig fields as JSON")
    parser.add_argument("--router", required=True, help="ZeroMQ address workers connect to")
    parser.add_argument("--shm-prefix", required=True, help="prefix of this session's shared-memory segments")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    parser.add_argument(
        "--ready-fd", type=int, default=None, help='write the bound ports here once serving, or {"error": ...}'
    )
    args = parser.parse_args()
    config = ServeConfig(**orjson.loads(args.config))
    configure_logging(config.log_level, config.log_format)
    try:
        _run(serve_core(config, args.router, args.shm_prefix, args.parent_pid, args.ready_fd))
    except ServerError as exc:
        # An expected failure to start (a port in use): one line for Serve to raise, and no traceback.
        if not _report_to_parent(args.ready_fd, str(exc)):
            logger.error("%s", exc)
        sys.exit(1)


def _run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # uvloop is optional off Linux/macOS
        asyncio.run(main)
    else:
        uvloop.run(main)


def _report_to_parent(ready_fd: int | None, error: str) -> bool:
    """Write ``{"error": ...}`` where Serve waits for the ports; False when there is no such pipe (any more)."""
    if ready_fd is None:
        return False
    try:
        os.write(ready_fd, orjson.dumps({"error": error}) + b"\n")
    except OSError:
        return False
    return True


if __name__ == "__main__":
    main()
