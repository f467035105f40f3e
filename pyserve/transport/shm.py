"""A pool of shared-memory segments for tensors too large to travel inline over ZeroMQ.

Each slot is one segment (``/dev/shm/<prefix>-<n>``) sized to a power of two. Freed slots are kept and reused,
so a steady stream of requests maps no new memory and takes no page faults. The owner of a pool creates and
unlinks its segments; readers map a segment once by name (``ShmReader``) and cache the mapping.
Every segment name starts with the session prefix, so ``remove_segments(prefix)`` cleans up after any crash.

Large slots (``LARGE_SLOT_BYTES`` and up) are not kept without bound: a pool keeps free large slots for reuse only
up to ``retain_bytes`` in all, and unmaps and unlinks a released one past that, so one huge request does not pin
its memory until shutdown. Readers never cache mappings of large segments (the mapping lives as long as the views
of it), so a segment its owner unlinks is not kept alive by a reader.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import tempfile
from dataclasses import dataclass

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
MIN_SLOT_BYTES = 64 * 1024
# Slots from this size on are "large": pooled only up to a pool's retain_bytes, never cached by readers.
LARGE_SLOT_BYTES = 16 << 20
# Free large slots a pool keeps for reuse, in bytes (a released large slot past this is unmapped and unlinked).
RETAIN_BYTES = 64 << 20


@dataclass
class Slot:
    """One segment of a pool: its name, capacity and writable mapping."""

    name: str
    capacity: int
    buffer: mmap.mmap


def _size_class(nbytes: int) -> int:
    return max(MIN_SLOT_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


class ShmPool:
    """Owner side: allocate a slot of at least n bytes, release it for reuse, unlink everything on close.

    At most ``limit_bytes`` are mapped at once; of the free large slots (``LARGE_SLOT_BYTES`` and up) at most
    ``retain_bytes`` are kept for reuse.
    """

    def __init__(self, prefix: str, limit_bytes: int, retain_bytes: int = RETAIN_BYTES) -> None:
        self.prefix = prefix
        self.limit_bytes = limit_bytes
        self.retain_bytes = retain_bytes
        self.mapped_bytes = 0
        self.free_large_bytes = 0
        self._counter = 0
        self._free: dict[int, list[Slot]] = {}
        self._slots: dict[str, Slot] = {}

    def allocate(self, nbytes: int) -> Slot | None:
        """A free slot with room for nbytes, or None when the pool is at its byte limit."""
        size = _size_class(nbytes)
        free = self._free.get(size)
        if free:
            if size >= LARGE_SLOT_BYTES:
                self.free_large_bytes -= size
            return free.pop()
        if self.mapped_bytes + size > self.limit_bytes:
            return None
        self._counter += 1
        name = f"{self.prefix}-{self._counter}"
        fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            buffer = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        slot = Slot(name, size, buffer)
        self._slots[name] = slot
        self.mapped_bytes += size
        return slot

    def release(self, name: str) -> None:
        """Return a slot to the pool (unknown names are ignored: the pool may have been closed).

        A large slot that would take the free large slots past ``retain_bytes`` is unmapped and unlinked instead.
        """
        slot = self._slots.get(name)
        if slot is None:
            return
        free = self._free.setdefault(slot.capacity, [])
        if slot in free:  # a repeated release must not hand the same slot out twice
            return
        if slot.capacity >= LARGE_SLOT_BYTES:
            if self.free_large_bytes + slot.capacity > self.retain_bytes:
                del self._slots[name]
                self.mapped_bytes -= slot.capacity
                _discard(slot)
                return
            self.free_large_bytes += slot.capacity
        free.append(slot)

    def close(self) -> None:
        """Unmap and unlink every segment of the pool."""
        for slot in self._slots.values():
            _discard(slot)
        self._slots.clear()
        self._free.clear()
        self.mapped_bytes = 0
        self.free_large_bytes = 0


class ShmReader:
    """Reader side: map segments by name once, hand out memoryviews of their first n bytes.

    Large segments (``LARGE_SLOT_BYTES`` and up) are mapped anew for each view and not cached: the mapping goes
    away with the last view of it, so the memory of a segment its owner unlinked is given back.
    """

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}

    def view(self, name: str, nbytes: int) -> memoryview:
        """A writable view of the first nbytes of segment ``name``."""
        buffer = self._maps.get(name)
        if buffer is None:
            fd = os.open(_path(name), os.O_RDWR)
            try:
                buffer = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
            if len(buffer) < LARGE_SLOT_BYTES:
                self._maps[name] = buffer
        return memoryview(buffer)[:nbytes]

    def forget(self, prefix: str) -> None:
        """Drop mappings of segments whose name starts with prefix (their owner went away)."""
        for name in [n for n in self._maps if n.startswith(prefix)]:
            buffer = self._maps.pop(name)
            with contextlib.suppress(BufferError):
                buffer.close()

    def close(self) -> None:
        """Unmap everything (views still alive keep their mapping until released)."""
        self.forget("")


def map_client_segment(name: str, nbytes: int, offset: int) -> memoryview:
    """A view of ``nbytes`` at ``offset`` of a client's segment (Triton's shared-memory extension), mapped for this
    view only: private and copy-on-write, so arrays over it are writable like any input while the client's bytes
    never change. Never cached (the client may replace the segment once it unregisters it), never unlinked."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    fd = os.open(_path(name), os.O_RDONLY)
    try:
        buffer = mmap.mmap(fd, offset - start + nbytes, access=mmap.ACCESS_COPY, offset=start)
    finally:
        os.close(fd)
    return memoryview(buffer)[offset - start :]


def _discard(slot: Slot) -> None:
    # A numpy view may still reference the mapping (it is unmapped with the last view); the unlink frees the name.
    with contextlib.suppress(BufferError):
        slot.buffer.close()
    _unlink(slot.name)


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_path(name))


def remove_segments(prefix: str) -> int:
    """Unlink every segment whose name starts with prefix; returns how many were removed."""
    if not prefix:
        raise ValueError("remove_segments needs a non-empty prefix (an empty one matches every segment)")
    removed = 0
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(prefix) + "*")):
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed
