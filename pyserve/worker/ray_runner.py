"""One instance of a model as a Ray actor: the body ``pyserve.ray_instances`` turns into an actor class.

The actor runs pyserve's instance loop (``InstanceRunner``) on a thread of its own and connects to the core's remote
port like any remote peer (``pyserve.core.remote_peers``): CURVE with the server's token, tensors inline, a session
of its own that it pings. Ray places it (``ray_actor_options``) and restarts it when it dies (``max_restarts``): a
restart runs ``__init__`` again, which connects a fresh session, so the instance rejoins its model by itself, and
the core drops the dead session's instance when its connection closes.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from typing import Any

from pyserve.transport.payload import load_payload
from pyserve.worker.instance import InstanceRunner
from pyserve.worker.remote_session import SessionPinger


class RayInstance:
    """Instance ``index`` of the model in ``payload``, connected to the server at ``address``.

    ``settings``: ``session`` (the Serve's session, a prefix), ``shm_pool_bytes``, ``debug_errors``.
    """

    def __init__(self, address: str, token: str, payload: bytes, index: int, settings: dict[str, Any]) -> None:
        spec, functions = load_payload(payload)
        self._device = _device()
        self._node = _node_id()
        session = f"{settings['session']}-ray-{spec.name}-{index}-{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._ready = threading.Event()
        self._error: str | None = None
        runner = InstanceRunner(
            address,
            spec,
            functions[index % len(functions)],
            index,
            session,
            sys.maxsize,  # no shared memory with the core: every tensor inline
            int(settings.get("shm_pool_bytes", 1 << 20)),
            device=self._device,
            debug_errors=bool(settings.get("debug_errors", False)),
            remote_token=token,
            routing_id=f"{session}/{spec.name}/{index}".encode(),
            kind="ray",
            node=self._node,
        )
        self._thread = threading.Thread(
            target=runner.run, args=(self._stop, self._on_ready, (self._wake_read,)), name="pyserve-ray", daemon=True
        )
        self._thread.start()
        self._pinger = SessionPinger(address, token, session, self._stop)
        self._pinger.start()

    def _on_ready(self, error: str | None) -> None:
        self._error = error
        self._ready.set()

    def ready(self, timeout_s: float) -> str | None:
        """Wait until the core accepted the instance: None, or why it could not start."""
        if not self._ready.wait(timeout_s):
            return f"the instance did not connect to the core within {timeout_s} s"
        return self._error

    def placement(self) -> dict[str, Any]:
        """Where Ray put this instance: node, host, process and device."""
        return {
            "node_id": self._node,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": self._device,
        }

    def stop(self) -> None:
        """Leave the core and end the instance's thread (the actor is killed after)."""
        self._stop.set()
        os.close(self._wake_write)  # wakes the idle loop: end-of-file on its wake pipe
        self._thread.join(5.0)
        self._pinger.join()


def _node_id() -> str:
    """The Ray node the actor runs on."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _device() -> str:
    """The actor's device: its first GPU as Ray assigned it (``num_gpus``), else the CPU."""
    import ray

    # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPUs, so the first one is cuda:0 inside the actor.
    return "cuda:0" if ray.get_gpu_ids() else "cpu"
