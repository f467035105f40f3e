"""One model of a Triton-layout repository, read: its config (``config.pbtxt`` or the load API's JSON), versions and
files, as the ``ModelSpec`` / ``EnsembleSpec`` the core serves.

``read_model`` follows tritonserver: the directory's name is the model's; ``version_policy`` picks the version
directories; without ``--strict-model-config`` what the config leaves out is completed from the model file
(``pyserve.repository.autocomplete``); Triton's defaults are then filled in (a ``KIND_GPU`` instance group without
``gpus`` is placed on every visible GPU, a ``KIND_AUTO`` one on them where the backend can use them). Fields
Triton's backends read that pyserve's take as ``parameters`` are mapped there
(``pyserve.repository.backend_parameters``). Config fields pyserve does not use are reported in
``ModelDefinition.warnings`` (``pyserve.repository.config_document``); ``sequence_batching`` is read by
``pyserve.repository.sequence_batching``. Every error is a one-line ``ConfigError`` naming the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyserve.repository.layout as layout
from pyserve.backends import Backend, BackendModel, backend, backend_for
from pyserve.config import DynamicBatcher, ModelConfig, ModelSpec, QueuePolicy, Tensor, WorkerKind
from pyserve.devices import visible_gpu_count
from pyserve.dtypes import datatype_of
from pyserve.ensemble import EnsembleSpec, Step
from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2 as pb
from pyserve.repository.autocomplete import complete_config
from pyserve.repository.backend_parameters import MAPPED_FIELDS, backend_parameters
from pyserve.repository.config_document import (
    ENSEMBLE,
    config_json,
    is_ensemble,
    parse_config_json,
    parse_config_text,
    unused_fields,
)
from pyserve.repository.hooks import LoadHook, check_agents, checksum_hook, run_hooks
from pyserve.repository.sequence_batching import normalize_sequence_batching, sequence_batcher


@dataclasses.dataclass(frozen=True)
class ModelDefinition:
    """A model read from a repository: what the core registers and what each version's backend is built from.

    ``specs`` holds the versions ``version_policy`` selects (empty for an ensemble, whose graph is ``ensemble``);
    ``model_files`` the file each of them loads. ``config_json`` is the final (auto-completed) config in Triton's
    JSON form; ``warnings`` names each config field pyserve ignores. When ``read_model`` was given a file override,
    ``model_dir`` is a new temporary directory (not named after the model): the caller removes it when done.
    """

    name: str
    backend: str
    model_dir: Path
    specs: dict[int, ModelSpec]
    ensemble: EnsembleSpec | None
    model_files: dict[int, Path]
    reshape: dict[str, tuple[int, ...]]
    op_libraries: tuple[str, ...]
    config_json: dict[str, Any]
    warnings: tuple[str, ...]

    def backend_model(self, version: int, repository: Path | None) -> BackendModel:
        """What the backend needs to serve one selected version of this model."""
        if self.ensemble is not None:
            raise ConfigError(f"model '{self.name}' is an ensemble: it has no backend model")
        if version not in self.specs:
            raise ConfigError(
                f"model '{self.name}': version {version} is not selected (versions: {sorted(self.specs)})"
            )
        return BackendModel(
            spec=self.specs[version],
            model_file=self.model_files[version],
            version_dir=self.model_dir / str(version),
            model_dir=self.model_dir,
            repository=repository,
            reshape=self.reshape,
            op_libraries=self.op_libraries,
            config_json=self.config_json,
        )


def backend_gpu_capable(module: Backend) -> bool:
    """Whether the backend can run instances on a GPU here (its ``gpu_capable()``). A backend module that does not
    say can: the Python backend's functions choose their own device."""
    capable: Callable[[], bool] = getattr(module, "gpu_capable", lambda: True)
    return capable()


# What a backend that cannot use a GPU here lacks, and how to install it.
_GPU_NEEDS = {
    "onnxruntime": (
        "the installed onnxruntime has no CUDAExecutionProvider",
        'install onnxruntime-gpu in place of onnxruntime: pip uninstall onnxruntime && pip install "pyserve[onnx-gpu]"',
    ),
    "pytorch": (
        "torch is missing or is not a CUDA build",
        'install a CUDA build of torch: pip install "pyserve[torch]" (PyPI\'s Linux wheels are CUDA builds)',
    ),
    "tensorrt": ("tensorrt is not installed", 'install it: pip install "pyserve[tensorrt]"'),
}


