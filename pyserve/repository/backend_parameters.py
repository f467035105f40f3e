"""Config fields Triton's backends read that pyserve's backends take as ``parameters`` (docs/backends.md).

Triton's onnxruntime backend reads ``optimization { graph { level } }`` and the execution accelerators, its TensorRT
backend each instance group's ``profile``; pyserve's backends read those settings from ``parameters`` only, so the
repository writes them there. Other backends take nothing from these fields: set, they are reported as unused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2 as pb
from pyserve.repository.config_document import UsedFields

# The fields each backend's mapping reads (so they are not reported as unused).
MAPPED_FIELDS: Mapping[str, UsedFields] = {
    "onnxruntime": {"optimization": {"graph": None, "execution_accelerators": None}},
    "tensorrt": {"instance_group": {"profile": None}},
}
# The GPU execution accelerators of Triton's onnxruntime backend.
_ONNXRUNTIME_GPU_ACCELERATORS = ("tensorrt", "cuda")


@dataclasses.dataclass(frozen=True)
class BackendParameters:
    """The parameters a model's backend reads, and warnings about the mapped fields it cannot honour."""

    parameters: dict[str, str]
    warnings: tuple[str, ...] = ()


def backend_parameters(name: str, backend_name: str, config: pb.ModelConfig) -> BackendParameters:
    """The config's ``parameters`` and what ``backend_name`` reads from other fields; a ConfigError names a parameter
    given two different values."""
    parameters = {key: parameter.string_value for key, parameter in config.parameters.items()}
    if backend_name == "onnxruntime":
        warnings = _onnxruntime(name, config.optimization, parameters)
        return BackendParameters(parameters, tuple(warnings))
    if backend_name == "tensorrt":
        _tensorrt(name, config.instance_group, parameters)
    return BackendParameters(parameters)


def _onnxruntime(name: str, optimization: pb.ModelOptimizationPolicy, parameters: dict[str, str]) -> list[str]:
    if optimization.HasField("graph"):
        _put(name, parameters, "graph_optimization_level", str(optimization.graph.level), "optimization.graph.level")
    accelerators = optimization.execution_accelerators
    names = [accelerator.name for accelerator in accelerators.gpu_execution_accelerator]
    unknown = [n for n in names if n not in _ONNXRUNTIME_GPU_ACCELERATORS]
    if unknown:
        raise ConfigError(
            f"model '{name}': gpu_execution_accelerator {unknown[0]!r} is not one of the onnxruntime backend's "
            f"({', '.join(_ONNXRUNTIME_GPU_ACCELERATORS)})"
        )
    if names:
        # Triton's backend puts the TensorRT provider before the CUDA one when both are listed, as this does.
        accelerator = "tensorrt" if "tensorrt" in names else "cuda"
        _put(name, parameters, "execution_accelerator", accelerator, "gpu_execution_accelerator")
    for gpu_accelerator in accelerators.gpu_execution_accelerator:
        field = f"gpu_execution_accelerator '{gpu_accelerator.name}'"
        for key, value in sorted(gpu_accelerator.parameters.items()):
            _put(name, parameters, key, value, field)
    return [
        f"model '{name}': cpu_execution_accelerator '{cpu_accelerator.name}' is not supported by pyserve and is "
        "ignored: the model runs on ONNX Runtime's CPU provider"
        for cpu_accelerator in accelerators.cpu_execution_accelerator
    ]


def _tensorrt(name: str, groups: Iterable[pb.ModelInstanceGroup], parameters: dict[str, str]) -> None:
    profiles = sorted({profile for group in groups for profile in group.profile})
    if len(profiles) > 1:
        raise ConfigError(
            f"model '{name}': instance_group profiles {profiles}: pyserve's TensorRT backend runs one optimization "
            "profile per model"
        )
    if profiles:
        _put(name, parameters, "optimization_profile", profiles[0], "instance_group.profile")


def _put(name: str, parameters: dict[str, str], key: str, value: str, field: str) -> None:
    if parameters.setdefault(key, value) != value:
        raise ConfigError(f"model '{name}': parameter '{key}' is {parameters[key]!r}, but {field} sets it to {value!r}")
