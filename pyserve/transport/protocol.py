"""The messages between the core, its instances and ``Serve``: every kind, who sends it, and its fields.

Each message is a msgpack map (``messages.pack_header``), followed on the worker socket by the frames its inline
buffers need. This module is the one place that knows their keys: everything else builds a message with its kind's
``build`` (or ``build_...``) and reads one through its kind's class, whose properties name the fields.

=================  ===================  ==================  ============================================================
from -> to         kind                 class               fields (wire key)
=================  ===================  ==================  ============================================================
instance -> core   ``hello``            ``Hello``           model, version, instance_index (instance), instance_kind
                                                            (kind), pid, shm_prefix
core -> instance   ``welcome``          ``Welcome``         cancel_address (cancel)
core -> instance   ``refused``          ``Refused``         message
core -> instance   ``infer``            ``InferBatch``      batch_id (b), requests (r), blocks (x), trace (tc)
instance -> core   ``res``              ``BatchResult``     batch_id (b), final, outputs (o), slots (s), timings (tm),
                                                            response_timings (rt), error (err), stage_times (st)
core -> instance   ``free``             ``FreeSlots``       slots
core -> instance   ``stop``             ``Stop``
instance -> core   ``bye``              ``Bye``
instance -> core   ``bls``              ``BlsRequest``      call_id (c), model, version, inputs (x), parameters (p),
                                                            outputs (o), request_id (id), stream, timeout_us (tu)
core -> instance   ``bls_res``          ``BlsResponse``     call_id (c), outputs (o), final, lease (l), error (err)
instance -> core   ``bls_cancel``       ``BlsCancel``       call_id (c)
instance -> core   ``bls_free``         ``BlsFree``         lease (l)
Serve -> core      ``load``             ``Load``            request_id (rid), spec, payload
Serve -> core      ``load_ensemble``    ``LoadEnsemble``    request_id (rid), ensemble (spec)
Serve -> core      ``unload``           ``Unload``          request_id (rid), name, version
Serve -> core      ``serving``          ``Serving``         request_id (rid)
Serve -> core      ``shutdown``         ``Shutdown``        request_id (rid)
core -> Serve      ``ok``, ``error``    ``ControlReply``    request_id (rid), error (message)
core -> instances  (cancel socket)      ``CancelNotice``    batch_id (b), request_indexes (i)
=================  ===================  ==================  ============================================================

Every message but the cancel notice carries its kind under ``t`` (``kind_of``). The keys stay short because ``infer``
and ``res`` go once per batch. For the same reason builders are plain functions that return the map, and a reader
takes the fields it has into slots when it is made (reading a property costs a call each on Python 3.11, more than
the lookup it wraps); only a model spec is decoded when read. Tensors
are lists ``[name, datatype, shape, loc]`` (``TensorDescriptor``), placed by ``messages.FrameWriter``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, NamedTuple

from pyserve.config import ModelSpec
from pyserve.errors import InferenceError, error_from_kind, error_kind

Header = dict[str, Any]
"""A message as msgpack carries it: built by a kind's ``build``, read through its class."""

RequestEntry = list[Any]
"""One request of an infer batch: ``[request id, parameters, requested output names, rows]``."""

InputBlock = list[Any]
"""One input of an infer batch: ``[name, datatype, shape, loc, target]``; ``target`` is the index of the request the
tensor belongs to, or ``MERGED``."""

TensorDescriptor = list[Any]
"""One tensor of a result or a BLS message: ``[name, datatype, shape, loc]`` (``loc``: ``messages.Loc``)."""

MERGED: Final = -1
"""The ``target`` of an input block that holds every request's rows of that input, end to end."""


class MessageKind:
    """The kinds of message: the ``t`` of every header (the cancel notice, alone on its socket, has none)."""

    HELLO: Final = "hello"
    WELCOME: Final = "welcome"
    REFUSED: Final = "refused"
    INFER: Final = "infer"
    RESULT: Final = "res"
    FREE: Final = "free"
    STOP: Final = "stop"
    BYE: Final = "bye"
    BLS_REQUEST: Final = "bls"
    BLS_RESPONSE: Final = "bls_res"
    BLS_CANCEL: Final = "bls_cancel"
    BLS_FREE: Final = "bls_free"
    LOAD: Final = "load"
    LOAD_ENSEMBLE: Final = "load_ensemble"
    UNLOAD: Final = "unload"
    SERVING: Final = "serving"
    SHUTDOWN: Final = "shutdown"
    OK: Final = "ok"
    ERROR: Final = "error"


