"""What the front ends may use of the core: the one interface they are written against.

The core process's entry point (``pyserve.core.__main__``) builds the core, then starts each front end with the
core's ``CoreApi``. A front end decodes its wire format into a request (``infer_call.build_request``), submits it
here and writes the answer from the request's callback; everything else it serves (health, metadata, statistics,
settings, the metrics page, clients' shared-memory regions) it reaches through the same object. Front ends never
see ``CoreServer``, its sockets or its workers, so either side can change behind this interface, and a front end
can be tested against a ``CoreApi`` built from fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from pyserve.core.inference import InferenceRequest, ModelEntry, SharedMemorySlice


class ModelsView(Protocol):
    """The bound model versions, read only (``pyserve.core.registry.Registry`` fits)."""

    def get(self, name: str, version: str | int | None = None) -> ModelEntry:
        """A model version; without a version, the highest one. Raises ModelNotFoundError."""
        ...

    def entries(self) -> list[ModelEntry]:
        """Every model version, sorted by name and version."""
        ...

    def versions(self, name: str) -> list[ModelEntry]:
        """All versions of one model (empty when unknown)."""
        ...


class TracingControls(Protocol):
    """Triton's trace settings, as the trace endpoints read and change them (``pyserve.core.tracing.Tracing``)."""

    @property
    def active(self) -> bool:
        """Whether any scope traces: only then does a front end read a request's ``traceparent``."""
        ...

    def to_json(self, model: str | None = None) -> dict[str, Any]:
        """The settings of a model (or the server's)."""
        ...

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change settings; returns the settings that now apply."""
        ...


class LogControls(Protocol):
    """Triton's log settings, as the logging endpoints read and change them (``pyserve.core.logs.LogSettings``)."""

    def to_json(self) -> dict[str, Any]:
        """The settings document."""
        ...

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a settings request (all or nothing); returns the settings now in force."""
        ...


class StageRecorder(Protocol):
    """The stage-times debug switch, as the HTTP front end stamps a request's first and last stage
    (``pyserve.core.stage_times.StageTimes``)."""

    def start(self) -> list[int]:
        """The stamps of a request just read in full (hand them to its ``InferenceRequest.stamps``)."""
        ...

    def written(self, stamps: list[int]) -> None:
        """The request's response is written."""
        ...


class RepositoryControls(Protocol):
    """Triton's model repository endpoints (``pyserve.core.repository_control.RepositoryControl``)."""

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """The repository index: name, version, state and reason of each model."""
        ...

    async def request_load(self, name: str, config: str | None, files: Mapping[str, bytes]) -> None:
        """Load or reload a model (``config``: a JSON config to use instead of config.pbtxt; ``files``: path in
        the model directory -> content). Raises ModelLoadError / UnsupportedError with the reason."""
        ...

    async def request_unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload a model once it has answered what it accepted."""
        ...


class SharedMemoryControls(Protocol):
    """Triton's shared-memory extension: clients' regions, system and CUDA, by name
    (``pyserve.core.shm_regions.SharedMemoryRegistry``). ``kind`` is ``"system"`` or ``"cuda"``; every error is an
    ``InferenceError`` naming what is wrong."""

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the client's ``/dev/shm/<key>`` as region ``name``."""
        ...

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open a client's CUDA IPC handle as region ``name``."""
        ...

    def unregister(self, kind: str, name: str = "") -> None:
        """Unregister one region of ``kind``, or all of them without a name."""
        ...

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """Triton's status entries of the regions of ``kind`` (or of the one named)."""
        ...

    def slice(self, name: str, offset: int, byte_size: int) -> SharedMemorySlice:
        """Where one input or output of a request lies in region ``name``."""
        ...


class StatusView(Protocol):
    """What the status page (``pyserve.frontends.dashboard``) reads beyond the statistics
    (``pyserve.core.status.CoreStatus``)."""

    def instances(self, entry: ModelEntry) -> list[dict[str, Any]]:
        """Each instance of a model version: ``index``, ``kind`` (thread, process, remote), ``pid`` (0 while it has
        no process), ``device``, ``restarts``, ``state`` (idle, busy, starting, restarting)."""
        ...

    def latency_quantiles(self, entry: ModelEntry, quantiles: Sequence[float]) -> list[float] | None:
        """Request latency quantiles in µs over the last minute, NaN where nothing was observed; None unless the
        latency summaries are on (``ServeConfig.metrics_summaries``)."""
        ...


class CoreApi:
    """The core, as a front end sees it.

    - ``submit(request)`` queues a request built with ``build_request``; it is answered through its callback, on
      the core's loop. A request refused at once (model not ready, queue full, a bad ``priority``) raises its
      ``InferenceError`` instead and gets no callback.
    - ``cancel(request)`` says the client went away: a queued request is dropped, a running one is told to stop.
      It gets no further callback.
    - ``is_live()`` / ``is_ready()``: the server's health (ready: the bound models are loaded and each has an
      instance).
    - ``models``: the bound model versions (``ModelsView``); ``tracing`` and ``logs``: the settings endpoints.
    - ``metrics_page()``: the Prometheus page, built when called (``METRICS_CONTENT_TYPE``).
    - ``repository``: the repository index, load and unload (``RepositoryControls``).
    - ``stage_times``: the stage-times recorder (``StageRecorder``), None unless ``ServeConfig.stage_times`` is on.
    - ``shared_memory``: the clients' shared-memory regions (``SharedMemoryControls``).
    - ``remote_address``: where remote peers attach (``tcp://host:port``), "" when the remote port is off.
    - ``status``: the instances and latency quantiles the status page shows (``StatusView``), None where the core
      does not say (a front end then shows what ``models`` tells).

    The members are the core's own bound methods and objects, so calling through this object costs what calling
    the core directly would.
    """

    __slots__ = (
        "cancel",
        "is_ready",
        "logs",
        "metrics_page",
        "models",
        "remote_address",
        "repository",
        "shared_memory",
        "stage_times",
        "status",
        "submit",
        "tracing",
    )

    def __init__(
        self,
        *,
        submit: Callable[[InferenceRequest], None],
        cancel: Callable[[InferenceRequest], None],
        is_ready: Callable[[], bool],
        models: ModelsView,
        tracing: TracingControls,
        logs: LogControls,
        metrics_page: Callable[[], bytes],
        repository: RepositoryControls,
        shared_memory: SharedMemoryControls,
        stage_times: StageRecorder | None = None,
        remote_address: str = "",
        status: StatusView | None = None,
    ) -> None:
        self.submit = submit
        self.remote_address = remote_address
        self.cancel = cancel
        self.is_ready = is_ready
        self.models = models
        self.tracing = tracing
        self.logs = logs
        self.metrics_page = metrics_page
        self.stage_times = stage_times
        self.repository = repository
        self.shared_memory = shared_memory
        self.status = status

    def is_live(self) -> bool:
        """Whether the core answers: always, while its loop runs (anything that can ask, gets True)."""
        return True


# The Prometheus text format (0.0.4) that ``CoreApi.metrics_page`` is written in.
METRICS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
