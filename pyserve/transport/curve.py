"""Authentication and encryption of the core's tcp socket for remote peers (ZeroMQ CURVE), from one shared token.

Both sides derive their key pairs from the token (``ServeConfig.remote_token`` on the server, ``RemoteServe``'s
``token`` on the peer): the server's pair from one hash of it, the peer's from another. A peer without the token
cannot complete the handshake (it does not know the server's public key), and the server's authenticator admits
only the one peer key the token gives, so nothing a stranger sends reaches the core. The token itself never
travels: not on the wire, not in a process's arguments, not in a log line.
"""

from __future__ import annotations

import hashlib
from typing import Any

import zmq
from zmq.utils import z85

from pyserve.errors import ConfigError

TOKEN_ENV = "PYSERVE_REMOTE_TOKEN"
"""The environment variable that carries the token to the core process and to remote peers."""

_MIN_TOKEN_CHARS = 16


def _key_pair(token: str, role: bytes) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys for ``role`` derived from ``token``."""
    check_token(token)
    secret = z85.encode(hashlib.sha256(b"pyserve-curve-" + role + b"\0" + token.encode()).digest())
    return zmq.curve_public(secret), secret


def check_token(token: str) -> None:
    """Refuse a token too short to be a secret."""
    if len(token) < _MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the remote token must have at least {_MIN_TOKEN_CHARS} characters (got {len(token)}); "
            "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def server_public_key(token: str) -> bytes:
    """The server's public key, as a peer derives it."""
    return _key_pair(token, b"server")[0]


def peer_public_key(token: str) -> bytes:
    """The one peer key the server admits."""
    return _key_pair(token, b"peer")[0]


def secure_server(socket: zmq.Socket[Any], token: str) -> None:
    """Make ``socket`` (before bind) a CURVE server with the token's server keys, checked by the ZAP domain
    ``pyserve``."""
    public, secret = _key_pair(token, b"server")
    socket.setsockopt(zmq.CURVE_SERVER, 1)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
    socket.setsockopt(zmq.ZAP_DOMAIN, b"pyserve")


def secure_client(socket: zmq.Socket[Any], token: str) -> None:
    """Make ``socket`` (before connect) a CURVE client of a server keyed by the same token."""
    public, secret = _key_pair(token, b"peer")
    socket.setsockopt(zmq.CURVE_SERVERKEY, server_public_key(token))
    socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
