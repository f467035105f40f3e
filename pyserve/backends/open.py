"""Open a model file on a device, for functions and classes bound by hand.

The backends open their models with these helpers, and a bound class may too, in ``setup(device)``::

    class Classifier:
        def setup(self, device: str) -> None:
            self.session = open_onnx("model.onnx", device, intra_op_num_threads=2)

        @batch
        def __call__(self, image: np.ndarray) -> dict[str, np.ndarray]:
            (scores,) = self.session.run(["scores"], {"image": image})
            return {"scores": scores}

Devices are the strings an instance's ``setup`` receives: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. The frameworks are
imported inside each helper, so importing this module costs nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyserve.backends.common import parse_device
from pyserve.backends.tensorrt import TensorRTEngine
from pyserve.errors import ConfigError

__all__ = ["onnx_providers", "open_onnx", "open_tensorrt", "open_torch_export", "open_torchscript"]


def onnx_providers(
    device: str,
    *,
    tensorrt: bool = False,
    cuda_options: Mapping[str, Any] | None = None,
    tensorrt_options: Mapping[str, Any] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """ONNX Runtime execution providers for a device, most preferred first, each with its options.

    ``"cpu"``: the CPU provider. ``"cuda:N"``: the CUDA provider on GPU N (``device_id``), behind the TensorRT
    provider when ``tensorrt`` is set; the CPU provider last runs the nodes the others cannot.
    """
    kind, index = parse_device(device)
    providers: list[tuple[str, dict[str, Any]]] = []
    if kind == "cuda":
        if tensorrt:
            providers.append(("TensorrtExecutionProvider", {**(tensorrt_options or {}), "device_id": index}))
        providers.append(("CUDAExecutionProvider", {**(cuda_options or {}), "device_id": index}))
    providers.append(("CPUExecutionProvider", {}))
    return providers


def open_onnx(
    path: str | Path | bytes,
    device: str = "cpu",
    *,
    tensorrt: bool = False,
    cuda_options: Mapping[str, Any] | None = None,
    tensorrt_options: Mapping[str, Any] | None = None,
    op_libraries: Sequence[str] = (),
    config_entries: Mapping[str, str] | None = None,
    **session_options: Any,
) -> Any:
    """An ``onnxruntime.InferenceSession`` of a model file (or its bytes) on ``device``.

    ``session_options`` set attributes of ``onnxruntime.SessionOptions`` (``intra_op_num_threads=2``,
    ``graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC``...); ``config_entries`` go through
    ``add_session_config_entry``; ``op_libraries`` are custom-op libraries registered first. On a GPU the CUDA
    provider (and the TensorRT one before it with ``tensorrt=True``) gets ``device_id``, and the provider options
    given. ConfigError when the installed onnxruntime lacks a provider the device needs, or when the session did not
    take it (missing CUDA libraries): a GPU model never silently runs on the CPU.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    for name, value in session_options.items():
        if name.startswith("_") or not hasattr(options, name):
            raise ConfigError(f"onnxruntime.SessionOptions has no option '{name}'")
        setattr(options, name, value)
    for key, value in (config_entries or {}).items():
        options.add_session_config_entry(key, value)
    for library in op_libraries:
        if not Path(library).is_file():
            raise ConfigError(f"custom op library {library} does not exist")
        try:
            options.register_custom_ops_library(str(library))
        except Exception as exc:  # onnxruntime raises its own Fail for a library it cannot load
            raise ConfigError(f"custom op library {library} could not be loaded by onnxruntime: {exc}") from exc
    providers = onnx_providers(device, tensorrt=tensorrt, cuda_options=cuda_options, tensorrt_options=tensorrt_options)
    available = ort.get_available_providers()
    for name, _ in providers:
        if name not in available:
            raise ConfigError(
                f"device '{device}' needs onnxruntime's {name}, which the installed onnxruntime {ort.__version__} "
                f"lacks (it has {', '.join(available)}); install onnxruntime-gpu for CUDA and TensorRT"
            )
    source = path if isinstance(path, bytes) else str(path)
    try:
        session = ort.InferenceSession(
            source, options, providers=[name for name, _ in providers], provider_options=[o for _, o in providers]
        )
    except Exception as exc:  # onnxruntime's own exception types (Fail, InvalidGraph, NoSuchFile...)
        where = "model bytes" if isinstance(path, bytes) else str(path)
        raise ConfigError(f"onnxruntime could not open {where}: {exc}") from exc
    missing = [name for name, _ in providers if name not in session.get_providers()]
    if missing:
        raise ConfigError(
            f"onnxruntime could not start {', '.join(missing)} for device '{device}' (check the CUDA, cuDNN and "
            "TensorRT libraries it needs; its log says which failed)"
        )
    return session


def open_torchscript(path: str | Path, device: str = "cpu", *, op_libraries: Sequence[str] = ()) -> Any:
    """A TorchScript module (``torch.jit.save`` output) loaded onto ``device``, in eval mode.

    ``op_libraries`` are custom-op libraries loaded first with ``torch.ops.load_library``.
    """
    torch = _torch_for(device, op_libraries)
    with warnings.catch_warnings():
        # TorchScript is deprecated upstream; serving an existing TorchScript file is still what was asked for.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.* is deprecated", category=DeprecationWarning)
        try:
            module = torch.jit.load(str(path), map_location=device)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"torch could not load TorchScript file {path}: {exc}") from exc
    return module.eval()


def open_torch_export(path: str | Path, device: str = "cpu", *, op_libraries: Sequence[str] = ()) -> Any:
    """The module of a ``torch.export`` program (``torch.export.save`` output, ``.pt2``) with its weights on
    ``device``."""
    torch = _torch_for(device, op_libraries)
    from torch.export.passes import move_to_device_pass

    try:
        program = torch.export.load(str(path))
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        raise ConfigError(f"torch could not load exported program {path}: {exc}") from exc
    if device != "cpu":
        program = move_to_device_pass(program, device)
    return program.module()


def open_tensorrt(path: str | Path, device: str = "cuda", *, plugin_libraries: Sequence[str] = ()) -> TensorRTEngine:
    """A TensorRT engine (``.plan``) on a GPU, ready to run: ``engine({"x": array}) -> {"y": array}``.

    ``plugin_libraries`` are TensorRT plugin libraries loaded first.
    """
    engine = TensorRTEngine(Path(path), plugin_libraries)
    engine.open(device)
    return engine


def _torch_for(device: str, op_libraries: Sequence[str]) -> Any:
    """torch, after checking that ``device`` exists and loading the custom-op libraries."""
    import torch

    kind, index = parse_device(device)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device '{device}': torch {torch.__version__} sees no CUDA GPU")
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device '{device}': torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    for library in op_libraries:
        if not Path(library).is_file():
            raise ConfigError(f"custom op library {library} does not exist")
        try:
            torch.ops.load_library(str(library))  # type: ignore[no-untyped-call]
        except OSError as exc:
            raise ConfigError(f"custom op library {library} could not be loaded by torch: {exc}") from exc
    return torch
