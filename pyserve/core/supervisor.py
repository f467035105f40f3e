"""Process instances: spawn one worker process per instance, watch them, restart the ones that die.

The core owns the processes (so a crash is noticed even while the user's process is busy) but never unpickles
user code: the worker process reads the pickled callable from a file the core wrote. Each process gets
``CUDA_VISIBLE_DEVICES`` for its GPU, so inside it the device is ``cuda:0``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# A process that lived this long is considered healthy again: its next restart starts from the first delay.
HEALTHY_AFTER_S = 60.0
STOP_TIMEOUT_S = 5.0


@dataclass(eq=False)
class WorkerProcess:
    """One instance's process and its restart history."""

    model: str
    version: int
    index: int
    device: str
    payload_path: str
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff_s: float = BACKOFF_START_S
    restarts: int = 0
    ready: bool = False
    restart_at: float | None = None
    last_pid: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0


def describe_exit(status: int) -> str:
    """'exit status 3' or 'killed by SIGKILL' for a Popen return code."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def placement(devices: tuple[str, ...], index: int) -> tuple[str, dict[str, str]]:
    """The device string an instance sees and the environment that pins it there (round-robin over devices)."""
    if not devices:
        return "cpu", {}
    device = devices[index % len(devices)]
    if device.startswith("cuda:"):
        return "cuda:0", {"CUDA_VISIBLE_DEVICES": device.split(":", 1)[1]}
    if device == "cpu":
        return "cpu", {"CUDA_VISIBLE_DEVICES": ""}
    return device, {}


class Supervisor:
    """Starts, watches and restarts worker processes; tells the core when one exits."""

    def __init__(
        self,
        router_address: str,
        shm_prefix: str,
        shm_threshold: int,
        shm_limit: int,
        on_exit: Callable[[WorkerProcess, int], None],
    ) -> None:
        self.router_address = router_address
        self.shm_prefix = shm_prefix
        self.shm_threshold = shm_threshold
        self.shm_limit = shm_limit
        self._on_exit = on_exit
        self.workers: list[WorkerProcess] = []

    def spawn(self, worker: WorkerProcess) -> None:
        """Start (or restart) a worker's process."""
        device, env_update = worker.device, worker.extra.get("env", {})
        env = dict(os.environ)
        env.update(env_update)
        command = [
            sys.executable,
            "-m",
            "pyserve.worker",
            "--router",
            self.router_address,
            "--payload",
            worker.payload_path,
            "--index",
            str(worker.index),
            "--device",
            device,
            "--shm-prefix",
            self.shm_prefix,
            "--shm-threshold",
            str(self.shm_threshold),
            "--shm-limit",
            str(self.shm_limit),
            "--parent-pid",
            str(os.getpid()),
        ]
        worker.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
        worker.last_pid = worker.process.pid
        worker.started_at = time.monotonic()
        worker.ready = False
        worker.restart_at = None
        if worker not in self.workers:
            self.workers.append(worker)

    def add(
        self, model: str, version: int, count: int, devices: tuple[str, ...], payload_path: str
    ) -> list[WorkerProcess]:
        """Start ``count`` instances of a model, placed round-robin on ``devices``."""
        started = []
        for index in range(count):
            device, env = placement(devices, index)
            worker = WorkerProcess(model, version, index, device, payload_path, extra={"env": env})
            self.spawn(worker)
            started.append(worker)
        return started

    def find(self, pid: int) -> WorkerProcess | None:
        """The worker whose current process has this pid."""
        for worker in self.workers:
            if worker.pid == pid:
                return worker
        return None

    def poll(self) -> None:
        """Notice exited processes (reported through on_exit) and start due restarts."""
        now = time.monotonic()
        for worker in list(self.workers):
            process = worker.process
            if process is not None:
                status = process.poll()
                if status is not None:
                    worker.process = None
                    lived = now - worker.started_at
                    if lived >= HEALTHY_AFTER_S:
                        worker.backoff_s = BACKOFF_START_S
                    self._on_exit(worker, status)
            elif worker.restart_at is not None and now >= worker.restart_at:
                worker.restarts += 1
                logger.warning(
                    "restarting instance %d of model '%s' (restart %d)", worker.index, worker.model, worker.restarts
                )
                self.spawn(worker)

    def schedule_restart(self, worker: WorkerProcess) -> float:
        """Restart a worker after its backoff delay (which then doubles, up to BACKOFF_MAX_S)."""
        delay = worker.backoff_s
        worker.restart_at = time.monotonic() + delay
        worker.backoff_s = min(worker.backoff_s * 2, BACKOFF_MAX_S)
        return delay

    def remove_model(self, model: str, version: int) -> None:
        """Stop and forget every worker of a model version."""
        doomed = [w for w in self.workers if w.model == model and w.version == version]
        self.workers = [w for w in self.workers if w not in doomed]
        _terminate([w.process for w in doomed if w.process is not None])

    def close(self) -> None:
        """Stop every worker process (SIGTERM, then SIGKILL after a grace period)."""
        processes = [w.process for w in self.workers if w.process is not None]
        self.workers = []
        _terminate(processes)


def _terminate(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
