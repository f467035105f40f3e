"""The instance's side of sequence batching (pyserve.worker.sequence_state): control inputs, implicit state kept per
sequence, and ``@sequence``, which keeps a Python value per sequence on the same machinery."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyserve import (
    ModelConfig,
    Request,
    RequestBatch,
    SequenceBatcher,
    SequenceControl,
    SequenceState,
    Tensor,
    sequence,
)
from pyserve.config import ModelSpec
from pyserve.errors import ConfigError, OutputMismatchError
from pyserve.transport.protocol import SEQUENCE_END, SEQUENCE_START, InferBatch
from pyserve.worker.sequence_state import SequenceStates

START, END = SEQUENCE_START, SEQUENCE_END


def spec(max_batch_size: int = 8, **settings: Any) -> ModelSpec:
    config = ModelConfig(max_batch_size=max_batch_size, sequence_batcher=SequenceBatcher(**settings))
    return ModelSpec("acc", 1, (Tensor("INPUT", np.int32, (1,)),), (Tensor("OUTPUT", np.int32, (1,)),), config)


def batch_of(*values: int, batching: bool = True, merged: bool = True) -> RequestBatch:
    """A batch of requests of one row each, laid out as the instance decodes them (views of one merged block)."""
    block = np.array(values, np.int32).reshape(len(values), 1)
    requests = RequestBatch(Request({"INPUT": block[i : i + 1] if batching else block[i]}) for i in range(len(values)))
    if merged and batching:
        requests.merged = {"INPUT": block}
    return requests


def accumulate(requests: RequestBatch) -> list[dict[str, np.ndarray]]:
    """A running sum in implicit state: STATE_IN + INPUT, returned as OUTPUT and as the new STATE_OUT."""
    return [{"OUTPUT": r["STATE_IN"] + r["INPUT"], "STATE_OUT": r["STATE_IN"] + r["INPUT"]} for r in requests]


def run(states: SequenceStates, entries: list[list[Any]], values: list[int], released: list[Any] | None = None) -> Any:
    """One batch through the instance's hooks, as InstanceRunner calls them."""
    batch = batch_of(*values)
    states.prepare(batch, entries, released or [])
    result = states.collect(batch, accumulate(batch))
    states.finish(batch)
    return [int(outputs["OUTPUT"][0, 0]) for outputs in result], result


def test_control_inputs_carry_start_end_ready_and_the_correlation_id() -> None:
    controls = (
        SequenceControl("START", "START"),
        SequenceControl("END", "END", np.float32, (-1.0, 2.0)),
        SequenceControl("READY", "READY", bool),
        SequenceControl("CORRID", "CORRID"),
    )
    states = SequenceStates(spec(control_inputs=controls))
    batch = batch_of(1, 2, 3)
    states.prepare(batch, [[7, START, 0], [8, END, 1], [9, START | END, 2]], [])
    assert [r["START"].tolist() for r in batch] == [[[1]], [[0]], [[1]]]
    assert batch[0]["START"].dtype == np.int32
    assert [r["END"].tolist() for r in batch] == [[[-1.0]], [[2.0]], [[2.0]]]
    assert [r["READY"].tolist() for r in batch] == [[[True]]] * 3
    assert batch[0]["CORRID"].dtype == np.uint64 and batch[1]["CORRID"].tolist() == [[8]]
    assert batch.merged is not None and batch.merged["START"].tolist() == [[1], [0], [1]]
    assert [(r.sequence.correlation_id, r.sequence.start, r.sequence.end, r.sequence.slot) for r in batch] == [
        (7, True, False, 0),
        (8, False, True, 1),
        (9, True, True, 2),
    ]


def test_a_string_corrid_control_gets_the_ids_as_bytes_and_a_model_without_batching_gets_shape_1() -> None:
    states = SequenceStates(spec(max_batch_size=0, control_inputs=(SequenceControl("ID", "CORRID", bytes),)))
    batch = batch_of(1, batching=False)
    states.prepare(batch, [[1002, START, 0]], [])
    assert batch[0]["ID"].shape == (1,) and batch[0]["ID"].tolist() == [b"1002"]


