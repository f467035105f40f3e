"""Sequence batching settings (Triton's ``sequence_batching``): how a stateful model's requests are scheduled.

``SequenceBatcher`` goes into ``ModelConfig(sequence_batcher=...)``; its parts are ``SequenceControl`` (a control
input the model asks for: START, END, READY or CORRID) and ``SequenceState`` (an implicit state tensor the instance
keeps per sequence). Re-exported from ``pyserve.config``; the scheduler is ``pyserve.core.sequence_batcher`` and the
instance's side ``pyserve.worker.sequence_state`` (docs/sequence.md).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from pyserve.dtypes import as_bytes_array, datatype_of, deserialize_bytes, numpy_dtype, serialize_bytes
from pyserve.errors import ConfigError

# Triton's default when max_sequence_idle_microseconds is left out (or 0).
DEFAULT_IDLE_MICROSECONDS = 1_000_000
# Triton refuses string correlation IDs longer than this.
MAX_STRING_ID_BYTES = 128


class SequenceStrategy(str, enum.Enum):
    """How sequences share an instance: ``DIRECT`` gives each sequence a batch slot of its own (a batch has at most
    one request per slot); ``OLDEST`` batches the oldest ready requests of the instance's candidate sequences, as the
    dynamic batcher does."""

    DIRECT = "direct"
    OLDEST = "oldest"


class ControlKind(str, enum.Enum):
    """What a control input tells the model (Triton's ``ModelSequenceBatching.Control.Kind``)."""

    START = "CONTROL_SEQUENCE_START"
    READY = "CONTROL_SEQUENCE_READY"
    END = "CONTROL_SEQUENCE_END"
    CORRID = "CONTROL_SEQUENCE_CORRID"


_BOOLEAN_DATATYPES = ("INT32", "FP32", "BOOL")
_CORRID_DATATYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")
_NO_DTYPE: Any = object()


def _control_kind(value: Any) -> ControlKind:
    if isinstance(value, ControlKind):
        return value
    text = str(value.value if isinstance(value, enum.Enum) else value).upper()
    for kind in ControlKind:
        if text in (kind.value, kind.name):
            return kind
    choices = ", ".join(kind.name for kind in ControlKind)
    raise ConfigError(f"control kind must be one of {choices} (or CONTROL_SEQUENCE_<kind>), got {value!r}")


@dataclasses.dataclass(frozen=True)
class SequenceControl:
    """A control input: a tensor the server adds to each request of a sequence (not declared among the inputs).

    START, END and READY are boolean: each request gets ``false_true[1]`` where the flag holds, else
    ``false_true[0]``; ``dtype`` is np.int32 (default), np.float32 or bool. CORRID carries the request's correlation
    ID; ``dtype`` is np.uint64 (default), np.int64, np.uint32, np.int32 or bytes (string IDs). Each request's tensor
    has shape [1] (batch dimension added when the model batches: [1, 1]).
    """

    name: str
    kind: ControlKind | str
    dtype: Any = dataclasses.field(default=_NO_DTYPE, compare=False)
    false_true: tuple[Any, Any] | None = None
    _datatype: str = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a sequence control input needs a name, got {self.name!r}")
        kind = _control_kind(self.kind)
        object.__setattr__(self, "kind", kind)
        label = f"control input '{self.name}' ({kind.name})"
        if kind is ControlKind.CORRID:
            datatype = datatype_of(np.uint64 if self.dtype is _NO_DTYPE else self.dtype)
            if datatype not in _CORRID_DATATYPES:
                raise ConfigError(f"{label}: data type must be one of {', '.join(_CORRID_DATATYPES)}, got {datatype}")
            if self.false_true is not None:
                raise ConfigError(f"{label}: false_true is for START, END and READY controls, not CORRID")
        else:
            datatype = datatype_of(np.int32 if self.dtype is _NO_DTYPE else self.dtype)
            if datatype not in _BOOLEAN_DATATYPES:
                raise ConfigError(f"{label}: data type must be INT32, FP32 or BOOL, got {datatype}")
            values = (False, True) if self.false_true is None else tuple(self.false_true)
            if len(values) != 2:
                raise ConfigError(f"{label}: false_true must hold exactly 2 values (false, true), got {values!r}")
            cast = {"INT32": int, "FP32": float, "BOOL": bool}[datatype]
            object.__setattr__(self, "false_true", (cast(values[0]), cast(values[1])))
        object.__setattr__(self, "dtype", numpy_dtype(datatype))
        object.__setattr__(self, "_datatype", datatype)

    @property
    def datatype(self) -> str:
        """The KServe datatype of the control tensor ('INT32', 'BYTES', ...)."""
        return self._datatype


@dataclasses.dataclass(frozen=True)
class SequenceState:
    """An implicit state tensor: kept by the instance for each sequence, handed to the function as input
    ``input_name`` with each request and replaced by the output ``output_name`` the function returns (an output that
    is left out keeps the state as it was). Neither is declared among the model's inputs or outputs, and neither
    travels to or from the client.

    ``shape`` excludes the batch dimension (each request's state has shape [1, *shape] when the model batches). A
    sequence starts from ``initial_value`` (broadcast to ``shape``) or, when None, from zeros (empty strings for
    BYTES; a -1 dimension starts at 0, an empty state that grows).
    """

    input_name: str
    output_name: str
    dtype: Any = dataclasses.field(default=_NO_DTYPE, compare=False)
    shape: tuple[int, ...] = (1,)
    initial_value: Any = dataclasses.field(default=None, compare=False)
    _datatype: str = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        for field in ("input_name", "output_name"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise ConfigError(f"a sequence state needs an {field}, got {getattr(self, field)!r}")
        label = f"state '{self.input_name}'"
        if self.dtype is _NO_DTYPE:
            raise ConfigError(f"{label}: dtype is required")
        datatype = datatype_of(self.dtype)
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError):
            raise ConfigError(f"{label}: shape must be a sequence of ints, got {self.shape!r}") from None
        if any(d < -1 or d == 0 for d in shape):
            raise ConfigError(f"{label}: dimensions of shape {shape} must be > 0 or -1")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", numpy_dtype(datatype))
        object.__setattr__(self, "_datatype", datatype)
        if self.initial_value is not None:
            object.__setattr__(self, "initial_value", _initial_array(label, self.initial_value, datatype, shape))

    @property
    def datatype(self) -> str:
        """The KServe datatype of the state tensor."""
        return self._datatype

    def initial(self) -> np.ndarray:
        """A fresh copy of the state a sequence starts from (without the batch dimension)."""
        if self.initial_value is not None:
            return np.array(self.initial_value, copy=True)
        shape = tuple(0 if d == -1 else d for d in self.shape)
        if self._datatype == "BYTES":
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=self.dtype)


