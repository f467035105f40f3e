"""Auto-complete: what a model's config leaves out, read from its model file, as Triton's auto-complete does.

``complete_config`` fills a repository model's config in place: inputs, outputs and ``max_batch_size`` from the
tensors the file declares (``backend(name).autocomplete``), or, for a ``model.py``, from what the Python backend's
``describe`` makes of it (which imports the file in a child process: the user's code never runs in the core).
``complete_binding`` does the same for a model
file bound without a repository (``Serve.bind_model``). Both follow one rule: a file whose tensors all have a
variable first dimension batches, with ``max_batch_size`` 4 (Triton's ``default-max-batch-size``) and a dynamic
batcher.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from pyserve.backends import DEFAULT_MAX_BATCH_SIZE, Backend, Signature, TensorSignature, backend
from pyserve.config import ModelConfig, QueuePolicy, Tensor, TimeoutAction, WorkerKind
from pyserve.dtypes import config_type
from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2 as pb
from pyserve.repository.config_document import config_json
from pyserve.repository.sequence_batching import write_sequence_batching

logger = logging.getLogger(__name__)


def complete_config(name: str, config: pb.ModelConfig, module: Backend, model_file: Path) -> None:
    """Fill what a repository model's config leaves out (max_batch_size, inputs, outputs) from its file, in place."""
    declared = bool(config.input) and bool(config.output)
    describe = getattr(module, "describe", None)
    if describe is not None:  # the Python backend: a model.py declares itself in code
        if not declared:  # (which runs that code, in a child process: only when the config lacks tensors)
            _complete_from_code(name, config, describe, model_file)
        return
    if declared and config.max_batch_size > 0:
        return
    try:
        signature = _read_signature(name, module, model_file)
    except ConfigError as exc:
        if declared:  # nothing is missing: the config stands as written
            logger.debug("%s", exc)
            return
        raise
    if signature is None:
        return
    if config.max_batch_size == 0 and not _spells_batch_dim(config, signature):
        config.max_batch_size = _max_batch_size(signature)
        if config.max_batch_size > 0 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    batch = 1 if config.max_batch_size > 0 else 0
    for declared_tensors, found in ((config.input, signature.inputs), (config.output, signature.outputs)):
        known = {t.name: t for t in declared_tensors}
        for file_tensor in found:
            target = known.get(file_tensor.name)
            if target is None and not known:
                target = declared_tensors.add(name=file_tensor.name)
            if target is not None and target.data_type == pb.TYPE_INVALID:
                tensor = _served_tensor(file_tensor, batch)
                target.data_type = _data_type(tensor)
                if not target.dims:
                    target.dims.extend(tensor.shape)


def complete_binding(
    model_name: str,
    backend_name: str,
    model_file: Path,
    inputs: Sequence[Tensor] | None,
    outputs: Sequence[Tensor] | None,
    config: ModelConfig | None,
) -> tuple[Sequence[Tensor], Sequence[Tensor], ModelConfig]:
    """The tensors and config of a model file bound without a repository (``Serve.bind_model``): what is not given
    is read from the file; its instances are processes."""
    if backend_name == "python" and (inputs is None or outputs is None or config is None):
        from pyserve.backends.python_loader import describe

        described = describe(model_file)
        if described is not None:
            declared_inputs, declared_outputs, declared_config = described
            inputs = inputs if inputs is not None or not declared_inputs else declared_inputs
            outputs = outputs if outputs is not None or not declared_outputs else declared_outputs
            config = config if config is not None or declared_config is None else declared_config
    signature = None
    if inputs is None or outputs is None or config is None:
        signature = _read_signature(model_name, backend(backend_name), model_file)
    if config is None:
        max_batch_size = _max_batch_size(signature)
        config = ModelConfig(max_batch_size=max_batch_size) if max_batch_size else ModelConfig(batcher=None)
    config = dataclasses.replace(config, worker=WorkerKind.PROCESS)
    if inputs is None or outputs is None:
        if signature is None:
            raise ConfigError(
                f"model '{model_name}': the {backend_name} file '{model_file.name}' does not declare its tensors; "
                "pass inputs=[Tensor(...)] and outputs=[Tensor(...)]"
            )
        batch = 1 if config.max_batch_size > 0 else 0
        if batch and not signature.batch_dim:
            raise ConfigError(
                f"model '{model_name}': max_batch_size {config.max_batch_size} needs a variable first dimension on "
                f"every tensor of '{model_file.name}'"
            )
        if inputs is None:
            inputs = [_served_tensor(t, batch) for t in signature.inputs]
        if outputs is None:
            outputs = [_served_tensor(t, batch) for t in signature.outputs]
    return inputs, outputs, config


