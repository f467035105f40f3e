"""pyserve: serve Python functions over the KServe v2 / Triton protocol, with dynamic batching."""

from pyserve._version import __version__
from pyserve.bls import ainfer, ainfer_stream, infer, infer_stream
from pyserve.config import (
    DynamicBatcher,
    ModelConfig,
    QueuePolicy,
    SequenceBatcher,
    SequenceControl,
    SequenceState,
    ServeConfig,
    Tensor,
    TimeoutAction,
)
from pyserve.decorators import (
    ConstantPadder,
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    sequence,
)
from pyserve.ensemble import Step
from pyserve.errors import PyServeError
from pyserve.remote import RemoteServe
from pyserve.request import ModelContext, Request, RequestBatch, current_model
from pyserve.serve import Serve

__all__ = [
    "ConstantPadder",
    "DynamicBatcher",
    "ModelConfig",
    "ModelContext",
    "PyServeError",
    "QueuePolicy",
    "RemoteServe",
    "Request",
    "RequestBatch",
    "SequenceBatcher",
    "SequenceControl",
    "SequenceState",
    "Serve",
    "ServeConfig",
    "Step",
    "Tensor",
    "TimeoutAction",
    "__version__",
    "ainfer",
    "ainfer_stream",
    "batch",
    "current_model",
    "fill_optionals",
    "first_value",
    "group_by_keys",
    "group_by_values",
    "infer",
    "infer_stream",
    "pad_batch",
    "sample",
    "sequence",
]
