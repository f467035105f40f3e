"""Importing a ``model.py``: in this process for an instance (``load_module``), or in a short-lived child process
that reports what the file declares of itself, for auto-complete (``describe``).

``describe`` runs ``python -m pyserve.backends.python_loader --describe MODEL_FILE``; the child imports the file with
``load_module`` and answers in JSON, so the user's code never runs in the calling process (for a repository, the
core). ``pyserve.backends.python`` re-exports ``describe``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import subprocess
import sys
import traceback
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from pyserve.backends import triton_python_backend_utils as pb_utils
from pyserve.config import DynamicBatcher, ModelConfig, Tensor, _batcher_from_wire, _batcher_to_wire
from pyserve.errors import ConfigError
from pyserve.sequence_config import sequence_from_wire, sequence_to_wire

PB_UTILS_MODULE = "triton_python_backend_utils"
DESCRIBE_TIMEOUT_S = 30.0  # how long describe() waits for the child that imports a model.py

logger = logging.getLogger(__name__)


def describe(
    model_file: Path, config_json: Mapping[str, Any] | None = None, *, timeout_s: float = DESCRIBE_TIMEOUT_S
) -> tuple[list[Tensor], list[Tensor], ModelConfig | None] | None:
    """What a model.py declares of itself, for auto-complete; imports the file in a short-lived child process.

    pyserve's form: its module-level ``inputs``, ``outputs`` and ``config``. Triton's form: the configuration its
    ``TritonPythonModel.auto_complete_config`` makes of ``config_json`` (what config.pbtxt says, in Triton's JSON
    form). None when the file declares nothing. The user's code never runs in the calling process (for a repository,
    the core): the child imports it with this process's ``sys.path`` and the file's directory, as an instance does.
    Raises ConfigError with the child's one-line reason when the file cannot be imported or described, or when the
    child has not answered within ``timeout_s`` seconds (it is killed then).
    """
    request = {"config_json": None if config_json is None else dict(config_json), "sys_path": list(sys.path)}
    command = [sys.executable, "-m", "pyserve.backends.python_loader", "--describe", str(model_file)]
    try:
        child = subprocess.run(
            command, input=json.dumps(request), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"model file '{model_file}': describing it passed the timeout of {timeout_s:g} s (importing it, or its "
            "auto_complete_config, did not finish)"
        ) from None
    if child.stderr:
        logger.debug("describing %s, its process wrote:\n%s", model_file, child.stderr.rstrip())
    try:
        answer = json.loads(child.stdout)
    except ValueError:
        last = child.stderr.strip().splitlines()[-1:] or ["(nothing on stderr)"]
        raise ConfigError(
            f"model file '{model_file}': the process describing it exited with code {child.returncode} before "
            f"answering: {last[0]}"
        ) from None
    if "error" in answer:
        logger.debug("describing %s failed:\n%s", model_file, answer["traceback"].rstrip())
        raise ConfigError(answer["error"])
    return _described_from_wire(answer["described"])


def _describe_here(
    model_file: Path, config_json: Mapping[str, Any] | None
) -> tuple[list[Tensor], list[Tensor], ModelConfig | None] | None:
    """``describe``'s work, done in its child process: import the file and read what it declares."""
    try:
        module = load_module(model_file)
    except BaseException as exc:  # a model calling sys.exit() at import fails the same way
        raise ConfigError(f"model file '{model_file}' could not be imported: {type(exc).__name__}: {exc}") from exc
    triton_class = getattr(module, "TritonPythonModel", None)
    if triton_class is not None:
        complete = getattr(triton_class, "auto_complete_config", None)
        if complete is None:
            return None
        given = pb_utils.ModelConfig(config_json or {})
        try:
            completed = complete(given)
        except Exception as exc:
            raise ConfigError(
                f"model file '{model_file}': auto_complete_config failed: {type(exc).__name__}: {exc}"
            ) from exc
        return declared_by(completed.as_dict() if completed is not None else given.as_dict())
    inputs = getattr(module, "inputs", None)
    outputs = getattr(module, "outputs", None)
    config = getattr(module, "config", None)
    if inputs is None and outputs is None and config is None:
        return None
    for kind, tensors in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(tensors, (list, tuple, type(None))) or not all(isinstance(t, Tensor) for t in tensors or ()):
            raise ConfigError(f"model file '{model_file}': '{kind}' must be a list of pyserve.Tensor, got {tensors!r}")
    if config is not None and not isinstance(config, ModelConfig):
        raise ConfigError(f"model file '{model_file}': 'config' must be a pyserve.ModelConfig, got {config!r}")
    return list(inputs or ()), list(outputs or ()), config


