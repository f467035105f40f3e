"""Tests of pyserve.core.shm_regions: clients' shared-memory regions registered, sliced, reported and unregistered.

Regions here are real ``/dev/shm`` objects the test creates (as a client would) and removes itself; the registry maps
them and must never remove them.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pyserve.core import cuda_shm
from pyserve.core.inference import OutputTensor
from pyserve.core.shm_regions import CUDA, SYSTEM, SharedMemoryRegistry, segment_of
from pyserve.errors import InvalidInputError, UnsupportedError
from pyserve.frontends.shared_memory import input_from_region, slice_of, write_outputs
from pyserve.transport.shm import SHM_DIR, map_client_segment

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="checks mappings through /proc")


def client_object(byte_size: int, data: bytes = b"") -> Iterator[str]:
    """A client's shared-memory object: its key while the test runs, removed afterwards."""
    key = f"/pyserve-unit-{uuid.uuid4().hex[:12]}"
    path = Path(SHM_DIR, key[1:])
    with open(path, "wb") as handle:
        handle.truncate(byte_size)
        handle.write(data)
    try:
        yield key
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def key() -> Iterator[str]:
    yield from client_object(1 << 16, np.arange(16, dtype=np.float32).tobytes())


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    regions = SharedMemoryRegistry("pyserve-server-session")
    yield regions
    regions.close()


def is_mapped(key: str) -> bool:
    path = os.path.join(SHM_DIR, key[1:])
    return any(path in line for line in Path("/proc/self/maps").read_text().splitlines())


