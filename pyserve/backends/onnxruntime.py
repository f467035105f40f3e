"""The ONNX Runtime backend: ``model.onnx`` run by an ``onnxruntime.InferenceSession`` on the CPU or a GPU.

Config ``parameters`` carry what Triton's onnxruntime backend reads from its config (docs/backends.md lists them):
session options (``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode``,
``graph_optimization_level`` with the values of Triton's ``optimization { graph { level } }``, ``enable_mem_arena``,
``enable_mem_pattern``, ``session.use_device_allocator_for_initializers``, ``memory.enable_memory_arena_shrinkage``),
CUDA provider options, and ``execution_accelerator: "tensorrt"`` with the TensorRT provider's options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pyserve.backends.base import BackendModel, Signature
from pyserve.backends.common import (
    ORT_DATATYPES,
    Arrays,
    BatchRunner,
    check_signature,
    existing_file,
    kserve_datatype,
    signature_of,
)
from pyserve.backends.open import open_onnx
from pyserve.errors import ConfigError, InvalidInputError
from pyserve.request import Request

NAME = "onnxruntime"
PLATFORMS = ("onnxruntime_onnx",)
DEFAULT_MODEL_FILENAME = "model.onnx"

# Triton's ``optimization { graph { level } }``: -1 basic, 1 basic + extended, 2 none, anything else (0) all.
_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 0: "ORT_ENABLE_ALL", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
_INT_SESSION_OPTIONS = {
    "intra_op_thread_count": "intra_op_num_threads",
    "inter_op_thread_count": "inter_op_num_threads",
}
_BOOL_SESSION_OPTIONS = {"enable_mem_arena": "enable_cpu_mem_arena", "enable_mem_pattern": "enable_mem_pattern"}
_SESSION_CONFIG_ENTRIES = ("session.use_device_allocator_for_initializers",)
_RUN_CONFIG_ENTRIES = ("memory.enable_memory_arena_shrinkage",)
# Triton's (deprecated but still read) top-level CUDA provider parameters; cudnn_conv_algo_search is an index.
_CUDA_OPTIONS = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream")
_CUDNN_SEARCH = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}
# Triton's TensorRT accelerator parameters that are not ``trt_*`` provider options already.
_TRT_RENAMED = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_PRECISIONS = {"FP32": {}, "FP16": {"trt_fp16_enable": "True"}, "INT8": {"trt_int8_enable": "True"}}
_ACCELERATORS = ("cuda", "tensorrt")


@dataclasses.dataclass(frozen=True)
class SessionConfig:
    """How to open a session, read from config parameters (validated at ``create``, applied at ``setup``)."""

    session_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    graph_level: int = 0
    config_entries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    run_entries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tensorrt: bool = False
    cuda_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tensorrt_options: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_parameters(cls, model: str, parameters: Mapping[str, str]) -> SessionConfig:
        """Read the parameters Triton's onnxruntime backend knows; other keys are left to the model's own use."""
        session: dict[str, Any] = {}
        for key, option in _INT_SESSION_OPTIONS.items():
            if key in parameters:
                session[option] = _int(model, parameters, key, minimum=0)
        for key, option in _BOOL_SESSION_OPTIONS.items():
            if key in parameters:
                session[option] = _int(model, parameters, key, choices=(0, 1)) == 1
        if "execution_mode" in parameters:
            session["execution_mode"] = _int(model, parameters, "execution_mode", choices=(0, 1))
        graph_level = 0
        if "graph_optimization_level" in parameters:
            graph_level = _int(model, parameters, "graph_optimization_level", choices=tuple(_GRAPH_LEVELS))
        accelerator = parameters.get("execution_accelerator", "cuda").lower()
        if accelerator not in _ACCELERATORS:
            raise ConfigError(
                f"model '{model}': parameter 'execution_accelerator' must be one of {', '.join(_ACCELERATORS)}, "
                f"got {accelerator!r}"
            )
        cuda = {key: parameters[key] for key in _CUDA_OPTIONS if key in parameters}
        if "cudnn_conv_algo_search" in cuda:
            _int(model, parameters, "cudnn_conv_algo_search", choices=(0, 1, 2))
            cuda["cudnn_conv_algo_search"] = _CUDNN_SEARCH[cuda["cudnn_conv_algo_search"].strip()]
        trt = {_TRT_RENAMED.get(k, k): v for k, v in parameters.items() if k in _TRT_RENAMED or k.startswith("trt_")}
        precision = parameters.get("precision_mode", "FP32").upper()
        if precision not in _PRECISIONS:
            raise ConfigError(
                f"model '{model}': parameter 'precision_mode' must be FP32, FP16 or INT8, got {precision!r}"
            )
        trt.update(_PRECISIONS[precision])
        return cls(
            session_options=session,
            graph_level=graph_level,
            config_entries={k: parameters[k] for k in _SESSION_CONFIG_ENTRIES if k in parameters},
            run_entries={k: parameters[k] for k in _RUN_CONFIG_ENTRIES if k in parameters},
            tensorrt=accelerator == "tensorrt",
            cuda_options=cuda,
            tensorrt_options=trt,
        )


def _int(model: str, parameters: Mapping[str, str], key: str, minimum: int = 0, choices: tuple[int, ...] = ()) -> int:
    raw = parameters[key]
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = None
    if value is None or (choices and value not in choices) or (not choices and value < minimum):
        expected = f"one of {', '.join(map(str, choices))}" if choices else f"an integer >= {minimum}"
        raise ConfigError(f"model '{model}': parameter '{key}' must be {expected}, got {raw!r}")
    return value


class OnnxRuntimeModel:
    """One instance of an ONNX model: ``setup(device)`` opens the session there, calls run request batches."""

    def __init__(self, model: BackendModel, config: SessionConfig) -> None:
        self.model = model
        self.config = config
        self.session: Any = None
        self._run_options: Any = None
        self._strings: frozenset[str] = frozenset()
        self._runner: BatchRunner | None = None

    def __getstate__(self) -> dict[str, Any]:
        # What travels to a process instance: the description, never an open session.
        return {**self.__dict__, "session": None, "_run_options": None, "_runner": None}

    def setup(self, device: str) -> None:
        """Open the session on ``device`` and check the config's tensors against the model file's."""
        import onnxruntime as ort

        config = self.config
        options = dict(config.session_options)
        if "execution_mode" in options:
            options["execution_mode"] = ort.ExecutionMode(options["execution_mode"])
        session = open_onnx(
            existing_file(self.model),
            device,
            tensorrt=config.tensorrt,
            cuda_options=config.cuda_options,
            tensorrt_options=config.tensorrt_options,
            op_libraries=self.model.op_libraries,
            config_entries=config.config_entries,
            graph_optimization_level=getattr(ort.GraphOptimizationLevel, _GRAPH_LEVELS[config.graph_level]),
            **options,
        )
        check_signature(self.model, session_signature(session))
        run_options = None
        if config.run_entries:
            run_options = ort.RunOptions()
            for key, value in config.run_entries.items():
                run_options.add_run_config_entry(key, value)
        self.session = session
        self._run_options = run_options
        tensors = (*self.model.spec.inputs, *self.model.spec.outputs)
        self._strings = frozenset(t.name for t in tensors if t.datatype == "BYTES")
        self._runner = BatchRunner(self.model, self._run)

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        if self._runner is None:
            raise RuntimeError("OnnxRuntimeModel.setup(device) must run before the model is called")
        return self._runner(requests)

    def _run(self, inputs: Arrays, names: tuple[str, ...]) -> Arrays:
        feeds = {name: _to_strings(name, a) if name in self._strings else a for name, a in inputs.items()}
        results = self.session.run(list(names), feeds, self._run_options)
        return {name: _to_bytes(r) if name in self._strings else r for name, r in zip(names, results, strict=True)}


def _to_strings(name: str, array: np.ndarray) -> np.ndarray:
    """A BYTES input as the str array onnxruntime string tensors take (they hold UTF-8 text)."""
    out = np.empty(array.shape, dtype=object)
    try:
        for index, item in enumerate(array.flat):
            out.flat[index] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"input '{name}': element {index} is not UTF-8 text ({exc.reason})") from None
    return out


def _to_bytes(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    for index, item in enumerate(array.flat):
        out.flat[index] = item.encode("utf-8") if isinstance(item, str) else item
    return out


def session_signature(session: Any) -> Signature:
    """The tensors an ``onnxruntime.InferenceSession`` declares (symbolic dims as -1)."""

    def tensors(args: Any, kind: str) -> list[tuple[str, str, Any]]:
        return [(a.name, kserve_datatype(ORT_DATATYPES, a.type, f"{kind} '{a.name}'"), a.shape) for a in args]

    return signature_of(tensors(session.get_inputs(), "input"), tensors(session.get_outputs(), "output"))


def create(model: BackendModel) -> OnnxRuntimeModel:
    """The instance object of an ONNX model (its config parameters checked here, the file opened in ``setup``)."""
    bf16 = [t.name for t in (*model.spec.inputs, *model.spec.outputs) if t.datatype == "BF16"]
    if bf16:
        raise ConfigError(
            f"model '{model.spec.name}': tensors {bf16} are BF16, which cannot pass between numpy and onnxruntime; "
            "cast them to FP16 or FP32 in the graph"
        )
    return OnnxRuntimeModel(model, SessionConfig.from_parameters(model.spec.name, model.parameters))


def autocomplete(model_file: Path) -> Signature | None:
    """The inputs and outputs ``model_file`` declares, read by onnxruntime on the CPU."""
    if not model_file.is_file():
        raise ConfigError(f"model file {model_file} does not exist")
    return session_signature(open_onnx(model_file, "cpu"))


def gpu_capable() -> bool:
    """Whether the installed onnxruntime can run on a GPU (the ``onnxruntime-gpu`` build has the CUDA provider)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()
