"""Entry point of the core process: ``python -m pyserve.core --config JSON --router ADDR --shm-prefix P``."""

from __future__ import annotations

import argparse
import asyncio

import orjson

from pyserve.config import ServeConfig
from pyserve.core.logs import configure_logging
from pyserve.core.server import serve_core


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m pyserve.core")
    parser.add_argument("--config", required=True, help="ServeConfig fields as JSON")
    parser.add_argument("--router", required=True, help="ZeroMQ address workers connect to")
    parser.add_argument("--shm-prefix", required=True, help="prefix of this session's shared-memory segments")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    parser.add_argument("--ready-fd", type=int, default=None, help="write the bound ports here once serving")
    args = parser.parse_args()
    config = ServeConfig(**orjson.loads(args.config))
    configure_logging(config.log_level, config.log_format)
    main = serve_core(config, args.router, args.shm_prefix, args.parent_pid, args.ready_fd)
    try:
        import uvloop
    except ImportError:  # uvloop is optional off Linux/macOS
        asyncio.run(main)
    else:
        uvloop.run(main)


if __name__ == "__main__":
    main()
