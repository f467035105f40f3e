"""Bound models as the core knows them: specs, instances, readiness, validation and Triton-shaped documents."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyserve.config import ModelSpec, Tensor
from pyserve.core.inference import InputTensor
from pyserve.core.stats import ModelStats
from pyserve.dtypes import config_type
from pyserve.errors import ConfigError, InvalidInputError, ModelAlreadyBoundError, ModelNotFoundError

if TYPE_CHECKING:
    from pyserve.core.scheduler import ModelScheduler


@dataclass(eq=False)
class Instance:
    """One connected worker instance of a model."""

    identity: bytes
    index: int
    kind: str
    pid: int
    busy: bool = False
    batch_id: int = 0


@dataclass(eq=False)
class ModelEntry:
    """One version of one bound model."""

    spec: ModelSpec
    stats: ModelStats = field(default_factory=ModelStats)
    instances: list[Instance] = field(default_factory=list)
    scheduler: ModelScheduler | None = None

    def __post_init__(self) -> None:
        self.name = self.spec.name
        self.version = self.spec.version
        self.batching = self.spec.config.max_batch_size > 0
        self.max_batch_size = self.spec.config.max_batch_size
        self.response_cache = self.spec.config.response_cache
        if self.response_cache and self.spec.config.decoupled:
            # As in Triton: a stream of responses is not one cacheable result.
            raise ConfigError(f"model '{self.name}': response_cache cannot be used with a decoupled (streaming) model")
        self.inputs: dict[str, Tensor] = {t.name: t for t in self.spec.inputs}
        self.outputs: dict[str, Tensor] = {t.name: t for t in self.spec.outputs}
        self.required_inputs = frozenset(t.name for t in self.spec.inputs if not t.optional)
        self.single_input = self.spec.inputs[0] if len(self.spec.inputs) == 1 else None

    @property
    def ready(self) -> bool:
        """A model is ready while at least one instance is connected."""
        return bool(self.instances)

    def validate(self, inputs: dict[str, InputTensor], requested_outputs: list[str]) -> int:
        """Check a request against the declared tensors; returns its batch size (rows; 1 without batching)."""
        for name in inputs:
            if name not in self.inputs:
                raise InvalidInputError(
                    f"unexpected inference input '{name}' for model '{self.name}'; "
                    f"expected inputs: {sorted(self.inputs)}"
                )
        missing = self.required_inputs.difference(inputs)
        if missing:
            raise InvalidInputError(f"missing required input(s) {sorted(missing)} for model '{self.name}'")
        rows = -1
        for name, tensor in inputs.items():
            declared = self.inputs[name]
            if tensor.datatype != declared.datatype:
                raise InvalidInputError(f"input '{name}': expected datatype {declared.datatype}, got {tensor.datatype}")
            dims = declared.shape
            shape = tensor.shape
            if self.batching:
                if len(shape) != len(dims) + 1:
                    raise InvalidInputError(
                        f"input '{name}': expected shape [-1,{','.join(map(str, dims))}] (batch dimension first), "
                        f"got {shape}"
                    )
                if rows == -1:
                    rows = shape[0]
                elif shape[0] != rows:
                    raise InvalidInputError(
                        f"input '{name}': batch size {shape[0]} differs from the other inputs' batch size {rows}"
                    )
                tail = shape[1:]
            else:
                tail = shape
                if len(shape) != len(dims):
                    raise InvalidInputError(f"input '{name}': expected shape {list(dims)}, got {shape}")
            for expected, got in zip(dims, tail, strict=True):
                if expected != -1 and expected != got:
                    prefix = "[-1," if self.batching else "["
                    raise InvalidInputError(
                        f"input '{name}': expected shape {prefix}{','.join(map(str, dims))}], got {shape}"
                    )
        if self.batching:
            if rows < 1:
                raise InvalidInputError(f"model '{self.name}': batch size must be at least 1, got {rows}")
            if rows > self.max_batch_size:
                raise InvalidInputError(
                    f"model '{self.name}': batch size {rows} exceeds max_batch_size {self.max_batch_size}"
                )
        for name in requested_outputs:
            if name not in self.outputs:
                raise InvalidInputError(
                    f"unexpected inference output '{name}' for model '{self.name}'; "
                    f"expected outputs: {sorted(self.outputs)}"
                )
        return rows if self.batching else 1

    def index_entry(self) -> dict[str, Any]:
        """This version in the repository index: Triton's name/version/state/reason, plus live instance counts."""
        configured = self.spec.config.instances
        live = len(self.instances)
        return {
            "name": self.name,
            "version": str(self.version),
            "state": "READY" if live else "UNAVAILABLE",
            "reason": "" if live == configured else f"{live} of {configured} instances live",
            "instances": {"configured": configured, "live": live},
        }

    def metadata(self, versions: list[int] | None = None) -> dict[str, Any]:
        """The model metadata document (``GET /v2/models/{m}``); ``versions`` lists every version of the model."""
        batch = [-1] if self.batching else []
        return {
            "name": self.name,
            "versions": [str(v) for v in (versions or [self.version])],
            "platform": "python",
            "inputs": [
                {"name": t.name, "datatype": t.datatype, "shape": batch + list(t.shape)} for t in self.spec.inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": t.datatype, "shape": batch + list(t.shape)} for t in self.spec.outputs
            ],
        }

    def config_json(self) -> dict[str, Any]:
        """The Triton-shaped model configuration (``GET /v2/models/{m}/config``)."""
        cfg = self.spec.config
        doc: dict[str, Any] = {
            "name": self.name,
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
                for t in self.spec.inputs
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
                for t in self.spec.outputs
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
                "name": f"{self.name}_0",
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


class Registry:
    """All bound model versions, by name then version."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, ModelEntry]] = {}

    def add(self, entry: ModelEntry) -> None:
        """Register a model version; binding the same name and version twice is an error."""
        versions = self._models.setdefault(entry.name, {})
        if entry.version in versions:
            raise ModelAlreadyBoundError(f"model '{entry.name}' version {entry.version} is already bound")
        versions[entry.version] = entry

    def remove(self, name: str, version: int) -> ModelEntry | None:
        """Forget a model version."""
        versions = self._models.get(name, {})
        entry = versions.pop(version, None)
        if not versions:
            self._models.pop(name, None)
        return entry

    def get(self, name: str, version: str | int | None = None) -> ModelEntry:
        """A model version; without a version, the highest one. Raises ModelNotFoundError."""
        versions = self._models.get(name)
        if not versions:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
        if version is None or version == "":
            return versions[max(versions)]
        try:
            number = int(version)
        except (TypeError, ValueError):
            raise ModelNotFoundError(f"Request for unknown model: '{name}' version {version!r} is not found") from None
        entry = versions.get(number)
        if entry is None:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' version {number} is not found")
        return entry

    def entries(self) -> list[ModelEntry]:
        """Every model version, sorted by name and version."""
        return [self._models[name][v] for name in sorted(self._models) for v in sorted(self._models[name])]

    def versions(self, name: str) -> list[ModelEntry]:
        """All versions of one model (empty when unknown)."""
        return [entry for _, entry in sorted(self._models.get(name, {}).items())]
