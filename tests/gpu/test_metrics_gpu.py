"""GPU metrics from NVML on a machine with a GPU: Triton's nv_gpu_* families, one series per GPU by UUID."""

from __future__ import annotations

import urllib.request

import pytest

from pyserve import Serve, ServeConfig

pytestmark = pytest.mark.gpu

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (the gpu extra)")


def gpu_uuids() -> list[str]:
    try:
        pynvml.nvmlInit()
    except Exception:
        pytest.skip("NVML cannot start here: no GPU or no driver")
    try:
        uuids = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
            uuids.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        return uuids
    finally:
        pynvml.nvmlShutdown()


def test_the_metrics_page_has_every_gpu_under_its_uuid() -> None:
    uuids = gpu_uuids()
    if not uuids:
        pytest.skip("NVML sees no GPU")
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as server:
        response = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30)
        try:
            page = response.read().decode()
        finally:
            response.close()
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage"):
        assert f"# TYPE {name} gauge" in page, name
        for uuid in uuids:
            assert f'{name}{{gpu_uuid="{uuid}"}}' in page, (name, uuid)
