"""The fuzz server's models and the tensors they take: strategies for valid tensors of each datatype, their wire
forms, and the check that an accepted request came back unchanged (every model is an identity)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from pyserve.dtypes import deserialize_bytes, serialize_bytes

DATATYPES = (
    "BOOL",
    "UINT8",
    "INT8",
    "INT16",
    "UINT32",
    "INT32",
    "INT64",
    "UINT64",
    "FP16",
    "BF16",
    "FP32",
    "FP64",
    "BYTES",
)
DTYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "INT16": np.int16,
    "UINT32": np.uint32,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": bytes,
}
MAX_BATCH = 8
MAX_REQUEST_BYTES = 256 * 1024
FIXED_MODEL = "fixed_int32"  # INT32 [2, 3], no batching
FIXED_SHAPE = (2, 3)
# Every model the server has, for cases that pick a model at random.
MODEL_NAMES = (*(f"identity_{datatype.lower()}" for datatype in DATATYPES), FIXED_MODEL, "pair")


def model_of(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def same_values_reshaped(model: str, before: list[int], after: list[int]) -> bool:
    """Whether a request whose input shape went from ``before`` to ``after`` is still valid: an identity model
    (``[-1]`` with batches up to MAX_BATCH) takes the same values as any ``[batch, n]`` of the same element count."""
    if after == before:
        return True
    if not model.startswith("identity_") or len(after) != 2 or any(type(dim) is not int for dim in after):
        return False  # (a JSON shape may hold floats, strings, booleans: those are refused)
    if not 1 <= after[0] <= MAX_BATCH or after[1] < 0:
        return False
    return after[0] * after[1] == int(np.prod(before))


@dataclass
class Tensor:
    """A valid input: the model it goes to, its datatype and its values."""

    model: str
    datatype: str
    array: np.ndarray  # object array of bytes for BYTES

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)

    def raw(self) -> bytes:
        """The bytes of the binary tensor data extension and of gRPC raw contents."""
        if self.datatype == "BYTES":
            return serialize_bytes(self.array)
        return np.ascontiguousarray(self.array).tobytes()

    def json_ready(self) -> bool:
        """Whether the values can travel as JSON in a request (FP16 and BF16 cannot; BYTES only as UTF-8)."""
        if self.datatype in ("FP16", "BF16"):
            return False
        return self.datatype != "BYTES" or all(_is_utf8(item) for item in self.array.reshape(-1))

    def json_output_ready(self) -> bool:
        """Whether the values can come back as JSON (BYTES only as UTF-8)."""
        return self.datatype != "BYTES" or all(_is_utf8(item) for item in self.array.reshape(-1))

    def json_data(self, nested: bool) -> Any:
        """The values as a JSON request's ``data``: flat or nested."""
        array = self.array if nested else self.array.reshape(-1)
        if self.datatype == "BYTES":
            return np.vectorize(lambda item: item.decode(), otypes=[object])(array).tolist() if array.size else []
        return array.tolist()


def _is_utf8(item: bytes) -> bool:
    try:
        item.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _elements(datatype: str) -> st.SearchStrategy[Any]:
    if datatype == "BOOL":
        return st.booleans()
    if datatype == "BYTES":
        return st.one_of(st.binary(max_size=6), st.text(max_size=4).map(str.encode))
    if datatype in ("FP16", "FP32", "FP64"):
        return st.floats(width={"FP16": 16, "FP32": 32, "FP64": 64}[datatype])
    if datatype == "BF16":
        return st.floats(width=32)
    info = np.iinfo(DTYPES[datatype])
    return st.integers(int(info.min), int(info.max))


@st.composite
def tensors(draw: st.DrawFn, datatype: str | None = None) -> Tensor:
    """A valid input of one of the identity models (rows of 0 to 4 elements: zero-size tensors included)."""
    if datatype is None:
        datatype = draw(st.sampled_from((*DATATYPES, "FIXED")))
    if datatype == "FIXED":
        shape: tuple[int, ...] = FIXED_SHAPE
        model, datatype = FIXED_MODEL, "INT32"
    else:
        shape = (draw(st.integers(1, 3)), draw(st.integers(0, 4)))
        model = model_of(datatype)
    count = int(np.prod(shape))
    values = draw(st.lists(_elements(datatype), min_size=count, max_size=count))
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = values
    else:
        array = np.array(values, dtype=np.float32 if datatype == "BF16" else DTYPES[datatype])
        array = array.astype(DTYPES[datatype])
    return Tensor(model, datatype, array.reshape(shape))


def dumps(doc: Any) -> bytes:
    """JSON as tritonclient writes it: NaN and infinities as Python's json writes them."""
    return json.dumps(doc, separators=(",", ":")).encode()


def same_values(tensor: Tensor, datatype: str, shape: list[int], values: np.ndarray) -> str | None:
    """None when an output is the input unchanged, else what differs."""
    if datatype != tensor.datatype or shape != tensor.shape:
        return f"output {datatype} {shape} for input {tensor.datatype} {tensor.shape}"
    expected = tensor.array.reshape(-1)
    got = values.reshape(-1)
    if tensor.datatype == "BYTES":
        same = list(expected) == list(got)
    elif tensor.datatype in ("FP16", "BF16", "FP32", "FP64"):
        same = expected.shape == got.shape and bool(
            np.array_equal(expected.astype(np.float64), got.astype(np.float64), equal_nan=True)
        )
    else:
        same = bool(np.array_equal(expected, got))
    return None if same else f"values changed: sent {expected!r}, got {got!r}"


def from_raw(datatype: str, shape: list[int], data: bytes) -> np.ndarray:
    """An output's values from its binary form."""
    count = int(np.prod(shape))
    if datatype == "BYTES":
        return deserialize_bytes(data, count)
    return np.frombuffer(data, dtype=DTYPES[datatype], count=count)


def from_json(datatype: str, data: list[Any]) -> np.ndarray:
    """An output's values from its JSON form."""
    if datatype == "BYTES":
        array = np.empty(len(data), dtype=object)
        array[:] = [item.encode("utf-8") for item in data]
        return array
    if datatype in ("FP16", "BF16", "FP32", "FP64"):
        return np.array(data, dtype=np.float64).astype(DTYPES[datatype])
    return np.array(data, dtype=DTYPES[datatype])
