"""Prometheus metrics with Triton's names, labels and HELP text, read from the core's counters at scrape time.

Nothing here runs per request by default: ``CoreMetrics.collect`` builds every family from the models'
``ModelStats`` (which the core keeps anyway for the statistics extension), the schedulers' queue depths, the
response cache, ``/proc`` and NVML when a scrape arrives. Workers' numbers (compute times, batch sizes) already
reach those counters with every batch result, so one scrape of the core shows all processes.

Opt-in per-request observations (``ServeConfig.metrics_summaries`` / ``metrics_histograms``) go through a
``LatencyRecorder`` attached to a model's stats: Triton's latency summaries (quantiles over a sliding minute) and
the first-response histogram of decoupled models.

The text is rendered here rather than with ``prometheus_client.generate_latest``, which renames every counter
``<name>_total``: Triton's counters (``nv_inference_request_success``...) have no suffix, and dashboards and
autoscalers query those exact names.
"""

from __future__ import annotations

import bisect
import math
import random
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from pyserve.core.host import GPU_FAMILIES, CpuReader, GpuReader
from pyserve.core.stats import FAILURE_REASONS

if TYPE_CHECKING:
    from pyserve.core.api import ModelsView
    from pyserve.core.cache import ResponseCache
    from pyserve.core.inference import ModelEntry

# Triton's defaults: summary quantiles over a 60 s window (5 age buckets), first-response histogram buckets (ms).
SUMMARY_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
SUMMARY_MAX_AGE_S = 60.0
SUMMARY_AGE_BUCKETS = 5
SUMMARY_SAMPLES_PER_BUCKET = 4096
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)

# (family, HELP text, ModelStats Duration attribute) of Triton's cumulative latency counters.
_LATENCY_COUNTERS = (
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        "success",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        "queue",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        "compute_output",
    ),
)
_SUMMARIES = (
    ("request", "nv_inference_request_summary_us", "Summary of inference request duration in microseconds "
     "(includes cached requests)"),
    ("queue", "nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds "
     "(includes cached requests)"),
    ("compute_input", "nv_inference_compute_input_summary_us", "Cumulative compute input duration in "
     "microseconds (does not include cached requests)"),
    ("compute_infer", "nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in "
     "microseconds (does not include cached requests)"),
    ("compute_output", "nv_inference_compute_output_summary_us", "Cumulative inference compute output duration "
     "in microseconds (does not include cached requests)"),
)  # fmt: skip
_CACHE_SUMMARIES = (
    ("cache_hit", "nv_cache_hit_summary_per_model", "Summary of cache hit duration per model, in microseconds"),
    ("cache_miss", "nv_cache_miss_summary_per_model", "Summary of cache miss (insert+lookup) duration per model, "
     "in microseconds"),
)  # fmt: skip


# per-request observations (opt-in) -------------------------------------------------------------------------------


class SlidingQuantiles:
    """A Prometheus summary: cumulative count and sum, and quantiles over the last ``max_age_s`` seconds.

    Observations land in the newest of ``age_buckets`` buckets that rotate every ``max_age_s / age_buckets``;
    a bucket keeps at most ``cap`` of them (a uniform sample past that), so memory stays bounded under load.
    """

    __slots__ = ("_buckets", "_cap", "_clock", "_rotate_at", "_seen", "_width", "count", "total")

    def __init__(
        self,
        max_age_s: float = SUMMARY_MAX_AGE_S,
        age_buckets: int = SUMMARY_AGE_BUCKETS,
        cap: int = SUMMARY_SAMPLES_PER_BUCKET,
        clock: Any = time.monotonic,
    ) -> None:
        self.count = 0
        self.total = 0.0
        self._clock = clock
        self._cap = cap
        self._width = max_age_s / age_buckets
        self._buckets: list[list[float]] = [[] for _ in range(age_buckets)]
        self._seen = 0  # observations offered to the newest bucket
        self._rotate_at = clock() + self._width

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.count += 1
        self.total += value
        if self._clock() >= self._rotate_at:
            self._rotate()
        newest = self._buckets[-1]
        self._seen += 1
        if len(newest) < self._cap:
            newest.append(value)
        else:
            slot = random.randrange(self._seen)
            if slot < self._cap:
                newest[slot] = value

    def quantiles(self, wanted: Iterable[float] = SUMMARY_QUANTILES) -> list[tuple[float, float]]:
        """(quantile, value) over the window; NaN when nothing was observed in it."""
        if self._clock() >= self._rotate_at:
            self._rotate()
        values = sorted(value for bucket in self._buckets for value in bucket)
        if not values:
            return [(q, math.nan) for q in wanted]
        last = len(values) - 1
        return [(q, values[min(last, max(0, math.ceil(q * len(values)) - 1))]) for q in wanted]

    def _rotate(self) -> None:
        now = self._clock()
        while now >= self._rotate_at:
            self._buckets.pop(0)
            self._buckets.append([])
            self._rotate_at += self._width
            if now - self._rotate_at > self._width * len(self._buckets):
                # Idle for longer than the whole window: every bucket is stale, skip ahead.
                self._buckets = [[] for _ in self._buckets]
                self._rotate_at = now + self._width
        self._seen = 0


