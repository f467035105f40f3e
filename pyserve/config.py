"""Configuration dataclasses: the one source of truth for tensors, models and the server.

The CLI and ``PYSERVE_<FIELD>`` environment variables map onto ``ServeConfig`` (defined, with its environment
parsing, in ``pyserve.server_config`` and re-exported here); everything the core process needs to know about a bound
model travels as ``ModelSpec.to_wire()``.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from pyserve.dtypes import datatype_of, numpy_dtype
from pyserve.errors import ConfigError
from pyserve.sequence_config import ControlKind as ControlKind
from pyserve.sequence_config import SequenceBatcher as SequenceBatcher
from pyserve.sequence_config import SequenceControl as SequenceControl
from pyserve.sequence_config import SequenceState as SequenceState
from pyserve.sequence_config import SequenceStrategy as SequenceStrategy
from pyserve.sequence_config import sequence_from_wire, sequence_to_wire
from pyserve.server_config import ServeConfig as ServeConfig  # re-exported: configuration is imported from here
from pyserve.server_config import header_pattern as header_pattern
from pyserve.server_config import parse_bool as parse_bool

_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


# Stands in for a Tensor's dtype when none was given: the field needs a default only because ``name`` has one.
_NO_DTYPE: Any = object()


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A declared input or output: name, dtype (numpy dtype, ``bytes``/``object`` for BYTES, ``bool``), shape.

    ``name`` may be left out (``""`` or None): ``bind`` then names the tensor by its place among the declared inputs
    or outputs, ``INPUT_1``, ``INPUT_2``, ... and ``OUTPUT_1``, ... (as PyTriton does). ``shape`` excludes the batch
    dimension when the model batches (``max_batch_size > 0``); -1 marks a variable dimension. ``optional`` inputs
    may be left out of a request; ``optional`` outputs may be left out of what the function returns (a missing
    required output fails the request). Tensors compare by datatype, so ``np.float32`` and ``"FP32"`` declare the
    same tensor.
    """

    name: str = ""
    dtype: Any = dataclasses.field(default=_NO_DTYPE, compare=False)
    shape: tuple[int, ...] = (-1,)
    optional: bool = False
    _datatype: str = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.name is None:
            object.__setattr__(self, "name", "")
        if not isinstance(self.name, str):
            raise ConfigError(f"tensor name must be a string (or None to be named by bind), got {self.name!r}")
        label = f"tensor '{self.name}'" if self.name else "unnamed tensor"
        if self.dtype is _NO_DTYPE:
            raise ConfigError(f"{label}: dtype is required (a numpy dtype, bytes for BYTES, bool, ...)")
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError):
            raise ConfigError(f"{label}: shape must be a sequence of ints, got {self.shape!r}") from None
        object.__setattr__(self, "shape", shape)
        for dim in self.shape:
            if dim < -1 or dim == 0:
                raise ConfigError(f"{label}: dimension {dim} in shape {self.shape} must be > 0 or -1")
        object.__setattr__(self, "_datatype", datatype_of(self.dtype))

    @property
    def datatype(self) -> str:
        """The KServe datatype name, e.g. 'FP32' or 'BYTES'."""
        return self._datatype

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The numpy dtype arrays of this tensor have inside the infer function."""
        return numpy_dtype(self.datatype)


class TimeoutAction(str, enum.Enum):
    """What a queue does with a request whose timeout expired."""

    REJECT = "REJECT"
    DELAY = "DELAY"


_E = TypeVar("_E", bound=enum.Enum)


def _enum_value(kind: type[_E], value: Any, field: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(member.value) for member in kind)
        raise ConfigError(f"{field} must be one of {choices}, got {value!r}") from None


@dataclasses.dataclass(frozen=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy: timeout behaviour and queue bound of one priority level."""

    timeout_action: TimeoutAction | str = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeout_action", _enum_value(TimeoutAction, self.timeout_action, "timeout_action"))
        if self.default_timeout_microseconds < 0 or self.max_queue_size < 0:
            raise ConfigError("QueuePolicy timeouts and max_queue_size must be >= 0")


