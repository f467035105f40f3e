"""The request and response types front ends hand to the core and get back, and the model version a request is for.

This is the bottom of the core: the registry, the schedulers and everything above import it, and it imports none of
them. A model version (``ModelEntry``) lives here because a request points at it; what the entry needs of its
scheduler is the ``Scheduler`` protocol (``pyserve.core.scheduler.ModelScheduler`` implements it), and its
statistics (``pyserve.core.stats``) and documents (``pyserve.core.model_documents``) sit below this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pyserve.config import ModelSpec, Tensor
from pyserve.core.model_documents import model_config_json, model_metadata
from pyserve.core.stats import ModelStats
from pyserve.dtypes import deserialize_bytes, numpy_dtype
from pyserve.errors import ConfigError, InferenceError, InvalidInputError


class SharedMemorySlice(Protocol):
    """Where a request's input or output lies in a client's registered shared-memory region (Triton's extension):
    ``byte_size`` bytes at ``offset`` of region ``region`` (``pyserve.core.shm_regions`` makes them)."""

    region: str
    offset: int
    byte_size: int
    location: tuple[str, int] | None
    """``(segment, offset in it)`` of the bytes in ``/dev/shm``, for an instance to map; None for CUDA memory."""

    def read(self) -> memoryview:
        """The bytes (a view of the region for system shared memory, a host copy for CUDA memory)."""
        ...

    def write(self, data: Any) -> None:
        """Write ``data`` (a buffer of at most ``byte_size`` bytes) at the start of the slice."""
        ...


@dataclass(slots=True)
class InputTensor:
    """A decoded request input: fixed-size data as a numpy array, BYTES as their length-prefixed blob.

    ``location`` is ``(segment, offset)`` when the bytes lie in a client's shared-memory segment an instance can map
    itself (``pyserve.core.batches`` then hands it the place instead of a copy).
    """

    datatype: str
    shape: list[int]
    data: Any  # np.ndarray for fixed-size types; bytes/memoryview (length-prefixed) for BYTES
    location: tuple[str, int] | None = None

    @property
    def nbytes(self) -> int:
        """Size of the data in bytes."""
        return int(self.data.nbytes) if isinstance(self.data, np.ndarray) else memoryview(self.data).nbytes

    def buffer(self) -> Any:
        """The raw bytes, as a buffer (no copy for contiguous arrays)."""
        if isinstance(self.data, np.ndarray):
            return np.ascontiguousarray(self.data).reshape(-1).view(np.uint8)
        return self.data


@dataclass(slots=True)
class OutputTensor:
    """One output of a response: its raw bytes (BYTES length-prefixed) and how to read them.

    ``shm`` is ``[segment, nbytes]`` when the bytes lie in a worker's shared-memory slot, so the core can hand the
    location on (to a BLS caller, to the next step of an ensemble) instead of the bytes.
    """

    name: str
    datatype: str
    shape: list[int]
    buffer: memoryview
    shm: list[Any] | None = None

    def to_numpy(self) -> np.ndarray:
        """The output as a numpy array (a view for fixed-size types)."""
        count = 1
        for dim in self.shape:
            count *= dim
        if self.datatype == "BYTES":
            return deserialize_bytes(self.buffer, count, self.name).reshape(self.shape)
        return np.frombuffer(self.buffer, dtype=numpy_dtype(self.datatype), count=count).reshape(self.shape)


@dataclass(slots=True)
class InferenceResponse:
    """One response to a request: outputs, or an error. ``final`` marks the last (decoupled models send many).

    Output buffers may point into shared memory that is reused once the response callback returns: a front end
    must encode (copy) them inside the callback, or ``retain()`` them (ensembles and BLS keep intermediate tensors
    in shared memory that way).
    """

    outputs: list[OutputTensor]
    error: InferenceError | None = None
    final: bool = True
    parameters: dict[str, Any] = field(default_factory=dict)
    lease: BufferLease | None = None

    def retain(self) -> Callable[[], None]:
        """Keep the output buffers valid after the callback returns; call the returned function once done."""
        return self.lease.acquire() if self.lease is not None else _nothing


class BufferLease:
    """Holds the shared-memory slots behind a response's outputs until every holder has let go.

    Its creator holds it from the start and ``drop()``-s it once the response callbacks have run; ``acquire()``
    adds a holder and returns that holder's one-shot release. ``release`` runs when the last holder lets go.
    """

    __slots__ = ("_holders", "_release")

    def __init__(self, release: Callable[[], None]) -> None:
        self._holders = 1
        self._release = release

    def acquire(self) -> Callable[[], None]:
        """One more holder; the result releases it (calling it again does nothing)."""
        self._holders += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.drop()

        return release

    def drop(self) -> None:
        """The creator (or one holder) lets go; the last one out releases the slots."""
        self._holders -= 1
        if self._holders == 0:
            self._release()


def _nothing() -> None:
    return None


ResponseCallback = Callable[["InferenceRequest", InferenceResponse], None]


@dataclass(slots=True, eq=False)
class InferenceRequest:
    """A validated request for one model version, as the scheduler and workers see it."""

    model: ModelEntry
    id: str
    inputs: dict[str, InputTensor]
    parameters: dict[str, Any]
    requested_outputs: list[str]
    rows: int
    on_response: ResponseCallback
    arrival_ns: int = 0
    signature: tuple[Any, ...] = ()
    cancelled: bool = False
    done: bool = False
    batch_id: int = 0
    batch_index: int = 0
    # Absolute time.monotonic_ns() by which the request must be answered (0: none), set by the core for the steps
    # of an ensemble and for BLS calls, whose callers wait on them.
    deadline_ns: int = 0
    # Observability (pyserve.core.stats / tracing): responses so far (a decoupled model's response index), the
    # client's W3C traceparent header, and the request's spans while it is traced.
    responses: int = 0
    traceparent: str = ""
    trace: Any = None
    # With ServeConfig.stage_times on, an HTTP request's time.monotonic_ns() per stage (pyserve.core.stage_times).
    stamps: list[int] | None = None
    # Whether the core may poll for the reply to this request's batch rather than sleep (ServeConfig.reply_spin_us).
    # gRPC requests may not: grpc.aio's completion-queue thread needs the interpreter lock the polling loop holds
    # (measured in docs/architecture.md, "gRPC throughput").
    reply_spin: bool = True
    # A stateful model's request: [correlation id, flags, slot] as its instance hears it (pyserve.core.sequence_batcher
    # sets it; transport.protocol.SequenceEntry); None otherwise.
    sequence: list[Any] | None = None


REMOTE_KIND = "remote"
"""The kind of an instance on a remote peer (``pyserve.core.remote_peers``): its tensors travel inline."""


@dataclass(eq=False)
class Instance:
    """One connected worker instance of a model (kind: ``thread``, ``process`` or ``remote``)."""

    identity: bytes
    index: int
    kind: str
    pid: int
    busy: bool = False
    batch_id: int = 0
    # Where it runs, as its hello said: the host name, the cluster node (a Ray node id) and the device.
    host: str = ""
    node: str = ""
    device: str = ""
    runs_as: str = ""  # the kind it said it is: "ray" for a Ray actor (its kind is "remote" to the core)
    batches_done: int = 0  # batches it answered: one that did work is no start-up crash loop (supervisor back-off)
    # Correlation IDs of sequences released on this instance, told with its next batch (pyserve.core.sequence_batcher).
    released_sequences: list[Any] = field(default_factory=list)

    @property
    def shown_kind(self) -> str:
        """The kind reports show: ``ray`` for a Ray actor (remote to the core), else ``kind``."""
        return "ray" if self.remote and self.runs_as == "ray" else self.kind

    @property
    def remote(self) -> bool:
        """Whether it runs on a remote peer: no shared memory between it and the core."""
        return self.kind == REMOTE_KIND


class ResponseOrdering(Protocol):
    """What the core asks of a model's response orderer (``pyserve.core.response_orderer.ResponseOrderer``)."""

    def register(self, request: InferenceRequest) -> None: ...

    def deliver(self, request: InferenceRequest, response: InferenceResponse) -> None: ...

    def forget(self, request: InferenceRequest) -> None: ...


class Scheduler(Protocol):
    """What the core asks of a model version's scheduler (``pyserve.core.scheduler.ModelScheduler``)."""

    @property
    def orderer(self) -> ResponseOrdering | None: ...

    def submit(self, request: InferenceRequest) -> None: ...

    def cancel(self, request: InferenceRequest) -> bool: ...

    def drain(self) -> list[InferenceRequest]: ...

    def queued_count(self) -> int: ...

    def add_instance(self, instance: Instance) -> None: ...

    def remove_instance(self, instance: Instance, error: InferenceError | None = None) -> None:
        """``error``: why it went away (a stateful model's sequences on it fail with the reason)."""
        ...

    def instance_done(self, instance: Instance) -> None: ...


@dataclass(eq=False)
class ModelEntry:
    """One version of one bound model."""

    spec: ModelSpec
    stats: ModelStats = field(default_factory=ModelStats)
    instances: list[Instance] = field(default_factory=list)
    scheduler: Scheduler | None = None
    # The configuration a model repository read (Triton's JSON form); None for a bound model, whose configuration
    # is built from its spec.
    config_document: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.name = self.spec.name
        self.version = self.spec.version
        self.batching = self.spec.config.max_batch_size > 0
        self.max_batch_size = self.spec.config.max_batch_size
        self.response_cache = self.spec.config.response_cache
        if self.response_cache and self.spec.config.decoupled:
            # As in Triton: a stream of responses is not one cacheable result.
            raise ConfigError(f"model '{self.name}': response_cache cannot be used with a decoupled (streaming) model")
        self.inputs: dict[str, Tensor] = {t.name: t for t in self.spec.inputs}
        self.outputs: dict[str, Tensor] = {t.name: t for t in self.spec.outputs}
        self.required_inputs = frozenset(t.name for t in self.spec.inputs if not t.optional)
        self.single_input = self.spec.inputs[0] if len(self.spec.inputs) == 1 else None

    @property
    def ready(self) -> bool:
        """A model is ready while at least one instance is connected."""
        return bool(self.instances)

    def validate(self, inputs: dict[str, InputTensor], requested_outputs: list[str]) -> int:
        """Check a request against the declared tensors; returns its batch size (rows; 1 without batching)."""
        for name in inputs:
            if name not in self.inputs:
                raise InvalidInputError(
                    f"unexpected inference input '{name}' for model '{self.name}'; "
                    f"expected inputs: {sorted(self.inputs)}"
                )
        missing = self.required_inputs.difference(inputs)
        if missing:
            raise InvalidInputError(f"missing required input(s) {sorted(missing)} for model '{self.name}'")
        rows = -1
        for name, tensor in inputs.items():
            declared = self.inputs[name]
            if tensor.datatype != declared.datatype:
                raise InvalidInputError(f"input '{name}': expected datatype {declared.datatype}, got {tensor.datatype}")
            dims = declared.shape
            shape = tensor.shape
            if self.batching:
                if len(shape) != len(dims) + 1:
                    raise InvalidInputError(
                        f"input '{name}': expected shape [-1,{','.join(map(str, dims))}] (batch dimension first), "
                        f"got {shape}"
                    )
                if rows == -1:
                    rows = shape[0]
                elif shape[0] != rows:
                    raise InvalidInputError(
                        f"input '{name}': batch size {shape[0]} differs from the other inputs' batch size {rows}"
                    )
                tail = shape[1:]
            else:
                tail = shape
                if len(shape) != len(dims):
                    raise InvalidInputError(f"input '{name}': expected shape {list(dims)}, got {shape}")
            for expected, got in zip(dims, tail, strict=True):
                if expected != -1 and expected != got:
                    prefix = "[-1," if self.batching else "["
                    raise InvalidInputError(
                        f"input '{name}': expected shape {prefix}{','.join(map(str, dims))}], got {shape}"
                    )
        if self.batching:
            if rows < 1:
                raise InvalidInputError(f"model '{self.name}': batch size must be at least 1, got {rows}")
            if rows > self.max_batch_size:
                raise InvalidInputError(
                    f"model '{self.name}': batch size {rows} exceeds max_batch_size {self.max_batch_size}"
                )
        for name in requested_outputs:
            if name not in self.outputs:
                raise InvalidInputError(
                    f"unexpected inference output '{name}' for model '{self.name}'; "
                    f"expected outputs: {sorted(self.outputs)}"
                )
        return rows if self.batching else 1

    def index_entry(self) -> dict[str, Any]:
        """This version in the repository index: Triton's name/version/state/reason, plus live instance counts."""
        configured = self.spec.config.instances
        live = len(self.instances)
        return {
            "name": self.name,
            "version": str(self.version),
            "state": "READY" if live else "UNAVAILABLE",
            "reason": "" if live == configured else f"{live} of {configured} instances live",
            "instances": {"configured": configured, "live": live},
        }

    def metadata(self, versions: list[int] | None = None) -> dict[str, Any]:
        """The model metadata document (``GET /v2/models/{m}``); ``versions`` lists every version of the model."""
        return model_metadata(self.spec, versions)

    def config_json(self) -> dict[str, Any]:
        """The Triton-shaped model configuration (``GET /v2/models/{m}/config``)."""
        if self.config_document is not None:
            return self.config_document
        return model_config_json(self.spec)
