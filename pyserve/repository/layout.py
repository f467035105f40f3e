"""Where things lie in a Triton-layout model repository: model directories, version directories, model files.

A repository holds one directory per model; a model directory holds ``config.pbtxt`` (optional where the model file
describes its tensors) and one numeric directory per version (``1/model.onnx``). As in Triton, version directories
whose names are not numbers, or start with ``0``, are ignored.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2

CONFIG_FILENAME = "config.pbtxt"

# The file that tells which backend serves a model without a config (Triton's auto-complete of the backend),
# in the order they are tried.
BACKEND_OF_FILE = {
    "model.onnx": "onnxruntime",
    "model.plan": "tensorrt",
    "model.pt": "pytorch",
    "model.py": "python",
}

_VERSION = re.compile(r"^[1-9][0-9]*$")


def list_models(repository: Path) -> list[str]:
    """The sorted names of the model directories in a repository (hidden entries and plain files are skipped)."""
    if not repository.is_dir():
        raise ConfigError(f"model repository {str(repository)!r} is not a directory")
    return sorted(entry.name for entry in repository.iterdir() if entry.is_dir() and not entry.name.startswith("."))


def version_dirs(model_dir: Path) -> list[int]:
    """The versions of a model: its numeric subdirectories, sorted."""
    if not model_dir.is_dir():
        return []
    return sorted(int(entry.name) for entry in model_dir.iterdir() if _VERSION.match(entry.name) and entry.is_dir())


def fingerprint(model_dir: Path) -> str:
    """A digest of every file and directory under ``model_dir`` (path, size, mtime_ns); "" when it does not exist.

    It changes when a file is added, removed, rewritten or touched, which is what polling the repository watches.
    """
    if not model_dir.is_dir():
        return ""
    digest = hashlib.sha256()
    for root, dirs, names in os.walk(model_dir, followlinks=True):
        dirs.sort()
        relative_root = Path(root).relative_to(model_dir)
        digest.update(f"d {relative_root.as_posix()}\n".encode())
        for name in sorted(names):
            path = Path(root) / name
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed while walking (or a dangling link): absent
                continue
            digest.update(f"f {(relative_root / name).as_posix()} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def guess_backend(model_name: str, model_dir: Path, versions: list[int]) -> str:
    """The backend of a model without one configured, from the model file in its version directories."""
    for filename, backend_name in BACKEND_OF_FILE.items():
        if any((model_dir / str(version) / filename).exists() for version in versions):
            return backend_name
    files = ", ".join(BACKEND_OF_FILE)
    raise ConfigError(
        f"model '{model_name}': neither backend nor platform is configured and no model file ({files}) lies in its "
        "version directories to tell the backend from"
    )


def write_model_files(model_name: str, files: Mapping[str, bytes]) -> Path:
    """Write Triton's load-API file override into a fresh temporary directory, which becomes the model directory.

    Keys are paths relative to the model directory (``"1/model.onnx"``, ``"config.pbtxt"``). The caller owns the
    directory returned and removes it when the model is unloaded.
    """
    relative_paths: dict[PurePosixPath, bytes] = {}
    for key, content in files.items():
        relative = PurePosixPath(key)
        if not key or relative.is_absolute() or ".." in relative.parts or key.startswith("\\"):
            raise ConfigError(f"model '{model_name}': file override path {key!r} must be relative to the model dir")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise ConfigError(
                f"model '{model_name}': file override {key!r} must be bytes, got {type(content).__name__}"
            )
        relative_paths[relative] = bytes(content)
    model_dir = Path(tempfile.mkdtemp(prefix="pyserve-model-"))
    for relative, content in relative_paths.items():
        path = model_dir.joinpath(*relative.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return model_dir


def select_versions(model_name: str, policy: model_config_pb2.ModelVersionPolicy, available: list[int]) -> list[int]:
    """The versions a ``version_policy`` selects among the version directories (default: the latest one)."""
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        if not wanted or any(version not in available for version in wanted):
            raise ConfigError(
                f"model '{model_name}': version_policy specific selects versions {wanted}, but the version "
                f"directories are {available}"
            )
        return wanted
    count = policy.latest.num_versions if choice == "latest" else 1
    if count < 1:
        raise ConfigError(f"model '{model_name}': version_policy latest num_versions must be >= 1, got {count}")
    return available[-count:]


def op_libraries(model_dir: Path, filenames: Iterable[str]) -> tuple[str, ...]:
    """Custom-op library paths, relative ones resolved against the model directory; a bare name that is not there
    is left to the dynamic loader's search path (as Triton leaves it)."""
    libraries = []
    for filename in filenames:
        path = Path(filename)
        if not path.is_absolute() and ("/" in filename or (model_dir / path).exists()):
            path = model_dir / path
        libraries.append(str(path))
    return tuple(libraries)
