"""Clients' shared-memory regions (Triton's shared-memory extension): registered by name, then read for the inputs
and written for the outputs of requests that name them.

A **system** region is ``byte_size`` bytes at ``offset`` of a client's POSIX shared-memory object ``/dev/shm/<key>``.
The core maps that range once, when it is registered (shared, read-write), so every later request reads and writes
through a mapping already faulted in. The core never owns the object: it unmaps it, it never unlinks it — not on
unregister, not when the server stops. A **CUDA** region is a client's device buffer (``pyserve.core.cuda_shm``).
Names are one namespace for both kinds, as in Triton.

Unregistering a region that requests in flight still use is allowed (as Triton does): its name goes at once, so new
requests cannot use it and it can be registered again, while each in-flight request keeps the slice it was given.
A slice holds a view of the mapping, and a mapping still viewed cannot be closed: it is unmapped when its last view
goes, that is when the last request using it has been answered.

Errors answer 400 / INVALID_ARGUMENT with Triton's wording where it has one, and name the value seen.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from typing import Any, Protocol

from pyserve.core.inference import SharedMemorySlice
from pyserve.errors import InvalidInputError
from pyserve.transport.shm import SHM_DIR

SYSTEM = "system"
CUDA = "cuda"
_LABELS = {SYSTEM: "system shared memory", CUDA: "CUDA shared memory"}


class Region(Protocol):
    """A registered region of either kind."""

    name: str
    kind: str
    byte_size: int

    def slice(self, offset: int, byte_size: int) -> SharedMemorySlice:
        """The slice a request uses (bounds already checked)."""
        ...

    def status(self) -> dict[str, Any]:
        """The region in Triton's status response."""
        ...

    def close(self) -> None:
        """The registry lets go: release the region once no slice of it is left."""
        ...


class SystemSlice:
    """Bytes of a system region: a view of the core's mapping (it keeps the mapping alive)."""

    __slots__ = ("_owner", "_view", "byte_size", "location", "offset", "region")

    def __init__(self, owner: SystemRegion, offset: int, view: memoryview) -> None:
        self._owner = owner
        self.region = owner.name
        self.offset = offset
        self.byte_size = len(view)
        self.location: tuple[str, int] | None = (owner.segment, owner.offset + offset)
        self._view = view

    def read(self) -> memoryview:
        """The bytes, in place."""
        self._owner.check_size(self.offset + self.byte_size)
        return self._view

    def write(self, data: Any) -> None:
        """Copy ``data`` to the start of the slice."""
        raw = memoryview(data).cast("B")
        self._owner.check_size(self.offset + len(raw))
        self._view[: len(raw)] = raw


