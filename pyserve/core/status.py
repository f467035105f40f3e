"""What the status page shows beyond the statistics: each model's instances (kind, pid, device, host, node,
restarts, state, batches) and its request latency quantiles. The ``StatusView`` of ``CoreApi``, read when the page
asks, never per request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pyserve.core.inference import REMOTE_KIND, Instance, ModelEntry
from pyserve.core.metrics_collector import LatencyRecorder
from pyserve.core.supervisor import WorkerProcess


class ProcessDirectory(Protocol):
    """Where the supervised processes of a model version are found (``WorkerControl.processes``)."""

    def processes(self, entry: ModelEntry) -> list[WorkerProcess]: ...


class CoreStatus:
    """The instances of the model versions and their latency quantiles, read from the core's own records."""

    def __init__(self, workers: ProcessDirectory) -> None:
        self._workers = workers

    def instances(self, entry: ModelEntry) -> list[dict[str, Any]]:
        """Each instance of ``entry``: connected ones by their state, process instances also while they start or
        wait to be restarted."""
        devices = entry.spec.config.devices
        described: list[dict[str, Any]] = []
        connected = list(entry.instances)
        for worker in self._workers.processes(entry):
            instance = next((i for i in connected if i.kind == "process" and i.pid and i.pid == worker.pid), None)
            if instance is not None:
                connected.remove(instance)
                state = "busy" if instance.busy else "idle"
            else:
                state = "restarting" if worker.process is None else "starting"
            described.append(_described(worker.index, "process", worker.pid, devices, worker.restarts, state, instance))
        for instance in connected:
            state = "busy" if instance.busy else "idle"
            described.append(_described(instance.index, instance.kind, instance.pid, devices, 0, state, instance))
        return sorted(described, key=lambda instance: (instance["index"], instance["kind"]))

    def latency_quantiles(self, entry: ModelEntry, quantiles: Sequence[float]) -> list[float] | None:
        """The request latency summary's quantiles (µs, the last minute), when ``metrics_summaries`` keeps one."""
        recorder = entry.stats.latency
        if not isinstance(recorder, LatencyRecorder) or "request" not in recorder.summaries:
            return None
        return [value for _, value in recorder.summaries["request"].quantiles(quantiles)]


def _described(
    index: int,
    kind: str,
    pid: int,
    devices: Sequence[str],
    restarts: int,
    state: str,
    instance: Instance | None = None,
) -> dict[str, Any]:
    # What a connected instance said of itself; else placement is round-robin over the configured devices, for
    # thread and process instances alike (one waiting to be restarted has not said).
    device = instance.device if instance is not None and instance.device else ""
    if not device:
        device = "remote" if kind == REMOTE_KIND else devices[index % len(devices)] if devices else "cpu"
    if instance is not None:
        kind = instance.shown_kind
    return {
        "index": index,
        "kind": kind,
        "pid": pid,
        "device": device,
        "host": instance.host if instance is not None else "",
        "node": instance.node if instance is not None else "",
        "restarts": restarts,
        "state": state,
        "batches": instance.batches_done if instance is not None else 0,
    }
