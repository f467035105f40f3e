"""The logic of every client, written once for sync and asyncio alike.

Each operation (wait for the server, read the model's configuration, infer) is a *flow*: a generator that yields
the steps it needs done (``Run`` a call with a timeout, ``Sleep``) and gets each call's answer back, or the call's
error raised where it yielded. The blocking clients drive flows with ``drive`` and the asyncio clients with
``drive_async``: the only code that exists twice is those two small loops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Generator, Mapping
from typing import Any, Generic

from pyserve.client.calls import AsyncTransport, Call, Codec, Outputs, StreamCall, T, Transport
from pyserve.client.errors import ClientTimeoutError, ServerUnreachableError
from pyserve.client.grpc_codec import GrpcCodec
from pyserve.client.http_codec import HttpCodec
from pyserve.client.model import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_INFERENCE_TIMEOUT_S,
    DEFAULT_INIT_TIMEOUT_S,
    Headers,
    Parameters,
    RemoteModelConfig,
    build_request,
    parse_url,
    sample_outputs,
)
from pyserve.errors import ModelNotReadyError, PyServeError, UnsupportedError

# How often readiness is asked while waiting for it.
POLL_INTERVAL_S = 0.1


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
    ) -> None:
        self._address = parse_url(url)
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
        self._codec: Codec = HttpCodec() if self._address.scheme == "http" else GrpcCodec()
        self._config: RemoteModelConfig | None = None
        self._connect(self.DEFAULT_MAX_CONNECTIONS if max_connections is None else max_connections)

    def _connect(self, max_connections: int) -> None:
        """Make the transport (connections open on first use; HTTP keeps up to ``max_connections`` alive)."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        """The server's URL, with its scheme (``http://...`` or ``grpc://...``)."""
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
        last = "no answer"
        while True:
            try:
                if (yield Run(self._codec.server_ready(), _left(deadline))):
                    return
                last = "it answers not ready"
            except (ServerUnreachableError, ClientTimeoutError) as exc:
                last = str(exc)
            yield from self._pause(deadline, f"the server at {self._address} was not ready", timeout_s, last)

    def _wait_for_model_flow(self, timeout_s: float) -> Flow[None]:
        deadline = time.monotonic() + timeout_s
        yield from self._wait_for_server_flow(timeout_s)
        last = "no answer"
        while True:
            try:
                if (yield Run(self._codec.model_ready(self._model_name, self._model_version), _left(deadline))):
                    return
                last = "it answers not ready (or unknown)"
            except (ServerUnreachableError, ClientTimeoutError) as exc:
                last = str(exc)
            yield from self._pause(deadline, f"model '{self._model_name}' was not ready", timeout_s, last)

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
        config = yield from self._config_flow()
        if config.decoupled:
            raise UnsupportedError(
                f"model '{config.model_name}' is decoupled (it streams its responses): use DecoupledModelClient "
                "or AsyncioDecoupledModelClient"
            )
        request = build_request(config, self._model_version, inputs, named, parameters, headers, sample)
        outputs: Outputs = yield Run(self._codec.infer(request), self._inference_timeout_s)
        return sample_outputs(config, outputs) if sample else outputs

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
