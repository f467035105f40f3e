"""Tests of pyserve.dtypes: datatype names, and the length-prefixed BYTES encoding."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from pyserve.dtypes import (
    DATATYPES,
    as_bytes_array,
    config_type,
    datatype_of,
    deserialize_bytes,
    itemsize,
    numpy_dtype,
    serialize_bytes,
)
from pyserve.errors import ConfigError, InvalidInputError

ALL_TYPES = [
    ("BOOL", np.bool_, "TYPE_BOOL", 1),
    ("UINT8", np.uint8, "TYPE_UINT8", 1),
    ("UINT16", np.uint16, "TYPE_UINT16", 2),
    ("UINT32", np.uint32, "TYPE_UINT32", 4),
    ("UINT64", np.uint64, "TYPE_UINT64", 8),
    ("INT8", np.int8, "TYPE_INT8", 1),
    ("INT16", np.int16, "TYPE_INT16", 2),
    ("INT32", np.int32, "TYPE_INT32", 4),
    ("INT64", np.int64, "TYPE_INT64", 8),
    ("FP16", np.float16, "TYPE_FP16", 2),
    ("FP32", np.float32, "TYPE_FP32", 4),
    ("FP64", np.float64, "TYPE_FP64", 8),
    ("BF16", ml_dtypes.bfloat16, "TYPE_BF16", 2),
    ("BYTES", object, "TYPE_STRING", 0),
]


def blob(*items: bytes) -> bytes:
    """Length-prefixed elements, as on the wire."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def test_every_datatype_is_covered() -> None:
    assert sorted(DATATYPES) == sorted(name for name, *_ in ALL_TYPES)


@pytest.mark.parametrize(("datatype", "np_type", "config_name", "size"), ALL_TYPES)
def test_datatype_numpy_and_config_names_agree(datatype: str, np_type: object, config_name: str, size: int) -> None:
    assert numpy_dtype(datatype) == np.dtype(np_type)
    assert datatype_of(np_type) == datatype
    assert datatype_of(np.dtype(np_type)) == datatype
    assert datatype_of(datatype) == datatype
    assert datatype_of(datatype.lower()) == datatype
    assert datatype_of(config_name) == datatype
    assert config_type(datatype) == config_name
    assert itemsize(datatype) == size


@pytest.mark.parametrize(
    "dtype", [bytes, str, object, np.bytes_, np.str_, np.dtype("S5"), np.dtype("U3"), "TYPE_STRING"]
)
def test_string_like_dtypes_are_bytes(dtype: object) -> None:
    assert datatype_of(dtype) == "BYTES"


def test_python_scalar_types_and_bfloat16_spellings() -> None:
    assert datatype_of(bool) == "BOOL"
    assert datatype_of(int) == "INT64"
    assert datatype_of(float) == "FP64"
    assert datatype_of("bfloat16") == "BF16"
    assert datatype_of("BFloat16") == "BF16"
    assert datatype_of("float32") == "FP32"


@pytest.mark.parametrize("dtype", [np.complex128, "no-such-type", "TYPE_COMPLEX", None, np.dtype("M8[s]")])
def test_unsupported_dtypes_are_config_errors(dtype: object) -> None:
    with pytest.raises(ConfigError, match="dtype"):
        datatype_of(dtype)


# BYTES encoding -------------------------------------------------------------------------------------------------


def test_serialize_bytes_writes_little_endian_length_prefixes_in_c_order() -> None:
    array = np.array([[b"ab", b""], [b"c", b"def"]], dtype=object)
    assert serialize_bytes(array) == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x01\x00\x00\x00c" + (
        b"\x03\x00\x00\x00def"
    )
    assert serialize_bytes(array.T) == blob(b"ab", b"c", b"", b"def")


@pytest.mark.parametrize(
    "items",
    [
        [b"hello", b"", b"world"],
        [b""],
        [b"", b""],
        ["héllo".encode(), "日本語".encode(), "🙂".encode()],
        [bytes(range(256))],
    ],
)
def test_bytes_round_trip(items: list[bytes]) -> None:
    array = np.array([*items, b"x"], dtype=object)[:-1]  # an object array even when all items are equal length
    decoded = deserialize_bytes(serialize_bytes(array), len(items))
    assert decoded.dtype == object
    assert decoded.tolist() == items


def test_str_items_are_encoded_as_utf8() -> None:
    mixed = np.array(["héllo", b"raw", np.str_("x"), np.bytes_(b"y")], dtype=object)
    assert serialize_bytes(mixed) == blob("héllo".encode(), b"raw", b"x", b"y")
    assert serialize_bytes(np.array(["日本", "a"])) == blob("日本".encode(), b"a")
    assert serialize_bytes(np.array([b"ab", b"c"])) == blob(b"ab", b"c")


def test_zero_elements_round_trip() -> None:
    assert serialize_bytes(np.empty((0, 3), dtype=object)) == b""
    assert deserialize_bytes(b"", 0).shape == (0,)


def test_deserialize_accepts_memoryviews_and_copies_out_bytes() -> None:
    data = bytearray(blob(b"abc"))
    decoded = deserialize_bytes(memoryview(data), 1)
    data[4:7] = b"xyz"
    assert decoded[0] == b"abc"
    assert type(decoded[0]) is bytes


def test_truncated_length_prefix_is_an_invalid_input() -> None:
    with pytest.raises(
        InvalidInputError, match=r"input 'text': BYTES data ends after 1 of 2 elements \(no room for a length prefix\)"
    ):
        deserialize_bytes(blob(b"ab") + b"\x01\x00", 2, "text")


def test_length_larger_than_the_data_is_an_invalid_input() -> None:
    with pytest.raises(InvalidInputError, match="input 'text': BYTES element 1 declares 9 bytes but only 3 remain"):
        deserialize_bytes(blob(b"ab") + struct.pack("<I", 9) + b"abc", 2, "text")


def test_trailing_bytes_are_an_invalid_input() -> None:
    with pytest.raises(InvalidInputError, match="input 'text': BYTES data has 2 bytes after its 1 elements"):
        deserialize_bytes(blob(b"ab") + b"zz", 1, "text")


def test_error_messages_without_a_name_have_no_label() -> None:
    with pytest.raises(InvalidInputError, match=r"^BYTES data has 1 bytes after its 0 elements$"):
        deserialize_bytes(b"z", 0)


def test_as_bytes_array_converts_str_and_bytes_arrays() -> None:
    already = np.array([b"a", b"bc"], dtype=object)
    assert as_bytes_array(already) is already
    converted = as_bytes_array(np.array([["a", "é"]]))
    assert converted.dtype == object
    assert converted.shape == (1, 2)
    assert converted.tolist() == [[b"a", "é".encode()]]
    assert as_bytes_array(np.array([b"x", b"yz"])).tolist() == [b"x", b"yz"]
