"""The TensorRT backend where tensorrt may be missing (it needs a GPU): whether it can use one."""

from __future__ import annotations

import importlib.util

from pyserve.backends import tensorrt as trt_backend


def test_tensorrt_can_use_a_gpu_where_it_is_installed() -> None:
    assert trt_backend.gpu_capable() is (importlib.util.find_spec("tensorrt") is not None)
