"""Hostile HTTP requests as hypothesis strategies, each with what a correct answer looks like.

Three families: infer requests (a valid one for an identity model, then at most a couple of mutations from a
catalogue, each naming what its error message must mention), other routes (every route of the API with odd values,
methods and bodies), and raw bytes (request lines and headers no parser should trust), sent on a connection of their
own.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from pyserve.frontends.http_routes import ROUTES

from .models import (
    DATATYPES,
    MAX_REQUEST_BYTES,
    MODEL_NAMES,
    Tensor,
    dumps,
    from_json,
    from_raw,
    same_values,
    same_values_reshaped,
    tensors,
)


@dataclass
class Response:
    """One HTTP response as read off the socket (header names lower-cased)."""

    status: int
    headers: dict[str, str]
    body: bytes


class HttpCase:
    """One request and what its answer may be.

    ``may_succeed`` / ``may_fail``: whether 200 / a 4xx is a correct answer; an error's message must contain one of
    ``expect`` (any non-empty message when empty); ``check`` looks at a 200 answer and returns what is wrong with it.
    (Not a dataclass: hypothesis would print every field of a failing case, its large requests included.)
    """

    def __init__(
        self,
        label: str,
        request: bytes,
        may_succeed: bool = True,
        may_fail: bool = True,
        expect: tuple[str, ...] = (),
        check: Callable[[Response], str | None] | None = None,
    ) -> None:
        self.label = label
        self.request = request
        self.may_succeed = may_succeed
        self.may_fail = may_fail
        self.expect = expect
        self.check = check

    def __repr__(self) -> str:
        request = self.request if len(self.request) <= 300 else self.request[:300] + b"..."
        return f"HttpCase({self.label!r}, {request!r})"


def http_request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """The bytes of one request; Content-Length is set unless the headers say chunked."""
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz"]
    all_headers = dict(headers or {})
    if "Transfer-Encoding" not in all_headers:
        all_headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{name}: {value}" for name, value in all_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# values no request should hold ------------------------------------------------------------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
# Any JSON value, nested a little.
JSON_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
_ODD_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "..", "/", "%", "%2F", "\x00", "INPUT0 ", "input0", "OUTPUT0", "x" * 300, "\u202e", "😀"]),
)
_ODD_DIMS = st.one_of(
    st.integers(-5, 10),
    st.sampled_from([2**31, 2**32 + 1, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63), 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
)
_ODD_SHAPES = st.one_of(
    st.lists(_ODD_DIMS, max_size=5),
    st.lists(st.integers(0, 2), min_size=33, max_size=40),
    st.lists(st.sampled_from([0, 1, 2**62, 2**63 - 1]), min_size=1, max_size=4),
    JSON_VALUES,
)
_ODD_SIZES = st.one_of(
    st.integers(-10, 10**6), st.sampled_from([2**63, 2**64 + 1, -(2**63)]), st.text(max_size=4), st.floats(), st.none()
)


def _json_body(doc: Any) -> bytes:
    """JSON with integers past 64 bits and NaN kept (orjson refuses both)."""
    return dumps(doc)


# infer requests -------------------------------------------------------------------------------------------------

# Where the inputs' data goes, and how outputs are asked for.
_ENCODINGS = ("json-flat", "json-nested", "binary")
_OUTPUT_MODES = ("default", "binary_data_output", "listed-json", "listed-binary")


@dataclass
class _Infer:
    """A valid infer request under construction: its JSON, its binary part and its headers."""

    tensor: Tensor
    doc: dict[str, Any]
    binary: bytes
    headers: dict[str, str]
    output_binary: bool
    path: str
    method: str = "POST"

    def body(self) -> bytes:
        header = _json_body(self.doc)
        if self.binary or "Inference-Header-Content-Length" in self.headers:
            self.headers.setdefault("Inference-Header-Content-Length", str(len(header)))
        return header + self.binary


@st.composite
def _valid_infer(draw: st.DrawFn) -> _Infer:
    tensor = draw(tensors())
    encoding = draw(st.sampled_from(_ENCODINGS)) if tensor.json_ready() else "binary"
    entry: dict[str, Any] = {"name": "INPUT0", "datatype": tensor.datatype, "shape": tensor.shape}
    binary = b""
    if encoding == "binary":
        binary = tensor.raw()
        entry["parameters"] = {"binary_data_size": len(binary)}
    else:
        entry["data"] = tensor.json_data(nested=encoding == "json-nested")
    doc: dict[str, Any] = {"inputs": [entry]}
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=8))
    mode = draw(st.sampled_from(_OUTPUT_MODES))
    output_binary = mode in ("binary_data_output", "listed-binary")
    if mode == "binary_data_output":
        doc["parameters"] = {"binary_data_output": True}
    elif mode.startswith("listed"):
        doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": output_binary}}]
    version = draw(st.sampled_from(["", "/versions/1"]))
    return _Infer(tensor, doc, binary, {}, output_binary, f"/v2/models/{tensor.model}{version}/infer")


def _round_trip(tensor: Tensor) -> Callable[[Response], str | None]:
    """The check of a 200 answer: OUTPUT0 is the input unchanged, as JSON or binary data."""

    def check(response: Response) -> str | None:
        length = response.headers.get("inference-header-content-length")
        header = response.body if length is None else response.body[: int(length)]
        # Python's json, as tritonclient: it reads the NaN and Infinity tokens.
        doc = json.loads(header)
        (output,) = doc["outputs"]
        if "data" in output:
            values = from_json(output["datatype"], output["data"])
        else:
            size = output["parameters"]["binary_data_size"]
            values = from_raw(output["datatype"], output["shape"], response.body[int(length or 0) :][:size])
        return same_values(tensor, output["datatype"], output["shape"], values)

    return check


# Each mutation changes a valid request and says what the error must mention; it returns whether the request may
# still succeed (a mutation that can leave it valid).
Mutation = Callable[[st.DrawFn, _Infer], tuple[tuple[str, ...], bool]]


def _mutate_datatype(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    entry = infer.doc["inputs"][0]
    entry["datatype"] = draw(st.one_of(st.sampled_from(DATATYPES), JSON_VALUES))
    return ("INPUT0",), entry["datatype"] == infer.tensor.datatype


def _mutate_shape(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    entry = infer.doc["inputs"][0]
    after = draw(_ODD_SHAPES)
    if isinstance(after, list) and same_values_reshaped(infer.tensor.model, infer.tensor.shape, after):
        after = infer.tensor.shape  # the same values in another valid shape: no mutation
    entry["shape"] = after
    return ("INPUT0", "batch size"), entry["shape"] == infer.tensor.shape


def _mutate_data(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    entry = infer.doc["inputs"][0]
    entry.pop("parameters", None)
    infer.binary = b""
    entry["data"] = draw(
        st.one_of(
            JSON_VALUES,
            st.lists(st.one_of(st.floats(), st.integers(-(2**70), 2**70)), max_size=12),
            st.lists(st.lists(st.integers(0, 3), max_size=3), max_size=3),
        )
    )
    return ("INPUT0",), True


def _mutate_name(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    entry = infer.doc["inputs"][0]
    entry["name"] = draw(st.one_of(_ODD_TEXT, JSON_VALUES))
    return ("input",), entry["name"] == "INPUT0"


def _mutate_duplicate(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    infer.doc["inputs"].append(dict(infer.doc["inputs"][0]))
    return ("more than once", "bytes left", "binary_data_size"), False


def _mutate_inputs(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    infer.binary = b""
    infer.doc["inputs"] = draw(st.one_of(st.builds(list), JSON_VALUES, st.lists(JSON_VALUES, max_size=3)))
    return ("input",), False


def _mutate_binary_size(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    entry = infer.doc["inputs"][0]
    entry.pop("data", None)
    if not infer.binary:
        infer.binary = infer.tensor.raw()
    size = draw(_ODD_SIZES)
    entry["parameters"] = {"binary_data_size": size}
    return ("INPUT0", "bytes after"), size == len(infer.binary) and type(size) is int


def _mutate_header_length(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    infer.headers["Inference-Header-Content-Length"] = draw(
        st.one_of(st.integers(-3, 400).map(str), st.sampled_from(["", "abc", "1e3", "9" * 30, "+5", " 7", "0x10"]))
    )
    # 0 reads the whole body as the raw bytes of the only input, which may fit.
    return ("Inference-Header-Content-Length", "JSON", "bytes", "INPUT0", "binary_data_size", "raw"), True


def _mutate_parameters(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    name = draw(st.one_of(st.just("triton_" + draw(st.text(max_size=4))), st.text(max_size=6)))
    value = draw(JSON_VALUES)
    infer.doc["parameters"] = draw(st.one_of(st.just({name: value}), JSON_VALUES))
    return ("parameter",), True


def _mutate_outputs(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    entry = draw(
        st.one_of(
            st.fixed_dictionaries({"name": _ODD_TEXT}),
            st.fixed_dictionaries({"name": st.just("OUTPUT0"), "parameters": JSON_VALUES}),
            st.just({"name": "OUTPUT0", "parameters": {"classification": 2}}),
            JSON_VALUES,
        )
    )
    infer.doc["outputs"] = draw(st.one_of(st.just([entry, entry]), st.just([entry]), JSON_VALUES))
    return ("output",), True


def _mutate_id(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    infer.doc["id"] = draw(JSON_VALUES)
    return ("'id'",), isinstance(infer.doc["id"], str)


def _mutate_shared_memory(draw: st.DrawFn, infer: _Infer) -> tuple[tuple[str, ...], bool]:
    keys = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
    parameters = draw(st.dictionaries(st.sampled_from(keys), st.one_of(_ODD_TEXT, _ODD_SIZES), min_size=1))
    if draw(st.booleans()):
        infer.doc["inputs"][0]["parameters"] = parameters
    else:
        infer.doc["outputs"] = [{"name": "OUTPUT0", "parameters": parameters}]
    return ("shared memory", "INPUT0", "OUTPUT0", "binary_data_size", "bytes after"), False


MUTATIONS: dict[str, Mutation] = {
    "datatype": _mutate_datatype,
    "shape": _mutate_shape,
    "data": _mutate_data,
    "name": _mutate_name,
    "duplicate": _mutate_duplicate,
    "inputs": _mutate_inputs,
    "binary_data_size": _mutate_binary_size,
    "header_length": _mutate_header_length,
    "parameters": _mutate_parameters,
    "outputs": _mutate_outputs,
    "id": _mutate_id,
    "shared_memory": _mutate_shared_memory,
}


@st.composite
def _framing(draw: st.DrawFn, infer: _Infer, body: bytes) -> tuple[bytes, dict[str, str], bool, tuple[str, ...]]:
    """How the body travels: plainly, compressed (well or badly), chunked, after 100 Continue. Returns the body,
    the headers, whether the request can still succeed and what an error must mention."""
    headers = infer.headers
    how = draw(st.sampled_from(["plain"] * 6 + ["gzip", "deflate", "bad-gzip", "unknown", "bomb", "chunked", "expect"]))
    if how == "gzip":
        return gzip.compress(body, 1), {**headers, "Content-Encoding": "gzip"}, True, ()
    if how == "deflate":
        return zlib.compress(body, 1), {**headers, "Content-Encoding": "deflate"}, True, ()
    if how == "bad-gzip":
        compressed = gzip.compress(body, 1)
        broken = draw(
            st.one_of(
                st.just(compressed[: draw(st.integers(0, len(compressed) - 1))]),  # cut short
                st.binary(min_size=1, max_size=20),  # not gzip at all
                st.just(compressed + draw(st.binary(min_size=1, max_size=8))),  # trailing bytes
            )
        )
        return broken, {**headers, "Content-Encoding": "gzip"}, False, ("decompress", "gzip")
    if how == "unknown":
        coding = draw(st.sampled_from(["br", "zstd", "x-" + draw(st.text("abc", max_size=3)), "gzip, gzip"]))
        return body, {**headers, "Content-Encoding": coding}, False, ("Content-Encoding",)
    if how == "bomb":
        bomb = gzip.compress(b"\x00" * (MAX_REQUEST_BYTES + 1), 9)
        return bomb, {**headers, "Content-Encoding": "gzip"}, False, ("exceeds the limit",)
    if how == "chunked":
        size = draw(st.integers(1, 64))
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
        return chunks + b"0\r\n\r\n", {**headers, "Transfer-Encoding": "chunked"}, True, ()
    if how == "expect":
        return body, {**headers, "Expect": "100-continue"}, True, ()
    return body, headers, True, ()


@st.composite
def infer_cases(draw: st.DrawFn) -> HttpCase:
    """A valid infer request of an identity model, changed by up to two mutations."""
    infer = draw(_valid_infer())
    # About half the requests stay valid: their answers are checked value by value.
    some = st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=2, unique=True)
    names = draw(st.one_of(st.builds(list), some))
    if "data" in names and "binary_data_size" in names:
        names.remove("binary_data_size")  # each replaces what the other did
    # Those that replace a whole part first (the others change what is in it), the list of inputs last.
    order = {"data": 0, "binary_data_size": 0, "outputs": 1, "parameters": 1, "inputs": 3}
    names.sort(key=lambda name: order.get(name, 2))
    expect: tuple[str, ...] = ()
    may_succeed = True
    for name in names:
        fragments, still_valid = MUTATIONS[name](draw, infer)
        expect += fragments
        may_succeed = may_succeed and still_valid
    if "header_length" in names:
        may_succeed = True  # 0 reads the body as the raw bytes of the only input, whatever the JSON says
    body, headers, framing_ok, framing_expect = draw(_framing(infer, infer.body()))
    request = http_request(infer.method, infer.path, body, headers)
    label = f"infer {infer.tensor.model} {'+'.join(names) or 'valid'}"
    if not names and framing_ok:
        if infer.output_binary or infer.tensor.json_output_ready():
            return HttpCase(label, request, may_fail=False, check=_round_trip(infer.tensor))
        # BYTES that are not UTF-8 cannot come back as JSON: an error naming the output, never altered bytes.
        return HttpCase(label + " (non-UTF-8 as JSON)", request, may_succeed=False, expect=("'OUTPUT0': BYTES",))
    if not framing_ok:
        # The framing fails first when the body is not even readable.
        return HttpCase(label, request, may_succeed=False, expect=framing_expect)
    if not (infer.output_binary or infer.tensor.json_output_ready()):
        expect += ("'OUTPUT0': BYTES",)  # a mutation that leaves the request valid leaves this error too
    # With more than one mutation, which error comes first is the server's business: any message will do.
    return HttpCase(label, request, may_succeed=may_succeed, expect=expect if len(names) == 1 else ())


# other routes ---------------------------------------------------------------------------------------------------

_PATH_VALUES = st.one_of(
    st.sampled_from([*MODEL_NAMES, "1", "0", "-1", "999", "r0", "stats"]),
    _ODD_TEXT.map(lambda text: quote(text, safe="")),
    st.text(alphabet="%/.?#~!$&'()*+,;=:@ aZ09", max_size=8),
)
_SETTINGS = ("/v2/logging", "/v2/trace/setting", "/trace/setting")


@st.composite
def route_cases(draw: st.DrawFn) -> HttpCase:
    """Any route of the API (or a near miss) with odd parameters, methods and bodies."""
    route = draw(st.sampled_from(ROUTES))
    path = route.template
    for name in ("model", "version", "region"):
        if "{" + name + "}" in path:
            path = path.replace("{" + name + "}", draw(_PATH_VALUES).replace("/", "%2F") or "x")
    query = "?q=" + quote(draw(st.text(max_size=4)))
    path = draw(st.sampled_from([path, path, path, path + "/", path + "/extra", path + query])).replace(" ", "%20")
    method = draw(st.sampled_from([*route.methods, *route.methods, "GET", "POST", "PUT", "DELETE", "PATCH"]))
    doc = draw(JSON_VALUES)
    if route.handler in ("repository_load", "repository_unload"):
        # Never the fuzz server's own models: an unload that worked would take them away.
        path = path.replace("/models/", "/models/fuzz-", 1)
    if path.endswith(_SETTINGS) and method == "POST":
        # Settings apply all or nothing: an unknown last key leaves them as they are, whatever the others hold.
        known = ["log_info", "log_verbose_level", "log_format", "trace_level", "trace_rate", "trace_count"]
        doc = draw(st.dictionaries(st.sampled_from(known), JSON_VALUES, max_size=3))
        doc["fuzz_unknown_setting"] = 1
    if route.handler == "shm_register":
        keys = st.one_of(_ODD_TEXT, st.sampled_from(["/fuzz-none", "../etc/passwd", "/dev/shm/x", "a\x00b"]))
        doc = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "key": keys,
                    "offset": st.one_of(st.integers(0, 64), _ODD_SIZES),
                    "byte_size": st.one_of(st.integers(1, 4096), _ODD_SIZES),
                    "device_id": st.one_of(st.integers(0, 2), _ODD_SIZES),
                    "raw_handle": st.one_of(JSON_VALUES, st.fixed_dictionaries({"b64": st.text(max_size=12)})),
                },
            )
        )
    body = draw(st.sampled_from([_json_body(doc)] * 4 + [draw(st.binary(max_size=40)), b""]))
    return HttpCase(f"{method} {route.template}", http_request(method, path, body))


# raw bytes ------------------------------------------------------------------------------------------------------

_TOKENS = st.sampled_from(
    [
        b"GET",
        b"POST",
        b"/v2/health/live",
        b"/v2/models/identity_fp32/infer",
        b" ",
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"HTTP/2.0",
        b"\r\n",
        b"\n",
        b":",
        b"Content-Length: ",
        b"Content-Length: 5",
        b"Content-Length: -1",
        b"Content-Length: 99999999999999999999",
        b"Transfer-Encoding: chunked",
        b"Transfer-Encoding: gzip, chunked",
        b"Inference-Header-Content-Length: 3",
        b"Expect: 100-continue",
        b"Connection: upgrade\r\nUpgrade: h2c",
        b"Host: x",
        b"ffffffffffffffff\r\n",
        b"0\r\n\r\n",
        b"{}",
        b"\x00",
        b"\xff\xfe",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ]
)


@st.composite
def raw_cases(draw: st.DrawFn) -> HttpCase:
    """Bytes that may or may not be HTTP: request lines and headers assembled from pieces, or noise."""
    pieces = draw(st.lists(st.one_of(_TOKENS, st.binary(max_size=8)), min_size=1, max_size=16))
    data = b"".join(pieces)
    if draw(st.booleans()):
        data += b"\r\n\r\n"
    return HttpCase("raw bytes", data)


@st.composite
def oversized_cases(draw: st.DrawFn) -> HttpCase:
    """Heads and bodies over the limits: 431 and 413, then the connection closes."""
    if draw(st.booleans()):
        name = draw(st.sampled_from(["X-Big", "Cookie", "Traceparent"]))
        size = draw(st.integers(70_000, 200_000))
        request = http_request("GET", "/v2/health/live", headers={name: "a" * size})
        return HttpCase("huge header", request, may_succeed=False, expect=("headers exceed",))
    body = b"{" + b" " * MAX_REQUEST_BYTES + b"}"
    chunked = draw(st.booleans())
    if chunked:
        framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        request = http_request("POST", "/v2/models/identity_fp32/infer", framed, {"Transfer-Encoding": "chunked"})
    else:
        request = http_request("POST", "/v2/models/identity_fp32/infer", body)
    return HttpCase("huge body", request, may_succeed=False, expect=("exceeds the limit",))
