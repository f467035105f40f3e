"""Tests of pyserve.transport.protocol: every message kind survives the wire and reads back by name, the per-batch
messages keep their short keys, and no module but the protocol builds or reads a message by hand."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import pyserve
from pyserve import ModelConfig, Tensor
from pyserve.config import ModelSpec
from pyserve.errors import DeadlockError, ModelExecutionError
from pyserve.transport import protocol
from pyserve.transport.messages import pack_header, unpack_header
from pyserve.transport.protocol import (
    MERGED,
    BatchResult,
    BlsCancel,
    BlsFree,
    BlsRequest,
    BlsResponse,
    Bye,
    CancelNotice,
    ControlReply,
    FreeSlots,
    Header,
    Hello,
    InferBatch,
    Load,
    LoadEnsemble,
    Message,
    MessageKind,
    OpenRemote,
    Ping,
    Refused,
    Serving,
    Shutdown,
    Stop,
    TraceContext,
    Unload,
    Welcome,
    kind_of,
)

PACKAGE_DIR = Path(pyserve.__file__).resolve().parent
SPEC = ModelSpec("m", 2, (Tensor("x", np.float32, (-1,)),), (Tensor("y", np.float32, (-1,)),), ModelConfig(8))


def wire(header: Header) -> Header:
    """A message as its receiver decodes it."""
    return unpack_header(pack_header(header))


# every kind, there and back ---------------------------------------------------------------------------------------


def test_an_instance_joins_with_hello_and_is_welcomed_or_refused() -> None:
    hello = Hello(wire(Hello.build("m", 2, 1, "process", 4242, "pyserve-s-0")))
    assert (hello.model, hello.version, hello.instance_index, hello.instance_kind, hello.pid, hello.shm_prefix) == (
        "m",
        2,
        1,
        "process",
        4242,
        "pyserve-s-0",
    )
    assert Welcome(wire(Welcome.build("ipc:///tmp/x/cancel.sock"))).cancel_address == "ipc:///tmp/x/cancel.sock"
    assert Welcome(wire(Welcome.build(""))).cancel_address == ""
    assert Refused(wire(Refused.build("model 'm' is not loaded"))).message == "model 'm' is not loaded"
    assert kind_of(wire(Stop.build())) == MessageKind.STOP
    assert kind_of(wire(Bye.build())) == MessageKind.BYE


def test_an_infer_batch_reads_back_with_its_requests_blocks_and_trace() -> None:
    requests = [["r1", {"k": 1}, ["y"], 2], ["r2", {}, [], 1]]
    blocks = [["x", "FP32", [3, 4], 0, MERGED], ["z", "BYTES", [1], ["seg-1", 12], 1]]
    batch = InferBatch(wire(InferBatch.build(7, requests, blocks)))
    assert (batch.batch_id, batch.requests, batch.blocks, batch.trace) == (7, requests, blocks, None)
    trace = TraceContext("/tmp/trace.jsonl", ["00-" + "1" * 32 + "-" + "2" * 16 + "-01", None])
    assert InferBatch(wire(InferBatch.build(7, requests, blocks, trace))).trace == trace


def test_a_batch_result_reads_back_in_each_of_its_forms() -> None:
    outputs = [[["y", "FP32", [1, 4], 0]], [["y", "FP32", [1, 4], ["seg-2", 16]]]]
    final = BatchResult(wire(BatchResult.build_final(7, outputs, ["seg-2"], [10, 20, 30])))
    assert (final.batch_id, final.final, final.outputs, final.slots, final.timings) == (
        7,
        True,
        outputs,
        ["seg-2"],
        [10, 20, 30],
    )
    assert final.error is None and final.response_timings is None and final.stage_times is None
    # With the stage-times switch on, the instance's stamps travel in the final result.
    stamped = BatchResult(wire(BatchResult.build_final(7, outputs, ["seg-2"], [10, 20, 30], [1, 2, 3, 4])))
    assert stamped.stage_times == [1, 2, 3, 4] and stamped.outputs == outputs

    response = BatchResult(wire(BatchResult.build_response(7, [outputs[0], None], [], [5, 6])))
    assert (response.final, response.outputs, response.slots, response.response_timings) == (
        False,
        [outputs[0], None],
        [],
        [5, 6],
    )

    end = BatchResult(wire(BatchResult.build_end(7, [10, 20, 0], [3])))
    assert (end.final, end.outputs, end.slots, end.timings, end.response_timings) == (True, None, [], [10, 20, 0], [3])

    failed = BatchResult(wire(BatchResult.build_error(7, ModelExecutionError("model 'm' raised"), [4])))
    assert failed.final and failed.response_timings == [4]
    assert isinstance(failed.error, ModelExecutionError) and str(failed.error) == "model 'm' raised"
    assert BatchResult(wire(BatchResult.build_error(7, DeadlockError("stuck")))).response_timings is None


def test_slots_are_freed_and_cancels_published_by_name() -> None:
    assert FreeSlots(wire(FreeSlots.build(["seg-1", "seg-2"]))).slots == ["seg-1", "seg-2"]
    notice = CancelNotice(wire(CancelNotice.build(7, [0, 2])))
    assert (notice.batch_id, notice.request_indexes) == (7, [0, 2])


def test_bls_messages_read_back() -> None:
    inputs = [["x", "FP32", [1, 2], 0]]
    call = BlsRequest(wire(BlsRequest.build(3, "b", 1, inputs, {"k": "v"}, ["y"], "req-9", True, 250_000)))
    assert (call.call_id, call.model, call.version, call.inputs, call.parameters, call.outputs) == (
        3,
        "b",
        1,
        inputs,
        {"k": "v"},
        ["y"],
    )
    assert (call.request_id, call.stream, call.timeout_us) == ("req-9", True, 250_000)
    latest = BlsRequest(wire(BlsRequest.build(4, "b", None, inputs, {}, [], "", False, 0)))
    assert (latest.version, latest.parameters, latest.outputs, latest.stream, latest.timeout_us) == (
        None,
        {},
        [],
        False,
        0,
    )

    outputs = [["y", "FP32", [1, 2], ["seg-3", 8]]]
    response = BlsResponse(wire(BlsResponse.build(3, outputs, False, lease=11)))
    assert (response.call_id, response.outputs, response.final, response.lease, response.error) == (
        3,
        outputs,
        False,
        11,
        None,
    )
    assert BlsResponse(wire(BlsResponse.build(3, [], True))).lease is None
    failed = BlsResponse(wire(BlsResponse.build_error(3, DeadlockError("would deadlock"))))
    assert failed.final and isinstance(failed.error, DeadlockError) and str(failed.error) == "would deadlock"
    assert BlsCancel(wire(BlsCancel.build(3))).call_id == 3
    assert BlsFree(wire(BlsFree.build(11))).lease == 11


def test_control_requests_and_replies_read_back() -> None:
    load = Load(wire(Load.build(SPEC, 1, b"pickled")))
    assert (load.request_id, load.spec, load.payload) == (1, SPEC, b"pickled")
    assert Load(wire(Load.build(SPEC, 2))).payload is None
    ensemble = {"name": "e", "version": 1, "steps": []}
    load_ensemble = LoadEnsemble(wire(LoadEnsemble.build(ensemble, 3)))
    assert (load_ensemble.request_id, load_ensemble.ensemble) == (3, ensemble)
    unload = Unload(wire(Unload.build("m", 2, 4)))
    assert (unload.request_id, unload.name, unload.version) == (4, "m", 2)
    assert Serving(wire(Serving.build(5))).request_id == 5
    assert Shutdown(wire(Shutdown.build(6))).request_id == 6
    ok = ControlReply(wire(ControlReply.build_ok(5)))
    assert (ok.request_id, ok.error) == (5, None)
    error = ControlReply(wire(ControlReply.build_error(1, "model 'm' is already loaded")))
    assert (error.request_id, error.error) == (1, "model 'm' is already loaded")


def message_classes() -> Iterator[type[Message]]:
    """Every message class of the protocol module."""
    for value in vars(protocol).values():
        if isinstance(value, type) and issubclass(value, Message) and value is not Message:
            yield value


def test_every_kind_has_its_class_and_builds_messages_of_that_kind() -> None:
    kinds = {value for name, value in vars(MessageKind).items() if name.isupper()}
    with_class = {cls.KIND for cls in message_classes() if "KIND" in vars(cls)}
    assert kinds - with_class == {MessageKind.OK, MessageKind.ERROR}  # both ControlReply's
    samples: dict[type[Message], Header] = {
        Hello: Hello.build("m", 2, 0, "thread", 1, "p"),
        Welcome: Welcome.build(""),
        Refused: Refused.build("no"),
        Stop: Stop.build(),
        Bye: Bye.build(),
        InferBatch: InferBatch.build(1, [], []),
        BatchResult: BatchResult.build_end(1, [0, 0, 0], [0]),
        FreeSlots: FreeSlots.build([]),
        BlsRequest: BlsRequest.build(1, "m", None, [], {}, [], "", False, 0),
        BlsResponse: BlsResponse.build(1, [], True),
        BlsCancel: BlsCancel.build(1),
        BlsFree: BlsFree.build(1),
        Load: Load.build(SPEC, 1),
        LoadEnsemble: LoadEnsemble.build({}, 1),
        Unload: Unload.build("m", 2, 1),
        Serving: Serving.build(1),
        Shutdown: Shutdown.build(1),
        Ping: Ping.build(),
        OpenRemote: OpenRemote.build("t" * 16, 1),
    }
    assert {kind_of(header) for header in samples.values()} == with_class
    for cls, header in samples.items():
        assert kind_of(header) == cls.KIND, cls.__name__


def test_the_per_batch_messages_keep_their_short_keys() -> None:
    # infer and res go once per batch: their keys stay one or two letters (what a longer key costs is paid per batch).
    assert InferBatch.build(7, [["r1", {}, [], 1]], [["x", "FP32", [1], 0, 0]]) == {
        "t": "infer",
        "b": 7,
        "r": [["r1", {}, [], 1]],
        "x": [["x", "FP32", [1], 0, 0]],
    }
    assert BatchResult.build_final(7, [[]], [], [1, 2, 3]) == {
        "t": "res",
        "b": 7,
        "o": [[]],
        "s": [],
        "final": True,
        "tm": [1, 2, 3],
    }
    assert BatchResult.build_final(7, [[]], [], [1, 2, 3], [4, 5, 6, 7])["st"] == [4, 5, 6, 7]


# nothing else builds or reads messages by hand ---------------------------------------------------------------------

# Names the code gives a decoded message; a string subscript of one, or .get() with a string, reads a key by hand.
MESSAGE_NAMES = frozenset({"header", "reply", "message"})
# Functions that encode a message: a dict literal handed to one is a message built by hand.
ENCODERS = frozenset({"pack_header", "packb"})


def hand_made_messages(path: Path) -> Iterator[tuple[str, int, str]]:
    """(function, line, what) for each message a module builds or reads without the protocol."""
    tree = ast.parse(path.read_text(), str(path))

    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, int, str]]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Dict) and any(isinstance(key, ast.Constant) and key.value == "t" for key in node.keys):
            yield function, node.lineno, "a dict with a 't' key"
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in MESSAGE_NAMES
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            yield function, node.lineno, f"{node.value.id}[{node.slice.value!r}]"
        elif isinstance(node, ast.Call):
            callee = node.func
            if (
                isinstance(callee, ast.Attribute)
                and callee.attr == "get"
                and isinstance(callee.value, ast.Name)
                and callee.value.id in MESSAGE_NAMES
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                yield function, node.lineno, f"{callee.value.id}.get({node.args[0].value!r})"
            name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
            if name in ENCODERS and node.args and isinstance(node.args[0], ast.Dict):
                yield function, node.lineno, f"{name}() of a dict literal"
        for child in ast.iter_child_nodes(node):
            yield from visit(child, function)

    yield from visit(tree, "<module>")


def test_no_module_but_the_protocol_builds_or_reads_messages_by_hand() -> None:
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = path.relative_to(PACKAGE_DIR).as_posix()
        if module.startswith("transport/protocol/") or "_pb2" in module:
            continue
        if module.startswith("routes/") or module == "frontends/dashboard.py":
            continue  # ASGI's messages and the status page's JSON: not the core's and workers' messages
        for function, line, what in hand_made_messages(path):
            found.setdefault((module, function), []).append(f"{module}:{line} ({function}): {what}")
    unexpected = [hit for hits in found.values() for hit in hits]
    assert unexpected == [], "build and read messages with pyserve.transport.protocol:\n" + "\n".join(unexpected)


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ('send({"t": "stop"})', "a dict with a 't' key"),
        ('batch_id = header["b"]', "header['b']"),
        ('lease = reply.get("l")', "reply.get('l')"),
        ('pack_header({"b": 1, "i": [0]})', "pack_header() of a dict literal"),
    ],
)
def test_the_check_sees_a_message_made_by_hand(tmp_path: Path, source: str, what: str) -> None:
    module = tmp_path / "module.py"
    module.write_text(f"def f(send, header, reply, pack_header):\n    {source}\n")
    assert [hit[2] for hit in hand_made_messages(module)] == [what]


def test_a_reader_shows_its_fields() -> None:
    assert repr(FreeSlots(FreeSlots.build(["s"]))) == "FreeSlots(slots=['s'])"
    assert repr(Unload(Unload.build("m", 2, 4))) == "Unload(drain_s=0.0, name='m', version=2, request_id=4)"