def kind_of(header: Header) -> str:
    """The kind of a received message (one of ``MessageKind``)."""
    kind: str = header["t"]
    return kind


class TraceContext(NamedTuple):
    """What a worker needs to put its compute spans under the batch's traced requests."""

    file: str
    """Where the core writes its trace (Triton's ``trace_file``), for a worker that exports to a file too."""
    parents: list[str | None]
    """Per request of the batch, the ``traceparent`` of its request span, or None for a request not traced."""


class Message:
    """A received message, read into the attributes of its kind's class."""

    __slots__ = ()

    KIND: ClassVar[str]

    def __init__(self, header: Header) -> None:
        """Read a received header (a kind without fields has nothing to read)."""

    def __repr__(self) -> str:
        names = [name for cls in type(self).__mro__ for name in getattr(cls, "__slots__", ()) if name[0] != "_"]
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)!r}' for name in names)})"


# an instance joining ---------------------------------------------------------------------------------------------


class Hello(Message):
    """instance -> core: the first message of an instance, which serves one model version."""

    __slots__ = ("instance_index", "instance_kind", "model", "pid", "shm_prefix", "version")
    KIND = MessageKind.HELLO

    model: str
    version: int
    instance_index: int
    """The instance's index among its model's instances."""
    instance_kind: str
    """Either "thread" or "process"."""
    pid: int
    """The process the instance runs in."""
    shm_prefix: str
    """The name prefix of the instance's shared-memory segments (its outputs)."""

    def __init__(self, header: Header) -> None:
        self.model = header["model"]
        self.version = header["version"]
        self.instance_index = header["instance"]
        self.instance_kind = header["kind"]
        self.pid = header["pid"]
        self.shm_prefix = header["shm_prefix"]

    @staticmethod
    def build(model: str, version: int, instance_index: int, instance_kind: str, pid: int, shm_prefix: str) -> Header:
        """The message (fields: see the class)."""
        return {
            "t": "hello",
            "model": model,
            "version": version,
            "instance": instance_index,
            "kind": instance_kind,
            "pid": pid,
            "shm_prefix": shm_prefix,
        }


class Welcome(Message):
    """core -> instance: accepted; from now on it receives batches."""

    __slots__ = ("cancel_address",)
    KIND = MessageKind.WELCOME

    cancel_address: str
    """Where the core publishes ``CancelNotice``s; "" when it does not."""

    def __init__(self, header: Header) -> None:
        self.cancel_address = header.get("cancel") or ""

    @staticmethod
    def build(cancel_address: str) -> Header:
        """The message (fields: see the class)."""
        return {"t": "welcome", "cancel": cancel_address}


class Refused(Message):
    """core -> instance: not accepted (its model version is not loaded); the instance stops."""

    __slots__ = ("message",)
    KIND = MessageKind.REFUSED

    message: str
    """Why."""

    def __init__(self, header: Header) -> None:
        self.message = header["message"]

    @staticmethod
    def build(message: str) -> Header:
        """The message (fields: see the class)."""
        return {"t": "refused", "message": message}


class Stop(Message):
    """core -> instance: stop serving (its model version was unloaded)."""

    __slots__ = ()
    KIND = MessageKind.STOP

    @staticmethod
    def build() -> Header:
        """The message (it has no fields)."""
        return {"t": "stop"}


class Bye(Message):
    """instance -> core: the instance leaves; its batches in flight fail."""

    __slots__ = ()
    KIND = MessageKind.BYE

    @staticmethod
    def build() -> Header:
        """The message (it has no fields)."""
        return {"t": "bye"}


# batches ---------------------------------------------------------------------------------------------------------


class InferBatch(Message):
    """core -> instance: a batch to run, its inputs in the frames that follow or in the core's pool."""

    __slots__ = ("batch_id", "blocks", "requests", "trace")
    KIND = MessageKind.INFER

    batch_id: int
    """The batch's id, which its results carry."""
    requests: list[RequestEntry]
    """The batch's requests in order."""
    blocks: list[InputBlock]
    """The batch's inputs."""
    trace: TraceContext | None
    """The trace context of a batch with traced requests, else None."""

    def __init__(self, header: Header) -> None:
        self.batch_id = header["b"]
        self.requests = header["r"]
        self.blocks = header["x"]
        trace = header.get("tc")
        self.trace = None if trace is None else TraceContext(trace["file"], trace["parents"])

    @staticmethod
    def build(
        batch_id: int, requests: list[RequestEntry], blocks: list[InputBlock], trace: TraceContext | None = None
    ) -> Header:
        """The message (fields: see the class); ``trace`` for a batch with traced requests."""
        header: Header = {"t": "infer", "b": batch_id, "r": requests, "x": blocks}
        if trace is not None:
            header["tc"] = {"file": trace.file, "parents": trace.parents}
        return header


