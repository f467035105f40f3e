"""The TensorRT backend: a serialized engine (``model.plan``) run on a GPU.

``TensorRTEngine`` deserializes the engine with the ``tensorrt`` package (TensorRT 10, or 8.6 with its name-based
API), makes one execution context and runs it with ``execute_async_v3``; its device buffers are torch CUDA tensors
(torch is what is realistically installed beside TensorRT), on a CUDA stream of its own. Dynamic shapes: each call
sets every input's shape with ``set_input_shape`` within the engine's optimization profile (parameter
``optimization_profile``, 0 by default) and allocates outputs in the shapes TensorRT then reports.
"""

from __future__ import annotations

import ctypes
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyserve.backends.base import BackendModel, Signature
from pyserve.backends.common import (
    TRT_DATATYPES,
    Arrays,
    BatchRunner,
    check_signature,
    existing_file,
    kserve_datatype,
    parse_device,
    signature_of,
    to_numpy,
    to_torch,
    torch_dtype,
)
from pyserve.errors import ConfigError, InvalidInputError, ModelExecutionError
from pyserve.request import Request

NAME = "tensorrt"
PLATFORMS = ("tensorrt_plan",)
DEFAULT_MODEL_FILENAME = "model.plan"

logger = logging.getLogger(__name__)


class TensorRTEngine:
    """A TensorRT engine on one GPU: ``open(device)``, then ``engine({"x": array}) -> {"y": array}``."""

    def __init__(self, path: Path, plugin_libraries: Sequence[str] = (), profile: int = 0) -> None:
        self.path = path
        self.plugin_libraries = tuple(plugin_libraries)
        self.profile = profile
        self.engine: Any = None
        self.context: Any = None
        self._runtime: Any = None
        self._stream: Any = None
        self._device: Any = None
        self._inputs: tuple[str, ...] = ()
        self._outputs: tuple[str, ...] = ()
        self._dtypes: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # An engine, a context and a stream live on one GPU of one process: only the description travels.
        gone = ("engine", "context", "_runtime", "_stream", "_device")
        return {**self.__dict__, **dict.fromkeys(gone), "_dtypes": {}}

    def open(self, device: str) -> None:
        """Deserialize the engine on ``device`` (``"cuda:N"``) and create its execution context there."""
        import tensorrt as trt
        import torch

        kind, index = parse_device(device)
        if kind != "cuda":
            raise ConfigError(f"TensorRT engine {self.path}: engines run on a GPU, not on device '{device}'")
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ConfigError(f"TensorRT engine {self.path}: torch sees no CUDA device '{device}'")
        self._device = torch.device("cuda", index)
        torch.cuda.set_device(self._device)
        trt_logger = trt.Logger(trt.Logger.WARNING)
        for library in self.plugin_libraries:
            try:
                ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                raise ConfigError(f"TensorRT plugin library {library} could not be loaded: {exc}") from exc
        trt.init_libnvinfer_plugins(trt_logger, "")
        # The runtime must outlive the engine it deserialized.
        self._runtime = trt.Runtime(trt_logger)
        self.engine = _deserialize(self._runtime, self.path)
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise ConfigError(f"TensorRT engine {self.path}: no execution context (out of GPU memory?)")
        self._stream = torch.cuda.Stream(device=self._device)  # type: ignore[no-untyped-call]
        if not 0 <= self.profile < self.engine.num_optimization_profiles:
            raise ConfigError(
                f"TensorRT engine {self.path}: optimization profile {self.profile} does not exist "
                f"(the engine has {self.engine.num_optimization_profiles})"
            )
        self.context.set_optimization_profile_async(self.profile, self._stream.cuda_stream)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self._inputs = tuple(n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
        self._outputs = tuple(n for n in names if n not in self._inputs)
        for name in names:
            if self.engine.is_shape_inference_io(name):
                raise ConfigError(f"TensorRT engine {self.path}: shape tensor '{name}' is not supported")
        self._dtypes = {name: torch_dtype(datatype) for name, datatype in self._datatypes().items()}

    def _datatypes(self) -> dict[str, str]:
        return {
            name: kserve_datatype(TRT_DATATYPES, self.engine.get_tensor_dtype(name).name, f"tensor '{name}'")
            for name in (*self._inputs, *self._outputs)
        }

    def signature(self) -> Signature:
        """The engine's inputs and outputs (dynamic dims as -1)."""
        datatypes = self._datatypes()
        return signature_of(
            [(n, datatypes[n], tuple(self.engine.get_tensor_shape(n))) for n in self._inputs],
            [(n, datatypes[n], tuple(self.engine.get_tensor_shape(n))) for n in self._outputs],
        )

    def __call__(self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] = ()) -> Arrays:
        """Run the engine on host arrays; the outputs named (all by default) as host arrays."""
        import torch

        if self.context is None:
            raise RuntimeError("TensorRTEngine.open(device) must run before the engine is called")
        context = self.context
        buffers = {}
        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            for name in self._inputs:
                if name not in inputs:
                    raise InvalidInputError(f"TensorRT engine input '{name}' is missing")
                tensor = to_torch(np.ascontiguousarray(inputs[name]), self._device)
                if tensor.dtype != self._dtypes[name]:
                    raise InvalidInputError(
                        f"input '{name}': the engine takes {self._dtypes[name]}, got {inputs[name].dtype}"
                    )
                if not context.set_input_shape(name, tuple(tensor.shape)):
                    low, _, high = self.engine.get_tensor_profile_shape(name, self.profile)
                    raise InvalidInputError(
                        f"input '{name}': shape {list(tensor.shape)} is outside the engine's optimization profile "
                        f"{self.profile} ({list(low)} to {list(high)})"
                    )
                buffers[name] = tensor
            for name in self._outputs:
                shape = tuple(context.get_tensor_shape(name))
                if any(dim < 0 for dim in shape):
                    raise ModelExecutionError(
                        f"output '{name}': TensorRT cannot tell its shape before running ({list(shape)}); "
                        "data-dependent output shapes are not supported"
                    )
                buffers[name] = torch.empty(shape, dtype=self._dtypes[name], device=self._device)
            for name, tensor in buffers.items():
                context.set_tensor_address(name, tensor.data_ptr())
            if not context.execute_async_v3(self._stream.cuda_stream):
                raise ModelExecutionError(f"TensorRT engine {self.path}: execution failed (see the TensorRT log)")
            # .cpu() on this stream waits for the engine to finish.
            return {name: to_numpy(buffers[name]) for name in (output_names or self._outputs)}


