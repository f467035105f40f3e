"""Triton's shared-memory extension, as tritonclient and perf_analyzer use it: a client's system shared-memory regions
registered over HTTP and gRPC, inputs read from them and outputs written into them, status, unregister, the errors,
the restricted API, and the client's objects left where they are (the server never removes them).
"""

from __future__ import annotations

import base64
import glob
import importlib
import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from pyserve import ModelConfig, Serve, ServeConfig
from pyserve.transport.shm import SHM_DIR

from .conftest import fp32, identity, run_perf_analyzer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="system shared memory lives in /dev/shm"),
]

Client = triton_http.InferenceServerClient | triton_grpc.InferenceServerClient
PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def shm() -> ModuleType:
    """tritonclient.utils.shared_memory, the client side of system shared memory."""
    with warnings.catch_warnings():
        # It imports pkg_resources (setuptools<81), which warns that it is deprecated.
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module("tritonclient.utils.shared_memory")
        except ImportError as exc:
            pytest.skip(f"tritonclient.utils.shared_memory cannot be imported ({exc}): install setuptools<81")


class Regions:
    """The client's regions of one test: created like tritonclient's examples, unregistered and destroyed after."""

    def __init__(self, shm: ModuleType, client: Client) -> None:
        self.shm = shm
        self.client = client
        self.handles: list[Any] = []
        self.names: list[str] = []
        self.keys: list[str] = []

    def create(self, byte_size: int, *arrays: np.ndarray, register: bool = True) -> tuple[str, str, Any]:
        """A new region (name, key, handle) holding ``arrays`` end to end; registered unless told not to."""
        token = uuid.uuid4().hex[:10]
        name, key = f"region-{token}", f"/shmtest-{token}"
        handle = self.shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        self.names.append(name)
        self.keys.append(key)
        if arrays:
            self.shm.set_shared_memory_region(handle, list(arrays))
        if register:
            self.client.register_system_shared_memory(name, key, byte_size)
        return name, key, handle

    def identity(self, triton: Any, data: np.ndarray) -> tuple[list[Any], list[Any], Any]:
        """A region holding ``data`` and one as large for the answer: the identity model's input and requested output
        naming them, and the answer's region."""
        source, _, _ = self.create(data.nbytes, data)
        target, _, answer = self.create(data.nbytes)
        return [shm_input(triton, "INPUT0", data, source)], [shm_output(triton, "OUTPUT0", target, data.nbytes)], answer

    def destroy(self) -> None:
        for handle in self.handles:
            self.shm.destroy_shared_memory_region(handle)

    def close(self) -> None:
        self.client.unregister_system_shared_memory()
        self.destroy()


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def triton(protocol: str) -> Any:
    """tritonclient's module for the protocol under test."""
    return triton_http if protocol == "http" else triton_grpc


@pytest.fixture
def tc(protocol: str, client: triton_http.InferenceServerClient, grpc_client: Any) -> Client:
    """tritonclient's client of the shared server, for the protocol under test."""
    return client if protocol == "http" else grpc_client


@pytest.fixture
def regions(shm: ModuleType, tc: Client) -> Iterator[Regions]:
    made = Regions(shm, tc)
    yield made
    made.close()


def shm_input(triton: Any, name: str, data: np.ndarray, region: str, offset: int = 0) -> Any:
    tensor = triton.InferInput(name, list(data.shape), "FP32")
    tensor.set_shared_memory(region, data.nbytes, offset=offset)
    return tensor


def shm_output(triton: Any, name: str, region: str, byte_size: int, offset: int = 0) -> Any:
    output = triton.InferRequestedOutput(name)
    output.set_shared_memory(region, byte_size, offset=offset)
    return output


def server_error(call: Callable[[], Any]) -> str:
    """The message of the error a call answers with (HTTP: 400 / gRPC: INVALID_ARGUMENT unless said otherwise)."""
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.message())


def status_names(tc: Client) -> set[str]:
    status = tc.get_system_shared_memory_status()
    return {region["name"] for region in status} if isinstance(status, list) else set(status.regions)


def mapped_by(pid: int, key: str) -> bool:
    """Whether process ``pid`` maps the client's object ``key``."""
    path = os.path.join(SHM_DIR, key.lstrip("/"))
    return path in Path(f"/proc/{pid}/maps").read_text()


