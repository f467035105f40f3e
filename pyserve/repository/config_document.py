"""A model config as a document: ``config.pbtxt`` and the load API's JSON parsed into ``model_config_pb2``, the
config written back in Triton's JSON form (what ``/v2/models/{m}/config`` answers), and the fields set in it that
pyserve does not act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, text_format

from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2 as pb

# The platform of an ensemble.
ENSEMBLE = "ensemble"


def parse_config_text(text: str, model_name: str) -> pb.ModelConfig:
    """Parse a ``config.pbtxt``; a ConfigError names the model, the line and column, and what is wrong there."""
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        reason = str(exc).split(" : ", 1)[-1] if exc.GetLine() is not None else str(exc)
        raise ConfigError(
            f"model '{model_name}': config.pbtxt line {exc.GetLine()} column {exc.GetColumn()}: {reason}"
        ) from None
    return config


def parse_config_json(text: str, model_name: str) -> pb.ModelConfig:
    """Parse a config in Triton's JSON form (the load API's ``parameters: {"config": ...}``)."""
    config = pb.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"model '{model_name}': the config override is not a valid model config: {exc}") from None
    return config


def is_ensemble(config: pb.ModelConfig) -> bool:
    """Whether a config describes an ensemble (by its platform or its ``ensemble_scheduling``)."""
    return config.platform == ENSEMBLE or config.HasField("ensemble_scheduling")


def config_json(message: Any) -> dict[str, Any]:
    """A config message in Triton's JSON form: every field in declaration order, scalars, lists and maps even when
    empty, messages only when set, enums by name and 64-bit integers as numbers."""
    document: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            document[field.name] = {str(k): _json_value(value_field, v) for k, v in sorted(value.items())}
        elif _repeated(field):
            document[field.name] = [_json_value(field, item) for item in value]
        elif (field.message_type is None and field.containing_oneof is None) or message.HasField(field.name):
            document[field.name] = _json_value(field, value)
    return document


def _json_value(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        return config_json(value)
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return value if known is None else known.name
    return value


# Config fields pyserve acts on: a name maps to the fields used inside it, or to None when all of them are.
UsedFields = Mapping[str, "UsedFields | None"]
_USED: UsedFields = {
    **dict.fromkeys(("name", "platform", "backend", "version_policy", "max_batch_size", "dynamic_batching")),
    **dict.fromkeys(("default_model_filename", "parameters", "model_operations", "model_transaction_policy")),
    **dict.fromkeys(("model_repository_agents", "response_cache")),
    "sequence_batching": {
        **dict.fromkeys(("direct", "oldest", "max_sequence_idle_microseconds", "control_input", "iterative_sequence")),
        "state": dict.fromkeys(("input_name", "output_name", "data_type", "dims", "initial_state")),
    },
    "input": dict.fromkeys(("name", "data_type", "dims", "reshape", "optional")),
    "output": dict.fromkeys(("name", "data_type", "dims", "reshape")),
    "instance_group": dict.fromkeys(("name", "kind", "count", "gpus")),
    "ensemble_scheduling": {"step": dict.fromkeys(("model_name", "model_version", "input_map", "output_map"))},
}
_USED_BY_ENSEMBLES = ("name", "platform", "version_policy", "max_batch_size", "input", "output", "ensemble_scheduling")


def unused_fields(config: pb.ModelConfig, also_used: UsedFields | None = None) -> list[str]:
    """The fields set in a config that pyserve ignores, as dotted paths (``optimization``, ``input.format``);
    ``also_used`` names more that the model's backend reads."""
    used = _USED
    if is_ensemble(config):
        used = {key: value for key, value in _USED.items() if key in _USED_BY_ENSEMBLES}
    return _unused(config, _merged(used, also_used or {}), "")


def _merged(used: UsedFields, more: UsedFields) -> UsedFields:
    merged = dict(used)
    for key, inner in more.items():
        if key in used:
            current = used[key]
            merged[key] = None if current is None or inner is None else _merged(current, inner)
        else:
            merged[key] = inner
    return merged


def _unused(message: Any, used: UsedFields, prefix: str) -> list[str]:
    found: list[str] = []
    for field, value in message.ListFields():
        path = prefix + field.name
        if field.name not in used:
            found.append(path)
            continue
        inner = used[field.name]
        if inner is None:
            continue
        for item in value if _repeated(field) else [value]:
            found.extend(p for p in _unused(item, inner, path + ".") if p not in found)
    return found


def _repeated(field: Any) -> bool:
    """Whether a message field is repeated: ``is_repeated`` from protobuf 6.31 on (protobuf 7 dropped ``label``)."""
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(field.label == field.LABEL_REPEATED)
