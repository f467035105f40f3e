"""Entry point of the core process: ``python -m pyserve.core --config JSON --router ADDR --shm-prefix P``.

This is where the core process is put together, and the one module of ``pyserve.core`` that imports the front
ends: it builds the ``CoreServer``, starts the front ends with the core's ``CoreApi`` (``start_listeners``),
reports the bound ports to ``Serve`` through the ready pipe, and closes both in order when the core stops.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

import orjson

from pyserve.config import ServeConfig
from pyserve.core.server import CoreServer
from pyserve.core.supervisor import STOP_TIMEOUT_S
from pyserve.errors import ServerError
from pyserve.frontends.listeners import Listeners, start_listeners
from pyserve.server_config import CORE_CONFIG_ENV
from pyserve.telemetry.logging_setup import configure_logging
from pyserve.transport.curve import TOKEN_ENV

logger = logging.getLogger("pyserve.core")

# How long process instances still busy after the drain get between SIGTERM and SIGKILL.
_BUSY_GRACE_S = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m pyserve.core")
    parser.add_argument("--router", required=True, help="ZeroMQ address workers connect to")
    parser.add_argument("--shm-prefix", required=True, help="prefix of this session's shared-memory segments")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    parser.add_argument(
        "--ready-fd", type=int, default=None, help='write the bound ports here once serving, or {"error": ...}'
    )
    args = parser.parse_args()
    # ServeConfig's fields as JSON, by environment (they hold secrets); gone from the environment process instances
    # inherit, as is a remote token the user's environment held.
    config = ServeConfig(**orjson.loads(os.environ.pop(CORE_CONFIG_ENV)))
    os.environ.pop(TOKEN_ENV, None)
    configure_logging(config.log_level, config.log_format)
    try:
        _run(serve_core(config, args.router, args.shm_prefix, args.parent_pid, args.ready_fd))
    except ServerError as exc:
        # An expected failure to start (a port in use): one line for Serve to raise, and no traceback.
        if not _report_to_parent(args.ready_fd, str(exc)):
            logger.error("%s", exc)
        sys.exit(1)


async def serve_core(
    config: ServeConfig, router_address: str, shm_prefix: str, parent_pid: int, ready_fd: int | None
) -> None:
    """Run the core and its front ends until stopped; reports the ports on ``ready_fd`` once they accept
    connections. A front end that cannot listen raises ServerError."""
    core = CoreServer(config, router_address, shm_prefix, parent_pid)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, core.stop)
    if parent_pid and os.getppid() != parent_pid:
        return
    listeners: Listeners | None = None
    grace_s = STOP_TIMEOUT_S
    try:
        await core.start()
        listeners = await start_listeners(core.api, config)
        if ready_fd is not None:
            ready = {
                "http_port": listeners.http_port,
                "grpc_port": listeners.grpc_port,
                "metrics_port": listeners.metrics_port,
                "router": core.router_address,
                "cancel": core.batches.cancel_address,
                "remote": core.remote_address,
            }
            os.write(ready_fd, orjson.dumps(ready) + b"\n")
            os.close(ready_fd)
        await core.wait_stopped()
        # Graceful: take nothing new, let what was accepted finish (at most exit_timeout_s), then close.
        # (Not when the parent died: its thread instances died with it.)
        core.begin_drain()
        listeners.stop_accepting()
        timeout_s = 0.0 if core.parent_gone else config.exit_timeout_s
        left, _ = await asyncio.gather(core.drain(timeout_s), listeners.stop_grpc(grace_s=timeout_s))
        if left:
            logger.warning("stopping with %d request(s) still in flight after %.1f s", left, timeout_s)
            grace_s = _BUSY_GRACE_S  # instances still busy past the timeout are not waited for long
    finally:
        # Front ends first: nothing new arrives while the core fails what is in flight.
        if listeners is not None:
            await listeners.close()
        await core.close(grace_s)


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
