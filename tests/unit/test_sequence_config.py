"""Sequence batching settings: ``SequenceBatcher`` and its parts, their checks, the wire form, config.pbtxt's
``sequence_batching`` read and written, and the config JSON a sequence model shows (Triton's shape)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyserve.config import (
    ControlKind,
    DynamicBatcher,
    ModelConfig,
    ModelSpec,
    SequenceBatcher,
    SequenceControl,
    SequenceState,
    SequenceStrategy,
    Tensor,
)
from pyserve.core.model_documents import model_config_json
from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2 as pb
from pyserve.repository.config_document import config_json, parse_config_text, unused_fields
from pyserve.repository.sequence_batching import (
    normalize_sequence_batching,
    sequence_batcher,
    write_sequence_batching,
)

INPUTS = (Tensor("INPUT", np.int32, (1,)),)
OUTPUTS = (Tensor("OUTPUT", np.int32, (1,)),)

# Triton's simple_dyna_sequence example model, as its config.pbtxt declares it.
DYNA_SEQUENCE = """
name: "simple_dyna_sequence"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 10000000
  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


# SequenceBatcher -------------------------------------------------------------------------------------------------


def test_the_defaults_are_tritons() -> None:
    batcher = SequenceBatcher()
    assert batcher.strategy is SequenceStrategy.DIRECT
    assert batcher.max_sequence_idle_microseconds == 1_000_000
    assert batcher.max_backlog_sequences is None
    assert batcher.slots_per_instance(8) == 8
    assert batcher.slots_per_instance(0) == 1
    assert SequenceBatcher(strategy="OLDEST", max_candidate_sequences=100).slots_per_instance(8) == 100


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"strategy": "newest"}, "strategy must be 'direct' or 'oldest'"),
        ({"max_sequence_idle_microseconds": 0}, "must be > 0"),
        ({"minimum_slot_utilization": 1.5}, r"must be in \[0.0, 1.0\]"),
        ({"preferred_batch_size": (4,)}, "preferred_batch_size do\\(es\\) not apply to strategy 'direct'"),
        ({"strategy": "oldest", "minimum_slot_utilization": 0.5}, "minimum_slot_utilization do"),
        ({"strategy": "oldest", "preferred_batch_size": (0,)}, "must be positive"),
        ({"max_backlog_sequences": -1}, "max_backlog_sequences must be >= 0"),
        ({"control_inputs": ("START",)}, "must hold SequenceControl objects"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SequenceBatcher(**settings)


def test_controls_take_tritons_kinds_and_data_types() -> None:
    start = SequenceControl("START", "CONTROL_SEQUENCE_START")
    assert (start.kind, start.datatype, start.false_true) == (ControlKind.START, "INT32", (0, 1))
    ready = SequenceControl("READY", "ready", np.float32, (0, 1))
    assert (ready.datatype, ready.false_true) == ("FP32", (0.0, 1.0))
    end = SequenceControl("END", ControlKind.END, bool)
    assert (end.datatype, end.false_true) == ("BOOL", (False, True))
    corrid = SequenceControl("CORRID", "CORRID")
    assert (corrid.datatype, corrid.false_true) == ("UINT64", None)
    assert SequenceControl("ID", "CORRID", bytes).datatype == "BYTES"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("S", "BEGIN"), "control kind must be one of START, READY, END, CORRID"),
        (("S", "START", np.int64), "must be INT32, FP32 or BOOL, got INT64"),
        (("S", "START", np.int32, (0, 1, 2)), "exactly 2 values"),
        (("C", "CORRID", np.float32), "must be one of UINT64, INT64, UINT32, INT32, BYTES, got FP32"),
        (("C", "CORRID", np.uint64, (0, 1)), "false_true is for START, END and READY"),
        (("", "START"), "needs a name"),
    ],
)
def test_bad_controls_are_refused(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SequenceControl(*args)


def test_one_control_per_kind_and_one_kind_per_name() -> None:
    with pytest.raises(ConfigError, match="CONTROL_SEQUENCE_START is given twice"):
        SequenceBatcher(control_inputs=(SequenceControl("A", "START"), SequenceControl("B", "START")))
    with pytest.raises(ConfigError, match="'A' is given for several kinds"):
        SequenceBatcher(control_inputs=(SequenceControl("A", "START"), SequenceControl("A", "END")))
    with pytest.raises(ConfigError, match="input name 'A' is used twice"):
        SequenceBatcher(
            control_inputs=(SequenceControl("A", "START"),), states=(SequenceState("A", "B", np.float32, (2,)),)
        )


def test_a_state_starts_from_zeros_or_its_initial_value() -> None:
    zeros = SequenceState("IN", "OUT", np.float32, (2, 3))
    assert zeros.initial().shape == (2, 3) and zeros.initial().dtype == np.float32 and not zeros.initial().any()
    grows = SequenceState("IN", "OUT", np.int64, (-1,))
    assert grows.initial().shape == (0,)
    given = SequenceState("IN", "OUT", np.int32, (3,), initial_value=7)
    assert given.initial().tolist() == [7, 7, 7]
    given.initial()[0] = 1  # a copy each time
    assert given.initial().tolist() == [7, 7, 7]
    words = SequenceState("IN", "OUT", bytes, (2,), initial_value=["a", b"b"])
    assert words.initial().tolist() == [b"a", b"b"]
    assert SequenceState("IN", "OUT", bytes, (1,)).initial().tolist() == [b""]
    with pytest.raises(ConfigError, match=r"initial_value of shape \(2,\) does not fit shape \(3,\)"):
        SequenceState("IN", "OUT", np.int32, (3,), initial_value=[1, 2])
    with pytest.raises(ConfigError, match="dtype is required"):
        SequenceState("IN", "OUT")


def test_model_config_takes_a_sequence_batcher_in_place_of_the_dynamic_batcher() -> None:
    config = ModelConfig(max_batch_size=8, sequence_batcher=SequenceBatcher())
    assert config.batcher is None and not config.dynamic_batching
    with pytest.raises(ConfigError, match="one scheduler"):
        ModelConfig(
            max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=5), sequence_batcher=SequenceBatcher()
        )
    with pytest.raises(ConfigError, match="response_cache cannot be used with sequence_batcher"):
        ModelConfig(max_batch_size=8, response_cache=True, sequence_batcher=SequenceBatcher())
    with pytest.raises(ConfigError, match="must be a SequenceBatcher"):
        ModelConfig(sequence_batcher="direct")  # type: ignore[arg-type]


