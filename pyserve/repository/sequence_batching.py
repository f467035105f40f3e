"""A config's ``sequence_batching`` (Triton's ``ModelSequenceBatching``) and pyserve's ``SequenceBatcher``, both ways.

``sequence_batcher`` reads the message into the settings the core serves with, checking it as Triton does (one of
``int32_false_true`` / ``fp32_false_true`` / ``bool_false_true`` with two values for START, END and READY, a
``data_type`` and none of them for CORRID); an initial state's ``data_file`` is read from the model directory's
``initial_state/`` folder. ``normalize_sequence_batching`` fills in Triton's defaults; ``write_sequence_batching``
writes a ``SequenceBatcher`` declared in Python into a config (auto-complete of a pyserve-form ``model.py``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pyserve.config import ControlKind, SequenceBatcher, SequenceControl, SequenceState, SequenceStrategy
from pyserve.dtypes import config_type, datatype_of, deserialize_bytes, numpy_dtype
from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2 as pb
from pyserve.sequence_config import DEFAULT_IDLE_MICROSECONDS

# Where Triton reads an initial state's data_file from, inside the model directory.
INITIAL_STATE_FOLDER = "initial_state"

_Control = pb.ModelSequenceBatching.Control


def normalize_sequence_batching(config: pb.ModelConfig) -> None:
    """Fill Triton's defaults in place: an idle timeout of 1 s, and an ``oldest`` strategy without preferred batch
    sizes prefers ``max_batch_size``."""
    if not config.HasField("sequence_batching"):
        return
    settings = config.sequence_batching
    if not settings.max_sequence_idle_microseconds:
        settings.max_sequence_idle_microseconds = DEFAULT_IDLE_MICROSECONDS
    if settings.HasField("oldest") and not settings.oldest.preferred_batch_size and config.max_batch_size > 0:
        settings.oldest.preferred_batch_size.append(config.max_batch_size)


def sequence_batcher(settings: pb.ModelSequenceBatching, model_dir: Path) -> SequenceBatcher:
    """The settings a config's ``sequence_batching`` describes (ConfigError naming what is wrong)."""
    if settings.iterative_sequence:
        raise ConfigError("sequence_batching.iterative_sequence (Triton's iterative scheduling) is not supported")
    strategy: dict[str, Any]
    if settings.WhichOneof("strategy_choice") == "oldest":
        oldest = settings.oldest
        strategy = {
            "strategy": SequenceStrategy.OLDEST,
            "max_candidate_sequences": oldest.max_candidate_sequences,
            "preferred_batch_size": tuple(oldest.preferred_batch_size),
            "max_queue_delay_microseconds": oldest.max_queue_delay_microseconds,
            "preserve_ordering": oldest.preserve_ordering,
        }
    else:
        direct = settings.direct
        strategy = {
            "strategy": SequenceStrategy.DIRECT,
            "max_queue_delay_microseconds": direct.max_queue_delay_microseconds,
            # a float32 in the message: 0.1 would read 0.10000000149
            "minimum_slot_utilization": round(direct.minimum_slot_utilization, 6),
        }
    return SequenceBatcher(
        max_sequence_idle_microseconds=settings.max_sequence_idle_microseconds or DEFAULT_IDLE_MICROSECONDS,
        control_inputs=tuple(_control(control_input) for control_input in settings.control_input),
        states=tuple(_state(state, model_dir) for state in settings.state),
        **strategy,
    )


def _control(control_input: pb.ModelSequenceBatching.ControlInput) -> SequenceControl:
    name = control_input.name
    if not name:
        raise ConfigError("a sequence batching control tensor must have a name")
    if len(control_input.control) != 1:
        raise ConfigError(
            f"sequence batching control tensor '{name}' must have exactly one control, got {len(control_input.control)}"
        )
    control = control_input.control[0]
    kind = _Control.Kind.Name(control.kind)
    given = [
        (values, dtype)
        for values, dtype in (
            (control.int32_false_true, np.int32),
            (control.fp32_false_true, np.float32),
            (control.bool_false_true, np.bool_),
        )
        if len(values)
    ]
    if kind == ControlKind.CORRID.value:
        if given:
            raise ConfigError(
                f"sequence batching must not specify 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
                f"{kind} ('{name}')"
            )
        if control.data_type == pb.TYPE_INVALID:
            raise ConfigError(f"sequence batching control '{name}' ({kind}) needs a data_type")
        return SequenceControl(name, kind, datatype_of(pb.DataType.Name(control.data_type)))
    if len(given) != 1:
        which = "either" if not given else "only one of"
        raise ConfigError(
            f"sequence batching must specify {which} 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
            f"{kind} ('{name}')"
        )
    values, dtype = given[0]
    return SequenceControl(name, kind, dtype, tuple(values))