def _initial_array(label: str, value: Any, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    try:
        array = as_bytes_array(np.asarray(value)) if datatype == "BYTES" else np.asarray(value, numpy_dtype(datatype))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{label}: initial_value cannot be read as {datatype}: {exc}") from None
    if -1 not in shape:
        try:
            return np.array(np.broadcast_to(array, shape), copy=True)
        except ValueError:
            raise ConfigError(f"{label}: initial_value of shape {array.shape} does not fit shape {shape}") from None
    if array.ndim != len(shape) or any(d not in (-1, s) for d, s in zip(shape, array.shape, strict=True)):
        raise ConfigError(f"{label}: initial_value of shape {array.shape} does not fit shape {shape}")
    return np.array(array, copy=True)


_DIRECT_ONLY = ("minimum_slot_utilization",)
_OLDEST_ONLY = ("max_candidate_sequences", "preferred_batch_size", "preserve_ordering")


@dataclasses.dataclass(frozen=True)
class SequenceBatcher:
    """Triton's sequence batcher: every request carries a correlation ID (``sequence_id``) and the
    ``sequence_start`` / ``sequence_end`` flags; all requests of one sequence run, in order, on the instance (and
    batch slot) the sequence was given at its start.

    ``strategy`` "direct" (default): each instance has ``max_batch_size`` slots (1 without batching), one per
    sequence; a batch holds at most one request per slot, and goes as soon as one is ready, or — with
    ``minimum_slot_utilization`` > 0 — once that fraction of the slots is ready or its oldest request has waited
    ``max_queue_delay_microseconds``. "oldest": each instance takes up to ``max_candidate_sequences`` sequences (0:
    ``max_batch_size``) and batches the oldest ready requests among them like the dynamic batcher
    (``preferred_batch_size``, ``max_queue_delay_microseconds``, ``preserve_ordering``).

    A sequence that gets no request for ``max_sequence_idle_microseconds`` is released; its next request fails. A
    sequence that finds every slot taken waits in the backlog for one; ``max_backlog_sequences`` (pyserve's; None,
    the default, is unbounded as in Triton) bounds the backlog: past it a new sequence is refused.
    """

    strategy: SequenceStrategy | str = SequenceStrategy.DIRECT
    max_sequence_idle_microseconds: int = DEFAULT_IDLE_MICROSECONDS
    control_inputs: tuple[SequenceControl, ...] = ()
    states: tuple[SequenceState, ...] = ()
    max_queue_delay_microseconds: int = 0
    minimum_slot_utilization: float = 0.0
    max_candidate_sequences: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False
    max_backlog_sequences: int | None = None

    def __post_init__(self) -> None:
        try:
            strategy = SequenceStrategy(str(getattr(self.strategy, "value", self.strategy)).lower())
        except ValueError:
            raise ConfigError(f"SequenceBatcher.strategy must be 'direct' or 'oldest', got {self.strategy!r}") from None
        object.__setattr__(self, "strategy", strategy)
        object.__setattr__(self, "control_inputs", _tuple_of(self.control_inputs, SequenceControl, "control_inputs"))
        object.__setattr__(self, "states", _tuple_of(self.states, SequenceState, "states"))
        object.__setattr__(self, "preferred_batch_size", tuple(int(s) for s in self.preferred_batch_size or ()))
        if self.max_sequence_idle_microseconds <= 0:
            raise ConfigError("SequenceBatcher.max_sequence_idle_microseconds must be > 0")
        if self.max_queue_delay_microseconds < 0:
            raise ConfigError("SequenceBatcher.max_queue_delay_microseconds must be >= 0")
        if not 0.0 <= self.minimum_slot_utilization <= 1.0 or math.isnan(self.minimum_slot_utilization):
            raise ConfigError(
                f"SequenceBatcher.minimum_slot_utilization must be in [0.0, 1.0], got {self.minimum_slot_utilization}"
            )
        if self.max_candidate_sequences < 0:
            raise ConfigError("SequenceBatcher.max_candidate_sequences must be >= 0")
        if any(size <= 0 for size in self.preferred_batch_size):
            raise ConfigError(f"SequenceBatcher.preferred_batch_size must be positive, got {self.preferred_batch_size}")
        if self.max_backlog_sequences is not None and self.max_backlog_sequences < 0:
            raise ConfigError("SequenceBatcher.max_backlog_sequences must be >= 0 (or None: no bound)")
        defaults = SequenceBatcher.__dataclass_fields__
        wrong = _DIRECT_ONLY if strategy is SequenceStrategy.OLDEST else _OLDEST_ONLY
        set_wrong = [name for name in wrong if getattr(self, name) != defaults[name].default]
        if set_wrong:
            raise ConfigError(
                f"SequenceBatcher: {', '.join(set_wrong)} do(es) not apply to strategy '{strategy.value}'"
            )
        self._check_names()

    def _check_names(self) -> None:
        kinds: dict[ControlKind, str] = {}
        names: set[str] = set()
        for control in self.control_inputs:
            kind = ControlKind(control.kind)
            if kind in kinds:
                raise ConfigError(f"SequenceBatcher: {kind.value} is given twice ('{kinds[kind]}', '{control.name}')")
            if control.name in names:
                raise ConfigError(f"SequenceBatcher: control input '{control.name}' is given for several kinds")
            kinds[kind] = control.name
            names.add(control.name)
        outputs: set[str] = set()
        for state in self.states:
            if state.input_name in names:
                raise ConfigError(f"SequenceBatcher: input name '{state.input_name}' is used twice")
            if state.output_name in outputs:
                raise ConfigError(f"SequenceBatcher: state output name '{state.output_name}' is used twice")
            names.add(state.input_name)
            outputs.add(state.output_name)

    def control(self, kind: ControlKind) -> SequenceControl | None:
        """The control input of ``kind``, if the model asks for one."""
        return next((c for c in self.control_inputs if c.kind is kind), None)

    def slots_per_instance(self, max_batch_size: int) -> int:
        """How many sequences one instance holds at a time."""
        if self.strategy is SequenceStrategy.OLDEST and self.max_candidate_sequences:
            return self.max_candidate_sequences
        return max(max_batch_size, 1)

    def check_model(self, model: str, max_batch_size: int, inputs: Iterable[str], outputs: Iterable[str]) -> None:
        """Raise ConfigError where these settings do not fit the model: preferred sizes over ``max_batch_size``,
        control or state inputs named like declared inputs, state outputs named like declared outputs."""
        too_big = [size for size in self.preferred_batch_size if size > max_batch_size]
        if too_big:
            raise ConfigError(f"model '{model}': sequence preferred_batch_size {too_big} exceeds max_batch_size")
        declared_inputs, declared_outputs = set(inputs), set(outputs)
        for name in [c.name for c in self.control_inputs] + [s.input_name for s in self.states]:
            if name in declared_inputs:
                raise ConfigError(
                    f"model '{model}': '{name}' is a sequence control or state input and must not be declared among "
                    "the inputs (the server supplies it)"
                )
        for state in self.states:
            if state.output_name in declared_outputs:
                raise ConfigError(
                    f"model '{model}': '{state.output_name}' is a sequence state output and must not be declared "
                    "among the outputs (it stays in the instance)"
                )


def _tuple_of(items: Any, kind: type[Any], field: str) -> tuple[Any, ...]:
    if isinstance(items, kind):
        items = (items,)
    result = tuple(items or ())
    for item in result:
        if not isinstance(item, kind):
            raise ConfigError(f"SequenceBatcher.{field} must hold {kind.__name__} objects, got {item!r}")
    return result


# the wire form (ModelSpec.to_wire) ---------------------------------------------------------------------------------


def sequence_to_wire(batcher: SequenceBatcher) -> dict[str, Any]:
    """A description of ``batcher`` that msgpack and JSON can both carry."""
    return {
        "strategy": SequenceStrategy(batcher.strategy).value,
        "idle_us": batcher.max_sequence_idle_microseconds,
        "controls": [
            [c.name, ControlKind(c.kind).value, c.datatype, list(c.false_true) if c.false_true else None]
            for c in batcher.control_inputs
        ],
        "states": [
            [s.input_name, s.output_name, s.datatype, list(s.shape), _array_to_wire(s.initial_value, s.datatype)]
            for s in batcher.states
        ],
        "delay_us": batcher.max_queue_delay_microseconds,
        "min_util": batcher.minimum_slot_utilization,
        "candidates": batcher.max_candidate_sequences,
        "preferred": list(batcher.preferred_batch_size),
        "ordered": batcher.preserve_ordering,
        "backlog": batcher.max_backlog_sequences,
    }


def sequence_from_wire(data: dict[str, Any]) -> SequenceBatcher:
    """Rebuild a batcher sent by ``sequence_to_wire``."""
    return SequenceBatcher(
        strategy=data["strategy"],
        max_sequence_idle_microseconds=data["idle_us"],
        control_inputs=tuple(
            SequenceControl(name, kind, datatype, None if values is None else tuple(values))
            for name, kind, datatype, values in data["controls"]
        ),
        states=tuple(
            SequenceState(input_name, output_name, datatype, tuple(shape), _array_from_wire(initial, datatype))
            for input_name, output_name, datatype, shape, initial in data["states"]
        ),
        max_queue_delay_microseconds=data["delay_us"],
        minimum_slot_utilization=data["min_util"],
        max_candidate_sequences=data["candidates"],
        preferred_batch_size=tuple(data["preferred"]),
        preserve_ordering=data["ordered"],
        max_backlog_sequences=data["backlog"],
    )


def _array_to_wire(array: np.ndarray | None, datatype: str) -> list[Any] | None:
    if array is None:
        return None
    data = serialize_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
    return [list(array.shape), base64.b64encode(data).decode()]


def _array_from_wire(value: list[Any] | None, datatype: str) -> np.ndarray | None:
    if value is None:
        return None
    shape, data = tuple(value[0]), base64.b64decode(value[1])
    if datatype == "BYTES":
        return deserialize_bytes(data, math.prod(shape)).reshape(shape)
    return np.frombuffer(data, dtype=numpy_dtype(datatype)).reshape(shape).copy()
