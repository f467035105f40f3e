"""Ray instances: the instances of models bound with ``worker="ray"``, run as Ray actors anywhere in a Ray cluster.

``Serve`` loads such a model into its core like a thread-instance model (the core holds no functions for it), then
starts one actor per instance (``pyserve.worker.ray_runner.RayInstance``, with the model's ``ray_actor_options``).
Each actor connects to the core's remote port over tcp (authenticated with the server's remote token) and serves
batches there; Ray restarts a dead actor (``max_restarts``, 3 unless the options say otherwise) and it rejoins by
itself. Ray is the user's: an existing connection (``ray.init(address=...)`` before ``run()``, or ``RAY_ADDRESS``) is
used as it is; with none, a local Ray is started on demand and shut down with the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from pyserve.config import ModelSpec, ServeConfig
from pyserve.errors import ConfigError, ServerError
from pyserve.transport.payload import build_payload

logger = logging.getLogger(__name__)

DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"max_restarts": 3}
_STOP_TIMEOUT_S = 5.0


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "worker='ray' needs Ray: install pyserve with its [ray] extra (pip install -e '.[ray]')"
        ) from None
    return ray


class RayInstances:
    """The Ray actors of one ``Serve`` start, by model version."""

    def __init__(self, session: str) -> None:
        self._session = session
        self._actors: dict[tuple[str, int], list[Any]] = {}
        self._started_ray = False
        self.placements: dict[tuple[str, int], list[dict[str, Any]]] = {}
        """Where each instance runs (node, host, pid, device), by model version, once started."""

    def start(
        self,
        spec: ModelSpec,
        functions: Sequence[Callable[..., Any]],
        address: str,
        token: str,
        config: ServeConfig,
    ) -> None:
        """Start ``spec``'s instances as actors connecting to ``address``; returns once the core accepted them all.
        Raises ``ServerError`` (the actors are killed) when one cannot start."""
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(include_dashboard=False)
            self._started_ray = True
        from pyserve.worker.ray_runner import RayInstance

        options = {**DEFAULT_ACTOR_OPTIONS, **(spec.config.ray_actor_options or {})}
        actor_class = ray.remote(**options)(RayInstance)
        settings = {
            "session": self._session,
            "shm_pool_bytes": config.shm_pool_bytes,
            "debug_errors": config.debug_errors,
        }
        payload = build_payload(spec, functions)
        actors = [
            actor_class.remote(address, token, payload, index, settings) for index in range(spec.config.instances)
        ]
        key = (spec.name, spec.version)
        self._actors[key] = actors
        try:
            errors = ray.get(
                [actor.ready.remote(config.startup_timeout_s) for actor in actors],
                timeout=config.model_load_timeout_s,
            )
            failed = [error for error in errors if error]
            if failed:
                raise ServerError(f"model '{spec.name}': a Ray instance could not start: {failed[0]}")
            self.placements[key] = ray.get([actor.placement.remote() for actor in actors])
        except ServerError:
            self.remove(spec.name, spec.version)
            raise
        except Exception as exc:  # Ray's own errors: an actor that could not be placed or died starting
            self.remove(spec.name, spec.version)
            raise ServerError(f"model '{spec.name}': its Ray instances did not start: {exc}") from None
        for index, placement in enumerate(self.placements[key]):
            logger.info("model '%s' instance %d runs on Ray: %s", spec.name, index, placement)

    def actors(self, name: str, version: int) -> list[Any]:
        """The actor handles of a model version (for tests and tools)."""
        return list(self._actors.get((name, version), ()))

    def remove(self, name: str, version: int) -> None:
        """Stop and kill the actors of a model version."""
        actors = self._actors.pop((name, version), [])
        self.placements.pop((name, version), None)
        if not actors:
            return
        ray = import_ray()
        stopping = [actor.stop.remote() for actor in actors]
        try:
            ray.get(stopping, timeout=_STOP_TIMEOUT_S)
        except Exception as exc:  # an actor already dead or stuck: killed below either way
            logger.debug("Ray instances of '%s' did not stop cleanly: %s", name, exc)
        for actor in actors:
            ray.kill(actor, no_restart=True)

    def stop(self) -> None:
        """Kill every actor; shut down the local Ray this started."""
        for name, version in list(self._actors):
            self.remove(name, version)
        if self._started_ray:
            import_ray().shutdown()
            self._started_ray = False
