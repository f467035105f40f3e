"""Process instances: spawn one worker process per instance, watch them, restart the ones that die.

The core owns the processes (so a crash is noticed even while the user's process is busy) but never unpickles
user code: the worker process reads the pickled callable from a file the core wrote. Each process gets
``CUDA_VISIBLE_DEVICES`` for its GPU (the core's own entry for it), so inside it the device is ``cuda:0``.

Nothing here polls on a timer where the system allows: exits are watched through pidfds on the core's event loop,
restarts are timers, and workers learn of the core's death from a pipe that reaches end-of-file when it dies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyserve.core.inference import ModelEntry
from pyserve.devices import VISIBLE_DEVICES, pinned_visible_devices

logger = logging.getLogger(__name__)

# The first restart comes quickly (an instance killed under load is back within ~1 s: the delay plus its start);
# a process that keeps dying without answering a batch (a start-up crash loop) waits twice as long each time.
BACKOFF_START_S = 0.1
BACKOFF_MAX_S = 30.0
# A process that lived this long, or answered a batch, is considered healthy: its next restart starts from the first
# delay.
HEALTHY_AFTER_S = 30.0
STOP_TIMEOUT_S = 5.0
# Where the system offers no pidfds, how often running processes are looked at.
POLL_S = 0.1


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
    exit_fd: int = -1
    extra: dict[str, Any] = field(default_factory=dict)
    # The model version this process serves (its hello joins it; a reload runs two of the same name and number).
    entry: ModelEntry | None = None

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


def open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` exits, or None where the system has no pidfds
    (Linux before 5.3, other systems, some seccomp filters). Raises ProcessLookupError for no such process."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError:
        return None
    return fd


def placement(
    devices: tuple[str, ...], index: int, environ: Mapping[str, str] = os.environ
) -> tuple[str, dict[str, str]]:
    """The device string an instance sees and the environment that pins it there (round-robin over devices).

    ``cuda:N`` is this server's GPU N: the instance gets this server's own ``CUDA_VISIBLE_DEVICES`` entry for it
    (from ``environ``), so with ``CUDA_VISIBLE_DEVICES=2,3`` an instance on ``cuda:0`` runs on GPU 2.
    """
    if not devices:
        return "cpu", {}
    device = devices[index % len(devices)]
    if device.startswith("cuda:"):
        ordinal = device.split(":", 1)[1]
        visible = environ.get(VISIBLE_DEVICES)
        pinned = pinned_visible_devices(int(ordinal), visible) if ordinal.isdigit() else None
        if pinned is None:
            logger.warning(
                "an instance is placed on %s, but this server's %s=%r names no GPU %s: the instance sees no GPU",
                device,
                VISIBLE_DEVICES,
                visible,
                ordinal,
            )
            pinned = ""
        return "cuda:0", {VISIBLE_DEVICES: pinned}
    if device == "cpu":
        return "cpu", {VISIBLE_DEVICES: ""}
    return device, {}


class Supervisor:
    """Starts, watches and restarts worker processes; tells the core when one exits.

    It watches exits (pidfds) and times restarts on the event loop it runs on. Each worker holds the read end of a
    pipe whose write end only this process holds (``--parent-fd``): end-of-file on it tells the worker that its
    core is gone.
    """

    def __init__(
        self,
        router_address: str,
        shm_prefix: str,
        shm_threshold: int,
        shm_limit: int,
        on_exit: Callable[[WorkerProcess, int], None],
        loop: asyncio.AbstractEventLoop,
        debug_errors: bool = False,
        stage_times: bool = False,
        spin_us: int = 0,
        cancel_address: str = "",
    ) -> None:
        self.router_address = router_address
        self.shm_prefix = shm_prefix
        self.shm_threshold = shm_threshold
        self.shm_limit = shm_limit
        self._on_exit = on_exit
        self.debug_errors = debug_errors
        self.stage_times = stage_times
        self.spin_us = spin_us
        self.cancel_address = cancel_address
        self.workers: list[WorkerProcess] = []
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._lifeline: tuple[int, int] | None = None

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
            "--parent-fd",
            str(self._lifeline_fd()),
        ]
        if self.debug_errors:
            command.append("--debug-errors")
        if self.spin_us:
            command += ["--spin-us", str(self.spin_us)]
        if self.stage_times:
            command.append("--stage-times")
        if self.cancel_address:
            command += ["--cancel", self.cancel_address]
        worker.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, pass_fds=(self._lifeline_fd(),))
        worker.last_pid = worker.process.pid
        worker.started_at = time.monotonic()
        worker.ready = False
        worker.restart_at = None
        if worker not in self.workers:
            self.workers.append(worker)
        fd = open_pidfd(worker.process.pid)  # not reaped yet, so it exists
        if fd is not None:
            worker.exit_fd = fd
            self._loop.add_reader(fd, self.poll)

    def add(self, entry: ModelEntry, count: int, devices: tuple[str, ...], payload_path: str) -> list[WorkerProcess]:
        """Start ``count`` instances of a model version, placed round-robin on ``devices``."""
        started = []
        for index in range(count):
            device, env = placement(devices, index)
            worker = WorkerProcess(
                entry.name, entry.version, index, device, payload_path, extra={"env": env}, entry=entry
            )
            self.spawn(worker)
            started.append(worker)
        self._arm()
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
                    self._unwatch(worker)
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
        self._arm()

    def schedule_restart(self, worker: WorkerProcess, worked: bool = False) -> float:
        """Restart a worker after its backoff delay (which then doubles, up to BACKOFF_MAX_S); ``worked``: it
        answered batches before it died (no start-up crash loop), so the delay starts over."""
        if worked:
            worker.backoff_s = BACKOFF_START_S
        delay = worker.backoff_s
        worker.restart_at = time.monotonic() + delay
        worker.backoff_s = min(worker.backoff_s * 2, BACKOFF_MAX_S)
        self._arm()
        return delay

    def remove_entry(self, entry: ModelEntry) -> None:
        """Stop and forget every worker of a model version."""
        doomed = [w for w in self.workers if w.entry is entry]
        self.workers = [w for w in self.workers if w not in doomed]
        for worker in doomed:
            self._unwatch(worker)
        _terminate([w.process for w in doomed if w.process is not None], STOP_TIMEOUT_S)
        self._arm()

    def close(self, grace_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every worker process (SIGTERM, then SIGKILL after ``grace_s``)."""
        processes = [w.process for w in self.workers if w.process is not None]
        for worker in self.workers:
            self._unwatch(worker)
        self.workers = []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        _terminate(processes, grace_s)
        if self._lifeline is not None:
            for fd in self._lifeline:
                os.close(fd)
            self._lifeline = None

    def _lifeline_fd(self) -> int:
        # The read end workers inherit; the write end stays here, so the pipe reaches EOF only when we are gone.
        if self._lifeline is None:
            self._lifeline = os.pipe()
        return self._lifeline[0]

    def _unwatch(self, worker: WorkerProcess) -> None:
        if worker.exit_fd >= 0:
            self._loop.remove_reader(worker.exit_fd)
            os.close(worker.exit_fd)
            worker.exit_fd = -1

    def _arm(self) -> None:
        """Set the one timer poll() needs: the next due restart, or the next look at processes no pidfd watches."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = time.monotonic()
        delays = [w.restart_at - now for w in self.workers if w.process is None and w.restart_at is not None]
        if any(w.process is not None and w.exit_fd < 0 for w in self.workers):
            delays.append(POLL_S)
        if delays:
            # A millisecond late rather than early: an early timer would find nothing due and re-arm at once.
            self._timer = self._loop.call_later(max(0.0, min(delays)) + 0.001, self.poll)


def _terminate(processes: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
