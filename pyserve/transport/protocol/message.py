"""The message machinery every kind shares: ``Header``, ``MessageKind``, ``kind_of``, ``Message`` and the tensor
descriptor (``pyserve.transport.protocol`` lists every kind)."""

from __future__ import annotations

from typing import Any, ClassVar, Final

Header = dict[str, Any]
"""A message as msgpack carries it: built by a kind's ``build``, read through its class."""

TensorDescriptor = list[Any]
"""One tensor of a result or a BLS message: ``[name, datatype, shape, loc]`` (``loc``: ``messages.Loc``)."""


class MessageKind:
    """The kinds of message: the ``t`` of every header (the cancel notice, alone on its socket, has none)."""

    HELLO: Final = "hello"
    WELCOME: Final = "welcome"
    REFUSED: Final = "refused"
    INFER: Final = "infer"
    RESULT: Final = "res"
    FREE: Final = "free"
    STOP: Final = "stop"
    BYE: Final = "bye"
    BLS_REQUEST: Final = "bls"
    BLS_RESPONSE: Final = "bls_res"
    BLS_CANCEL: Final = "bls_cancel"
    BLS_FREE: Final = "bls_free"
    LOAD: Final = "load"
    LOAD_ENSEMBLE: Final = "load_ensemble"
    UNLOAD: Final = "unload"
    SERVING: Final = "serving"
    SHUTDOWN: Final = "shutdown"
    PING: Final = "ping"
    OPEN_REMOTE: Final = "open_remote"
    OK: Final = "ok"
    ERROR: Final = "error"


def kind_of(header: Header) -> str:
    """The kind of a received message (one of ``MessageKind``)."""
    kind: str = header["t"]
    return kind


class Message:
    """A received message, read into the attributes of its kind's class."""

    __slots__ = ()

    KIND: ClassVar[str]

    def __init__(self, header: Header) -> None:
        """Read a received header (a kind without fields has nothing to read)."""

    def __repr__(self) -> str:
        names = [name for cls in type(self).__mro__ for name in getattr(cls, "__slots__", ()) if name[0] != "_"]
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)!r}' for name in names)})"
