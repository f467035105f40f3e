"""What every framework backend provides, and what it is given.

A backend turns a model file into the object a process instance runs: ``create(model)`` returns a picklable object
with ``setup(device)`` (called once in the instance's process, on its device: open the session / load the module
there) and ``__call__(requests)`` (a ``RequestBatch`` in, one output dict per request out, as any bound callable).
The core pickles that object into the process instances of the model; nothing heavy may be opened before
``setup``.

``autocomplete(model_file)`` reads the tensors a model file declares (Triton's auto-complete), or returns None when
the format does not say (TorchScript). ``gpu_capable()`` says whether the framework installed here can use a GPU
(the CPU build of onnxruntime cannot): a ``KIND_AUTO`` instance group goes on the visible GPUs only when it can, and
a ``KIND_GPU`` one fails the load when it cannot. Both import the framework lazily, in the core's process.

The repository (``pyserve.repository``) and ``Serve.bind_model`` build a ``BackendModel`` and pick the backend by
name with ``pyserve.backends.backend(name)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pyserve.config import ModelSpec


@dataclasses.dataclass(frozen=True)
class TensorSignature:
    """A tensor as a model file declares it: name, KServe datatype, dims (-1 variable; the batch dim included)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a model file says of its tensors; ``batch_dim`` is True when every tensor's first dim is variable."""

    inputs: tuple[TensorSignature, ...]
    outputs: tuple[TensorSignature, ...]

    @property
    def batch_dim(self) -> bool:
        tensors = self.inputs + self.outputs
        return bool(tensors) and all(t.dims and t.dims[0] == -1 for t in tensors)


@dataclasses.dataclass(frozen=True)
class BackendModel:
    """One model version, as a backend needs it to serve it.

    - ``spec``: the served model (name, version, tensors as clients see them, ModelConfig incl. ``parameters``).
    - ``model_file``: the file to load (``<version dir>/<default_model_filename>``); for the Python backend the
      ``model.py``.
    - ``version_dir`` / ``model_dir`` / ``repository``: where it lies (the Python backend passes them on, as Triton
      does in ``initialize(args)``).
    - ``reshape``: tensor name -> the shape the model itself sees (Triton's ``reshape``; the batch dim excluded);
      the backend reshapes inputs before the model and outputs after it.
    - ``op_libraries``: custom-operation libraries to load in the instance before the model
      (``model_operations { op_library_filename }``).
    - ``config_json``: the model's configuration in Triton's JSON form (what ``/v2/models/{m}/config`` answers),
      for backends that hand it to user code (Python backend ``initialize(args)["model_config"]``).
    """

    spec: ModelSpec
    model_file: Path
    version_dir: Path
    model_dir: Path
    repository: Path | None = None
    reshape: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    op_libraries: tuple[str, ...] = ()
    config_json: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def parameters(self) -> Mapping[str, str]:
        """Config ``parameters`` (string values), e.g. ONNX Runtime's ``intra_op_thread_count``."""
        return self.spec.config.parameters


class Backend(Protocol):
    """A backend module (``pyserve.backends.onnxruntime`` etc.) seen as an object."""

    NAME: str  # Triton's backend name: "onnxruntime", "pytorch", "tensorrt", "python"
    PLATFORMS: tuple[str, ...]  # Triton platform names that mean this backend, e.g. ("onnxruntime_onnx",)
    DEFAULT_MODEL_FILENAME: str  # "model.onnx", "model.pt", "model.plan", "model.py"

    def create(self, model: BackendModel) -> Callable[..., Any]:
        """The picklable instance object (``setup(device)`` + ``__call__(requests)``)."""
        ...

    def autocomplete(self, model_file: Path) -> Signature | None:
        """The tensors the file declares, or None when its format does not say."""
        ...

    def gpu_capable(self) -> bool:
        """Whether this backend can run instances on a GPU here: its framework is installed with GPU support (a
        ``KIND_AUTO`` instance group uses the visible GPUs only then)."""
        ...
