"""The logic of every client, written once for sync and asyncio alike.

Each operation (wait for the server, read the model's configuration, infer) is a *flow*: a generator that yields
the steps it needs done (``Run`` a call with a timeout, ``Sleep``) and gets each call's answer back, or the call's
error raised where it yielded. The blocking clients drive flows with ``drive`` and the asyncio clients with
``drive_async``: the only code that exists twice is those two small loops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any, Generic

from pyserve.client.calls import AsyncTransport, Call, Codec, Outputs, StreamCall, T, Transport
from pyserve.client.grpc_codec import GrpcCodec
from pyserve.client.http_codec import HttpCodec
from pyserve.client.model import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_INFERENCE_TIMEOUT_S,
    DEFAULT_INIT_TIMEOUT_S,
    Headers,
    InferRequest,
    Parameters,
    RemoteModelConfig,
    build_request,
    parse_url,
    sample_outputs,
)
from pyserve.client.shared_memory import RegionPlan, RegionPool, SharedMemoryOption, check_option, plan_request
from pyserve.client.tls import ClientTls
from pyserve.errors import (
    ClientError,
    ClientTimeoutError,
    ConfigError,
    InferenceError,
    ModelNotReadyError,
    PyServeError,
    ServerUnreachableError,
    UnsupportedError,
)

# How often readiness is asked while waiting for it.
POLL_INTERVAL_S = 0.1
# The longest close() waits for the server to unregister each shared-memory region.
CLOSE_TIMEOUT_S = 5.0
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Run(Generic[T]):
    """Step: send ``call`` within ``timeout_s``; the flow gets its answer (or its error raised)."""

    call: Call[T]
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class Sleep:
    """Step: wait ``seconds``."""

    seconds: float


Flow = Generator["Run[Any] | Sleep", Any, T]


def drive(flow: Flow[T], transport: Transport) -> T:
    """Run a flow to its end with a blocking transport; its result."""
    answer: Any = None
    error: PyServeError | None = None
    while True:
        try:
            step = flow.send(answer) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        answer, error = None, None
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            continue
        try:
            answer = transport.run(step.call, step.timeout_s)
        except PyServeError as exc:
            error = exc


async def drive_async(flow: Flow[T], transport: AsyncTransport) -> T:
    """Run a flow to its end with an asyncio transport; its result."""
    answer: Any = None
    error: PyServeError | None = None
    while True:
        try:
            step = flow.send(answer) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        answer, error = None, None
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            continue
        try:
            answer = await transport.run(step.call, step.timeout_s)
        except PyServeError as exc:
            error = exc


class ClientBase:
    """What every client holds (server, model, timeouts, the model's configuration once read) and the flows of
    its operations. A subclass makes its transport in ``_connect``."""

    DEFAULT_MAX_CONNECTIONS = 8
    TAKES_SHARED_MEMORY = True

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | int | None = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        max_connections: int | None = None,
        headers: Headers | None = None,
        shared_memory: SharedMemoryOption = False,
        tls: ClientTls | None = None,
    ) -> None:
        self._address = parse_url(url, tls)
        self._model_name = model_name
        self._model_version = None if model_version is None else str(model_version)
        self._lazy_init = lazy_init
        self._init_timeout_s = DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else float(init_timeout_s)
        self._inference_timeout_s = (
            DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else float(inference_timeout_s)
        )
        self._connect_timeout_s = (
            min(DEFAULT_CONNECT_TIMEOUT_S, self._inference_timeout_s)
            if connect_timeout_s is None
            else float(connect_timeout_s)
        )
        self._codec: Codec = HttpCodec(headers) if self._address.scheme == "http" else GrpcCodec(headers)
        self._config: RemoteModelConfig | None = None
        option = check_option(shared_memory)
        if option and not self.TAKES_SHARED_MEMORY:
            raise ConfigError(f"{type(self).__name__} streams its responses: it takes no shared_memory")
        self._regions = RegionPool(option, self._address) if option else None
        self._connect(self.DEFAULT_MAX_CONNECTIONS if max_connections is None else max_connections)

    def _connect(self, max_connections: int) -> None:
        """Make the transport (connections open on first use; HTTP keeps up to ``max_connections`` alive)."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        """The server's URL, with its scheme (``http://``, ``https://``, ``grpc://`` or ``grpcs://``)."""
        return str(self._address)

    @property
    def model_name(self) -> str:
        """The model this client calls."""
        return self._model_name

    @property
    def model_version(self) -> str | None:
        """The model version this client calls (None: the server's latest)."""
        return self._model_version

    # flows ---------------------------------------------------------------------------------------------------------

    def _wait_for_server_flow(self, timeout_s: float) -> Flow[None]:
        deadline = time.monotonic() + timeout_s
        what = f"the server at {self._address} was not ready"
        yield from self._until_ready(self._codec.server_ready, deadline, timeout_s, what, "it answers not ready")

    def _wait_for_model_flow(self, timeout_s: float) -> Flow[None]:
        deadline = time.monotonic() + timeout_s
        yield from self._wait_for_server_flow(timeout_s)
        yield from self._until_ready(
            lambda: self._codec.model_ready(self._model_name, self._model_version),
            deadline,
            timeout_s,
            f"model '{self._model_name}' was not ready",
            "it answers not ready (or unknown)",
        )

    def _until_ready(
        self, ask: Callable[[], Any], deadline: float, timeout_s: float, what: str, not_ready: str
    ) -> Flow[None]:
        """Ask ``ask()`` (a readiness request) until it says yes; ClientTimeoutError naming ``what`` at the deadline."""
        last = "no answer"
        while True:
            try:
                if (yield Run(ask(), _left(deadline))):
                    return
                last = not_ready
            except (ServerUnreachableError, ClientTimeoutError) as exc:
                last = _last_failure(last, exc)
            yield from self._pause(deadline, what, timeout_s, last)

    def _config_flow(self) -> Flow[RemoteModelConfig]:
        """The model's configuration, read once: waits (up to ``init_timeout_s``) for the server and the model to
        be ready; a model the server does not know raises ModelNotFoundError at once."""
        if self._config is not None:
            return self._config
        deadline = time.monotonic() + self._init_timeout_s
        yield from self._wait_for_server_flow(self._init_timeout_s)
        name, version = self._model_name, self._model_version
        while True:
            try:
                config: RemoteModelConfig = yield Run(self._codec.model_config(name, version), _left(deadline))
                if (yield Run(self._codec.model_ready(name, version), _left(deadline))):
                    self._config = config
                    return config
                last = "it answers not ready"
            except ModelNotReadyError as exc:
                last = str(exc)
            yield from self._pause(deadline, f"model '{name}' was not ready", self._init_timeout_s, last)

    def _pause(self, deadline: float, what: str, timeout_s: float, last: str) -> Flow[None]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClientTimeoutError(f"{what} within {timeout_s:g} s (last: {last})")
        yield Sleep(min(POLL_INTERVAL_S, left))

    def _infer_flow(
        self,
        inputs: tuple[Any, ...],
        named: Mapping[str, Any],
        parameters: Parameters | None,
        headers: Headers | None,
        sample: bool,
    ) -> Flow[Outputs]:
        use_regions = self._regions is not None and self._regions.use()  # before any call: True may refuse the server
        config = yield from self._config_flow()
        if config.decoupled:
            raise UnsupportedError(
                f"model '{config.model_name}' is decoupled (it streams its responses): use DecoupledModelClient "
                "or AsyncioDecoupledModelClient"
            )
        request = build_request(config, self._model_version, inputs, named, parameters, headers, sample)
        plan = plan_request(config, request) if use_regions else None
        if plan is None:
            outputs: Outputs = yield Run(self._codec.infer(request), self._inference_timeout_s)
        else:
            outputs = yield from self._infer_in_region_flow(request, plan)
        return sample_outputs(config, outputs) if sample else outputs

    def _infer_in_region_flow(self, request: InferRequest, plan: RegionPlan) -> Flow[Outputs]:
        """Infer with the planned tensors in a region leased for the call (registered first when new); without one
        where the server refused it (``"auto"``)."""
        assert self._regions is not None
        yield from self._unregister_flow(self._regions.take_retired(), self._inference_timeout_s)
        region, new = self._regions.lease(plan.byte_size)
        if new:
            registration = self._codec.register_region(region.name, region.key, region.byte_size)
            try:
                yield Run(registration, self._inference_timeout_s)
            except InferenceError as exc:
                if isinstance(exc, ClientTimeoutError):
                    self._regions.retire(region)  # it may have been registered: unregister it later
                    raise
                self._regions.refused(region)
                if self._regions.option is True:
                    raise
                logger.warning(
                    "%s refused a shared-memory region (%s): tensors travel over the connection from now on",
                    self._address,
                    exc,
                )
                plain: Outputs = yield Run(self._codec.infer(request), self._inference_timeout_s)
                return plain
            except BaseException:
                self._regions.retire(region)
                raise
        reusable = False
        try:
            placed = dataclasses.replace(request, regions=plan.lay_out(region, request))
            outputs: Outputs = yield Run(self._codec.infer(placed), self._inference_timeout_s)
            reusable = True
            return outputs
        except InferenceError as exc:
            # The server answered (it is done with the region), unless the client stopped waiting.
            reusable = not isinstance(exc, ClientTimeoutError)
            raise
        finally:
            self._regions.give_back(region, reusable)

    def _unregister_flow(self, names: list[str], timeout_s: float) -> Flow[None]:
        """Unregister regions the client no longer has; a server that cannot be reached is left alone."""
        for name in names:
            try:
                yield Run(self._codec.unregister_region(name), timeout_s)
            except ClientError as exc:  # unreachable (its mappings went with it), closed, timed out: stop trying
                logger.debug("unregistering shared-memory regions: %s", exc)
                return
            except InferenceError as exc:
                logger.debug("unregistering shared-memory region '%s': %s", name, exc)

    def _close_regions_flow(self) -> Flow[None]:
        """Unlink the client's regions and unregister them from the server."""
        if self._regions is not None:
            yield from self._unregister_flow(self._regions.close(), min(self._inference_timeout_s, CLOSE_TIMEOUT_S))

    def _stream_flow(
        self,
        inputs: tuple[Any, ...],
        named: Mapping[str, Any],
        parameters: Parameters | None,
        headers: Headers | None,
        sample: bool,
    ) -> Flow[tuple[RemoteModelConfig, StreamCall[Outputs]]]:
        config = yield from self._config_flow()
        request = build_request(config, self._model_version, inputs, named, parameters, headers, sample)
        return config, self._codec.stream(request, config)

    def _load_call(self, config: str | None, files: Mapping[str, bytes] | None) -> Run[None]:
        return Run(self._codec.load_model(self._model_name, config, files), self._init_timeout_s)

    def _unload_call(self) -> Run[None]:
        return Run(self._codec.unload_model(self._model_name), self._init_timeout_s)


def _left(deadline: float) -> float:
    # A call always gets a little time, so a deadline that just passed still gives a clear answer or timeout.
    return max(deadline - time.monotonic(), 0.001)


def _last_failure(last: str, error: Exception) -> str:
    """What to report of a wait's attempts: a timeout (often the last attempt cut short by the deadline) does not
    hide a more telling failure seen before it, such as a refused connection."""
    if isinstance(error, ClientTimeoutError) and last != "no answer":
        return last
    return str(error)
