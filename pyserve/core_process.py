"""The core serving process as the user's process sees it: started, asked over its control socket, stopped.

``Serve`` owns one ``CoreProcess`` per start. ``start()`` spawns ``python -m pyserve.core``, which reports its ports
(or a one-line error) on a pipe once its front ends listen; ``request()`` sends a control message (``load``,
``serving``, ...) and waits for its answer; ``stop()`` ends the process (SIGTERM, then SIGKILL after a grace period)
and removes its socket directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import zmq

from pyserve.config import ServeConfig
from pyserve.core.supervisor import open_pidfd
from pyserve.errors import ServerError
from pyserve.server_config import CORE_CONFIG_ENV
from pyserve.transport.curve import secure_client
from pyserve.transport.messages import pack_header, unpack_header
from pyserve.transport.protocol import ControlReply, Header, kind_of

CONTROL_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
CLOSE_CHECK_S = 0.1  # how often a waiting control request looks whether its channel is being closed
# Core processes this process has started: the CLI compares the count around importing a module, because a module
# written like the Quickstart serves (and has stopped again) by the time its import returns.
_starts = 0


def core_starts() -> int:
    """How many times a Serve in this process has started its core process."""
    return _starts


class ControlChannel:
    """A DEALER socket to a core's worker socket for control requests (load, unload, ...), one at a time.

    ``remote_token`` makes it a CURVE client of a remote server's socket (``pyserve.transport.curve``), and
    ``routing_id`` names it there (``pyserve.core.remote_peers``).
    """

    def __init__(self, address: str, what: str, remote_token: str = "", routing_id: bytes = b"") -> None:
        self.address = address
        self._what = what
        socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if remote_token:
            secure_client(socket, remote_token)
        if routing_id:
            socket.setsockopt(zmq.ROUTING_ID, routing_id)
        socket.connect(address)
        self._socket = socket
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._request_ids = itertools.count(1)

    def request(self, build: Callable[[int], Header], timeout_s: float = CONTROL_TIMEOUT_S) -> ControlReply:
        """Send the control request ``build(request_id)`` makes; wait for the reply to it (``ServerError`` when
        none comes within ``timeout_s``)."""
        with self._lock:
            if self._closing.is_set():
                raise ServerError(f"the channel to {self._what} is closed (the server stopped)")
            request_id = next(self._request_ids)
            message = build(request_id)
            self._socket.send(pack_header(message))
            deadline = time.monotonic() + timeout_s
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServerError(f"{self._what} did not answer {kind_of(message)!r} in time")
                # In slices: close() from another thread (stop() while run() still loads) ends the wait within one.
                if not self._socket.poll(int(min(remaining, CLOSE_CHECK_S) * 1000)):
                    if self._closing.is_set():
                        raise ServerError(f"the server stopped before {self._what} answered {kind_of(message)!r}")
                    continue
                reply = ControlReply(unpack_header(self._socket.recv()))
                if reply.request_id == request_id:
                    return reply

    def monitor(self, events: int) -> zmq.Socket[Any]:
        """A PAIR socket that receives the socket's ``events`` (``zmq.utils.monitor.recv_monitor_message``)."""
        monitor: zmq.Socket[Any] = self._socket.get_monitor_socket(events)
        return monitor

    def close(self) -> None:
        """Close the socket; a request waiting in another thread fails with ServerError first (zmq sockets are not
        thread-safe: the socket is closed only once no request holds it)."""
        self._closing.set()
        with self._lock:
            self._socket.close(linger=0)