def test_a_spec_checks_the_sequence_tensors_against_its_own() -> None:
    def spec(batcher: SequenceBatcher, max_batch_size: int = 8) -> ModelSpec:
        config = ModelConfig(max_batch_size=max_batch_size, sequence_batcher=batcher)
        return ModelSpec("m", 1, INPUTS, OUTPUTS, config)

    with pytest.raises(ConfigError, match="'INPUT' is a sequence control or state input"):
        spec(SequenceBatcher(control_inputs=(SequenceControl("INPUT", "START"),)))
    with pytest.raises(ConfigError, match="'OUTPUT' is a sequence state output"):
        spec(SequenceBatcher(states=(SequenceState("S", "OUTPUT", np.int32, (1,)),)))
    with pytest.raises(ConfigError, match=r"preferred_batch_size \[16\] exceeds max_batch_size"):
        spec(SequenceBatcher(strategy="oldest", preferred_batch_size=(16,)))


def test_the_wire_form_round_trips() -> None:
    batcher = SequenceBatcher(
        strategy="oldest",
        max_sequence_idle_microseconds=5000,
        control_inputs=(
            SequenceControl("START", "START", np.float32, (0.5, 2.0)),
            SequenceControl("CORRID", "CORRID", bytes),
        ),
        states=(
            SequenceState("S", "S_OUT", np.float32, (2,), initial_value=[1.5, 2.5]),
            SequenceState("W", "W_OUT", bytes, (-1,), initial_value=[b"x", b"yz"]),
            SequenceState("Z", "Z_OUT", np.int8, (3,)),
        ),
        max_candidate_sequences=64,
        preferred_batch_size=(4, 8),
        max_queue_delay_microseconds=100,
        preserve_ordering=True,
        max_backlog_sequences=3,
    )
    spec = ModelSpec("m", 1, INPUTS, OUTPUTS, ModelConfig(max_batch_size=8, sequence_batcher=batcher))
    again = ModelSpec.from_wire(spec.to_wire())
    assert again == spec
    states = again.config.sequence_batcher.states  # type: ignore[union-attr]
    assert states[0].initial().tolist() == [1.5, 2.5]
    assert states[1].initial().tolist() == [b"x", b"yz"]
    assert states[2].initial_value is None


