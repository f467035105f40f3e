"""Blocking clients: ``ModelClient`` (one response per request) and ``DecoupledModelClient`` (streamed responses),
named and behaving as PyTriton's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from pyserve.client.base import ClientBase, drive
from pyserve.client.calls import Outputs, StreamCall, Transport
from pyserve.client.model import Headers, Parameters, RemoteModelConfig, sample_outputs
from pyserve.client.transports import GrpcTransport, HttpTransport

_Client = TypeVar("_Client", bound="_BlockingClient")


class _BlockingClient(ClientBase):
    """What both blocking clients share: everything but inference."""

    def _connect(self, max_connections: int) -> None:
        self._transport: Transport = (
            HttpTransport(self._address, self._connect_timeout_s, max_connections)
            if self._address.scheme == "http"
            else GrpcTransport(self._address)
        )
        if not self._lazy_init:
            try:
                drive(self._config_flow(), self._transport)
            except BaseException:
                self.close()
                raise

    def __enter__(self: _Client) -> _Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Unregister and remove the client's shared-memory regions, if any, and close its connections; it cannot
        be used afterwards."""
        try:
            drive(self._close_regions_flow(), self._transport)
        finally:
            self._transport.close()

    def wait_for_server(self, timeout_s: float) -> None:
        """Wait until the server answers ready; ClientTimeoutError (naming the last answer) after ``timeout_s``."""
        drive(self._wait_for_server_flow(timeout_s), self._transport)

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and the model answer ready; ClientTimeoutError after ``timeout_s``."""
        drive(self._wait_for_model_flow(timeout_s), self._transport)

    @property
    def model_config(self) -> RemoteModelConfig:
        """The model's configuration, read once (waiting up to ``init_timeout_s`` for the model to be ready)."""
        return drive(self._config_flow(), self._transport)

    @property
    def is_batching_supported(self) -> bool:
        """Whether the model batches (``max_batch_size > 0``), as PyTriton names it."""
        return self.model_config.batching

    def load_model(self, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) the model from the server's repository (explicit model control mode); ``config`` is
        a configuration as JSON text and ``files`` maps paths in the model directory to their content, as
        Triton's load request takes them."""
        step = self._load_call(config, files)
        self._config = None
        self._transport.run(step.call, step.timeout_s)

    def unload_model(self) -> None:
        """Unload the model from the server (explicit model control mode)."""
        step = self._unload_call()
        self._config = None
        self._transport.run(step.call, step.timeout_s)


class ModelClient(_BlockingClient):
    """A blocking client of one model, over HTTP (``http://host:port``, or no scheme) or gRPC (``grpc://``), or
    the same over TLS (``https://``, ``grpcs://``; ``tls=ClientTls(ca_file=...)`` names the authorities to trust
    instead of the system's, and the client's own certificate for mutual TLS).

    ``with ModelClient("localhost:8000", "add_sub") as client: client.infer_sample(a, b)`` returns a dict of
    output name -> numpy array (BYTES outputs as object arrays of bytes). The model's configuration is read on the
    first call (at once with ``lazy_init=False``), waiting up to ``init_timeout_s`` for the server and model to be
    ready; each inference must answer within ``inference_timeout_s`` and each connection open within
    ``connect_timeout_s``. The client may be shared by threads (``max_connections`` are kept alive for them).
    ``headers`` go with every call (HTTP headers, gRPC metadata).

    ``shared_memory``: ``True`` or ``"auto"`` put a large request's tensors in shared-memory regions of the client's
    when the server is on this host (``True`` raises ConfigError for a server elsewhere, and the server's error
    when it refuses a region; ``"auto"`` then sends them over the connection); False, the default, never does.
    """

    def infer_sample(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> Outputs:
        """Infer one sample: inputs by position (the model's input order) or by name, without the batch axis; the
        client adds it when the model batches, and removes it from the outputs. ``parameters`` go to the model
        (``priority``, and ``timeout`` in microseconds, are the scheduler's, as in Triton); ``headers`` are sent
        as HTTP headers or gRPC metadata."""
        return drive(self._infer_flow(inputs, named_inputs, parameters, headers, sample=True), self._transport)

    def infer_batch(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> Outputs:
        """Infer a batch (the first axis of every input); as ``infer_sample`` otherwise. A model that does not
        batch raises UnsupportedError."""
        return drive(self._infer_flow(inputs, named_inputs, parameters, headers, sample=False), self._transport)


class DecoupledModelClient(_BlockingClient):
    """A blocking client of a decoupled (streaming) model: ``infer_sample`` and ``infer_batch`` return iterators
    of responses. Over gRPC each request is one ``ModelStreamInfer`` call; over HTTP it is a ``generate_stream``
    request (inputs as JSON: one row per variable dimension, no FP16/BF16; gRPC carries any tensor).

    Inputs are checked and the model's configuration read when the method is called; the request is sent when
    iteration starts. Each response must come within ``inference_timeout_s``; closing the iterator early (or
    leaving the ``for`` loop) cancels the request on the server. It takes no ``shared_memory``.
    """

    TAKES_SHARED_MEMORY = False

    def infer_sample(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> Iterator[Outputs]:
        """Stream the responses to one sample (batch axis added and removed as by ``ModelClient``)."""
        flow = self._stream_flow(inputs, named_inputs, parameters, headers, sample=True)
        config, call = drive(flow, self._transport)
        return self._responses(config, call, sample=True)

    def infer_batch(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> Iterator[Outputs]:
        """Stream the responses to a batch."""
        config, call = drive(
            self._stream_flow(inputs, named_inputs, parameters, headers, sample=False), self._transport
        )
        return self._responses(config, call, sample=False)

    def _responses(self, config: RemoteModelConfig, call: StreamCall[Outputs], sample: bool) -> Iterator[Outputs]:
        responses = self._transport.stream(call, self._inference_timeout_s)
        try:
            for outputs in responses:
                yield sample_outputs(config, outputs) if sample else outputs
        finally:
            close = getattr(responses, "close", None)
            if close is not None:
                close()