def declares_ensemble(model_dir: Path) -> bool:
    """Whether a model directory's config.pbtxt declares an ensemble, read from the config alone (no hooks, files or
    auto-complete). False when there is no config or it does not parse: loading the model reports that."""
    try:
        text = (model_dir / layout.CONFIG_FILENAME).read_text()
        return is_ensemble(parse_config_text(text, model_dir.name))
    except (OSError, ConfigError):
        return False


def read_model(
    model_dir: Path,
    *,
    strict: bool = False,
    config_override: str | None = None,
    files: Mapping[str, bytes] | None = None,
    hooks: Sequence[LoadHook] = (),
    gpu_count: Callable[[], int] = visible_gpu_count,
    gpu_capable: Callable[[Backend], bool] = backend_gpu_capable,
) -> ModelDefinition:
    """Read the model in ``model_dir`` (its name is the directory's).

    ``config_override`` (a JSON model config) replaces ``config.pbtxt``; ``files`` (path relative to the model dir
    -> bytes, Triton's load-API file override) are written into a new temporary model directory used instead of
    ``model_dir`` (see ``ModelDefinition``). ``strict`` (tritonserver's ``--strict-model-config``) turns
    auto-complete off. The checksum check, then ``hooks``, run on the directory before the model files are read;
    a hook may hand back another directory to read them from. ``gpu_count`` counts the GPUs instance groups may be
    placed on (asked only where a group's kind or ``gpus`` leaves it open); ``gpu_capable`` tells whether the
    model's backend can use them (by default ``backend_gpu_capable``; asked only for a ``KIND_AUTO`` group where a
    GPU is visible, and for a ``KIND_GPU`` one).
    """
    if files is None:
        return _read_model(model_dir.name, model_dir, strict, config_override, hooks, gpu_count, gpu_capable)
    written = layout.write_model_files(model_dir.name, files)
    try:
        return _read_model(model_dir.name, written, strict, config_override, hooks, gpu_count, gpu_capable)
    except BaseException:
        shutil.rmtree(written, ignore_errors=True)
        raise


def _read_model(
    name: str,
    model_dir: Path,
    strict: bool,
    config_override: str | None,
    hooks: Sequence[LoadHook],
    gpu_count: Callable[[], int],
    gpu_capable: Callable[[Backend], bool],
) -> ModelDefinition:
    config = _load_config(name, model_dir, config_override, strict)
    if config.name and config.name != name:
        raise ConfigError(
            f"model '{name}': the config names the model '{config.name}'; the name must equal the directory's "
            "(or be left out)"
        )
    config.name = name
    if config.sequence_batching.iterative_sequence:
        raise ConfigError(
            f"model '{name}': sequence_batching.iterative_sequence (iterative scheduling) is not supported"
        )
    check_agents(name, config)
    model_dir = run_hooks(model_dir, config, (checksum_hook, *hooks))
    versions = layout.select_versions(name, config.version_policy, layout.version_dirs(model_dir))
    if is_ensemble(config):
        return _read_ensemble(name, model_dir, config, versions, _unused_warnings(name, config, ENSEMBLE))
    if not versions:
        raise ConfigError(f"model '{name}': no version directory (a numeric subdirectory such as 1/) in {model_dir}")
    backend_name = _backend_name(name, model_dir, config, versions)
    module = _backend_module(name, backend_name)
    warnings = _unused_warnings(name, config, backend_name)  # of the config as written, before it is completed
    filename = config.default_model_filename or module.DEFAULT_MODEL_FILENAME
    model_files = {version: model_dir / str(version) / filename for version in versions}
    for version, model_file in model_files.items():
        if not model_file.exists():
            raise ConfigError(f"model '{name}': version {version} has no model file {version}/{filename}")
    if not strict:
        complete_config(name, config, module, model_files[versions[-1]])
    _normalize(config, backend_name, module, functools.cache(gpu_count), functools.cache(lambda: gpu_capable(module)))
    mapped = backend_parameters(name, backend_name, config)
    with _about(name):
        specs = {version: _model_spec(name, version, config, mapped.parameters, model_dir) for version in versions}
    return ModelDefinition(
        name=name,
        backend=backend_name,
        model_dir=model_dir,
        specs=specs,
        ensemble=None,
        model_files=model_files,
        reshape=_reshapes(config),
        op_libraries=layout.op_libraries(model_dir, config.model_operations.op_library_filename),
        config_json=config_json(config),
        warnings=warnings + mapped.warnings,
    )


# reading ----------------------------------------------------------------------------------------------------------