# shared by both --------------------------------------------------------------------------------------------------


def _read_signature(name: str, module: Backend, model_file: Path) -> Signature | None:
    """The tensors ``model_file`` declares (None where its format does not say); ConfigError when it cannot be read."""
    try:
        return module.autocomplete(model_file)
    except Exception as exc:
        raise ConfigError(
            f"model '{name}': cannot read the tensors of {model_file.name} to complete its config: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _max_batch_size(signature: Signature | None) -> int:
    """The max_batch_size a model file gets: Triton's default when every tensor's first dim is variable, else 0."""
    return DEFAULT_MAX_BATCH_SIZE if signature is not None and signature.batch_dim else 0


def _served_tensor(tensor: TensorSignature, batch: int) -> Tensor:
    """A tensor of a model file as clients see it: without its first (batch) dim when ``batch`` is 1."""
    return Tensor(tensor.name, tensor.datatype, tensor.dims[batch:])


def _data_type(tensor: Tensor) -> pb.DataType:
    return cast(pb.DataType, pb.DataType.Value(config_type(tensor.datatype)))


# the repository's config ------------------------------------------------------------------------------------------


def _spells_batch_dim(config: pb.ModelConfig, signature: Signature) -> bool:
    """Whether the config writes out the file's first dim in some tensor's dims: a model that does not batch."""
    by_name = {t.name: t for t in signature.inputs + signature.outputs}
    spelled = [t for t in [*config.input, *config.output] if t.name in by_name and t.dims]
    return any(len(t.dims) == len(by_name[t.name].dims) for t in spelled)


def _complete_from_code(name: str, config: pb.ModelConfig, describe: Any, model_file: Path) -> None:
    """Fill tensors, batching and decoupling from what a model.py declares (``describe``: Triton's
    ``auto_complete_config`` or pyserve's module-level ``inputs``, ``outputs`` and ``config``), in place."""
    try:
        described = describe(model_file, config_json(config))
    except ConfigError as exc:  # it names the file and the reason
        raise ConfigError(f"model '{name}': {exc}") from exc
    except Exception as exc:
        raise ConfigError(
            f"model '{name}': {model_file.name} cannot describe itself: {type(exc).__name__}: {exc}"
        ) from exc
    if described is None:
        return
    inputs, outputs, declared = described
    for target, tensors in ((config.input, inputs), (config.output, outputs)):
        if not target:
            for tensor in tensors:
                entry = target.add(name=tensor.name, data_type=_data_type(tensor))
                entry.dims.extend(tensor.shape)
                if tensor.optional and isinstance(entry, pb.ModelInput):
                    entry.optional = True
    if declared is None:
        return
    config.max_batch_size = config.max_batch_size or declared.max_batch_size
    if declared.dynamic_batching and declared.batcher and config.WhichOneof("scheduling_choice") is None:
        batcher = declared.batcher
        settings = config.dynamic_batching
        settings.SetInParent()
        settings.preferred_batch_size.extend(batcher.preferred_batch_size)
        settings.max_queue_delay_microseconds = batcher.max_queue_delay_microseconds
        settings.preserve_ordering = batcher.preserve_ordering
        settings.priority_levels = batcher.priority_levels
        settings.default_priority_level = batcher.default_priority_level
        _set_policy(settings.default_queue_policy, batcher.default_queue_policy)
        for level, policy in batcher.priority_queue_policy.items():
            _set_policy(settings.priority_queue_policy[level], policy)
    if declared.sequence_batcher is not None and config.WhichOneof("scheduling_choice") is None:
        write_sequence_batching(declared.sequence_batcher, config.sequence_batching)
    if declared.decoupled:
        config.model_transaction_policy.decoupled = True


def _set_policy(target: pb.ModelQueuePolicy, policy: QueuePolicy) -> None:
    target.timeout_action = pb.ModelQueuePolicy.TimeoutAction.Value(TimeoutAction(policy.timeout_action).value)
    target.default_timeout_microseconds = policy.default_timeout_microseconds
    target.allow_timeout_override = policy.allow_timeout_override
    target.max_queue_size = policy.max_queue_size
