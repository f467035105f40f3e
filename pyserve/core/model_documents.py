"""The Triton-shaped documents of a bound model: its metadata and its model configuration.

``GET /v2/models/{m}`` answers the metadata and ``GET /v2/models/{m}/config`` the configuration (gRPC
``ModelMetadata`` and ``ModelConfig`` the same), the one ``perf_analyzer`` reads. Both follow from the model's
``ModelSpec`` alone.
"""

from __future__ import annotations

from typing import Any

from pyserve.config import ModelSpec
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
