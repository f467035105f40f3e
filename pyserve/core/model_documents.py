"""The Triton-shaped documents of a bound model: its metadata and its model configuration.

``GET /v2/models/{m}`` answers the metadata and ``GET /v2/models/{m}/config`` the configuration (gRPC
``ModelMetadata`` and ``ModelConfig`` the same), the one ``perf_analyzer`` reads. Both follow from the model's
``ModelSpec`` alone.
"""

from __future__ import annotations

from typing import Any

from pyserve.config import ControlKind, ModelSpec, SequenceBatcher, SequenceStrategy
from pyserve.dtypes import config_type


def model_metadata(spec: ModelSpec, versions: list[int] | None = None) -> dict[str, Any]:
    """The model metadata document; ``versions`` lists every version of the model (default: the spec's)."""
    batch = [-1] if spec.config.max_batch_size > 0 else []
    return {
        "name": spec.name,
        "versions": [str(v) for v in (versions or [spec.version])],
        "platform": "python",
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": batch + list(t.shape)} for t in spec.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": batch + list(t.shape)} for t in spec.outputs],
    }


def model_config_json(spec: ModelSpec) -> dict[str, Any]:
    """The Triton-shaped model configuration."""
    cfg = spec.config
    doc: dict[str, Any] = {
        "name": spec.name,
        "platform": "",
        "backend": "python",
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": cfg.max_batch_size,
        "input": [
            {
                "name": t.name,
                "data_type": config_type(t.datatype),
                "format": "FORMAT_NONE",
                "dims": list(t.shape),
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": t.optional,
                "is_non_linear_format_io": False,
            }
            for t in spec.inputs
        ],
        "output": [
            {
                "name": t.name,
                "data_type": config_type(t.datatype),
                "dims": list(t.shape),
                "label_filename": "",
                "is_shape_tensor": False,
                "is_non_linear_format_io": False,
            }
            for t in spec.outputs
        ],
        "batch_input": [],
        "batch_output": [],
        "optimization": {
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": {"enable": True},
            "output_pinned_memory": {"enable": True},
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": False,
        },
    }
    if cfg.dynamic_batching and cfg.batcher is not None:
        batcher = cfg.batcher
        doc["dynamic_batching"] = {
            "preferred_batch_size": list(batcher.preferred_batch_size),
            "max_queue_delay_microseconds": batcher.max_queue_delay_microseconds,
            "preserve_ordering": batcher.preserve_ordering,
            "priority_levels": batcher.priority_levels,
            "default_priority_level": batcher.default_priority_level,
            "priority_queue_policy": {
                str(level): _policy_json(policy) for level, policy in batcher.priority_queue_policy.items()
            },
        }
        if batcher.default_queue_policy != type(batcher.default_queue_policy)():
            doc["dynamic_batching"]["default_queue_policy"] = _policy_json(batcher.default_queue_policy)
    if cfg.sequence_batcher is not None:
        doc["sequence_batching"] = sequence_batching_json(cfg.sequence_batcher, cfg.max_batch_size)
    gpus = [int(d.split(":", 1)[1]) for d in cfg.devices if d.startswith("cuda:")]
    doc["instance_group"] = [
        {
            "name": f"{spec.name}_0",
            "kind": "KIND_GPU" if gpus else "KIND_CPU",
            "count": cfg.instances,
            "gpus": gpus,
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]
    doc["default_model_filename"] = ""
    doc["cc_model_filenames"] = {}
    doc["metric_tags"] = {}
    doc["parameters"] = {key: {"string_value": value} for key, value in cfg.parameters.items()}
    doc["model_warmup"] = []
    doc["model_transaction_policy"] = {"decoupled": cfg.decoupled}
    return doc


def _policy_json(policy: Any) -> dict[str, Any]:
    return {
        "timeout_action": policy.timeout_action.value,
        "default_timeout_microseconds": policy.default_timeout_microseconds,
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


def sequence_batching_json(batcher: SequenceBatcher, max_batch_size: int) -> dict[str, Any]:
    """A sequence batcher as Triton's config JSON shows ``sequence_batching`` (its defaults filled in as Triton fills
    them: an ``oldest`` strategy without preferred sizes prefers ``max_batch_size``)."""
    if batcher.strategy is SequenceStrategy.OLDEST:
        preferred = list(batcher.preferred_batch_size) or ([max_batch_size] if max_batch_size > 0 else [])
        strategy: dict[str, Any] = {
            "oldest": {
                "max_candidate_sequences": batcher.max_candidate_sequences,
                "preferred_batch_size": preferred,
                "max_queue_delay_microseconds": batcher.max_queue_delay_microseconds,
                "preserve_ordering": batcher.preserve_ordering,
            }
        }
    else:
        strategy = {
            "direct": {
                "max_queue_delay_microseconds": batcher.max_queue_delay_microseconds,
                "minimum_slot_utilization": batcher.minimum_slot_utilization,
            }
        }
    controls = []
    for control in batcher.control_inputs:
        values = list(control.false_true) if control.false_true is not None else []
        datatype = control.datatype
        controls.append(
            {
                "name": control.name,
                "control": [
                    {
                        "kind": ControlKind(control.kind).value,
                        "int32_false_true": values if datatype == "INT32" and values else [],
                        "fp32_false_true": values if datatype == "FP32" else [],
                        "bool_false_true": values if datatype == "BOOL" else [],
                        "data_type": config_type(datatype) if control.kind is ControlKind.CORRID else "TYPE_INVALID",
                    }
                ],
            }
        )
    states = []
    for state in batcher.states:
        initial: list[dict[str, Any]] = []
        value = state.initial_value
        if value is not None:
            # Triton's initial state is zeros or a file's data: a value given in Python shows as zero_data only
            # when it is zeros.
            zero = all(len(item) == 0 for item in value.flat) if value.dtype == object else not value.any()
            entry: dict[str, Any] = {"data_type": config_type(state.datatype), "dims": list(value.shape)}
            if zero:
                entry["zero_data"] = True
            entry["name"] = ""
            initial.append(entry)
        states.append(
            {
                "input_name": state.input_name,
                "output_name": state.output_name,
                "data_type": config_type(state.datatype),
                "dims": list(state.shape),
                "initial_state": initial,
                "use_same_buffer_for_input_output": False,
                "use_growable_memory": False,
            }
        )
    return {
        **strategy,
        "max_sequence_idle_microseconds": batcher.max_sequence_idle_microseconds,
        "control_input": controls,
        "state": states,
        "iterative_sequence": False,
    }
