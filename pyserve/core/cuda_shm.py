"""CUDA shared-memory regions (Triton's extension): a client's device buffer, opened in the core from the
``cudaIpcMemHandle_t`` the client registers, read into host memory for inputs and written from it for outputs.

The CUDA runtime (``libcudart``) is loaded through ctypes the first time a CUDA region is registered: the one of
``$PYSERVE_CUDART`` if set, else whichever the system or a CUDA wheel (``nvidia-cuda-runtime-cu12``, which torch
and cupy install) provides. Nothing here imports a framework, and a server without CUDA answers the registration
with a clear error. Copies are synchronous ``cudaMemcpy`` on the core's loop: device -> host once per input (the
bytes then travel like any request's), host -> device once per output.

An opened handle is closed (``cudaIpcCloseMemHandle``) when its region is unregistered and no request in flight
still holds a slice of it, like a system region's mapping.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import weakref
from typing import Any

from pyserve.errors import InvalidInputError, UnsupportedError

_IPC_HANDLE_BYTES = 64
_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess
_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice
_DEVICE_TO_HOST = 2  # cudaMemcpyDeviceToHost


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _IPC_HANDLE_BYTES)]


class CudaRuntime:
    """The few CUDA runtime calls CUDA regions need, on a loaded ``libcudart``."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        library.cudaGetErrorString.restype = ctypes.c_char_p
        library.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcHandle, ctypes.c_uint]
        library.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        library.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        library.cudaSetDevice.argtypes = [ctypes.c_int]

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            message = self._lib.cudaGetErrorString(code)
            raise InvalidInputError(f"{what}: {message.decode() if message else f'CUDA error {code}'}")

    def open_handle(self, raw_handle: bytes, device_id: int) -> int:
        """The device pointer of a client's IPC handle, opened on ``device_id``."""
        handle = _IpcHandle()
        handle.reserved = raw_handle
        pointer = ctypes.c_void_p()
        self._check(self._lib.cudaSetDevice(device_id), f"failed to select CUDA device {device_id}")
        self._check(
            self._lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), handle, _LAZY_ENABLE_PEER_ACCESS),
            "failed to open CUDA IPC handle",
        )
        return int(pointer.value or 0)

    def close_handle(self, pointer: int, device_id: int) -> None:
        """Close a handle ``open_handle`` opened."""
        self._lib.cudaSetDevice(device_id)
        self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(pointer))

    def copy(self, destination: int, source: int, nbytes: int, kind: int, device_id: int) -> None:
        """``cudaMemcpy`` of ``nbytes`` between addresses (``kind``: host->device 1, device->host 2)."""
        self._check(self._lib.cudaSetDevice(device_id), f"failed to select CUDA device {device_id}")
        self._check(
            self._lib.cudaMemcpy(ctypes.c_void_p(destination), ctypes.c_void_p(source), nbytes, kind),
            "CUDA shared memory copy failed",
        )


_runtime: CudaRuntime | None = None


def runtime() -> CudaRuntime:
    """The process's CUDA runtime, loaded on first use; UnsupportedError naming why when there is none."""
    global _runtime
    if _runtime is None:
        tried: list[str] = []
        for candidate in library_candidates():
            try:
                _runtime = CudaRuntime(ctypes.CDLL(candidate))
                break
            except OSError as exc:
                tried.append(f"{candidate} ({exc})")
        else:
            raise UnsupportedError(
                "CUDA shared memory needs the CUDA runtime (libcudart), which this server cannot load"
                + (f": tried {'; '.join(tried)}" if tried else "")
                + "; set PYSERVE_CUDART to its path, or use system shared memory"
            )
    return _runtime


def library_candidates() -> list[str]:
    """Where ``libcudart`` may be, in the order tried."""
    explicit = os.environ.get("PYSERVE_CUDART")
    if explicit:
        return [explicit]
    candidates: list[str] = []
    found = ctypes.util.find_library("cudart")
    if found:
        candidates.append(found)
    try:
        import nvidia.cuda_runtime as wheel  # type: ignore[import-not-found]  # the pip CUDA runtime (torch, cupy)

        for directory in wheel.__path__:
            candidates += sorted(glob.glob(os.path.join(directory, "lib", "libcudart.so*")))
    except ImportError:
        pass
    return [*candidates, "libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]


class CudaSlice:
    """Bytes of a CUDA region: copied to the host to be read, from the host when written."""

    __slots__ = ("_region", "byte_size", "location", "offset", "region")

    def __init__(self, region: CudaRegion, offset: int, byte_size: int) -> None:
        self._region = region  # holds the handle open while a request uses the slice
        self.region = region.name
        self.offset = offset
        self.byte_size = byte_size
        self.location: tuple[str, int] | None = None

    def read(self) -> memoryview:
        """A host copy of the bytes."""
        host = bytearray(self.byte_size)
        if self.byte_size:
            address = ctypes.addressof(ctypes.c_char.from_buffer(host))
            self._region.copy(address, self.offset, self.byte_size, _DEVICE_TO_HOST)
        return memoryview(host)

    def write(self, data: Any) -> None:
        """Copy ``data`` (host memory) to the start of the slice."""
        raw = memoryview(data).cast("B")
        if not len(raw):
            return
        if raw.readonly:  # ctypes needs a writable buffer to take its address
            raw = memoryview(bytearray(raw))
        address = ctypes.addressof(ctypes.c_char.from_buffer(raw))
        self._region.copy(address, self.offset, len(raw), _HOST_TO_DEVICE)


class CudaRegion:
    """A client's device buffer, opened from its IPC handle while registered."""

    kind = "cuda"

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if len(raw_handle) != _IPC_HANDLE_BYTES:
            raise InvalidInputError(
                f"failed to register CUDA shared memory region '{name}': raw_handle must be a "
                f"{_IPC_HANDLE_BYTES}-byte cudaIpcMemHandle_t, got {len(raw_handle)} bytes"
            )
        if byte_size <= 0 or device_id < 0:
            raise InvalidInputError(
                f"failed to register CUDA shared memory region '{name}': byte_size must be > 0 and device_id >= 0, "
                f"got {byte_size} and {device_id}"
            )
        cuda = runtime()
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        try:
            self._pointer = cuda.open_handle(raw_handle, device_id)
        except InvalidInputError as exc:
            raise InvalidInputError(f"failed to register CUDA shared memory region '{name}': {exc}") from None
        self._cuda = cuda
        # Closed once neither the registry nor any request's slice refers to the region.
        weakref.finalize(self, cuda.close_handle, self._pointer, device_id)

    def slice(self, offset: int, byte_size: int) -> CudaSlice:
        """``byte_size`` bytes at ``offset`` (bounds already checked)."""
        return CudaSlice(self, offset, byte_size)

    def copy(self, host: int, offset: int, nbytes: int, kind: int) -> None:
        """Copy between host address ``host`` and the region at ``offset``, in the direction ``kind``."""
        device = self._pointer + offset
        if kind == _DEVICE_TO_HOST:
            self._cuda.copy(host, device, nbytes, kind, self.device_id)
        else:
            self._cuda.copy(device, host, nbytes, kind, self.device_id)

    def status(self) -> dict[str, Any]:
        """Triton's status entry: name, device_id, byte_size."""
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def close(self) -> None:
        """Nothing to do now: the handle closes with the last reference to the region (see the finalizer)."""