class SystemRegion:
    """A client's ``/dev/shm/<key>`` range, mapped by the core while registered."""

    kind = SYSTEM

    def __init__(self, name: str, key: str, offset: int, byte_size: int, server_prefix: str) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.segment = segment_of(key)
        if server_prefix and self.segment.startswith(server_prefix):
            raise InvalidInputError(
                f"failed to register shared memory region '{name}': key '{key}' is one of this server's own segments"
            )
        if byte_size <= 0:
            raise InvalidInputError(
                f"failed to register shared memory region '{name}': byte_size must be > 0, got {byte_size}"
            )
        if offset < 0:
            raise InvalidInputError(f"failed to register shared memory region '{name}': offset must be >= 0")
        try:
            fd = os.open(os.path.join(SHM_DIR, self.segment), os.O_RDWR)
        except OSError as exc:
            raise InvalidInputError(f"Unable to open shared memory region: '{key}' ({exc.strerror})") from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidInputError(
                    f"failed to register shared memory region '{name}': invalid args (offset {offset} + byte_size "
                    f"{byte_size} is past the end of '{key}', which holds {size} bytes)"
                )
            # mmap starts at a multiple of the allocation granularity: map from there, keep where the region starts.
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            self._skip = offset - start
            self._mapping: mmap.mmap | None = mmap.mmap(fd, self._skip + byte_size, offset=start)
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, OSError):
                raise InvalidInputError(f"failed to register shared memory region '{name}': {exc}") from None
            raise
        # The descriptor stays open while the region or a slice of it lives: check_size reads the object's size.
        self._fd = fd
        weakref.finalize(self, os.close, fd)

    def check_size(self, end: int) -> None:
        """Refuse to touch bytes the client cut off its object since (touching them would kill the process)."""
        size = os.fstat(self._fd).st_size
        if self.offset + end > size:
            raise InvalidInputError(
                f"shared memory region '{self.name}': its object '{self.key}' now holds {size} bytes, fewer than the "
                f"{self.offset + end} it registered"
            )

    def slice(self, offset: int, byte_size: int) -> SystemSlice:
        """A view of ``byte_size`` bytes at ``offset`` of the region."""
        assert self._mapping is not None
        begin = self._skip + offset
        return SystemSlice(self, offset, memoryview(self._mapping)[begin : begin + byte_size])

    def status(self) -> dict[str, Any]:
        """Triton's status entry: name, key, offset, byte_size."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        """Unmap now, or — while requests still hold slices — when the last of them is gone."""
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            with contextlib.suppress(BufferError):  # views left: the mapping goes with the last of them
                mapping.close()


def segment_of(key: str) -> str:
    """The ``/dev/shm`` file name of a POSIX shared-memory key (``/name``, as shm_open takes it)."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or "\x00" in name or name in (".", ".."):
        raise InvalidInputError(
            f"shared memory key must be one name such as '/input0' (as shm_open takes), got {key!r}"
        )
    return name


class SharedMemoryRegistry:
    """The registered regions by name; what the front ends' shared-memory endpoints and infer decoding use.

    ``server_prefix`` is the prefix of this server's own segments, which no client may register.
    """

    def __init__(self, server_prefix: str = "") -> None:
        self._server_prefix = server_prefix
        self._regions: dict[str, Region] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of ``/dev/shm/<key>`` as region ``name``."""
        self._check_new(name)
        self._regions[name] = SystemRegion(name, key, offset, byte_size, self._server_prefix)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open a client's CUDA IPC handle as region ``name`` (raises UnsupportedError without CUDA)."""
        self._check_new(name)
        from pyserve.core.cuda_shm import CudaRegion  # CUDA is loaded only by the first CUDA registration

        self._regions[name] = CudaRegion(name, raw_handle, device_id, byte_size)

    def _check_new(self, name: str) -> None:
        if not name:
            raise InvalidInputError("a shared memory region needs a name")
        if name in self._regions:
            raise InvalidInputError(f"shared memory region '{name}' already in manager")

    def unregister(self, kind: str, name: str = "") -> None:
        """Unregister region ``name`` of ``kind`` (all of that kind without a name); an unknown name is no error."""
        names = [name] if name else [n for n, region in self._regions.items() if region.kind == kind]
        for each in names:
            region = self._regions.get(each)
            if region is not None and region.kind == kind:
                del self._regions[each]
                region.close()

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """Triton's status response: every region of ``kind``, or the one named."""
        if not name:
            return [region.status() for region in self._regions.values() if region.kind == kind]
        region = self._regions.get(name)
        if region is None:
            raise InvalidInputError(f"Unable to find {kind} shared memory region: '{name}'")
        if region.kind != kind:
            raise InvalidInputError(
                f"The region named '{name}' is registered as {_LABELS[region.kind]}, not {_LABELS[kind]}"
            )
        return [region.status()]

    def slice(self, name: str, offset: int, byte_size: int) -> SharedMemorySlice:
        """The ``byte_size`` bytes at ``offset`` of region ``name``, for one input or output of a request."""
        region = self._regions.get(name)
        if region is None:
            raise InvalidInputError(f"Unable to find shared memory region: '{name}'")
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidInputError(
                f"Invalid offset + byte size for shared memory region: '{name}' (offset {offset} + byte size "
                f"{byte_size} > the region's {region.byte_size} bytes)"
            )
        return region.slice(offset, byte_size)

    def close(self) -> None:
        """Unregister everything (the server is stopping); clients' objects stay where they are."""
        for kind in (SYSTEM, CUDA):
            self.unregister(kind)
