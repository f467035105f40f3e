"""Entry point of a process instance: ``python -m pyserve.worker --router ADDR --payload FILE --index N ...``.

Spawned by the core's supervisor. Reads the model spec and the pickled callable(s), then runs the same instance
loop as a thread instance until the core says stop, SIGTERM arrives or the core goes away.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

import cloudpickle

from pyserve.config import ModelSpec
from pyserve.core.logs import configure_logging
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
    args = parser.parse_args()
    # The core exports its log settings to the processes it spawns.
    configure_logging(os.environ.get("PYSERVE_LOG_LEVEL", "WARNING"), os.environ.get("PYSERVE_LOG_FORMAT", "default"))
    with open(args.payload, "rb") as handle:
        payload: dict[str, Any] = cloudpickle.load(handle)
    spec = ModelSpec.from_wire(payload["spec"])
    sys.path.extend(path for path in payload["sys_path"] if path not in sys.path)
    functions = cloudpickle.loads(payload["functions"])
    function = functions[args.index % len(functions)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
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
    )
    runner.run(stop, on_ready)
    if errors:
        print(f"pyserve: instance {args.index} of model '{spec.name}' failed to start:\n{errors[0]}", file=sys.stderr)
        sys.exit(EXIT_NOT_READY)


if __name__ == "__main__":
    main()
