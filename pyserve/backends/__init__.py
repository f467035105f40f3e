"""Framework backends: ONNX Runtime, PyTorch, TensorRT and Python models, each run in process instances.

``backend(name)`` imports the backend module for a Triton backend or platform name (the framework itself is
imported only inside the instance that runs the model, or when a model file is read for auto-complete).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import cast

from pyserve.backends.base import Backend, BackendModel, Signature, TensorSignature
from pyserve.errors import ConfigError

__all__ = [
    "Backend",
    "BackendModel",
    "Signature",
    "TensorSignature",
    "backend",
    "backend_for",
    "backend_for_file",
    "backend_names",
]

# Triton's default-max-batch-size: what auto-complete gives a model whose file says it batches.
DEFAULT_MAX_BATCH_SIZE = 4

# Triton backend name -> the module implementing it.
_MODULES = {
    "onnxruntime": "pyserve.backends.onnxruntime",
    "pytorch": "pyserve.backends.pytorch",
    "tensorrt": "pyserve.backends.tensorrt",
    "python": "pyserve.backends.python",
}
# A model file's suffix -> the backend that serves it.
_SUFFIXES = {".onnx": "onnxruntime", ".pt": "pytorch", ".pt2": "pytorch", ".plan": "tensorrt", ".py": "python"}
# Triton platform names -> backend name.
_PLATFORMS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
}


def backend_names() -> tuple[str, ...]:
    """The backend names pyserve serves."""
    return tuple(_MODULES)


def backend_for(backend_name: str, platform: str) -> str:
    """The backend a config names through ``backend`` or ``platform``; ConfigError when neither is known."""
    if backend_name:
        if backend_name not in _MODULES:
            raise ConfigError(
                f"backend '{backend_name}' is not served by pyserve (it serves {', '.join(_MODULES)}; "
                "serve other frameworks as a bound Python function)"
            )
        return backend_name
    if platform in _PLATFORMS:
        return _PLATFORMS[platform]
    raise ConfigError(
        f"platform '{platform}' is not served by pyserve (it serves platforms {', '.join(_PLATFORMS)} and backends "
        f"{', '.join(_MODULES)})"
    )


def backend(name: str) -> Backend:
    """The backend module for a Triton backend name (see ``backend_for`` for platform names)."""
    if name not in _MODULES:
        raise ConfigError(f"backend '{name}' is not served by pyserve (it serves {', '.join(_MODULES)})")
    return cast(Backend, importlib.import_module(_MODULES[name]))


def backend_for_file(path: Path) -> str:
    """The backend for a model file, by its suffix; ConfigError for a suffix no backend serves."""
    name = _SUFFIXES.get(path.suffix)
    if name is None:
        raise ConfigError(
            f"cannot tell the backend of '{path.name}' from its suffix ({', '.join(_SUFFIXES)}); pass backend=..."
        )
    return name