class CoreProcess:
    """One run of the core process: its ports and addresses once ``start()`` returned."""

    def __init__(self, config: ServeConfig, session: str) -> None:
        self.config = config
        self.session = session
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self.router_address = ""
        self.cancel_address = ""
        self.remote_address = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._control: ControlChannel | None = None
        # Channels of their own for requests made beside others (Serve loads its models concurrently): closed by
        # stop() with the main one.
        self._channels: set[ControlChannel] = set()
        self._channels_lock = threading.Lock()
        self._runtime_dir: str | None = None

    def start(self) -> None:
        """Spawn the core and wait until it serves; raises ServerError (the core's own one-line reason) if not."""
        config = self.config
        if config.transport == "ipc":
            self._runtime_dir = tempfile.mkdtemp(prefix="pyserve-")
            router = f"ipc://{self._runtime_dir}/core.sock"
        else:
            router = f"tcp://{config.host}:*"
        read_fd, write_fd = os.pipe()
        # The settings go by environment, not on the command line, which any local user can read: they hold secrets
        # (the remote token, the restricted APIs' header values).
        env = {**os.environ, CORE_CONFIG_ENV: orjson.dumps(dataclasses.asdict(config)).decode()}
        command = [
            sys.executable,
            "-m",
            "pyserve.core",
            "--router",
            router,
            "--shm-prefix",
            self.session,
            "--parent-pid",
            str(os.getpid()),
            "--ready-fd",
            str(write_fd),
        ]
        try:
            self._process = subprocess.Popen(command, pass_fds=(write_fd,), stdin=subprocess.DEVNULL, env=env)
        finally:
            os.close(write_fd)
        try:
            ready = self._wait_ready(read_fd)
        except BaseException:
            self.stop()
            raise
        finally:
            os.close(read_fd)
        self.http_port = ready["http_port"]
        self.grpc_port = ready.get("grpc_port", 0)
        self.metrics_port = ready.get("metrics_port", 0)
        self.router_address = ready["router"]
        self.cancel_address = ready.get("cancel", "")
        self.remote_address = ready.get("remote", "")
        self._control = ControlChannel(self.router_address, "the core process")
        global _starts
        _starts += 1

    def _wait_ready(self, read_fd: int) -> dict[str, Any]:
        assert self._process is not None
        deadline = time.monotonic() + self.config.startup_timeout_s
        data = b""
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerError(f"the core process did not start within {self.config.startup_timeout_s} s")
            readable, _, _ = select.select([read_fd], [], [], min(remaining, 0.2))
            if readable:
                chunk = os.read(read_fd, 4096)
                if not chunk:
                    break
                data += chunk
            elif self._process.poll() is not None:
                break
        if not data.endswith(b"\n"):
            status = self._process.wait()
            raise ServerError(
                f"the core process exited with status {status} before it was ready (its output above says why)"
            )
        ready: dict[str, Any] = orjson.loads(data)
        if "error" in ready:
            # An expected start-up failure (a port in use): the core names it in one line and exits.
            raise ServerError(ready["error"])
        return ready

    def request(self, build: Callable[[int], Header], timeout_s: float = CONTROL_TIMEOUT_S) -> ControlReply:
        """Send the control request ``build(request_id)`` makes; wait for the core's reply to it."""
        control = self._control
        if control is None:
            raise ServerError("the core process is stopped")
        return control.request(build, timeout_s)

    @contextlib.contextmanager
    def channel(self) -> Iterator[ControlChannel]:
        """A control channel of its own (a socket: one per concurrent requester), closed on exit or by ``stop()``."""
        with self._channels_lock:
            if self._control is None:
                raise ServerError("the core process is stopped")
            channel = ControlChannel(self.router_address, "the core process")
            self._channels.add(channel)
        try:
            yield channel
        finally:
            with self._channels_lock:
                self._channels.discard(channel)
            channel.close()

    @property
    def pid(self) -> int:
        """The core's process id (0 before start)."""
        return self._process.pid if self._process is not None else 0

    @property
    def runtime_dir(self) -> str | None:
        """The private directory holding the core's ipc socket (None with the tcp transport)."""
        return self._runtime_dir

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended; None while it runs."""
        return self._process.poll() if self._process is not None else None

    def wait_for_exit(self) -> None:
        """Block until the process exits. Sleeps on a pidfd where the system has them (else looks every 0.2 s);
        signals still get through, and stop() from another thread can reap the process meanwhile."""
        process = self._process
        assert process is not None
        try:
            exit_fd = open_pidfd(process.pid)
        except ProcessLookupError:
            exit_fd = None  # reaped already: poll() below says so
        try:
            while process.poll() is None:
                if exit_fd is None:
                    time.sleep(0.2)
                else:
                    select.select([exit_fd], [], [])
        finally:
            if exit_fd is not None:
                os.close(exit_fd)

    def stop(self) -> None:
        """End the process (SIGTERM: it drains for up to ``exit_timeout_s``; SIGKILL ``STOP_TIMEOUT_S`` after that);
        close the control socket and remove the socket directory."""
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()  # the core drains what is in flight, for up to exit_timeout_s
            try:
                process.wait(self.config.exit_timeout_s + STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with self._channels_lock:
            if self._control is not None:
                self._channels.add(self._control)
                self._control = None
            channels, self._channels = self._channels, set()
        for channel in channels:
            channel.close()  # a request waiting on it in another thread fails with ServerError
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None