class BatchResult(Message):
    """instance -> core: a batch's outputs, or its error.

    A batch ends with one final message: its outputs (``build_final``), its error (``build_error``), or, for a
    decoupled model, after any number of ``build_response`` rounds, ``build_end``. Timings are nanoseconds.
    """

    __slots__ = ("batch_id", "error", "final", "outputs", "response_timings", "slots", "stage_times", "timings")
    KIND = MessageKind.RESULT

    batch_id: int
    """The id of the batch (``InferBatch.batch_id``)."""
    final: bool
    """Whether this is the batch's last message."""
    outputs: list[list[TensorDescriptor] | None] | None
    """Per request its outputs (None: no response this round); None for an error or the end of a decoupled batch."""
    slots: list[str]
    """The instance's pool slots the outputs use, to be freed (``FreeSlots``) once no response needs them."""
    timings: list[int]
    """Of a final message with outputs or ending a decoupled batch: [decode, compute, encode] of the batch (else
    empty)."""
    response_timings: list[int] | None
    """Of a decoupled model's messages: the time this message took to produce (Triton's response_stats)."""
    error: InferenceError | None
    """The batch's error; None when it has outputs."""
    stage_times: list[int] | None
    """Of a final message with outputs, when ``ServeConfig.stage_times`` is on: the instance's
    ``time.monotonic_ns()`` when it received the batch, decoded it, the function returned and it sent this (else
    None; ``pyserve.core.stage_times``)."""

    def __init__(self, header: Header) -> None:
        self.batch_id = header["b"]
        self.final = header["final"]
        self.outputs = header.get("o")
        self.slots = header.get("s") or []
        self.timings = header.get("tm") or []
        self.response_timings = header.get("rt")
        self.stage_times = header.get("st")
        error = header.get("err")
        self.error = None if error is None else error_from_kind(error[0], error[1])

    @staticmethod
    def build_final(
        batch_id: int,
        outputs: list[list[TensorDescriptor]],
        slots: list[str],
        timings: list[int],
        stage_times: list[int] | None = None,
    ) -> Header:
        """A batch's outputs, one list per request; ``timings``: [decode, compute, encode]; ``stage_times`` only
        when the switch is on (the key is absent otherwise)."""
        header: Header = {"t": "res", "b": batch_id, "o": outputs, "s": slots, "final": True, "tm": timings}
        if stage_times is not None:
            header["st"] = stage_times
        return header

    @staticmethod
    def build_response(
        batch_id: int, outputs: list[list[TensorDescriptor] | None], slots: list[str], response_timings: list[int]
    ) -> Header:
        """One round of a decoupled model's responses (None for a request without one this round);
        ``response_timings``: [compute, encode] of this round."""
        return {"t": "res", "b": batch_id, "o": outputs, "s": slots, "final": False, "rt": response_timings}

    @staticmethod
    def build_end(batch_id: int, timings: list[int], response_timings: list[int]) -> Header:
        """The end of a decoupled model's batch: no outputs; ``timings`` for the whole batch, ``response_timings``
        for the time since the last round."""
        return {"t": "res", "b": batch_id, "o": None, "s": [], "final": True, "tm": timings, "rt": response_timings}

    @staticmethod
    def build_error(batch_id: int, error: InferenceError, response_timings: list[int] | None = None) -> Header:
        """The batch failed: every request of it is answered with ``error``; ``response_timings`` for a decoupled
        model's batch."""
        header: Header = {"t": "res", "b": batch_id, "err": [error_kind(error), str(error)], "final": True}
        if response_timings is not None:
            header["rt"] = response_timings
        return header


class FreeSlots(Message):
    """core -> instance: these slots of the instance's pool are no longer read."""

    __slots__ = ("slots",)
    KIND = MessageKind.FREE

    slots: list[str]
    """Names of the instance's pool slots to release."""

    def __init__(self, header: Header) -> None:
        self.slots = header["slots"]

    @staticmethod
    def build(slots: list[str]) -> Header:
        """The message (fields: see the class)."""
        return {"t": "free", "slots": slots}


