"""Tests of pyserve.transport.messages: placing buffers inline or in shared memory, and reading them back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest

from pyserve.dtypes import serialize_bytes
from pyserve.errors import InvalidInputError
from pyserve.transport.messages import FrameWriter, array_from_buffer, pack_header, read_buffer, unpack_header
from pyserve.transport.shm import ShmPool, ShmReader, remove_segments

THRESHOLD = 1024


@pytest.fixture
def pool() -> Iterator[ShmPool]:
    """A sender's pool with a unique prefix."""
    prefix = f"pyserve-test-{uuid.uuid4().hex}"
    owner = ShmPool(prefix, 1 << 20)
    yield owner
    owner.close()
    remove_segments(prefix)


@pytest.fixture
def reader() -> Iterator[ShmReader]:
    """A receiver's mappings."""
    mappings = ShmReader()
    yield mappings
    mappings.close()


def round_trip(writer: FrameWriter, array: np.ndarray, reader: ShmReader, datatype: str) -> np.ndarray:
    """Place an array, then read it back as the receiver would."""
    loc = writer.add_array(array)
    return array_from_buffer(read_buffer(loc, writer.frames, reader), datatype, array.shape)


def test_header_round_trip() -> None:
    header = {"t": "infer", "id": 7, "inputs": [["x", "FP32", [2, 3], 0], ["y", "BYTES", [1], ["seg-1", 12]]]}
    assert unpack_header(pack_header(header)) == header


def test_small_buffers_travel_inline_as_frames(pool: ShmPool) -> None:
    writer = FrameWriter(pool, THRESHOLD)
    assert writer.add(b"a" * 10, 10) == 0
    assert writer.add(b"b" * (THRESHOLD - 1), THRESHOLD - 1) == 1
    assert writer.frames == [b"a" * 10, b"b" * (THRESHOLD - 1)]
    assert writer.slots == []
    assert pool.mapped_bytes == 0


def test_buffers_at_the_threshold_go_through_shared_memory(pool: ShmPool, reader: ShmReader) -> None:
    writer = FrameWriter(pool, THRESHOLD)
    data = bytes(range(256)) * 4
    loc = writer.add(data, len(data))
    assert isinstance(loc, list)
    name, nbytes = loc
    assert name.startswith(pool.prefix)
    assert nbytes == THRESHOLD
    assert writer.slots == [name]
    assert writer.frames == []
    assert bytes(read_buffer(loc, writer.frames, reader)) == data


def test_without_a_pool_everything_is_inline() -> None:
    writer = FrameWriter(None, THRESHOLD)
    assert writer.add(b"x" * 10 * THRESHOLD, 10 * THRESHOLD) == 0
    assert writer.slots == []


def test_a_full_pool_falls_back_to_inline() -> None:
    prefix = f"pyserve-test-{uuid.uuid4().hex}"
    pool = ShmPool(prefix, 0)
    try:
        writer = FrameWriter(pool, THRESHOLD)
        assert writer.add(b"x" * THRESHOLD, THRESHOLD) == 0
        assert writer.slots == []
    finally:
        pool.close()


def test_add_parts_lays_parts_end_to_end_inline() -> None:
    writer = FrameWriter(None, THRESHOLD)
    first = np.arange(3, dtype=np.float32)
    second = np.arange(3, 5, dtype=np.float32)
    loc = writer.add_parts([first.view(np.uint8), second.view(np.uint8)], 20)
    assert loc == 0
    merged = array_from_buffer(read_buffer(loc, writer.frames, ShmReader()), "FP32", [5])
    np.testing.assert_array_equal(merged, np.arange(5, dtype=np.float32))


def test_add_parts_lays_parts_end_to_end_in_shared_memory(pool: ShmPool, reader: ShmReader) -> None:
    writer = FrameWriter(pool, THRESHOLD)
    rows = [np.full((100, 2), i, dtype=np.int32) for i in range(3)]
    nbytes = sum(r.nbytes for r in rows)
    loc = writer.add_parts([r.reshape(-1).view(np.uint8) for r in rows], nbytes)
    assert isinstance(loc, list)
    assert loc[1] == nbytes
    merged = array_from_buffer(read_buffer(loc, writer.frames, reader), "INT32", [300, 2])
    np.testing.assert_array_equal(merged, np.concatenate(rows))


