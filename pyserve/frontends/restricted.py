"""Restricted endpoint groups, as both front ends check them (tritonserver's ``--http-restricted-api`` and
``--grpc-restricted-protocol``; ``ServeConfig.http_restricted_api`` / ``grpc_restricted_protocol``).

Every endpoint belongs to one group (``server_config.RESTRICTED_GROUPS``), declared in one place per protocol: the
HTTP route table (``http_routes.Route.group``) and ``grpc.METHOD_GROUPS``. A front end builds a ``HeaderCheck`` per
restricted group when it starts; a request to one of the group's endpoints must carry the header with the value,
else it is refused with 403 / PERMISSION_DENIED before anything else is looked at. The value is compared in constant
time (``hmac.compare_digest``) and appears in no message, log line or repr; the error names the header only.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from pyserve.errors import PermissionDeniedError
from pyserve.server_config import Restriction

# gRPC carries a restriction's header as metadata under this prefix, as tritonserver does (its
# kRestrictedProtocolHeaderTemplate): HTTP/2 wants lower-case keys, and the prefix keeps them apart from others.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


class HeaderCheck:
    """The header one restricted group needs, as one protocol names it (``admin-key``, or over gRPC
    ``triton-grpc-protocol-admin-key``)."""

    __slots__ = ("_expected", "header", "header_bytes", "message")

    def __init__(self, header: str, value: str) -> None:
        self.header = header
        self.header_bytes = header.encode("latin-1")
        self._expected = value.encode()
        # Triton's wording; the header's name only, never its value.
        self.message = f"This API is restricted, expecting header '{header}'"

    def __repr__(self) -> str:
        return f"HeaderCheck({self.header!r})"

    def check(self, received: bytes | str | None) -> None:
        """Raise PermissionDeniedError unless ``received`` (the header's value, None when missing) is the value."""
        if received is None:
            raise PermissionDeniedError(self.message)
        given = received.encode("utf-8", "surrogateescape") if isinstance(received, str) else received
        # Constant time: how long the comparison takes says nothing of how much of the value matched.
        if not hmac.compare_digest(given, self._expected):
            raise PermissionDeniedError(self.message)


def header_checks(restrictions: Mapping[str, Restriction], prefix: str = "") -> dict[str, HeaderCheck]:
    """``{group: HeaderCheck}`` for a protocol's restrictions (``ServeConfig.http_restrictions()`` /
    ``grpc_restrictions()``), each header name after ``prefix``."""
    return {
        group: HeaderCheck(prefix + restriction.header, restriction.value)
        for group, restriction in restrictions.items()
    }