# config.pbtxt ----------------------------------------------------------------------------------------------------


def test_tritons_example_config_reads_into_a_sequence_batcher(tmp_path: Path) -> None:
    config = parse_config_text(DYNA_SEQUENCE, "simple_dyna_sequence")
    batcher = sequence_batcher(config.sequence_batching, tmp_path)
    assert batcher.strategy is SequenceStrategy.OLDEST
    assert (batcher.max_candidate_sequences, batcher.max_queue_delay_microseconds) == (1024, 10000)
    assert batcher.max_sequence_idle_microseconds == 10_000_000
    assert [(c.name, ControlKind(c.kind).name, c.datatype) for c in batcher.control_inputs] == [
        ("START", "START", "INT32"),
        ("END", "END", "INT32"),
        ("READY", "READY", "INT32"),
        ("CORRID", "CORRID", "UINT64"),
    ]
    assert unused_fields(config) == []


def test_an_initial_state_comes_from_zeros_or_a_data_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "start.bin").write_bytes(np.array([1, 2, 3], np.float32).tobytes())
    text = """
    sequence_batching {
      state [
        { input_name: "A" output_name: "A_OUT" data_type: TYPE_FP32 dims: [ 3 ]
          initial_state: { data_type: TYPE_FP32 dims: [ 3 ] data_file: "start.bin" name: "from a file" } },
        { input_name: "B" output_name: "B_OUT" data_type: TYPE_INT32 dims: [ -1 ]
          initial_state: { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: "zeros" } }
      ]
    }
    """
    batcher = sequence_batcher(parse_config_text(text, "m").sequence_batching, tmp_path)
    first, second = batcher.states
    assert first.initial().tolist() == [1.0, 2.0, 3.0]
    assert second.initial().tolist() == [0, 0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('control_input { name: "S" control { kind: CONTROL_SEQUENCE_START } }', "must specify either"),
        (
            'control_input { name: "S" control { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] '
            "fp32_false_true: [0, 1] } }",
            "must specify only one of",
        ),
        (
            'control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 '
            "int32_false_true: [0, 1] } }",
            "must not specify",
        ),
        ('control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID } }', "needs a data_type"),
        ("control_input { control { kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] } }", "must have a name"),
        ("iterative_sequence: true", "iterative_sequence"),
        (
            'state { input_name: "A" output_name: "B" data_type: TYPE_FP32 dims: [1] '
            'initial_state { data_type: TYPE_FP32 dims: [1] data_file: "missing.bin" } }',
            "cannot read initial_state/missing.bin",
        ),
        ("direct { minimum_slot_utilization: 2 }", r"must be in \[0.0, 1.0\]"),
    ],
)
def test_a_wrong_sequence_batching_is_refused(tmp_path: Path, text: str, message: str) -> None:
    config = parse_config_text(f"sequence_batching {{ {text} }}", "m")
    with pytest.raises(ConfigError, match=message):
        sequence_batcher(config.sequence_batching, tmp_path)


