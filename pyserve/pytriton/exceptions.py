"""PyTriton's ``pytriton.exceptions``, as names of pyserve's errors (``pyserve.errors``) so that ``except`` clauses
written for PyTriton catch what pyserve raises.

- ``PyTritonError``: ``PyServeError``, the base of everything pyserve raises;
- ``PyTritonValidationError``, ``PyTritonBadParameterError``, ``PyTritonModelConfigError``: ``ConfigError`` (a bad
  ``Tensor``, ``ModelConfig``, ``TritonConfig`` or ``bind``);
- ``PyTritonInvalidOperationError``: ``ServerError`` (the server could not start, or is not running);
- ``PyTritonRuntimeError``: ``ModelExecutionError`` (a model or a decorator failed a batch);
- ``PyTritonUnrecoverableError``: an infer function raises it to fail its batch; pyserve answers the batch's
  requests with it (HTTP 500) and, unlike PyTriton, keeps the model serving.
"""

from __future__ import annotations

from pyserve.errors import ConfigError, ModelExecutionError, PyServeError, ServerError

PyTritonError = PyServeError
PyTritonValidationError = ConfigError
PyTritonBadParameterError = ConfigError
PyTritonModelConfigError = ConfigError
PyTritonInvalidOperationError = ServerError
PyTritonRuntimeError = ModelExecutionError


class PyTritonUnrecoverableError(ModelExecutionError):
    """Raised by an infer function for an error it cannot recover from; answers its batch with HTTP 500."""


__all__ = [
    "PyTritonBadParameterError",
    "PyTritonError",
    "PyTritonInvalidOperationError",
    "PyTritonModelConfigError",
    "PyTritonRuntimeError",
    "PyTritonUnrecoverableError",
    "PyTritonValidationError",
]
