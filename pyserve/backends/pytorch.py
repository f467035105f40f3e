"""The PyTorch backend: a TorchScript module (``model.pt``) or a ``torch.export`` program (``model.pt2``).

Tensors map onto ``forward`` as in Triton's pytorch backend: names ending in ``__<index>`` (``INPUT__0``,
``OUTPUT__1``) by position, any other input name by ``forward``'s argument of that name, any other output name by
the key of the dict ``forward`` returns (or the one tensor it returns, for a model with one output). The model runs
under ``torch.inference_mode()``; arrays become tensors without a copy where numpy and torch can share memory.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyserve.backends.base import BackendModel, Signature
from pyserve.backends.common import (
    TORCH_DTYPE_NAMES,
    Arrays,
    BatchRunner,
    parse_device,
    sequence_tensors,
    to_numpy,
    to_torch,
)
from pyserve.backends.open import open_torch_export, open_torchscript
from pyserve.errors import ConfigError, InvalidInputError, OutputMismatchError
from pyserve.request import Request

NAME = "pytorch"
PLATFORMS = ("pytorch_libtorch",)
DEFAULT_MODEL_FILENAME = "model.pt"
# A torch.export program; served in place of model.pt when that is missing.
EXPORT_MODEL_FILENAME = "model.pt2"

logger = logging.getLogger(__name__)

_INDEXED = re.compile(r"^.+__(\d+)$")
_TRUE = ("1", "true", "yes", "on")


def model_path(model: BackendModel) -> Path:
    """The file to load: ``model_file``, or the ``.pt2`` beside a missing ``.pt`` file; ConfigError if neither."""
    path = model.model_file
    if not path.is_file() and path.suffix == ".pt" and path.with_suffix(".pt2").is_file():
        path = path.with_suffix(".pt2")
    if not path.is_file():
        raise ConfigError(f"model '{model.spec.name}': model file {model.model_file} does not exist")
    return path


def positions(names: Sequence[str]) -> dict[str, int] | None:
    """Each name's index when every name follows the ``<name>__<index>`` convention, else None."""
    matches = [_INDEXED.match(name) for name in names]
    if not names or not all(matches):
        return None
    return {name: int(match.group(1)) for name, match in zip(names, matches, strict=True) if match}


