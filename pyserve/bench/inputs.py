"""The requests a benchmark sends: random data shaped by the model's declared inputs, or the samples of a data file.

Random data (perf_analyzer's default) fills every required input: floats in [0, 1), integers in [0, 64), random
booleans, BYTES as random lowercase strings of ``string_length`` characters. A dimension the model declares
variable (-1) needs ``--shape NAME:DIMS``. A data file is perf_analyzer's ``--input-data`` JSON, ``{"data":
[sample, ...]}``, each sample mapping input names to a flat or nested list, ``{"content": [...], "shape": [...]}`` or
``{"b64": "...", "shape": [...]}``; with ``--batch-size N`` a request takes N consecutive samples as its rows.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyserve.bench.settings import BenchSettings
from pyserve.client.model import RemoteModelConfig, fill_shape
from pyserve.config import Tensor
from pyserve.dtypes import as_bytes_array, numpy_dtype
from pyserve.errors import ConfigError

Inputs = dict[str, np.ndarray]
_INTEGER_HIGH = 64


def request_inputs(config: RemoteModelConfig, settings: BenchSettings) -> list[Inputs]:
    """The requests to send, in turn: one of random data, or one per data-file sample (``batch_size`` rows each
    when the model batches). ConfigError names what does not fit the model."""
    if config.decoupled:
        raise ConfigError(
            f"model '{config.model_name}' is decoupled (it streams its responses): bench measures models that "
            "answer each request once"
        )
    declared = {tensor.name: tensor for tensor in config.inputs}
    unknown = sorted(set(settings.shapes) - set(declared))
    if unknown:
        raise ConfigError(
            f"--shape names {', '.join(repr(name) for name in unknown)}, not an input of model "
            f"'{config.model_name}' (its inputs: {', '.join(declared) or 'none'})"
        )
    if settings.batch_size > 1 and not config.batching:
        raise ConfigError(
            f"model '{config.model_name}' does not batch (max_batch_size 0): --batch-size must be 1, "
            f"got {settings.batch_size}"
        )
    if settings.data_file is not None:
        return _file_requests(Path(settings.data_file), config, settings)
    rng = np.random.default_rng(settings.seed)
    rows = (settings.batch_size,) if config.batching else ()
    request: Inputs = {}
    for tensor in config.inputs:
        if tensor.optional and tensor.name not in settings.shapes:
            continue
        dims = _dims(tensor, settings.shapes.get(tensor.name), config.model_name)
        request[tensor.name] = random_array(tensor.datatype, rows + dims, rng, settings.string_length)
    return [request]


def random_array(datatype: str, shape: tuple[int, ...], rng: np.random.Generator, string_length: int) -> np.ndarray:
    """An array of random values of ``datatype`` (a KServe name) and ``shape``."""
    if datatype == "BYTES":
        count = math.prod(shape)
        letters = rng.integers(ord("a"), ord("z") + 1, size=(count, string_length), dtype=np.uint8)
        strings = np.empty(count, dtype=object)
        strings[:] = [row.tobytes() for row in letters]
        return strings.reshape(shape)
    if datatype == "BOOL":
        return rng.random(shape) < 0.5
    dtype = numpy_dtype(datatype)
    if datatype.startswith(("FP", "BF")):
        return rng.random(shape).astype(dtype)
    return rng.integers(0, _INTEGER_HIGH, size=shape).astype(dtype)


def _dims(tensor: Tensor, given: tuple[int, ...] | None, model: str) -> tuple[int, ...]:
    """An input's dimensions without the batch dimension: ``--shape``'s, checked against the declared ones."""
    declared = tensor.shape
    if given is None:
        if -1 in declared:
            example = ",".join("16" if dim == -1 else str(dim) for dim in declared)
            raise ConfigError(
                f"input '{tensor.name}' of model '{model}' has a variable dimension (shape {list(declared)}): "
                f"give its dimensions, e.g. --shape {tensor.name}:{example}"
            )
        return declared
    fits = len(given) == len(declared) and all(d in (-1, g) for d, g in zip(declared, given, strict=True))
    if not fits:
        raise ConfigError(
            f"--shape {tensor.name}:{','.join(map(str, given))} does not fit input '{tensor.name}' of model "
            f"'{model}', declared {list(declared)} (without the batch dimension)"
        )
    return given


# data files -----------------------------------------------------------------------------------------------------


def _file_requests(path: Path, config: RemoteModelConfig, settings: BenchSettings) -> list[Inputs]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--data {path}: cannot read it: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--data {path}: not JSON: {exc}") from None
    samples = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(samples, list) or not samples:
        raise ConfigError(f'--data {path}: expected {{"data": [sample, ...]}} with at least one sample')
    parsed = [_sample(path, index, sample, config, settings.shapes) for index, sample in enumerate(samples)]
    if not config.batching:
        return parsed
    # A request takes batch_size consecutive samples as its rows; there are as many requests as samples.
    requests = []
    for start in range(len(parsed)):
        rows = [parsed[(start + offset) % len(parsed)] for offset in range(settings.batch_size)]
        names = set(rows[0])
        if any(set(row) != names for row in rows):
            raise ConfigError(f"--data {path}: samples {start} onwards give different inputs, so they cannot batch")
        try:
            requests.append({name: np.stack([row[name] for row in rows]) for name in rows[0]})
        except ValueError as exc:
            raise ConfigError(f"--data {path}: samples {start} onwards cannot form a batch: {exc}") from None
    return requests


def _sample(
    path: Path, index: int, sample: Any, config: RemoteModelConfig, shapes: Mapping[str, tuple[int, ...]]
) -> Inputs:
    where = f"--data {path}, sample {index}"
    if not isinstance(sample, dict):
        raise ConfigError(f"{where}: expected an object mapping input names to data (sequences are not supported)")
    declared = {tensor.name: tensor for tensor in config.inputs}
    unknown = sorted(set(sample) - set(declared))
    if unknown:
        raise ConfigError(f"{where}: {', '.join(map(repr, unknown))} is not an input of model '{config.model_name}'")
    missing = [tensor.name for tensor in config.inputs if not tensor.optional and tensor.name not in sample]
    if missing:
        raise ConfigError(f"{where}: input {', '.join(map(repr, missing))} is missing")
    return {name: _array(where, declared[name], value, shapes.get(name)) for name, value in sample.items()}


def _array(where: str, tensor: Tensor, value: Any, given: tuple[int, ...] | None) -> np.ndarray:
    shape: Sequence[int] | None = given
    if isinstance(value, dict):
        if "shape" in value:
            shape = [int(dim) for dim in value["shape"]]
        if "b64" in value:
            array = _from_b64(f"{where}, input '{tensor.name}'", tensor.datatype, value["b64"])
        elif "content" in value:
            array = _from_list(f"{where}, input '{tensor.name}'", tensor.datatype, value["content"])
        else:
            raise ConfigError(f"{where}, input '{tensor.name}': expected a list, or an object with content or b64")
    else:
        array = _from_list(f"{where}, input '{tensor.name}'", tensor.datatype, value)
    if shape is None:
        shape = fill_shape(tensor.shape, None, array.size) if -1 in tensor.shape else tensor.shape
    try:
        return array.reshape(tuple(shape))
    except ValueError:
        raise ConfigError(
            f"{where}, input '{tensor.name}': {array.size} values do not make shape {list(shape)}; give its "
            f'"shape" or --shape {tensor.name}:DIMS'
        ) from None


def _from_list(what: str, datatype: str, values: Any) -> np.ndarray:
    flat = np.asarray(values, dtype=object).reshape(-1)
    if datatype == "BYTES":
        return as_bytes_array(flat)
    try:
        return flat.astype(numpy_dtype(datatype))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: values are not {datatype}: {exc}") from None


def _from_b64(what: str, datatype: str, text: Any) -> np.ndarray:
    if datatype == "BYTES":
        raise ConfigError(f"{what}: b64 data is for fixed-size datatypes; give BYTES as a list of strings")
    try:
        raw = base64.b64decode(str(text), validate=True)
        return np.frombuffer(raw, dtype=numpy_dtype(datatype)).copy()
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"{what}: not base64 of {datatype} values: {exc}") from None
