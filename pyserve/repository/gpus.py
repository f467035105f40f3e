"""The GPUs this process sees, counted as CUDA would show them: the GPUs a ``KIND_GPU`` instance group without
``gpus`` spreads over (Triton places such a group on every GPU), and what ``KIND_AUTO`` decides by."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

logger = logging.getLogger(__name__)


def visible_gpu_count() -> int:
    """How many GPUs CUDA would show this process: NVML's devices narrowed by ``CUDA_VISIBLE_DEVICES``; 0 where
    NVML (``nvidia-ml-py``, the ``gpu`` extra) is not installed or cannot start (no driver)."""
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
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in handles]
    except pynvml.NVMLError as exc:
        logger.debug("NVML cannot list the GPUs (%s): no GPU is counted", exc)
        return 0
    finally:
        pynvml.nvmlShutdown()
    return count_visible(uuids, os.environ.get("CUDA_VISIBLE_DEVICES"))


def count_visible(uuids: Sequence[str], visible_devices: str | None) -> int:
    """How many of the GPUs with these UUIDs (in NVML's order) ``visible_devices`` (``CUDA_VISIBLE_DEVICES``) shows.

    Unset, all. Otherwise its entries are indexes or UUIDs (``GPU-...``, a unique prefix is enough), read as CUDA
    reads them: up to the first entry that names no GPU, or one already named. A MIG device (``MIG-...``) counts as
    one GPU.
    """
    if visible_devices is None:
        return len(uuids)
    named: set[str] = set()
    for entry in (item.strip() for item in visible_devices.split(",")):
        if entry.isdigit() and int(entry) < len(uuids):
            device = uuids[int(entry)]
        elif entry.startswith("GPU-") and len(found := [u for u in uuids if u.startswith(entry)]) == 1:
            device = found[0]
        elif entry.startswith("MIG-"):
            device = entry
        else:
            break
        if device in named:
            break
        named.add(device)
    return len(named)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