class TorchModel:
    """One instance of a PyTorch model: ``setup(device)`` loads it there, calls run request batches."""

    def __init__(self, model: BackendModel) -> None:
        self.model = model
        self._module: Any = None
        self._device: Any = None
        self._arguments: tuple[str, ...] = ()
        # forward() returning one bare tensor answers the model's only output (state outputs count: sequence_batching).
        self._single_output = len(model.spec.outputs) + len(sequence_tensors(model)[1]) == 1
        self._contexts: tuple[Any, ...] = ()
        self._runner: BatchRunner | None = None

    def __getstate__(self) -> dict[str, Any]:
        # What travels to a process instance: the description, never a loaded module.
        return {**self.__dict__, "_module": None, "_device": None, "_contexts": (), "_runner": None}

    def setup(self, device: str) -> None:
        """Load the model onto ``device`` (custom-op libraries first) and map the tensors onto ``forward``."""
        import torch

        parse_device(device)
        parameters = self.model.parameters
        _set_threads(torch, self.model.spec.name, parameters)
        if _flag(parameters, "DISABLE_CUDNN"):
            torch.backends.cudnn.enabled = False
        path = model_path(self.model)
        libraries = self.model.op_libraries
        if path.suffix == ".pt2":
            module = open_torch_export(path, device, op_libraries=libraries)
            arguments = tuple(inspect.signature(module.forward).parameters)
        else:
            module = open_torchscript(path, device, op_libraries=libraries)
            arguments = tuple(argument.name for argument in module.forward.schema.arguments[1:])
        self._arguments = self._input_order(arguments)
        inference = parameters.get("INFERENCE_MODE", "true").strip().lower() in _TRUE
        contexts: list[Any] = [torch.inference_mode if inference else torch.no_grad]
        if path.suffix != ".pt2" and _flag(parameters, "DISABLE_OPTIMIZED_EXECUTION"):
            optimized_execution = torch.jit.optimized_execution  # type: ignore[attr-defined]
            contexts.append(lambda: optimized_execution(False))
        self._contexts = tuple(contexts)
        self._module = module
        self._device = torch.device(device)
        self._runner = BatchRunner(self.model, self._run)

    def _input_order(self, arguments: tuple[str, ...]) -> tuple[str, ...]:
        """The declared inputs in the order ``forward`` takes them."""
        spec = self.model.spec
        # A stateful model's control and state inputs are forward() arguments too (sequence_batching).
        names = [t.name for t in (*spec.inputs, *sequence_tensors(self.model)[0])]
        indexed = positions(names)
        if indexed is not None:
            if sorted(indexed.values()) != list(range(len(names))):
                raise ConfigError(f"model '{spec.name}': indexed inputs {names} must number 0..{len(names) - 1}")
            return tuple(sorted(names, key=indexed.__getitem__))
        unknown = [name for name in names if name not in arguments]
        if unknown:
            raise ConfigError(
                f"model '{spec.name}': inputs {unknown} are neither forward() arguments ({', '.join(arguments)}) "
                "nor named <name>__<index>"
            )
        order = tuple(name for name in arguments if name in names)
        if order != arguments[: len(order)]:
            raise ConfigError(
                f"model '{spec.name}': declared inputs {list(order)} must be the first arguments of forward "
                f"({', '.join(arguments)})"
            )
        return order

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        if self._runner is None:
            raise RuntimeError("TorchModel.setup(device) must run before the model is called")
        return self._runner(requests)

    def _run(self, inputs: Arrays, names: tuple[str, ...]) -> Arrays:
        args = []
        for name in self._arguments:
            if name not in inputs:
                break
            args.append(to_torch(inputs[name], self._device))
        if len(args) != len(inputs):
            missing = [name for name in self._arguments[: len(inputs)] if name not in inputs]
            raise InvalidInputError(f"model '{self.model.spec.name}': forward() needs inputs {missing} before others")
        with contextlib.ExitStack() as stack:
            for context in self._contexts:
                stack.enter_context(context())
            result = self._module(*args)
        return {name: to_numpy(self._output(result, name)) for name in names}

    def _output(self, result: Any, name: str) -> Any:
        """The tensor of output ``name`` in what forward() returned."""
        import torch

        index = positions((name,))
        found: Any = None
        if index is not None:
            position = index[name]
            if isinstance(result, (tuple, list)) and position < len(result):
                found = result[position]
            elif position == 0 and isinstance(result, torch.Tensor):
                found = result
        elif isinstance(result, Mapping):
            found = result.get(name)
        elif self._single_output:
            found = result
        if not isinstance(found, torch.Tensor):
            raise OutputMismatchError(
                f"model '{self.model.spec.name}' output '{name}': no tensor for it in what forward() returned "
                f"({_describe(result)})"
            )
        return found


def _describe(result: Any) -> str:
    if isinstance(result, Mapping):
        return f"a dict with keys {sorted(result)}"
    if isinstance(result, (tuple, list)):
        return f"a {type(result).__name__} of {len(result)}"
    return type(result).__name__


def _flag(parameters: Mapping[str, str], key: str) -> bool:
    return parameters.get(key, "false").strip().lower() in _TRUE


def _set_threads(torch: Any, model: str, parameters: Mapping[str, str]) -> None:
    """Triton's INTRA_OP_THREAD_COUNT / INTER_OP_THREAD_COUNT (process-wide settings in torch)."""
    counts = {}
    for key in ("INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT"):
        if key in parameters:
            raw = parameters[key].strip()
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigError(f"model '{model}': parameter '{key}' must be an integer >= 1, got {raw!r}")
            counts[key] = int(raw)
    if "INTRA_OP_THREAD_COUNT" in counts:
        torch.set_num_threads(counts["INTRA_OP_THREAD_COUNT"])
    if "INTER_OP_THREAD_COUNT" in counts:
        try:
            torch.set_num_interop_threads(counts["INTER_OP_THREAD_COUNT"])
        except RuntimeError:
            # torch takes it once per process, before any inter-op work; as in Triton, the first value wins.
            logger.warning("model '%s': INTER_OP_THREAD_COUNT ignored, this process already set it", model)


def create(model: BackendModel) -> TorchModel:
    """The instance object of a PyTorch model (the file is loaded in ``setup``)."""
    unsupported = [t.name for t in (*model.spec.inputs, *model.spec.outputs) if t.datatype not in TORCH_DTYPE_NAMES]
    if unsupported:
        raise ConfigError(
            f"model '{model.spec.name}': tensors {unsupported} are BYTES, which torch tensors cannot hold"
        )
    return TorchModel(model)


def autocomplete(model_file: Path) -> Signature | None:
    """None: a TorchScript file does not say its tensors' names, types or shapes; declare them in the config."""
    return None


def gpu_capable() -> bool:
    """Whether torch is installed here and can use a CUDA GPU (a CUDA build, a driver and a GPU)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
