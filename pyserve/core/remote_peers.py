"""The core's second worker socket: remote peers (``RemoteServe``, ``RemoteTriton``) attach over tcp://.

Off unless ``ServeConfig.remote_port`` is set. The socket is a ROUTER on tcp, a ZeroMQ CURVE server keyed by
``ServeConfig.remote_token`` (``pyserve.transport.curve``): every peer is authenticated and its traffic encrypted,
and a ZAP handler admits only the token's peer key. A peer loads models (its functions run in its own process, as
thread instances), connects their instances, answers their batches and makes BLS calls, with the same messages the
local socket carries, and under stricter rules:

- tensors travel inline, in the message's frames: a location in shared memory would name a segment on another host
  (or, from a hostile peer, one of this host's), so any message that carries one is dropped;
- a peer may not load process instances (their functions would be unpickled by processes the core starts), stop
  the core or declare the server started;
- its identities are prefixed with ``REMOTE_PREFIX`` inside the core, so they never collide with the local
  socket's, and ``send`` routes a reply by that prefix.

A peer names its sockets ``<session>/<role>`` (ZeroMQ routing ids: its control socket, one per instance, one
that sends ``ping`` every second, and ``<session>/cancel``, which hears the cancellations of requests running on
its instances: it says ``ping`` once and is answered with a sync notice, as the local cancel publisher answers a
subscription). A session silent for ``ServeConfig.remote_peer_timeout_s`` is gone — the process
died, its host vanished or the network between failed: ``on_gone`` is called for each of its sockets, which removes
its instances and the models it loaded, and their requests fail with the reason. (ZeroMQ's own heartbeats close the
dead tcp connections, and libzmq's stable API does not say which peer a closed connection was; so when the socket's
monitor reports a closed connection, the core probes each remote instance with a ``ping`` — ROUTER_MANDATORY makes a
send to a peer whose connection is gone fail — and removes the ones that fail at once: a killed peer process is
noticed in milliseconds, a vanished host within the heartbeat timeout.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from pyserve.transport.curve import peer_public_key, secure_server
from pyserve.transport.messages import pack_header, unpack_header
from pyserve.transport.protocol import (
    BatchResult,
    BlsRequest,
    CancelNotice,
    ControlReply,
    ControlRequest,
    Header,
    Load,
    MessageKind,
    Ping,
    kind_of,
)

logger = logging.getLogger(__name__)

REMOTE_PREFIX = b"\x01remote:"
"""The prefix of a remote peer's identity inside the core (local identities start with a zero byte)."""

_CHECK_EVERY_S = 1.0
_PROBE_DELAYS_S = (0.01, 0.1, 0.5)
# A peer's control, ping and cancel sockets are not probed: they would read a ping as a reply (control), never
# read it (ping) or read it as a cancellation (cancel).
_CANCEL_ROLE = b"/cancel"
_NOT_PROBED = (b"/control", b"/ping", _CANCEL_ROLE)
_HEARTBEAT_IVL_MS = 2000
_HEARTBEAT_TIMEOUT_MS = 6000

# What a peer may send. Ensembles and unloads carry names and specs only; the rest is checked message by message.
_ALLOWED = frozenset(
    {
        MessageKind.HELLO,
        MessageKind.BYE,
        MessageKind.RESULT,
        MessageKind.BLS_REQUEST,
        MessageKind.BLS_CANCEL,
        MessageKind.BLS_FREE,
        MessageKind.LOAD,
        MessageKind.LOAD_ENSEMBLE,
        MessageKind.UNLOAD,
        MessageKind.PING,
    }
)


# The kinds a reply answers (a refused one is answered with the reason, so its sender does not wait in vain).
_CONTROL_REQUESTS = frozenset(
    {MessageKind.LOAD, MessageKind.LOAD_ENSEMBLE, MessageKind.UNLOAD, MessageKind.SERVING, MessageKind.SHUTDOWN}
)


def is_remote(identity: bytes) -> bool:
    """Whether a core-side identity is a remote peer's."""
    return identity.startswith(REMOTE_PREFIX)


