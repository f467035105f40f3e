"""Thread instances: the instances of ``Serve``'s bound functions, run as threads of the user's process.

Each thread runs an ``InstanceRunner`` that connects to the core itself. An idle instance sleeps on its socket and
on the read end of one pipe; stopping closes the write end, so no instance needs a timer to notice the stop.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyserve.config import ModelSpec, ServeConfig
from pyserve.core_process import STOP_TIMEOUT_S, CoreProcess
from pyserve.errors import ServerError
from pyserve.worker.instance import InstanceRunner


@dataclass(frozen=True)
class CoreLink:
    """Where thread instances connect, and how: the local core's ipc socket, or a remote server's tcp socket."""

    address: str
    cancel_address: str = ""
    remote_token: str = ""
    """Set for a remote server (``RemoteServe``): the socket authenticates with it, and tensors travel inline."""
    remote_session: str = ""
    """A remote peer's session: its instances' sockets are named ``<session>/<model>/<index>/<nonce>``."""

    @staticmethod
    def local(core: CoreProcess) -> CoreLink:
        """The link to a core this process started."""
        return CoreLink(core.router_address, core.cancel_address)


class ThreadInstances:
    """Starts the thread instances of each model; wakes and joins them all when the server stops.

    ``stop`` is the event the instances' loops watch: its owner sets it before calling ``wake``.
    """

    def __init__(self, stop: threading.Event, session: str) -> None:
        self._stop = stop
        self._session = session
        self._threads: list[threading.Thread] = []
        self._wake_pipe: tuple[int, int] | None = None
        self._pipe_lock = threading.Lock()  # models may be started from several threads at once (Serve.run)
        # The read end of a pipe whose write end wake() closed: join() closes it once no thread polls it.
        self._woken_fd: int | None = None

    def start(
        self, spec: ModelSpec, functions: Sequence[Callable[..., Any]], core: CoreLink, config: ServeConfig
    ) -> None:
        """Start one instance per function, placed round-robin on ``spec``'s devices; returns once every one is
        connected to the core. Raises ``ServerError`` when one fails to start or none connects in time."""
        devices = spec.config.devices
        ready: list[str | None] = []
        events: list[threading.Event] = []
        for index, function in enumerate(functions):
            event = threading.Event()
            events.append(event)
            runner = InstanceRunner(
                core.address,
                spec,
                function,
                index,
                self._session,
                # No shared memory with a remote server: every tensor goes inline.
                sys.maxsize if core.remote_token else config.shm_threshold_bytes,
                config.shm_pool_bytes,
                device=devices[index % len(devices)] if devices else "cpu",
                debug_errors=config.debug_errors,
                stage_times=bool(config.stage_times),
                cancel_address=core.cancel_address,
                remote_token=core.remote_token,
                routing_id=(
                    f"{core.remote_session}/{spec.name}/{index}/{uuid.uuid4().hex[:8]}".encode()
                    if core.remote_session
                    else b""
                ),
            )

            def on_ready(error: str | None, event: threading.Event = event) -> None:
                ready.append(error)
                event.set()

            thread = threading.Thread(
                target=runner.run,
                args=(self._stop, on_ready, (self._wake_fd(),)),
                name=f"pyserve-{spec.name}-{index}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        for event in events:
            if not event.wait(config.startup_timeout_s):
                raise ServerError(f"instances of model '{spec.name}' did not connect to the core in time")
        errors = [e for e in ready if e]
        if errors:
            raise ServerError(f"model '{spec.name}' could not start: {errors[0]}")

    def wake(self) -> None:
        """Wake every instance (end-of-file on the pipe's read end) so it sees the stop event set."""
        with self._pipe_lock:
            pipe, self._wake_pipe = self._wake_pipe, None
        if pipe is not None:
            os.close(pipe[1])
            self._woken_fd = pipe[0]

    def join(self) -> None:
        """Wait for every instance to return (``STOP_TIMEOUT_S`` each), after ``wake``."""
        stuck = False
        for thread in self._threads:
            thread.join(STOP_TIMEOUT_S)
            stuck = stuck or thread.is_alive()
        self._threads.clear()
        woken, self._woken_fd = self._woken_fd, None
        if woken is not None and not stuck:
            # A thread still inside the user's function polls the read end once it returns: leave it open then.
            os.close(woken)

    def _wake_fd(self) -> int:
        """The read end of the pipe thread instances sleep on: readable (end-of-file) once wake() closes the write
        end, so an idle instance needs no timer to notice the stop."""
        with self._pipe_lock:
            if self._wake_pipe is None:
                self._wake_pipe = os.pipe()
            return self._wake_pipe[0]
