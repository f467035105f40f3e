"""TLS for pyserve's clients: which certificate authorities to trust, and a certificate of the client's own for
servers that ask for one (mutual TLS).

A client speaks TLS when its URL says ``https://`` or ``grpcs://``; ``ClientTls`` then says whom to trust. Without
one it trusts the system's certificate authorities (Python's default context over HTTP, grpcio's bundled roots
over gRPC) and checks the server's name against the URL's host, as a browser would.
"""

from __future__ import annotations

import dataclasses
import functools
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from pyserve.errors import ConfigError

if TYPE_CHECKING:
    import grpc


@dataclasses.dataclass(frozen=True)
class ClientTls:
    """``ca_file``: PEM certificates of the authorities to trust (None: the system's); ``cert_file`` and
    ``key_file``: the client's certificate (chain) and its private key, for a server that requires one."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("a client certificate needs both cert_file and key_file")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"TLS {name} {path!r} is not a readable file")

    def ssl_context(self) -> ssl.SSLContext:
        """The context HTTP connections are wrapped with (made once per settings, shared)."""
        return _ssl_context(self)

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """The credentials gRPC channels open with."""
        return _grpc_credentials(self)


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


@functools.lru_cache(maxsize=16)
def _ssl_context(tls: ClientTls) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot use the TLS files {tls}: {exc}") from None
    context.set_alpn_protocols(["http/1.1"])
    return context


@functools.lru_cache(maxsize=16)
def _grpc_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file),
        private_key=_read(tls.key_file),
        certificate_chain=_read(tls.cert_file),
    )
