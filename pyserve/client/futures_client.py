"""``FuturesModelClient``: PyTriton's concurrent.futures client, a bounded thread pool around one ``ModelClient``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from pyserve.client.calls import Outputs
from pyserve.client.model import Headers, Parameters, RemoteModelConfig
from pyserve.client.model_client import ModelClient
from pyserve.client.shared_memory import SharedMemoryOption
from pyserve.client.tls import ClientTls
from pyserve.errors import ClientClosedError, ConfigError, QueueFullError

R = TypeVar("R")
DEFAULT_MAX_WORKERS = 128
DEFAULT_MAX_QUEUE_SIZE = 128


class FuturesModelClient:
    """Calls of one model run on up to ``max_workers`` threads; each method returns a ``concurrent.futures.Future``.

    At most ``max_queue_size`` calls wait for a free thread: a further call blocks until one is taken, or, with
    ``non_blocking=True``, raises QueueFullError. The threads share one ``ModelClient`` (one connection per thread
    over HTTP, one channel over gRPC, and its shared-memory regions); ``close()`` waits for the calls already made,
    unless ``wait=False``. ``headers``, ``shared_memory`` and ``tls`` as for ``ModelClient``.
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | int | None = None,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
        non_blocking: bool = False,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        headers: Headers | None = None,
        shared_memory: SharedMemoryOption = False,
        tls: ClientTls | None = None,
    ) -> None:
        if max_workers < 1 or max_queue_size < 0:
            raise ConfigError(
                f"FuturesModelClient needs max_workers >= 1 and max_queue_size >= 0, got {max_workers} and "
                f"{max_queue_size}"
            )
        self._client = ModelClient(
            url,
            model_name,
            model_version,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_connections=max_workers,
            headers=headers,
            shared_memory=shared_memory,
            tls=tls,
        )
        self._max_workers = max_workers
        self._max_queue_size = max_queue_size
        self._non_blocking = non_blocking
        self._slots = threading.BoundedSemaphore(max_workers + max_queue_size)
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> FuturesModelClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, wait: bool = True) -> None:
        """Stop taking calls and close the connections, after the calls already made unless ``wait=False``
        (those still waiting for a thread are then cancelled)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            executor = self._executor
        if executor is not None:
            executor.shutdown(wait=wait, cancel_futures=not wait)
        self._client.close()

    def wait_for_server(self, timeout_s: float) -> Future[None]:
        """A future done when the server answers ready (ClientTimeoutError after ``timeout_s``)."""
        return self._submit(self._client.wait_for_server, timeout_s)

    def wait_for_model(self, timeout_s: float) -> Future[None]:
        """A future done when the server and the model answer ready (ClientTimeoutError after ``timeout_s``)."""
        return self._submit(self._client.wait_for_model, timeout_s)

    def model_config(self) -> Future[RemoteModelConfig]:
        """A future of the model's configuration (a method here, as in PyTriton)."""
        return self._submit(lambda: self._client.model_config)

    def infer_sample(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> Future[Outputs]:
        """A future of ``ModelClient.infer_sample``'s result."""
        return self._submit(
            lambda: self._client.infer_sample(*inputs, parameters=parameters, headers=headers, **named_inputs)
        )

    def infer_batch(
        self,
        *inputs: Any,
        parameters: Parameters | None = None,
        headers: Headers | None = None,
        **named_inputs: Any,
    ) -> Future[Outputs]:
        """A future of ``ModelClient.infer_batch``'s result."""
        return self._submit(
            lambda: self._client.infer_batch(*inputs, parameters=parameters, headers=headers, **named_inputs)
        )

    def load_model(self, config: str | None = None, files: Mapping[str, bytes] | None = None) -> Future[None]:
        """A future done when the model is loaded; see ``ModelClient.load_model``."""
        return self._submit(self._client.load_model, config, files)

    def unload_model(self) -> Future[None]:
        """A future done when the model is unloaded."""
        return self._submit(self._client.unload_model)

    def _submit(self, function: Callable[..., R], *args: Any) -> Future[R]:
        if not self._slots.acquire(blocking=not self._non_blocking):
            raise QueueFullError(
                f"FuturesModelClient of model '{self._client.model_name}': {self._max_workers} calls running and "
                f"{self._max_queue_size} waiting (max_queue_size)"
            )
        try:
            with self._lock:
                if self._closed:
                    raise ClientClosedError(f"the FuturesModelClient of model '{self._client.model_name}' is closed")
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self._max_workers, thread_name_prefix="pyserve-client")
                future = self._executor.submit(function, *args)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future
