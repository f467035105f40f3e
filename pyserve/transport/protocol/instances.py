"""An instance joining and leaving: ``hello``, ``welcome``, ``refused``, ``stop``, ``bye``."""

from __future__ import annotations

from pyserve.transport.protocol.message import Header, Message, MessageKind


class Hello(Message):
    """instance -> core: the first message of an instance, which serves one model version."""

    __slots__ = ("device", "host", "instance_index", "instance_kind", "model", "node", "pid", "shm_prefix", "version")
    KIND = MessageKind.HELLO

    model: str
    version: int
    instance_index: int
    """The instance's index among its model's instances."""
    instance_kind: str
    """"thread", "process" or "ray" (a remote peer's instances are remote to the core whatever they say)."""
    pid: int
    """The process the instance runs in."""
    shm_prefix: str
    """The name prefix of the instance's shared-memory segments (its outputs)."""
    host: str
    """The host name of the machine it runs on ("" from an instance that does not say)."""
    node: str
    """The cluster node it runs on (a Ray node id); "" outside a cluster."""
    device: str
    """The device its ``setup`` was given ("cpu", "cuda:0", ...); "" from an instance that does not say."""

    def __init__(self, header: Header) -> None:
        self.model = header["model"]
        self.version = header["version"]
        self.instance_index = header["instance"]
        self.instance_kind = header["kind"]
        self.pid = header["pid"]
        self.shm_prefix = header["shm_prefix"]
        self.host = str(header.get("host", ""))
        self.node = str(header.get("node", ""))
        self.device = str(header.get("device", ""))

    @staticmethod
    def build(
        model: str,
        version: int,
        instance_index: int,
        instance_kind: str,
        pid: int,
        shm_prefix: str,
        host: str = "",
        node: str = "",
        device: str = "",
    ) -> Header:
        """The message (fields: see the class)."""
        return {
            "t": "hello",
            "model": model,
            "version": version,
            "instance": instance_index,
            "kind": instance_kind,
            "pid": pid,
            "shm_prefix": shm_prefix,
            "host": host,
            "node": node,
            "device": device,
        }


class Welcome(Message):
    """core -> instance: accepted; from now on it receives batches."""

    __slots__ = ("cancel_address",)
    KIND = MessageKind.WELCOME

    cancel_address: str
    """Where the core publishes ``CancelNotice``s; "" when it does not."""

    def __init__(self, header: Header) -> None:
        self.cancel_address = header.get("cancel") or ""

    @staticmethod
    def build(cancel_address: str) -> Header:
        """The message (fields: see the class)."""
        return {"t": "welcome", "cancel": cancel_address}


class Refused(Message):
    """core -> instance: not accepted (its model version is not loaded); the instance stops."""

    __slots__ = ("message",)
    KIND = MessageKind.REFUSED

    message: str
    """Why."""

    def __init__(self, header: Header) -> None:
        self.message = header["message"]

    @staticmethod
    def build(message: str) -> Header:
        """The message (fields: see the class)."""
        return {"t": "refused", "message": message}


class Stop(Message):
    """core -> instance: stop serving (its model version was unloaded)."""

    __slots__ = ()
    KIND = MessageKind.STOP

    @staticmethod
    def build() -> Header:
        """The message (it has no fields)."""
        return {"t": "stop"}


class Bye(Message):
    """instance -> core: the instance leaves; its batches in flight fail."""

    __slots__ = ()
    KIND = MessageKind.BYE

    @staticmethod
    def build() -> Header:
        """The message (it has no fields)."""
        return {"t": "bye"}
