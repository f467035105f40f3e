"""pyserve.client.shared_memory without a server: deciding that a server is local, laying a request out in a region,
and the pool of regions (lease, reuse, retire, close, the finalizer). The round trips, and a server reached by an
address of this host that is not loopback, are in tests/integration/test_client_shared_memory.py."""

from __future__ import annotations

import gc
import os
from typing import Any

import numpy as np
import pytest

from pyserve import Tensor
from pyserve.client.model import InferRequest, Placement, RemoteModelConfig, ServerAddress
from pyserve.client.shared_memory import (
    ALIGNMENT,
    MIN_REGION_BYTES,
    MIN_SHARED_BYTES,
    Region,
    RegionPool,
    check_option,
    plan_request,
    server_is_local,
    size_class,
)
from pyserve.errors import ClientClosedError, ClientError, ConfigError

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="system shared memory lives in /dev/shm")

LOCAL = ServerAddress("http", "127.0.0.1", 8000)
ROWS = 1 << 15  # FP32 elements per row: 128 KiB, enough to place


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "0.0.0.0", "127.0.0.2"])
def test_loopback_and_unspecified_hosts_are_local(host: str) -> None:
    assert server_is_local(host)


@pytest.mark.parametrize("host", ["203.0.113.7", "2001:db8::1", "no-such-host.invalid"])
def test_other_hosts_and_names_that_do_not_resolve_are_not_local(host: str) -> None:
    assert not server_is_local(host)


@pytest.mark.parametrize("value", [False, True, "auto"])
def test_the_option_takes_false_true_or_auto(value: Any) -> None:
    assert check_option(value) == value