class BucketHistogram:
    """A Prometheus histogram with fixed upper bounds (cumulative counts are made at scrape time)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = sorted(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations <= le), ending with +Inf."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip([*self.bounds, math.inf], self.counts, strict=True):
            running += count
            out.append((_format_value(bound), running))
        return out


class LatencyRecorder:
    """One model's opt-in per-request latency observations (a ``stats.LatencyObserver``)."""

    def __init__(self, summaries: bool, histograms: bool, decoupled: bool) -> None:
        names = [key for key, _, _ in _SUMMARIES] + [key for key, _, _ in _CACHE_SUMMARIES]
        self.summaries: dict[str, SlidingQuantiles] = {key: SlidingQuantiles() for key in names} if summaries else {}
        self.first_response_ms = BucketHistogram(FIRST_RESPONSE_BUCKETS_MS) if histograms and decoupled else None

    def request(self, queue_ns: int, request_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        summaries = self.summaries
        if summaries:
            summaries["request"].observe(request_ns // 1000)
            summaries["queue"].observe(queue_ns // 1000)
            summaries["compute_input"].observe(input_ns // 1000)
            summaries["compute_infer"].observe(infer_ns // 1000)
            summaries["compute_output"].observe(output_ns // 1000)

    def cache_hit(self, queue_ns: int, request_ns: int, lookup_ns: int) -> None:
        if self.summaries:
            self.summaries["request"].observe(request_ns // 1000)
            self.summaries["queue"].observe(queue_ns // 1000)
            self.summaries["cache_hit"].observe(lookup_ns // 1000)

    def cache_miss(self, miss_ns: int) -> None:
        if self.summaries:
            self.summaries["cache_miss"].observe(miss_ns // 1000)

    def first_response(self, ns: int) -> None:
        if self.first_response_ms is not None:
            self.first_response_ms.observe(ns / 1e6)


# the collector ---------------------------------------------------------------------------------------------------


class CoreMetrics:
    """The core's metrics: Triton's families built from the models' counters, the response cache and the host,
    read when scraped.

    ``summaries`` and ``histograms`` switch on the opt-in per-request observations (``ServeConfig.metrics_summaries``
    / ``metrics_histograms``); ``gpu=False`` leaves NVML alone.
    """

    def __init__(
        self,
        models: ModelsView,
        cache: ResponseCache | None = None,
        *,
        summaries: bool = False,
        histograms: bool = False,
        gpu: bool = True,
    ) -> None:
        self._models = models
        self._cache = cache
        self.summaries = summaries
        self.histograms = histograms
        self._cpu = CpuReader()
        self._gpu = GpuReader.open() if gpu else None

    def close(self) -> None:
        """Release NVML."""
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def model_ready(self, entry: ModelEntry) -> None:
        """A model's instance connected: note its load time and start its opt-in latency observations."""
        stats = entry.stats
        stats.mark_loaded(len(entry.instances), entry.spec.config.instances)
        if stats.latency is None and (self.summaries or self.histograms):
            stats.latency = LatencyRecorder(self.summaries, self.histograms, entry.spec.config.decoupled)

    def render(self) -> bytes:
        """The metrics page (Prometheus text format 0.0.4)."""
        return render(self.collect())

    def collect(self) -> Iterator[Metric]:
        """Every family, in Triton's order."""
        entries = self._models.entries()
        labels = [{"model": entry.name, "version": str(entry.version)} for entry in entries]
        stats = [entry.stats for entry in entries]

        def counter(name: str, doc: str, values: Iterable[float]) -> Metric:
            family = Metric(name, doc, "counter")
            for label, value in zip(labels, values, strict=True):
                family.add_sample(name, label, value)
            return family

        yield counter(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            (s.success.count for s in stats),
        )
        failure = Metric(
            "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter"
        )
        for label, s in zip(labels, stats, strict=True):
            for reason in FAILURE_REASONS:
                failure.add_sample(failure.name, {**label, "reason": reason}, s.failures[reason])
        yield failure
        yield counter(
            "nv_inference_count",
            "Number of inferences performed (does not include cached requests)",
            (s.inference_count for s in stats),
        )
        yield counter(
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            (s.execution_count for s in stats),
        )
        for name, doc, attribute in _LATENCY_COUNTERS:
            yield counter(name, doc, (getattr(s, attribute).ns // 1000 for s in stats))
        pending = Metric(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            "gauge",
        )
        for label, entry in zip(labels, entries, strict=True):
            pending.add_sample(pending.name, label, entry.scheduler.queued_count() if entry.scheduler else 0)
        yield pending
        load = Metric("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
        for label, s in zip(labels, stats, strict=True):
            load.add_sample(load.name, label, s.load_duration_ns / 1e9)
        yield load
        yield from self._cache_families(entries, labels)
        yield from self._latency_families(entries, labels)
        yield from self._host_families()
        yield from _instance_families(entries, labels)

    def _cache_families(self, entries: list[ModelEntry], labels: list[dict[str, str]]) -> Iterator[Metric]:
        cache = self._cache
        cached = [(label, entry.stats) for label, entry in zip(labels, entries, strict=True) if entry.response_cache]
        if cache is None or not cached:
            return
        # (family, HELP, ModelStats Duration, whether the value is its time in µs rather than its count)
        families = (
            ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", False),
            ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", False),
            (
                "nv_cache_hit_duration_per_model",
                "Total cache hit duration per model, in microseconds",
                "cache_hit",
                True,
            ),
            (
                "nv_cache_miss_duration_per_model",
                "Total cache miss (insert+lookup) duration per model, in microseconds",
                "cache_miss",
                True,
            ),
        )
        for name, doc, attribute, in_us in families:
            family = Metric(name, doc, "counter")
            for label, s in cached:
                duration = getattr(s, attribute)
                family.add_sample(name, label, duration.ns // 1000 if in_us else duration.count)
            yield family
        for name, doc, kind, value in cache.metrics():
            family = Metric(name, doc, kind)
            family.add_sample(name, {}, value)
            yield family

    def _latency_families(self, entries: list[ModelEntry], labels: list[dict[str, str]]) -> Iterator[Metric]:
        recorders = [
            (label, entry, entry.stats.latency)
            for label, entry in zip(labels, entries, strict=True)
            if isinstance(entry.stats.latency, LatencyRecorder)
        ]
        if not recorders:
            return
        if self.summaries:
            for key, name, doc in (*_SUMMARIES, *_CACHE_SUMMARIES):
                family = Metric(name, doc, "summary")
                for label, entry, recorder in recorders:
                    if key.startswith("cache_") and not entry.response_cache:
                        continue
                    summary = recorder.summaries[key]
                    family.add_sample(name + "_count", label, summary.count)
                    family.add_sample(name + "_sum", label, summary.total)
                    for quantile, value in summary.quantiles():
                        family.add_sample(name, {**label, "quantile": _format_value(quantile)}, value)
                if family.samples:
                    yield family
        histograms = [(label, r.first_response_ms) for label, _, r in recorders if r.first_response_ms is not None]
        if histograms:
            name = "nv_inference_first_response_histogram_ms"
            family = Metric(name, "Duration from request to first response in milliseconds", "histogram")
            for label, histogram in histograms:
                for bound, count in histogram.cumulative():
                    family.add_sample(name + "_bucket", {**label, "le": bound}, count)
                family.add_sample(name + "_count", label, histogram.count)
                family.add_sample(name + "_sum", label, histogram.total)
            yield family

    def _host_families(self) -> Iterator[Metric]:
        if self._gpu is not None:
            readings = self._gpu.read()
            for name, doc, kind in GPU_FAMILIES:
                if readings[name]:
                    family = Metric(name, doc, kind)
                    for uuid, value in readings[name]:
                        family.add_sample(name, {"gpu_uuid": uuid}, value)
                    yield family
        utilization = self._cpu.utilization()
        if utilization is not None:
            family = Metric("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge")
            family.add_sample(family.name, {}, utilization)
            yield family
        memory = self._cpu.memory()
        if memory is not None:
            for name, doc, value in (
                ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", memory[0]),
                ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", memory[1]),
            ):
                family = Metric(name, doc, "gauge")
                family.add_sample(name, {}, value)
                yield family


def _instance_families(entries: list[ModelEntry], labels: list[dict[str, str]]) -> Iterator[Metric]:
    """pyserve's own (Triton has none per instance): where each connected instance runs, and the batches it ran."""
    info = Metric(
        "pyserve_instance_info",
        "A connected model instance: its kind, device, host and cluster node (a Ray node id) as labels; always 1",
        "gauge",
    )
    batches = Metric(
        "pyserve_instance_batches_total",
        "Batches a model instance answered since it connected (restarts from 0 with the instance)",
        "counter",
    )
    for label, entry in zip(labels, entries, strict=True):
        for instance in sorted(entry.instances, key=lambda i: i.index):
            named = {**label, "instance": str(instance.index)}
            kind, device = instance.shown_kind, instance.device
            where = {"kind": kind, "device": device, "host": instance.host, "node": instance.node}
            info.add_sample(info.name, {**named, **where}, 1)
            batches.add_sample(batches.name, named, instance.batches_done)
    if info.samples:
        yield info
        yield batches


# text format -----------------------------------------------------------------------------------------------------


def render(families: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4, family and sample names exactly as given (no ``_total`` added)."""
    lines: list[str] = []
    for family in families:
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines.append(f"# HELP {family.name} {doc}\n# TYPE {family.name} {_TEXT_TYPES.get(family.type, family.type)}\n")
        for sample in family.samples:
            if sample.labels:
                labels = ",".join(f'{key}="{_escape_label(value)}"' for key, value in sorted(sample.labels.items()))
                lines.append(f"{sample.name}{{{labels}}} {_format_value(sample.value)}\n")
            else:
                lines.append(f"{sample.name} {_format_value(sample.value)}\n")
    return "".join(lines).encode()


_TEXT_TYPES = {"unknown": "untyped"}


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