def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def core_pid(server: Serve) -> int:
    assert server._core is not None
    return server._core.pid


# register, status, unregister -----------------------------------------------------------------------------------


def test_register_status_and_unregister(
    shm: ModuleType, client: triton_http.InferenceServerClient, grpc_client: Any
) -> None:
    made = Regions(shm, client)
    try:
        first, first_key, _ = made.create(256)
        second, second_key, _ = made.create(128, register=False)
        grpc_client.register_system_shared_memory(second, second_key, 64, offset=64)
        assert sorted(client.get_system_shared_memory_status(), key=lambda r: r["name"] != first) == [
            {"name": first, "key": first_key, "offset": 0, "byte_size": 256},
            {"name": second, "key": second_key, "offset": 64, "byte_size": 64},
        ]
        (region,) = grpc_client.get_system_shared_memory_status(second).regions.values()
        assert (region.name, region.key, region.offset, region.byte_size) == (second, second_key, 64, 64)
        assert client.get_system_shared_memory_status(first) == [
            {"name": first, "key": first_key, "offset": 0, "byte_size": 256}
        ]
        grpc_client.unregister_system_shared_memory(first)
        assert status_names(client) == {second}
        client.unregister_system_shared_memory()
        assert status_names(grpc_client) == set()
        assert not client.get_cuda_shared_memory_status() and not grpc_client.get_cuda_shared_memory_status().regions
    finally:
        made.close()


# inference --------------------------------------------------------------------------------------------------------


def test_identity_reads_its_input_from_a_region_and_writes_its_output_into_one(
    regions: Regions, tc: Client, triton: Any, protocol: str
) -> None:
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs, outputs, answer = regions.identity(triton, data)
    result = tc.infer("identity_fp32", inputs, outputs=outputs)
    np.testing.assert_array_equal(regions.shm.get_contents_as_numpy(answer, np.float32, [1, 16]), data)
    output = result.get_output("OUTPUT0")
    if protocol == "http":
        assert output == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}  # described, no data
    else:
        region = output.parameters["shared_memory_region"].string_param
        assert list(output.shape) == [1, 16] and region == regions.names[1]
        assert result.get_response().raw_output_contents == [b""]


