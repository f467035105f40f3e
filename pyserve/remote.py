"""``RemoteServe``: bind Python functions into a pyserve server that runs elsewhere (another process or host).

The server opens a remote port (``ServeConfig.remote_port`` with a ``remote_token``); ``RemoteServe(url, token=...)``
finds it (``url`` is the server's HTTP address, which names the remote port at ``GET /v2/pyserve/remote``, or the
remote port's own ``tcp://host:port``), authenticates with the token (ZeroMQ CURVE: authenticated and encrypted),
loads each bound model there and runs its instances as threads of this process. Requests reach them through the
server's front ends, batched and scheduled by its core like any model; tensors travel in the messages (no shared
memory across hosts). ``stop()`` (or leaving the ``with`` block) unloads them again; if this process dies, the server
notices the closed connections and unloads them itself.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import orjson
import zmq
from zmq.utils.monitor import recv_monitor_message

from pyserve.config import ModelConfig, ModelSpec, ServeConfig, Tensor, WorkerKind
from pyserve.core_process import ControlChannel
from pyserve.errors import ConfigError, ModelAlreadyBoundError, ServerError
from pyserve.serve import bound_model
from pyserve.thread_instances import CoreLink, ThreadInstances
from pyserve.transport.curve import TOKEN_ENV, check_token
from pyserve.transport.protocol import Load, Unload
from pyserve.worker.remote_session import SessionPinger

if TYPE_CHECKING:  # pyserve.client is not imported with pyserve (tls= takes its ClientTls)
    from pyserve.client.tls import ClientTls

logger = logging.getLogger(__name__)

REMOTE_PATH = "/v2/pyserve/remote"
"""The HTTP path where a server names its remote port: ``{"address": "tcp://host:port"}``."""

_DETACH_TIMEOUT_S = 5.0
_MONITOR_POLL_MS = 200  # how often serve() looks whether stop() was called
_HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_DISCONNECTED
)


@dataclasses.dataclass(eq=False)
class _RemoteModel:
    spec: ModelSpec
    functions: list[Callable[..., Any]]
    loaded: bool = False


class RemoteServe:
    """Models of this process attached to a running pyserve server: ``with RemoteServe(url, token=t) as r:
    r.bind(...); r.serve()``.

    ``token`` defaults to ``PYSERVE_REMOTE_TOKEN``; ``tls`` says whom to trust when ``url`` is an ``https://`` one
    (the remote port itself is encrypted and authenticated with the token, whatever the HTTP port serves).
    ``config`` supplies the instances' settings (``debug_errors``, ``startup_timeout_s``, ``model_load_timeout_s``,
    and ``exit_timeout_s``: how long ``stop()`` lets requests already accepted finish); its addresses are not used.
    Models run as thread instances of this process (``ModelConfig.instances`` threads, or one per callable in a list).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        config: ServeConfig | None = None,
        timeout_s: float = 30.0,
        tls: ClientTls | None = None,
    ) -> None:
        token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        if not token:
            raise ConfigError(f"RemoteServe needs the server's remote token: pass token= or set {TOKEN_ENV}")
        check_token(token)
        self.url = url
        self.config = config if config is not None else ServeConfig()
        self.timeout_s = timeout_s
        self.tls = tls
        self._token = token
        self._models: dict[tuple[str, int], _RemoteModel] = {}
        self._control: ControlChannel | None = None
        self._monitor: zmq.Socket[Any] | None = None
        # serve() polls the monitor in one thread while stop() may come from another: the socket is closed only
        # between polls (ZeroMQ sockets are not thread-safe).
        self._monitor_lock = threading.Lock()
        self._stop_lock = threading.Lock()
        self._stop_event = threading.Event()
        self._session = f"pyserve-remote-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._threads = ThreadInstances(self._stop_event, self._session)
        self._pinger: SessionPinger | None = None
        self.address = ""

    # public API -----------------------------------------------------------------------------------------------

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
        model_version: int = 1,
        strict: bool = False,
    ) -> None:
        """Serve ``infer_func`` as ``model_name`` on the remote server (``Serve.bind``'s arguments). Before ``run()``
        the model is recorded; when attached, it is loaded at once."""
        spec, functions = bound_model(model_name, infer_func, inputs, outputs, config, model_version, strict)
        if spec.config.worker is not WorkerKind.THREAD:
            raise ConfigError(
                f"model '{model_name}': RemoteServe runs its models' functions in this process (thread instances); "
                "worker='process' is for models bound to a local Serve"
            )
        key = (model_name, model_version)
        if key in self._models:
            raise ModelAlreadyBoundError(f"model '{model_name}' version {model_version} is already bound")
        model = _RemoteModel(spec, functions)
        self._models[key] = model
        if self._control is not None:
            try:
                self._load(model)
            except BaseException:
                self._models.pop(key, None)
                raise

    def run(self) -> RemoteServe:
        """Attach to the server and load every bound model; returns once they are ready there."""
        if self._control is None:
            self._stop_event.clear()
            self._attach()
        for model in list(self._models.values()):
            if not model.loaded:
                self._load(model)
        return self

    def serve(self) -> None:
        """Run and block until Ctrl+C, SIGTERM or the server goes away; then stop."""
        self.run()
        handled = (signal.SIGINT, signal.SIGTERM)
        in_main = threading.current_thread() is threading.main_thread()
        previous = {signum: signal.getsignal(signum) for signum in handled} if in_main else {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt

        for signum in previous:
            signal.signal(signum, on_signal)
        try:
            self._wait_disconnected()
            if not self._stop_event.is_set():
                logger.error("the server at %s closed the connection; stopping", self.address)
        except KeyboardInterrupt:
            pass
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.stop()

    def stop(self) -> None:
        """Detach gracefully: the server takes no new requests for this process's models, those it accepted finish
        here (at most ``config.exit_timeout_s``), then the instances stop. Idempotent, and safe from any thread
        (``serve()`` in one, ``stop()`` from another)."""
        with self._stop_lock:
            self._stop()

    def _stop(self) -> None:
        control = self._control
        if control is None:
            return
        drain_s = self.config.exit_timeout_s
        for model in self._models.values():
            if model.loaded:
                spec = model.spec
                try:
                    control.request(
                        partial(Unload.build, spec.name, spec.version, drain_s=drain_s), drain_s + _DETACH_TIMEOUT_S
                    )
                except ServerError as exc:
                    logger.warning("could not unload model '%s' from %s: %s", spec.name, self.address, exc)
                model.loaded = False
        self._stop_event.set()
        self._threads.wake()
        self._threads.join()
        if self._pinger is not None:
            self._pinger.join()
            self._pinger = None
        with self._monitor_lock:
            if self._monitor is not None:
                self._monitor.close(linger=0)
                self._monitor = None
        control.close()
        self._control = None

    @property
    def is_running(self) -> bool:
        """Whether this process is attached to the server."""
        return self._control is not None

    def __enter__(self) -> RemoteServe:
        try:
            return self.run()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # internals ------------------------------------------------------------------------------------------------

    def _attach(self) -> None:
        address = resolve_remote_address(self.url, self.timeout_s, self.tls)
        control = ControlChannel(address, f"the server at {address}", self._token, f"{self._session}/control".encode())
        self._control = control
        self.address = address
        self._monitor = control.monitor(_HANDSHAKE_EVENTS)
        self._wait_handshake()
        self._pinger = SessionPinger(address, self._token, self._session, self._stop_event)
        self._pinger.start()

    def _wait_handshake(self) -> None:
        """Wait until the CURVE handshake succeeded; a refused handshake is a wrong token (or not a pyserve
        remote port)."""
        assert self._monitor is not None
        deadline_ms = int(self.timeout_s * 1000)
        failures = 0
        while self._monitor.poll(deadline_ms):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return
            failures += 1
            if failures >= 2:  # one failure may be a connection cut short; two is the server refusing us
                break
        self.stop()
        raise ServerError(
            f"could not authenticate with the server at {self.address}: "
            + ("it refused the handshake (is the remote token the server's?)" if failures else "no answer in time")
        )

    def _wait_disconnected(self) -> None:
        """Block until the control connection closes (the server stopped or went away) or ``stop()``."""
        while not self._stop_event.is_set():
            with self._monitor_lock:
                monitor = self._monitor
                if monitor is None:
                    return
                if monitor.poll(_MONITOR_POLL_MS) and recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
                    return

    def _load(self, model: _RemoteModel) -> None:
        assert self._control is not None
        spec = model.spec
        reply = self._control.request(lambda rid: Load.build(spec, rid), self.config.model_load_timeout_s)
        if reply.error is not None:
            raise ConfigError(reply.error)
        link = CoreLink(self.address, remote_token=self._token, remote_session=self._session)
        try:
            self._threads.start(spec, model.functions, link, self.config)
        except BaseException:
            self._control.request(partial(Unload.build, spec.name, spec.version), _DETACH_TIMEOUT_S)
            raise
        model.loaded = True


def resolve_remote_address(url: str, timeout_s: float, tls: ClientTls | None = None) -> str:
    """The ``tcp://`` address of a server's remote port: ``url`` itself, or what its HTTP front end names (an
    ``https://`` one trusting ``tls``'s authorities, else the system's)."""
    if url.startswith("tcp://"):
        return url
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    # Triton's HTTP port when none is given, as tritonclient and PyTriton assume.
    netloc = parsed.netloc if parsed.port is not None else f"{parsed.netloc}:8000"
    base = f"{parsed.scheme}://{netloc}"
    try:
        context = tls.ssl_context() if tls is not None else None
        with urllib.request.urlopen(base.rstrip("/") + REMOTE_PATH, timeout=timeout_s, context=context) as response:
            address: str = orjson.loads(response.read())["address"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ServerError(
                f"the server at {base} does not accept remote models: start it with a remote port "
                "(ServeConfig.remote_port, `pyserve serve --remote-port`)"
            ) from None
        raise ServerError(f"the server at {base} answered {exc.code} for {REMOTE_PATH}") from None
    except (OSError, ValueError, KeyError) as exc:
        raise ServerError(f"could not ask {base} for its remote port: {exc}") from None
    return address
