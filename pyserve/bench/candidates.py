"""A configuration ``tune`` tries, and the winner written out: as the ``ModelConfig(...)`` line to paste into the
``bind`` call, and as a Triton ``config.pbtxt`` (the model's configuration document, minus what only a repository
needs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format, text_format

from pyserve.config import DynamicBatcher, ModelConfig, ModelSpec, Tensor, WorkerKind
from pyserve.core.model_documents import model_config_json
from pyserve.frontends.protocol import model_config_pb2 as pb


@dataclasses.dataclass(frozen=True)
class Candidate:
    """The settings tune varies. ``instances`` counts every instance (per GPU times the GPUs when ``devices`` name
    GPUs); ``max_batch_size`` 0 is a model without a batch dimension."""

    max_batch_size: int
    instances: int
    worker: str = WorkerKind.THREAD.value
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()

    def model_config(self, base: ModelConfig) -> ModelConfig:
        """``base`` (the model's own configuration) with this candidate's settings; the rest of ``base`` kept."""
        batcher = base.batcher
        if self.max_batch_size > 0:
            batcher = dataclasses.replace(
                batcher or DynamicBatcher(),
                max_queue_delay_microseconds=self.max_queue_delay_us,
                preferred_batch_size=self.preferred_batch_size,
            )
        return dataclasses.replace(
            base,
            max_batch_size=self.max_batch_size,
            batcher=batcher,
            instances=self.instances,
            worker=self.worker,
            devices=self.devices,
        )

    def label(self) -> str:
        """A short description: ``batch 16, 2 thread instances, delay 100 us``."""
        parts = [f"batch {self.max_batch_size}" if self.max_batch_size else "no batching"]
        where = f" on {len(self.devices)} GPUs" if self.devices else ""
        parts.append(f"{self.instances} {self.worker} instance{'s' if self.instances > 1 else ''}{where}")
        if self.max_queue_delay_us:
            parts.append(f"delay {self.max_queue_delay_us} us")
        if self.preferred_batch_size:
            parts.append(f"preferred {','.join(map(str, self.preferred_batch_size))}")
        return ", ".join(parts)

    def cost(self) -> tuple[int, int, int, int, int]:
        """What the candidate costs, for breaking ties between candidates that measure alike: fewer instances, then
        threads before processes, then smaller batches, shorter delays, no preferred sizes."""
        return (
            self.instances,
            0 if self.worker == WorkerKind.THREAD.value else 1,
            self.max_batch_size,
            self.max_queue_delay_us,
            len(self.preferred_batch_size),
        )

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON."""
        doc = dataclasses.asdict(self)
        doc["preferred_batch_size"] = list(self.preferred_batch_size)
        doc["devices"] = list(self.devices)
        return doc


def model_config_line(config: ModelConfig) -> str:
    """``config`` as Python source, naming only the fields that differ from their defaults."""
    return _source(config)


def _source(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            default = type(value)()
        except (TypeError, ValueError):  # a settings class without defaults for every field
            return repr(value)
        fields = [
            f"{field.name}={_source(getattr(value, field.name))}"
            for field in dataclasses.fields(value)
            if field.init and getattr(value, field.name) != getattr(default, field.name)
        ]
        return f"{type(value).__name__}({', '.join(fields)})"
    if isinstance(value, WorkerKind):
        return repr(value.value)
    if isinstance(value, tuple):
        return f"({', '.join(_source(item) for item in value)}{',' if len(value) == 1 else ''})"
    return repr(value)


def config_pbtxt(name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor], config: ModelConfig) -> str:
    """The model's configuration as ``config.pbtxt`` (what ``/v2/models/{m}/config`` answers, without the fields that
    only restate defaults)."""
    spec = ModelSpec(name, 1, tuple(inputs), tuple(outputs), config)
    message = json_format.ParseDict(model_config_json(spec), pb.ModelConfig())
    for field in ("version_policy", "optimization"):
        message.ClearField(field)
    if not config.decoupled:
        message.ClearField("model_transaction_policy")
    text: str = text_format.MessageToString(message)
    return text