def test_add_sub_with_regions_at_offsets_beside_ordinary_tensors(regions: Regions, tc: Client, triton: Any) -> None:
    a = np.arange(8, dtype=np.float32).reshape(1, 8)
    b = np.full((1, 8), 10, dtype=np.float32)
    # Both inputs in one region, the second at an offset; one output into a region at an offset, one sent back.
    source, _, _ = regions.create(a.nbytes + b.nbytes, a, b)
    target, _, out = regions.create(64 + a.nbytes)
    second = triton.InferInput("INPUT1", [1, 8], "FP32")
    second.set_data_from_numpy(b)
    for inputs in (
        [shm_input(triton, "INPUT0", a, source), shm_input(triton, "INPUT1", b, source, offset=a.nbytes)],
        [shm_input(triton, "INPUT0", a, source), second],
    ):
        result = tc.infer(
            "add_sub",
            inputs,
            outputs=[
                shm_output(triton, "OUTPUT0", target, a.nbytes, offset=64),
                triton.InferRequestedOutput("OUTPUT1"),
            ],
        )
        np.testing.assert_array_equal(regions.shm.get_contents_as_numpy(out, np.float32, [1, 8], offset=64), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def core_segments(server: Serve, min_bytes: int) -> set[str]:
    """The core's pool segments of at least ``min_bytes``."""
    paths = glob.glob(os.path.join(SHM_DIR, glob.escape(server._session) + "-core-*"))
    return {path for path in paths if os.path.exists(path) and os.path.getsize(path) >= min_bytes}


def test_a_64_mib_tensor_round_trips_through_regions(regions: Regions, tc: Client, triton: Any, server: Serve) -> None:
    data = np.random.default_rng(1).standard_normal((1, 16 << 20)).astype(np.float32)  # 64 MiB
    inputs, outputs, answer = regions.identity(triton, data)
    before = core_segments(server, data.nbytes)
    tc.infer("large_fp32", inputs, outputs=outputs)
    assert np.array_equal(regions.shm.get_contents_as_numpy(answer, np.float32, list(data.shape)), data)
    # The instance read the input from the client's object itself: the core copied nothing into its pool.
    assert core_segments(server, data.nbytes) <= before


# errors -----------------------------------------------------------------------------------------------------------


def test_infer_errors_name_the_region_and_the_sizes(regions: Regions, tc: Client, triton: Any) -> None:
    data = np.ones((1, 16), np.float32)
    source, _, _ = regions.create(data.nbytes, data)
    target, _, _ = regions.create(32)

    def infer(*tensors: Any, outputs: list[Any] | None = None) -> Callable[[], Any]:
        return lambda: tc.infer("identity_fp32", list(tensors), outputs=outputs)

    unknown = shm_input(triton, "INPUT0", data, source)
    unknown.set_shared_memory("no-such-region", data.nbytes)
    assert "Unable to find shared memory region: 'no-such-region'" in server_error(infer(unknown))
    assert "Invalid offset + byte size for shared memory region" in server_error(
        infer(shm_input(triton, "INPUT0", data, source, offset=4))
    )
    short = triton.InferInput("INPUT0", [1, 16], "FP32")
    short.set_shared_memory(source, 60)
    assert "shape [1, 16] of FP32 needs 64 bytes, got 60" in server_error(infer(short))
    too_small = shm_output(triton, "OUTPUT0", target, 32)
    assert "output 'OUTPUT0' (32 bytes) should be at least 64 bytes" in server_error(
        infer(shm_input(triton, "INPUT0", data, source), outputs=[too_small])
    )
    assert "Unable to find system shared memory region: 'no-such-region'" in server_error(
        lambda: tc.get_system_shared_memory_status("no-such-region")
    )


def test_register_errors(regions: Regions, tc: Client, server: Serve) -> None:
    name, key, _ = regions.create(64)
    assert f"shared memory region '{name}' already in manager" in server_error(
        lambda: tc.register_system_shared_memory(name, key, 64)
    )
    missing = f"/shmtest-missing-{uuid.uuid4().hex[:8]}"
    assert f"Unable to open shared memory region: '{missing}'" in server_error(
        lambda: tc.register_system_shared_memory("missing", missing, 64)
    )
    assert "invalid args" in server_error(lambda: tc.register_system_shared_memory("past", key, 64, offset=8))
    own = f"/{server._session}-core-1"
    assert "one of this server's own segments" in server_error(lambda: tc.register_system_shared_memory("own", own, 8))
    assert status_names(tc) == {name}


def test_cuda_registration_without_a_gpu_is_a_clear_error(tc: Client) -> None:
    # A well-formed handle no device can open: without the CUDA runtime 501 / UNIMPLEMENTED, with it but no such
    # buffer 400 / INVALID_ARGUMENT; either way the message says what failed.
    handle = base64.b64encode(bytes(64))
    assert "CUDA" in server_error(lambda: tc.register_cuda_shared_memory("gpu", handle, 0, 64))
    assert not tc.get_cuda_shared_memory_status() or isinstance(tc, triton_grpc.InferenceServerClient)


def test_unregistering_a_region_in_use_waits_for_its_request(
    regions: Regions, tc: Client, triton: Any, server: Serve
) -> None:
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs, outputs, answer = regions.identity(triton, data)
    answers: list[Any] = []
    if isinstance(tc, triton_http.InferenceServerClient):
        pending = tc.async_infer("slow", inputs, outputs=outputs, parameters={"sleep_s": 0.5})
    else:
        tc.async_infer(
            "slow",
            inputs,
            lambda result, error: answers.append((result, error)),
            outputs=outputs,
            parameters={"sleep_s": 0.5},
        )
    time.sleep(0.2)
    tc.unregister_system_shared_memory()  # while the request runs: its name goes, its mapping stays
    assert status_names(tc) == set()
    if isinstance(tc, triton_http.InferenceServerClient):
        pending.get_result()
    else:
        assert eventually(lambda: bool(answers), 10.0)
        assert answers[0][1] is None
    np.testing.assert_array_equal(regions.shm.get_contents_as_numpy(answer, np.float32, [1, 16]), data)
    core = core_pid(server)
    assert eventually(lambda: not any(mapped_by(core, key) for key in regions.keys))


# the restricted API, the server's end ---------------------------------------------------------------------------


def identity_server(**config: Any) -> Serve:
    """A server of the test's own, serving ``identity`` (batches of up to 8)."""
    serve = Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0, **config))
    serve.bind("identity", identity, [fp32("INPUT0")], [fp32("OUTPUT0")], ModelConfig(max_batch_size=8))
    return serve


