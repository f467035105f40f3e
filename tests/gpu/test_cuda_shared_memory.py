"""CUDA shared memory (Triton's extension) on a machine with a GPU: a client's device buffers, shared through CUDA IPC
handles, registered over HTTP and gRPC, read for inputs and written for outputs by the server's core process.

The client side calls the CUDA runtime through ctypes (the library pyserve itself loads), so the test needs no
cuda-python; it is skipped with the reason where no CUDA runtime or GPU is found.
"""

from __future__ import annotations

import base64
import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.core.cuda_shm import library_candidates

pytestmark = pytest.mark.gpu


def identity(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


class DeviceBuffer:
    """A client's device allocation and its IPC handle (what tritonclient's cuda_shared_memory makes)."""

    def __init__(self, cuda: ctypes.CDLL, byte_size: int) -> None:
        self.cuda = cuda
        self.byte_size = byte_size
        self.pointer = ctypes.c_void_p()
        assert cuda.cudaMalloc(ctypes.byref(self.pointer), ctypes.c_size_t(byte_size)) == 0
        handle = (ctypes.c_char * 64)()
        assert cuda.cudaIpcGetMemHandle(handle, self.pointer) == 0
        self.raw_handle = base64.b64encode(bytes(handle))

    def write(self, array: np.ndarray) -> None:
        assert self.cuda.cudaMemcpy(self.pointer, array.ctypes.data_as(ctypes.c_void_p), array.nbytes, 1) == 0

    def read(self, dtype: Any, shape: list[int]) -> np.ndarray:
        out = np.empty(shape, dtype)
        assert self.cuda.cudaMemcpy(out.ctypes.data_as(ctypes.c_void_p), self.pointer, out.nbytes, 2) == 0
        return out

    def free(self) -> None:
        self.cuda.cudaFree(self.pointer)


@pytest.fixture(scope="module")
def cuda() -> ctypes.CDLL:
    for candidate in library_candidates():
        try:
            library = ctypes.CDLL(candidate)
        except OSError:
            continue
        count = ctypes.c_int()
        if library.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
            pytest.skip("no CUDA GPU on this machine")
        library.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return library
    pytest.skip("no CUDA runtime (libcudart) on this machine")


@pytest.fixture(scope="module")
def server(cuda: ctypes.CDLL) -> Iterator[Serve]:
    serve = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))
    fp32 = [Tensor("INPUT0", np.float32, (-1,))], [Tensor("OUTPUT0", np.float32, (-1,))]
    serve.bind("identity", identity, *fp32, config=ModelConfig(max_batch_size=8))
    with serve:
        yield serve


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_cuda_regions(cuda: ctypes.CDLL, server: Serve, protocol: str) -> None:
    triton: Any = triton_http if protocol == "http" else triton_grpc
    port = server.http_port if protocol == "http" else server.grpc_port
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    data = np.arange(1024, dtype=np.float32).reshape(1, 1024)
    source, target = DeviceBuffer(cuda, data.nbytes), DeviceBuffer(cuda, 2 * data.nbytes)
    try:
        source.write(data)
        client.register_cuda_shared_memory("gpu_in", source.raw_handle, 0, data.nbytes)
        client.register_cuda_shared_memory("gpu_out", target.raw_handle, 0, target.byte_size)
        status = client.get_cuda_shared_memory_status()
        names = {r["name"] for r in status} if protocol == "http" else set(status.regions)
        assert names == {"gpu_in", "gpu_out"}
        tensor = triton.InferInput("INPUT0", [1, 1024], "FP32")
        tensor.set_shared_memory("gpu_in", data.nbytes)
        output = triton.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("gpu_out", data.nbytes, offset=data.nbytes)
        client.infer("identity", [tensor], outputs=[output])
        np.testing.assert_array_equal(target.read(np.float32, [2, 1024])[1:], data)
        client.unregister_cuda_shared_memory()
        status = client.get_cuda_shared_memory_status()
        assert not (status if protocol == "http" else status.regions)
    finally:
        client.unregister_cuda_shared_memory()
        source.free()
        target.free()
        client.close()
