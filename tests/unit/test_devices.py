"""The GPUs this process may use: CUDA_VISIBLE_DEVICES read as CUDA reads it, no GPU where NVML is missing or cannot
start, and each process instance pinned to the server's own entry for its GPU."""

from __future__ import annotations

import sys
import types

import pytest

from pyserve.core.supervisor import placement
from pyserve.devices import (
    VisibleGpu,
    device_entries,
    nvml_gpus,
    pinned_visible_devices,
    visible_gpu_count,
    visible_gpus,
)

UUIDS = ("GPU-4a1b-0000", "GPU-4a1c-1111")


@pytest.mark.parametrize(
    ("visible_devices", "count"),
    [
        (None, 2),
        ("", 0),
        ("1", 1),
        ("1,0", 2),
        (" 0 , 1 ", 2),
        ("2", 0),  # no such GPU
        ("0,2,1", 1),  # CUDA reads up to the first entry that names no GPU
        ("0,0,1", 1),  # or names one again
        ("0,GPU-4a1b", 1),  # by index, then by UUID
        ("-1", 0),
        ("GPU-4a1c", 1),  # a unique UUID prefix
        ("GPU-4a1", 0),  # an ambiguous one
        ("GPU-4a1b-0000,1", 2),
        ("MIG-5b2d-2222", 1),
    ],
)
def test_cuda_visible_devices_narrows_the_gpus(visible_devices: str | None, count: int) -> None:
    assert len(visible_gpus(UUIDS, visible_devices)) == count


def test_each_visible_gpu_keeps_its_entry_and_nvml_index_in_cuda_order() -> None:
    assert visible_gpus(UUIDS, None) == (VisibleGpu("0", 0), VisibleGpu("1", 1))
    assert visible_gpus(UUIDS, "GPU-4a1c,0,MIG-5b2d") == (
        VisibleGpu("GPU-4a1c", 1),
        VisibleGpu("0", 0),
        VisibleGpu("MIG-5b2d", None),  # a slice of a GPU: no NVML index of its own
    )


@pytest.mark.parametrize(
    ("visible_devices", "entries"),
    [
        ("", ()),
        ("2,3", ("2", "3")),
        (" 3 , GPU-4a1c ,MIG-5b2d", ("3", "GPU-4a1c", "MIG-5b2d")),
        ("2,-1,3", ("2",)),
        ("2,2,3", ("2",)),
        ("nvidia0", ()),
    ],
)
def test_the_entries_read_without_nvml(visible_devices: str, entries: tuple[str, ...]) -> None:
    assert device_entries(visible_devices) == entries


def test_a_child_is_pinned_to_the_parents_own_entry_for_its_gpu() -> None:
    assert pinned_visible_devices(1, None) == "1"  # unset: CUDA's order is NVML's
    assert pinned_visible_devices(0, "2,3") == "2"
    assert pinned_visible_devices(1, "2,3") == "3"
    assert pinned_visible_devices(0, "GPU-4a1c,0") == "GPU-4a1c"
    assert pinned_visible_devices(2, "2,3") is None  # the parent has no GPU 2
    assert pinned_visible_devices(0, "") is None


@pytest.mark.parametrize(
    ("devices", "index", "environ", "placed"),
    [
        ((), 0, {}, ("cpu", {})),
        (("cpu",), 0, {}, ("cpu", {"CUDA_VISIBLE_DEVICES": ""})),
        (("cuda:0", "cuda:1"), 1, {}, ("cuda:0", {"CUDA_VISIBLE_DEVICES": "1"})),
        (("cuda:0", "cuda:1"), 2, {"CUDA_VISIBLE_DEVICES": "2,3"}, ("cuda:0", {"CUDA_VISIBLE_DEVICES": "2"})),
        (("cuda:1",), 0, {"CUDA_VISIBLE_DEVICES": "2,3"}, ("cuda:0", {"CUDA_VISIBLE_DEVICES": "3"})),
        (("cuda:2",), 0, {"CUDA_VISIBLE_DEVICES": "2,3"}, ("cuda:0", {"CUDA_VISIBLE_DEVICES": ""})),  # no such GPU
        (("mps",), 0, {}, ("mps", {})),
    ],
)
def test_placement_maps_an_instance_through_the_servers_cuda_visible_devices(
    devices: tuple[str, ...], index: int, environ: dict[str, str], placed: tuple[str, dict[str, str]]
) -> None:
    assert placement(devices, index, environ) == placed


def test_an_instance_on_a_gpu_the_server_lacks_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    placement(("cuda:2",), 0, {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert "placed on cuda:2, but this server's CUDA_VISIBLE_DEVICES='2,3' names no GPU 2" in caplog.text


class FakeNvml(types.ModuleType):
    """pynvml with two GPUs, or with a driver that fails to start."""

    class NVMLError(Exception):
        pass

    def __init__(self, starts: bool = True) -> None:
        super().__init__("pynvml")
        self.starts = starts
        self.shut_down = False

    def nvmlInit(self) -> None:
        if not self.starts:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return UUIDS[handle].encode()  # older nvidia-ml-py releases answer bytes


def test_nvml_lists_every_gpu_by_uuid() -> None:
    assert nvml_gpus(FakeNvml()) == [(UUIDS[0], 0), (UUIDS[1], 1)]


def test_nvml_counts_the_gpus_cuda_visible_devices_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert visible_gpu_count({}) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "GPU-4a1c"}) == 1
    assert nvml.shut_down


def test_without_nvml_or_a_driver_no_gpu_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(starts=False))
    assert visible_gpu_count({}) == 0
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: importing it fails
    assert visible_gpu_count({}) == 0
