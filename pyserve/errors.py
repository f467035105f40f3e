"""The one exception tree of pyserve, and how each error maps onto HTTP and gRPC.

PyServeError
├── ConfigError              invalid Tensor / ModelConfig / ServeConfig, bad bind
│   └── ModelAlreadyBoundError
├── ServerError              the core process failed to start or went away
├── InferenceError           anything that answers a request with an error
│   ├── InvalidInputError        400 / INVALID_ARGUMENT: malformed or mismatching request
│   ├── ModelNotFoundError       404 / NOT_FOUND: unknown model or version
│   ├── ModelNotReadyError       503 / UNAVAILABLE: model known but without live instances
│   ├── PayloadTooLargeError     413 / RESOURCE_EXHAUSTED: body over the configured limit
│   ├── QueueFullError           503 / UNAVAILABLE: the model's queue is full
│   ├── RequestTimeoutError      503 / DEADLINE_EXCEEDED: the request waited past its timeout
│   ├── CancelledError           499 / CANCELLED: the client went away
│   ├── UnsupportedError         501 / UNIMPLEMENTED: valid request this server cannot serve
│   ├── PermissionDeniedError    403 / PERMISSION_DENIED: a restricted API without its header (restricted_api)
│   ├── ModelLoadError           400 / INVALID_ARGUMENT: a repository model failed to load or unload
│   ├── ModelExecutionError      500 / INTERNAL: the user's function raised (type and message)
│   │   └── OutputMismatchError  500 / INTERNAL: a model returned a missing or (strict) wrong output
│   ├── WorkerDiedError          500 / INTERNAL: the instance running the request died
│   └── DeadlockError            500 / INTERNAL: a BLS call could never run (it waits on its own caller)
└── ClientError              raised by pyserve's own clients (pyserve.client), never by the server
    ├── ServerUnreachableError   no connection to the server (refused, reset, unknown host); names the address
    ├── ClientClosedError        a call on a client after close()
    └── ClientTimeoutError       a client-side wait ran out (connect, init, infer, a streamed response); also a
                                 RequestTimeoutError, so one except clause takes the client's and the server's
"""

from __future__ import annotations

import os
import ssl


class PyServeError(Exception):
    """Base of every error pyserve raises."""


class ConfigError(PyServeError, ValueError):
    """A Tensor, ModelConfig, ServeConfig or bind() call is invalid."""


class ModelAlreadyBoundError(ConfigError):
    """A model with that name and version is already bound."""


class ServerError(PyServeError, RuntimeError):
    """The core serving process could not start or stopped unexpectedly."""


class InferenceError(PyServeError):
    """An error that answers an inference or control request."""

    http_status = 500
    grpc_code = "INTERNAL"


class InvalidInputError(InferenceError, ValueError):
    """The request is malformed or does not match the model's declared tensors."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class ModelNotFoundError(InferenceError, LookupError):
    """No model (or version) of that name is bound."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class ModelNotReadyError(InferenceError):
    """The model is known but has no live instance."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class PayloadTooLargeError(InvalidInputError):
    """The request body exceeds ServeConfig.max_request_bytes."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class QueueFullError(InferenceError):
    """The model's queue holds its maximum number of requests."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class RequestTimeoutError(InferenceError, TimeoutError):
    """The request waited longer than its timeout."""

    http_status = 503
    grpc_code = "DEADLINE_EXCEEDED"


class CancelledError(InferenceError):
    """The client cancelled the request or disconnected."""

    http_status = 499
    grpc_code = "CANCELLED"


class UnsupportedError(InferenceError):
    """A valid request for something this server does not (yet) do."""

    http_status = 501
    grpc_code = "UNIMPLEMENTED"


class PermissionDeniedError(InferenceError):
    """A restricted API (``ServeConfig.restricted_api``) was called without the header it requires."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"


class ModelLoadError(InferenceError):
    """A repository model could not be loaded or unloaded (its config, files or instances); the message says why."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class ModelExecutionError(InferenceError):
    """The model's infer function raised; the message names the exception (and has its traceback with
    ServeConfig.debug_errors)."""

    http_status = 500
    grpc_code = "INTERNAL"


class OutputMismatchError(ModelExecutionError):
    """A model left out a declared or requested output, or a strict model returned a wrong name, dtype or shape."""


class WorkerDiedError(InferenceError):
    """The worker running the request exited before answering."""

    http_status = 500
    grpc_code = "INTERNAL"


class DeadlockError(InferenceError):
    """A BLS call (or an ensemble step it leads to) could only run on an instance waiting for it to finish."""

    http_status = 500
    grpc_code = "INTERNAL"


class ClientError(PyServeError):
    """An error of pyserve's clients themselves (no connection, a closed client, a client-side timeout, an answer
    the client cannot read); errors the server answered with are the InferenceError classes above."""


class ServerUnreachableError(ClientError, ConnectionError):
    """The client could not reach the server at ``address`` (connection refused or reset, unknown host)."""

    def __init__(self, address: str, reason: str | OSError) -> None:
        if isinstance(reason, ssl.SSLError):
            # "TLS: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: ..." (its errno says nothing).
            reason = f"TLS: {reason.strerror or reason}"
        elif isinstance(reason, OSError):
            # "Connection refused", not asyncio's "[Errno 111] Connect call failed ('127.0.0.1', 8000)".
            reason = os.strerror(reason.errno) if reason.errno else str(reason)
        super().__init__(f"cannot reach the server at {address}: {reason}")
        self.address = address


class ClientClosedError(ClientError):
    """The client was used after close()."""


class ClientTimeoutError(RequestTimeoutError, ClientError):
    """A client-side timeout ran out (connect, init, infer, or the wait for a streamed response); the message
    names which and its value. Also a RequestTimeoutError (and a TimeoutError): ``except RequestTimeoutError``
    takes a request that timed out on either side, ``except ClientTimeoutError`` only the client's."""


_BY_NAME: dict[str, type[InferenceError]] = {
    cls.__name__: cls
    for cls in (
        InferenceError,
        InvalidInputError,
        ModelNotFoundError,
        ModelNotReadyError,
        PayloadTooLargeError,
        QueueFullError,
        RequestTimeoutError,
        CancelledError,
        UnsupportedError,
        PermissionDeniedError,
        ModelLoadError,
        ModelExecutionError,
        OutputMismatchError,
        WorkerDiedError,
        DeadlockError,
    )
}


# Names the error's class beside Triton's error shape: an HTTP header of an error answer, a gRPC call's trailing
# metadata. Triton's clients ignore it; pyserve's client rebuilds the exact class from it.
ERROR_KIND_HEADER = "pyserve-error-kind"


def error_kind(error: InferenceError) -> str:
    """The name used to carry an error across a process boundary."""
    return type(error).__name__


def error_class(kind: str) -> type[InferenceError] | None:
    """The class error_kind() named, or None for a name it never gives."""
    return _BY_NAME.get(kind)


def error_from_kind(kind: str, message: str) -> InferenceError:
    """Rebuild an error sent across a process boundary by error_kind()."""
    return (error_class(kind) or InferenceError)(message)
