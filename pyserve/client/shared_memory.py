"""The client's side of Triton's system shared-memory extension (``ModelClient(..., shared_memory=...)``).

When the server runs on this host, a large request's tensors need not cross a socket: the client copies them into
a POSIX shared-memory object it owns, which the server has mapped since the client registered it, and the server
writes the outputs back into it. docs/client.md ("Shared memory") says when it pays and what it costs.

- ``server_is_local``: whether the server is on this host.
- ``plan_request``: which tensors of a request go into a region, and where. Every input but BYTES ones; and every
  output whose size the request fixes (a declared datatype other than BYTES, no variable dimension, the batch size
  taken from the inputs). The other outputs come back as usual; a model may return an output smaller than
  declared, but one larger than declared is the server's error.
- ``RegionPool``: the client's regions. A call leases one for itself and gives it back after, to be reused by
  later calls of the same size class; a region a call gave up on (the client stopped waiting: the server may still
  write into it) is retired instead of reused. A region is ``/dev/shm/pyserve-client-<pid>-<token>``, registered
  under that name; ``close`` unlinks every one, and a finalizer does when a client is dropped without closing.

The flows that register, use and unregister regions are ``base.ClientBase``'s, like every other call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import math
import mmap
import os
import socket
import threading
import uuid
import weakref
from collections.abc import Iterable, Mapping
from typing import Literal

import numpy as np

from pyserve.client.model import InferRequest, Placement, RemoteModelConfig, ServerAddress, wire_datatype
from pyserve.dtypes import numpy_dtype
from pyserve.errors import ClientClosedError, ClientError, ConfigError
from pyserve.transport.shm import SHM_DIR

logger = logging.getLogger(__name__)

SharedMemoryOption = bool | Literal["auto"]
KEY_PREFIX = "pyserve-client"
# A request with fewer bytes than this to place travels as usual: below it a region saves less than it costs
# (measured on loopback: about even at 64 KiB in and 64 KiB out, 3-5x faster from 1 MiB).
MIN_SHARED_BYTES = 128 * 1024
# Tensors start at multiples of this in a region (a cache line; numpy and the server read them in place).
ALIGNMENT = 64
# Regions come in size classes of a quarter of a power of two (at most 25 % unused); the smallest is 64 KiB.
MIN_REGION_BYTES = 64 * 1024
# Idle regions a client keeps for reuse, in all; a region given back past this is unregistered and unlinked.
RETAIN_BYTES = 1 << 30


def check_option(value: object) -> SharedMemoryOption:
    """``shared_memory`` as given: False, True or ``"auto"``."""
    if value is True or value is False or value == "auto":
        return value  # type: ignore[return-value]
    raise ConfigError(f"shared_memory must be False, True or 'auto', got {value!r}")


def server_is_local(host: str) -> bool:
    """Whether ``host`` is this host: every address it resolves to is a loopback address, the unspecified address,
    or one of this host's own (an address a socket can bind to). A name that does not resolve is not local."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = {str(info[4][0]) for info in infos}
    return bool(addresses) and all(_is_own_address(address) for address in addresses)