@pytest.mark.parametrize("value", ["yes", 1, None, "AUTO"])
def test_any_other_option_is_a_config_error(value: Any) -> None:
    with pytest.raises(ConfigError, match="shared_memory must be False, True or 'auto'"):
        check_option(value)


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (1, MIN_REGION_BYTES),
        (MIN_REGION_BYTES, MIN_REGION_BYTES),
        (MIN_REGION_BYTES + 1, MIN_REGION_BYTES * 5 // 4),
        (1 << 20, 1 << 20),
        ((1 << 20) + 1, 5 << 18),
        ((128 << 20) + 64, 160 << 20),  # 64 MiB in and out, aligned: a quarter over, not twice
    ],
)
def test_size_classes_are_quarters_of_powers_of_two(nbytes: int, expected: int) -> None:
    assert size_class(nbytes) == expected
    assert expected >= nbytes
    assert expected <= max(MIN_REGION_BYTES, nbytes * 5 // 4 + 1)


def config(outputs: list[Tensor], batching: bool = True, inputs: list[Tensor] | None = None) -> RemoteModelConfig:
    return RemoteModelConfig(
        "m",
        None,
        8 if batching else 0,
        False,
        tuple(inputs or [Tensor("INPUT0", np.float32, (-1,))]),
        tuple(outputs),
        {},
    )


def request(**inputs: np.ndarray) -> InferRequest:
    return InferRequest("m", None, dict(inputs))


def test_inputs_and_fixed_outputs_are_placed_end_to_end_aligned() -> None:
    fixed = Tensor("FIXED", np.float32, (ROWS,))
    small = Tensor("SMALL", np.int8, (3,))
    plan = plan_request(config([fixed, small]), request(INPUT0=np.zeros((2, ROWS), np.float32)))
    assert plan is not None
    assert plan.inputs == {"INPUT0": 0}
    two_rows = 2 * ROWS * 4
    assert plan.outputs == {"FIXED": (two_rows, two_rows), "SMALL": (2 * two_rows, 6)}
    assert plan.byte_size == 2 * two_rows + ALIGNMENT
    assert all(offset % ALIGNMENT == 0 for offset, _ in plan.outputs.values())
    assert plan.requested == ("FIXED", "SMALL")


def test_variable_and_bytes_outputs_and_bytes_inputs_travel_as_usual() -> None:
    outputs = [
        Tensor("VARIABLE", np.float32, (-1,)),
        Tensor("TEXT", bytes, (1,)),
        Tensor("FIXED", np.float32, (4,)),
    ]
    text = np.array([[b"abc"]] * 2, dtype=object)
    plan = plan_request(config(outputs), request(INPUT0=np.zeros((2, ROWS), np.float32), TEXT=text))
    assert plan is not None
    assert set(plan.inputs) == {"INPUT0"}
    assert set(plan.outputs) == {"FIXED"}
    # Naming one output in a request returns only those named: every declared output is listed.
    assert plan.requested == ("VARIABLE", "TEXT", "FIXED")


def test_a_model_without_batching_sizes_its_outputs_by_their_dims() -> None:
    tensor = Tensor("OUTPUT0", np.int32, (256, 256))
    plan = plan_request(config([tensor], batching=False), request(INPUT0=np.zeros((256, 256), np.int32)))
    assert plan is not None
    assert plan.outputs == {"OUTPUT0": (256 * 256 * 4, 256 * 256 * 4)}


def test_inputs_of_different_batch_sizes_place_no_output() -> None:
    two_inputs = [Tensor("A", np.float32, (-1,)), Tensor("B", np.float32, (-1,))]
    plan = plan_request(
        config([Tensor("OUTPUT0", np.float32, (4,))], inputs=two_inputs),
        request(A=np.zeros((2, ROWS), np.float32), B=np.zeros((3, ROWS), np.float32)),
    )
    assert plan is not None
    assert plan.outputs == {}


def test_a_small_request_is_not_placed() -> None:
    small = np.zeros((1, MIN_SHARED_BYTES // 8), np.float32)
    assert plan_request(config([Tensor("OUTPUT0", np.float32, (-1,))]), request(INPUT0=small)) is None


def test_a_region_holds_what_is_written_and_reads_back_a_copy() -> None:
    region = Region(MIN_REGION_BYTES)
    try:
        assert os.path.getsize(region.path) == MIN_REGION_BYTES
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        region.write(64, data.T)  # any layout: written C-ordered
        back = region.read(64, "FP32", [4, 3])
        np.testing.assert_array_equal(back, data.T)
        region.write(64, np.zeros((4, 3), np.float32))
        np.testing.assert_array_equal(back, data.T)  # a copy: the region's next use does not change it
        assert back.flags.writeable
    finally:
        region.close()
    assert not os.path.exists(region.path)


def test_a_layout_refuses_an_output_larger_than_its_slice() -> None:
    fixed = Tensor("OUTPUT0", np.float32, (ROWS,))
    req = request(INPUT0=np.ones((1, ROWS), np.float32))
    plan = plan_request(config([fixed]), req)
    assert plan is not None
    region = Region(size_class(plan.byte_size))
    try:
        layout = plan.lay_out(region, req)
        assert layout.inputs["INPUT0"] == Placement(region.name, 0, ROWS * 4)
        assert layout.outputs["OUTPUT0"].parameters() == {
            "shared_memory_region": region.name,
            "shared_memory_byte_size": ROWS * 4,
            "shared_memory_offset": ROWS * 4,
        }
        np.testing.assert_array_equal(region.read(0, "FP32", [1, ROWS]), req.inputs["INPUT0"])
        with pytest.raises(ClientError, match=r"output 'OUTPUT0': the server describes shape \[2, 32768\]"):
            layout.read_output("OUTPUT0", "FP32", [2, ROWS])
        with pytest.raises(ClientError, match="output 'OTHER'"):
            layout.read_output("OTHER", "FP32", [1])
    finally:
        region.close()


def test_the_pool_reuses_a_region_given_back_and_retires_one_given_up_on() -> None:
    pool = RegionPool("auto", LOCAL)
    assert pool.use()
    first, new = pool.lease(100_000)
    assert new
    assert first.byte_size == size_class(100_000)
    pool.give_back(first, reusable=True)
    again, new = pool.lease(100_000)
    assert (again, new) == (first, False)
    other, new = pool.lease(100_000)  # the first is leased: a second call gets its own
    assert new
    assert other is not first
    pool.give_back(other, reusable=False)  # e.g. a client-side timeout: the server may still write into it
    assert not os.path.exists(other.path)
    assert pool.take_retired() == [other.name]
    assert pool.take_retired() == []
    pool.give_back(first, reusable=True)
    assert sorted(pool.close()) == [first.name]
    assert not os.path.exists(first.path)
    with pytest.raises(ClientClosedError):
        pool.lease(1)
    assert not pool.use()


def test_the_pool_keeps_idle_regions_up_to_its_retain_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pyserve.client.shared_memory.RETAIN_BYTES", MIN_REGION_BYTES)
    pool = RegionPool(True, LOCAL)
    kept, _ = pool.lease(1)
    past, _ = pool.lease(1)
    pool.give_back(kept, reusable=True)
    pool.give_back(past, reusable=True)
    assert os.path.exists(kept.path)
    assert not os.path.exists(past.path)
    assert pool.take_retired() == [past.name]
    pool.close()


def test_a_refused_region_is_removed_and_auto_stops_using_regions() -> None:
    auto = RegionPool("auto", LOCAL)
    region, _ = auto.lease(1)
    auto.refused(region)
    assert not os.path.exists(region.path)
    assert not auto.use()
    assert auto.close() == []
    insisting = RegionPool(True, LOCAL)
    region, _ = insisting.lease(1)
    insisting.refused(region)
    assert insisting.use()  # True keeps trying, and raising the server's error
    insisting.close()


def test_true_with_a_server_elsewhere_is_a_config_error_and_auto_is_off() -> None:
    elsewhere = ServerAddress("grpc", "203.0.113.7", 8001)
    with pytest.raises(ConfigError, match=r"server at grpc://203\.0\.113\.7:8001 is not on this host"):
        RegionPool(True, elsewhere).use()
    assert not RegionPool("auto", elsewhere).use()


def test_a_pool_dropped_without_close_unlinks_its_objects() -> None:
    pool = RegionPool(True, LOCAL)
    region, _ = pool.lease(1)
    pool.give_back(region, reusable=True)
    path = region.path
    del pool, region
    gc.collect()
    assert not os.path.exists(path)
