"""What a process instance is started with: its model's spec and the callable(s) it runs, pickled in one file.

``Serve`` builds it for a model bound with ``worker="process"``, the core's repository for a model read from a
model repository (the callable is then a backend's model object); ``python -m pyserve.worker`` reads it back.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from pyserve.config import ModelSpec, WorkerKind
from pyserve.errors import ConfigError


def build_payload(spec: ModelSpec, functions: Sequence[Callable[..., Any]]) -> bytes:
    """The payload for ``spec``'s process instances; instance ``i`` runs ``functions[i % len(functions)]``."""
    try:
        functions_blob = cloudpickle.dumps(list(functions))
    except Exception as exc:
        raise ConfigError(
            f"model '{spec.name}': the infer function cannot be pickled for "
            f"worker='{WorkerKind(spec.config.worker).value}' ({exc}). "
            "Bind a class instead (the factory form): it is instantiated inside each instance's process, and its "
            "setup(device) method, if any, loads the model there."
        ) from exc
    # The worker extends its sys.path like ours before unpickling, so classes from the user's modules import.
    payload = {"spec": spec.to_wire(), "sys_path": list(sys.path), "functions": functions_blob}
    return cloudpickle.dumps(payload)  # type: ignore[no-any-return]


def read_payload(path: str) -> tuple[ModelSpec, list[Callable[..., Any]]]:
    """The spec and callables of a payload file (extends ``sys.path`` first, as the payload's maker had it)."""
    with open(path, "rb") as handle:
        return load_payload(handle.read())


def load_payload(data: bytes) -> tuple[ModelSpec, list[Callable[..., Any]]]:
    """The spec and callables of a payload (``build_payload``'s bytes)."""
    payload: dict[str, Any] = cloudpickle.loads(data)
    sys.path.extend(path for path in payload["sys_path"] if path not in sys.path)
    functions: list[Callable[..., Any]] = cloudpickle.loads(payload["functions"])
    return ModelSpec.from_wire(payload["spec"]), functions


def error_path(payload_path: str, index: int) -> str:
    """Where instance ``index`` writes why it could not start (the core reads it for the repository index)."""
    return f"{payload_path}.error-{index}"
