"""What an instance sends back: the outputs a model's function returned, checked against the declared ones."""

from __future__ import annotations

from typing import Any

import numpy as np

from pyserve.config import ModelSpec
from pyserve.dtypes import numpy_dtype
from pyserve.errors import OutputMismatchError
from pyserve.request import RequestBatch
from pyserve.transport.messages import FrameWriter
from pyserve.transport.protocol import TensorDescriptor
from pyserve.wrapping import named_outputs


class OutputEncoder:
    """Checks a model's returned outputs (names, datatypes, shapes when strict) and writes them for the core."""

    def __init__(self, spec: ModelSpec) -> None:
        self._spec = spec
        self._declared = {t.name: t for t in spec.outputs}
        self._output_names = tuple(self._declared)
        # Declared outputs every response must carry (the rest are optional).
        self._required = tuple(t.name for t in spec.outputs if not t.optional)

    def encode(self, batch: RequestBatch, result: Any, writer: FrameWriter, allow_none: bool = False) -> list[Any]:
        """Each request's outputs checked against the declared ones and added to ``writer``: one list of tensor
        descriptors per request (None for a request a streaming round has no response for, with ``allow_none``).

        Raises ``OutputMismatchError`` naming the model and the output when what the function returned does not fit.
        """
        if isinstance(result, dict) and len(batch) == 1:
            result = [result]
        if not isinstance(result, (list, tuple)) or len(result) != len(batch):
            got = (
                f"{type(result).__name__} of length {len(result)}"
                if isinstance(result, (list, tuple))
                else type(result).__name__
            )
            raise OutputMismatchError(
                f"model '{self._spec.name}' must return a list with one output dict per request "
                f"({len(batch)} requests), got {got}"
            )
        encoded: list[Any] = []
        strict = self._spec.strict
        batching = self._spec.config.max_batch_size > 0
        for request, outputs in zip(batch, result, strict=True):
            if outputs is None and allow_none:
                encoded.append(None)
                continue
            if isinstance(outputs, (list, tuple)):
                # A request's outputs as a list or tuple, in declared order (as PyTriton takes them).
                outputs = dict(named_outputs(outputs, self._output_names, f"model '{self._spec.name}'"))
            if not isinstance(outputs, dict):
                raise OutputMismatchError(
                    f"model '{self._spec.name}' returned {type(outputs).__name__} for a request; expected a dict "
                    "of output name -> array (or a list or tuple of arrays in declared order)"
                )
            requested = request.requested_output_names
            # A request naming its outputs needs exactly those; otherwise every declared output not optional.
            missing = [name for name in (requested or self._required) if name not in outputs]
            if missing:
                raise self._missing_error("requested" if requested else "declared", missing, outputs)
            descriptors: list[TensorDescriptor] = []
            for name in requested or outputs:
                declared = self._declared.get(name)
                if declared is None:
                    if strict:
                        raise OutputMismatchError(
                            f"model '{self._spec.name}' returned undeclared output '{name}' "
                            f"(declared: {_quoted(self._declared)})"
                        )
                    continue
                array = _check_output(
                    self._spec.name, declared.name, declared.datatype, declared.shape, outputs[name], strict, batching
                )
                descriptors.append([name, declared.datatype, list(array.shape), writer.add_array(array)])
            encoded.append(descriptors)
        return encoded

    def _missing_error(self, kind: str, missing: list[str], outputs: dict[Any, Any]) -> OutputMismatchError:
        noun = "output" if len(missing) == 1 else "outputs"
        returned = _quoted(outputs) or "nothing"
        undeclared = [name for name in outputs if name not in self._declared]
        extra = f"; undeclared: {_quoted(undeclared)}" if undeclared else ""
        return OutputMismatchError(
            f"model '{self._spec.name}' did not return {kind} {noun} {_quoted(missing)} (returned: {returned}{extra})"
        )


def _quoted(names: Any) -> str:
    return ", ".join(f"'{name}'" for name in names)


def _check_output(
    model: str, name: str, datatype: str, dims: tuple[int, ...], value: Any, strict: bool, batching: bool
) -> np.ndarray:
    """One returned output as an array of its declared datatype (converted unless ``strict``); with ``strict`` its
    shape must match the declared dims too (past the batch dimension when the model batches)."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    expected = numpy_dtype(datatype)
    if datatype == "BYTES":
        if array.dtype.kind not in ("O", "S", "U"):
            raise OutputMismatchError(
                f"model '{model}' output '{name}': expected BYTES (bytes/str/object array), got {array.dtype}"
            )
    elif array.dtype != expected:
        if strict:
            raise OutputMismatchError(f"model '{model}' output '{name}': expected dtype {expected}, got {array.dtype}")
        try:
            array = array.astype(expected)
        except (TypeError, ValueError) as exc:
            raise OutputMismatchError(
                f"model '{model}' output '{name}': cannot convert {array.dtype} to {expected}: {exc}"
            ) from exc
    if strict:
        shape = array.shape[1:] if batching else array.shape
        if len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape, strict=True)):
            want = ([-1] if batching else []) + list(dims)
            raise OutputMismatchError(
                f"model '{model}' output '{name}': expected shape {want}, got {list(array.shape)}"
            )
    return array