def _state(state: pb.ModelSequenceBatching.State, model_dir: Path) -> SequenceState:
    if state.data_type == pb.TYPE_INVALID:
        raise ConfigError(f"sequence batching state '{state.input_name}' has no data_type")
    datatype = datatype_of(pb.DataType.Name(state.data_type))
    if len(state.initial_state) > 1:
        raise ConfigError(f"sequence batching state '{state.input_name}' has more than one initial_state")
    initial = None
    if state.initial_state:
        initial = _initial_value(state.input_name, datatype, state.initial_state[0], model_dir)
    return SequenceState(state.input_name, state.output_name, datatype, tuple(state.dims), initial)


def _initial_value(
    name: str, datatype: str, initial: pb.ModelSequenceBatching.InitialState, model_dir: Path
) -> np.ndarray:
    label = f"initial_state of state '{name}'"
    if initial.data_type not in (pb.TYPE_INVALID, pb.DataType.Value(config_type(datatype))):
        raise ConfigError(f"{label}: data_type {pb.DataType.Name(initial.data_type)} differs from the state's")
    shape = tuple(int(d) for d in initial.dims)
    if any(d < 0 for d in shape):
        raise ConfigError(f"{label}: dims {list(shape)} must all be known (no -1)")
    choice = initial.WhichOneof("state_data")
    count = math.prod(shape)
    if choice == "zero_data":
        if datatype == "BYTES":
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=numpy_dtype(datatype))
    if choice != "data_file":
        raise ConfigError(f"{label}: set zero_data or data_file")
    path = model_dir / INITIAL_STATE_FOLDER / initial.data_file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read {INITIAL_STATE_FOLDER}/{initial.data_file}: {exc}") from None
    if datatype == "BYTES":
        return deserialize_bytes(data, count, name).reshape(shape)
    expected = count * numpy_dtype(datatype).itemsize
    if len(data) != expected:
        raise ConfigError(f"{label}: {initial.data_file} holds {len(data)} bytes, dims {list(shape)} need {expected}")
    return np.frombuffer(data, dtype=numpy_dtype(datatype)).reshape(shape).copy()


def write_sequence_batching(batcher: SequenceBatcher, settings: pb.ModelSequenceBatching) -> None:
    """Write ``batcher`` into a config's ``sequence_batching`` (an initial state must be zeros: Triton's config can
    only name other data by file)."""
    settings.SetInParent()
    settings.max_sequence_idle_microseconds = batcher.max_sequence_idle_microseconds
    if batcher.strategy is SequenceStrategy.OLDEST:
        oldest = settings.oldest
        oldest.SetInParent()
        oldest.max_candidate_sequences = batcher.max_candidate_sequences
        oldest.preferred_batch_size.extend(batcher.preferred_batch_size)
        oldest.max_queue_delay_microseconds = batcher.max_queue_delay_microseconds
        oldest.preserve_ordering = batcher.preserve_ordering
    else:
        direct = settings.direct
        direct.SetInParent()
        direct.max_queue_delay_microseconds = batcher.max_queue_delay_microseconds
        direct.minimum_slot_utilization = batcher.minimum_slot_utilization
    for control in batcher.control_inputs:
        written = settings.control_input.add(name=control.name).control.add()
        written.kind = _Control.Kind.Value(ControlKind(control.kind).value)
        if control.kind is ControlKind.CORRID:
            written.data_type = pb.DataType.Value(config_type(control.datatype))
        elif control.false_true is not None:
            field = {"INT32": "int32_false_true", "FP32": "fp32_false_true", "BOOL": "bool_false_true"}
            getattr(written, field[control.datatype]).extend(control.false_true)
    for state in batcher.states:
        written_state = settings.state.add(
            input_name=state.input_name,
            output_name=state.output_name,
            data_type=pb.DataType.Value(config_type(state.datatype)),
        )
        written_state.dims.extend(state.shape)
        value = state.initial_value
        if value is None:
            continue
        zero = all(len(item) == 0 for item in value.flat) if value.dtype == object else not value.any()
        if not zero:
            raise ConfigError(
                f"state '{state.input_name}': a non-zero initial_value cannot be written into a config; declare the "
                "model's sequence_batching in config.pbtxt with an initial_state data_file"
            )
        initial = written_state.initial_state.add(data_type=written_state.data_type, zero_data=True)
        initial.dims.extend(value.shape)