def test_implicit_state_runs_from_zeros_and_stays_in_the_instance() -> None:
    states = SequenceStates(spec(states=(SequenceState("STATE_IN", "STATE_OUT", np.int32, (1,)),)))
    sums, result = run(states, [[1, START, 0], [2, START, 1]], [5, 100])
    assert sums == [5, 100]
    assert all("STATE_OUT" not in outputs for outputs in result)  # never sent to the core
    assert run(states, [[1, 0, 0], [2, END, 1]], [6, 1])[0] == [11, 101]
    assert len(states) == 1  # sequence 2 ended
    assert run(states, [[1, END, 0]], [1])[0] == [12]
    assert len(states) == 0


def test_a_start_begins_again_from_the_initial_state() -> None:
    states = SequenceStates(spec(states=(SequenceState("STATE_IN", "STATE_OUT", np.int32, (1,), initial_value=10),)))
    assert run(states, [[1, START, 0]], [1])[0] == [11]
    assert run(states, [[1, 0, 0]], [1])[0] == [12]
    assert run(states, [[1, START, 0]], [1])[0] == [11]


def test_a_released_sequence_loses_its_state() -> None:
    states = SequenceStates(spec(states=(SequenceState("STATE_IN", "STATE_OUT", np.int32, (1,)),)))
    run(states, [[1, START, 0]], [3])
    assert run(states, [[2, START, 0]], [4], released=[1])[0] == [4]
    assert len(states) == 1


def test_a_failed_batch_leaves_the_state_as_it_was() -> None:
    states = SequenceStates(spec(states=(SequenceState("STATE_IN", "STATE_OUT", np.int32, (1,)),)))
    run(states, [[1, START, 0]], [3])
    batch = batch_of(4)
    states.prepare(batch, [[1, 0, 0]], [])
    states.finish(batch)  # the function raised: nothing collected
    assert run(states, [[1, 0, 0]], [1])[0] == [4]


def test_a_state_output_left_out_keeps_the_state() -> None:
    states = SequenceStates(spec(states=(SequenceState("STATE_IN", "STATE_OUT", np.int32, (1,)),)))
    run(states, [[1, START, 0]], [3])
    batch = batch_of(4)
    states.prepare(batch, [[1, 0, 0]], [])
    kept = states.collect(batch, [{"OUTPUT": batch[0]["INPUT"]}])
    states.finish(batch)
    assert kept == [{"OUTPUT": batch[0]["INPUT"]}]
    assert run(states, [[1, 0, 0]], [1])[0] == [4]


def test_a_state_of_the_wrong_shape_fails_the_batch() -> None:
    states = SequenceStates(spec(states=(SequenceState("STATE_IN", "STATE_OUT", np.int32, (2,)),)))
    batch = batch_of(1)
    states.prepare(batch, [[1, START, 0]], [])
    assert batch[0]["STATE_IN"].shape == (1, 2)
    with pytest.raises(OutputMismatchError, match=r"state output 'STATE_OUT': expected shape \[1, 2\], got \[1, 3\]"):
        states.collect(batch, [{"OUTPUT": batch[0]["INPUT"], "STATE_OUT": np.zeros((1, 3))}])


def test_the_infer_batch_carries_the_sequences_and_the_released_ones() -> None:
    header = InferBatch.build(3, [["r", {}, [], 1]], [["x", "INT32", [1, 1], 0, -1]], None, [[5, START, 2]], ["old"])
    message = InferBatch(header)
    assert (message.sequences, message.released_sequences) == ([[5, START, 2]], ["old"])
    plain = InferBatch(InferBatch.build(3, [["r", {}, [], 1]], []))
    assert (plain.sequences, plain.released_sequences) == (None, [])
    assert "sq" not in InferBatch.build(3, [], []) and "sr" not in InferBatch.build(3, [], [], None, [], [])


