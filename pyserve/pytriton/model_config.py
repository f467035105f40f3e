"""PyTriton's ``pytriton.model_config``: ``Tensor`` and ``ModelConfig`` with PyTriton's argument order and
defaults, over pyserve's ``pyserve.Tensor`` and ``pyserve.ModelConfig``.

``DynamicBatcher``, ``QueuePolicy`` and ``TimeoutAction`` are pyserve's own (they take PyTriton's arguments,
``None`` included); unlike PyTriton's they are frozen, so build a new one instead of assigning to a field.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Sequence
from typing import Any

from pyserve.config import DynamicBatcher, QueuePolicy, TimeoutAction
from pyserve.config import ModelConfig as PyServeModelConfig
from pyserve.config import Tensor as PyServeTensor

logger = logging.getLogger(__name__)

__all__ = ["DeviceKind", "DynamicBatcher", "ModelConfig", "QueuePolicy", "Tensor", "TimeoutAction"]


class DeviceKind(enum.Enum):
    """PyTriton's device kinds of a model's instances (pyserve places instances with ``ModelConfig.devices``)."""

    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class Tensor(PyServeTensor):
    """PyTriton's ``Tensor(shape, dtype, name=None, optional=False)``: a ``pyserve.Tensor`` declared in PyTriton's
    argument order. Without a name, ``bind`` names it ``INPUT_<n>`` / ``OUTPUT_<n>`` by its place (from 1)."""

    def __init__(
        self, shape: Sequence[int], dtype: Any, name: str | None = None, optional: bool | None = False
    ) -> None:
        super().__init__(name or "", dtype, tuple(shape), bool(optional))


@dataclasses.dataclass
class ModelConfig:
    """PyTriton's model configuration: batching on with ``max_batch_size`` 4 and a default dynamic batcher.

    ``batching=False`` serves a model without a batch dimension (``max_batch_size`` and ``batcher`` are then ignored,
    as PyTriton does). ``response_cache`` needs the server's cache (``TritonConfig.cache_config``). ``model_warmup``
    is accepted and not run (pyserve has no warm-up requests): a warning says so.
    """

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher | None = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list[Any] | None = None

    def to_pyserve(self) -> PyServeModelConfig:
        """The ``pyserve.ModelConfig`` that serves the model as this configuration says."""
        if self.model_warmup:
            logger.warning("ModelConfig.model_warmup is not run by pyserve; the model serves without warm-up")
        if not self.batching:
            return PyServeModelConfig(batching=False, decoupled=self.decoupled, response_cache=self.response_cache)
        return PyServeModelConfig(
            max_batch_size=self.max_batch_size,
            batcher=self.batcher,
            decoupled=self.decoupled,
            response_cache=self.response_cache,
        )
