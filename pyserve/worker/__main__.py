"""Entry point of a process instance: ``python -m pyserve.worker --router ADDR --payload FILE --index N ...``.

Spawned by the core's supervisor. Reads the model spec and the pickled callable(s), then runs the same instance
loop as a thread instance until the core says stop, SIGTERM arrives or the core goes away (the pipe passed as
``--parent-fd`` reaches end-of-file).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from types import FrameType

from pyserve.telemetry.logging_setup import configure_logging
from pyserve.transport.payload import error_path, read_payload
from pyserve.worker.instance import InstanceRunner

EXIT_NOT_READY = 3


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m pyserve.worker")
    parser.add_argument("--router", required=True)
    parser.add_argument("--payload", required=True, help="file with the pickled spec and callable(s)")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shm-prefix", required=True)
    parser.add_argument("--shm-threshold", type=int, required=True)
    parser.add_argument("--shm-limit", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--parent-fd", type=int, default=-1, help="pipe that reaches end-of-file when the core dies")
    parser.add_argument("--debug-errors", action="store_true", help="send tracebacks to clients (ServeConfig)")
    parser.add_argument("--stage-times", action="store_true", help="stamp each batch's stages (ServeConfig)")
    parser.add_argument("--spin-us", type=int, default=0, help="poll this long for the next batch (ServeConfig)")
    parser.add_argument("--cancel", default="", help="the core's cancel publisher, subscribed to before the hello")
    args = parser.parse_args()
    # The core exports its log settings to the processes it spawns.
    configure_logging(os.environ.get("PYSERVE_LOG_LEVEL", "WARNING"), os.environ.get("PYSERVE_LOG_FORMAT", "default"))
    spec, functions = read_payload(args.payload)
    function = functions[args.index % len(functions)]
    stop = threading.Event()
    # The instance sleeps in poll() on its socket and these descriptors: a signal writes a byte to wake it.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        with contextlib.suppress(BlockingIOError):
            os.write(wake_write, b"\0")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    wake_fds = [wake_read] if args.parent_fd < 0 else [wake_read, args.parent_fd]
    errors: list[str] = []

    def on_ready(error: str | None) -> None:
        if error:
            errors.append(error)

    runner = InstanceRunner(
        args.router,
        spec,
        function,
        args.index,
        args.shm_prefix,
        args.shm_threshold,
        args.shm_limit,
        device=args.device,
        kind="process",
        parent_pid=args.parent_pid,
        debug_errors=args.debug_errors,
        stage_times=args.stage_times,
        spin_us=args.spin_us,
        cancel_address=args.cancel,
    )
    runner.run(stop, on_ready, wake_fds)
    if errors:
        print(f"pyserve: instance {args.index} of model '{spec.name}' failed to start:\n{errors[0]}", file=sys.stderr)
        # The core reads the reason back for the repository index and the load's answer.
        with contextlib.suppress(OSError), open(error_path(args.payload, args.index), "w") as handle:
            handle.write(errors[0])
        sys.exit(EXIT_NOT_READY)


if __name__ == "__main__":
    main()
