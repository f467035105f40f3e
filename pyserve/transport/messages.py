"""The wire format between the core and workers: a msgpack header frame followed by one frame per inline buffer.

A buffer is placed either inline (``loc`` is the index of its frame after the header, sent zero-copy) or in a
shared-memory slot of the sender's pool (``loc`` is ``[segment, nbytes]``); the header lists the slots it uses
so the receiver can hand them back with a ``free`` message once it is done with them. The core may also point an
instance at a request's input in a client's own segment: ``[segment, nbytes, offset]``.

Tensor descriptors are lists ``[name, datatype, shape, loc]``; BYTES tensors travel length-prefixed.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack
import numpy as np

from pyserve.dtypes import deserialize_bytes, numpy_dtype, serialize_bytes
from pyserve.transport.shm import ShmPool, ShmReader, map_client_segment

Loc = int | list[Any]


# msgpack.packb makes a packer per call, with a 256 KiB buffer whose allocation costs more than packing a header.
# Each thread keeps a packer of its own (one is not thread-safe) with a small buffer; one whose buffer grew past
# _KEEP_PACKER_BYTES for a large message (a model's pickled functions) is dropped with it.
_PACKER_BUFFER_BYTES = 4096
_KEEP_PACKER_BYTES = 64 * 1024
_packers = threading.local()


def pack_header(header: dict[str, Any]) -> bytes:
    """Encode a message header (``pyserve.transport.protocol`` builds them)."""
    try:
        pack = _packers.pack
    except AttributeError:
        pack = _packers.pack = msgpack.Packer(buf_size=_PACKER_BUFFER_BYTES).pack
    data: bytes = pack(header)
    if len(data) > _KEEP_PACKER_BYTES:
        del _packers.pack
    return data


def unpack_header(frame: Any) -> dict[str, Any]:
    """Decode a message header frame (bytes or zmq.Frame)."""
    # msgpack >= 1.0 decodes str as str and bytes as bytes by default (raw=False): no keyword to parse per message.
    return msgpack.unpackb(frame)  # type: ignore[no-any-return]


class FrameWriter:
    """Collects the buffers of one outgoing message, inline or through the sender's shared-memory pool."""

    __slots__ = ("_pool", "_threshold", "frames", "slots")

    def __init__(self, pool: ShmPool | None, threshold: int) -> None:
        self.frames: list[Any] = []
        self.slots: list[str] = []
        self._pool = pool
        self._threshold = threshold

    def add(self, buffer: Any, nbytes: int) -> Loc:
        """Place one contiguous buffer and return its location."""
        if self._pool is not None and nbytes >= self._threshold:
            slot = self._pool.allocate(nbytes)
            if slot is not None:
                slot.buffer[:nbytes] = buffer
                self.slots.append(slot.name)
                return [slot.name, nbytes]
        self.frames.append(buffer)
        return len(self.frames) - 1

    def add_parts(self, parts: list[Any], nbytes: int) -> Loc:
        """Place buffers laid end to end as one (the core's one copy of a batch's rows)."""
        if len(parts) == 1:
            return self.add(parts[0], nbytes)
        if self._pool is not None and nbytes >= self._threshold:
            slot = self._pool.allocate(nbytes)
            if slot is not None:
                offset = 0
                for part in parts:
                    size = memoryview(part).nbytes
                    slot.buffer[offset : offset + size] = part
                    offset += size
                self.slots.append(slot.name)
                return [slot.name, nbytes]
        self.frames.append(b"".join(parts))
        return len(self.frames) - 1

    def add_array(self, array: np.ndarray) -> Loc:
        """Place a numpy array's bytes (BYTES arrays length-prefixed)."""
        if array.dtype == object or array.dtype.kind in ("S", "U"):
            blob = serialize_bytes(array)
            return self.add(blob, len(blob))
        array = np.ascontiguousarray(array)
        raw = array.reshape(-1).view(np.uint8)
        return self.add(raw, raw.nbytes)


def read_buffer(loc: Loc, frames: list[Any], reader: ShmReader) -> memoryview:
    """The bytes a location points at (a view: no copy).

    A location of three, ``[segment, nbytes, offset]``, is in a client's segment (Triton's shared-memory extension):
    mapped for this use only, copy-on-write (``map_client_segment``).
    """
    if isinstance(loc, int):
        return memoryview(frames[loc])
    if len(loc) == 3:
        return map_client_segment(loc[0], loc[1], loc[2])
    name, nbytes = loc
    return reader.view(name, nbytes)


def array_from_buffer(
    buffer: memoryview, datatype: str, shape: list[int] | tuple[int, ...], name: str = ""
) -> np.ndarray:
    """A numpy array over buffer (zero-copy for fixed-size types; BYTES are decoded into an object array)."""
    count = 1
    for dim in shape:
        count *= dim
    if datatype == "BYTES":
        return deserialize_bytes(buffer, count, name).reshape(shape)
    return np.frombuffer(buffer, dtype=numpy_dtype(datatype), count=count).reshape(shape)
