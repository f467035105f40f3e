"""Cancellation flags of running requests, set from the core while the infer function runs.

A separate thread is needed because an instance's own socket is not read while its function runs. The core
publishes ``{"b": batch_id, "i": [request indexes]}`` on an XPUB socket; one listener thread per worker process
(shared by its instances) subscribes and sets the ``CancelFlag`` each running request carries as
``Request.is_cancelled``. The core answers each subscription with a sync message, and an instance sends its hello
only once its listener heard it (the core gives the publisher's address to thread instances through ``Serve`` and to
process instances on their command line): by the time the core can run a batch on the instance, the subscription
is in place (ZeroMQ drops what a publisher sends to a subscriber whose subscription has not arrived yet).

The instances of a remote peer (``RemoteServe``, a Ray actor) cannot reach that publisher, a socket on the core's
host: their listener is a CURVE DEALER on the core's remote port named ``<session>/cancel``, which says ``ping`` once
and is answered with the same sync notice; the core sends it the cancellations of the session's running batches
(``pyserve.core.remote_peers``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import zmq

from pyserve.request import CancelFlag
from pyserve.transport.curve import secure_client
from pyserve.transport.messages import pack_header, unpack_header
from pyserve.transport.protocol import CancelNotice, Ping

logger = logging.getLogger(__name__)

# How long an instance waits for its listener's subscription to be confirmed before it reports ready anyway.
SYNC_TIMEOUT_MS = 10_000


class CancelListener:
    """Sets the cancel flags of registered batches when the core says so.

    ``remote_token`` and ``session`` make it a remote session's listener on the core's remote port (see above).
    """

    def __init__(self, address: str, remote_token: str = "", session: str = "") -> None:
        self.address = address
        self.key = _key(address, session)
        self._remote_token = remote_token
        self._session = session
        self._lock = threading.Lock()
        self._batches: dict[int, list[CancelFlag]] = {}
        self._stop = threading.Event()
        # Readable (end-of-file) once the core confirmed the subscription: instances wait on it beside their wake fds.
        self.synced_fd, self._synced_write = os.pipe()
        # The thread sleeps on its socket and this pipe; close() closes the write end to wake it.
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="pyserve-cancel", daemon=True)
        self._thread.start()

    def register(self, batch_id: int, flags: list[CancelFlag]) -> None:
        """Track the flags of a batch about to run."""
        with self._lock:
            self._batches[batch_id] = flags

    def unregister(self, batch_id: int) -> None:
        """The batch finished: forget its flags."""
        with self._lock:
            self._batches.pop(batch_id, None)

    def close(self) -> None:
        """Stop the listener thread."""
        self._stop.set()
        os.close(self._wake_write)
        self._thread.join(2)
        if not self._thread.is_alive():
            os.close(self._wake_read)
            os.close(self.synced_fd)
            if self._synced_write >= 0:
                os.close(self._synced_write)
                self._synced_write = -1

    def _run(self) -> None:
        socket: zmq.Socket[Any]
        if self._remote_token:
            socket = zmq.Context.instance().socket(zmq.DEALER)
            secure_client(socket, self._remote_token)
            socket.setsockopt(zmq.ROUTING_ID, f"{self._session}/cancel".encode())
        else:
            socket = zmq.Context.instance().socket(zmq.SUB)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.connect(self.address)
            if self._remote_token:
                socket.send(pack_header(Ping.build()))  # queued until connected; the core answers with the sync
            poller = zmq.Poller()
            poller.register(socket, zmq.POLLIN)
            poller.register(self._wake_read, zmq.POLLIN)
            while not self._stop.is_set():
                if dict(poller.poll()).get(self._wake_read):
                    return
                message = CancelNotice(unpack_header(socket.recv()))
                if message.is_sync:
                    if self._synced_write >= 0:
                        os.close(self._synced_write)
                        self._synced_write = -1
                    continue
                with self._lock:
                    flags = self._batches.get(message.batch_id)
                    if flags is not None:
                        for index in message.request_indexes:
                            if 0 <= index < len(flags):
                                flags[index].set()
        except zmq.ZMQError as exc:
            if not self._stop.is_set():
                logger.warning("cancel listener for %s stopped: %s", self.address, exc)
        finally:
            socket.close(linger=0)


_listeners: dict[str, tuple[CancelListener, int]] = {}
_listeners_lock = threading.Lock()


def _key(address: str, session: str) -> str:
    return f"{address}#{session}" if session else address


def acquire_listener(address: str, remote_token: str = "", session: str = "") -> CancelListener:
    """The process-wide listener for a core's cancel address (or a remote session's, on the core's remote port),
    started on first use and shared by instances."""
    key = _key(address, session)
    with _listeners_lock:
        listener, users = _listeners.get(key, (None, 0))
        if listener is None:
            listener = CancelListener(address, remote_token, session)
        _listeners[key] = (listener, users + 1)
        return listener


def wait_synced(listener: CancelListener, wake_fds: list[int]) -> bool:
    """Wait until the listener's subscription is confirmed; False if a wake fd became readable first (stop).

    Gives up with a warning after ``SYNC_TIMEOUT_MS``: the instance then serves, and a request cancelled while it
    runs may not see its flag.
    """
    poller = zmq.Poller()
    poller.register(listener.synced_fd, zmq.POLLIN)
    for fd in wake_fds:
        poller.register(fd, zmq.POLLIN)
    ready = dict(poller.poll(SYNC_TIMEOUT_MS))
    if any(fd in ready for fd in wake_fds):
        return False
    if listener.synced_fd not in ready:
        logger.warning(
            "the cancel listener for %s was not confirmed within %d ms: a running request's cancellation may be missed",
            listener.address,
            SYNC_TIMEOUT_MS,
        )
    return True


def release_listener(key: str) -> None:
    """An instance stopped (``key``: its listener's): the last one to go stops the listener."""
    with _listeners_lock:
        listener, users = _listeners.get(key, (None, 0))
        if listener is None:
            return
        if users > 1:
            _listeners[key] = (listener, users - 1)
            return
        del _listeners[key]
    listener.close()