def test_add_parts_with_one_part_is_add() -> None:
    writer = FrameWriter(None, THRESHOLD)
    part = np.arange(4, dtype=np.uint8)
    assert writer.add_parts([part], 4) == 0
    assert writer.frames[0] is part  # no copy


@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("FP32", np.arange(12, dtype=np.float32).reshape(3, 4)),
        ("INT64", np.array([-1, 0, 2**40], dtype=np.int64)),
        ("UINT8", np.arange(5, dtype=np.uint8)),
        ("BOOL", np.array([[True, False], [False, True]])),
        ("FP16", np.array([0.5, -2.0], dtype=np.float16)),
        ("BF16", np.array([1.5, -3.0], dtype=ml_dtypes.bfloat16)),
        ("FP64", np.float64(3.25).reshape(())),
    ],
)
def test_fixed_size_arrays_round_trip_inline(datatype: str, array: np.ndarray) -> None:
    result = round_trip(FrameWriter(None, THRESHOLD), array, ShmReader(), datatype)
    assert result.dtype == array.dtype
    assert result.shape == array.shape
    np.testing.assert_array_equal(result, array)


def test_large_arrays_round_trip_through_shared_memory(pool: ShmPool, reader: ShmReader) -> None:
    writer = FrameWriter(pool, THRESHOLD)
    array = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    result = round_trip(writer, array, reader, "FP32")
    assert len(writer.slots) == 1
    np.testing.assert_array_equal(result, array)


def test_non_contiguous_arrays_are_placed_in_c_order() -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    for view in (base.T, base[:, ::2], base[::-1]):
        assert not view.flags.c_contiguous
        np.testing.assert_array_equal(round_trip(FrameWriter(None, THRESHOLD), view, ShmReader(), "INT32"), view)


@pytest.mark.parametrize(
    "array",
    [
        np.array([b"a", b"", "é".encode()], dtype=object),
        np.array([["x", "yz"], ["", "日本"]]),
        np.array([b"ab", b"c"]),
    ],
    ids=["object", "str_", "bytes_"],
)
def test_bytes_arrays_travel_length_prefixed(array: np.ndarray) -> None:
    writer = FrameWriter(None, THRESHOLD)
    loc = writer.add_array(array)
    assert writer.frames[loc] == serialize_bytes(array)  # type: ignore[index]
    result = array_from_buffer(read_buffer(loc, writer.frames, ShmReader()), "BYTES", array.shape)
    assert result.dtype == object
    expected = [x if isinstance(x, bytes) else x.encode() for x in array.reshape(-1).tolist()]
    assert result.reshape(-1).tolist() == expected


def test_large_bytes_arrays_go_through_shared_memory(pool: ShmPool, reader: ShmReader) -> None:
    writer = FrameWriter(pool, THRESHOLD)
    array = np.array([b"x" * 600, b"y" * 600], dtype=object)
    result = round_trip(writer, array, reader, "BYTES")
    assert len(writer.slots) == 1
    assert result.tolist() == array.tolist()


def test_inline_arrays_are_read_back_without_a_copy() -> None:
    writer = FrameWriter(None, THRESHOLD)
    array = np.arange(16, dtype=np.float32)
    loc = writer.add_array(array)
    frame = writer.frames[loc]  # type: ignore[index]
    assert np.shares_memory(frame, array)  # contiguous arrays are sent as they are
    result = array_from_buffer(read_buffer(loc, writer.frames, ShmReader()), "FP32", [4, 4])
    assert np.shares_memory(result, frame)


def test_shared_memory_arrays_are_views_of_the_segment(pool: ShmPool, reader: ShmReader) -> None:
    writer = FrameWriter(pool, THRESHOLD)
    loc = writer.add_array(np.zeros(512, dtype=np.float32))
    result = array_from_buffer(read_buffer(loc, writer.frames, reader), "FP32", [512])
    slot = pool._slots[loc[0]]  # type: ignore[index]
    slot.buffer[:4] = np.float32(7).tobytes()
    assert result[0] == 7
    del result


def test_bytes_with_a_bad_blob_name_the_tensor() -> None:
    with pytest.raises(InvalidInputError, match="input 'text': BYTES data ends after 0 of 1 elements"):
        array_from_buffer(memoryview(b""), "BYTES", [1], "text")
