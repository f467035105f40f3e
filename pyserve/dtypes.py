"""numpy dtypes <-> KServe v2 / Triton datatypes, and the BYTES wire encoding.

BYTES tensors are numpy object arrays of ``bytes`` inside pyserve. On the wire (binary tensor extension, shared
memory, ZeroMQ frames) each element is a 4-byte little-endian length followed by that many bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np

from pyserve.errors import ConfigError, InvalidInputError

BF16 = np.dtype(ml_dtypes.bfloat16)

_NUMPY_OF: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": BF16,
    "BYTES": np.dtype(object),
}
DATATYPES = tuple(_NUMPY_OF)
_DATATYPE_OF: dict[np.dtype[Any], str] = {dt: name for name, dt in _NUMPY_OF.items()}
_CONFIG_TYPE_OF = {name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in DATATYPES}
_LENGTH = struct.Struct("<I")


def datatype_of(dtype: Any) -> str:
    """The KServe datatype ('FP32', 'BYTES', ...) of a numpy dtype, Python type or datatype name."""
    if isinstance(dtype, str):
        upper = dtype.upper()
        if upper in _NUMPY_OF:
            return upper
        if upper.startswith("TYPE_"):
            name = "BYTES" if upper == "TYPE_STRING" else upper[5:]
            if name in _NUMPY_OF:
                return name
        if dtype.lower() == "bfloat16":
            return "BF16"
    if dtype is None:
        # np.dtype(None) is float64: a missing dtype must not silently become FP64.
        raise ConfigError("dtype must be given, got None")
    if dtype in (bytes, str, object):
        return "BYTES"
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as exc:
        raise ConfigError(f"unsupported dtype {dtype!r}") from exc
    if np_dtype.kind in ("S", "U", "O"):
        return "BYTES"
    try:
        return _DATATYPE_OF[np_dtype]
    except KeyError:
        raise ConfigError(f"unsupported dtype {dtype!r}; use one of {', '.join(DATATYPES)}") from None


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype pyserve uses for a KServe datatype (object for BYTES)."""
    return _NUMPY_OF[datatype]


def config_type(datatype: str) -> str:
    """The Triton model-config name of a datatype ('FP32' -> 'TYPE_FP32', 'BYTES' -> 'TYPE_STRING')."""
    return _CONFIG_TYPE_OF[datatype]


def itemsize(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype (0 for BYTES)."""
    return 0 if datatype == "BYTES" else _NUMPY_OF[datatype].itemsize


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview, np.bytes_)):
        return bytes(value)
    return str(value).encode("utf-8")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Encode a BYTES tensor (object, bytes_ or str_ array) as length-prefixed elements in C order."""
    parts: list[bytes] = []
    pack = _LENGTH.pack
    for item in array.ravel(order="C"):
        data = _as_bytes(item)
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int, name: str = "") -> np.ndarray:
    """Decode ``count`` length-prefixed elements that fill ``buffer`` exactly into a 1-D object array."""
    view = memoryview(buffer).cast("B")
    size = len(view)
    out = np.empty(count, dtype=object)
    offset = 0
    label = f"input '{name}': " if name else ""
    for index in range(count):
        if offset + 4 > size:
            raise InvalidInputError(
                f"{label}BYTES data ends after {index} of {count} elements (no room for a length prefix)"
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > size:
            raise InvalidInputError(
                f"{label}BYTES element {index} declares {length} bytes but only {size - offset} remain"
            )
        out[index] = view[offset : offset + length].tobytes()
        offset += length
    if offset != size:
        raise InvalidInputError(f"{label}BYTES data has {size - offset} bytes after its {count} elements")
    return out


def as_bytes_array(array: np.ndarray) -> np.ndarray:
    """A BYTES tensor given as str_/bytes_/object array, as an object array of bytes."""
    if array.dtype == object and all(isinstance(x, bytes) for x in array.flat):
        return array
    out = np.empty(array.shape, dtype=object)
    for index, item in enumerate(array.flat):
        out.flat[index] = _as_bytes(item)
    return out