class CancelNotice(Message):
    """core -> instances, on the cancel publisher: requests of a running batch were cancelled.

    The publisher also answers each new subscription with a sync notice (``build_sync``, ``is_sync``): a listener
    that heard one hears every cancel published after it.
    """

    __slots__ = ("batch_id", "is_sync", "request_indexes")

    batch_id: int
    """The running batch (0 in a sync notice)."""
    request_indexes: list[int]
    """Positions in the batch of the requests cancelled (empty in a sync notice)."""
    is_sync: bool
    """Whether this is the answer to a subscription rather than a cancel."""

    def __init__(self, header: Header) -> None:
        self.is_sync = bool(header.get("sync"))
        self.batch_id = header.get("b", 0)
        self.request_indexes = header.get("i", [])

    @staticmethod
    def build(batch_id: int, request_indexes: list[int]) -> Header:
        """The message (fields: see the class)."""
        return {"b": batch_id, "i": request_indexes}

    @staticmethod
    def build_sync() -> Header:
        """The answer to a new subscription."""
        return {"sync": True}


# BLS -------------------------------------------------------------------------------------------------------------


class BlsRequest(Message):
    """instance -> core: a call its function makes to a model, its inputs in frames or the instance's pool."""

    __slots__ = (
        "call_id",
        "inputs",
        "model",
        "outputs",
        "parameters",
        "request_id",
        "stream",
        "timeout_us",
        "version",
    )
    KIND = MessageKind.BLS_REQUEST

    call_id: int
    """The caller's number for the call, which its responses carry."""
    model: str
    """The model called."""
    version: int | None
    """Its version; None for the latest."""
    inputs: list[TensorDescriptor]
    parameters: dict[str, Any]
    """The request's parameters."""
    outputs: list[str]
    """The names of the outputs requested; empty for all of them."""
    request_id: str
    """The request's id ("" for none)."""
    stream: bool
    """Whether the caller takes several responses (``infer_stream``)."""
    timeout_us: int
    """The caller's own timeout in microseconds; 0 for none."""

    def __init__(self, header: Header) -> None:
        self.call_id = header["c"]
        self.model = header["model"]
        self.version = header.get("version")
        self.inputs = header["x"]
        self.parameters = header.get("p") or {}
        self.outputs = list(header.get("o") or ())
        self.request_id = header.get("id", "")
        self.stream = bool(header.get("stream"))
        self.timeout_us = int(header.get("tu") or 0)

    @staticmethod
    def build(
        call_id: int,
        model: str,
        version: int | None,
        inputs: list[TensorDescriptor],
        parameters: dict[str, Any],
        outputs: list[str],
        request_id: str,
        stream: bool,
        timeout_us: int,
    ) -> Header:
        """The message (fields: see the class)."""
        return {
            "t": "bls",
            "c": call_id,
            "model": model,
            "version": version,
            "x": inputs,
            "p": parameters,
            "o": outputs,
            "id": request_id,
            "stream": stream,
            "tu": timeout_us,
        }


class BlsResponse(Message):
    """core -> instance: a response to a BLS call, or its error.

    Outputs in a worker's pool travel as their location; the response then carries a ``lease``, which the caller
    hands back with ``BlsFree`` once it has copied them.
    """

    __slots__ = ("call_id", "error", "final", "lease", "outputs")
    KIND = MessageKind.BLS_RESPONSE

    call_id: int
    """The call answered (``BlsRequest.call_id``)."""
    outputs: list[TensorDescriptor]
    """The response's outputs (none for an error)."""
    final: bool
    """Whether the call is over."""
    lease: int | None
    """What to hand back with ``BlsFree`` once the outputs are copied; None when there is nothing to free."""
    error: InferenceError | None
    """The call's error, or None."""

    def __init__(self, header: Header) -> None:
        self.call_id = header["c"]
        self.outputs = header.get("o") or []
        self.final = header["final"]
        self.lease = header.get("l")
        error = header.get("err")
        self.error = None if error is None else error_from_kind(error[0], error[1])

    @staticmethod
    def build(call_id: int, outputs: list[TensorDescriptor], final: bool, lease: int | None = None) -> Header:
        """A response (fields: see the class)."""
        header: Header = {"t": "bls_res", "c": call_id, "o": outputs, "final": final}
        if lease is not None:
            header["l"] = lease
        return header

    @staticmethod
    def build_error(call_id: int, error: InferenceError) -> Header:
        """The call failed (it is over)."""
        return {"t": "bls_res", "c": call_id, "final": True, "err": [error_kind(error), str(error)]}