def _load_config(name: str, model_dir: Path, config_override: str | None, strict: bool) -> pb.ModelConfig:
    if config_override is not None:
        return parse_config_json(config_override, name)
    if not model_dir.is_dir():
        raise ConfigError(f"model '{name}': directory {str(model_dir)!r} does not exist")
    path = model_dir / layout.CONFIG_FILENAME
    if path.is_file():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"model '{name}': cannot read {layout.CONFIG_FILENAME}: {exc}") from None
        return parse_config_text(text, name)
    if strict:
        raise ConfigError(
            f"model '{name}': no {layout.CONFIG_FILENAME} in {model_dir} (a strict model config must be written out)"
        )
    return pb.ModelConfig()


def _unused_warnings(name: str, config: pb.ModelConfig, backend_name: str) -> tuple[str, ...]:
    return tuple(
        f"model '{name}': field '{field}' is set but is not supported by pyserve and is ignored"
        for field in unused_fields(config, MAPPED_FIELDS.get(backend_name))
    )


def _backend_name(name: str, model_dir: Path, config: pb.ModelConfig, versions: list[int]) -> str:
    if not config.backend and not config.platform:
        return layout.guess_backend(name, model_dir, versions)
    with _about(name):
        chosen = backend_for(config.backend, config.platform)
        if config.backend and config.platform and backend_for("", config.platform) != chosen:
            raise ConfigError(f"backend '{config.backend}' does not serve platform '{config.platform}'")
    return chosen


def _backend_module(name: str, backend_name: str) -> Backend:
    with _about(name):
        try:
            return backend(backend_name)
        except ImportError as exc:
            raise ConfigError(f"backend '{backend_name}' cannot be imported: {exc}") from exc


def _read_ensemble(
    name: str, model_dir: Path, config: pb.ModelConfig, versions: list[int], warnings: tuple[str, ...]
) -> ModelDefinition:
    if config.platform != ENSEMBLE or config.backend or not config.HasField("ensemble_scheduling"):
        raise ConfigError(
            f"model '{name}': an ensemble needs platform \"ensemble\", no backend and ensemble_scheduling"
        )
    if not config.version_policy.WhichOneof("policy_choice"):
        config.version_policy.latest.num_versions = 1
    version = versions[-1] if versions else 1
    with _about(name):
        spec = EnsembleSpec(
            name=name,
            version=version,
            inputs=tuple(_tensor(t, "input", t.optional) for t in config.input),
            outputs=tuple(_tensor(t, "output", False) for t in config.output),
            steps=tuple(
                Step(
                    model=step.model_name,
                    inputs=dict(step.input_map),
                    outputs=dict(step.output_map),
                    version=None if step.model_version in (-1, 0) else int(step.model_version),
                )
                for step in config.ensemble_scheduling.step
            ),
            max_batch_size=config.max_batch_size,
        )
    return ModelDefinition(
        name=name,
        backend=ENSEMBLE,
        model_dir=model_dir,
        specs={},
        ensemble=spec,
        model_files={},
        reshape={},
        op_libraries=(),
        config_json=config_json(config),
        warnings=warnings,
    )


# Triton's defaults --------------------------------------------------------------------------------------------------


def _normalize(
    config: pb.ModelConfig,
    backend_name: str,
    module: Backend,
    gpu_count: Callable[[], int],
    gpu_capable: Callable[[], bool],
) -> None:
    """Fill the defaults Triton fills before it serves a config (and answers it on /config), in place."""
    config.backend = backend_name
    if not config.platform and module.PLATFORMS:
        config.platform = module.PLATFORMS[0]
    if not config.version_policy.WhichOneof("policy_choice"):
        config.version_policy.latest.num_versions = 1
    if not config.HasField("optimization"):
        config.optimization.input_pinned_memory.enable = True
        config.optimization.output_pinned_memory.enable = True
    if not config.instance_group:
        config.instance_group.add()
    for index, group in enumerate(config.instance_group):
        group.name = group.name or f"{config.name}_{index}"
        group.count = max(group.count, 1)
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            # As in Triton: on the GPUs when any is visible, every one listed is and the backend can use them (an
            # ONNX model stays on the CPU where only the CPU build of onnxruntime is installed), else on the CPU.
            visible = gpu_count()
            if visible and all(0 <= gpu < visible for gpu in group.gpus) and gpu_capable():
                group.kind = pb.ModelInstanceGroup.KIND_GPU
            else:
                group.kind = pb.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
        elif group.kind == pb.ModelInstanceGroup.KIND_GPU and not gpu_capable():
            lacks, install = _GPU_NEEDS.get(backend_name, ("its framework has no GPU support", "install its GPU build"))
            raise ConfigError(
                f"model '{config.name}': instance_group '{group.name}' asks for KIND_GPU, but backend "
                f"'{backend_name}' cannot use a GPU here ({lacks}); {install}"
            )
        if group.kind == pb.ModelInstanceGroup.KIND_GPU and not group.gpus:
            visible = gpu_count()
            if not visible:
                raise ConfigError(f"model '{config.name}': instance_group asks for KIND_GPU but no GPU is visible")
            group.gpus.extend(range(visible))
    if not config.default_model_filename:
        config.default_model_filename = module.DEFAULT_MODEL_FILENAME
    normalize_sequence_batching(config)