def test_tritons_defaults_are_filled_in() -> None:
    config = parse_config_text("max_batch_size: 4 sequence_batching { oldest { } }", "m")
    normalize_sequence_batching(config)
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(config.sequence_batching.oldest.preferred_batch_size) == [4]


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
def test_a_bound_model_shows_its_sequence_batching_as_triton_does(strategy: str) -> None:
    # The config JSON of a bound model (model_documents) matches Triton's JSON form of the same config.pbtxt
    # (config_document.config_json): the same fields, in the same order, with the same defaults.
    options: dict[str, Any] = {"strategy": strategy, "max_queue_delay_microseconds": 100}
    if strategy == "direct":
        options["minimum_slot_utilization"] = 0.5
    batcher = SequenceBatcher(
        control_inputs=(
            SequenceControl("START", "START"),
            SequenceControl("READY", "READY", np.float32, (0.0, 1.0)),
            SequenceControl("END", "END", bool),
            SequenceControl("CORRID", "CORRID", bytes),
        ),
        states=(SequenceState("S_IN", "S_OUT", np.float32, (2,), initial_value=np.zeros(2, np.float32)),),
        **options,
    )
    spec = ModelSpec("m", 1, INPUTS, OUTPUTS, ModelConfig(max_batch_size=8, sequence_batcher=batcher))
    shown = model_config_json(spec)
    config = pb.ModelConfig(max_batch_size=8)
    write_sequence_batching(batcher, config.sequence_batching)
    normalize_sequence_batching(config)
    assert shown["sequence_batching"] == config_json(config)["sequence_batching"]
    assert list(shown)[list(shown).index("optimization") + 1] == "sequence_batching"
    assert "dynamic_batching" not in shown


def test_a_non_zero_initial_value_cannot_be_written_into_a_config() -> None:
    batcher = SequenceBatcher(states=(SequenceState("S", "O", np.int32, (1,), initial_value=3),))
    with pytest.raises(ConfigError, match="non-zero initial_value cannot be written"):
        write_sequence_batching(batcher, pb.ModelConfig().sequence_batching)


SEQUENCE_MODEL_PY = """
import numpy as np
from pyserve import ModelConfig, SequenceBatcher, SequenceControl, SequenceState, Tensor

inputs = [Tensor("INPUT", np.int32, (1,))]
outputs = [Tensor("OUTPUT", np.int32, (1,))]
config = ModelConfig(
    max_batch_size=4,
    sequence_batcher=SequenceBatcher(
        strategy="oldest",
        control_inputs=(SequenceControl("START", "START"),),
        states=(SequenceState("ACC", "ACC_OUT", np.int32, (1,), initial_value=0),),
    ),
)

def infer_func(requests):
    return [{"OUTPUT": r["INPUT"] + r["ACC"], "ACC_OUT": r["INPUT"] + r["ACC"]} for r in requests]
"""


def test_a_model_py_declaring_a_sequence_batcher_completes_the_config(tmp_path: Path) -> None:
    pytest.importorskip("pyserve.backends.python_loader", reason="the Python backend reads what a model.py declares")
    from pyserve.repository.model_config import read_model

    (tmp_path / "seq" / "1").mkdir(parents=True)
    (tmp_path / "seq" / "1" / "model.py").write_text(SEQUENCE_MODEL_PY)
    definition = read_model(tmp_path / "seq")
    batcher = definition.specs[1].config.sequence_batcher
    assert batcher is not None and batcher.strategy is SequenceStrategy.OLDEST
    assert [c.name for c in batcher.control_inputs] == ["START"]
    assert batcher.states[0].initial().tolist() == [0]
    shown = definition.config_json["sequence_batching"]
    assert shown["oldest"]["preferred_batch_size"] == [4]
    assert shown["state"][0]["initial_state"][0]["zero_data"] is True
