"""pyserve: serve Python functions over the KServe v2 / Triton protocol, with dynamic batching."""

from pyserve._version import __version__
from pyserve.config import DynamicBatcher, ModelConfig, QueuePolicy, ServeConfig, Tensor, TimeoutAction
from pyserve.decorators import (
    ConstantPadder,
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
)
from pyserve.errors import PyServeError
from pyserve.request import ModelContext, Request, RequestBatch, current_model
from pyserve.serve import Serve

__all__ = [
    "ConstantPadder",
    "DynamicBatcher",
    "ModelConfig",
    "ModelContext",
    "PyServeError",
    "QueuePolicy",
    "Request",
    "RequestBatch",
    "Serve",
    "ServeConfig",
    "Tensor",
    "TimeoutAction",
    "__version__",
    "batch",
    "current_model",
    "fill_optionals",
    "first_value",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
]
