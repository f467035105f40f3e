"""The boundary between what a client asks and how bytes move: calls described as data, and the transports that
carry them.

A codec (``http_codec``, ``grpc_codec``) turns each operation into a call: what to send and how to read the answer,
with no I/O. A transport (``transports`` sync, ``aio_transports`` asyncio) sends calls and hands the answer to the
call's parser. So the protocol logic exists once per protocol, and the client logic once for sync and async alike;
only the few lines that do I/O come twice. (A sync client driving an asyncio core on a loop thread was measured: the
thread hop added ~0.1 ms to a 0.4 ms round trip.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

import numpy as np

from pyserve.client.model import InferRequest, RemoteModelConfig, ServerAddress
from pyserve.errors import InferenceError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
Outputs = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Call(Generic[T]):
    """One request and answer. ``what`` names it in errors ("infer on model 'm'"); ``idempotent`` calls are
    retried once when a kept-alive connection turns out dead; ``repository`` marks load/unload for error mapping."""

    what: str
    idempotent: bool
    repository: bool


@dataclasses.dataclass(frozen=True)
class HttpCall(Call[T]):
    """An HTTP request; ``parse`` reads the answer's status, headers and body (raising the server's error)."""

    method: str
    path: str
    parse: Callable[[int, Mapping[str, str], bytes], T]
    body: bytes = b""
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class GrpcCall(Call[T]):
    """A unary gRPC call of raw bytes; ``parse`` reads the response message; ``on_error`` (when set) answers instead
    of raising when the server answers an error."""

    method: str
    request: bytes
    parse: Callable[[bytes], T]
    metadata: tuple[tuple[str, str], ...] = ()
    on_error: Callable[[InferenceError], T] | None = None


@dataclasses.dataclass(frozen=True)
class HttpStreamCall(Generic[T]):
    """An HTTP request answered with Server-Sent Events; ``parse_event`` reads one event's data (raising an error
    event), ``parse_error`` a non-200 answer's status and body."""

    what: str
    path: str
    body: bytes
    headers: Mapping[str, str]
    parse_event: Callable[[bytes], T]
    parse_error: Callable[[int, bytes], Exception]


@dataclasses.dataclass(frozen=True)
class GrpcStreamCall(Generic[T]):
    """A ``ModelStreamInfer`` call carrying one request; ``parse`` reads one stream message into the response it
    carries (None for a flag-only one) and whether it is the request's last."""

    what: str
    method: str
    request: bytes
    parse: Callable[[bytes], tuple[T | None, bool]]
    metadata: tuple[tuple[str, str], ...] = ()


StreamCall = HttpStreamCall[T] | GrpcStreamCall[T]


class Codec(Protocol):
    """Builds the calls of one protocol."""

    def server_ready(self) -> Call[bool]:
        """Whether the server answers ready."""

    def model_ready(self, name: str, version: str | None) -> Call[bool]:
        """Whether the model answers ready (False for one the server does not know)."""

    def model_config(self, name: str, version: str | None) -> Call[RemoteModelConfig]:
        """The model's configuration."""

    def infer(self, request: InferRequest) -> Call[Outputs]:
        """One inference, answered once."""

    def stream(self, request: InferRequest, config: RemoteModelConfig) -> StreamCall[Outputs]:
        """One inference whose responses stream back."""

    def load_model(self, name: str, config: str | None, files: Mapping[str, bytes] | None) -> Call[None]:
        """Load (or reload) a model of the server's repository."""

    def unload_model(self, name: str) -> Call[None]:
        """Unload a model of the server's repository."""

    def register_region(self, name: str, key: str, byte_size: int) -> Call[None]:
        """Register the whole system shared-memory object ``key`` as region ``name``."""

    def unregister_region(self, name: str) -> Call[None]:
        """Unregister region ``name`` (an unknown name is no error)."""


class Transport(Protocol):
    """Carries calls, blocking."""

    address: ServerAddress

    def run(self, call: Call[T], timeout_s: float) -> T:
        """Send ``call`` and return its parsed answer, all within ``timeout_s``."""

    def stream(self, call: StreamCall[T], timeout_s: float) -> Iterator[T]:
        """Send ``call``; yield each response, waiting at most ``timeout_s`` for each. Closing the iterator
        early cancels the request."""

    def close(self) -> None:
        """Close every connection."""


class AsyncTransport(Protocol):
    """Carries calls on the running asyncio loop."""

    address: ServerAddress

    async def run(self, call: Call[T], timeout_s: float) -> T:
        """Send ``call`` and return its parsed answer, all within ``timeout_s``."""

    def stream(self, call: StreamCall[T], timeout_s: float) -> AsyncIterator[T]:
        """Send ``call``; yield each response, waiting at most ``timeout_s`` for each. Closing the iterator
        early, or cancelling the task reading it, cancels the request."""

    async def close(self) -> None:
        """Close every connection."""


def timeout_message(what: str, timeout_s: float, waiting_for: str = "answer") -> str:
    """The message of a ClientTimeoutError: what timed out and after how long."""
    return f"{what}: no {waiting_for} within {timeout_s:g} s"
