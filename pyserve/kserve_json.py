"""KServe v2 JSON tensors, for whichever side reads and writes them: the core's HTTP front end
(``pyserve.frontends.kserve``) and the ASGI app served from the user's process (``pyserve.routes.kserve_codec``).

JSON documents are read with orjson; one that holds NaN, Infinity or -Infinity (which Triton writes and reads, and
orjson refuses) is read again by the standard library. Float outputs holding them are written as those tokens, not
as null; BYTES outputs that are not UTF-8 are refused rather than altered.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from pyserve.errors import InvalidInputError


def json_object(data: bytes | bytearray | memoryview, what: str) -> dict[str, Any]:
    """A JSON object (the ``what`` JSON, in error messages), NaN and infinities included."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        doc = _json_with_non_finite(data, f"failed to parse the {what} JSON: {exc}")
    if not isinstance(doc, dict):
        raise InvalidInputError(f"the {what} JSON must be an object")
    return doc


def _json_with_non_finite(data: bytes | bytearray | memoryview, refusal: str) -> Any:
    """JSON holding the numbers NaN, Infinity or -Infinity, which Triton reads (and Python's json writes) and orjson
    refuses; any other document orjson refused stays refused with its reason (``refusal``)."""
    raw = bytes(data)
    if b"NaN" not in raw and b"Infinity" not in raw:
        raise InvalidInputError(refusal)
    try:
        doc = json.loads(raw, parse_int=_int_as_orjson_reads_it)
    except (ValueError, RecursionError):
        raise InvalidInputError(refusal) from None
    try:
        # Strings orjson refuses (lone surrogates) and nesting past its depth stay refused.
        orjson.dumps(doc)
    except orjson.JSONEncodeError as exc:
        raise InvalidInputError(f"{refusal.partition(': ')[0]}: {exc}") from None
    return doc


def _int_as_orjson_reads_it(text: str) -> int | float:
    """An integer within 64 bits; a float past them (as orjson reads it)."""
    value = int(text)
    return value if -(1 << 63) <= value < 1 << 64 else float(value)


def flatten(data: list[Any]) -> list[Any]:
    """A tensor's JSON data, nested lists or flat, as one flat list (row-major)."""
    if not any(isinstance(item, list) for item in data):
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def json_values(name: str, datatype: str, array: np.ndarray, scalar: bool = False, compact: bool = True) -> Any:
    """An output's elements for a JSON document: a flat list (a lone element itself with ``scalar``). ``compact``
    False writes a list holding NaN or infinities with json's default separators (the ASGI app's form)."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        values: list[Any] = json_strings(name, flat)
    else:
        if datatype == "BF16":
            flat = flat.astype(np.float32)
        values = flat.tolist()
        if flat.dtype.kind == "f" and not np.isfinite(flat).all():
            # orjson writes null for NaN and infinities: Python's json writes the tokens Triton writes.
            return orjson.Fragment(
                json.dumps(
                    values[0] if scalar and len(values) == 1 else values, separators=(",", ":") if compact else None
                )
            )
    return values[0] if scalar and len(values) == 1 else values


def json_strings(name: str, array: np.ndarray) -> list[str]:
    """A BYTES output's elements as JSON strings; elements that are not UTF-8 are refused, never altered."""
    strings: list[str] = []
    for index, item in enumerate(array):
        if isinstance(item, str):
            strings.append(item)
            continue
        try:
            strings.append(bytes(item).decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidInputError(
                f"output '{name}': BYTES element {index} is not valid UTF-8, which JSON cannot carry; request it as "
                'binary data (its parameter "binary_data": true, or the request parameter '
                '"binary_data_output": true)'
            ) from None
    return strings
