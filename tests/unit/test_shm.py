"""Tests of pyserve.transport.shm: the owner's pool of reusable segments and the reader's mappings."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from pyserve.transport.shm import LARGE_SLOT_BYTES, MIN_SLOT_BYTES, SHM_DIR, ShmPool, ShmReader, remove_segments


@pytest.fixture
def prefix() -> Iterator[str]:
    """A prefix no other test or process uses; leftovers are removed afterwards."""
    name = f"pyserve-test-{uuid.uuid4().hex}"
    yield name
    remove_segments(name)


@pytest.fixture
def pool(prefix: str) -> Iterator[ShmPool]:
    """A pool of up to 1 MiB."""
    owner = ShmPool(prefix, 1 << 20)
    yield owner
    owner.close()


def segments(prefix: str) -> list[str]:
    """Names of the segment files with this prefix."""
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefix))


def test_allocate_creates_a_named_segment_of_at_least_the_size_asked(pool: ShmPool, prefix: str) -> None:
    slot = pool.allocate(100)
    assert slot is not None
    assert slot.name == f"{prefix}-1"
    assert slot.capacity == MIN_SLOT_BYTES
    assert os.path.getsize(os.path.join(SHM_DIR, slot.name)) == MIN_SLOT_BYTES
    assert segments(prefix) == [slot.name]
    assert pool.mapped_bytes == MIN_SLOT_BYTES


@pytest.mark.parametrize(
    ("nbytes", "capacity"),
    [
        (0, MIN_SLOT_BYTES),
        (1, MIN_SLOT_BYTES),
        (MIN_SLOT_BYTES, MIN_SLOT_BYTES),
        (MIN_SLOT_BYTES + 1, 2 * MIN_SLOT_BYTES),
        (300_000, 512 * 1024),
        (512 * 1024, 512 * 1024),
    ],
)
def test_slots_come_in_power_of_two_size_classes(pool: ShmPool, nbytes: int, capacity: int) -> None:
    slot = pool.allocate(nbytes)
    assert slot is not None
    assert slot.capacity == capacity


def test_released_slot_is_reused_for_the_same_size_class(pool: ShmPool, prefix: str) -> None:
    first = pool.allocate(1000)
    assert first is not None
    pool.release(first.name)
    again = pool.allocate(5000)
    assert again is first
    assert segments(prefix) == [first.name]
    assert pool.mapped_bytes == MIN_SLOT_BYTES


def test_a_slot_in_use_is_not_handed_out_twice(pool: ShmPool) -> None:
    first = pool.allocate(10)
    second = pool.allocate(10)
    assert first is not None
    assert second is not None
    assert first.name != second.name


def test_releasing_twice_does_not_duplicate_the_slot(pool: ShmPool) -> None:
    slot = pool.allocate(10)
    assert slot is not None
    pool.release(slot.name)
    pool.release(slot.name)
    one = pool.allocate(10)
    other = pool.allocate(10)
    assert one is slot
    assert other is not slot


def test_a_free_slot_of_another_size_class_is_not_reused(pool: ShmPool) -> None:
    small = pool.allocate(10)
    assert small is not None
    pool.release(small.name)
    big = pool.allocate(MIN_SLOT_BYTES * 2)
    assert big is not None
    assert big.name != small.name


def test_release_of_an_unknown_name_is_ignored(pool: ShmPool) -> None:
    pool.release("not-a-segment-of-this-pool")
    assert pool.allocate(1) is not None


def test_allocate_returns_none_at_the_byte_limit(prefix: str) -> None:
    pool = ShmPool(prefix, 2 * MIN_SLOT_BYTES)
    try:
        first = pool.allocate(1)
        assert first is not None
        assert pool.allocate(1) is not None
        assert pool.allocate(1) is None
        assert pool.allocate(3 * MIN_SLOT_BYTES) is None
        pool.release(first.name)
        assert pool.allocate(1) is first  # a free slot is still handed out at the limit
    finally:
        pool.close()


def test_close_unlinks_every_segment(prefix: str) -> None:
    pool = ShmPool(prefix, 1 << 20)
    slots = [pool.allocate(10), pool.allocate(MIN_SLOT_BYTES + 1)]
    assert len(segments(prefix)) == 2
    pool.release(slots[0].name)  # type: ignore[union-attr]
    pool.close()
    assert segments(prefix) == []
    assert pool.mapped_bytes == 0


# large slots: kept only up to the pool's retain_bytes -------------------------------------------------------------


@pytest.fixture
def reader() -> Iterator[ShmReader]:
    """A reader, closed afterwards."""
    mapped = ShmReader()
    yield mapped
    mapped.close()


@pytest.fixture
def large_pool(prefix: str) -> Iterator[ShmPool]:
    """A pool that keeps at most two free large slots' worth of bytes (segments stay sparse: nothing is written)."""
    owner = ShmPool(prefix, 1 << 30, retain_bytes=2 * LARGE_SLOT_BYTES)
    yield owner
    owner.close()


