"""PyTriton's ``pytriton.triton``: ``Triton`` and ``TritonConfig``, over pyserve's ``Serve``.

``Triton`` keeps PyTriton's lifecycle — ``run()``, ``serve()``, ``stop()``, ``is_alive()``, ``connect()``, the
context manager — and its ``bind`` signature, and hands everything to one ``pyserve.Serve`` (``Triton.server``):
the models run as pyserve thread instances in this process, with no tritonserver binary, workspace or proxy
processes. ``RemoteTriton`` binds into a server started elsewhere (another process or host), over
``pyserve.remote.RemoteServe``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from pyserve.config import ModelConfig as PyServeModelConfig
from pyserve.config import Tensor as PyServeTensor
from pyserve.pytriton.model_config import ModelConfig
from pyserve.pytriton.triton_config import TritonConfig, to_serve_config
from pyserve.remote import RemoteServe
from pyserve.serve import Serve

logger = logging.getLogger(__name__)

__all__ = ["RemoteTriton", "Triton", "TritonConfig"]

# PyTriton's serve(monitoring_period_s=...) default; pyserve's serve() watches its core process without polling.
MONITORING_PERIOD_S = 10.0


class Triton:
    """PyTriton's server object: bind Python functions as models, then ``run()`` or ``serve()`` them.

    ``config`` (a ``TritonConfig``) is read over the ``PYTRITON_TRITON_CONFIG_*`` variables, as PyTriton reads it,
    and mapped onto a ``pyserve.ServeConfig`` (``PYSERVE_*`` variables still apply beneath it). ``workspace`` and
    ``triton_lifecycle_policy`` are accepted and unused (pyserve writes no model store); ``security_config`` is
    accepted with a warning: use ``TritonConfig.http_restricted_api`` for what pyserve can restrict.
    """

    server: Serve | RemoteServe

    def __init__(
        self,
        *,
        config: TritonConfig | None = None,
        workspace: Any = None,
        triton_lifecycle_policy: Any = None,
        security_config: Any = None,
    ) -> None:
        merged = TritonConfig.from_env()
        if config is not None:
            merged = config.merged_over(merged)
        if security_config is not None:
            logger.warning(
                "Triton(security_config=...) is not used by pyserve: endpoints are not protected by an access token; "
                "TritonConfig.http_restricted_api restricts the shared-memory endpoints"
            )
        self.config = merged
        self.server = Serve(to_serve_config(merged))
        self._started = False

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[PyServeTensor],
        outputs: Sequence[PyServeTensor],
        model_version: int = 1,
        config: ModelConfig | PyServeModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
    ) -> None:
        """Serve ``infer_func`` (or a list of callables: one instance each) as ``model_name``.

        ``config`` defaults to PyTriton's ``ModelConfig()`` (batching, ``max_batch_size`` 4); a ``pyserve.ModelConfig``
        is taken as it is. Unnamed tensors are named ``INPUT_1``, ... and ``OUTPUT_1``, ... in declared order. On a
        running server the model is loaded at once. ``trace_config`` is server-wide in pyserve
        (``TritonConfig.trace_config``): given here it is ignored with a warning.
        """
        if trace_config is not None:
            logger.warning(
                "bind(trace_config=...) of model '%s' is ignored: pyserve traces server-wide "
                "(TritonConfig.trace_config)",
                model_name,
            )
        if config is None:
            config = ModelConfig()
        served = config.to_pyserve() if isinstance(config, ModelConfig) else config
        self.server.bind(
            model_name,
            infer_func,
            inputs=[_plain(tensor) for tensor in inputs],
            outputs=[_plain(tensor) for tensor in outputs],
            config=served,
            model_version=model_version,
            strict=strict,
        )

    def run(self) -> None:
        """Start the server and load the bound models; returns once they are ready."""
        self._started = True
        self.server.run()

    def connect(self) -> None:
        """Make sure the server runs and every bound model is loaded (PyTriton's ``connect``)."""
        self.run()

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Run, and block until Ctrl+C, SIGTERM or the server's end; then stop."""
        self._started = True
        try:
            self.server.serve()
        finally:
            self._started = False

    def stop(self) -> bool:
        """Stop the server; False when it was not running."""
        if not self._started:
            return False
        self._started = False
        self.server.stop()
        return True

    def is_alive(self) -> bool:
        """Whether the server runs."""
        return self.server.is_running

    def is_connected(self) -> bool:
        """Whether the server was started and runs."""
        return self._started and self.server.is_running

    def __enter__(self) -> Triton:
        try:
            self.run()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _plain(tensor: PyServeTensor) -> PyServeTensor:
    """A PyTriton-ordered Tensor as a plain pyserve Tensor (so the spec compares equal after its wire trip)."""
    if type(tensor) is PyServeTensor or not isinstance(tensor, PyServeTensor):
        return tensor
    return PyServeTensor(tensor.name, tensor.dtype, tensor.shape, tensor.optional)


class RemoteTriton(Triton):
    """PyTriton's remote mode: models of this process bound into a pyserve server running elsewhere.

    ``url`` is the server's HTTP address (``localhost``, ``host:8000``, ``http://host:8000``; port 8000 when none is
    given) or its remote port (``tcp://host:port``). The server must have a remote port open
    (``ServeConfig.remote_port``, ``pyserve serve --remote-port``); ``token`` defaults to ``PYSERVE_REMOTE_TOKEN``,
    which PyTriton code sets instead of changing a line. The models run as threads of this process and are unloaded
    from the server when it stops (``stop()``, the ``with`` block's end). ``workspace`` is accepted and unused.
    """

    def __init__(self, url: str, workspace: Any = None, *, token: str | None = None) -> None:
        self.config = TritonConfig()
        self.server = RemoteServe(url, token=token)
        self._started = False

    def __enter__(self) -> RemoteTriton:
        super().__enter__()
        return self