def _described_to_wire(described: tuple[list[Tensor], list[Tensor], ModelConfig | None] | None) -> Any:
    """What ``_describe_here`` found, as JSON for the parent (tensors as ``ModelSpec.to_wire`` writes them)."""
    if described is None:
        return None
    inputs, outputs, config = described
    config_doc = None
    if config is not None:
        batcher = None if config.batcher is None else _batcher_to_wire(config.batcher)
        sequences = None if config.sequence_batcher is None else sequence_to_wire(config.sequence_batcher)
        config_doc = {**dataclasses.asdict(config), "batcher": batcher, "sequence_batcher": sequences}
    return {
        "inputs": [[t.name, t.datatype, list(t.shape), t.optional] for t in inputs],
        "outputs": [[t.name, t.datatype, list(t.shape), t.optional] for t in outputs],
        "config": config_doc,
    }


def _described_from_wire(doc: Any) -> tuple[list[Tensor], list[Tensor], ModelConfig | None] | None:
    if doc is None:
        return None
    config_doc = doc["config"]
    config = None
    if config_doc is not None:
        batcher = config_doc["batcher"]
        sequences = config_doc.get("sequence_batcher")
        config = ModelConfig(
            **{
                **config_doc,
                "batcher": None if batcher is None else _batcher_from_wire(batcher),
                "sequence_batcher": None if sequences is None else sequence_from_wire(sequences),
            }
        )
    inputs = [Tensor(n, d, tuple(s), o) for n, d, s, o in doc["inputs"]]
    outputs = [Tensor(n, d, tuple(s), o) for n, d, s, o in doc["outputs"]]
    return inputs, outputs, config


def _describe_main(model_file: str) -> None:
    """The child of ``describe``: reads the request on stdin, writes its answer as JSON on stdout, and exits."""
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # what the model prints goes to stderr, not into the answer
    request = json.load(sys.stdin)
    sys.path.extend(path for path in request["sys_path"] if path not in sys.path)
    try:
        answer = {"described": _described_to_wire(_describe_here(Path(model_file), request["config_json"]))}
    except BaseException as exc:
        reason = str(exc) if isinstance(exc, ConfigError) else f"model file '{model_file}': {type(exc).__name__}: {exc}"
        answer = {"error": " ".join(reason.split()), "traceback": traceback.format_exc()}
    with open(answer_fd, "w") as out:
        json.dump(answer, out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads or atexit hooks the model started do not keep the answer waiting


def load_module(model_file: Path) -> ModuleType:
    """Import a model.py from its path as Triton does: ``triton_python_backend_utils`` is pyserve's, and the
    file's directory is on ``sys.path`` for the file's own imports. Each call imports it anew, under its own name."""
    sys.modules[PB_UTILS_MODULE] = pb_utils
    directory = str(Path(model_file).resolve().parent)
    if directory not in sys.path:
        sys.path.append(directory)
    name = f"_pyserve_model_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"model file '{model_file}' cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def declared_by(doc: Mapping[str, Any]) -> tuple[list[Tensor], list[Tensor], ModelConfig]:
    """The tensors and configuration a Triton JSON configuration declares."""

    def tensors(kind: str) -> list[Tensor]:
        return [
            Tensor(e["name"], e["data_type"], tuple(e.get("dims", (-1,))), bool(e.get("optional", False)))
            for e in doc.get(kind, ())
        ]

    max_batch_size = int(doc.get("max_batch_size", 0))
    batching = doc.get("dynamic_batching")
    options: dict[str, Any] = {
        "max_batch_size": max_batch_size,
        "decoupled": pb_utils.using_decoupled_model_transaction_policy(doc),
        "parameters": {key: value.get("string_value", "") for key, value in doc.get("parameters", {}).items()},
    }
    if max_batch_size > 0:
        options["batcher"] = (
            None
            if batching is None
            else DynamicBatcher(
                max_queue_delay_microseconds=int(batching.get("max_queue_delay_microseconds", 0)),
                preferred_batch_size=tuple(batching.get("preferred_batch_size", ())),
            )
        )
    return tensors("input"), tensors("output"), ModelConfig(**options)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Describe a model.py for auto-complete (run by describe()).")
    parser.add_argument("--describe", metavar="MODEL_FILE", required=True)
    _describe_main(parser.parse_args().describe)