def _deserialize(runtime: Any, path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise ConfigError(
            f"TensorRT could not deserialize {path}: an engine runs only with the TensorRT version and GPU kind it "
            "was built for (the TensorRT log says more)"
        )
    return engine


class TensorRTModel:
    """One instance of a TensorRT model: ``setup(device)`` opens the engine there, calls run request batches."""

    def __init__(self, model: BackendModel, profile: int) -> None:
        self.model = model
        self.profile = profile
        self._engine: TensorRTEngine | None = None
        self._runner: BatchRunner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_engine": None, "_runner": None}

    def setup(self, device: str) -> None:
        """Open the engine on ``device`` and check the config's tensors against the engine's."""
        engine = TensorRTEngine(existing_file(self.model), self.model.op_libraries, self.profile)
        engine.open(device)
        check_signature(self.model, engine.signature())
        self._engine = engine
        self._runner = BatchRunner(self.model, engine)

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        if self._runner is None:
            raise RuntimeError("TensorRTModel.setup(device) must run before the model is called")
        return self._runner(requests)


def create(model: BackendModel) -> TensorRTModel:
    """The instance object of a TensorRT engine (opened in ``setup``, on a GPU)."""
    raw = model.parameters.get("optimization_profile", "0").strip()
    if not raw.isdigit():
        raise ConfigError(f"model '{model.spec.name}': parameter 'optimization_profile' must be >= 0, got {raw!r}")
    return TensorRTModel(model, int(raw))


def autocomplete(model_file: Path) -> Signature | None:
    """The engine's tensors, read on GPU 0; None where ``tensorrt`` (or torch, or a GPU) is missing here."""
    try:
        import tensorrt  # noqa: F401
        import torch
    except ImportError:
        logger.debug("tensorrt or torch is not installed: %s cannot describe its tensors", model_file)
        return None
    if not torch.cuda.is_available():
        logger.debug("no CUDA GPU: %s cannot describe its tensors", model_file)
        return None
    engine = TensorRTEngine(model_file)
    engine.open("cuda:0")
    return engine.signature()


def gpu_capable() -> bool:
    """Whether ``tensorrt`` is installed (TensorRT runs on GPUs only; a missing GPU fails the instance's setup)."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return True