@pytest.fixture(scope="module")
def restricted() -> Iterator[Serve]:
    """A server whose shared-memory API needs the header admin-key: s3cret."""
    with identity_server(restricted_api="shared-memory:admin-key=s3cret") as serve:
        yield serve


def test_the_restricted_api_needs_its_header(shm: ModuleType, restricted: Serve) -> None:
    http = triton_http.InferenceServerClient(f"127.0.0.1:{restricted.http_port}")
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{restricted.grpc_port}")
    made = Regions(shm, http)
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    try:
        name, key, _ = made.create(data.nbytes, data, register=False)
        with pytest.raises(InferenceServerException) as info:
            http.register_system_shared_memory(name, key, data.nbytes)
        assert info.value.status() == "403" and "expecting header 'admin-key'" in str(info.value.message())
        with pytest.raises(InferenceServerException) as info:
            grpc.get_system_shared_memory_status()
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "expecting header 'triton-grpc-protocol-admin-key'" in str(info.value.message())
        http.register_system_shared_memory(name, key, data.nbytes, headers={"admin-key": "s3cret"})
        assert grpc.get_system_shared_memory_status(headers={"triton-grpc-protocol-admin-key": "s3cret"}).regions
        # Inference is not restricted: a region registered with the header serves anyone's requests.
        source = shm_input(triton_http, "INPUT0", data, name)
        result = http.infer("identity", [source], outputs=[shm_output(triton_http, "OUTPUT0", name, data.nbytes)])
        assert result.get_output("OUTPUT0")["shape"] == [1, 4]
        with pytest.raises(InferenceServerException):
            http.unregister_system_shared_memory(headers={"admin-key": "wrong"})
        grpc.unregister_system_shared_memory(headers={"triton-grpc-protocol-admin-key": "s3cret"})
        assert not grpc.get_system_shared_memory_status(headers={"triton-grpc-protocol-admin-key": "s3cret"}).regions
    finally:
        made.destroy()
        http.close()
        grpc.close()


def test_the_clients_objects_outlive_the_server(shm: ModuleType) -> None:
    data = np.arange(1 << 20, dtype=np.float32).reshape(1, -1)  # 4 MiB: through the server's own pool too
    with identity_server() as serve:
        http = triton_http.InferenceServerClient(f"127.0.0.1:{serve.http_port}")
        made = Regions(shm, http)
        try:
            inputs, outputs, answer = made.identity(triton_http, data)
            http.infer("identity", inputs, outputs=outputs)
        except BaseException:
            made.close()
            raise
        finally:
            http.close()
    try:
        # The server stopped with both regions registered: it unmapped them and removed its own segments only.
        assert glob.glob(os.path.join(SHM_DIR, glob.escape(serve._session) + "*")) == []
        assert all(os.path.exists(os.path.join(SHM_DIR, key.lstrip("/"))) for key in made.keys)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(answer, np.float32, list(data.shape)), data)
    finally:
        made.destroy()
    assert not any(os.path.exists(os.path.join(SHM_DIR, key.lstrip("/"))) for key in made.keys)


# perf_analyzer ----------------------------------------------------------------------------------------------------


def test_perf_analyzer_with_system_shared_memory(
    perf_analyzer: str, server: Serve, client: triton_http.InferenceServerClient, protocol: str
) -> None:
    before = set(os.listdir(SHM_DIR))
    port = server.http_port if protocol == "http" else server.grpc_port
    options = ("--shared-memory", "system", "--output-shared-memory-size", "64")
    run_perf_analyzer(perf_analyzer, port, "identity_fp32", *options, protocol=protocol)
    assert status_names(client) == set()  # perf_analyzer unregistered its regions
    # ... and removed its objects (other servers on the machine may add their own pyserve-* segments meanwhile).
    left = {name for name in set(os.listdir(SHM_DIR)) - before if not name.startswith(("pyserve-", "sem."))}
    assert left == set()
