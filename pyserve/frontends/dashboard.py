"""The status page: ``GET /dashboard`` on the HTTP port (``/`` redirects there), one page with no build step and no
CDN, and the JSON it polls, ``GET /dashboard/data``. ``ServeConfig.dashboard`` False turns both off (404).

The page shows what the server already keeps, read when asked, never per request: the models and their instances
(``CoreApi.models``, ``CoreApi.status``), queue depths, the statistics extension's counters and batch sizes, and the
latency summaries when ``ServeConfig.metrics_summaries`` keeps them. For "the last minutes" a timer samples those
counters every ``SAMPLE_S`` seconds into a ring of ``HISTORY_SAMPLES`` (five minutes): the page draws throughput,
latency and queue depth from the differences between samples, so a page opened now shows the minutes before it.

Recent errors are of two kinds, both kept in small rings: what the core process logged at WARNING or above (an
instance died, a load failed), and failed requests, counted by model and Triton's failure reason between two samples
(a model's own exception is logged where the model runs, in its instance's process).

The assets (``dashboard_assets/``: the HTML page, its stylesheet and script) ship in the package and are read once;
the stylesheet and script are inlined into the page, so it is one request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from importlib import resources
from typing import Any

from pyserve.config import ServeConfig
from pyserve.core.api import CoreApi
from pyserve.core.inference import ModelEntry
from pyserve.frontends.common import SERVER_NAME, SERVER_VERSION

logger = logging.getLogger(__name__)

SAMPLE_S = 2.0
HISTORY_SAMPLES = 150  # five minutes of samples
RECENT_ERRORS = 50
QUANTILES = (0.5, 0.99)
# The numbers of a model version in a history sample, in this order (the page reads them by these names).
SAMPLE_FIELDS = ("success", "fail", "success_ns", "inferences", "executions", "queued", "p50_us", "p99_us")
_FAILURES = {
    "REJECTED": "were rejected by the scheduler (queue full, or a queue timeout)",
    "CANCELED": "were cancelled (their clients went away)",
    "BACKEND": "failed in the model (its function raised; the traceback is in its instance's log)",
    "OTHER": "failed (an instance died, or the model was unloaded)",
}


class Dashboard:
    """The page's assets, its history of samples and its recent errors, for one HTTP front end."""

    def __init__(self, core: CoreApi, config: ServeConfig) -> None:
        self.core = core
        self.summaries = config.metrics_summaries
        self.page = _page()
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_SAMPLES)
        self.errors: deque[dict[str, Any]] = deque(maxlen=RECENT_ERRORS)
        self.started = time.time()
        self._failures: dict[str, dict[str, int]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._log_handler: RecentLogs | None = None

    def start(self) -> None:
        """Start sampling on the running loop, and keep what the core logs at WARNING or above."""
        self._log_handler = RecentLogs(self.errors)
        logging.getLogger("pyserve").addHandler(self._log_handler)
        self._tick()

    def close(self) -> None:
        """Stop sampling and keeping logs."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._log_handler is not None:
            logging.getLogger("pyserve").removeHandler(self._log_handler)
            self._log_handler = None

    def _tick(self) -> None:
        try:
            self.sample()
        except Exception:  # a page without history beats a core whose timer died
            logger.exception("the status page could not sample the statistics")
        self._timer = asyncio.get_running_loop().call_later(SAMPLE_S, self._tick)

    # the data ------------------------------------------------------------------------------------------------------

    def sample(self) -> None:
        """Add a sample of every model version's counters to the history; note failed requests since the last."""
        now = time.time()
        models: dict[str, list[float | None]] = {}
        for entry in self.core.models.entries():
            key = f"{entry.name}/{entry.version}"
            stats = entry.stats
            p50, p99 = self._quantiles(entry) or (None, None)
            models[key] = [
                stats.success.count,
                stats.fail.count,
                stats.success.ns,
                stats.inference_count,
                stats.execution_count,
                _queued(entry),
                p50,
                p99,
            ]
            self._note_failures(now, entry, key)
        self.history.append({"t": now, "models": models})

    def data(self) -> dict[str, Any]:
        """What the page shows: the server, each model version now, the history of samples, recent errors."""
        core = self.core
        return {
            "server": {
                "name": SERVER_NAME,
                "version": SERVER_VERSION,
                "pid": os.getpid(),
                "started": self.started,
                "now": time.time(),
                "ready": core.is_ready(),
                "sample_s": SAMPLE_S,
                "latency": "quantiles" if self.summaries else "mean",
            },
            "models": [self._model(entry) for entry in core.models.entries()],
            "history": {"fields": SAMPLE_FIELDS, "samples": list(self.history)},
            # list() first: a thread of the core may log while this sorts.
            "errors": sorted(list(self.errors), key=lambda error: -float(error["t"])),
        }

    def _model(self, entry: ModelEntry) -> dict[str, Any]:
        config = entry.spec.config
        stats = entry.stats
        status = self.core.status
        instances = status.instances(entry) if status is not None else _connected(entry)
        quantiles = self._quantiles(entry)
        return {
            "name": entry.name,
            "version": entry.version,
            "ready": entry.ready,
            "max_batch_size": config.max_batch_size,
            "decoupled": config.decoupled,
            "configured_instances": config.instances,
            "worker": str(getattr(config.worker, "value", config.worker)),
            "instances": instances,
            "queued": _queued(entry),
            "stats": {
                "success": stats.success.count,
                "success_ns": stats.success.ns,
                "fail": stats.fail.count,
                "queue_ns": stats.queue.ns,
                "inference_count": stats.inference_count,
                "execution_count": stats.execution_count,
                "last_inference_ms": stats.last_inference_ms,
                "failures": dict(stats.failures),
            },
            # Executions by batch size (rows), from the statistics extension's batch_stats.
            "batches": [[size, batch.compute_infer.count] for size, batch in sorted(stats.batches.items())],
            "latency_us": None if quantiles is None else dict(zip(("p50", "p99"), quantiles, strict=True)),
        }

    def _quantiles(self, entry: ModelEntry) -> list[float] | None:
        status = self.core.status
        if status is None or not self.summaries:
            return None
        return status.latency_quantiles(entry, QUANTILES)

    def _note_failures(self, now: float, entry: ModelEntry, key: str) -> None:
        failures = dict(entry.stats.failures)
        before = self._failures.get(key)
        self._failures[key] = failures
        if before is None:
            before = dict.fromkeys(failures, 0)  # failures before the first sample count as recent too
        for reason, count in failures.items():
            new = count - before.get(reason, 0)
            if new > 0:
                self.errors.append(
                    {
                        "t": now,
                        "level": "WARNING" if reason == "CANCELED" else "ERROR",
                        "source": f"model {key}",
                        "message": f"{new} request(s) {_FAILURES.get(reason, 'failed (' + reason + ')')}",
                    }
                )


class RecentLogs(logging.Handler):
    """Keeps the core's log records at WARNING and above as recent errors."""

    def __init__(self, errors: deque[dict[str, Any]]) -> None:
        super().__init__(logging.WARNING)
        self._errors = errors

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: keep the format
            message = str(record.msg)
        self._errors.append({"t": record.created, "level": record.levelname, "source": record.name, "message": message})


def _queued(entry: ModelEntry) -> int:
    return entry.scheduler.queued_count() if entry.scheduler is not None else 0


def _connected(entry: ModelEntry) -> list[dict[str, Any]]:
    """The connected instances, where the core offers no ``status`` (a test's fake core)."""
    return [
        {
            "index": i.index,
            "kind": i.kind,
            "pid": i.pid,
            "device": "",
            "restarts": 0,
            "state": "busy" if i.busy else "idle",
        }
        for i in entry.instances
    ]


def _page() -> bytes:
    """index.html with the stylesheet and the script inlined."""
    assets = resources.files("pyserve.frontends").joinpath("dashboard_assets")
    html = assets.joinpath("index.html").read_text(encoding="utf-8")
    css = assets.joinpath("dashboard.css").read_text(encoding="utf-8")
    script = assets.joinpath("dashboard.js").read_text(encoding="utf-8")
    html = html.replace("<!-- dashboard.css -->", f"<style>\n{css}</style>")
    html = html.replace("<!-- dashboard.js -->", f"<script>\n{script}</script>")
    return html.encode("utf-8")