def remote_cancel_identity(identity: bytes) -> bytes:
    """The core-side identity of the cancel socket of a remote instance's session."""
    return identity.partition(b"/")[0] + _CANCEL_ROLE


class _PeerKey:
    """The ZAP credentials check: only the token's peer key is admitted."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self._key


class RemotePeers:
    """The tcp ROUTER for remote peers: bound by ``start``, closed by ``close``.

    ``on_message(identity, header, frames)`` gets each admitted message with the prefixed identity; ``on_gone``
    the identity of a peer whose connection closed.
    """

    def __init__(
        self,
        address: str,
        token: str,
        on_message: Callable[[bytes, Header, list[Any]], None],
        on_gone: Callable[[bytes], None],
        peer_timeout_s: float,
    ) -> None:
        self._bind_address = address
        self._token = token
        self._on_message = on_message
        self._on_gone = on_gone
        self._socket: zmq.Socket[Any] | None = None
        self._auth: ThreadAuthenticator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # session -> (when it was last heard of, its sockets' routing ids)
        self._sessions: dict[bytes, tuple[float, set[bytes]]] = {}
        self._check: asyncio.TimerHandle | None = None
        self._peer_timeout_s = peer_timeout_s
        self._monitor: zmq.Socket[Any] | None = None
        self.address = ""

    def start(self, loop: asyncio.AbstractEventLoop) -> str:
        """Bind the socket; returns the address it listens on (``tcp://host:port``)."""
        self._loop = loop
        context: zmq.Context[Any] = zmq.Context.instance()
        auth = ThreadAuthenticator(context, log=logging.getLogger("pyserve.core.remote_auth"))
        auth.start()
        auth.configure_curve_callback("pyserve", credentials_provider=_PeerKey(peer_public_key(self._token)))
        self._auth = auth
        socket: zmq.Socket[Any] = context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        socket.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)
        secure_server(socket, self._token)
        socket.bind(self._bind_address)
        self.address = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._socket = socket
        loop.add_reader(socket.fileno(), self._drain)
        loop.call_soon(self._drain)
        self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        loop.add_reader(self._monitor.fileno(), self._on_monitor)
        loop.call_soon(self._on_monitor)  # ZeroMQ's FD is edge-triggered: read what may have come before
        return self.address

    def close(self) -> None:
        """Close the socket and stop the authenticator."""
        if self._check is not None:
            self._check.cancel()
            self._check = None
        if self._monitor is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._monitor.fileno())
            self._monitor.close(linger=0)
            self._monitor = None
        if self._socket is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._socket.fileno())
            self._socket.close(linger=0)
            self._socket = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def send(self, identity: bytes, frames: list[Any]) -> None:
        """Send to a peer by its core-side identity (``REMOTE_PREFIX`` + ZeroMQ's)."""
        if self._socket is None:
            return
        try:
            self._socket.send_multipart([identity[len(REMOTE_PREFIX) :], *frames], copy=False)
        except zmq.ZMQError as exc:
            logger.warning("could not send to remote peer %r: %s", identity, exc)
        if self._loop is not None:
            self._loop.call_soon(self._drain)  # sending can consume the edge that announced input

    def _drain(self) -> None:
        socket = self._socket
        while socket is not None and int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            raw = frames[0].bytes
            identity = REMOTE_PREFIX + raw
            session, slash, _ = raw.partition(b"/")
            if not slash or not session:
                logger.warning("dropped a message from remote peer %r: its routing id is not <session>/<role>", raw)
                continue
            self._heard(session, raw)
            try:
                header = unpack_header(frames[1].buffer)
                refusal = refuse(header)
            except Exception as exc:  # not even a header: drop it
                logger.warning("dropped a malformed message from remote peer %r: %s", identity, exc)
                continue
            if refusal is not None:
                logger.warning("refused a message from remote peer %r: %s", identity, refusal)
                if kind_of(header) in _CONTROL_REQUESTS:
                    request_id = ControlRequest(header).request_id
                    self.send(identity, [pack_header(ControlReply.build_error(request_id, refusal))])
                continue
            kind = kind_of(header)
            if kind == MessageKind.PING:
                if raw.endswith(_CANCEL_ROLE):
                    # The session's cancel socket is connected: from now on it hears its instances' cancellations.
                    self.send(identity, [pack_header(CancelNotice.build_sync())])
                continue
            if kind == MessageKind.BYE and raw.endswith(b"/ping"):
                self._end_session(session)  # the peer stopped: forget it now rather than when it falls silent
                continue
            try:
                self._on_message(identity, header, frames[2:])
            except Exception:
                logger.exception("error handling a message from remote peer %r", identity)
            socket = self._socket

    def _on_monitor(self) -> None:
        monitor = self._monitor
        disconnected = False
        while monitor is not None and int(monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            recv_monitor_message(monitor, zmq.NOBLOCK)
            disconnected = True
        if disconnected and self._loop is not None:
            # The pipe of a closed connection goes away in ZeroMQ's I/O thread, shortly after the event: look again.
            for delay in _PROBE_DELAYS_S:
                self._loop.call_later(delay, self._probe)

    def _probe(self) -> None:
        """Remove the remote instances a send cannot reach (their connection is gone)."""
        socket = self._socket
        if socket is None:
            return
        ping = pack_header(Ping.build())
        for _, sockets in list(self._sessions.values()):
            for raw in [raw for raw in sockets if not raw.endswith(_NOT_PROBED)]:
                try:
                    socket.send_multipart([raw, ping], zmq.NOBLOCK)
                except zmq.Again:
                    continue  # alive, only slow to read
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    sockets.discard(raw)
                    logger.warning("remote peer %r closed its connection: removing it", raw)
                    try:
                        self._on_gone(REMOTE_PREFIX + raw)
                    except Exception:
                        logger.exception("error removing remote peer %r", raw)

    def _heard(self, session: bytes, raw: bytes) -> None:
        known = self._sessions.get(session)
        if known is None:
            logger.info("remote session %r connected", session)
            self._sessions[session] = (time.monotonic(), {raw})
            if self._check is None and self._loop is not None:
                self._check = self._loop.call_later(_CHECK_EVERY_S, self._check_sessions)
        else:
            known[1].add(raw)
            self._sessions[session] = (time.monotonic(), known[1])

    def _end_session(self, session: bytes) -> None:
        known = self._sessions.pop(session, None)
        if known is None:
            return
        logger.info("remote session %r ended", session)
        for raw in sorted(known[1]):
            try:
                self._on_gone(REMOTE_PREFIX + raw)
            except Exception:
                logger.exception("error removing remote peer %r", raw)

    def _check_sessions(self) -> None:
        self._check = None
        now = time.monotonic()
        for session, (seen, sockets) in list(self._sessions.items()):
            if now - seen > self._peer_timeout_s:
                del self._sessions[session]
                logger.warning("remote session %r went silent for %.0f s: removing it", session, now - seen)
                for raw in sorted(sockets):
                    try:
                        self._on_gone(REMOTE_PREFIX + raw)
                    except Exception:
                        logger.exception("error removing remote peer %r", raw)
        if self._sessions and self._loop is not None and self._socket is not None:
            self._check = self._loop.call_later(_CHECK_EVERY_S, self._check_sessions)


def refuse(header: Header) -> str | None:
    """Why a remote peer may not send this message (None: it may)."""
    kind = kind_of(header)
    if kind not in _ALLOWED:
        return f"a remote peer may not send '{kind}' messages"
    if kind == MessageKind.LOAD and Load(header).payload is not None:
        return (
            "a remote peer runs its models' functions itself (thread instances): it may not ship functions "
            "for the server to run"
        )
    elif kind == MessageKind.RESULT:
        result = BatchResult(header)
        if result.slots or any(
            not isinstance(loc, int) for outputs in result.outputs or () for _, _, _, loc in outputs or ()
        ):
            return "a remote peer must send its outputs inline (shared memory does not cross hosts)"
    elif kind == MessageKind.BLS_REQUEST and any(
        not isinstance(loc, int) for _, _, _, loc in BlsRequest(header).inputs
    ):
        return "a remote peer must send BLS inputs inline (shared memory does not cross hosts)"
    return None
