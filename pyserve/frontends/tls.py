"""TLS for the core's listeners: ``ServeConfig.tls_certfile`` / ``tls_keyfile`` (the server's certificate chain and
key, PEM), ``tls_client_ca`` (mutual TLS: the CAs whose client certificates are accepted) and ``tls_endpoints`` (which
front ends serve TLS).

HTTP and the metrics page get an ``ssl.SSLContext`` for asyncio's ``create_server``; gRPC gets credentials for
``add_secure_port`` read from the same files. Both are built when the listener starts, so a file that is missing,
unreadable, encrypted or not matching fails the start with a ``ServerError`` that names the setting and the reason.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

import grpc

from pyserve.config import ServeConfig
from pyserve.errors import ServerError


def server_ssl_context(config: ServeConfig) -> ssl.SSLContext:
    """The server side of TLS 1.2 or later with the configured certificate, offering HTTP/1.1 by ALPN; with
    ``tls_client_ca`` a client must present a certificate one of those CAs signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_certfile, config.tls_keyfile, password=_no_passphrase(config))
    except (OSError, ssl.SSLError) as exc:
        raise ServerError(
            f"TLS: cannot load tls_certfile {config.tls_certfile!r} with tls_keyfile {config.tls_keyfile!r}: "
            f"{_reason(exc)}"
        ) from None
    if config.tls_client_ca:
        try:
            context.load_verify_locations(cafile=config.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ServerError(f"TLS: cannot load tls_client_ca {config.tls_client_ca!r}: {_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["http/1.1"])
    return context


def grpc_server_credentials(config: ServeConfig) -> grpc.ServerCredentials:
    """gRPC's server credentials from the same files; ``tls_client_ca`` makes client certificates required."""
    # grpc reads the files only at the first handshake and then fails that connection alone: load them here first,
    # so that a bad file fails the start, with the same message as for HTTP.
    server_ssl_context(config)
    chain, key = _read(config.tls_certfile, "tls_certfile"), _read(config.tls_keyfile, "tls_keyfile")
    client_ca = _read(config.tls_client_ca, "tls_client_ca") if config.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _no_passphrase(config: ServeConfig) -> Callable[[], bytes]:
    def refuse() -> bytes:
        # OpenSSL would otherwise ask for the passphrase on the terminal, which the core process does not have.
        raise ServerError(
            f"TLS: tls_keyfile {config.tls_keyfile!r} is encrypted; pyserve takes no passphrase: give it the key "
            "unencrypted (readable by the server's user only)"
        )

    return refuse


def _read(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ServerError(f"TLS: cannot read {setting} {path!r}: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
