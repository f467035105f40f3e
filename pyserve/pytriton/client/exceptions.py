"""PyTriton's ``pytriton.client.exceptions``, as names of the errors pyserve's clients raise.

Each name is the pyserve class (``pyserve.errors``) raised where PyTriton raises that
exception, so ``except`` clauses written for PyTriton catch the same failures:

- ``PyTritonClientError``: ``PyServeError`` (everything a client raises);
- ``PyTritonClientTimeoutError``: ``RequestTimeoutError`` (the client's own timeouts, ``ClientTimeoutError``,
  are one);
- ``PyTritonClientModelUnavailableError``: ``ModelNotFoundError`` (a model the server has not loaded is
  ``ModelNotReadyError``);
- ``PyTritonClientInferenceServerError``: ``InferenceError`` (any error the server answered);
- ``PyTritonClientModelDoesntSupportBatchingError``: ``UnsupportedError`` (``infer_batch`` on a model with
  ``max_batch_size`` 0);
- ``PyTritonClientClosedError``: ``ClientClosedError``; ``PyTritonClientQueueFullError``: ``QueueFullError``;
- ``PyTritonClientValueError``: ``InvalidInputError`` (inputs or parameters the client refuses);
- ``PyTritonClientInvalidUrlError``, ``PyTritonClientUrlParseError``: ``ConfigError`` (a malformed server URL).
"""

from __future__ import annotations

from pyserve.errors import (
    ClientClosedError,
    ConfigError,
    InferenceError,
    InvalidInputError,
    ModelNotFoundError,
    PyServeError,
    QueueFullError,
    RequestTimeoutError,
    UnsupportedError,
)

PyTritonClientError = PyServeError
PyTritonClientTimeoutError = RequestTimeoutError
PyTritonClientModelUnavailableError = ModelNotFoundError
PyTritonClientInferenceServerError = InferenceError
PyTritonClientModelDoesntSupportBatchingError = UnsupportedError
PyTritonClientClosedError = ClientClosedError
PyTritonClientQueueFullError = QueueFullError
PyTritonClientValueError = InvalidInputError
PyTritonClientInvalidUrlError = ConfigError
PyTritonClientUrlParseError = ConfigError

__all__ = [
    "PyTritonClientClosedError",
    "PyTritonClientError",
    "PyTritonClientInferenceServerError",
    "PyTritonClientInvalidUrlError",
    "PyTritonClientModelDoesntSupportBatchingError",
    "PyTritonClientModelUnavailableError",
    "PyTritonClientQueueFullError",
    "PyTritonClientTimeoutError",
    "PyTritonClientUrlParseError",
    "PyTritonClientValueError",
]
