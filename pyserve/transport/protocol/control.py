"""Serve's control requests to the core and their replies: ``load``, ``load_ensemble``, ``unload``, ``serving``,
``shutdown``; ``ok`` / ``error``."""

from __future__ import annotations

from typing import Any

from pyserve.config import ModelSpec
from pyserve.transport.protocol.message import Header, Message, MessageKind


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
    """Serve -> core: unload a model version. At once (``drain_s`` 0: its queued requests fail, its instances stop),
    or gracefully: it takes no new requests, what it accepted finishes (at most ``drain_s``), then its instances stop
    and the reply comes."""

    __slots__ = ("drain_s", "name", "version")
    KIND = MessageKind.UNLOAD

    name: str
    version: int
    drain_s: float

    def __init__(self, header: Header) -> None:
        super().__init__(header)
        self.name = header["name"]
        self.version = header["version"]
        drain_s = header.get("drain", 0.0)
        self.drain_s = float(drain_s) if isinstance(drain_s, (int, float)) and drain_s > 0 else 0.0

    @staticmethod
    def build(name: str, version: int, request_id: int, drain_s: float = 0.0) -> Header:
        """The message (fields: see the class)."""
        header: Header = {"t": "unload", "name": name, "version": version, "rid": request_id}
        if drain_s > 0:
            header["drain"] = drain_s
        return header


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


class OpenRemote(ControlRequest):
    """Serve -> core: open the remote port now (for Ray instances bound on a running server) with this token; the
    reply's value is its address. Answered at once when it is open already."""

    __slots__ = ("token",)
    KIND = MessageKind.OPEN_REMOTE

    token: str
    """The shared secret remote peers authenticate with (``pyserve.transport.curve``)."""

    def __init__(self, header: Header) -> None:
        super().__init__(header)
        self.token = header["token"]

    @staticmethod
    def build(token: str, request_id: int) -> Header:
        """The message (fields: see the class)."""
        return {"t": "open_remote", "token": token, "rid": request_id}


class Ping(Message):
    """remote peer -> core: this peer is alive (``RemoteServe`` sends one a second; ``pyserve.core.remote_peers``
    drops a peer that stays silent). No reply."""

    __slots__ = ()
    KIND = MessageKind.PING

    @staticmethod
    def build() -> Header:
        """The message (no fields)."""
        return {"t": "ping"}


class ControlReply(Message):
    """core -> Serve: the answer to a control request, ``ok`` or ``error``."""

    __slots__ = ("error", "request_id", "value")

    request_id: int
    """The id of the request answered."""
    error: str | None
    """Why the request failed; None when it succeeded."""
    value: str
    """What a successful request answers, where it answers something (``open_remote``: the address); else ""."""

    def __init__(self, header: Header) -> None:
        self.request_id = header["rid"]
        self.error = header["message"] if header["t"] == "error" else None
        self.value = header.get("v", "")

    @staticmethod
    def build_ok(request_id: int, value: str = "") -> Header:
        """The request succeeded (``value``: what it answers, if anything)."""
        header: Header = {"t": "ok", "rid": request_id}
        if value:
            header["v"] = value
        return header

    @staticmethod
    def build_error(request_id: int, message: str) -> Header:
        """The request failed; ``message`` says why."""
        return {"t": "error", "rid": request_id, "message": message}