class BlsCancel(Message):
    """instance -> core: the caller no longer waits for this call."""

    __slots__ = ("call_id",)
    KIND = MessageKind.BLS_CANCEL

    call_id: int
    """The call withdrawn."""

    def __init__(self, header: Header) -> None:
        self.call_id = header["c"]

    @staticmethod
    def build(call_id: int) -> Header:
        """The message (fields: see the class)."""
        return {"t": "bls_cancel", "c": call_id}


class BlsFree(Message):
    """instance -> core: the caller copied a response's outputs; their slots may go."""

    __slots__ = ("lease",)
    KIND = MessageKind.BLS_FREE

    lease: int
    """The response's ``BlsResponse.lease``."""

    def __init__(self, header: Header) -> None:
        self.lease = header["l"]

    @staticmethod
    def build(lease: int) -> Header:
        """The message (fields: see the class)."""
        return {"t": "bls_free", "l": lease}


# Serve's control requests ----------------------------------------------------------------------------------------


class ControlRequest(Message):
    """Serve -> core: a control request; the core answers it with a ``ControlReply`` of the same request id."""

    __slots__ = ("request_id",)

    request_id: int
    """The id the reply carries."""

    def __init__(self, header: Header) -> None:
        self.request_id = header["rid"]


class Load(ControlRequest):
    """Serve -> core: load a model version. With a payload its instances are processes the core starts, and the
    core answers once all of them joined."""

    __slots__ = ("_spec", "payload")
    KIND = MessageKind.LOAD

    payload: bytes | None
    """The pickled functions of process instances; None for thread instances (Serve starts them)."""

    def __init__(self, header: Header) -> None:
        super().__init__(header)
        self._spec: dict[str, Any] = header["spec"]
        self.payload = header.get("payload")

    @staticmethod
    def build(spec: ModelSpec, request_id: int, payload: bytes | None = None) -> Header:
        """The message (fields: see the class)."""
        header: Header = {"t": "load", "spec": spec.to_wire(), "rid": request_id}
        if payload is not None:
            header["payload"] = payload
        return header

    @property
    def spec(self) -> ModelSpec:
        """The model version's spec."""
        return ModelSpec.from_wire(self._spec)


class LoadEnsemble(ControlRequest):
    """Serve -> core: load an ensemble."""

    __slots__ = ("ensemble",)
    KIND = MessageKind.LOAD_ENSEMBLE

    ensemble: dict[str, Any]
    """The ensemble as ``EnsembleSpec.to_wire()`` describes it (that module lies above this one)."""

    def __init__(self, header: Header) -> None:
        super().__init__(header)
        self.ensemble = header["spec"]

    @staticmethod
    def build(ensemble: dict[str, Any], request_id: int) -> Header:
        """The message (fields: see the class)."""
        return {"t": "load_ensemble", "spec": ensemble, "rid": request_id}


class Unload(ControlRequest):
    """Serve -> core: unload a model version (its queued requests fail, its instances stop)."""

    __slots__ = ("name", "version")
    KIND = MessageKind.UNLOAD

    name: str
    version: int

    def __init__(self, header: Header) -> None:
        super().__init__(header)
        self.name = header["name"]
        self.version = header["version"]

    @staticmethod
    def build(name: str, version: int, request_id: int) -> Header:
        """The message (fields: see the class)."""
        return {"t": "unload", "name": name, "version": version, "rid": request_id}


class Serving(ControlRequest):
    """Serve -> core: what was bound before start is loaded; from now on readiness is the models' own."""

    __slots__ = ()
    KIND = MessageKind.SERVING

    @staticmethod
    def build(request_id: int) -> Header:
        """The message (a request id only)."""
        return {"t": "serving", "rid": request_id}


class Shutdown(ControlRequest):
    """Serve -> core: stop the core."""

    __slots__ = ()
    KIND = MessageKind.SHUTDOWN

    @staticmethod
    def build(request_id: int) -> Header:
        """The message (a request id only)."""
        return {"t": "shutdown", "rid": request_id}


class ControlReply(Message):
    """core -> Serve: the answer to a control request, ``ok`` or ``error``."""

    __slots__ = ("error", "request_id")

    request_id: int
    """The id of the request answered."""
    error: str | None
    """Why the request failed; None when it succeeded."""

    def __init__(self, header: Header) -> None:
        self.request_id = header["rid"]
        self.error = header["message"] if header["t"] == "error" else None

    @staticmethod
    def build_ok(request_id: int) -> Header:
        """The request succeeded."""
        return {"t": "ok", "rid": request_id}

    @staticmethod
    def build_error(request_id: int, message: str) -> Header:
        """The request failed; ``message`` says why."""
        return {"t": "error", "rid": request_id, "message": message}
