"""The errors and tensors of pyserve's ``triton_python_backend_utils`` (``pb_utils``), which re-exports them.

Model code imports them from ``triton_python_backend_utils``, never from here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyserve.errors import InferenceError

# errors ----------------------------------------------------------------------------------------------------------


class TritonError:
    """An error a response carries: a message and one of Triton's codes."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = 1) -> None:
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        """The error message."""
        return self._message

    def code(self) -> int:
        """The error code (``TritonError.INTERNAL`` unless given)."""
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"

    __str__ = message


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail; a model may raise it too (its requests then fail with the message)."""


# The TritonError code of a pyserve error, by its gRPC status.
_CODE_OF_GRPC = {
    "NOT_FOUND": TritonError.NOT_FOUND,
    "INVALID_ARGUMENT": TritonError.INVALID_ARG,
    "RESOURCE_EXHAUSTED": TritonError.INVALID_ARG,
    "UNAVAILABLE": TritonError.UNAVAILABLE,
    "DEADLINE_EXCEEDED": TritonError.UNAVAILABLE,
    "UNIMPLEMENTED": TritonError.UNSUPPORTED,
    "CANCELLED": TritonError.CANCELLED,
}


def triton_error(error: InferenceError) -> TritonError:
    """The TritonError a BLS response carries for a pyserve error."""
    return TritonError(str(error), _CODE_OF_GRPC.get(error.grpc_code, TritonError.INTERNAL))


# tensors ---------------------------------------------------------------------------------------------------------


class Tensor:
    """A named tensor: ``Tensor(name, numpy_array)``; always in CPU memory."""

    __slots__ = ("_array", "_name")

    def __init__(self, name: str, array: Any) -> None:
        self._name = name
        self._array = array if isinstance(array, np.ndarray) else np.asarray(array)

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The tensor's data (BYTES tensors: an object array of bytes)."""
        return self._array

    def shape(self) -> list[int]:
        """The tensor's shape."""
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        """True: pyserve keeps tensors in CPU memory."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing the tensor's memory (not for BYTES tensors)."""
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor sharing the memory of a DLPack capsule or of an object with ``__dlpack__`` (CPU memory only)."""
        source = dlpack if hasattr(dlpack, "__dlpack__") else _Capsule(dlpack)
        try:
            return Tensor(name, np.from_dlpack(source))
        except (BufferError, RuntimeError, TypeError) as exc:
            raise TritonModelException(
                f"Tensor.from_dlpack('{name}'): pyserve's Python backend takes CPU tensors only: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, dtype={self._array.dtype}, shape={list(self._array.shape)})"


class _Capsule:
    """A bare DLPack capsule (what ``torch.utils.dlpack.to_dlpack`` returns) seen as an object numpy can import."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)