def _is_own_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def size_class(nbytes: int) -> int:
    """The size of the region that holds ``nbytes``: 2^k, 1.25 * 2^k, 1.5 * 2^k or 1.75 * 2^k bytes."""
    if nbytes <= MIN_REGION_BYTES:
        return MIN_REGION_BYTES
    quarter = 1 << ((nbytes - 1).bit_length() - 3)  # a quarter of the power of two just below nbytes
    return -(-nbytes // quarter) * quarter


def _aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


class Region:
    """One of the client's POSIX shared-memory objects, mapped read-write. The object's blocks are allocated when
    it is created, so a full ``/dev/shm`` fails here rather than as a fault when a tensor is written."""

    def __init__(self, byte_size: int) -> None:
        self.name = f"{KEY_PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.key = f"/{self.name}"
        self.path = os.path.join(SHM_DIR, self.name)
        self.byte_size = byte_size
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, byte_size)
            else:
                os.ftruncate(fd, byte_size)
            self.mapping = mmap.mmap(fd, byte_size)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)

    def write(self, offset: int, array: np.ndarray) -> None:
        """Copy ``array`` (any layout) to ``offset``, C-ordered."""
        target: np.ndarray = np.ndarray(array.shape, array.dtype, buffer=self.mapping, offset=offset)
        np.copyto(target, array, casting="no")

    def read(self, offset: int, datatype: str, shape: list[int]) -> np.ndarray:
        """A copy of the tensor at ``offset`` (the region is reused by the next call)."""
        dtype = numpy_dtype(datatype)
        return np.frombuffer(self.mapping, dtype, math.prod(shape), offset).reshape(shape).copy()

    def close(self) -> None:
        """Unlink the object and unmap it (the mapping goes with the last view of it, if any is left)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        with contextlib.suppress(BufferError):
            self.mapping.close()


@dataclasses.dataclass(frozen=True)
class RegionLayout:
    """One request's tensors in one region (``model.TensorsInRegion``). ``requested`` lists every declared output:
    a request that names any output gets only those."""

    region: Region
    inputs: Mapping[str, Placement]
    outputs: Mapping[str, Placement]
    requested: tuple[str, ...]

    def read_output(self, name: str, datatype: str, shape: list[int]) -> np.ndarray:
        """Output ``name`` as the server wrote it into the region (a copy)."""
        placement = self.outputs.get(name)
        if placement is None:
            raise ClientError(f"the server placed output '{name}' in shared memory, which the client did not ask for")
        needed = math.prod(shape) * numpy_dtype(datatype).itemsize
        if needed > placement.byte_size:
            raise ClientError(
                f"output '{name}': the server describes shape {shape} of {datatype} ({needed} bytes) in a slice of "
                f"{placement.byte_size} bytes"
            )
        return self.region.read(placement.offset, datatype, shape)


@dataclasses.dataclass(frozen=True)
class RegionPlan:
    """Where a request's tensors will lie in a region (offsets, sizes), before one is leased."""

    inputs: Mapping[str, int]
    outputs: Mapping[str, tuple[int, int]]
    requested: tuple[str, ...]
    byte_size: int

    def lay_out(self, region: Region, request: InferRequest) -> RegionLayout:
        """Write the inputs into ``region``; the layout the request is sent with."""
        inputs = {}
        for name, offset in self.inputs.items():
            array = request.inputs[name]
            region.write(offset, array)
            inputs[name] = Placement(region.name, offset, array.nbytes)
        outputs = {name: Placement(region.name, offset, size) for name, (offset, size) in self.outputs.items()}
        return RegionLayout(region, inputs, outputs, self.requested if outputs else ())


def plan_request(config: RemoteModelConfig, request: InferRequest) -> RegionPlan | None:
    """The region plan of a request; None when it has fewer than ``MIN_SHARED_BYTES`` to place."""
    offset = 0
    inputs: dict[str, int] = {}
    for name, array in request.inputs.items():
        if array.nbytes and wire_datatype(name, array) != "BYTES":
            inputs[name] = offset
            offset = _aligned(offset + array.nbytes)
    outputs: dict[str, tuple[int, int]] = {}
    for tensor, nbytes in _sized_outputs(config, request):
        outputs[tensor] = (offset, nbytes)
        offset = _aligned(offset + nbytes)
    if offset < MIN_SHARED_BYTES:
        return None
    return RegionPlan(inputs, outputs, tuple(t.name for t in config.outputs), offset)


def _sized_outputs(config: RemoteModelConfig, request: InferRequest) -> Iterable[tuple[str, int]]:
    """The declared outputs whose size the request fixes, with that size."""
    rows = 1
    if config.batching:
        batched = [array.shape[0] for array in request.inputs.values() if array.ndim]
        if not batched or len(set(batched)) != 1:
            return  # the server will say what is wrong with the batch
        rows = batched[0]
    for tensor in config.outputs:
        if tensor.datatype != "BYTES" and -1 not in tensor.shape:
            nbytes = rows * math.prod(tensor.shape) * numpy_dtype(tensor.datatype).itemsize
            if nbytes:
                yield tensor.name, nbytes


