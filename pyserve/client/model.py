"""What every client shares, whatever its protocol and whether sync or async: the server's address, the model's
configuration as the server reports it, and turning a call's arguments into a request and its response into the
dict it returns (adding and removing the batch axis for ``infer_sample``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np

from pyserve.client.tls import ClientTls
from pyserve.config import Tensor
from pyserve.dtypes import as_bytes_array, datatype_of, deserialize_bytes, numpy_dtype, serialize_bytes
from pyserve.errors import ClientError, ConfigError, InvalidInputError, UnsupportedError
from pyserve.frontends.shared_memory import BYTE_SIZE, OFFSET, REGION

DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
# A URL's scheme: the protocol, and whether over TLS (Triton serves TLS on the same ports).
SCHEMES = {"http": ("http", False), "https": ("http", True), "grpc": ("grpc", False), "grpcs": ("grpc", True)}
# PyTriton's defaults: wait up to 5 minutes for the server and model, 60 s for one inference.
DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
Parameters = Mapping[str, str | int | float | bool]
Headers = Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class ServerAddress:
    """Where a server listens: ``scheme`` is the protocol, ``http`` or ``grpc``; ``tls`` is set when the connection
    is over TLS (``https://``, ``grpcs://``)."""

    scheme: str
    host: str
    port: int
    tls: ClientTls | None = None

    @property
    def authority(self) -> str:
        """``host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}{'s' if self.tls else ''}://{self.authority}"


def parse_url(url: str, tls: ClientTls | None = None) -> ServerAddress:
    """``http://host:port``, ``grpc://host:port`` or ``host:port`` (HTTP), or over TLS ``https://`` and
    ``grpcs://`` (trusting ``tls``'s authorities, else the system's); the port defaults to 8000 or 8001."""
    text = url if "://" in url else f"http://{url}"
    parts = urlsplit(text)
    if parts.scheme.lower() not in SCHEMES:
        raise ConfigError(f"server url {url!r}: scheme must be http, https, grpc or grpcs, got {parts.scheme!r}")
    scheme, secure = SCHEMES[parts.scheme.lower()]
    if tls is not None and not secure:
        raise ConfigError(f"server url {url!r}: TLS settings given for a plain connection (use https:// or grpcs://)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"server url {url!r}: give only scheme, host and port")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"server url {url!r}: {exc}") from None
    if not parts.hostname:
        raise ConfigError(f"server url {url!r} has no host")
    port = DEFAULT_PORTS[scheme] if port is None else port
    return ServerAddress(scheme, parts.hostname, port, (tls or ClientTls()) if secure else None)


@dataclasses.dataclass(frozen=True)
class RemoteModelConfig:
    """A served model's configuration as its server reports it (PyTriton's ``TritonModelConfig``, in short).

    ``inputs`` and ``outputs`` are in the model's declared order, their shapes without the batch dimension when the
    model batches (``max_batch_size > 0``); ``document`` is the whole configuration in Triton's JSON form.
    """

    model_name: str
    model_version: str | None
    max_batch_size: int
    decoupled: bool
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    document: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @property
    def batching(self) -> bool:
        """Whether the model takes a batch dimension (``max_batch_size > 0``)."""
        return self.max_batch_size > 0

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], model_name: str, model_version: str | None) -> RemoteModelConfig:
        """Read Triton's model configuration JSON (``/v2/models/{m}/config``, or gRPC's converted to JSON)."""

        def tensors(key: str) -> tuple[Tensor, ...]:
            return tuple(
                Tensor(
                    str(item["name"]),
                    _dtype(str(item.get("data_type", "TYPE_INVALID"))),
                    tuple(int(dim) for dim in item.get("dims", ())),
                    optional=bool(item.get("optional", False)),
                )
                for item in doc.get(key, ())
            )

        try:
            policy = doc.get("model_transaction_policy") or {}
            return cls(
                model_name=str(doc.get("name") or model_name),
                model_version=model_version,
                max_batch_size=int(doc.get("max_batch_size", 0)),
                decoupled=bool(policy.get("decoupled", False)),
                inputs=tensors("input"),
                outputs=tensors("output"),
                document=doc,
            )
        except (ConfigError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ClientError(f"model '{model_name}': cannot read the configuration the server sent: {exc}") from exc


def _dtype(config_type: str) -> Any:
    """The dtype a tensor of a Triton config type is given, as PyTriton's: a numpy scalar type, ``bytes`` for
    strings."""
    datatype = datatype_of(config_type)
    return bytes if datatype == "BYTES" else numpy_dtype(datatype).type


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one tensor lies in a shared-memory region: Triton's three parameters of an input or requested output."""

    region: str
    offset: int
    byte_size: int

    def parameters(self) -> dict[str, str | int]:
        """``shared_memory_region``, ``shared_memory_byte_size`` and ``shared_memory_offset``."""
        return {REGION: self.region, BYTE_SIZE: self.byte_size, OFFSET: self.offset}


class TensorsInRegion(Protocol):
    """A request's tensors placed in a shared-memory region (``shared_memory.RegionLayout``): what the codecs send
    in place of their bytes, and how they read an output the server wrote there."""

    @property
    def inputs(self) -> Mapping[str, Placement]:
        """The inputs in the region."""

    @property
    def outputs(self) -> Mapping[str, Placement]:
        """The outputs asked for in the region."""

    @property
    def requested(self) -> tuple[str, ...]:
        """Every output to name in the request when some are in the region (a request naming outputs gets only
        those named)."""

    def read_output(self, name: str, datatype: str, shape: list[int]) -> np.ndarray:
        """Output ``name`` as the server wrote it into the region (a copy)."""


@dataclasses.dataclass
class InferRequest:
    """One inference request, protocol-neutral: what the codecs encode. With ``regions``, the inputs it places are
    sent as their place in a shared-memory region instead of their bytes, and the outputs it places are asked for
    there."""

    model_name: str
    model_version: str | None
    inputs: dict[str, np.ndarray]
    parameters: Parameters | None = None
    headers: Headers | None = None
    regions: TensorsInRegion | None = None


def build_request(
    config: RemoteModelConfig,
    model_version: str | None,
    args: tuple[Any, ...],
    named: Mapping[str, Any],
    parameters: Parameters | None,
    headers: Headers | None,
    sample: bool,
) -> InferRequest:
    """The request for ``infer_sample`` (``sample``: add the batch axis when the model batches) or ``infer_batch``.

    Inputs come by position, in the model's declared input order, or by name, never both (as in PyTriton).
    """
    if args and named:
        raise InvalidInputError(
            f"model '{config.model_name}': give inputs by position or by name, not both "
            f"({len(args)} positional, named {sorted(named)})"
        )
    if not sample and not config.batching:
        raise UnsupportedError(
            f"model '{config.model_name}' does not batch (max_batch_size 0): use infer_sample instead of infer_batch"
        )
    if len(args) > len(config.inputs):
        raise InvalidInputError(
            f"model '{config.model_name}' takes {len(config.inputs)} input(s) "
            f"({', '.join(t.name for t in config.inputs)}), got {len(args)} positional"
        )
    pairs = zip((t.name for t in config.inputs), args, strict=False) if args else named.items()
    inputs: dict[str, np.ndarray] = {}
    for name, value in pairs:
        array = np.asarray(value)
        inputs[name] = array[np.newaxis, ...] if sample and config.batching else array
    _check_parameters(config.model_name, parameters)
    return InferRequest(config.model_name, model_version, inputs, parameters, headers)


def _check_parameters(model_name: str, parameters: Parameters | None) -> None:
    for key, value in (parameters or {}).items():
        if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
            raise InvalidInputError(
                f"model '{model_name}': parameter {key!r} must be a string, number or boolean, got "
                f"{type(value).__name__}"
            )


def sample_outputs(config: RemoteModelConfig, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The outputs of ``infer_sample``: the batch axis the request got is removed again."""
    if not config.batching:
        return outputs
    return {name: array[0] for name, array in outputs.items()}


def wire_datatype(name: str, array: np.ndarray) -> str:
    """The KServe datatype an input array is sent as (its own dtype; strings and objects as BYTES)."""
    try:
        return datatype_of(array.dtype)
    except ConfigError:
        raise InvalidInputError(f"input '{name}': numpy dtype {array.dtype} has no KServe datatype") from None


def fill_shape(declared: tuple[int, ...], batch_rows: int | None, count: int) -> list[int]:
    """The shape of ``count`` elements of a tensor declared ``declared`` (with ``batch_rows`` rows first when the
    model batches): one variable dimension takes what the fixed ones leave; with several, the elements past the
    batch dimension stay flat."""
    dims = list(declared)
    rows = [] if batch_rows is None else [batch_rows]
    per_row = count // batch_rows if batch_rows else count
    variable = [index for index, dim in enumerate(dims) if dim == -1]
    fixed = math.prod(dim for dim in dims if dim != -1)
    if len(variable) == 1 and fixed and per_row % fixed == 0:
        dims[variable[0]] = per_row // fixed
    elif variable or math.prod(dims) != per_row:
        dims = [per_row]
    return rows + dims


def tensor_bytes(datatype: str, array: np.ndarray) -> bytes | memoryview:
    """An input's data as the binary tensor extension and gRPC raw contents carry it (BYTES length-prefixed)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def array_from_bytes(datatype: str, shape: list[int], data: bytes | memoryview) -> np.ndarray:
    """An output received as bytes: a read-only view for fixed-size datatypes, an object array of bytes for BYTES."""
    if datatype == "BYTES":
        return deserialize_bytes(data, math.prod(shape)).reshape(shape)
    return np.frombuffer(data, dtype=numpy_dtype(datatype)).reshape(shape)


def array_from_json(datatype: str, shape: list[int], data: Any) -> np.ndarray:
    """An output received as JSON data (a flat or nested list, or one scalar)."""
    if datatype == "BYTES":
        flat = data if isinstance(data, list) else [data]
        return as_bytes_array(np.array(flat, dtype=object).reshape(-1)).reshape(shape)
    return np.asarray(data, dtype=numpy_dtype(datatype)).reshape(shape)
