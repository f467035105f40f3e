"""Tests of pyserve.errors: the one exception tree and its HTTP / gRPC mapping."""

from __future__ import annotations

import errno
import inspect
import os

import pytest

from pyserve import errors
from pyserve.errors import (
    CancelledError,
    ClientClosedError,
    ClientError,
    ClientTimeoutError,
    ConfigError,
    DeadlockError,
    InferenceError,
    InvalidInputError,
    ModelAlreadyBoundError,
    ModelExecutionError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    OutputMismatchError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PyServeError,
    QueueFullError,
    RequestTimeoutError,
    ServerError,
    ServerUnreachableError,
    UnsupportedError,
    WorkerDiedError,
    error_from_kind,
    error_kind,
)

GRPC_CODES = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
}

# The errors a server answers with (ClientTimeoutError is also a RequestTimeoutError, but only clients raise it).
INFERENCE_ERRORS = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, InferenceError) and not issubclass(cls, ClientError) and cls.__module__ == errors.__name__
]

MAPPING = [
    (InvalidInputError, 400, "INVALID_ARGUMENT"),
    (ModelNotFoundError, 404, "NOT_FOUND"),
    (ModelNotReadyError, 503, "UNAVAILABLE"),
    (PayloadTooLargeError, 413, "RESOURCE_EXHAUSTED"),
    (QueueFullError, 503, "UNAVAILABLE"),
    (RequestTimeoutError, 503, "DEADLINE_EXCEEDED"),
    (CancelledError, 499, "CANCELLED"),
    (UnsupportedError, 501, "UNIMPLEMENTED"),
    (PermissionDeniedError, 403, "PERMISSION_DENIED"),
    (ModelLoadError, 400, "INVALID_ARGUMENT"),
    (ModelExecutionError, 500, "INTERNAL"),
    (OutputMismatchError, 500, "INTERNAL"),
    (WorkerDiedError, 500, "INTERNAL"),
    (DeadlockError, 500, "INTERNAL"),
    (InferenceError, 500, "INTERNAL"),
]


def test_the_table_covers_every_inference_error() -> None:
    assert {cls for cls, _, _ in MAPPING} == set(INFERENCE_ERRORS)


@pytest.mark.parametrize(("cls", "status", "code"), MAPPING, ids=[cls.__name__ for cls, _, _ in MAPPING])
def test_each_inference_error_maps_to_one_http_status_and_grpc_code(
    cls: type[InferenceError], status: int, code: str
) -> None:
    assert cls.http_status == status
    assert cls.grpc_code == code
    assert code in GRPC_CODES
    error = cls("boom")
    assert error.http_status == status
    assert str(error) == "boom"


@pytest.mark.parametrize("cls", INFERENCE_ERRORS, ids=lambda cls: cls.__name__)
def test_error_kind_round_trips_across_a_process_boundary(cls: type[InferenceError]) -> None:
    original = cls("input 'x': expected FP32, got INT64")
    rebuilt = error_from_kind(error_kind(original), str(original))
    assert type(rebuilt) is cls
    assert str(rebuilt) == str(original)
    assert rebuilt.http_status == original.http_status
    assert rebuilt.grpc_code == original.grpc_code


def test_an_unknown_kind_becomes_a_plain_inference_error() -> None:
    rebuilt = error_from_kind("SomethingNew", "details")
    assert type(rebuilt) is InferenceError
    assert str(rebuilt) == "details"
    assert rebuilt.http_status == 500


def test_every_error_is_a_pyserve_error() -> None:
    every = [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if cls.__module__ == errors.__name__]
    assert len(every) >= 17
    for cls in every:
        assert issubclass(cls, PyServeError), cls
        assert cls.__doc__, f"{cls.__name__} has no docstring"


def test_the_tree_of_the_module_docstring() -> None:
    assert issubclass(ModelAlreadyBoundError, ConfigError)
    assert issubclass(OutputMismatchError, ModelExecutionError)
    assert issubclass(PayloadTooLargeError, InvalidInputError)
    for cls in (ConfigError, ServerError, InferenceError, ClientError):
        assert cls.__bases__[0] is PyServeError
    for cls in (ServerUnreachableError, ClientClosedError, ClientTimeoutError):
        assert issubclass(cls, ClientError)
        assert not issubclass(cls, (ConfigError, ServerError)), cls
    named = {word for word in (errors.__doc__ or "").split() if word.endswith("Error")}
    defined = {name for name, cls in inspect.getmembers(errors, inspect.isclass) if cls.__module__ == errors.__name__}
    assert named == defined


def test_errors_also_catch_as_builtin_exceptions() -> None:
    # Callers that only know Python's exceptions still catch the right thing.
    assert issubclass(ConfigError, ValueError)
    assert issubclass(InvalidInputError, ValueError)
    assert issubclass(ModelNotFoundError, LookupError)
    assert issubclass(RequestTimeoutError, TimeoutError)
    assert issubclass(ServerError, RuntimeError)


def test_a_client_timeout_is_caught_as_a_request_timeout() -> None:
    # One except clause takes a request that timed out on either side; ClientTimeoutError tells the client's apart.
    with pytest.raises(RequestTimeoutError):
        raise ClientTimeoutError("infer on model 'm': no answer within 0.2 s")
    assert issubclass(ClientTimeoutError, TimeoutError)
    assert not issubclass(RequestTimeoutError, ClientError)


def test_a_client_error_never_crosses_a_process_boundary_as_itself() -> None:
    assert type(error_from_kind("ClientTimeoutError", "late")) is InferenceError


def test_server_unreachable_names_the_address_and_the_reason() -> None:
    error = ServerUnreachableError(
        "http://127.0.0.1:8000", ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
    )
    assert str(error) == f"cannot reach the server at http://127.0.0.1:8000: {os.strerror(errno.ECONNREFUSED)}"
    assert error.address == "http://127.0.0.1:8000"
    assert isinstance(error, ConnectionError)
