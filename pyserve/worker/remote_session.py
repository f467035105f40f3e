"""A remote peer's session with a server: the pings that tell its core the session is alive.

A remote peer (``RemoteServe``, a Ray actor) names each of its sockets ``<session>/<role>``; the core drops a session
that stays silent for ``ServeConfig.remote_peer_timeout_s`` (``pyserve.core.remote_peers``). ``SessionPinger`` sends
a ``ping`` a second from a socket of its own — the control socket may be busy waiting for a long load, and an
instance's socket is its loop's alone — and a ``bye`` when its session ends, so the core forgets it at once.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import zmq

from pyserve.transport.curve import secure_client
from pyserve.transport.messages import pack_header
from pyserve.transport.protocol import Bye, Ping

PING_EVERY_S = 1.0


class SessionPinger:
    """Pings ``address`` for ``session`` from a daemon thread until ``stop`` is set."""

    def __init__(self, address: str, token: str, session: str, stop: threading.Event) -> None:
        self._address = address
        self._token = token
        self._session = session
        self._stop = stop
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start pinging."""
        self._thread = threading.Thread(target=self._run, name="pyserve-remote-ping", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float = 5.0) -> None:
        """Wait for the thread to end (after ``stop`` was set)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        socket: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 500)  # the bye may still be on its way when the socket closes
        socket.setsockopt(zmq.SNDHWM, 4)  # a few pings queue while the server is away; the rest are dropped
        secure_client(socket, self._token)
        socket.setsockopt(zmq.ROUTING_ID, f"{self._session}/ping".encode())
        socket.connect(self._address)
        ping = pack_header(Ping.build())
        try:
            while True:
                with contextlib.suppress(zmq.Again):
                    socket.send(ping, zmq.NOBLOCK)
                if self._stop.wait(PING_EVERY_S):
                    with contextlib.suppress(zmq.Again):
                        socket.send(pack_header(Bye.build()), zmq.NOBLOCK)
                    return
        finally:
            socket.close()