# @sequence -------------------------------------------------------------------------------------------------------


def prepared(states: SequenceStates, entries: list[list[Any]], values: list[int]) -> RequestBatch:
    batch = batch_of(*values)
    states.prepare(batch, entries, [])
    return batch


def test_sequence_hands_each_request_its_sequences_state() -> None:
    @sequence
    def running_sum(inputs: dict[str, np.ndarray], total: Any) -> tuple[dict[str, np.ndarray], Any]:
        total = inputs["INPUT"] if total is None else total + inputs["INPUT"]
        return {"OUTPUT": total}, total

    states = SequenceStates(spec())
    for entries, values, expected in (
        ([[1, START, 0], [2, START, 1]], [5, 100], [5, 100]),
        ([[1, 0, 0], [2, END, 1]], [6, 1], [11, 101]),
        ([[1, 0, 0], [2, START, 1]], [1, 7], [12, 7]),
    ):
        batch = prepared(states, entries, values)
        result = running_sum(batch)
        states.collect(batch, result)
        states.finish(batch)
        assert [int(outputs["OUTPUT"][0, 0]) for outputs in result] == expected


def test_sequence_batched_gets_one_row_and_one_state_per_sequence() -> None:
    calls: list[tuple[list[int], list[Any]]] = []

    @sequence(batched=True, initial_state=lambda: np.zeros(1, np.int64))
    def running_sums(inputs: dict[str, np.ndarray], totals: list[np.ndarray]) -> tuple[dict[str, Any], list[Any]]:
        calls.append((inputs["INPUT"][:, 0].tolist(), [int(t[0]) for t in totals]))
        new = [total + row for total, row in zip(totals, inputs["INPUT"], strict=True)]
        return {"OUTPUT": np.stack(new)}, new

    states = SequenceStates(spec())
    for entries, values in (([[1, START, 0], [2, START, 1]], [5, 100]), ([[1, 0, 0], [2, 0, 1]], [6, 1])):
        batch = prepared(states, entries, values)
        result = running_sums(batch)
        states.collect(batch, result)
        states.finish(batch)
    assert calls == [([5, 100], [0, 0]), ([6, 1], [5, 100])]
    assert [int(outputs["OUTPUT"][0, 0]) for outputs in result] == [11, 101]


def test_sequence_copies_a_plain_initial_state_for_each_sequence() -> None:
    @sequence(initial_state={"seen": []})
    def remember(inputs: dict[str, np.ndarray], state: dict[str, list[int]]) -> tuple[dict[str, Any], Any]:
        state["seen"].append(int(inputs["INPUT"][0, 0]))
        return {"OUTPUT": np.array([[len(state["seen"])]], np.int32)}, state

    states = SequenceStates(spec())
    batch = prepared(states, [[1, START, 0], [2, START, 1]], [1, 2])
    assert [int(o["OUTPUT"][0, 0]) for o in remember(batch)] == [1, 1]


def test_sequence_needs_a_stateful_model_and_an_outputs_state_pair() -> None:
    @sequence
    def echo(inputs: dict[str, np.ndarray], state: Any) -> Any:
        return {"OUTPUT": inputs["INPUT"]}

    with pytest.raises(ConfigError, match="@sequence needs a stateful model"):
        echo(batch_of(1))
    states = SequenceStates(spec())
    with pytest.raises(OutputMismatchError, match=r"must return \(outputs, state\), got dict"):
        echo(prepared(states, [[1, START, 0]], [1]))

    @sequence(batched=True)
    def short(inputs: dict[str, np.ndarray], states: list[Any]) -> Any:
        return {"OUTPUT": inputs["INPUT"]}, []

    with pytest.raises(OutputMismatchError, match=r"one state per sequence of the batch \(1\), got list of length 0"):
        short(prepared(states, [[1, START, 0]], [1]))