@dataclasses.dataclass(frozen=True)
class DynamicBatcher:
    """Triton's dynamic batcher settings; batches count rows, up to the model's max_batch_size."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = dataclasses.field(default_factory=QueuePolicy)
    priority_queue_policy: dict[int, QueuePolicy] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # None (as PyTriton's DynamicBatcher leaves them) means the default.
        if self.default_queue_policy is None:
            object.__setattr__(self, "default_queue_policy", QueuePolicy())
        if self.priority_queue_policy is None:
            object.__setattr__(self, "priority_queue_policy", {})
        preferred = self.preferred_batch_size if self.preferred_batch_size is not None else ()
        object.__setattr__(self, "preferred_batch_size", tuple(int(s) for s in preferred))
        if self.max_queue_delay_microseconds < 0:
            raise ConfigError("DynamicBatcher.max_queue_delay_microseconds must be >= 0")
        if any(size <= 0 for size in self.preferred_batch_size):
            raise ConfigError(f"DynamicBatcher.preferred_batch_size must be positive, got {self.preferred_batch_size}")
        if self.priority_levels < 0:
            raise ConfigError("DynamicBatcher.priority_levels must be >= 0")
        if self.priority_levels and not 1 <= self.default_priority_level <= self.priority_levels:
            raise ConfigError(
                f"DynamicBatcher.default_priority_level {self.default_priority_level} must be in "
                f"1..{self.priority_levels}"
            )
        for level in self.priority_queue_policy:
            if not 1 <= level <= self.priority_levels:
                raise ConfigError(f"priority_queue_policy level {level} is outside 1..{self.priority_levels}")


class WorkerKind(str, enum.Enum):
    """Where instances of a model run."""

    THREAD = "thread"
    PROCESS = "process"
    RAY = "ray"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """How a bound model is served.

    ``max_batch_size`` 0 means the model's tensors have no batch dimension (as in Triton). With a positive
    ``max_batch_size`` the ``batcher`` (dynamic batching, on by default; ``None`` turns it off) merges requests
    into batches of at most that many rows.

    ``batching=False`` (PyTriton's switch) says the same as ``max_batch_size=0, batcher=None``: the model has no
    batch dimension and requests are never merged; a positive ``max_batch_size`` or batcher settings beside it are
    refused as contradictions. ``batching=True`` (the default) leaves it to ``max_batch_size``.

    ``sequence_batcher`` makes the model stateful (Triton's sequence batcher, docs/sequence.md): it takes the place
    of the dynamic batcher (``batcher`` is then None; other batcher settings beside it are refused).

    ``execution_timeout_s`` (off by default) bounds how long an instance may run one batch: past it, the batch's
    requests fail (``RequestTimeoutError``) and a process instance is killed and replaced; a thread cannot be
    stopped, so a thread instance serves again once its function returns (docs/batching.md).

    ``worker="ray"`` runs each instance as a Ray actor, placed by Ray anywhere in its cluster (extra ``[ray]``,
    docs/ray.md); ``ray_actor_options`` go to ``ray.remote`` (``{"num_gpus": 1}``, ``max_restarts``, resources...).
    """

    max_batch_size: int = 0
    batcher: DynamicBatcher | None = dataclasses.field(default_factory=DynamicBatcher)
    decoupled: bool = False
    instances: int = 1
    devices: tuple[str, ...] = ()
    worker: WorkerKind | str = WorkerKind.THREAD
    response_cache: bool = False
    parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    batching: bool = True
    sequence_batcher: SequenceBatcher | None = None
    ray_actor_options: dict[str, Any] | None = None
    execution_timeout_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "worker", _enum_value(WorkerKind, self.worker, "worker"))
        if self.execution_timeout_s is not None and not self.execution_timeout_s > 0:
            raise ConfigError(f"execution_timeout_s must be > 0 (or None: off), got {self.execution_timeout_s}")
        if self.ray_actor_options is not None and self.worker is not WorkerKind.RAY:
            raise ConfigError(f"ray_actor_options are for worker='ray', not worker='{WorkerKind(self.worker).value}'")
        if self.sequence_batcher is not None:
            self._check_sequence_batcher(self.sequence_batcher)
        object.__setattr__(self, "devices", tuple(self.devices))
        if self.max_batch_size < 0:
            raise ConfigError(f"max_batch_size must be >= 0, got {self.max_batch_size}")
        if not self.batching:
            if self.max_batch_size > 0:
                raise ConfigError(
                    f"batching=False means max_batch_size 0 (no batch dimension), got max_batch_size "
                    f"{self.max_batch_size}: leave one of them out"
                )
            if self.batcher is not None and self.batcher != DynamicBatcher():
                raise ConfigError("batching=False means no dynamic batcher, got batcher settings: leave one out")
            object.__setattr__(self, "batcher", None)
        if self.instances < 1:
            raise ConfigError(f"instances must be >= 1, got {self.instances}")
        if self.batcher is not None and self.max_batch_size > 0:
            too_big = [s for s in self.batcher.preferred_batch_size if s > self.max_batch_size]
            if too_big:
                raise ConfigError(f"preferred_batch_size {too_big} exceeds max_batch_size {self.max_batch_size}")
        if self.max_batch_size == 0 and self.batcher is not None and self.batcher != DynamicBatcher():
            # Settings that could never apply are refused rather than silently ignored.
            raise ConfigError(
                "DynamicBatcher settings need a batching model: with max_batch_size=0 requests have no batch "
                "dimension and are never merged, queued by priority or timed out; set max_batch_size > 0, or "
                "batcher=None"
            )

    def _check_sequence_batcher(self, sequence_batcher: SequenceBatcher) -> None:
        if not isinstance(sequence_batcher, SequenceBatcher):
            raise ConfigError(f"sequence_batcher must be a SequenceBatcher, got {sequence_batcher!r}")
        if self.batcher is not None and self.batcher != DynamicBatcher():
            raise ConfigError(
                "a model has one scheduler: dynamic batching (batcher) or sequence batching (sequence_batcher), not "
                "both; leave batcher out"
            )
        if self.response_cache:
            raise ConfigError(
                "response_cache cannot be used with sequence_batcher: a stateful model's answers depend on its sequence"
            )
        object.__setattr__(self, "batcher", None)

    @property
    def dynamic_batching(self) -> bool:
        """Whether requests are merged into batches."""
        return self.batcher is not None and self.max_batch_size > 0


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything the core needs to serve one bound model (no callables: it crosses processes)."""

    name: str
    version: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    config: ModelConfig
    strict: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _MODEL_NAME.match(self.name):
            raise ConfigError(
                f"invalid model name {self.name!r}: use 1-128 letters, digits, '_', '-' or '.', "
                "not starting with '-' or '.'"
            )
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise ConfigError(f"model '{self.name}': version must be an integer >= 1, got {self.version!r}")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            if not tensors:
                raise ConfigError(f"model '{self.name}': at least one {kind} is required")
            for tensor in tensors:
                if not isinstance(tensor, Tensor):
                    raise ConfigError(f"model '{self.name}': {kind}s must be Tensor objects, got {tensor!r}")
                if not tensor.name:
                    # bind() names unnamed tensors (as_tensors); a spec built by hand must name them itself.
                    raise ConfigError(f"model '{self.name}': {kind} {tensor!r} has no name")
            names = [t.name for t in tensors]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ConfigError(f"model '{self.name}': duplicate {kind} names {dupes}")
        sequence_batcher = self.config.sequence_batcher
        if sequence_batcher is not None:
            sequence_batcher.check_model(
                self.name, self.config.max_batch_size, (t.name for t in self.inputs), (t.name for t in self.outputs)
            )

    def to_wire(self) -> dict[str, Any]:
        """A msgpack-able description for the core process."""
        cfg = self.config
        batcher = cfg.batcher
        return {
            "name": self.name,
            "version": self.version,
            "strict": self.strict,
            "inputs": [[t.name, t.datatype, list(t.shape), t.optional] for t in self.inputs],
            "outputs": [[t.name, t.datatype, list(t.shape), t.optional] for t in self.outputs],
            "max_batch_size": cfg.max_batch_size,
            "batcher": None if batcher is None else _batcher_to_wire(batcher),
            "decoupled": cfg.decoupled,
            "instances": cfg.instances,
            "devices": list(cfg.devices),
            "worker": WorkerKind(cfg.worker).value,
            "response_cache": cfg.response_cache,
            "parameters": dict(cfg.parameters),
            "batching": cfg.batching,
            "execution_timeout_s": cfg.execution_timeout_s,
            "sequence_batcher": None if cfg.sequence_batcher is None else sequence_to_wire(cfg.sequence_batcher),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ModelSpec:
        """Rebuild a spec sent by to_wire()."""
        batcher = data["batcher"]
        config = ModelConfig(
            max_batch_size=data["max_batch_size"],
            batcher=None if batcher is None else _batcher_from_wire(batcher),
            decoupled=data["decoupled"],
            instances=data["instances"],
            devices=tuple(data["devices"]),
            worker=data["worker"],
            response_cache=data["response_cache"],
            parameters=dict(data["parameters"]),
            batching=data.get("batching", True),
            execution_timeout_s=data.get("execution_timeout_s"),
            sequence_batcher=None if not data.get("sequence_batcher") else sequence_from_wire(data["sequence_batcher"]),
        )
        return cls(
            name=data["name"],
            version=data["version"],
            inputs=tuple(Tensor(n, d, tuple(s), o) for n, d, s, o in data["inputs"]),
            outputs=tuple(Tensor(n, d, tuple(s), o) for n, d, s, o in data["outputs"]),
            config=config,
            strict=data["strict"],
        )


def _policy_to_wire(policy: QueuePolicy) -> list[Any]:
    return [
        TimeoutAction(policy.timeout_action).value,
        policy.default_timeout_microseconds,
        policy.allow_timeout_override,
        policy.max_queue_size,
    ]


def _batcher_to_wire(batcher: DynamicBatcher) -> dict[str, Any]:
    return {
        "max_queue_delay_microseconds": batcher.max_queue_delay_microseconds,
        "preferred_batch_size": list(batcher.preferred_batch_size),
        "preserve_ordering": batcher.preserve_ordering,
        "priority_levels": batcher.priority_levels,
        "default_priority_level": batcher.default_priority_level,
        "default_queue_policy": _policy_to_wire(batcher.default_queue_policy),
        "priority_queue_policy": {
            str(level): _policy_to_wire(policy) for level, policy in batcher.priority_queue_policy.items()
        },
    }


def _batcher_from_wire(data: dict[str, Any]) -> DynamicBatcher:
    return DynamicBatcher(
        max_queue_delay_microseconds=data["max_queue_delay_microseconds"],
        preferred_batch_size=tuple(data["preferred_batch_size"]),
        preserve_ordering=data["preserve_ordering"],
        priority_levels=data["priority_levels"],
        default_priority_level=data["default_priority_level"],
        default_queue_policy=QueuePolicy(*data["default_queue_policy"]),
        priority_queue_policy={int(k): QueuePolicy(*v) for k, v in data["priority_queue_policy"].items()},
    )


def as_tensors(tensors: Sequence[Tensor], kind: str) -> tuple[Tensor, ...]:
    """Validate a user-given sequence of Tensor declarations (``kind``: "inputs" or "outputs").

    A tensor without a name is named by its place in the sequence, as PyTriton names them: ``INPUT_1``, ``INPUT_2``,
    ... for inputs and ``OUTPUT_1``, ... for outputs (counting every tensor, named or not).
    """
    if isinstance(tensors, Tensor):
        tensors = (tensors,)
    try:
        declared = tuple(tensors)
    except TypeError:
        raise ConfigError(f"{kind} must be a list of Tensor, got {tensors!r}") from None
    prefix = kind.rstrip("s").upper()
    return tuple(
        dataclasses.replace(tensor, name=f"{prefix}_{index}")
        if isinstance(tensor, Tensor) and not tensor.name
        else tensor
        for index, tensor in enumerate(declared, start=1)
    )
