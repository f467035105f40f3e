"""An instance's side of sequence batching (``ModelConfig.sequence_batcher``): what it keeps for each sequence.

The core sends a stateful model's batches with each request's place in its sequence (``InferBatch.sequences``:
correlation ID, START / END flags, slot). Before the function runs, ``SequenceStates.prepare`` gives each request
its ``Request.sequence`` (a ``SequenceContext`` holding what the function kept for the sequence), the control
inputs the model asks for (START, END, READY, CORRID) and its implicit state tensors (``SequenceState``: the state
the function returned with the sequence's previous request, or the initial one). ``collect`` takes the new states
out of what the function returned (they never travel to the core), and ``finish`` keeps them once the batch is
done — unless the function raised, which leaves every state as it was. A sequence's state goes when it ends, when
it starts again, or when the core says it released it (``InferBatch.released_sequences``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyserve.config import ControlKind, ModelSpec, SequenceState
from pyserve.dtypes import as_bytes_array
from pyserve.errors import OutputMismatchError
from pyserve.request import RequestBatch, SequenceContext
from pyserve.transport.protocol import SEQUENCE_END, SEQUENCE_START, SequenceEntry

CorrelationId = int | str


class SequenceStates:
    """The sequences of one instance of a stateful model: their implicit state tensors and the values their
    function keeps (``SequenceContext.state``)."""

    def __init__(self, spec: ModelSpec) -> None:
        settings = spec.config.sequence_batcher
        if settings is None:
            raise ValueError(f"model '{spec.name}' has no sequence_batcher")
        self._model = spec.name
        self._batching = spec.config.max_batch_size > 0
        self._controls = settings.control_inputs
        self._states: tuple[SequenceState, ...] = settings.states
        self._tensors: dict[CorrelationId, dict[str, np.ndarray]] = {}
        self._values: dict[CorrelationId, Any] = {}
        self._updates: dict[CorrelationId, dict[str, np.ndarray]] = {}
        self._collected = False

    def __len__(self) -> int:
        """How many sequences hold something here."""
        return len(self._tensors.keys() | self._values.keys())

    def prepare(self, batch: RequestBatch, entries: list[SequenceEntry] | None, released: list[Any]) -> None:
        """Drop the ``released`` sequences, then give each request of ``batch`` its sequence context, control
        inputs and state inputs."""
        for correlation_id in released:
            self._drop(correlation_id)
        self._collected = False
        self._updates = {}
        if entries is None:
            return
        contexts: list[SequenceContext] = []
        for request, (correlation_id, flags, slot) in zip(batch, entries, strict=True):
            start = bool(flags & SEQUENCE_START)
            if start:
                self._drop(correlation_id)
            context = SequenceContext(
                correlation_id, start, bool(flags & SEQUENCE_END), slot, self._values.get(correlation_id)
            )
            request.sequence = context
            contexts.append(context)
        added: dict[str, list[np.ndarray]] = {}
        for control in self._controls:
            added[control.name] = self._control_values(
                ControlKind(control.kind), control.dtype, control.false_true, contexts
            )
        for state in self._states:
            added[state.input_name] = [self._state_of(state, context) for context in contexts]
        for name, arrays in added.items():
            for request, array in zip(batch, arrays, strict=True):
                request.data[name] = array
        if batch.merged is not None and added:
            try:
                batch.merged.update({name: np.concatenate(arrays) for name, arrays in added.items()})
            except ValueError:  # states of different shapes: @batch concatenates (or reports) what it can
                batch.merged = None

    def collect(self, batch: RequestBatch, result: Any) -> Any:
        """Take the state outputs out of what the function returned for ``batch`` (kept by ``finish``); returns the
        rest, for the output encoder."""
        self._collected = True
        if not self._states:
            return result
        per_request = [result] if isinstance(result, dict) and len(batch) == 1 else result
        if not isinstance(per_request, (list, tuple)) or len(per_request) != len(batch):
            return result  # the output encoder says what is wrong with it
        kept: list[Any] = []
        for request, outputs in zip(batch, per_request, strict=True):
            if isinstance(outputs, dict) and request.sequence is not None:
                outputs = dict(outputs)
                for state in self._states:
                    value = outputs.pop(state.output_name, None)
                    if value is not None:
                        updates = self._updates.setdefault(request.sequence.correlation_id, {})
                        updates[state.input_name] = self._checked_state(state, value)
            kept.append(outputs)
        return kept

    def finish(self, batch: RequestBatch) -> None:
        """The batch is done: keep what its requests left for their sequences (unless the function raised before
        returning), and forget the sequences that ended."""
        for request in batch:
            context = request.sequence
            if context is None:
                continue
            correlation_id = context.correlation_id
            if self._collected:
                updates = self._updates.get(correlation_id)
                if updates:
                    self._tensors.setdefault(correlation_id, {}).update(updates)
                if context.state is None:
                    self._values.pop(correlation_id, None)
                else:
                    self._values[correlation_id] = context.state
            if context.end:
                self._drop(correlation_id)
        self._updates = {}
        self._collected = False

    # inputs ------------------------------------------------------------------------------------------------------

    def _control_values(
        self, kind: ControlKind, dtype: np.dtype[Any], false_true: Any, contexts: list[SequenceContext]
    ) -> list[np.ndarray]:
        """One [1] (batching: [1, 1]) array per request, views of one block."""
        if kind is ControlKind.CORRID:
            if dtype.kind == "O":
                values: list[Any] = [str(c.correlation_id).encode() for c in contexts]
            else:
                values = [c.correlation_id for c in contexts]
        elif kind is ControlKind.READY:
            values = [false_true[1]] * len(contexts)
        else:
            flag = "start" if kind is ControlKind.START else "end"
            values = [false_true[1] if getattr(c, flag) else false_true[0] for c in contexts]
        block = np.array(values, dtype=dtype).reshape(len(contexts), 1)
        if self._batching:
            return [block[index : index + 1] for index in range(len(contexts))]
        return [block[index] for index in range(len(contexts))]

    def _state_of(self, state: SequenceState, context: SequenceContext) -> np.ndarray:
        kept = self._tensors.get(context.correlation_id)
        value = kept.get(state.input_name) if kept is not None else None
        if value is None:
            value = state.initial()
            if self._batching:
                value = value[np.newaxis]
        return value

    def _checked_state(self, state: SequenceState, value: Any) -> np.ndarray:
        """A returned state as an array of the state's dtype and shape (batch dimension added where left out), a copy
        the instance owns."""
        if state.datatype == "BYTES":
            array = as_bytes_array(np.array(value, dtype=object, copy=True))
        else:
            try:
                array = np.array(value, dtype=state.dtype, copy=True)
            except (TypeError, ValueError) as exc:
                raise OutputMismatchError(
                    f"model '{self._model}' state output '{state.output_name}': cannot convert to {state.datatype}: "
                    f"{exc}"
                ) from exc
        dims = state.shape
        if self._batching and array.ndim == len(dims):
            array = array[np.newaxis]
        shape = array.shape[1:] if self._batching else array.shape
        if len(shape) != len(dims) or any(d not in (-1, s) for d, s in zip(dims, shape, strict=True)):
            want = ([1] if self._batching else []) + list(dims)
            raise OutputMismatchError(
                f"model '{self._model}' state output '{state.output_name}': expected shape {want}, got "
                f"{list(array.shape)}"
            )
        return array

    def _drop(self, correlation_id: CorrelationId) -> None:
        self._tensors.pop(correlation_id, None)
        self._values.pop(correlation_id, None)