class RegionPool:
    """The regions of one client, leased to one call at a time and kept for reuse by size class; thread-safe.

    ``use`` says whether a call should place its tensors at all: the option is on, the server is on this host
    (decided once, on first use) and, with ``"auto"``, the server has not refused a region.
    """

    def __init__(self, option: SharedMemoryOption, address: ServerAddress) -> None:
        self.option = option
        self._address = address
        self._local: bool | None = None
        self._refused = False
        self._lock = threading.Lock()
        self._idle: dict[int, list[Region]] = {}
        self._idle_bytes = 0
        self._live: dict[str, Region] = {}  # leased or idle: registered (or being registered) with the server
        self._retired: list[str] = []  # unlinked, still to unregister
        self._paths: set[str] = set()
        self._closed = False
        # A client dropped without close() still removes its objects (the server keeps its mappings until it
        # stops: only close() can unregister them).
        self._finalizer = weakref.finalize(self, _unlink_all, self._paths)

    def use(self) -> bool:
        """Whether calls place their tensors in regions now (ConfigError for ``True`` and a server elsewhere)."""
        if self._local is None:
            self._local = server_is_local(self._address.host)
            if not self._local and self.option == "auto":
                logger.info("%s is not on this host: tensors travel over the connection", self._address)
        if not self._local and self.option is True:
            raise ConfigError(
                f"shared_memory=True, but the server at {self._address} is not on this host ({self._address.host!r} "
                "resolves to none of its addresses); use shared_memory='auto' to send tensors over the connection "
                "to such a server"
            )
        return self._local and not self._refused and not self._closed

    def lease(self, byte_size: int) -> tuple[Region, bool]:
        """A region of at least ``byte_size`` bytes for one call, and whether it is new (to register first)."""
        size = size_class(byte_size)
        with self._lock:
            if self._closed:
                raise ClientClosedError(f"the client of {self._address} is closed")
            idle = self._idle.get(size)
            if idle:
                self._idle_bytes -= size
                return idle.pop(), False
        try:
            region = Region(size)
        except OSError as exc:
            raise ClientError(f"cannot create a shared-memory region of {size} bytes in {SHM_DIR}: {exc}") from None
        with self._lock:
            self._live[region.name] = region
            self._paths.add(region.path)
        return region, True

    def give_back(self, region: Region, reusable: bool) -> None:
        """The call is done with ``region``: keep it for reuse, or (not ``reusable``, or past ``RETAIN_BYTES``)
        retire it."""
        with self._lock:
            if region.name not in self._live:
                return  # closed meanwhile
            if reusable and not self._closed and self._idle_bytes + region.byte_size <= RETAIN_BYTES:
                self._idle.setdefault(region.byte_size, []).append(region)
                self._idle_bytes += region.byte_size
                return
            self._retire(region)

    def refused(self, region: Region) -> None:
        """The server refused to register ``region`` (``"auto"``: calls travel as usual from now on)."""
        with self._lock:
            self._forget(region)
            if self.option == "auto":
                self._refused = True

    def retire(self, region: Region) -> None:
        """Unlink ``region`` now and unregister it later (its registration may or may not have happened)."""
        with self._lock:
            self._retire(region)

    def take_retired(self) -> list[str]:
        """The names of retired regions still to unregister (the caller unregisters them)."""
        with self._lock:
            names, self._retired = self._retired, []
            return names

    def close(self) -> list[str]:
        """Unlink every region now; the names to unregister from the server. Later leases raise ClientClosedError."""
        with self._lock:
            self._closed = True
            names = [*self._retired, *self._live]
            for region in list(self._live.values()):
                self._forget(region)
            self._retired = []
            self._idle.clear()
            self._idle_bytes = 0
        self._finalizer.detach()
        return names

    def _retire(self, region: Region) -> None:
        self._forget(region)
        self._retired.append(region.name)

    def _forget(self, region: Region) -> None:
        self._live.pop(region.name, None)
        self._paths.discard(region.path)
        region.close()


def _unlink_all(paths: set[str]) -> None:
    for path in list(paths):
        with contextlib.suppress(OSError):
            os.unlink(path)