def test_a_region_is_read_in_place_and_reported_as_triton_does(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("in", key, 0, 64)
    assert registry.status(SYSTEM) == [{"name": "in", "key": key, "offset": 0, "byte_size": 64}]
    assert registry.status(SYSTEM, "in") == registry.status(SYSTEM)
    assert registry.status(CUDA) == []
    where = registry.slice("in", 16, 32)
    assert np.frombuffer(where.read(), np.float32).tolist() == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    assert (where.region, where.offset, where.byte_size, where.location) == ("in", 16, 32, (key[1:], 16))


def test_a_region_at_an_offset_of_its_object(registry: SharedMemoryRegistry, key: str) -> None:
    # Offsets that are not a multiple of the page size are mapped from the page before.
    registry.register_system("tail", key, 8, 56)
    where = registry.slice("tail", 0, 8)
    assert np.frombuffer(where.read(), np.float32).tolist() == [2.0, 3.0]
    assert where.location == (key[1:], 8)
    registry.slice("tail", 48, 8)
    with pytest.raises(InvalidInputError, match=r"Invalid offset \+ byte size for shared memory region: 'tail'"):
        registry.slice("tail", 49, 8)


def test_writing_an_output_lands_in_the_clients_object(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("out", key, 4096, 4096)
    where = registry.slice("out", 8, 16)
    where.write(memoryview(np.array([1.5, 2.5], np.float64)).cast("B"))
    with open(os.path.join(SHM_DIR, key[1:]), "rb") as handle:
        handle.seek(4096 + 8)
        assert np.frombuffer(handle.read(16), np.float64).tolist() == [1.5, 2.5]


def test_unregistering_unmaps_at_once_when_nothing_uses_the_region(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("r", key, 0, 64)
    assert is_mapped(key)
    registry.unregister(SYSTEM, "r")
    assert not is_mapped(key)
    assert os.path.exists(os.path.join(SHM_DIR, key[1:])), "the client's object must never be removed"
    registry.unregister(SYSTEM, "r")  # unknown names are no error (as in Triton)


def test_a_slice_in_use_keeps_the_mapping_until_it_goes(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("r", key, 0, 64)
    array = np.frombuffer(registry.slice("r", 0, 64).read(), np.float32)
    registry.unregister(SYSTEM, "r")
    assert registry.status(SYSTEM) == []
    registry.register_system("r", key, 0, 64)  # the name is free again at once
    registry.unregister(SYSTEM)
    assert array[3] == 3.0 and is_mapped(key)  # the request in flight still reads its input
    del array
    gc.collect()
    assert not is_mapped(key)


def test_an_object_the_client_shrank_is_refused_not_touched(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("r", key, 4096, 8192)
    where = registry.slice("r", 4096, 4096)
    os.truncate(os.path.join(SHM_DIR, key[1:]), 8192)  # touching the cut-off bytes would be SIGBUS
    with pytest.raises(InvalidInputError, match="now holds 8192 bytes, fewer than the 12288 it registered"):
        where.read()
    with pytest.raises(InvalidInputError, match="now holds 8192 bytes"):
        where.write(b"x")


def test_registration_errors_name_what_is_wrong(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("r", key, 0, 64)
    with pytest.raises(InvalidInputError, match="shared memory region 'r' already in manager"):
        registry.register_system("r", key, 0, 64)
    with pytest.raises(InvalidInputError, match="Unable to open shared memory region: '/no-such-key"):
        registry.register_system("other", f"/no-such-key-{uuid.uuid4().hex}", 0, 64)
    with pytest.raises(InvalidInputError, match=r"'big': invalid args .*65536 bytes"):
        registry.register_system("big", key, 8, 1 << 16)
    with pytest.raises(InvalidInputError, match="byte_size must be > 0"):
        registry.register_system("empty", key, 0, 0)
    with pytest.raises(InvalidInputError, match="one of this server's own segments"):
        registry.register_system("mine", "/pyserve-server-session-core-1", 0, 64)
    for bad in ("/", "/a/b", "/..", ""):
        with pytest.raises(InvalidInputError, match="shared memory key must be one name"):
            segment_of(bad)
    assert segment_of("plain") == "plain" and segment_of("/slash") == "slash"
    assert len(registry) == 1


def test_lookups_of_unknown_regions(registry: SharedMemoryRegistry, key: str) -> None:
    with pytest.raises(InvalidInputError, match="Unable to find shared memory region: 'nope'"):
        registry.slice("nope", 0, 4)
    with pytest.raises(InvalidInputError, match="Unable to find system shared memory region: 'nope'"):
        registry.status(SYSTEM, "nope")
    with pytest.raises(InvalidInputError, match="Unable to find cuda shared memory region: 'nope'"):
        registry.status(CUDA, "nope")
    registry.register_system("sys", key, 0, 64)
    with pytest.raises(InvalidInputError, match="registered as system shared memory, not CUDA shared memory"):
        registry.status(CUDA, "sys")
    registry.unregister(CUDA, "sys")  # another kind's region is left alone
    assert len(registry) == 1


def test_cuda_without_a_runtime_is_refused_clearly(
    registry: SharedMemoryRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_shm, "_runtime", None)
    monkeypatch.setenv("PYSERVE_CUDART", "/nonexistent/libcudart.so")
    with pytest.raises(UnsupportedError, match="CUDA shared memory needs the CUDA runtime"):
        registry.register_cuda("gpu", bytes(64), 0, 64)
    with pytest.raises(InvalidInputError, match="64-byte cudaIpcMemHandle_t, got 3 bytes"):
        registry.register_cuda("gpu", b"abc", 0, 64)
    assert len(registry) == 0


# what the front ends build on it --------------------------------------------------------------------------------


def test_tensor_parameters_name_a_slice(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("in", key, 0, 64)
    tensor = input_from_region(
        registry, "INPUT0", "FP32", [1, 4], {"shared_memory_region": "in", "shared_memory_byte_size": 16}
    )
    assert tensor.data.tolist() == [[0.0, 1.0, 2.0, 3.0]] and tensor.location == (key[1:], 0)
    with pytest.raises(InvalidInputError, match=r"input 'INPUT0': shape \[1, 4\] of FP32 needs 16 bytes, got 12"):
        input_from_region(
            registry, "INPUT0", "FP32", [1, 4], {"shared_memory_region": "in", "shared_memory_byte_size": 12}
        )
    with pytest.raises(InvalidInputError, match="needs both 'shared_memory_region' and 'shared_memory_byte_size'"):
        slice_of(registry, {"shared_memory_region": "in"}, "output 'y'")
    with pytest.raises(InvalidInputError, match="'shared_memory_offset' must be a non-negative integer, got -4"):
        slice_of(
            registry,
            {"shared_memory_region": "in", "shared_memory_byte_size": 4, "shared_memory_offset": -4},
            "output 'y'",
        )


def test_outputs_too_large_for_their_slice_are_refused(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("out", key, 0, 64)
    output = OutputTensor("y", "FP32", [4], memoryview(np.ones(4, np.float32)).cast("B"))
    write_outputs({"y": registry.slice("out", 0, 16)}, [output])
    with pytest.raises(InvalidInputError, match=r"output 'y' \(8 bytes\) should be at least 16 bytes"):
        write_outputs({"y": registry.slice("out", 0, 8)}, [output])


def test_an_instance_maps_a_clients_segment_copy_on_write(key: str) -> None:
    view = map_client_segment(key[1:], 16, 8)
    array = np.frombuffer(view, np.float32)
    assert array.tolist() == [2.0, 3.0, 4.0, 5.0]
    array[0] = 99.0  # the model may write into its input; the client's bytes stay as they were
    with open(os.path.join(SHM_DIR, key[1:]), "rb") as handle:
        assert np.frombuffer(handle.read(16), np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
