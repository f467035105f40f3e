"""Counting the GPUs instance groups are placed on: CUDA_VISIBLE_DEVICES read as CUDA reads it, and no GPU where NVML
is missing or cannot start."""

from __future__ import annotations

import sys
import types

import pytest

from pyserve.repository.gpus import count_visible, visible_gpu_count

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
        ("-1", 0),
        ("GPU-4a1c", 1),  # a unique UUID prefix
        ("GPU-4a1", 0),  # an ambiguous one
        ("GPU-4a1b-0000,1", 2),
        ("MIG-5b2d-2222", 1),
    ],
)
def test_cuda_visible_devices_narrows_the_gpus(visible_devices: str | None, count: int) -> None:
    assert count_visible(UUIDS, visible_devices) == count


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


def test_nvml_counts_the_gpus_cuda_visible_devices_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-4a1c")
    assert visible_gpu_count() == 1
    assert nvml.shut_down


def test_without_nvml_or_a_driver_no_gpu_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(starts=False))
    assert visible_gpu_count() == 0
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: importing it fails
    assert visible_gpu_count() == 0
