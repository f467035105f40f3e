"""Triton's shared-memory extension as both front ends speak it (docs/shared-memory.md).

A tensor's parameters ``shared_memory_region``, ``shared_memory_byte_size`` and (optional, default 0)
``shared_memory_offset`` put an input's bytes, or where an output should go, in a region the client registered.
An input is read from the region in place; an output is written into the region by the front end when the response
comes, and the response then describes it (name, datatype, shape, the same parameters) without its data. The
shared-memory endpoints themselves (register, unregister, status) are the restricted group ``shared-memory``
(``ServeConfig.restricted_api``, ``http_restricted_api``, ``grpc_restricted_protocol``; see ``restricted``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyserve.core.api import SharedMemoryControls
from pyserve.core.infer_call import tensor_from_shared_memory
from pyserve.core.inference import InputTensor, OutputTensor, SharedMemorySlice
from pyserve.errors import InvalidInputError

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
SYSTEM = "system"
CUDA = "cuda"


def uses_shared_memory(parameters: Mapping[str, Any]) -> bool:
    """Whether a tensor's parameters put it in a shared-memory region."""
    return REGION in parameters or BYTE_SIZE in parameters or OFFSET in parameters


def slice_of(regions: SharedMemoryControls, parameters: Mapping[str, Any], tensor: str) -> SharedMemorySlice:
    """The region slice a tensor's shared-memory parameters name (``tensor``: "input 'x'" / "output 'y'")."""
    region = parameters.get(REGION)
    byte_size = parameters.get(BYTE_SIZE)
    offset = parameters.get(OFFSET, 0)
    if region is None or byte_size is None:
        raise InvalidInputError(
            f"{tensor}: shared memory needs both '{REGION}' and '{BYTE_SIZE}' parameters, got "
            f"{sorted(key for key in (REGION, BYTE_SIZE, OFFSET) if key in parameters)}"
        )
    if not isinstance(region, str) or not region:
        raise InvalidInputError(f"{tensor}: '{REGION}' must be a region's name, got {region!r}")
    for key, value in ((BYTE_SIZE, byte_size), (OFFSET, offset)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInputError(f"{tensor}: '{key}' must be a non-negative integer, got {value!r}")
    return regions.slice(region, offset, byte_size)


def input_from_region(
    regions: SharedMemoryControls, name: str, datatype: str, shape: list[int], parameters: Mapping[str, Any]
) -> InputTensor:
    """An input whose bytes are in a region: its byte size must be what its shape and datatype need."""
    return tensor_from_shared_memory(name, datatype, shape, slice_of(regions, parameters, f"input '{name}'"))


def write_outputs(slices: Mapping[str, SharedMemorySlice], outputs: list[OutputTensor]) -> None:
    """Write each output the client placed in a region into it (before the response describes them)."""
    for output in outputs:
        where = slices.get(output.name)
        if where is None:
            continue
        nbytes = output.buffer.nbytes
        if nbytes > where.byte_size:
            raise InvalidInputError(
                f"shared memory size specified with the request for output '{output.name}' ({where.byte_size} "
                f"bytes) should be at least {nbytes} bytes to hold the results"
            )
        where.write(output.buffer)


def output_parameters(where: SharedMemorySlice, nbytes: int) -> dict[str, Any]:
    """The parameters describing an output written into a region: its region, the bytes written, its offset."""
    described: dict[str, Any] = {REGION: where.region, BYTE_SIZE: nbytes}
    if where.offset:
        described[OFFSET] = where.offset
    return described