def test_a_large_slot_within_the_retained_bytes_is_reused(large_pool: ShmPool, prefix: str) -> None:
    slot = large_pool.allocate(LARGE_SLOT_BYTES)
    assert slot is not None
    large_pool.release(slot.name)
    assert large_pool.free_large_bytes == LARGE_SLOT_BYTES
    assert large_pool.allocate(LARGE_SLOT_BYTES - 1) is slot
    assert large_pool.free_large_bytes == 0
    assert segments(prefix) == [slot.name]


def test_a_large_slot_past_the_retained_bytes_is_unlinked_on_release(large_pool: ShmPool, prefix: str) -> None:
    kept = [large_pool.allocate(LARGE_SLOT_BYTES) for _ in range(2)]
    huge = large_pool.allocate(4 * LARGE_SLOT_BYTES)  # bigger than all that is retained
    assert huge is not None and all(slot is not None for slot in kept)
    assert large_pool.mapped_bytes == 6 * LARGE_SLOT_BYTES
    large_pool.release(huge.name)
    assert huge.name not in segments(prefix)
    assert huge.buffer.closed
    assert large_pool.mapped_bytes == 2 * LARGE_SLOT_BYTES
    for slot in kept:
        large_pool.release(slot.name)  # type: ignore[union-attr]
    assert large_pool.free_large_bytes == 2 * LARGE_SLOT_BYTES
    third = large_pool.allocate(LARGE_SLOT_BYTES)
    assert third in kept
    extra = large_pool.allocate(LARGE_SLOT_BYTES)
    another = large_pool.allocate(LARGE_SLOT_BYTES)  # a new segment: only one free slot was left
    assert extra in kept and another is not None and another not in kept
    for slot in (third, extra, another):
        large_pool.release(slot.name)  # type: ignore[union-attr]
    # Two are kept (the retained bytes), the third is unlinked: the pool is back to two segments.
    assert len(segments(prefix)) == 2
    assert large_pool.mapped_bytes == 2 * LARGE_SLOT_BYTES


def test_small_slots_are_kept_whatever_the_retained_bytes(prefix: str) -> None:
    pool = ShmPool(prefix, 1 << 20, retain_bytes=0)
    try:
        slot = pool.allocate(10)
        assert slot is not None
        pool.release(slot.name)
        assert pool.allocate(10) is slot
    finally:
        pool.close()


def mappings_of(name: str) -> int:
    """How many times segment ``name`` is mapped into this process."""
    path = os.path.join(SHM_DIR, name)
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.split()[-1] == path)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_reader_does_not_cache_large_segments(large_pool: ShmPool, reader: ShmReader) -> None:
    slot = large_pool.allocate(LARGE_SLOT_BYTES)
    assert slot is not None
    slot.buffer[:4] = b"abcd"
    view = reader.view(slot.name, 4)
    assert bytes(view) == b"abcd"
    assert reader._maps == {}
    assert mappings_of(slot.name) == 2  # the pool's mapping and the reader's
    view.release()
    # The last view gone, the reader's mapping is too: an owner that unlinks the segment frees its memory.
    assert mappings_of(slot.name) == 1


def test_reader_sees_what_the_pool_wrote(pool: ShmPool, reader: ShmReader) -> None:
    slot = pool.allocate(16)
    assert slot is not None
    slot.buffer[:5] = b"hello"
    view = reader.view(slot.name, 5)
    assert bytes(view) == b"hello"
    slot.buffer[:5] = b"world"  # same memory: later writes are visible through the view
    assert bytes(view) == b"world"
    view[0:1] = b"W"  # and the view is writable
    assert slot.buffer[:5] == b"World"
    view.release()


def test_reader_maps_each_segment_once(pool: ShmPool, reader: ShmReader) -> None:
    slot = pool.allocate(16)
    assert slot is not None
    slot.buffer[:4] = b"abcd"
    first = reader.view(slot.name, 2)
    second = reader.view(slot.name, 4)
    assert bytes(first) == b"ab"
    assert bytes(second) == b"abcd"
    assert len(reader._maps) == 1
    first.release()
    second.release()


def test_reader_forget_drops_mappings_of_a_prefix(pool: ShmPool, prefix: str) -> None:
    slot = pool.allocate(16)
    assert slot is not None
    reader = ShmReader()
    reader.view(slot.name, 4).release()
    reader.forget("some-other-prefix")
    assert slot.name in reader._maps
    reader.forget(prefix)
    assert reader._maps == {}


def test_reader_of_a_missing_segment_raises(prefix: str) -> None:
    with pytest.raises(FileNotFoundError):
        ShmReader().view(f"{prefix}-404", 1)


def test_remove_segments_unlinks_leftovers_of_a_prefix(prefix: str) -> None:
    crashed = ShmPool(prefix, 1 << 20)
    crashed.allocate(1)
    crashed.allocate(1)
    other_prefix = f"pyserve-test-{uuid.uuid4().hex}"
    survivor = ShmPool(other_prefix, 1 << 20)
    survivor.allocate(1)
    try:
        assert remove_segments(prefix) == 2
        assert segments(prefix) == []
        assert len(segments(other_prefix)) == 1
        assert remove_segments(prefix) == 0
    finally:
        survivor.close()
        crashed.close()


def test_remove_segments_refuses_an_empty_prefix() -> None:
    with pytest.raises(ValueError, match="non-empty prefix"):
        remove_segments("")