# onto pyserve's definitions ---------------------------------------------------------------------------------------


def _model_spec(
    name: str, version: int, config: pb.ModelConfig, parameters: dict[str, str], model_dir: Path
) -> ModelSpec:
    if not config.input or not config.output:
        missing = "input" if not config.input else "output"
        raise ConfigError(f"no {missing} is declared, and none could be read from the model file; declare it")
    instances, devices = _placement(config)
    model_config = ModelConfig(
        max_batch_size=config.max_batch_size,
        batcher=_batcher(config.dynamic_batching) if config.HasField("dynamic_batching") else None,
        decoupled=config.model_transaction_policy.decoupled,
        instances=instances,
        devices=devices,
        worker=WorkerKind.PROCESS,
        response_cache=config.response_cache.enable,
        parameters=dict(parameters),
        sequence_batcher=(
            sequence_batcher(config.sequence_batching, model_dir) if config.HasField("sequence_batching") else None
        ),
    )
    return ModelSpec(
        name=name,
        version=version,
        inputs=tuple(_tensor(t, "input", t.optional) for t in config.input),
        outputs=tuple(_tensor(t, "output", False) for t in config.output),
        config=model_config,
    )


def _tensor(tensor: pb.ModelInput | pb.ModelOutput, kind: str, optional: bool) -> Tensor:
    if not tensor.name:
        raise ConfigError(f"an {kind} has no name")
    if tensor.data_type == pb.TYPE_INVALID:
        raise ConfigError(f"{kind} '{tensor.name}' has no data_type")
    datatype = datatype_of(pb.DataType.Name(tensor.data_type))
    return Tensor(tensor.name, datatype, tuple(tensor.dims), optional)


def _batcher(settings: pb.ModelDynamicBatching) -> DynamicBatcher:
    return DynamicBatcher(
        max_queue_delay_microseconds=settings.max_queue_delay_microseconds,
        preferred_batch_size=tuple(settings.preferred_batch_size),
        preserve_ordering=settings.preserve_ordering,
        priority_levels=settings.priority_levels,
        default_priority_level=settings.default_priority_level,
        default_queue_policy=_queue_policy(settings.default_queue_policy),
        priority_queue_policy={
            int(level): _queue_policy(policy) for level, policy in settings.priority_queue_policy.items()
        },
    )


def _queue_policy(policy: pb.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=pb.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action),
        default_timeout_microseconds=policy.default_timeout_microseconds,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size,
    )


def _placement(config: pb.ModelConfig) -> tuple[int, tuple[str, ...]]:
    """Instances and the device of each, from normalized instance groups (a GPU group's count is per GPU)."""
    devices: list[str] = []
    for group in config.instance_group:
        if group.kind == pb.ModelInstanceGroup.KIND_GPU:
            for gpu in group.gpus:
                if gpu < 0:
                    raise ConfigError(f"instance_group '{group.name}': GPU {gpu} is not a device id")
                devices.extend([f"cuda:{gpu}"] * group.count)
        elif group.gpus:
            kind = pb.ModelInstanceGroup.Kind.Name(group.kind)
            raise ConfigError(f"instance_group '{group.name}' of kind {kind} lists gpus {list(group.gpus)}")
        else:
            devices.extend(["cpu"] * group.count)
    # Instances placed on the CPU only need no device list (the core's default placement is the CPU).
    return len(devices), tuple(devices) if any(d != "cpu" for d in devices) else ()


def _reshapes(config: pb.ModelConfig) -> dict[str, tuple[int, ...]]:
    tensors: list[pb.ModelInput | pb.ModelOutput] = [*config.input, *config.output]
    return {t.name: tuple(int(d) for d in t.reshape.shape) for t in tensors if t.HasField("reshape")}


@contextlib.contextmanager
def _about(name: str) -> Iterator[None]:
    """Name the model in a ConfigError that does not already."""
    try:
        yield
    except ConfigError as exc:
        message = str(exc)
        if message.startswith((f"model '{name}'", f"ensemble '{name}'")):
            raise
        raise ConfigError(f"model '{name}': {message}") from exc
