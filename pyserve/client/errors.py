"""The server's answers turned back into pyserve's errors (the client's own errors, ``ClientError`` and its
subclasses, are in ``pyserve.errors`` with the rest of the tree).

pyserve's server names the class it raised (``pyserve.errors.ERROR_KIND_HEADER``, an HTTP header or gRPC trailing
metadata), and ``server_error`` rebuilds exactly that class. Without it (Triton, PyTriton, an error inside a stream)
an answer is an HTTP status or a gRPC code and a message, nothing more: the class comes from the status (each
class's ``http_status``/``grpc_code``), and where several classes share one status (503 is a full queue, a model
not ready or a queue timeout) from the words pyserve's and Triton's messages use. The message is the server's,
unchanged.
"""

from __future__ import annotations

import re

from pyserve.errors import (
    ClientError,
    DeadlockError,
    InferenceError,
    InvalidInputError,
    ModelExecutionError,
    ModelLoadError,
    ModelNotReadyError,
    QueueFullError,
    RequestTimeoutError,
    WorkerDiedError,
    error_class,
)

# Where several of pyserve's errors share a status, the one it stands for unless a message hint picks another.
_PREFERRED: tuple[type[InferenceError], ...] = (InvalidInputError, ModelNotReadyError, ModelExecutionError)


def _status_table(attribute: str) -> dict[object, type[InferenceError]]:
    """Status -> error class, over every server-side InferenceError of pyserve.errors (new ones join by themselves)."""
    by_status: dict[object, list[type[InferenceError]]] = {}
    pending = list(InferenceError.__subclasses__())
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        # ClientTimeoutError is also a RequestTimeoutError, but no server answers with it.
        if cls.__module__ == InferenceError.__module__ and not issubclass(cls, ClientError):
            by_status.setdefault(getattr(cls, attribute), []).append(cls)
    table: dict[object, type[InferenceError]] = {}
    for status, classes in by_status.items():
        preferred = [cls for cls in _PREFERRED if cls in classes]
        table[status] = classes[0] if len(classes) == 1 else (preferred[0] if preferred else InferenceError)
    return table


_BY_HTTP_STATUS = _status_table("http_status")
_BY_GRPC_CODE = _status_table("grpc_code")

# Classes that share a status with another, recognised by the words of their messages (pyserve's and Triton's).
_HINTS: tuple[tuple[type[InferenceError], re.Pattern[str]], ...] = (
    (QueueFullError, re.compile(r"maximum queue size|queue is full", re.IGNORECASE)),
    (RequestTimeoutError, re.compile(r"timeout expired|deadline passed|within its timeout", re.IGNORECASE)),
    (DeadlockError, re.compile(r"would deadlock|can never take this step")),
    (WorkerDiedError, re.compile(r"instance \d+ of model '[^']*' (?:left|\(pid \d+\) died)")),
    (ModelExecutionError, re.compile(r"model '[^']*' raised ")),
    (InferenceError, re.compile(r"^internal (?:server )?error")),
)


def server_error(
    status: int | str | None, message: str, *, repository: bool = False, kind: str | None = None
) -> InferenceError:
    """The pyserve error for a server's answer: ``status`` is the HTTP status (int), the gRPC code's name (str) or
    None (an error inside a stream, which carries only its message); ``kind`` the class the server named, if any.
    ``repository`` marks a load or unload call, whose invalid-argument answers are ModelLoadError."""
    named = None if kind is None else error_class(kind)
    if named is not None:
        return named(message)
    for cls, pattern in _HINTS:
        if _has_status(cls, status) and pattern.search(message):
            return cls(message)
    if repository and _has_status(ModelLoadError, status) and status is not None:
        return ModelLoadError(message)
    if isinstance(status, int):
        return _BY_HTTP_STATUS.get(status, InferenceError)(message)
    if isinstance(status, str):
        return _BY_GRPC_CODE.get(status, InferenceError)(message)
    return InferenceError(message)


def _has_status(cls: type[InferenceError], status: int | str | None) -> bool:
    if status is None:
        return True
    return cls.http_status == status if isinstance(status, int) else cls.grpc_code == status
