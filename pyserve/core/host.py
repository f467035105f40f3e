"""Readings of the host for the metrics page: CPU utilization and memory from ``/proc`` (Linux), and GPU utilization,
memory, power and energy through NVML (``nvidia-ml-py``, the ``gpu`` extra), with Triton's family names."""

from __future__ import annotations

import logging
import os
from typing import Any

from pyserve.devices import VISIBLE_DEVICES, nvml_gpus, visible_gpus

logger = logging.getLogger(__name__)


class CpuReader:
    """nv_cpu_* from /proc (Linux): utilization since the previous reading, memory used and total."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._last = self._cpu_times()

    def _cpu_times(self) -> tuple[int, int] | None:
        try:
            with open(os.path.join(self._proc, "stat"), encoding="ascii") as handle:
                fields = handle.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu":
            return None
        # user nice system idle iowait irq softirq steal (guest time is already in user and nice)
        values = [int(v) for v in fields[1:9]]
        idle = values[3] + values[4]
        return sum(values), idle

    def utilization(self) -> float | None:
        """Busy share of all cores since the previous call (0.0 - 1.0); None where /proc/stat is missing."""
        now = self._cpu_times()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        total, idle = now[0] - last[0], now[1] - last[1]
        return 0.0 if total <= 0 else max(0.0, min(1.0, (total - idle) / total))

    def memory(self) -> tuple[int, int] | None:
        """(total, used) bytes of RAM, used = MemTotal - MemAvailable; None where /proc/meminfo is missing."""
        values: dict[str, int] = {}
        try:
            with open(os.path.join(self._proc, "meminfo"), encoding="ascii") as handle:
                for line in handle:
                    name, _, rest = line.partition(":")
                    if name in ("MemTotal", "MemAvailable"):
                        values[name] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        if len(values) != 2:
            return None
        return values["MemTotal"], values["MemTotal"] - values["MemAvailable"]


class GpuReader:
    """nv_gpu_* through NVML (``nvidia-ml-py``, the ``gpu`` extra): one reading per scrape, per visible GPU."""

    def __init__(self, nvml: Any, handles: list[tuple[str, Any]]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._energy_start: dict[str, float] = {}
        for uuid, handle in handles:
            energy = self._call(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            if energy is not None:
                self._energy_start[uuid] = float(energy)

    @classmethod
    def open(cls) -> GpuReader | None:
        """A reader of the GPUs this process may use, or None (no NVML, no driver or no GPU)."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            gpus = nvml_gpus(pynvml)
        except Exception as exc:  # NVMLError: library or driver missing, no device
            logger.debug("no GPU metrics: %s", exc)
            return None
        # The GPUs this server may place instances on; a MIG device has no reading of its own here.
        visible = visible_gpus([uuid for uuid, _ in gpus], os.environ.get(VISIBLE_DEVICES))
        handles = [gpus[gpu.index] for gpu in visible if gpu.index is not None]
        if not handles:
            pynvml.nvmlShutdown()
            return None
        return cls(pynvml, handles)

    def close(self) -> None:
        """Release NVML."""
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            logger.debug("nvmlShutdown failed", exc_info=True)

    @staticmethod
    def _call(function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except Exception:  # a reading this GPU does not support (power on some boards): leave it out
            return None

    def read(self) -> dict[str, list[tuple[str, float]]]:
        """Family name -> [(gpu_uuid, value)]."""
        nvml = self._nvml
        out: dict[str, list[tuple[str, float]]] = {name: [] for name, _, _ in GPU_FAMILIES}
        for uuid, handle in self._handles:
            rates = self._call(nvml.nvmlDeviceGetUtilizationRates, handle)
            if rates is not None:
                out["nv_gpu_utilization"].append((uuid, rates.gpu / 100.0))
            memory = self._call(nvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                out["nv_gpu_memory_total_bytes"].append((uuid, float(memory.total)))
                out["nv_gpu_memory_used_bytes"].append((uuid, float(memory.used)))
            power = self._call(nvml.nvmlDeviceGetPowerUsage, handle)
            if power is not None:
                out["nv_gpu_power_usage"].append((uuid, power / 1000.0))
            limit = self._call(nvml.nvmlDeviceGetPowerManagementLimit, handle)
            if limit is not None:
                out["nv_gpu_power_limit"].append((uuid, limit / 1000.0))
            energy = self._call(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            if energy is not None and uuid in self._energy_start:
                out["nv_energy_consumption"].append((uuid, (energy - self._energy_start[uuid]) / 1000.0))
        return out


GPU_FAMILIES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge"),
    ("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter"),
)
