"""asyncio clients: ``AsyncioModelClient`` and ``AsyncioDecoupledModelClient``, named and behaving as PyTriton's,
with the same logic as the blocking ones (``base``) on aiohttp and grpc.aio."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

from pyserve.client.aio_transports import AsyncGrpcTransport, AsyncHttpTransport
from pyserve.client.base import ClientBase, drive_async
from pyserve.client.calls import AsyncTransport, Outputs
from pyserve.client.model import Headers, Parameters, RemoteModelConfig, sample_outputs

_Client = TypeVar("_Client", bound="_AsyncioClient")


class _AsyncioClient(ClientBase):
    """What both asyncio clients share: everything but inference. Connections open on first use, on the running
    loop; a client belongs to one event loop."""

    DEFAULT_MAX_CONNECTIONS = 100

    def _connect(self, max_connections: int) -> None:
        self._transport: AsyncTransport = (
            AsyncHttpTransport(self._address, self._connect_timeout_s, max_connections)
            if self._address.scheme == "http"
            else AsyncGrpcTransport(self._address)
        )

    async def __aenter__(self: _Client) -> _Client:
        if not self._lazy_init:
            try:
                await drive_async(self._config_flow(), self._transport)
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Unregister and remove the client's shared-memory regions, if any, and close its connections; it cannot
        be used afterwards."""
        try:
            await drive_async(self._close_regions_flow(), self._transport)
        finally:
            await self._transport.close()

    async def wait_for_server(self, timeout_s: float) -> None:
        """Wait until the server answers ready; ClientTimeoutError (naming the last answer) after ``timeout_s``."""
        await drive_async(self._wait_for_server_flow(timeout_s), self._transport)

    async def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and the model answer ready; ClientTimeoutError after ``timeout_s``."""
        await drive_async(self._wait_for_model_flow(timeout_s), self._transport)

    @property
    def model_config(self) -> Awaitable[RemoteModelConfig]:
        """The model's configuration (``await client.model_config``, as in PyTriton), read once."""
        return drive_async(self._config_flow(), self._transport)

    async def load_model(self, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) the model from the server's repository; see ``ModelClient.load_model``."""
        step = self._load_call(config, files)
        self._config = None
        await self._transport.run(step.call, step.timeout_s)

    async def unload_model(self) -> None:
        """Unload the model from the server (explicit model control mode)."""
        step = self._unload_call()
        self._config = None
        await self._transport.run(step.call, step.timeout_s)


class AsyncioModelClient(_AsyncioClient):
    """An asyncio client of one model over HTTP (aiohttp) or gRPC (grpc.aio): ``ModelClient`` with ``async``
    methods, and an async context manager (``async with``) that reads the configuration when ``lazy_init=False``.
    Many calls may run at once (``asyncio.gather``), on up to ``max_connections`` HTTP connections. ``headers`` and
    ``shared_memory`` as for ``ModelClient``."""

    async def infer_sample(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> Outputs:
        """Infer one sample; see ``ModelClient.infer_sample``."""
        flow = self._infer_flow(inputs, named_inputs, parameters, headers, sample=True)
        return await drive_async(flow, self._transport)

    async def infer_batch(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> Outputs:
        """Infer a batch; see ``ModelClient.infer_batch``."""
        flow = self._infer_flow(inputs, named_inputs, parameters, headers, sample=False)
        return await drive_async(flow, self._transport)


class AsyncioDecoupledModelClient(_AsyncioClient):
    """An asyncio client of a decoupled (streaming) model: ``async for response in client.infer_sample(x)``.

    Each response must come within ``inference_timeout_s``. Leaving the loop early (closing the iterator) or
    cancelling the task that reads it cancels the request on the server. It takes no ``shared_memory``.
    """

    TAKES_SHARED_MEMORY = False

    async def infer_sample(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> AsyncIterator[Outputs]:
        """Stream the responses to one sample (batch axis added and removed as by ``ModelClient``)."""
        flow = self._stream_flow(inputs, named_inputs, parameters, headers, sample=True)
        config, call = await drive_async(flow, self._transport)
        responses = self._transport.stream(call, self._inference_timeout_s)
        try:
            async for outputs in responses:
                yield sample_outputs(config, outputs)
        finally:
            await _aclose(responses)

    async def infer_batch(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> AsyncIterator[Outputs]:
        """Stream the responses to a batch."""
        flow = self._stream_flow(inputs, named_inputs, parameters, headers, sample=False)
        _, call = await drive_async(flow, self._transport)
        responses = self._transport.stream(call, self._inference_timeout_s)
        try:
            async for outputs in responses:
                yield outputs
        finally:
            await _aclose(responses)


async def _aclose(responses: AsyncIterator[Outputs]) -> None:
    aclose = getattr(responses, "aclose", None)
    if aclose is not None:
        await aclose()
