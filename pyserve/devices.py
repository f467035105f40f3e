"""The GPUs this process may use: the GPUs NVML lists, narrowed by ``CUDA_VISIBLE_DEVICES`` read as CUDA reads it.

The repository counts them (a ``KIND_GPU`` instance group without ``gpus`` spreads over them, and ``KIND_AUTO``
decides by them), the metrics page reads them, and the supervisor pins each process instance to one of them. NVML
comes from ``nvidia-ml-py`` (the ``gpu`` extra); where it is missing or cannot start (no driver), no GPU is counted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


@dataclasses.dataclass(frozen=True)
class VisibleGpu:
    """A GPU CUDA shows this process. ``entry`` is how ``CUDA_VISIBLE_DEVICES`` names it (an index, a GPU UUID or a
    unique prefix of one, a MIG device; the NVML index where the variable is unset); ``index`` is its NVML index,
    None for a MIG device (a slice of a GPU)."""

    entry: str
    index: int | None


def visible_gpus(uuids: Sequence[str], visible_devices: str | None) -> tuple[VisibleGpu, ...]:
    """The GPUs with these UUIDs (in NVML's order) that ``visible_devices`` (``CUDA_VISIBLE_DEVICES``) shows, in
    CUDA's order: the first is ``cuda:0``.

    Unset, all. Otherwise its entries are read as CUDA reads them: up to the first entry that names no GPU, or one
    already named. A MIG device (``MIG-...``) counts as one GPU.
    """
    if visible_devices is None:
        return tuple(VisibleGpu(str(index), index) for index in range(len(uuids)))
    shown: list[VisibleGpu] = []
    named: set[str] = set()
    for entry in device_entries(visible_devices):
        index: int | None
        if entry.isdigit() and int(entry) < len(uuids):
            index = int(entry)
        elif entry.startswith("GPU-") and len(found := [i for i, u in enumerate(uuids) if u.startswith(entry)]) == 1:
            index = found[0]
        elif entry.startswith("MIG-"):
            index = None
        else:
            break
        device = entry if index is None else uuids[index]
        if device in named:
            break
        named.add(device)
        shown.append(VisibleGpu(entry, index))
    return tuple(shown)


def device_entries(visible_devices: str) -> tuple[str, ...]:
    """The entries of ``CUDA_VISIBLE_DEVICES`` that may name a device, as far as they can be read without NVML: up
    to the first that is no index, ``GPU-`` or ``MIG-`` name, or that repeats one."""
    entries: list[str] = []
    for entry in (item.strip() for item in visible_devices.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))) or entry in entries:
            break
        entries.append(entry)
    return tuple(entries)


def pinned_visible_devices(ordinal: int, visible_devices: str | None) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` that shows a child process only this process's ``cuda:<ordinal>`` (which the
    child then knows as ``cuda:0``): this process's own entry for it. None where this process has no such entry."""
    if visible_devices is None:
        return str(ordinal)
    entries = device_entries(visible_devices)
    return entries[ordinal] if 0 <= ordinal < len(entries) else None


def nvml_gpus(nvml: Any) -> list[tuple[str, Any]]:
    """(UUID, handle) of every GPU a started NVML (the ``pynvml`` module) lists, in NVML's order."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        gpus.append((uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))  # older releases: bytes
    return gpus


def visible_gpu_count(environ: Mapping[str, str] = os.environ) -> int:
    """How many GPUs CUDA would show a process with this environment: NVML's GPUs narrowed by its
    ``CUDA_VISIBLE_DEVICES``; 0 where NVML is not installed or cannot start (no driver)."""
    try:
        import pynvml
    except ImportError:
        logger.debug("nvidia-ml-py is not installed: no GPU is counted")
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        logger.debug("NVML cannot start (%s): no GPU is counted", exc)
        return 0
    try:
        uuids = [uuid for uuid, _ in nvml_gpus(pynvml)]
    except pynvml.NVMLError as exc:
        logger.debug("NVML cannot list the GPUs (%s): no GPU is counted", exc)
        return 0
    finally:
        pynvml.nvmlShutdown()
    return len(visible_gpus(uuids, environ.get(VISIBLE_DEVICES)))
